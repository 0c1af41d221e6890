"""The replay interface shared by the CPU, CUDA and NPU backends.

A `ReplayCase` is one database row to re-measure (kernel type, tensor slots, dtypes,
formats, strides). A backend turns cases into `ReplayOutcome`s: per-call statistics in
microseconds, or the reason it could not run the case. Backends never touch CSVs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from perfcast.collect.kernel_types import KernelTypeSpec
from perfcast.collect.tables import SampleStats


@dataclass(frozen=True)
class ReplayCase:
    case_id: str                               # "<kernel_type>#<row index>"
    spec: KernelTypeSpec
    input_shapes: tuple[tuple[int, ...] | None, ...]
    input_dtypes: tuple[str, ...]
    input_formats: tuple[str, ...] = ()
    input_strides: tuple[tuple[int, ...] | None, ...] = ()
    runtime: tuple[tuple[str, str], ...] = ()  # other key columns (avg_seq_len, EP Size)

    def runtime_value(self, *columns: str) -> str:
        """The first non-empty value of these runtime columns ("" when none)."""
        values = dict(self.runtime)
        return next((values[c] for c in columns if (values.get(c) or "").strip()), "")

    @property
    def kernel_type(self) -> str:
        return self.spec.kernel_type


@dataclass(frozen=True)
class ReplayOutcome:
    case_id: str
    stats: SampleStats | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.stats is not None


@dataclass(frozen=True)
class ReplaySettings:
    repeat_count: int = 30
    warmup: int = 3

    def __post_init__(self) -> None:
        if self.repeat_count < 1:
            raise ValueError("--repeat-count must be at least 1")
        if self.warmup < 0:
            raise ValueError("warm-up count must be non-negative")


@runtime_checkable
class ReplayBackend(Protocol):
    name: str

    def unavailable_reason(self) -> str:
        """Empty when the backend can run here, else why not (missing torch, no GPU, ...)."""

    def measure(self, cases: Sequence[ReplayCase], settings: ReplaySettings) -> list[ReplayOutcome]:
        """One outcome per case, in order."""
