"""Composite path: one perfcast operator, several NPU kernels.

* Static (`sub_kernels`, MC2-style): the non-communication entries are alternative
  compute kernels (the first that matches is used); `hcom_*` entries are communication
  kernels whose latency is added, with the message size of the matmul output. Under
  sequence parallelism (the plan's `sp`) the entry's `runtime_comm_variants.
  sequence_parallel` replaces its `source_kernel_type` collective (MC2 lowers the
  all-reduce to a reduce-scatter: `per_rank_output` = the output bytes / the group
  size, `interpolation_method` between measured sizes), as TensorCast's
  `_lookup_composite` does when `enable_sequence_parallel` is on.
* Decomposed (a registered decomposer): every sub-kernel is queried (each of its
  candidate kernels with its own input layout, in order); all hit -> MEASURED, some hit
  -> PARTIAL (latency of the hits; `details["missed_specs"]` are the sub-kernels without
  a row, which `EmpiricalPerformanceModel` prices with the analytic model; a miss in
  metrics), none -> `sub_kernel_miss:<kernels>`. With the mapping's
  `require_all_sub_kernels` (TensorCast's `_lookup_composite`: a visible MLAPO regime is
  valid only when its whole kernel sequence resolves) any miss is
  `sub_kernel_miss:<kernels>`, never PARTIAL.

A composite's `rel_std` adds its sub-kernels' measured 1-sigmas in quadrature
(`residuals.combine`); one unknown sub-kernel makes it unknown.
"""

from __future__ import annotations

from collections.abc import Callable

from perfcast.core.dtypes import dtype_bytes
from perfcast.evidence.profiling.data_source import (
    LookupMiss,
    QueryResult,
    QuerySource,
    ShapeMatchInfo,
    SubKernelShapeInfo,
)
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import COMM_PREFIX, OperatorMapping
from perfcast.evidence.profiling.query_paths.attention import gap_details, query_attention
from perfcast.evidence.profiling.query_paths.common import (
    Candidate,
    LookupContext,
    shapes_of,
    tc_inputs,
)
from perfcast.evidence.profiling.query_paths.communication import query_comm_csv
from perfcast.evidence.profiling.query_paths.compute import find_compute_match
from perfcast.evidence.profiling.residuals import (
    UNCERTAINTY_KEYS,
    combine,
    confidence_of,
    measured_details,
)

# MC2 with quantised inputs accumulates and reduces in bf16
QUANT_DTYPES_REDUCED_IN_BF16 = frozenset({"int8", "fp8", "int4", "mxfp4", "nvfp4", "fp4"})


def mc2_message_bytes(op: OpInvokeInfo) -> int:
    if op.outputs and op.outputs[0].shape:
        out = op.outputs[0]
        elem = 2.0 if out.dtype in QUANT_DTYPES_REDUCED_IN_BF16 else dtype_bytes(out.dtype)
        return int(out.numel * elem)
    a, b = op.inputs[0], op.inputs[1]
    elem = 2.0 if a.dtype in QUANT_DTYPES_REDUCED_IN_BF16 else dtype_bytes(a.dtype)
    return int(a.shape[0] * b.shape[-1] * elem)


def lookup_static_composite(ctx: LookupContext, op: OpInvokeInfo, mapping: OperatorMapping
                            ) -> QueryResult | LookupMiss:
    if not mapping.sub_kernels:
        detail = f"{mapping.name} lists no sub_kernels"
        if mapping.decomposer:
            detail += " and perfcast has no decomposer for it"
            if mapping.primary_kernel_type:
                detail += (" (TensorCast's decomposer reads primary_kernel_type "
                           f"{mapping.primary_kernel_type})")
        return LookupMiss("no_sub_kernels", detail)
    inputs = tc_inputs(op, mapping.tc_input_count)
    sim = shapes_of(inputs)
    compute = [k for k in mapping.sub_kernels if not k.startswith(COMM_PREFIX)]
    hit = find_compute_match(ctx, compute, inputs, mapping.tc_input_count)
    if isinstance(hit, LookupMiss):
        return LookupMiss(hit.reason, hit.detail, ShapeMatchInfo(sim, (), hit.reason))
    total = hit.latency_us
    durations = [(hit.kernel_type, round(hit.latency_us, 3))]
    subs = [SubKernelShapeInfo(hit.kernel_type, sim, tuple(hit.row.input_shapes), hit.rule)]
    ids = [hit.record_id]
    parts = [(hit.latency_us, measured_details(hit.row))]
    comm = [k for k in mapping.sub_kernels if k.startswith(COMM_PREFIX)]
    variant = mapping.runtime_comm_variants.get("sequence_parallel") \
        if getattr(ctx, "sequence_parallel", False) else None
    for kt in comm:
        n = int(op.dim("participants", 0) or 0)
        if n < 1:
            return LookupMiss("invalid_args", f"{mapping.name} has no participants for {kt}")
        mb, method = mc2_message_bytes(op), "alpha_beta"
        if variant is not None and kt == variant["source_kernel_type"]:
            kt, method = variant["kernel_type"], variant.get("interpolation_method", method)
            if variant.get("message_bytes_mode") == "per_rank_output":
                if n < 2 or mb % n:
                    return LookupMiss("invalid_args", f"{mapping.name}: per_rank_output of "
                                      f"{mb} bytes over {n} ranks")
                mb //= n
        found = query_comm_csv(ctx, kt, mb, n, ctx.topology_tier(n, str(op.dim("tier", "") or "")),
                               method=method)
        if isinstance(found, LookupMiss):
            return LookupMiss("comm_sub_kernel_miss", f"{kt}: {found}",
                              ShapeMatchInfo(sim, (), "comm_sub_kernel_miss"))
        latency, _interp, comm_ids, comm_unc = found
        parts.append((latency, comm_unc))
        total += latency
        durations.append((kt, round(latency, 3)))
        subs.append(SubKernelShapeInfo(kt, ((mb,),), ((mb,),), "comm"))
        ids.extend(comm_ids)
    unc = combine(parts)
    return QueryResult(
        latency_us=total, confidence=confidence_of(unc), source=QuerySource.MEASURED,
        details={"kernel_type": hit.kernel_type, "sub_kernel_durations": durations,
                 "composite": True, "record_ids": ids,
                 "note": "compute + comm sub-kernels" if comm else "compute sub-kernel only",
                 **unc},
        sub_kernel_shapes=tuple(subs))


