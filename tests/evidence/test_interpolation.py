"""InterpolatingProvider: hand-checkable interpolation, validity, policy, real data."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from evidence_helpers import gemm_query, make_record

from perfcast.core.errors import AmbiguousEvidenceError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import (
    CostQuery,
    CostQueryContext,
    CostSubject,
    EstimateMethod,
    Miss,
)
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.importers.aiconfigurator import import_system
from perfcast.evidence.interpolation import InterpolatingProvider
from perfcast.evidence.selectors import query_facts
from perfcast.hardware import load_system

H100 = load_system("h100_sxm")
FIX = Path(__file__).parents[1] / "fixtures" / "aiconfigurator" / "h100_sxm"


def interp(records, policy="interpolate", system=H100):
    return InterpolatingProvider(PerformanceDatabase.from_records(records), system,
                                 policy=policy)


def compute_bound_line(c_s_per_row=1e-8):
    # n = k = 4096 bf16 is compute-bound on an H100 for m >= 1024, so latency proportional
    # to m means constant efficiency: efficiency interpolation must be exact.
    return [make_record(c_s_per_row * m, {"m": m, "n": 4096, "k": 4096}, rid=f"m{m}")
            for m in (1024, 4096, 16384)]


def test_gemm_efficiency_interpolation_is_exact_on_a_proportional_line():
    p = interp(compute_bound_line())
    est = p.estimate(gemm_query(2048, 4096, 4096))
    assert est.latency_s == pytest.approx(1e-8 * 2048, rel=1e-9)
    assert est.method is EstimateMethod.INTERPOLATED
    v = dict(est.validity)
    assert (v["m_lo"], v["m_hi"], v["n_lo"], v["n_hi"]) == (1024, 4096, 4096, 4096)
    assert est.components["distance_m"] == pytest.approx(1.0)  # one octave to 1024 and 4096
    assert set(est.raw_record_ids) == {"m1024", "m4096"}
    # three points leave one leave-one-out error: too few to size the uncertainty
    assert est.uncertainty.kind == "unknown" and est.uncertainty.rel_std is None
    assert "needs 5" in est.statistics["uncertainty_reason"] and est.confidence == 0.0


def test_outside_the_range_needs_the_extrapolate_policy():
    assert isinstance(interp(compute_bound_line()).estimate(gemm_query(512, 4096, 4096)), Miss)
    inside = interp(compute_bound_line(), policy="extrapolate").estimate(
        gemm_query(2048, 4096, 4096))
    est = interp(compute_bound_line(), policy="extrapolate").estimate(
        gemm_query(32768, 4096, 4096))
    assert est.method is EstimateMethod.EXTRAPOLATED
    assert est.latency_s == pytest.approx(1e-8 * 32768, rel=1e-9)
    assert est.components["distance_m"] == pytest.approx(1.0)  # one octave past 16384
    assert inside.method is EstimateMethod.INTERPOLATED
    # two leave-one-out extrapolations (the ends of a 3-point line): unknown, and why
    assert est.uncertainty.rel_std is None and est.confidence == 0.0
    assert "extrapolation errors along m" in est.statistics["uncertainty_reason"]
    far = interp(compute_bound_line(), policy="extrapolate").estimate(
        gemm_query(16384 * 8, 4096, 4096))
    assert isinstance(far, Miss) and "exceeds" in far.reason


def test_bilinear_over_n_on_log_axes():
    # latency = m * n * 1e-12 at two n lines; query n between them, latency-space check
    recs = [make_record(1e-12 * m * n, {"m": m, "n": n, "k": 4096}, rid=f"{m}-{n}")
            for m in (1024, 4096) for n in (2048, 8192)]
    est = interp(recs, system=None).estimate(gemm_query(2048, 4096, 4096))
    assert est.latency_s == pytest.approx(1e-12 * 2048 * 4096, rel=1e-9)
    assert len(est.raw_record_ids) == 4


def test_collectives_interpolate_a_local_alpha_beta_line():
    def rec(mb, t):
        return make_record(t, {"message_bytes": mb, "participants": 8}, operation="all_reduce",
                           subject=CostSubject.COMMUNICATION, rid=str(mb))
    # alpha 5 us, beta 1e11 B/s: t = 5e-6 + M / 1e11
    p = interp([rec(10**6, 15e-6), rec(3 * 10**6, 35e-6)])
    query = CostQuery(subject=CostSubject.COMMUNICATION, operation="all_reduce",
                      hardware="h100_sxm", dtype="bf16",
                      dims=FrozenDict({"message_bytes": 2 * 10**6, "participants": 8}))
    assert p.estimate(query).latency_s == pytest.approx(25e-6)
    other = CostQuery(subject=CostSubject.COMMUNICATION, operation="all_reduce",
                      hardware="h100_sxm", dtype="bf16",
                      dims=FrozenDict({"message_bytes": 2 * 10**6, "participants": 4}))
    assert isinstance(p.estimate(other), Miss)


def attn_query(batch, q, kv, **ctx):
    dims = {"batch": batch, "q_tokens": q, "kv_len": kv, "heads": 32, "kv_heads": 8,
            "head_dim": 128, "v_head_dim": 128, "phase": "prefill" if q > 1 else "decode",
            "kv_dtype": "bf16"}
    return CostQuery(subject=CostSubject.OPERATOR, operation="attention", hardware="h100_sxm",
                     dtype="bf16", dims=FrozenDict(dims), context=CostQueryContext(**ctx))


def test_prefill_attention_ties_q_tokens_to_kv_len():
    # latency ~ kv^2 is a straight line in log-log space: the geometric midpoint is exact
    base = {"batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128, "v_head_dim": 128,
            "phase": "prefill", "kv_dtype": "bf16"}
    recs = [make_record(1e-3 * (s / 1024) ** 2, {**base, "q_tokens": s, "kv_len": s},
                        operation="attention", rid=str(s)) for s in (1024, 4096)]
    p = interp(recs)
    assert p.estimate(attn_query(1, 2048, 2048)).latency_s == pytest.approx(4e-3)
    # a prefix-cached prefill (q_tokens != kv_len) is not what these records measured
    assert isinstance(p.estimate(attn_query(1, 1024, 2048)), Miss)


def test_two_groups_in_one_cell_are_ambiguous():
    recs = compute_bound_line() + [make_record(2e-8 * m, {"m": m, "n": 4096, "k": 4096},
                                               source="other", rid=f"o{m}")
                                   for m in (1024, 4096)]
    with pytest.raises(AmbiguousEvidenceError):
        interp(recs).estimate(gemm_query(2048, 4096, 4096))


@pytest.fixture(scope="module")
def real():
    return InterpolatingProvider(import_system(FIX / "gemm", hardware="h100_sxm"), H100)


@pytest.mark.parametrize("m,dtype", [(2048, "bfloat16"), (3072, "bfloat16"), (1536, "fp8"),
                                     (2816, "fp8")])
def test_leave_one_out_on_real_h100_gemm_is_within_ten_percent(real, m, dtype):
    measured = pq.read_table(FIX / "gemm/vllm/0.19.0/gemm_perf.parquet").filter(
        (pc.field("m") == m) & (pc.field("gemm_dtype") == dtype)).to_pylist()[0]
    query = gemm_query(m, 4096, 4096, dtype="bf16" if dtype == "bfloat16" else "fp8",
                       runtime="vllm", revision="0.19.0", implementation="vllm_default")
    part = real.select(query)
    row = next(int(r) for line in part.lines.values() for r in line.row_idx
               if real.database.record_at(int(r)).selector["m"] == m)
    latency = real.predict(part, query_facts(query), exclude_row=row)[0]
    assert latency == pytest.approx(measured["latency"] * 1e-3, rel=0.10)
