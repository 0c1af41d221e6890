"""The normalized evidence contract: queries, estimates, provider protocol, outcomes.

Every provider (measured database, interpolation, calibrated model, roofline,
collective model, TensorCast profiling data source) answers the same `CostQuery` with
the same `CostEstimate`, or with a `Miss` that says why. Invalid or ambiguous evidence
raises `InvalidEvidenceError`/`AmbiguousEvidenceError`, which no fallback may hide.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from perfcast.core.canonical import Record, content_digest
from perfcast.core.frozen import FrozenDict

DimValue = int | float | str | bool


class CostSubject(str, enum.Enum):
    OPERATOR = "operator"
    COMMUNICATION = "communication"


class EstimateMethod(str, enum.Enum):
    MEASURED = "measured"
    INTERPOLATED = "interpolated"
    SIMULATED = "simulated"
    ANALYTICAL = "analytical"
    CALIBRATED = "calibrated"
    EXTRAPOLATED = "extrapolated"
    FALLBACK = "fallback"


class MatchKind(str, enum.Enum):
    EXACT = "exact"              # every selector dimension equal
    SUBSET = "subset"            # record selector is a strict subset of the query's facts
    INTERPOLATED = "interpolated"
    EXTRAPOLATED = "extrapolated"
    MODEL = "model"              # computed from work facts (roofline, alpha-beta)
    DECLARED = "declared"        # a declared fact (zero-cost view op, accepted miss)


@dataclass(frozen=True)
class CostQueryContext(Record):
    """Late-bound execution context. Empty string means unknown, never a wildcard match
    for evidence that requires a specific value."""

    runtime: str = ""                      # vllm | sglang | trtllm | torch | ...
    runtime_revision: str = ""             # e.g. "0.19.0"
    implementation: str = ""               # kernel / implementation name, if known
    hardware_revision: str = ""
    topology_revision: str = ""
    power_mode: str = ""
    implementations: FrozenDict[str, str] = field(default_factory=FrozenDict)  # per operation
    operation_dimensions: FrozenDict[str, FrozenDict[str, DimValue]] = field(
        default_factory=FrozenDict)  # extra selector dims per operation (e.g. backend)

    def implementation_for(self, operation: str, dtype: str = "") -> str:
        """The implementation stated for `operation` at `dtype` (key `operation@dtype`),
        else for the operation, else the context-wide one: a runtime picks its kernel per
        operation and data type (e.g. a Triton MoE for bf16, a CUTLASS one for fp8)."""
        if dtype:
            hit = self.implementations.get(f"{operation}@{dtype}")
            if hit:
                return hit
        return self.implementations.get(operation, self.implementation)


@dataclass(frozen=True)
class CostQuery(Record):
    """One task's latency question: work facts + hardware + context. Holds no duration."""

    subject: CostSubject
    operation: str                          # semantic: gemm, attention, all_reduce, ...
    hardware: str                           # system name (catalog id)
    dtype: str                              # canonical compute dtype
    engine: str = "matrix"                  # matrix | vector | network | none
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    message_bytes: float = 0.0
    participants: int = 0
    network_tier: str = ""
    dims: FrozenDict[str, DimValue] = field(default_factory=FrozenDict)  # m,n,k,q_tokens,...
    context: CostQueryContext = field(default_factory=CostQueryContext)
    operator: str = ""                      # TensorCast operator name, e.g. aten.mm.default
    zero_cost: bool = False                 # declared: a view/metadata op
    # The task's tensors (TensorSpec: shape, dtype, format), for shape-keyed evidence
    # such as TensorCast profiling databases. Empty when the caller has none.
    inputs: tuple = ()
    outputs: tuple = ()

    DIGEST_DOMAIN = "perfcast.CostQuery"

    @property
    def bytes_total(self) -> float:
        return self.bytes_read + self.bytes_written

    def dim(self, name: str, default: DimValue | None = None) -> DimValue | None:
        return self.dims.get(name, default)


