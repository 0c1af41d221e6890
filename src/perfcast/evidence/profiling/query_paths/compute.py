"""Compute path: match input shapes, dtypes and formats against `{kernel_type}.csv`,
trying `alternate_kernel_types` in order (after the kernels `kernel_types_by_input_rank`
lists for the first input's rank), then `degenerate_bmm_kernel_type` for a K=1 bmm.

`query_mode: mtp_projection` (TensorCast's `_lookup_mtp_projection`) first looks a 2H -> H
concat projection up on `mtp_projection_kernel_type`, then falls back to this path."""

from __future__ import annotations

from collections.abc import Sequence

from perfcast.evidence.profiling.data_source import (
    LookupMiss,
    QueryResult,
    QuerySource,
    ShapeMatchInfo,
)
from perfcast.evidence.profiling.kernel_csv import query_dtype
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping
from perfcast.evidence.profiling.query_paths.common import (
    Candidate,
    LookupContext,
    find_candidate,
    kernel_list,
    shapes_of,
    tc_inputs,
)
from perfcast.evidence.profiling.residuals import confidence_of, measured_details
from perfcast.evidence.profiling.shape_rules import (
    effective_input_count,
    first_input_last_dims,
    match_inputs,
)

Shape = tuple[int, ...]


def find_compute_match(ctx: LookupContext, kernel_types: Sequence[str],
                       inputs: Sequence[tuple[Shape, str]], tc_input_count: int | None
                       ) -> Candidate | LookupMiss:
    def checker(table, row):
        rule = match_inputs(table.kernel_type, inputs, row, tc_input_count)
        if rule is None:
            return None
        return Candidate(row.latency_us, table.kernel_type, table, row, rule=rule,
                         distance=1.0 if "padding" in rule else 0.0)

    def candidates(table):
        return table.rows_for(first_input_last_dims(table.kernel_type, inputs))

    found = find_candidate(ctx, kernel_types, checker, rows=candidates)
    if isinstance(found, Candidate) or found.reason != "shape_mismatch":
        return found
    # tell a different number of tensors from different shapes (primary kernel's CSV)
    primary = next((ctx.tables.get(k) for k in kernel_types if ctx.tables.get(k)), None)
    if primary is not None and primary.row_count:
        csv_count = len(primary.row(0).input_shapes)
        tc_count = len(inputs)
        if tc_input_count is not None:
            csv_count = min(csv_count, tc_input_count)
            tc_count = min(tc_count, tc_input_count)
        tc_count = effective_input_count(primary.kernel_type, tc_count, csv_count)
        if tc_count != csv_count:
            return LookupMiss("input_count_mismatch",
                              f"{tc_count} tensor inputs vs {csv_count} in "
                              f"{primary.kernel_type}.csv")
    shown = ";".join(",".join(map(str, s)) for s in shapes_of(inputs))
    return LookupMiss("shape_mismatch", f"no row of {', '.join(kernel_types)} matches {shown}")


def candidate_result(cand: Candidate, simulation_shapes: tuple[Shape, ...],
                     details: dict | None = None, source: QuerySource = QuerySource.MEASURED
                     ) -> QueryResult:
    d = {"kernel_type": cand.kernel_type, "record_ids": [cand.record_id],
         **measured_details(cand.row)}
    d.update(cand.details)
    d.update(details or {})
    return QueryResult(
        latency_us=cand.latency_us, confidence=confidence_of(d), source=source, details=d,
        shape_match_info=ShapeMatchInfo(simulation_shapes, tuple(cand.row.input_shapes),
                                        cand.rule))


def is_degenerate_bmm(inputs: Sequence[tuple[Shape, str]]) -> bool:
    """A bmm (B, M, 1) x (B, 1, N): K = 1, an outer product CANN lowers to a broadcast
    Mul. TensorCast's `_uses_glm5_sampling_bmm_mul` accepts only GLM-5's sampling shapes
    (1, 32, 1) x (1, 1, T); perfcast any K=1 bmm (the Mul row must still match both
    input shapes)."""
    if len(inputs) < 2:
        return False
    (a, _), (b, _) = inputs[0], inputs[1]
    return (len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == 1 and b[1] == 1
            and min(a) > 0 and min(b) > 0)


