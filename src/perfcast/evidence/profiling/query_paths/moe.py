"""MoE-fused path (DispatchFFNCombine and friends): compute-style input matching on the
primary kernel plus an exact `EP Size` match when the CSV has that column.

The mapping's MoE fields, as TensorCast's `_lookup_moe` reads them (Ascend/msmodeling
84fec85, `profiling_data_source.py`):

* `project_full_shape`: the call's (x [T, h], expert_indices [T, k]) are projected to
  the kernel's seven physical inputs (`_project_dispatch_ffn_combine_inputs`): x, the
  stacked gate-up weights (E, h, 2I), the stacked down weights (E, I, h), the expert
  indices as INT32, two INT64 workspaces (E*2I,) and (E*h,), and FLOAT routing
  probabilities shaped like the indices. TensorCast reads E, h, 2I and I from the weight
  lists it passes; perfcast from the fused task's work axes (those of its grouped gate-up
  SwiGLU GEMM: `groups` = E local experts that receive rows, `k` = h, `n` = 2I; the
  down GEMM's input width I = n / 2, SwiGLU halving it);
* `embedded_compute`: kernels the fused op runs besides DispatchFFNCombine, each added
  when its CSV has a row: `residual_norm_from_activation` (an AddRmsNormBias on
  (x, x, (h,), (h,))), `routing_weight_cast` (a Cast of the (T, k) routing weights to
  `output_dtype`); one without a row adds nothing (as TensorCast) and is listed in
  `details["embedded_compute_missed"]`;
* `embedded_communication`: a routed-input all-to-all (x bytes times top-k, over the EP
  group when `group_type: expert_parallel`) added from the HCCL CSV. Where TensorCast
  drops it outside the measured message sizes, perfcast misses (never a time without
  it).
"""

from __future__ import annotations

from perfcast.core.dtypes import dtype_bytes
from perfcast.evidence.profiling.data_source import (
    LookupMiss,
    QueryResult,
    QuerySource,
    ShapeMatchInfo,
    SubKernelShapeInfo,
)
from perfcast.evidence.profiling.kernel_csv import profiling_dtype, query_dtype
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping
from perfcast.evidence.profiling.query_paths.common import (
    Candidate,
    LookupContext,
    find_candidate,
    shapes_of,
    tc_inputs,
)
from perfcast.evidence.profiling.query_paths.communication import query_comm_csv
from perfcast.evidence.profiling.query_paths.compute import candidate_result, find_compute_match
from perfcast.evidence.profiling.residuals import combine, confidence_of, measured_details
from perfcast.evidence.profiling.shape_rules import match_inputs

EP_COLUMN = "EP Size"

# the expert weights' dtype of each DFC operator whose projection perfcast knows: the
# bf16 op takes weights of x's dtype (None), the W8A8 op int8 weights
DFC_WEIGHT_DTYPES: dict[str, str | None] = {
    "tensor_cast.dispatch_ffn_combine.default": None,
    "tensor_cast.dispatch_ffn_combine_quant.default": "int8",
}