@dataclass(frozen=True)
class Uncertainty(Record):
    """Spread of an estimate. `rel_std` is a relative 1-sigma; bounds are absolute seconds.

    `kind`: `none`; `samples` (repeat spread of a measured point); `model` (an analytic
    model's stated spread); `loo` (measured: leave-one-out errors of the interpolation on
    its own evidence, `sample_count` of them); `heldout` (calibrated: the robust spread of
    the held-out errors of the calibration revision's cross-validation for this class);
    `partial`; `unknown`: nothing measured to
    size it, `rel_std` is None and the estimate's `statistics["uncertainty_reason"]`
    says why. Readers must treat None as unknown, never as zero."""

    kind: str = "none"          # none | samples | model | loo | heldout | partial | unknown
    rel_std: float | None = 0.0
    low_s: float | None = None
    high_s: float | None = None
    sample_count: int = 0


@dataclass(frozen=True)
class CostEstimate(Record):
    latency_s: float
    method: EstimateMethod
    match_kind: MatchKind
    provider: str
    provider_revision: str
    source_revision: str = ""
    raw_record_ids: tuple[str, ...] = ()
    validity: FrozenDict[str, DimValue] = field(default_factory=FrozenDict)
    uncertainty: Uncertainty = field(default_factory=Uncertainty)
    components: FrozenDict[str, float] = field(default_factory=FrozenDict)
    assumptions: tuple[str, ...] = ()
    bottleneck: str = ""        # compute | memory | comm | launch | measured
    confidence: float = 1.0     # 0..1; measured exact = 1.0; interpolated: exp(-rel_std)
                                # of the measured error, 0.0 when that is unknown
    # Provider-specific debug facts shown in reports and traces (e.g. the profiling
    # path's source, kernel_type, shape_match_rule, kernel_shapes).
    statistics: FrozenDict[str, DimValue] = field(default_factory=FrozenDict)

    DIGEST_DOMAIN = "perfcast.CostEstimate"


@dataclass(frozen=True)
class Miss:
    """A provider has no evidence for this query; the resolver goes on to the next."""

    reason: str


@runtime_checkable
class CostProvider(Protocol):
    """What every evidence source implements."""

    name: str
    revision: str

    def supports(self, query: CostQuery) -> bool | Miss:
        """True if this provider could answer the kind of query (cheap check)."""

    def estimate(self, query: CostQuery) -> CostEstimate | Miss:
        """An estimate, a Miss(reason), or raise InvalidEvidenceError."""


class AttemptOutcome(str, enum.Enum):
    HIT = "hit"
    MISS = "miss"
    UNSUPPORTED = "unsupported"
    ERROR = "error"


@dataclass(frozen=True)
class Attempt(Record):
    provider: str
    provider_revision: str
    outcome: AttemptOutcome
    reason: str = ""


@dataclass(frozen=True)
class Resolution(Record):
    """The resolver's answer for one query, with its full attempts trace."""

    estimate: CostEstimate
    attempts: tuple[Attempt, ...]
    policy: str
    alternatives: tuple[CostEstimate, ...] = ()
    query: CostQuery | None = None

    @property
    def query_digest(self) -> str:
        """Digest of the query answered (computed on demand: it costs a canonical encoding)."""
        return self.query.digest if self.query is not None else ""


def provider_digest(provider: CostProvider) -> str:
    """A digest of what a provider answers: its `digest` where it has one (a wrapper whose
    answers depend on more than the wrapped provider's revision), else its name and
    revision (a content digest of its data and settings)."""
    own = getattr(provider, "digest", None)
    if own:
        return own
    return content_digest("perfcast.CostProvider", [provider.name, provider.revision])


def providers_digest(providers: Sequence[CostProvider]) -> str:
    """The digest of an ordered provider chain (cache keys of costed terms)."""
    return content_digest("perfcast.ProviderChain", [provider_digest(p) for p in providers])
