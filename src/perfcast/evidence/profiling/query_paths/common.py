"""Pieces shared by the query paths: the lookup context and candidate search."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.data_source import LookupMiss, ShapeMatchInfo
from perfcast.evidence.profiling.kernel_csv import KernelRow, KernelTable, KernelTables, query_dtype
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping

Shape = tuple[int, ...]


class LookupContext(Protocol):
    """What a query path needs from the data source."""

    tables: KernelTables
    ep_size: int | None

    def topology_tier(self, participants: int, tier_name: str = "") -> int | None: ...

    def decomposer_for(self, operator: str) -> Callable | None: ...


@dataclass(frozen=True)
class Candidate:
    latency_us: float
    kernel_type: str
    table: KernelTable
    row: KernelRow
    rule: str = "identity"
    confidence: float = 1.0
    distance: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def record_id(self) -> str:
        return self.table.record_id(self.row)


Checker = Callable[[KernelTable, KernelRow], Candidate | None]


def find_candidate(ctx: LookupContext, kernel_types: Sequence[str], checker: Checker, *,
                   nearest: bool = False, communication: bool = False,
                   rows: Callable[[KernelTable], Sequence[KernelRow]] | None = None
                   ) -> Candidate | LookupMiss:
    """The best matching row in kernel priority order: within one kernel's CSV, the first
    row at distance 0 (an exact rule), else its nearest; with `nearest`, the nearest row
    over all kernels. `rows(table)`: the rows of a table that can match (default all).

    Misses with `csv_not_found` when none of the kernels has a CSV, else `shape_mismatch`
    (callers refine the reason)."""
    best: Candidate | None = None
    loaded = False
    for kt in kernel_types:
        table = ctx.tables.get(kt, communication)
        if table is None:
            continue
        loaded = True
        for row in (rows(table) if rows is not None else table.rows):
            cand = checker(table, row)
            if cand is None:
                continue
            if best is None or cand.distance < best.distance:
                best = cand
            if not nearest and best.distance == 0:
                return best
        if not nearest and best is not None:
            return best
    if best is not None:
        return best
    if not loaded:
        return LookupMiss("csv_not_found", "no CSV for " + ", ".join(kernel_types))
    return LookupMiss("shape_mismatch", "no row of " + ", ".join(kernel_types) + " matched")


def tc_inputs(op: OpInvokeInfo, tc_input_count: int | None) -> list[tuple[Shape, str]]:
    ins = [(tuple(t.shape), query_dtype(t.dtype)) for t in op.tensor_inputs()]
    return ins[:tc_input_count] if tc_input_count is not None else ins


def shapes_of(inputs: Sequence[tuple[Shape, str]]) -> tuple[Shape, ...]:
    return tuple(s for s, _ in inputs)


def miss(reason: str, detail: str = "", simulation_shapes: tuple[Shape, ...] = ()
         ) -> LookupMiss:
    return LookupMiss(reason, detail, ShapeMatchInfo(simulation_shapes, (), reason))


def kernel_list(mapping: OperatorMapping, *, with_alternates: bool = True,
                inputs: Sequence[tuple[Shape, str]] = ()) -> list[str]:
    """The kernels to try, in order; with `inputs`, those the mapping's
    `kernel_types_by_input_rank` lists for the rank of the first input come first (as
    TensorCast's `_lookup_compute` reorders them)."""
    kinds = list(mapping.kernel_types if with_alternates else mapping.kernel_types[:1])
    by_rank = mapping.extra.get("kernel_types_by_input_rank")
    if by_rank is None or not inputs:
        return kinds
    fld = f"operator_mappings.{mapping.name}.kernel_types_by_input_rank"
    if not isinstance(by_rank, dict) or not all(
            isinstance(v, list) and all(isinstance(k, str) for k in v) for v in by_rank.values()):
        raise ConfigError(f"has value {by_rank!r}", field=fld,
                          expected="a mapping of input rank -> list of kernel type names")
    rank = len(inputs[0][0])
    first = by_rank.get(rank, by_rank.get(str(rank), []))
    return list(dict.fromkeys([*first, *kinds]))
