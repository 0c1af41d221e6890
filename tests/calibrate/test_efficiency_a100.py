"""The A100 GEMM curve fitted on Vidur's public A100 profile (benchmarks/efficiency_a100.py):
the shipped revision rebuilds from the committed inputs, its cross-validation holds each
weight shape out whole, and it answers A100 GEMMs only."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from perfcast.calibrate.efficiency import fit_class, fit_fold, groups_of, observations
from perfcast.calibrate.store import read_revision
from perfcast.evidence.calibrated import PART_NAME, calibrated_providers
from perfcast.evidence.contracts import EstimateMethod
from perfcast.evidence.importers.common import file_digest
from perfcast.evidence.importers.vidur import VidurProfileImporter
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
    rev, _ = _script().build(VIDUR_A100, "fp16")
    shipped = read_revision(SHIPPED)
    part = shipped.part(PART_NAME)
    # same inputs, same fit (up to the last bits a different BLAS may move)
    assert part.fitted_on == rev.part(PART_NAME).fitted_on
    rebuilt = rev.values()
    assert set(rebuilt) == set(shipped.values())
    for prm in part.parameters:
        # a value the fit pressed against a bound (t0_us at 0: ~1e-6 us) is where the
        # optimiser stopped, not a number: there only the distance to the bound is kept
        span = prm.upper - prm.lower
        at_bound = min(prm.value - prm.lower, prm.upper - prm.value) < 1e-6 * span
        tol = dict(abs=1e-6 * span) if at_bound else dict(rel=1e-6)
        assert rebuilt[prm.name] == pytest.approx(prm.value, **tol), prm.name
    assert [p.name for p in shipped.parts] == [PART_NAME]
    assert list(part.fitted_on["systems"]) == ["a100_sxm"]
    (table,) = part.fitted_on["tables"]
    assert table["path"] == "a100_phi-2_mlp.csv" and table["dtype"] == "fp16"
    assert table["digest"] == file_digest(VIDUR_A100)
    assert list(part.fitted_on["evidence"]) and list(part.fitted_on["domain"]) == ["gemm.bf16"]
    cv = part.cv
    assert cv["group_by"] == "shape"
    held = sorted(f["held_out"] for f in cv["folds"])
    assert held == ["a100_sxm/10240x2560", "a100_sxm/2560x10240", "a100_sxm/2560x2560",
                    "a100_sxm/7680x2560"]
    n = part.fitted_on["records"]
    assert all(f["records"] + f["train_records"] == n for f in cv["folds"])
    pooled = cv["summary"]["held_out"]["gemm.bf16"]
    assert pooled["records"] == n > 1000 and pooled["mape"] < 0.10


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
    for other in ("h100_sxm", "h200_sxm"):   # same vendor: applied, said to be unscored
        (elsewhere,) = calibrated_providers(load_system(other), rev)
        assert elsewhere.transfer == {"from": ["a100_sxm"], "classes": ["gemm.bf16"],
                                      "undeclared": True}
    (prov,) = calibrated_providers(A100, rev)
    assert prov.transfer is None
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
                        "dims": {"m": 65536, "n": 65536, "k": 8192}})
    assert "outside the fitted range" in prov.estimate(huge).reason
