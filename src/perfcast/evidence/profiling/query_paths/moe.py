"""MoE-fused path (DispatchFFNCombine and friends): compute-style input matching on the
primary kernel plus an exact `EP Size` match when the CSV has that column."""

from __future__ import annotations

from perfcast.evidence.profiling.data_source import LookupMiss, QueryResult, ShapeMatchInfo
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping
from perfcast.evidence.profiling.query_paths.common import (
    Candidate,
    LookupContext,
    find_candidate,
    shapes_of,
    tc_inputs,
)
from perfcast.evidence.profiling.query_paths.compute import candidate_result
from perfcast.evidence.profiling.shape_rules import match_inputs

EP_COLUMN = "EP Size"


def lookup_moe(ctx: LookupContext, op: OpInvokeInfo, mapping: OperatorMapping
               ) -> QueryResult | LookupMiss:
    if not mapping.kernel_type:
        return LookupMiss("unmapped", f"{mapping.name} has no kernel_type")
    table = ctx.tables.get(mapping.kernel_type)
    if table is None:
        return LookupMiss("csv_not_found", f"no CSV for {mapping.kernel_type}")
    has_ep = table.has(EP_COLUMN)
    if has_ep and ctx.ep_size is None:
        return LookupMiss("ep_size_not_configured",
                          f"{table.path.name} is keyed by EP Size; pass a parallel plan")
    inputs = tc_inputs(op, mapping.tc_input_count)
    sim = shapes_of(inputs)

    def checker(tbl, row):
        rule = match_inputs(tbl.kernel_type, inputs, row, mapping.tc_input_count)
        if rule is None or (has_ep and row.number(EP_COLUMN) != ctx.ep_size):
            return None
        return Candidate(row.latency_us, tbl.kernel_type, tbl, row, rule=rule)

    found = find_candidate(ctx, [mapping.kernel_type], checker)
    if isinstance(found, LookupMiss):
        return LookupMiss(found.reason, f"{found.detail} (ep_size={ctx.ep_size})",
                          ShapeMatchInfo(sim, (), found.reason))
    return candidate_result(found, sim, {"ep_size": ctx.ep_size})
