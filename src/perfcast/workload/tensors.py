"""Tensors, work facts and tasks: the workload IR. It never holds a duration."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from perfcast.core.canonical import Record
from perfcast.core.dtypes import dtype_bytes
from perfcast.core.frozen import FrozenDict

DimValue = int | float | str | bool


@dataclass(frozen=True)
class TensorSpec(Record):
    shape: tuple[int, ...]
    dtype: str
    format: str = "ND"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> float:
        return self.numel * dtype_bytes(self.dtype)


class Engine(str, enum.Enum):
    MATRIX = "matrix"
    VECTOR = "vector"
    NETWORK = "network"
    NONE = "none"


@dataclass(frozen=True)
class Work(Record):
    """Exact work of one call of a task on one device.

    `flops` counts a multiply-add as 2. `axes` are the named shape facts shared by
    roofline, database, interpolation and profiling lookups (m, n, k, q_tokens, kv_len,
    heads, kv_heads, head_dim, batch, message_bytes, participants, ...).
    """

    flops: float = 0.0
    engine: Engine = Engine.MATRIX
    compute_dtype: str = "bf16"
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    message_bytes: float = 0.0
    participants: int = 0
    axes: FrozenDict[str, DimValue] = field(default_factory=FrozenDict)

    @property
    def bytes_total(self) -> float:
        return self.bytes_read + self.bytes_written


class TaskKind(str, enum.Enum):
    COMPUTE = "compute"
    COMMUNICATION = "communication"
    VIEW = "view"  # declared zero-cost (shape-only) op


@dataclass(frozen=True)
class Task(Record):
    """One operation of the step on one device, possibly repeated.

    * `lineage`: stable id, e.g. `L0-31.attn.o_proj` (layers 0..31) or `final.lm_head`.
    * `group`: the lineage without the layer prefix (`attn.o_proj`), used for tables.
    * `operator`: TensorCast-compatible operator name (`aten.mm.default`, ...).
    * `operation`: semantic kind used by evidence (`gemm`, `attention`, `all_reduce`, ...).
    * `count`: how many times the call runs per step on each device (layers x calls).
    * `devices`: how many devices each run an identical copy (for whole-step totals).
    * `deps`: lineage ids that must finish first (within one repetition).
    * `stage`: pipeline stage that owns the task.
    """

    lineage: str
    group: str
    operator: str
    operation: str
    kind: TaskKind
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    work: Work
    deps: tuple[str, ...] = ()
    count: int = 1
    devices: int = 1
    stage: int = 0
    layers: tuple[int, int] | None = None
    attributes: FrozenDict[str, DimValue] = field(default_factory=FrozenDict)