def lookup_mtp_projection(ctx: LookupContext, op: OpInvokeInfo, mapping: OperatorMapping
                          ) -> QueryResult | None:
    """`query_mode: mtp_projection`: a linear whose 2-D activation (T, 2H) is twice as
    wide as its 2-D output (T, H), with a weight of dims {2H, H} (the MTP block's concat
    projection, which vLLM-Ascend runs unquantised), is looked up on
    `mtp_projection_kernel_type` with both inputs in the output's dtype; None (the
    ordinary compute lookup follows) when the call has another shape or no row matches."""
    ins = [(tuple(t.shape), t.dtype) for t in op.tensor_inputs()]
    if len(ins) < 2 or not op.outputs:
        return None
    (x, _), (w, _) = ins[0], ins[1]
    out = tuple(op.outputs[0].shape)
    if (len(x) != 2 or len(w) != 2 or len(out) != 2 or x[0] != out[0]
            or x[1] != 2 * out[1] or set(w) != {x[1], out[1]}):
        return None
    dt = query_dtype(op.outputs[0].dtype)
    inputs = [(x, dt), (w, dt)]
    found = find_compute_match(ctx, [mapping.mtp_projection_kernel_type], inputs, 2)
    if isinstance(found, LookupMiss):
        return None
    return candidate_result(found, shapes_of(inputs), {"query_mode": "mtp_projection"})


def lookup_compute(ctx: LookupContext, op: OpInvokeInfo, mapping: OperatorMapping
                   ) -> QueryResult | LookupMiss:
    if mapping.query_mode == "mtp_projection" and mapping.mtp_projection_kernel_type:
        projected = lookup_mtp_projection(ctx, op, mapping)
        if projected is not None:
            return projected
    if not mapping.kernel_type:
        return LookupMiss("unmapped", f"{mapping.name} has no kernel_type")
    inputs = tc_inputs(op, mapping.tc_input_count)
    if mapping.tp_linear_projection is not None:
        projected = tp_project(inputs, mapping.tp_linear_projection,
                               getattr(ctx, "tp_size", None))
        if isinstance(projected, LookupMiss):
            return projected
        inputs = projected
    sim = shapes_of(inputs)
    kernels = kernel_list(mapping, inputs=inputs)
    degenerate = mapping.degenerate_bmm_kernel_type
    if degenerate and degenerate not in kernels and is_degenerate_bmm(inputs):
        kernels.append(degenerate)
    found = find_compute_match(ctx, kernels, inputs, mapping.tc_input_count)
    if isinstance(found, LookupMiss):
        return LookupMiss(found.reason, found.detail,
                          ShapeMatchInfo(sim, (), found.reason))
    return candidate_result(found, sim)


def tp_project(inputs: list[tuple[Shape, str]], rule: tuple[str, tuple[int, ...]],
               tp: int | None) -> list[tuple[Shape, str]] | LookupMiss:
    """The mapping's `tp_linear_projection` (as TensorCast's `_lookup_compute` applies it):
    a linear whose visible dim (x's last on `input`, the weight's columns on `output`) is
    one of `logical_global_dims` is looked up at its per-rank TP shape, that dim divided
    by the TP size; every other dim is physical and queried unchanged."""
    axis, dims = rule
    if len(inputs) < 2 or len(inputs[0][0]) != 2 or len(inputs[1][0]) != 2:
        return LookupMiss("invalid_tp_linear_projection_rule",
                          "tp_linear_projection needs a 2-D activation and weight")
    (x, x_dt), (w, w_dt) = inputs[0], inputs[1]
    visible = x[-1] if axis == "input" else w[1]
    if visible not in dims or not tp or tp == 1:
        return inputs
    if x[-1] != w[0] or visible % tp:
        return LookupMiss("tp_projection_invalid",
                          f"logical_dim={visible};shard_axis={axis};tp_size={tp}")
    if axis == "input":
        return [((x[0], x[1] // tp), x_dt), ((w[0] // tp, w[1]), w_dt), *inputs[2:]]
    return [(x, x_dt), ((w[0], w[1] // tp), w_dt), *inputs[2:]]
