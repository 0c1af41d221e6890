"""The TensorCast data-source contract: `DataSourcePerformanceModel.lookup(op)`.

A lookup has three outcomes, each an explicit value:

* `QueryResult` with `source` MEASURED or INTERPOLATED: a full hit;
* `QueryResult` with `source` PARTIAL: some sub-kernels of a composite hit (the latency
  is used, but coverage metrics count the op as a miss);
* `LookupMiss(reason)`: no evidence, and why (`unmapped`, `csv_not_found`,
  `shape_mismatch`, `input_count_mismatch`, ...). The reason is a value, never state
  left behind on the data source.

`EXTRAPOLATED` is reserved: no query path returns it.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from perfcast.evidence.profiling.op_invoke import OpInvokeInfo

Shape = tuple[int, ...]


class QuerySource(str, enum.Enum):
    MEASURED = "MEASURED"
    INTERPOLATED = "INTERPOLATED"
    EXTRAPOLATED = "EXTRAPOLATED"  # reserved for future use; never produced here
    PARTIAL = "PARTIAL"


@dataclass(frozen=True)
class ShapeMatchInfo:
    """How one lookup matched (or failed to match) shapes."""

    simulation_shapes: tuple[Shape, ...]   # perfcast-side shapes that were queried
    kernel_shapes: tuple[Shape, ...]       # CSV shapes of the matched row (() on a miss)
    shape_match_rule: str                  # identity, batch_strip, transpose, ... or a miss reason


@dataclass(frozen=True)
class SubKernelShapeInfo:
    kernel_type: str
    simulation_shapes: tuple[Shape, ...]
    kernel_shapes: tuple[Shape, ...]
    shape_match_rule: str


@dataclass(frozen=True)
class QueryResult:
    latency_us: float
    confidence: float
    source: QuerySource
    details: dict[str, Any] = field(default_factory=dict)
    shape_match_info: ShapeMatchInfo | None = None
    sub_kernel_shapes: tuple[SubKernelShapeInfo, ...] | None = None

    @property
    def kernel_type(self) -> str:
        return str(self.details.get("kernel_type", ""))

    @property
    def is_full_hit(self) -> bool:
        return self.source in (QuerySource.MEASURED, QuerySource.INTERPOLATED)

    @property
    def zero_cost(self) -> bool:
        return bool(self.details.get("zero_cost"))


@dataclass(frozen=True)
class LookupMiss:
    """No usable evidence. `reason` is a short code; `detail` says what was looked for."""

    reason: str
    detail: str = ""
    shape_match_info: ShapeMatchInfo | None = None

    def __str__(self) -> str:
        return f"{self.reason} ({self.detail})" if self.detail else self.reason


LookupOutcome = QueryResult | LookupMiss


class DataSourcePerformanceModel(ABC):
    """Abstract base of every empirical data source (profiling CSVs, wrappers, ...)."""

    @abstractmethod
    def lookup(self, op: OpInvokeInfo) -> LookupOutcome:
        """A `QueryResult` (full or partial hit) or a `LookupMiss` saying why."""

    def store(self, op: OpInvokeInfo, result: QueryResult) -> None:
        raise NotImplementedError("This data source is read-only")

    @property
    def identity(self) -> str:
        """A digest of the evidence behind this source (used in provider revisions)."""
        return ""
