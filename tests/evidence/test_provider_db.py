"""PerformanceDatabaseProvider: exact subset match, specificity, median, ambiguity."""

from __future__ import annotations

import math

import pytest
from evidence_helpers import gemm_query, make_record

from perfcast.core.errors import AmbiguousEvidenceError
from perfcast.evidence.contracts import EstimateMethod, MatchKind, Miss
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.provider_db import PerformanceDatabaseProvider
from perfcast.evidence.factory import build_resolver
from perfcast.hardware import load_system


def provider(*records):
    return PerformanceDatabaseProvider(PerformanceDatabase.from_records(records))


def test_repeated_samples_aggregate_to_median_with_spread():
    p = provider(*(make_record(t, {"m": 8, "n": 16, "k": 32}, rid=f"s{i}")
                   for i, t in enumerate((1e-3, 2e-3, 10e-3))))
    est = p.estimate(gemm_query(8, 16, 32))
    assert est.latency_s == pytest.approx(2e-3)
    # population std of (1, 2, 10) ms: sqrt(((1-13/3)^2 + (2-13/3)^2 + (10-13/3)^2) / 3)
    pstdev = math.sqrt(((1 - 13 / 3) ** 2 + (2 - 13 / 3) ** 2 + (10 - 13 / 3) ** 2) / 3) * 1e-3
    assert est.uncertainty.rel_std == pytest.approx(pstdev / 2e-3)
    assert (est.uncertainty.low_s, est.uncertainty.high_s) == (1e-3, 10e-3)
    assert est.uncertainty.sample_count == 3
    assert set(est.raw_record_ids) == {"s0", "s1", "s2"}
    assert est.method is EstimateMethod.MEASURED and est.match_kind is MatchKind.EXACT
    assert dict(est.validity) == {"m": 8, "n": 16, "k": 32}


def test_most_specific_selector_wins():
    p = provider(make_record(1e-3, {"m": 8, "n": 16, "k": 32}, rid="generic", source="a"),
                 make_record(5e-3, {"m": 8, "n": 16, "k": 32, "runtime": "vllm"},
                             rid="vllm", source="b"))
    assert p.estimate(gemm_query(8, 16, 32, runtime="vllm")).raw_record_ids == ("vllm",)
    assert p.estimate(gemm_query(8, 16, 32)).raw_record_ids == ("generic",)
    assert p.estimate(gemm_query(8, 16, 32, runtime="sglang")).raw_record_ids == ("generic",)


def test_unknown_runtime_never_hits_a_runtime_specific_record():
    p = provider(make_record(1e-3, {"m": 8, "n": 16, "k": 32, "runtime": "vllm",
                                    "implementation": "cutlass"}))
    miss = p.estimate(gemm_query(8, 16, 32))
    assert isinstance(miss, Miss) and "implementation" in miss.reason
    miss = p.estimate(gemm_query(8, 16, 32, runtime="vllm"))
    assert isinstance(miss, Miss) and "implementation" in miss.reason
    hit = p.estimate(gemm_query(8, 16, 32, runtime="vllm", implementation="cutlass"))
    assert hit.latency_s == 1e-3


def test_two_equally_specific_groups_are_ambiguous_even_behind_a_fallback():
    p = provider(make_record(1e-3, {"m": 8, "n": 16, "k": 32}, source="lab-a"),
                 make_record(9e-3, {"m": 8, "n": 16, "k": 32}, source="lab-b"))
    with pytest.raises(AmbiguousEvidenceError, match="lab-a.*lab-b"):
        p.estimate(gemm_query(8, 16, 32))
    resolver = build_resolver(load_system("h100_sxm"), evidence=[p])
    with pytest.raises(AmbiguousEvidenceError):
        resolver.resolve(gemm_query(8, 16, 32))


def test_equal_size_schemas_from_two_groups_are_ambiguous():
    p = provider(make_record(1e-3, {"m": 8, "n": 16, "k": 32, "runtime": "vllm"}, source="a"),
                 make_record(2e-3, {"m": 8, "n": 16, "k": 32, "implementation": "x"},
                             source="b"))
    with pytest.raises(AmbiguousEvidenceError):
        p.estimate(gemm_query(8, 16, 32, runtime="vllm", implementation="x"))


@pytest.mark.parametrize("stored", [8.0, True])
def test_selectors_are_type_strict(stored):
    p = provider(make_record(1e-3, {"m": stored, "n": 16, "k": 32}))
    miss = p.estimate(gemm_query(8 if stored is not True else 1, 16, 32))
    assert isinstance(miss, Miss)


def test_uncontrolled_dims_become_assumptions():
    p = provider(make_record(1e-3, {"m": 8, "n": 16, "k": 32}))
    est = p.estimate(gemm_query(8, 16, 32, batch=4))
    assert est.match_kind is MatchKind.SUBSET
    assert est.assumptions == ("evidence does not control batch=4",)


def test_core_identity_filters_hardware_and_dtype():
    p = provider(make_record(1e-3, {"m": 8, "n": 16, "k": 32}, dtype="fp8"))
    assert isinstance(p.supports(gemm_query(8, 16, 32)), Miss)
    assert p.estimate(gemm_query(8, 16, 32, dtype="fp8")).latency_s == 1e-3


def test_resolver_falls_back_to_roofline_on_a_miss():
    p = provider(make_record(1e-3, {"m": 8, "n": 16, "k": 32}))
    resolver = build_resolver(load_system("h100_sxm"), evidence=[p])
    res = resolver.resolve(gemm_query(64, 16, 32))
    assert res.estimate.provider == "roofline"
    assert res.attempts[0].outcome.value == "miss" and "m=64" in res.attempts[0].reason
