"""Efficiency curves for the analytic path: fit, cross-validation, calibrated provider."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from perfcast.calibrate.efficiency import (
    MIN_RECORDS,
    InsufficientDataError,
    Observations,
    fit_class,
    fit_efficiency,
    fit_fold,
    observations,
    roofline_latency_s,
)
from perfcast.calibrate.revision import CalibrationRevision
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.calibrated import (
    PART_NAME,
    CalibratedAnalyticProvider,
    calibrated_providers,
    curve_latency_s,
    params_of,
)
from perfcast.evidence.contracts import CostSubject, EstimateMethod
from perfcast.evidence.importers.aiconfigurator import import_system
from perfcast.evidence.query_spec import build_query
from perfcast.evidence.records import EvidenceProvenance, PerformanceRecord
from perfcast.evidence.resolver import CostResolver
from perfcast.evidence.roofline import RooflineCostProvider
from perfcast.hardware import load_system

FIX = Path(__file__).parents[1] / "fixtures" / "calibrate" / "h100_sxm"
H100 = load_system("h100_sxm")
PEAK = 989.4e12
BW = 3350e9
# e_compute, e_memory, overlap_q, log10_t_half_s, size_h, t0_us
TRUE = (0.75, 0.85, 2.5, -5.3, 0.8, 3.0)


def synthetic(n: int = 1800, *, seed: int = 0, theta=TRUE, noise: float = 0.03,
              frameworks=("trtllm", "vllm", "sglang"), system: str = "h100_sxm"
              ) -> Observations:
    """bf16 GEMMs with log-uniform m, n, k (both sides of the ridge, 1 us .. 10 ms),
    latency from the curve at `theta` times log-normal noise."""
    rng = np.random.default_rng(seed)
    m, n_, k = (np.round(2 ** rng.uniform(lo, 14, n)) for lo in (0, 8, 8))
    flops = 2 * m * n_ * k
    nbytes = (m * k + k * n_ + m * n_) * 2.0
    ideal = np.maximum(flops / PEAK, nbytes / BW)
    lat = curve_latency_s("gemm.bf16", theta, flops, nbytes, PEAK, BW, ideal)
    lat = lat * np.exp(rng.normal(0, noise, n))
    fw = np.array([frameworks[i % len(frameworks)] for i in range(n)], dtype=object)
    return Observations(cls=np.full(n, "gemm.bf16", dtype=object),
                        system=np.full(n, system, dtype=object), framework=fw,
                        flops=flops, nbytes=nbytes, peak=np.full(n, PEAK),
                        bw=np.full(n, BW), ideal_s=ideal, measured_s=lat,
                        digests=("sha256:synthetic",), systems=(system,))


def test_fit_recovers_known_parameters_within_reported_sigma():
    fit = fit_class(synthetic(), "gemm.bf16")
    for p, true, got, std in zip(params_of("gemm.bf16"), TRUE, fit.values, fit.stds):
        assert std is not None and std > 0, p.name
        assert abs(got - true) <= 3 * std, (p.name, got, true, std)
    # and the curve itself is back to within the noise
    obs = synthetic(seed=1)
    ratio = fit.predict(obs) / curve_latency_s("gemm.bf16", TRUE, obs.flops, obs.nbytes,
                                               PEAK, BW, obs.ideal_s)
    assert np.max(np.abs(ratio - 1)) < 0.02


def test_efficiency_is_bounded_by_one():
    obs = synthetic(noise=0.0)
    eff = obs.ideal_s / curve_latency_s("gemm.bf16", (1.0, 1.0, 8.0, -8.0, 2.0, 0.0),
                                        obs.flops, obs.nbytes, PEAK, BW, obs.ideal_s)
    assert np.all(eff <= 1.0 + 1e-12) and np.all(eff > 0)


def test_too_few_records_is_refused():
    obs = synthetic(MIN_RECORDS - 1)
    with pytest.raises(InsufficientDataError, match=f"at least {MIN_RECORDS}"):
        fit_class(obs, "gemm.bf16")
    # a fold whose training side is too small is refused when the class is named
    small = Observations.concat([synthetic(600, frameworks=("trtllm",)),
                                 synthetic(MIN_RECORDS - 5, frameworks=("vllm",), seed=3)])
    with pytest.raises(InsufficientDataError, match="fold h100_sxm/trtllm"):
        fit_fold(small, "framework", "h100_sxm/trtllm", classes=["gemm.bf16"])
    # ... and listed as refused when it is not
    fold = fit_fold(small, "framework", "h100_sxm/trtllm")
    assert "gemm.bf16" in fold["refused"] and not fold["fits"]


def test_held_out_records_never_enter_the_fold_fit():
    obs = synthetic()
    clean = fit_fold(obs, "framework", "h100_sxm/sglang")
    wild = obs.measured_s.copy()
    held = obs.framework == "sglang"
    wild[np.flatnonzero(held)[:50]] *= 1000.0          # a planted wild outlier group
    dirty_obs = Observations(**{**{k: getattr(obs, k) for k in (
        "cls", "system", "framework", "flops", "nbytes", "peak", "bw", "ideal_s")},
        "measured_s": wild}, digests=obs.digests, systems=obs.systems)
    dirty = fit_fold(dirty_obs, "framework", "h100_sxm/sglang")
    assert dirty["fits"]["gemm.bf16"].values == clean["fits"]["gemm.bf16"].values
    assert dirty["held_out"]["gemm.bf16"]["mape"] > clean["held_out"]["gemm.bf16"]["mape"] + 0.05
    # the fold fit is the fit of the training side alone
    alone = fit_class(obs.take(~held), "gemm.bf16")
    assert alone.values == clean["fits"]["gemm.bf16"].values


def test_system_folds_fit_on_the_other_system():
    obs = Observations.concat([synthetic(900), synthetic(900, seed=5, system="h200_sxm")])
    fit = fit_efficiency(obs)
    part = fit.part()
    assert part.name == PART_NAME
    assert part.cv["group_by"] == "system"
    assert [f["held_out"] for f in part.cv["folds"]] == ["h100_sxm", "h200_sxm"]
    assert part.cv["secondary"]["group_by"] == "framework"
    assert len(part.cv["secondary"]["folds"]) == 6
    assert set(part.fitted_on["systems"]) == {"h100_sxm", "h200_sxm"}
    for f in part.cv["folds"]:
        assert f["held_out_scores"]["gemm.bf16"]["mape"] < 0.05
        assert f["records"] == 900


def _record(m, n, k, latency_s, *, runtime="vllm", revision="0.1", row="r0", digest="d1"):
    prov = EvidenceProvenance(source="test", source_revision=f"{runtime}/{revision}",
                              importer="test", importer_revision="1",
                              source_digest=digest, method=EstimateMethod.MEASURED,
                              raw_record_id=row)
    return PerformanceRecord(subject=CostSubject.OPERATOR, operation="gemm",
                             hardware="h100_sxm", dtype="bf16",
                             selector=FrozenDict({"m": m, "n": n, "k": k, "runtime": runtime,
                                                  "runtime_revision": revision,
                                                  "implementation": "x"}),
                             latency_s=latency_s, provenance=prov)


def test_observations_deduplicate_and_use_workload_work_facts():
    recs = [_record(128, 4096, 4096, 1e-4, row="a"),
            _record(128, 4096, 4096, 3e-4, row="b", revision="0.2", digest="d2"),
            _record(128, 4096, 4096, 2e-4, row="c", revision="0.3", digest="d3"),
            _record(64, 4096, 4096, 1e-4, row="d")]
    obs = observations(recs, H100)
    assert len(obs) == 2 and obs.dropped["duplicates"] == 2
    i = int(np.flatnonzero(obs.flops == 2 * 128 * 4096 * 4096)[0])
    assert obs.measured_s[i] == pytest.approx(2e-4)          # median over versions
    facts = build_query({"operation": "gemm", "dims": {"m": 128, "n": 4096, "k": 4096}})
    assert obs.nbytes[i] == pytest.approx(facts.bytes_total)
    assert obs.ideal_s[i] == pytest.approx(max(facts.flops / PEAK, facts.bytes_total / BW))


def _revision(fit) -> CalibrationRevision:
    return CalibrationRevision(name="test", code_version="test", parts=(fit.part(),))


def test_provider_answers_calibrated_and_falls_through_outside_its_domain():
    fit = fit_efficiency(synthetic())
    rev = _revision(fit)
    provs = calibrated_providers(H100, rev)
    assert len(provs) == 1 and isinstance(provs[0], CalibratedAnalyticProvider)
    resolver = CostResolver([*provs, RooflineCostProvider(H100)])
    q = build_query({"operation": "gemm", "dims": {"m": 256, "n": 4096, "k": 4096}})
    est = resolver.resolve(q).estimate
    assert est.method is EstimateMethod.CALIBRATED
    assert est.source_revision == rev.digest
    assert est.statistics["calibration_revision"] == rev.digest
    assert est.statistics["calibration_part"] == PART_NAME
    spread = fit.part().cv["summary"]["residual_spread"]["gemm.bf16"]
    assert est.uncertainty.rel_std == spread["log_std"] > 0
    assert est.confidence == pytest.approx(math.exp(-spread["log_std"]))
    want = curve_latency_s("gemm.bf16", fit.fits["gemm.bf16"].values, q.flops, q.bytes_total,
                           PEAK, BW, max(q.flops / PEAK, q.bytes_total / BW))
    assert est.latency_s == pytest.approx(float(want))
    assert 0 < est.components["efficiency"] <= 1
    # a size far outside the fitted range: a miss with a reason, then the roofline
    tiny = build_query({"operation": "gemm", "dims": {"m": 1, "n": 2, "k": 2}})
    res = resolver.resolve(tiny)
    assert res.estimate.provider == "roofline"
    assert "outside the fitted range" in res.attempts[0].reason
    # a class that was not fitted
    attn = build_query({"operation": "attention", "dims": {
        "batch": 1, "q_tokens": 1, "kv_len": 1024, "heads": 32, "kv_heads": 8,
        "head_dim": 128, "phase": "decode"}})
    res = resolver.resolve(attn)
    assert res.estimate.provider == "roofline"
    assert "attention.decode.bf16 has no fitted curve" in res.attempts[0].reason
    # another device of the same vendor: the curves apply without records of it, and
    # every answer says so; a device of another vendor, or a revision without the part:
    # no provider at all
    (h200,) = calibrated_providers(load_system("h200_sxm"), rev)
    assert h200.transfer["undeclared"] and h200.transfer["from"] == ["h100_sxm"]
    other = h200.estimate(replace(q, hardware="h200_sxm"))
    assert other.method is EstimateMethod.CALIBRATED
    assert other.uncertainty.rel_std == spread["log_std"]
    assert any("applied to h200_sxm without any record of it" in a for a in other.assumptions)
    assert not any("without any record" in a for a in est.assumptions)
    assert calibrated_providers(load_system("mi300x"), rev) == []
    assert calibrated_providers(H100, None) == []
    assert calibrated_providers(H100, CalibrationRevision(name="e", code_version="t",
                                                          parts=())) == []


def test_part_round_trips_through_revision_json():
    rev = _revision(fit_efficiency(synthetic(600)))
    back = CalibrationRevision.from_json(rev.to_json())
    assert back.digest == rev.digest
    p = back.part(PART_NAME)
    assert p.parameter("efficiency.gemm.bf16.e_compute").std is not None
    assert p.fitted_on["evidence"] == ("sha256:synthetic",)


def test_calibrated_error_beats_roofline_on_real_h100_gemm_slice():
    db = import_system(FIX, hardware="h100_sxm")
    obs = observations(db, H100)
    assert len(obs) >= 300
    assert set(obs.framework.tolist()) == {"trtllm", "vllm", "sglang"}
    base = roofline_latency_s(obs, {"h100_sxm": H100})
    for held in ("h100_sxm/trtllm", "h100_sxm/vllm", "h100_sxm/sglang"):
        fold = fit_fold(obs, "framework", held, classes=["gemm.bf16"])
        test = obs.framework == held.split("/")[1]
        roof = np.mean(np.abs(base[test] - obs.measured_s[test]) / obs.measured_s[test])
        assert fold["held_out"]["gemm.bf16"]["mape"] < roof, held
    fit = fit_efficiency([(db, H100)])
    assert fit.part().fitted_on["evidence"] == (db.digest,)


@pytest.mark.parametrize("cls", ["gemm.bf16", "all_reduce.p8"])
def test_analytic_jacobian_matches_finite_differences(cls):
    from perfcast.calibrate.efficiency import log_jacobian

    obs = synthetic(200)
    theta = np.array(TRUE if cls == "gemm.bf16" else (0.7, -4.8, 0.6, 6.0))
    jac = log_jacobian(cls, theta, obs)

    def logt(th):
        return np.log(curve_latency_s(cls, th, obs.flops, obs.nbytes, obs.peak, obs.bw,
                                      obs.ideal_s))

    for j in range(len(theta)):
        step = 1e-6 * max(1.0, abs(theta[j]))
        up, dn = theta.copy(), theta.copy()
        up[j] += step
        dn[j] -= step
        fd = (logt(up) - logt(dn)) / (2 * step)
        assert np.allclose(jac[:, j], fd, rtol=1e-4, atol=1e-7), j


def test_roofline_baseline_matches_the_analytic_providers():
    from perfcast.evidence.collectives import CollectiveCostProvider
    from perfcast.evidence.contracts import CostQuery

    obs = synthetic(20)
    base = roofline_latency_s(obs, {"h100_sxm": H100})
    roof = RooflineCostProvider(H100)
    for i in range(len(obs)):
        q = CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware="h100_sxm",
                      dtype="bf16", flops=float(obs.flops[i]), bytes_read=float(obs.nbytes[i]))
        assert base[i] == pytest.approx(roof.estimate(q).latency_s)
    coll = Observations(cls=np.array(["all_reduce.p8"]), system=np.array(["h100_sxm"]),
                        framework=np.array(["nccl"]), flops=np.zeros(1),
                        nbytes=np.array([2.0 ** 20]), peak=np.zeros(1), bw=np.array([450e9]),
                        ideal_s=np.array([1.75 * 2 ** 20 / 450e9]), measured_s=np.ones(1))
    q = build_query({"operation": "all_reduce",
                     "dims": {"message_bytes": 2 ** 20, "participants": 8}})
    assert roofline_latency_s(coll, {"h100_sxm": H100})[0] == pytest.approx(
        CollectiveCostProvider(H100).estimate(q).latency_s)


def test_a_class_without_held_out_score_is_not_answered():
    # one system, one framework: no fold can score it
    fit = fit_efficiency(synthetic(600, frameworks=("vllm",)))
    assert "gemm.bf16" in fit.fits and "gemm.bf16" not in fit.spread
    resolver = CostResolver([*calibrated_providers(H100, _revision(fit)),
                             RooflineCostProvider(H100)])
    res = resolver.resolve(build_query({"operation": "gemm",
                                        "dims": {"m": 256, "n": 4096, "k": 4096}}))
    assert res.estimate.provider == "roofline"
    assert "never scored on held-out records" in res.attempts[0].reason
