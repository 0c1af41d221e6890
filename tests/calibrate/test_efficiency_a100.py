"""The A100 GEMM curve fitted on Vidur's public A100 profiles (benchmarks/efficiency_a100.py):
the shipped revision rebuilds from the committed inputs, its cross-validation holds each
weight shape out whole, it answers A100 GEMMs only, and the shipped tables are Vidur's rows
with only the columns the importer reads."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from perfcast.calibrate.efficiency import fit_class, fit_fold, groups_of, observations
from perfcast.calibrate.store import read_revision
from perfcast.evidence.calibrated import PART_NAME, calibrated_providers
from perfcast.evidence.contracts import EstimateMethod
from perfcast.evidence.importers.common import file_digest
from perfcast.evidence.importers.vidur import MODEL_COLUMNS, VidurProfileImporter
from perfcast.evidence.query_spec import build_query
from perfcast.hardware import load_system

ROOT = Path(__file__).parents[2]
VIDUR_A100 = ROOT / ".." / "shared" / "reference" / "vidur" / "a100_phi-2_mlp.csv"
SHIPPED = ROOT / "benchmarks" / "data" / "calibration_a100_vidur.json"
A100 = load_system("a100_sxm")
pytestmark = pytest.mark.skipif(not VIDUR_A100.is_file(), reason="shared reference data")


def _script():
    spec = importlib.util.spec_from_file_location("efficiency_a100",
                                                  ROOT / "benchmarks" / "efficiency_a100.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def obs():
    return observations(VidurProfileImporter.from_csv(VIDUR_A100, hardware="a100_sxm",
                                                      dtype="fp16"), A100)


def test_shipped_revision_rebuilds_from_the_vidur_table():
    """Regenerate with `python benchmarks/efficiency_a100.py` when the fitting code moves."""
    script = _script()
    rev, _ = script.build(None, "fp16")
    shipped = read_revision(SHIPPED)
    part = shipped.part(PART_NAME)
    # same inputs, same fit (up to the last bits a different BLAS may move)
    assert part.fitted_on == rev.part(PART_NAME).fitted_on
    rebuilt = rev.values()
    assert set(rebuilt) == set(shipped.values())
    for name, value in shipped.values().items():
        assert rebuilt[name] == pytest.approx(value, rel=1e-6), name
    assert [p.name for p in shipped.parts] == [PART_NAME]
    assert list(part.fitted_on["systems"]) == ["a100_sxm"]
    tables = part.fitted_on["tables"]
    files = script.default_tables()
    assert files[0] == VIDUR_A100 and len(files) == 8
    assert [t["path"] for t in tables] == [f.name for f in files]
    assert [t["digest"] for t in tables] == [file_digest(f) for f in files]
    assert {t["dtype"] for t in tables} == {"fp16"}
    assert list(part.fitted_on["evidence"]) and list(part.fitted_on["domain"]) == ["gemm.bf16"]
    cv = part.cv
    assert cv["group_by"] == "shape"
    held = sorted(f["held_out"] for f in cv["folds"])
    obs, _ = script.load_observations(files)
    assert held == sorted(set(groups_of(obs, "shape").tolist()))
    assert {"a100_sxm/10240x2560", "a100_sxm/2560x10240"} < set(held)
    n = part.fitted_on["records"]
    assert n == len(obs)
    assert all(f["records"] + f["train_records"] == n for f in cv["folds"])
    pooled = cv["summary"]["held_out"]["gemm.bf16"]
    assert pooled["records"] == n and pooled["mape"] < 0.10


def test_shape_folds_hold_a_shape_out_whole(obs):
    groups = groups_of(obs, "shape")
    assert len(set(groups.tolist())) == 4
    held = "a100_sxm/2560x2560"
    fold = fit_fold(obs, "shape", held, classes=["gemm.bf16"])
    # the held-out shape's latencies never reach the fit: doubling them changes nothing
    test = groups == held
    doubled = obs.take(np.ones(len(obs), dtype=bool))
    object.__setattr__(doubled, "measured_s", np.where(test, 2 * obs.measured_s,
                                                       obs.measured_s))
    again = fit_fold(doubled, "shape", held, classes=["gemm.bf16"])
    assert again["fits"]["gemm.bf16"].values == fold["fits"]["gemm.bf16"].values
    assert fold["fits"]["gemm.bf16"].values != fit_class(obs, "gemm.bf16").values
    med = again["held_out"]["gemm.bf16"]["median_log_ratio"]
    assert med == pytest.approx(fold["held_out"]["gemm.bf16"]["median_log_ratio"]
                                - np.log(2), abs=1e-9)


def test_answers_a100_gemms_only():
    rev = read_revision(SHIPPED)
    for other in ("h100_sxm", "h200_sxm"):
        assert calibrated_providers(load_system(other), rev) == []
    (prov,) = calibrated_providers(A100, rev)
    q = build_query({"operation": "gemm", "hardware": "a100_sxm", "dtype": "fp16",
                     "dims": {"m": 1024, "n": 2560, "k": 2560}})
    est = prov.estimate(q)
    assert est.method is EstimateMethod.CALIBRATED
    assert est.source_revision == rev.digest
    spread = rev.part(PART_NAME).cv["summary"]["residual_spread"]["gemm.bf16"]
    assert est.uncertainty.rel_std == pytest.approx(spread["log_std"])
    assert not any("transferred" in a for a in est.assumptions)
    attn = build_query({"operation": "attention", "hardware": "a100_sxm", "dims": {
        "batch": 1, "q_tokens": 2048, "kv_len": 2048, "heads": 32, "kv_heads": 32,
        "head_dim": 80, "phase": "prefill"}})
    assert "no fitted curve" in prov.estimate(attn).reason
    # more than the margin past the fitted sizes: a Miss, left to the next provider
    huge = build_query({"operation": "gemm", "hardware": "a100_sxm", "dtype": "fp16",
                        "dims": {"m": 1 << 20, "n": 65536, "k": 65536}})
    assert "outside the fitted range" in prov.estimate(huge).reason


def test_shipped_tables_keep_only_the_median_and_model_columns():
    """Each shipped profile imports, and holds the columns `extract` keeps: every
    `time_stats.<op>.median` and the model columns, nothing else."""
    for path in _script().default_tables()[1:]:
        with open(path, newline="") as f:
            header = next(csv.reader(f))
        assert set(header) - {c for c in header if c.endswith(".median")} == \
            {*MODEL_COLUMNS, "vocab_size"}, path.name
        db = VidurProfileImporter.from_csv(path, hardware="a100_sxm", dtype="fp16")
        assert len(observations(db, A100)) > 0


def test_extract_keeps_rows_and_cells_of_the_kept_columns(tmp_path):
    header = ["time_stats.mlp_up_proj.min", "time_stats.mlp_up_proj.median",
              "time_stats.mlp_up_proj.std", *MODEL_COLUMNS, "vocab_size", "extra"]
    rows = [["0.1", "0.12345678901", "0.01", "8", "8", "1024", "4096", "2", "1", "False",
             "32000", "x"],
            ["0.2", "0.25", "0.02", "8", "8", "1024", "4096", "4", "2", "False",
             "32000", "y"]]
    for model in ("org/m1", "microsoft/phi-2"):
        d = tmp_path / "data/profiling/compute/a100" / model
        d.mkdir(parents=True)
        with open(d / "mlp.csv", "w", newline="") as f:
            csv.writer(f).writerows([header, *rows])
    out = tmp_path / "out"
    (written,) = _script().extract(tmp_path, out)       # phi-2 is left out
    assert written == out / "org--m1.csv"
    with open(written, newline="") as f:
        got = list(csv.reader(f))
    keep = [1, *range(3, 11)]
    assert got == [[r[i] for i in keep] for r in [header, *rows]]