SubQuery = Callable[[object], "Candidate | LookupMiss"]


def _query_layout(ctx: LookupContext, spec) -> Candidate | LookupMiss:
    if spec.query is not None:  # an opaque kernel the decomposer queries by semantic key
        return spec.query(ctx, spec)
    if spec.attention is not None:
        return query_attention(ctx, spec.kernel_types, spec.attention)
    inputs = spec.inputs
    count = spec.tc_input_count if spec.tc_input_count is not None else len(inputs)
    return find_compute_match(ctx, spec.kernel_types, inputs, count)


def query_sub_kernel(ctx: LookupContext, spec) -> Candidate | LookupMiss:
    """The first candidate (kernel group with its own layout) that has a row; else the
    first miss that found a CSV (else the first miss)."""
    misses = []
    for cand in spec.candidates:
        found = _query_layout(ctx, cand)
        if not isinstance(found, LookupMiss):
            return found
        misses.append(found)
    return next((m for m in misses if m.reason != "csv_not_found"), misses[0])


def _layout_of(spec, kernel_type: str):
    """The candidate of `spec` whose kernels include `kernel_type` (its input layout)."""
    return next((c for c in spec.candidates if kernel_type in c.kernel_types), spec)


def _sub_uncertainty(found: Candidate, spec) -> dict:
    """A sub-kernel answer's uncertainty details (interpolated ones carry their own)."""
    if "rel_std" in found.details:
        return {k: found.details[k] for k in UNCERTAINTY_KEYS if k in found.details}
    if spec.attention is not None:
        return gap_details(found.table, found, spec.attention)
    return measured_details(found.row)


def lookup_decomposed(ctx: LookupContext, op: OpInvokeInfo, mapping: OperatorMapping,
                      decomposer, sub_query: Callable | None = None
                      ) -> QueryResult | LookupMiss:
    """`sub_query(spec) -> Candidate | LookupMiss` defaults to the exact lookup; the
    interpolating wrapper passes one that interpolates after an exact miss."""
    specs = decomposer(op, mapping)
    if not specs:
        return LookupMiss("decompose_failed", f"{mapping.name}: work axes do not describe it")
    query = sub_query or (lambda spec: query_sub_kernel(ctx, spec))
    total, hits, missed, durations, subs, ids, parts = 0.0, [], [], [], [], [], []
    interpolated = False
    missed_specs = []
    for spec in specs:
        found = query(spec)
        if isinstance(found, LookupMiss):
            missed.append(spec.kernel_type)
            missed_specs.append(spec)
            continue
        total += found.latency_us
        hits.append(found.kernel_type)
        interpolated |= bool(found.details.get("interpolated"))
        durations.append((found.kernel_type, round(found.latency_us, 3)))
        used = _layout_of(spec, found.kernel_type)
        subs.append(SubKernelShapeInfo(found.kernel_type, tuple(used.input_shapes),
                                       (found.row.input_shapes[0],) if spec.attention
                                       else tuple(found.row.input_shapes), found.rule))
        ids.append(found.record_id)
        parts.append((found.latency_us, _sub_uncertainty(found, spec)))
    if missed and not hits:
        return LookupMiss("sub_kernel_miss:" + ",".join(missed), f"{mapping.name}")
    if missed and mapping.require_all_sub_kernels:
        return LookupMiss("sub_kernel_miss:" + ",".join(missed),
                          f"{mapping.name}: require_all_sub_kernels, so the hits "
                          f"{','.join(hits)} are not a PARTIAL answer")
    if missed:
        return QueryResult(
            latency_us=total, confidence=len(hits) / len(specs), source=QuerySource.PARTIAL,
            details={"kernel_type": ",".join(hits), "hit_kernels": hits,
                     "missed_kernels": missed, "missed_specs": missed_specs,
                     "sub_kernel_durations": durations,
                     "composite": True, "partial": True, "record_ids": ids},
            sub_kernel_shapes=tuple(subs))
    unc = combine(parts)
    return QueryResult(
        latency_us=total, confidence=confidence_of(unc),
        source=QuerySource.INTERPOLATED if interpolated else QuerySource.MEASURED,
        details={"kernel_type": ",".join(hits), "sub_kernel_durations": durations,
                 "composite": True, "note": "decomposed sub-kernels", "record_ids": ids,
                 **unc},
        sub_kernel_shapes=tuple(subs))
