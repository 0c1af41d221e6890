"""Ordered cost resolution: the first admissible provider answers; nothing is averaged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perfcast.core.canonical import content_digest
from perfcast.core.errors import InvalidEvidenceError, UnresolvedCostError
from perfcast.evidence.contracts import (
    Attempt,
    AttemptOutcome,
    CostEstimate,
    CostProvider,
    CostQuery,
    Miss,
    Resolution,
)


@dataclass(frozen=True)
class ResolverPolicy:
    """How the resolver treats answers.

    `keep_alternatives`: also ask the providers after the winner and keep their answers
    for comparison (never mixed into the result).
    """

    name: str = "ordered"
    keep_alternatives: bool = False


class CostResolver:
    """Resolves each `CostQuery` through an ordered tuple of providers.

    * A `Miss` (or `supports() -> False`) moves on to the next provider; it is recorded.
    * `InvalidEvidenceError` (including ambiguity) propagates: no fallback hides it.
    * If every provider misses, `UnresolvedCostError` carries the attempts: an unknown
      cost never becomes zero.
    * A comparison oracle (`InferenceBaseline`) is refused at construction.
    * Answers are cached per resolver (fixed providers and policy) by the exact, type-strict
      identity of the query.
    """

    def __init__(self, providers: Sequence[CostProvider], policy: ResolverPolicy | None = None,
                 *, cache_size: int = 65536) -> None:
        if not providers:
            raise ValueError("a CostResolver needs at least one provider")
        for p in providers:
            if getattr(p, "comparison_oracle", False) is True:
                raise TypeError(
                    f"{type(p).__name__} is a comparison oracle (InferenceBaseline: "
                    "lookup() only), not a cost provider: a CostResolver cannot install it. "
                    "To cost with its rows, import them as evidence (e.g. "
                    "VidurProfileImporter.from_csv) and install "
                    "PerformanceDatabaseProvider(database)")
        self.providers = tuple(providers)
        self.policy = policy or ResolverPolicy()
        self._cache: dict[tuple, Resolution] = {}
        self._cache_size = cache_size
        self.identity = content_digest("perfcast.CostResolver", {
            "providers": [[p.name, p.revision] for p in self.providers],
            "policy": [self.policy.name, self.policy.keep_alternatives],
        })

    def resolve(self, query: CostQuery) -> Resolution:
        key = _cache_key(query)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        resolution = self._resolve_uncached(query)
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[key] = resolution
        return resolution

    def _resolve_uncached(self, query: CostQuery) -> Resolution:
        attempts: list[Attempt] = []
        winner: CostEstimate | None = None
        alternatives: list[CostEstimate] = []
        for provider in self.providers:
            if winner is not None and not self.policy.keep_alternatives:
                break
            supported = provider.supports(query)
            if supported is not True:
                reason = supported.reason if isinstance(supported, Miss) else "not supported"
                attempts.append(Attempt(provider.name, provider.revision,
                                        AttemptOutcome.UNSUPPORTED, reason))
                continue
            try:
                answer = provider.estimate(query)
            except InvalidEvidenceError as exc:
                attempts.append(Attempt(provider.name, provider.revision,
                                        AttemptOutcome.ERROR, str(exc)))
                if winner is None:
                    raise
                continue
            if isinstance(answer, Miss):
                attempts.append(Attempt(provider.name, provider.revision,
                                        AttemptOutcome.MISS, answer.reason))
                continue
            _check_estimate(provider, answer)
            attempts.append(Attempt(provider.name, provider.revision, AttemptOutcome.HIT))
            if winner is None:
                winner = answer
            else:
                alternatives.append(answer)
        if winner is None:
            raise UnresolvedCostError(
                f"no provider could cost {query.operation} ({query.operator or query.subject.value})"
                f" on {query.hardware}", tuple(attempts))
        return Resolution(estimate=winner, attempts=tuple(attempts), policy=self.policy.name,
                          alternatives=tuple(alternatives), query=query)


def _cache_key(query: CostQuery) -> tuple:
    """Exact semantic identity of a query, cheaper than its canonical digest.

    Dataclass equality treats 1, 1.0 and True as equal; selectors are type-strict, so the
    key adds the type of every selector value (dims and per-operation context dims)."""
    ctx_dims = query.context.operation_dimensions
    return (query,
            tuple(type(v) for v in query.dims.values()),
            tuple(tuple(type(v) for v in d.values()) for d in ctx_dims.values()))


def _check_estimate(provider: CostProvider, estimate: CostEstimate) -> None:
    import math

    from perfcast.evidence.contracts import MatchKind

    if not math.isfinite(estimate.latency_s) or estimate.latency_s < 0:
        raise InvalidEvidenceError(
            f"provider {provider.name} returned latency {estimate.latency_s!r}")
    if estimate.latency_s == 0 and estimate.match_kind is not MatchKind.DECLARED:
        raise InvalidEvidenceError(
            f"provider {provider.name} returned zero latency without declaring it "
            "(zero cost must be a declared fact)")
