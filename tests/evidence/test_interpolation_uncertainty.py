"""Uncertainty of interpolated answers is measured by leave-one-out on the evidence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from evidence_helpers import gemm_query, make_record

from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostQuery, CostSubject, EstimateMethod
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.interpolation import (
    LOO_MIN_SAMPLES,
    InterpolatingProvider,
    ResidualTable,
    confidence_from_rel_std,
    leave_one_out,
)


def moe_records(tokens, latency_s, rid="t"):
    return [make_record(float(lat), {"tokens": int(t)}, operation="moe", rid=f"{rid}{i}")
            for i, (t, lat) in enumerate(zip(tokens, latency_s))]


def moe_query(tokens):
    return CostQuery(subject=CostSubject.OPERATOR, operation="moe", hardware="h100_sxm",
                     dtype="bf16", dims=FrozenDict({"tokens": int(tokens)}))


def provider(records, **kw):
    return InterpolatingProvider(PerformanceDatabase.from_records(records), None, **kw)


def power_law(t):
    return 1e-5 * np.asarray(t, dtype=float) ** 0.8  # a straight line in log-log space


GRID = np.round(64 * 2.0 ** (np.arange(401) / 40)).astype(int)  # 10 octaves, 40 per octave


def test_reported_rel_std_matches_known_noise():
    # latency = power law x lognormal(sigma): interpolation in log space is exact on the
    # law, so every error is noise. Predicting a fresh measurement at mid-cell from two
    # noisy neighbours errs by e - (e_lo + e_hi) / 2: a 1-sigma of sigma * sqrt(1.5).
    sigma = 0.05
    rng = np.random.default_rng(1)
    tokens = np.unique(GRID)
    lat = power_law(tokens) * np.exp(rng.normal(0, sigma, len(tokens)))
    p = provider(moe_records(tokens, lat))
    lo, hi = tokens[200], tokens[201]
    mid = int(round(math.sqrt(lo * hi)))
    est = p.estimate(moe_query(mid))
    assert est.method is EstimateMethod.INTERPOLATED
    u = est.uncertainty
    assert u.kind == "loo" and u.sample_count == len(tokens) - 2
    assert u.rel_std == pytest.approx(sigma * math.sqrt(1.5), rel=0.15)  # stated tolerance
    assert 0.8 * sigma < u.rel_std < 1.5 * sigma                          # i.e. ~ the noise
    assert est.confidence == pytest.approx(math.exp(-u.rel_std))
    assert est.statistics["loo_samples"] == len(tokens) - 2
    assert "leave-one-out" in est.statistics["uncertainty_method"]
    # calibration: fresh noisy measurements at mid-cells fall inside +-1 sigma ~68 % of
    # the time
    inside = []
    for i in range(0, len(tokens) - 1, 2):
        q = int(round(math.sqrt(tokens[i] * tokens[i + 1])))
        if q in (tokens[i], tokens[i + 1]):
            continue
        e = p.estimate(moe_query(q))
        fresh = power_law(q) * math.exp(rng.normal(0, sigma))
        inside.append(abs(math.log(e.latency_s / fresh)) <= e.uncertainty.rel_std)
    assert np.mean(inside) == pytest.approx(0.6827, abs=0.08)


def curved(t):
    x = np.log(np.asarray(t, dtype=float))
    return 1e-5 * np.exp(0.5 * np.sin(x))  # curved in log-log space


@pytest.mark.parametrize("octave_points", [(2, 8), (3, 12)])
def test_denser_grid_gives_smaller_uncertainty(octave_points):
    sparse_n, dense_n = octave_points
    answers = {}
    for n in (sparse_n, dense_n):
        tokens = np.unique(np.round(16 * 2.0 ** (np.arange(12 * n + 1) / n)).astype(int))
        p = provider(moe_records(tokens, curved(tokens)))
        est = p.estimate(moe_query(1000))
        assert est.method is EstimateMethod.INTERPOLATED
        answers[n] = est
        # the error it reports is the error it makes (within the spread of the curve)
        err = abs(math.log(est.latency_s / float(curved(1000))))
        assert err <= 2 * est.uncertainty.rel_std
    assert answers[dense_n].uncertainty.rel_std < 0.5 * answers[sparse_n].uncertainty.rel_std
    assert answers[dense_n].confidence > answers[sparse_n].confidence


def test_leave_one_out_never_uses_the_point_it_predicts():
    tokens = np.unique(np.round(64 * 2.0 ** (np.arange(30) / 4)).astype(int))
    lat = power_law(tokens)
    k = 15
    lat[k] *= 3.0  # an outlier
    p = provider(moe_records(tokens, lat))
    part = p.select(moe_query(int(tokens[k])))
    (errs,) = leave_one_out(part)
    point_raw = part.arrays[2]
    own = int(np.nonzero(point_raw == tokens[k])[0][0])
    inner = ~errs.extrapolated
    at = {int(i): e for i, e in zip(errs.point[inner], errs.log_error[inner])}
    # predicted from its clean neighbours only: exactly the law, a third of the outlier
    assert at[own] == pytest.approx(-math.log(3.0), abs=1e-9)
    # its neighbours are predicted through it (they err), everyone else is exact
    neighbours = {int(np.nonzero(point_raw == tokens[k + d])[0][0]) for d in (-1, 1)}
    assert all(abs(at[i]) > 0.1 for i in neighbours)
    assert all(abs(e) < 1e-9 for i, e in at.items() if i not in neighbours | {own})
    # a robust quantile: three bad errors of 28 do not move the 1-sigma
    off = p.estimate(moe_query(int(round(math.sqrt(tokens[3] * tokens[4])))))
    assert off.uncertainty.rel_std == pytest.approx(0.0, abs=1e-9)


def test_too_few_points_report_unknown_with_a_reason():
    tokens = [64, 128, 256, 512]  # two interior points: two leave-one-out errors
    est = provider(moe_records(tokens, power_law(tokens))).estimate(moe_query(200))
    assert est.method is EstimateMethod.INTERPOLATED
    assert est.uncertainty.kind == "unknown" and est.uncertainty.rel_std is None
    assert est.confidence == 0.0
    reason = est.statistics["uncertainty_reason"]
    assert "2 leave-one-out interpolation errors along tokens" in reason
    assert f"needs {LOO_MIN_SAMPLES}" in reason


def test_a_measured_point_keeps_its_repeat_spread():
    tokens = [64, 128, 256, 512, 1024, 2048, 4096]
    recs = moe_records(tokens, power_law(tokens))
    repeats = [1.0e-3, 1.1e-3, 0.9e-3]
    recs += [make_record(v, {"tokens": 300}, operation="moe", rid=f"rep{i}")
             for i, v in enumerate(repeats)]
    est = provider(recs).estimate(moe_query(300))
    u = est.uncertainty
    assert u.kind == "samples" and u.sample_count == 3
    assert u.rel_std == pytest.approx(np.std(repeats) / 1.0e-3)
    assert (u.low_s, u.high_s) == (0.9e-3, 1.1e-3)
    assert est.latency_s == pytest.approx(1.0e-3)


def test_extrapolation_uses_the_errors_of_held_out_ends():
    tokens = np.unique(np.round(16 * 2.0 ** (np.arange(49) / 4)).astype(int))
    p = provider(moe_records(tokens, curved(tokens)), policy="extrapolate")
    inside = p.estimate(moe_query(1000))
    outside = p.estimate(moe_query(int(tokens[-1] * 1.5)))
    assert outside.method is EstimateMethod.EXTRAPOLATED
    assert outside.uncertainty.kind == "loo"
    assert outside.uncertainty.rel_std > inside.uncertainty.rel_std
    assert outside.confidence < inside.confidence
    # every point extrapolated from its two nearest on either side: 2 * (n - 2) errors
    assert outside.uncertainty.sample_count == 2 * (len(tokens) - 2)
    assert outside.statistics["loo_samples"] == 2 * (len(tokens) - 2)


def gemm_grid(noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    recs = []
    for m in (16, 32, 64, 128, 256, 512, 1024, 2048):
        for n in (512, 1024, 2048, 4096, 8192, 16384):
            lat = 1e-12 * m * n * 4096 * (1 + 0.3 * math.sin(math.log(n)))
            recs.append(make_record(lat * math.exp(rng.normal(0, noise)),
                                    {"m": m, "n": n, "k": 4096}, rid=f"{m}-{n}"))
    return recs


def test_per_axis_errors_add_in_quadrature():
    p = provider(gemm_grid())
    on_n = p.estimate(gemm_query(1024, 3000, 4096))    # off-grid in n only
    both = p.estimate(gemm_query(700, 3000, 4096))     # off-grid in m and n
    assert set(k for k in on_n.statistics if k.startswith("loo_sigma_")) == {"loo_sigma_n"}
    s_m, s_n = both.statistics["loo_sigma_m"], both.statistics["loo_sigma_n"]
    assert both.uncertainty.rel_std == pytest.approx(math.hypot(s_m, s_n))
    assert on_n.statistics["loo_sigma_n"] > 0


def test_residuals_are_paid_once_per_database():
    db = PerformanceDatabase.from_records(gemm_grid(noise=0.02))
    a, b = InterpolatingProvider(db, None), InterpolatingProvider(db, None)
    q = gemm_query(700, 3000, 4096)
    a.estimate(q)
    b.estimate(q)
    assert a.select(q).residuals is b.select(q).residuals


def test_residual_table_bins_by_distance():
    rng = np.random.default_rng(0)
    d = np.concatenate([np.full(100, 0.25), np.full(100, 1.0)])
    e = np.concatenate([rng.normal(0, 0.01, 100), rng.normal(0, 0.1, 100)])
    t = ResidualTable.from_samples(d, e)
    assert t.count == 200 and len(t.sigma) == 2
    assert t.sigma_at(0.1) == pytest.approx(0.01, rel=0.3)   # nearer than any: first bin
    assert t.sigma_at(0.9) == pytest.approx(0.1, rel=0.3)
    assert t.sigma_at(5.0) == t.sigma[-1]
    assert not ResidualTable.from_samples([1.0] * 4, [0.1] * 4).known
    assert confidence_from_rel_std(None) == 0.0 and confidence_from_rel_std(0.0) == 1.0
