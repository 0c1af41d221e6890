"""Pieces shared by the query paths: the lookup context and candidate search."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.data_source import LookupMiss, ShapeMatchInfo
from perfcast.evidence.profiling.kernel_csv import (
    PROFILED_LATENCY,
    KernelRow,
    KernelTable,
    KernelTables,
    query_dtype,
)
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OpMapping, OperatorMapping

# the Ascend profiler's per-core busy times of a row (TensorCast's
# `_PROFILING_AICORE_TIME_COL`, `_PROFILING_AIV_TIME_COL`) and its core type column
AICORE_TIME, AIV_TIME, CORE_COLUMN = ("Profiling Average aicore_time(us)",
                                      "Profiling Average aiv_time(us)", "Accelerator Core")

Shape = tuple[int, ...]


class LookupContext(Protocol):
    """What a query path needs from the data source."""

    tables: KernelTables
    ep_size: int | None
    tp_size: int | None
    mapping: OpMapping

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


def profiled(table: KernelTable, row: KernelRow) -> bool:
    """Whether `row`'s latency is the profiler's duration (its table's latency column, or
    the profiled cell a row replayed on another device falls back to)."""
    return table.latency_column == PROFILED_LATENCY or (
        table.has(PROFILED_LATENCY) and row.number(table.latency_column) != row.latency_us)


def core_envelope(cand: Candidate, ratio: float) -> Candidate:
    """`latency_policy` `profiling_core_envelope_fallback`: a MIX_AIC row whose profiled
    duration exceeds `ratio` x its busier core's time (a host or profiler scheduling
    outlier) is priced at that core time (TensorCast's `_effective_row_latency`)."""
    row, table = cand.row, cand.table
    if not profiled(table, row) or row.text(CORE_COLUMN) != "MIX_AIC":
        return cand
    cores = [row.number(AICORE_TIME), row.number(AIV_TIME)]
    if not all(c is not None and c > 0 for c in cores):
        return cand
    envelope = max(cores)
    if cand.latency_us / envelope <= ratio:
        return cand
    return replace(cand, latency_us=envelope, details={
        **cand.details, "latency_selection": "profiling_core_envelope_fallback",
        "raw_latency_us": cand.latency_us, "core_envelope_us": envelope,
        "max_duration_to_core_ratio": ratio})


def find_candidate(ctx: LookupContext, kernel_types: Sequence[str], checker: Checker, *,
                   nearest: bool = False, communication: bool = False,
                   rows: Callable[[KernelTable], Sequence[KernelRow]] | None = None
                   ) -> Candidate | LookupMiss:
    """The best matching row in kernel priority order: within one kernel's CSV, the first
    row at distance 0 (an exact rule), else its nearest; with `nearest`, the nearest row
    over all kernels. `rows(table)`: the rows of a table that can match (default all).

    The mapping's kernel policies apply: `latency_policy` `profiling_core_envelope_fallback`
    to every matching row's latency, and with `nearest` `prefer_profiling_rows` (rows
    priced by the profiled duration win a tie in distance) and `query_selection_policy`
    `require_semantic_unique` (equally near rows with different latencies miss with
    `ambiguous_semantic_match:<kernel>`), as TensorCast's `_find_candidates`.

    Misses with `csv_not_found` when none of the kernels has a CSV, else `shape_mismatch`
    (callers refine the reason)."""
    mapping = getattr(ctx, "mapping", None)
    lat_policy = mapping.latency_overrides if mapping is not None else {}
    sel_policy = mapping.selection_overrides if mapping is not None else {}
    best: Candidate | None = None
    best_score: tuple = ()
    ties: list[Candidate] = []
    loaded = False
    for ki, kt in enumerate(kernel_types):
        table = ctx.tables.get(kt, communication)
        if table is None:
            continue
        loaded = True
        policy = lat_policy.get(kt, {})
        envelope = policy.get("profiling_core_envelope_fallback", {}).get(
            "max_duration_to_core_ratio")
        prefer = bool(policy.get("prefer_profiling_rows"))
        for row in (rows(table) if rows is not None else table.rows):
            cand = checker(table, row)
            if cand is None:
                continue
            if envelope is not None:
                cand = core_envelope(cand, float(envelope))
            score = (cand.distance, ki, 0 if not prefer or profiled(table, row) else 1)
            if best is None or score < best_score:
                best, best_score, ties = cand, score, [cand]
            elif nearest and score == best_score:
                ties.append(cand)
            if not nearest and best.distance == 0:
                return best
        if not nearest and best is not None:
            return best
    if best is not None and len(ties) > 1 and \
            sel_policy.get(best.kernel_type, {}).get("require_semantic_unique") and \
            len({round(c.latency_us, 12) for c in ties}) > 1:
        return LookupMiss(f"ambiguous_semantic_match:{best.kernel_type}",
                          f"{len(ties)} equally near rows of {best.kernel_type} with "
                          "different latencies (query_selection_policy "
                          "require_semantic_unique)")
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
