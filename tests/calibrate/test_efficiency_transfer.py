"""`transfer_part`: the shipped analytic efficiency curves declared for a device they were
not fitted on, after scoring them on that device's measured kernels (Vidur's public A100
GEMM profile); nothing is refitted, and the provider reports the transfer's score."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from perfcast.calibrate.efficiency import (
    InsufficientDataError,
    observations,
    transfer_part,
)
from perfcast.calibrate.revision import CalibrationRevision
from perfcast.calibrate.store import default_revision
from perfcast.core.errors import ConfigError
from perfcast.evidence.calibrated import (
    PART_NAME,
    CalibratedAnalyticProvider,
    calibrated_providers,
    curve_latency_s,
    params_of,
)
from perfcast.evidence.contracts import EstimateMethod
from perfcast.evidence.importers.vidur import VidurProfileImporter
from perfcast.evidence.query_spec import build_query
from perfcast.hardware import load_system

VIDUR_A100 = Path(__file__).parents[2] / ".." / "shared" / "reference" / "vidur" / \
    "a100_phi-2_mlp.csv"
A100 = load_system("a100_sxm")
pytestmark = pytest.mark.skipif(not VIDUR_A100.is_file(), reason="shared reference data")


@pytest.fixture(scope="module")
def setup():
    obs = observations(VidurProfileImporter.from_csv(VIDUR_A100, hardware="a100_sxm",
                                                     dtype="fp16"), A100)
    base = default_revision().part(PART_NAME)
    return obs, base, transfer_part(base, obs, classes=["gemm.bf16"])


def test_nothing_refitted_and_every_record_scored(setup):
    obs, base, part = setup
    assert part.parameters == base.parameters
    assert tuple(part.fitted_on["systems"]) == tuple(base.fitted_on["systems"])
    t = part.fitted_on["transfers"]["a100_sxm"]
    assert list(t["classes"]) == ["gemm.bf16"]
    assert list(t["from"]) == list(base.fitted_on["systems"])
    on = obs.cls == "gemm.bf16"
    assert t["residual_spread"]["gemm.bf16"]["records"] == int(on.sum()) > 1000
    # the score by hand: the curve at the A100's peak and bandwidth against each record
    vals = base.values()
    theta = [vals[f"efficiency.gemm.bf16.{p.name}"] for p in params_of("gemm.bf16")]
    sub = obs.take(on)
    assert set(sub.peak.tolist()) == {312e12}
    pred = curve_latency_s("gemm.bf16", theta, sub.flops, sub.nbytes, sub.peak, sub.bw,
                           sub.ideal_s)
    r = np.log(pred / sub.measured_s)
    assert t["residual_spread"]["gemm.bf16"]["median_log_ratio"] == pytest.approx(
        float(np.median(r)), abs=1e-4)
    assert t["held_out"]["gemm.bf16"]["mape"] == pytest.approx(
        float(np.mean(np.abs(pred - sub.measured_s) / sub.measured_s)), abs=1e-4)


def test_provider_answers_the_transferred_class_only(setup):
    _, base, part = setup
    rev = CalibrationRevision(name="t", code_version="t", parts=(part,))
    # the shipped revision alone applies every curve to A100 without records of it; a
    # declared transfer answers the classes it scored, with that score
    (undeclared,) = calibrated_providers(A100, default_revision())
    assert undeclared.transfer["undeclared"]
    (prov,) = calibrated_providers(A100, rev)
    assert not prov.transfer.get("undeclared")
    assert isinstance(prov, CalibratedAnalyticProvider)
    q = build_query({"operation": "gemm", "hardware": "a100_sxm", "dtype": "fp16",
                     "dims": {"m": 4096, "n": 10240, "k": 2560}})
    est = prov.estimate(q)
    assert est.method is EstimateMethod.CALIBRATED
    spread = part.fitted_on["transfers"]["a100_sxm"]["residual_spread"]["gemm.bf16"]
    assert est.uncertainty.rel_std == spread["log_std"]
    assert est.confidence == pytest.approx(math.exp(-spread["log_std"]))
    assert any("transferred to a100_sxm" in a for a in est.assumptions)
    vals = base.values()
    theta = [vals[f"efficiency.gemm.bf16.{p.name}"] for p in params_of("gemm.bf16")]
    bw = A100.device.memory.bw_bytes_per_s
    ideal = max(q.flops / 312e12, q.bytes_total / bw)
    assert est.latency_s == pytest.approx(
        float(curve_latency_s("gemm.bf16", theta, q.flops, q.bytes_total, 312e12, bw, ideal)))
    attn = build_query({"operation": "attention", "hardware": "a100_sxm", "dims": {
        "batch": 1, "q_tokens": 2048, "kv_len": 2048, "heads": 32, "kv_heads": 8,
        "head_dim": 128, "phase": "prefill"}})
    assert "no fitted curve" in prov.estimate(attn).reason
    # on a system it was fitted on, the part answers as before
    h100 = load_system("h100_sxm")
    qh = build_query({"operation": "gemm", "dims": {"m": 4096, "n": 10240, "k": 2560}})
    (ph,) = calibrated_providers(h100, rev)
    (pd,) = calibrated_providers(h100, default_revision())
    assert ph.estimate(qh).latency_s == pd.estimate(qh).latency_s


def test_refused_on_a_fitted_system_or_too_few_records(setup):
    obs, base, _ = setup
    h100_obs = obs.take(np.arange(len(obs)) < 0)
    with pytest.raises(ConfigError, match="one system"):
        transfer_part(base, h100_obs)
    few = obs.take(np.arange(len(obs)) < 5)
    with pytest.raises(InsufficientDataError):
        transfer_part(base, few, classes=["gemm.bf16"])
    fitted = obs.take(obs.cls == "gemm.bf16")
    object.__setattr__(fitted, "system", np.full(len(fitted), "h100_sxm"))
    with pytest.raises(ConfigError, match="nothing to transfer"):
        transfer_part(base, fitted)


def test_shipped_transfer_revision_matches_the_shipped_curves():
    """benchmarks/data/calibration_a100_transfer.json is the shipped revision with the A100
    transfer added: regenerate it (benchmarks/efficiency_transfer.py) when the shipped
    revision changes."""
    from perfcast.calibrate.store import load_calibration

    path = Path(__file__).parents[2] / "benchmarks" / "data" / "calibration_a100_transfer.json"
    rev = load_calibration(str(path))
    base = default_revision()
    assert rev.part(PART_NAME).parameters == base.part(PART_NAME).parameters
    assert [p.name for p in rev.parts] == [p.name for p in base.parts]
    for p in base.parts:
        if p.name != PART_NAME:
            assert rev.part(p.name) == p
    t = rev.part(PART_NAME).fitted_on["transfers"]["a100_sxm"]
    assert list(t["classes"]) == ["gemm.bf16"]
