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
    output_shapes: tuple[tuple[int, ...] | None, ...] = ()  # as recorded (pad/slice targets)

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
        from perfcast.core.errors import ConfigError

        if self.repeat_count < 1:
            raise ConfigError(f"has value {self.repeat_count}", field="--repeat-count",
                              expected="at least 1")
        if self.warmup < 0:
            raise ConfigError(f"has value {self.warmup}", field="--warmup",
                              expected="a non-negative count")


@dataclass(frozen=True)
class DistributedLaunch:
    """How kernel types with `launch: torchrun` (DispatchFFNCombine: one fused
    dispatch -> expert FFN -> combine step over an EP group) are launched: one process per
    EP rank under torchrun. The `--dispatch-ffn-combine-*` flags of `collect replay`; the
    EP size also selects the rows of such CSVs that carry an `EP Size` column."""

    ep_size: int = 16
    nproc_per_node: int | None = None     # None: ep_size / nnodes
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None        # None: torchrun's default

    def __post_init__(self) -> None:
        from perfcast.core.errors import ConfigError

        if self.ep_size < 1 or self.nnodes < 1:
            raise ConfigError(f"ep_size={self.ep_size}, nnodes={self.nnodes}",
                              field="--dispatch-ffn-combine-ep-size/-nnodes",
                              expected="positive integers")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"has value {self.node_rank}",
                              field="--dispatch-ffn-combine-node-rank",
                              expected=f"0..{self.nnodes - 1} (--dispatch-ffn-combine-nnodes)")
        if self.procs_per_node * self.nnodes != self.ep_size:
            raise ConfigError(
                f"{self.procs_per_node} processes per node x {self.nnodes} nodes != EP size "
                f"{self.ep_size}", field="--dispatch-ffn-combine-nproc-per-node",
                expected="nproc_per_node x nnodes = --dispatch-ffn-combine-ep-size")

    @property
    def procs_per_node(self) -> int:
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        return self.ep_size // self.nnodes if self.ep_size % self.nnodes == 0 else 0

    def torchrun_args(self) -> list[str]:
        args = ["torchrun", f"--nproc-per-node={self.procs_per_node}", f"--nnodes={self.nnodes}",
                f"--node-rank={self.node_rank}", f"--master-addr={self.master_addr}"]
        if self.master_port is not None:
            args.append(f"--master-port={self.master_port}")
        return args


@runtime_checkable
class ReplayBackend(Protocol):
    name: str

    def unavailable_reason(self) -> str:
        """Empty when the backend can run here, else why not (missing torch, no GPU, ...)."""

    def measure(self, cases: Sequence[ReplayCase], settings: ReplaySettings) -> list[ReplayOutcome]:
        """One outcome per case, in order."""