def project_dfc_inputs(op: OpInvokeInfo) -> list[tuple[tuple[int, ...], str]] | str:
    """The seven physical DispatchFFNCombine inputs of a DFC call, or why not."""
    if op.func not in DFC_WEIGHT_DTYPES:
        return (f"project_full_shape: the weight layout of {op.func} is not known to "
                f"perfcast (known: {', '.join(DFC_WEIGHT_DTYPES)})")
    ins = op.tensor_inputs()
    if len(ins) < 2 or len(ins[0].shape) not in (2, 3) or not ins[1].shape:
        return "project_full_shape: expects (x [T, h], expert_indices [T, k])"
    x, idx = ins[0], ins[1]
    xs = tuple(x.shape) if len(x.shape) == 2 else (x.shape[0] * x.shape[1], x.shape[2])
    e, h, n = (int(op.dim(a, 0) or 0) for a in ("groups", "k", "n"))
    if e < 1 or h != xs[-1] or n < 2 or n % 2:
        return (f"project_full_shape: the task's axes groups={e}, k={h}, n={n} do not "
                f"describe the experts' gate-up GEMM of x {xs}")
    wdt = query_dtype(DFC_WEIGHT_DTYPES[op.func] or x.dtype)
    ks = tuple(idx.shape)
    return [(xs, query_dtype(x.dtype)), ((e, h, n), wdt), ((e, n // 2, h), wdt),
            (ks, "int32"), ((e * n,), "int64"), ((e * h,), "int64"), (ks, "fp32")]


def embedded_compute_query(op: OpInvokeInfo, spec: dict):
    """(inputs, tc_input_count, output) an `embedded_compute` spec queries its kernel
    with (output None: not matched), or a miss."""
    x, idx = op.tensor_inputs()[0], op.tensor_inputs()[1]
    dt = query_dtype(x.dtype)
    if spec["input_projection"] == "residual_norm_from_activation":
        a = tuple(x.shape)
        if spec.get("flatten_leading_dims") and len(a) > 2:
            a = (int(x.numel // a[-1]), a[-1])
        if len(a) != 2:
            return LookupMiss("shape_mismatch", f"{spec['kernel_type']}: activation {a} "
                              "is not 2-D")
        return [(a, dt), (a, dt), ((a[-1],), dt), ((a[-1],), dt)], 4, None
    routing = tuple(idx.shape)   # routing_weight_cast: the (T, k) weights, x's dtype
    return [(routing, dt)], 1, (routing, profiling_dtype(spec["output_dtype"]))


def _embedded_compute(ctx: LookupContext, op: OpInvokeInfo, spec: dict
                      ) -> Candidate | LookupMiss:
    query = embedded_compute_query(op, spec)
    if isinstance(query, LookupMiss):
        return query
    inputs, count, out = query
    kt = spec["kernel_type"]
    if out is None:
        return find_compute_match(ctx, [kt], inputs, count)

    def checker(table, row):
        rule = match_inputs(kt, inputs, row, count)
        if rule is None or tuple(row.output_shapes) != (out[0],) or \
                tuple(row.output_dtypes) != (out[1],):
            return None
        return Candidate(row.latency_us, kt, table, row, rule=rule)
    return find_candidate(ctx, [kt], checker)


def routed_message_bytes(op: OpInvokeInfo) -> int:
    """`message_bytes_mode: routed_input`: x's bytes times top-k."""
    x, idx = op.tensor_inputs()[0], op.tensor_inputs()[1]
    topk = idx.shape[-1] if len(idx.shape) >= 2 else 1
    return int(x.numel * dtype_bytes(x.dtype) * topk)


def _embedded_comm(ctx: LookupContext, op: OpInvokeInfo, spec: dict):
    """(latency, interpolated, record ids, uncertainty, message bytes) or a miss."""
    mb = routed_message_bytes(op)
    n = int(op.dim("participants", 0) or 0)
    if n < 1 or (spec.get("group_type") == "expert_parallel" and n != ctx.ep_size):
        return LookupMiss("moe_embedded_communication_context_mismatch",
                          f"{spec['kernel_type']}: group of {n} ranks, EP size {ctx.ep_size}")
    found = query_comm_csv(ctx, spec["kernel_type"], mb, n,
                           ctx.topology_tier(n, str(op.dim("tier", "") or "")),
                           method=spec.get("interpolation_method", "alpha_beta"))
    if isinstance(found, LookupMiss):
        return LookupMiss("moe_embedded_communication_miss:" + spec["kernel_type"],
                          found.detail)
    return (*found, mb)


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
    count = mapping.tc_input_count
    if mapping.project_full_shape:
        inputs = project_dfc_inputs(op)
        if isinstance(inputs, str):
            return LookupMiss("invalid_args", inputs)
        count = None
    else:
        inputs = tc_inputs(op, count)
    sim = shapes_of(inputs)

    def checker(tbl, row):
        rule = match_inputs(tbl.kernel_type, inputs, row, count)
        if rule is None or (has_ep and row.number(EP_COLUMN) != ctx.ep_size):
            return None
        if mapping.project_full_shape and rule == "identity":
            rule = "projected_full_shape"
        return Candidate(row.latency_us, tbl.kernel_type, tbl, row, rule=rule)

    found = find_candidate(ctx, [mapping.kernel_type], checker)
    if isinstance(found, LookupMiss):
        return LookupMiss(found.reason, f"{found.detail} (ep_size={ctx.ep_size})",
                          ShapeMatchInfo(sim, (), found.reason))
    if not mapping.embedded_compute and mapping.embedded_communication is None:
        return candidate_result(found, sim, {"ep_size": ctx.ep_size})
    return _with_embedded(ctx, op, mapping, found, sim)


def _with_embedded(ctx, op, mapping, hit: Candidate, sim) -> QueryResult | LookupMiss:
    if len(op.tensor_inputs()) < 2:
        return LookupMiss("invalid_args", f"{mapping.name}: embedded kernels need "
                          "(x, expert_indices)", ShapeMatchInfo(sim, (), "invalid_args"))
    total = hit.latency_us
    durations = [(hit.kernel_type, round(hit.latency_us, 3))]
    subs = [SubKernelShapeInfo(hit.kernel_type, sim, tuple(hit.row.input_shapes), hit.rule)]
    ids, parts, missed = [hit.record_id], [(hit.latency_us, measured_details(hit.row))], []
    for spec in mapping.embedded_compute:
        got = _embedded_compute(ctx, op, spec)
        if isinstance(got, LookupMiss):
            missed.append(f"{spec['kernel_type']} ({got.reason})")
            continue
        total += got.latency_us
        durations.append((got.kernel_type, round(got.latency_us, 3)))
        subs.append(SubKernelShapeInfo(got.kernel_type, (), tuple(got.row.input_shapes),
                                       got.rule))
        ids.append(got.record_id)
        parts.append((got.latency_us, measured_details(got.row)))
    interpolated = False
    details = {"ep_size": ctx.ep_size}
    spec = mapping.embedded_communication
    if spec is not None:
        got = _embedded_comm(ctx, op, spec)
        if isinstance(got, LookupMiss):
            return LookupMiss(got.reason, got.detail, ShapeMatchInfo(sim, (), got.reason))
        latency, interpolated, comm_ids, unc, mb = got
        total += latency
        durations.append((spec["kernel_type"], round(latency, 3)))
        subs.append(SubKernelShapeInfo(spec["kernel_type"], ((mb,),), ((mb,),), "comm"))
        ids.extend(comm_ids)
        parts.append((latency, unc))
        details["embedded_communication"] = {
            "kernel_type": spec["kernel_type"], "message_bytes": mb,
            "interpolation_method": spec.get("interpolation_method", "alpha_beta"),
            "interpolated": interpolated}
    if missed:
        details["embedded_compute_missed"] = missed
    unc = combine(parts)
    return QueryResult(
        latency_us=total, confidence=confidence_of(unc),
        source=QuerySource.INTERPOLATED if interpolated else QuerySource.MEASURED,
        details={"kernel_type": hit.kernel_type, "sub_kernel_durations": durations,
                 "record_ids": ids, **details, **unc},
        shape_match_info=ShapeMatchInfo(sim, tuple(hit.row.input_shapes), hit.rule),
        sub_kernel_shapes=tuple(subs))
