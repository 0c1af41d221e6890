from dataclasses import dataclass

import pytest

from perfcast.core.errors import AmbiguousEvidenceError, InvalidEvidenceError, UnresolvedCostError
from perfcast.evidence import (
    AttemptOutcome,
    CostEstimate,
    CostQuery,
    CostResolver,
    CostSubject,
    EstimateMethod,
    MatchKind,
    Miss,
    ResolverPolicy,
    RooflineCostProvider,
)

QUERY = CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware="round",
                  dtype="bf16", flops=2e12, bytes_read=1e9)


@dataclass
class FixedProvider:
    name: str
    latency_s: float | None = None
    miss_reason: str = ""
    error: Exception | None = None
    revision: str = "r1"
    calls: int = 0

    def supports(self, query):
        return True

    def estimate(self, query):
        self.calls += 1
        if self.error:
            raise self.error
        if self.latency_s is None:
            return Miss(self.miss_reason or "no record")
        return CostEstimate(latency_s=self.latency_s, method=EstimateMethod.MEASURED,
                            match_kind=MatchKind.EXACT, provider=self.name,
                            provider_revision=self.revision)


def test_first_hit_wins_in_order():
    a, b = FixedProvider("a", 1.0), FixedProvider("b", 2.0)
    res = CostResolver([a, b]).resolve(QUERY)
    assert res.estimate.provider == "a"
    assert [x.provider for x in res.attempts] == ["a"]
    assert b.calls == 0


def test_miss_proceeds_and_is_recorded():
    res = CostResolver([FixedProvider("db", miss_reason="no m=7"), FixedProvider("b", 2.0)]).resolve(QUERY)
    assert res.estimate.provider == "b"
    assert res.attempts[0].outcome is AttemptOutcome.MISS and res.attempts[0].reason == "no m=7"
    assert res.attempts[1].outcome is AttemptOutcome.HIT


def test_ambiguity_is_an_error_no_fallback_hides():
    db = FixedProvider("db", error=AmbiguousEvidenceError("two groups"))
    fallback = FixedProvider("roofline", 1.0)
    with pytest.raises(AmbiguousEvidenceError):
        CostResolver([db, fallback]).resolve(QUERY)
    assert fallback.calls == 0


def test_all_miss_raises_with_attempts_never_zero():
    with pytest.raises(UnresolvedCostError) as err:
        CostResolver([FixedProvider("a"), FixedProvider("b", miss_reason="nope")]).resolve(QUERY)
    assert [a.provider for a in err.value.attempts] == ["a", "b"]
    assert "nope" in str(err.value)


def test_undeclared_zero_latency_is_invalid():
    with pytest.raises(InvalidEvidenceError, match="zero latency"):
        CostResolver([FixedProvider("a", 0.0)]).resolve(QUERY)


def test_alternatives_kept_but_not_mixed():
    res = CostResolver([FixedProvider("a", 1.0), FixedProvider("b", 3.0)],
                       ResolverPolicy(keep_alternatives=True)).resolve(QUERY)
    assert res.estimate.latency_s == 1.0
    assert [e.provider for e in res.alternatives] == ["b"]


def test_cache_returns_same_resolution_for_equal_query():
    a = FixedProvider("a", 1.0)
    r = CostResolver([a])
    q2 = CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware="round",
                   dtype="bf16", flops=2e12, bytes_read=1e9)
    assert r.resolve(QUERY) is r.resolve(q2)
    assert a.calls == 1


def test_roofline_answers_after_database_miss(round_system):
    res = CostResolver([FixedProvider("db"), RooflineCostProvider(round_system)]).resolve(QUERY)
    assert res.estimate.provider == "roofline"
    assert res.estimate.latency_s == pytest.approx(2e12 / 100e12)


def test_cache_is_type_strict_on_selector_values():
    from perfcast.core.frozen import FrozenDict

    a = FixedProvider("a", 1.0)
    r = CostResolver([a])
    q_int = CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware="round",
                      dtype="bf16", flops=1.0, dims=FrozenDict({"m": 1}))
    q_float = CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware="round",
                        dtype="bf16", flops=1.0, dims=FrozenDict({"m": 1.0}))
    q_bool = CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware="round",
                       dtype="bf16", flops=1.0, dims=FrozenDict({"m": True}))
    for q in (q_int, q_float, q_bool):
        assert r.resolve(q).query_digest == q.digest
    assert a.calls == 3
    assert len({q_int.digest, q_float.digest, q_bool.digest}) == 3
