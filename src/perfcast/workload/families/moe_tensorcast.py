"""TensorCast's expert-parallel MoE layer, call for call (stack `tensorcast`).

`FusedMoETensorCast` (Ascend/msmodeling 84fec85, tensor_cast/layers/moe_layer.py): each
TP rank takes its slice of the tokens (`tensor_split`), runs the router and the top-k
gating on it, permutes the slice (`init_routing_v2`), sends the rows over the EP group
(`all_to_all`), regroups them by expert (`tensor_cast.cat`), runs the grouped gate/up GEMM
with SwiGLU and the grouped down GEMM, regroups them by source (`aten.cat`), sends them
back, unpermutes, weights and sums the top-k rows, adds the shared expert (run on the
slice with unsharded weights) and all-gathers the slices over TP. Without expert
parallelism it loops over the experts that receive rows (`tensorcast_expert_loop`).

Routing (`OpStack.moe_routing`): `tensorcast_split` is `get_split_sizes`: a source rank's
`P = slice x topk` routed rows go to experts 0, 1, ... in turn (`P // E` each, one more
for the first `P % E`), and every source sends the busiest rank (rank 0) the same rows,
so it computes `ep x` its own share; `expected` spreads the rows evenly (x
`expert_imbalance`) as the default graph does.
"""

from __future__ import annotations

import math

from perfcast.core.dtypes import dtype_bytes
from perfcast.workload.families.common import (check_divisible, dynamic_quantize,
                                               separate_activation_quant)
from perfcast.workload.families.traits import ArchTraits, MoeSpec, traits_for
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.tensors import TensorSpec


# (gate/up with SwiGLU, down) grouped GEMMs, by whether the rows arrive quantised (W8A8)
GROUPED_OPS = {False: ("tensor_cast.grouped_matmul_swiglu.default",
                       "tensor_cast.grouped_matmul.default"),
               True: ("tensor_cast.grouped_matmul_quant_swiglu.default",
                      "tensor_cast.grouped_matmul_quant.default")}


def applies(b: GraphBuilder) -> bool:
    plan = b.plan
    return (b.stack.moe_ep_dispatch == "all_to_all" and plan.moe_dispatch == "auto"
            and plan.dp == 1 and ((plan.ep > 1 and plan.moe_tp_size == 1) or plan.ep == 1))


def rows_per_expert(pairs: int, experts: int, first: int, count: int) -> list[int]:
    """Rows experts first..first+count-1 receive from one source under TensorCast's
    `get_split_sizes` (`pairs // experts` each, one more for the first `pairs % experts`)."""
    q, r = divmod(pairs, experts)
    return [q + (i < r) for i in range(first, first + count)]


def expert_split(pairs: int, experts: int, first: int, count: int) -> dict[int, int]:
    """TensorCast's `get_split_sizes`: `pairs` routed rows go to experts 0, 1, ... in turn
    (`pairs // experts` each, one more for the first `pairs % experts`); for experts
    first..first+count-1: {rows: how many of them get that many rows}, empty ones left out."""
    sizes: dict[int, int] = {}
    for n in rows_per_expert(pairs, experts, first, count):
        if n:
            sizes[n] = sizes.get(n, 0) + 1
    return sizes


def tensorcast_ep_moe(b: GraphBuilder, layers: tuple[int, ...], deps: tuple[str, ...],
                      stage: int, *, spec: MoeSpec, traits: ArchTraits) -> str:
    if b.plan.ep == 1:
        return tensorcast_expert_loop(b, layers, deps, stage, spec=spec, traits=traits)
    m, plan = b.model, b.plan
    tp, ep = plan.tp, plan.ep
    e, k, h = spec.num_experts, spec.topk, m.hidden_size
    local = check_divisible(e, ep, "routed experts", "ep_size")
    act = b.precision.activation
    act_b = dtype_bytes(act)
    w_dt, a_dt = b.precision.linear("moe.experts")
    w_b = dtype_bytes(w_dt)
    t_rank = b.local_batch.tokens
    t = -(-t_rank // tp)           # this TP rank's slice (tensor_split: the first is largest)
    pairs = t * k
    if b.stack.moe_routing == "tensorcast_split":
        q, r = divmod(pairs, e)
        rows = float(ep * (local * q + min(r, local)))
        groups = local if q else min(r, local)
    else:
        rows = b.batch.tokens * k / ep * plan.expert_imbalance
        groups = max(1, round(local * (1.0 - (1.0 - k / e) ** b.batch.tokens)))
    n_rows = max(1, math.ceil(rows))
    ins = dict(layers=layers, stage=stage)
    # the per-expert tensors TensorCast passes as list arguments (its exact split only)
    per_expert = ([n for n in rows_per_expert(pairs, e, 0, local) if n]
                  if b.stack.moe_routing == "tensorcast_split" else [])

    topk_w, topk_i = _router_and_gating(b, deps, t_rank, t, e, k, traits, **ins)
    idx = TensorSpec((t, k), "int64")
    x = TensorSpec((t, h), act)
    sent = TensorSpec((pairs, h), act)
    got = TensorSpec((n_rows, h), act)
    if _sigmoid_router(b) and t_rank % tp:  # the hidden states padded like the logits
        topk_i = _pad(b, "moe.pad_hidden", t_rank, t * tp, h, act, (topk_i,), **ins)
    last = b.elementwise("moe.permute", "tensor_cast.init_routing_v2.default", "moe_permute",
                         inputs=(x, idx), outputs=(sent,), flops=0, deps=(topk_i,), **ins)
    last = b.collective("moe.dispatch", "all_to_all", deps=(last,), participants=ep,
                        message_bytes=pairs * h * act_b,
                        shapes=((pairs, h), (n_rows, h)), **ins)
    if groups < local:
        # the rows regrouped by expert (`rearrange_token_by_expert`); when every local
        # expert receives rows the compiled graph keeps no such copy (the split of the
        # dispatched rows sinks into the grouped GEMM: sink_split_pass), as the dumps show
        pieces = tuple(TensorSpec((n, h), act) for n in per_expert for _ in range(ep))
        last = b.elementwise("moe.group_by_expert", "tensor_cast.cat.default", "copy",
                             inputs=(got,), outputs=(got,), flops=0, deps=(last,), **ins,
                             signature=(pieces, (got,)), extra={"list_inputs": 0})
    inter = spec.inter
    quant = separate_activation_quant(b, "moe.experts")
    if quant:  # the routed rows quantised for the W8A8 grouped GEMM
        last = dynamic_quantize(b, "moe.experts.gate_up_quant", n_rows, h, deps=(last,),
                                **ins)
    # per expert, after the rows and weights: weight scales, then activation scales
    scales = (TensorSpec((), "fp32"),) * (2 * len(per_expert)) if quant else ()
    gate_up_op, down_op = GROUPED_OPS[quant]
    gate_up_w, down_w = h * 2 * inter, inter * h
    up_bias, down_bias = (2 * inter, h) if traits.expert_bias else (0, 0)
    resident = {"weight_dtype": w_dt, "act_dtype": a_dt, "weight_shards": ep,
                "routed_rows": rows, "active_local_experts": float(groups)}
    mid = TensorSpec((n_rows, inter), act)
    last = b.compute(
        "moe.experts.gate_up", gate_up_op, "moe",
        flops=2.0 * rows * h * 2 * inter + 5.0 * rows * inter,
        bytes_read=rows * h * dtype_bytes(a_dt) + groups * gate_up_w * w_b,
        bytes_written=rows * inter * act_b, outputs=(mid,),
        inputs=tuple(TensorSpec((ep * n, h), a_dt) for n in per_expert)
        + tuple(TensorSpec((h, 2 * inter), w_dt) for _ in per_expert) + scales,
        axes={"m": n_rows, "n": 2 * inter, "k": h, "groups": groups}, deps=(last,),
        compute_dtype=act, **ins,
        extra={**resident, "list_inputs": 0, "weight_list_from": len(per_expert),
               "weight_params": local * (gate_up_w + up_bias),
               "weight_bytes": local * (gate_up_w * w_b + up_bias * act_b),
               "active_weight_params": k * gate_up_w / ep})
    if quant:
        last = dynamic_quantize(b, "moe.experts.down_quant", n_rows, inter, deps=(last,),
                                **ins)
    down_in = a_dt if quant else act
    last = b.compute(
        "moe.experts.down", down_op, "moe",
        flops=2.0 * rows * inter * h,
        bytes_read=rows * inter * dtype_bytes(down_in) + groups * down_w * w_b,
        bytes_written=rows * h * act_b, outputs=(got,),
        inputs=tuple(TensorSpec((ep * n, inter), down_in) for n in per_expert)
        + tuple(TensorSpec((inter, h), w_dt) for _ in per_expert) + scales,
        axes={"m": n_rows, "n": h, "k": inter, "groups": groups}, deps=(last,),
        compute_dtype=act, **ins,
        extra={**resident, "list_inputs": 0, "weight_list_from": len(per_expert),
               "weight_params": local * (down_w + down_bias),
               "weight_bytes": local * (down_w * w_b + down_bias * act_b),
               "active_weight_params": k * down_w / ep})
    by_source = tuple(TensorSpec((n, h), act) for _ in range(ep) for n in per_expert)
    last = b.elementwise("moe.group_by_source", "aten.cat.default", "copy", inputs=(got,),
                         outputs=(got,), flops=0, deps=(last,), **ins,
                         signature=(by_source, (got,)), extra={"list_inputs": 0})
    last = b.collective("moe.combine", "all_to_all", deps=(last,), participants=ep,
                        message_bytes=n_rows * h * act_b, shapes=((n_rows, h), (pairs, h)),
                        **ins)
    last = _unpermute_and_sum(b, sent, idx, last, topk_w, **ins)
    if spec.shared_inter:
        last = _shared_expert(b, spec.shared_inter, t, deps, last, quant_deps=(topk_i,),
                              **ins)
    if tp > 1:
        last = b.collective("moe.tp_all_gather", "all_gather", deps=(last,), participants=tp,
                            message_bytes=t * tp * h * act_b, shapes=((t, h), (t * tp, h)),
                            **ins)
    return last


def _unpermute_and_sum(b: GraphBuilder, rows: TensorSpec, idx: TensorSpec, last: str,
                       topk_w: str, **ins) -> str:
    """Back to token order (`unpermute_tokens` -> [t, k, h]), times the top-k weights,
    summed over k."""
    (t, k), (h,), act = idx.shape, rows.shape[1:], rows.dtype
    per_k = TensorSpec((t, k, h), act)
    last = b.elementwise("moe.unpermute", "tensor_cast.unpermute_tokens.default",
                         "moe_unpermute", inputs=(rows, idx), outputs=(per_k,), flops=0,
                         deps=(last,), **ins)
    last = b.elementwise("moe.weight", "aten.mul.Tensor", "mul",
                         inputs=(per_k, TensorSpec((t, k, 1), act)), outputs=(per_k,),
                         flops=t * k * h, deps=(last, topk_w), **ins)
    return b.elementwise("moe.sum_topk", "aten.sum.dim_IntList", "sum", inputs=(per_k,),
                         outputs=(TensorSpec((t, h), act),), flops=t * k * h, deps=(last,),
                         **ins)


def _sigmoid_router(b: GraphBuilder) -> bool:
    return str(b.model.raw.get("scoring_func", "softmax")) != "softmax"


def _pad(b: GraphBuilder, group: str, rows: int, padded: int, width: int, dtype: str,
         deps: tuple[str, ...], count: int | None = None, **ins) -> str:
    """`aten.constant_pad_nd` of [rows, width] to [padded, width] (a multiple of TP)."""
    x, y = TensorSpec((rows, width), dtype), TensorSpec((padded, width), dtype)
    return b.elementwise(group, "aten.constant_pad_nd.default", "pad", inputs=(x,),
                         outputs=(y,), flops=0, deps=deps, count=count, **ins)


def _router_and_gating(b: GraphBuilder, deps: tuple[str, ...], t_rank: int, t: int, e: int,
                       k: int, traits: ArchTraits, **ins) -> tuple[str, str]:
    """Router GEMM and top-k gating; returns the (weights, indices) lineages.

    A softmax router (Qwen3-MoE) runs on the TP rank's slice; under `softmax_gating:
    aten_ops` its gating is the aten chain TensorCast's compiled graph keeps. A sigmoid
    router (DeepSeek-V3's MoEGate, `scoring_func: sigmoid`) casts the hidden states and
    its weight to fp32 and runs over all the rank's tokens, its logits padded to a
    multiple of TP, then TensorCast's fused gating op on the slice and the top-k
    renormalisation (`norm_topk_prob`)."""
    h = b.model.hidden_size
    act = b.precision.activation
    bias = {"bias_params": e} if traits.router_bias else None
    top = TensorSpec((t, k), "fp32")
    col = TensorSpec((t, 1), "fp32")
    if not _sigmoid_router(b):
        router = b.gemm("moe.router", t, e, h, deps=deps, weight_shards=1, extra=bias, **ins)
        return _softmax_gating(b, router, t, e, k, **ins)
    tp = b.plan.tp
    x = b.elementwise("moe.router_input_fp32", "prims.convert_element_type.default",
                      "cast", inputs=(TensorSpec((t_rank, h), act),),
                      outputs=(TensorSpec((t_rank, h), "fp32"),), flops=0, deps=deps, **ins)
    last = b.gemm("moe.router", t_rank, e, h, deps=(x,), weight_shards=1, extra=bias,
                  weight_dtype="fp32", act_dtype="fp32", out_dtype="fp32", **ins)
    if t != t_rank and t_rank % tp:  # sliced over TP: logits padded to whole slices
        last = _pad(b, "moe.pad_logits", t_rank, t * tp, e, "fp32", (last,), **ins)
    gate = b.elementwise("moe.gating", "tensor_cast.moe_gating_top_k_softmax.default",
                         "moe_gating", inputs=(TensorSpec((t, e), "fp32"),),
                         outputs=(top, TensorSpec((t, k), "int64")), flops=5 * t * e,
                         deps=(last,), extra={"topk": k, "num_experts": e}, **ins)
    last = gate
    if b.model.raw.get("norm_topk_prob", False):
        last = b.elementwise("moe.gating.renorm_sum", "aten.sum.dim_IntList", "moe_gating",
                             inputs=(top,), outputs=(col,), flops=t * k, deps=(last,), **ins)
        last = b.elementwise("moe.gating.renorm_div", "aten.div.Tensor", "moe_gating",
                             inputs=(top, col), outputs=(top,), flops=t * k, deps=(last,),
                             **ins)
    last = b.elementwise("moe.gating.to_act", "prims.convert_element_type.default",
                         "moe_gating", inputs=(top,), outputs=(TensorSpec((t, k), act),),
                         flops=0, deps=(last,), **ins)
    return last, gate


def _softmax_gating(b: GraphBuilder, router: str, t: int, e: int, k: int,
                    **ins) -> tuple[str, str]:
    act = b.precision.activation
    m = b.model
    logits = TensorSpec((t, e), act)
    f32 = TensorSpec((t, e), "fp32")
    col = TensorSpec((t, 1), "fp32")
    top = TensorSpec((t, k), "fp32")
    if b.stack.softmax_gating != "aten_ops":
        g = b.elementwise("moe.gating", "tensor_cast.moe_gating_top_k_softmax.default",
                          "moe_gating", inputs=(f32,), outputs=(top, TensorSpec((t, k), "int64")),
                          flops=5 * t * e, deps=(router,), extra={"topk": k, "num_experts": e},
                          **ins)
        return g, g
    chain = [("to_fp32", "prims.convert_element_type.default", (logits,), (f32,), 0),
             ("max", "aten.amax.default", (f32,), (col,), t * e),
             ("sub", "aten.sub.Tensor", (f32, col), (f32,), t * e),
             ("exp", "aten.exp.default", (f32,), (f32,), t * e),
             ("sum", "aten.sum.dim_IntList", (f32,), (col,), t * e),
             ("div", "aten.div.Tensor", (f32, col), (f32,), t * e),
             ("topk", "aten.topk.default", (f32,), (top, TensorSpec((t, k), "int64")), t * e)]
    if m.raw.get("norm_topk_prob", False):
        chain += [("renorm_sum", "aten.sum.dim_IntList", (top,), (col,), t * k),
                  ("renorm_div", "aten.div.Tensor", (top, col), (top,), t * k)]
    chain.append(("to_act", "prims.convert_element_type.default", (top,),
                  (TensorSpec((t, k), act),), 0))
    last = router
    indices = ""
    for name, op, inputs, outputs, flops in chain:
        last = b.elementwise(f"moe.gating.{name}", op, "moe_gating", inputs=inputs,
                             outputs=outputs, flops=flops, deps=(last,), **ins)
        if name == "topk":
            indices = last
    return last, indices


def _shared_expert(b: GraphBuilder, inter: int, t: int, deps: tuple[str, ...], routed: str,
                   stream: bool = False, quant_deps: tuple[str, ...] = (), **ins) -> str:
    """The shared expert over `t` tokens with its whole (unsharded) weights, added to the
    routed output; `stream`: its activation and the add see [1, t, w] views. Under W8A8
    its input and intermediate are quantised by their own calls (the input once the
    tokens are sliced, after `quant_deps`)."""
    h = b.model.hidden_size
    act = b.precision.activation
    if separate_activation_quant(b, "moe.shared_experts.gate_up_proj"):
        deps = (dynamic_quantize(b, "moe.shared_experts.gate_up_quant", t, h,
                                 deps=(*deps, *quant_deps), stream=stream, **ins),)
    up = b.gemm("moe.shared_experts.gate_up_proj", t, 2 * inter, h, deps=deps, **ins)
    half = TensorSpec((t, inter), act)
    view = TensorSpec((1, t, inter), act) if stream else half
    swi = b.elementwise("moe.shared_experts.act", "tensor_cast.swiglu.default", "activation",
                        inputs=(TensorSpec((t, 2 * inter), act),), outputs=(half,),
                        flops=5 * t * inter, deps=(up,), signature=((view, view), (view,)),
                        **ins)
    if separate_activation_quant(b, "moe.shared_experts.down_proj"):
        swi = dynamic_quantize(b, "moe.shared_experts.down_quant", t, inter, deps=(swi,),
                               stream=stream, **ins)
    down = b.gemm("moe.shared_experts.down_proj", t, h, inter, deps=(swi,), **ins)
    x = TensorSpec((t, h), act)
    if traits_for(b.model).shared_expert_gate:  # sigmoid(shared_experts_gate(x)) * output
        gate = b.gemm("moe.shared_experts.gate", t, 1, h, deps=deps, weight_shards=1, **ins)
        col = TensorSpec((t, 1), act)
        gate = b.elementwise("moe.shared_experts.gate_sigmoid", "aten.sigmoid.default",
                             "activation", inputs=(col,), outputs=(col,), flops=4 * t,
                             deps=(gate,), **ins)
        down = b.elementwise("moe.shared_experts.gate_mul", "aten.mul.Tensor", "mul",
                             inputs=(x, col), outputs=(x,), flops=t * h, deps=(down, gate),
                             **ins)
    y = TensorSpec((1, t, h), act) if stream else x
    return b.elementwise("moe.add_shared", "aten.add.Tensor", "add", inputs=(x, x),
                         outputs=(x,), flops=t * h, deps=(routed, down), **ins,
                         signature=((y, y), (y,)))


def tensorcast_expert_loop(b: GraphBuilder, layers: tuple[int, ...], deps: tuple[str, ...],
                           stage: int, *, spec: MoeSpec, traits: ArchTraits) -> str:
    """Without expert parallelism TensorCast runs each expert that receives rows as its
    own TP-sharded MLP (`FusedMoETensorCast.forward` with one EP rank): the expert's rows
    padded to a multiple of TP (`constant_pad_nd`), gate/up `mm`, `swiglu`, down `mm`,
    a TP `all_reduce`; then `aten.cat`, `unpermute_tokens`, the top-k weighting and sum,
    and the shared expert over all the tokens with its whole weights. Rows per expert
    follow `get_split_sizes` (`expert_split`) under `moe_routing: tensorcast_split`, else
    the expected rows spread over the experts that receive any."""
    m, plan = b.model, b.plan
    tp = plan.tp
    e, k, h = spec.num_experts, spec.topk, m.hidden_size
    act = b.precision.activation
    act_b = dtype_bytes(act)
    inter = check_divisible(spec.inter, tp, "moe_intermediate_size", "tp_size")
    t = b.local_batch.tokens
    pairs = t * k
    ins = dict(layers=layers, stage=stage)
    topk_w, topk_i = _router_and_gating(b, deps, t, t, e, k, traits, **ins)
    idx = TensorSpec((t, k), "int64")
    routed = TensorSpec((pairs, h), act)
    last = b.elementwise("moe.permute", "tensor_cast.init_routing_v2.default", "moe_permute",
                         inputs=(TensorSpec((t, h), act), idx), outputs=(routed,), flops=0,
                         deps=(topk_i,), **ins,
                         signature=((TensorSpec((1, t, h), act), idx), (routed,)))
    if b.stack.moe_routing == "tensorcast_split":
        sizes = expert_split(pairs, e, 0, e)
    else:
        active = max(1, round(e * (1.0 - (1.0 - k / e) ** t)))
        sizes = {max(1, round(pairs / active)): active}
    w_dt = b.precision.linear("moe.experts")[0]
    quant = separate_activation_quant(b, "moe.experts")
    resident = e * 3 * h * inter  # every expert's gate, up and down shard
    # biases: gate/up split like its weight, the down bias whole on each rank (counted once)
    bias = e * (2 * inter + h / tp) if traits.expert_bias else 0
    outs = []
    for n, (rows, calls) in enumerate(sorted(sizes.items())):
        padded = -(-rows // tp) * tp
        pre = f"moe.experts.rows{rows}"
        step = last
        if padded != rows:
            step = _pad(b, pre + ".pad", rows, padded, h, act, (step,), count=calls, **ins)
        weights = {"weight_params": resident + bias if n == 0 else 0, "weight_shards": tp,
                   "weight_bytes": resident * dtype_bytes(w_dt) + bias * act_b if n == 0
                   else 0.0,
                   "layer_count": b.layer_count(layers),
                   "active_weight_params": k * 3 * h * spec.inter / tp if n == 0 else 0}
        if quant:
            step = dynamic_quantize(b, pre + ".gate_up_quant", padded, h, deps=(step,),
                                    count=calls, **ins)
        up = b.gemm(pre + ".gate_up_proj", padded, 2 * inter, h, deps=(step,), count=calls,
                    weight_shards=tp, extra=dict(weights), **ins)
        half = TensorSpec((padded, inter), act)
        swi = b.elementwise(pre + ".act", "tensor_cast.swiglu.default", "activation",
                            inputs=(TensorSpec((padded, 2 * inter), act),), outputs=(half,),
                            flops=5 * padded * inter, deps=(up,), count=calls,
                            signature=((half, half), (half,)), **ins)
        if quant:
            swi = dynamic_quantize(b, pre + ".down_quant", padded, inter, deps=(swi,),
                                   count=calls, **ins)
        down = b.gemm(pre + ".down_proj", padded, h, inter, deps=(swi,), count=calls,
                      weight_shards=tp, extra={"weight_params": 0, "weight_bytes": 0.0,
                                               "active_weight_params": 0}, **ins)
        outs.append(b.collective(pre + ".all_reduce", "all_reduce", deps=(down,),
                                 participants=tp, message_bytes=padded * h * act_b,
                                 count=calls, shapes=((padded, h), (padded, h)), **ins)
                    if tp > 1 else down)
    pieces = (tuple(TensorSpec((n, h), act) for n in rows_per_expert(pairs, e, 0, e) if n)
              if b.stack.moe_routing == "tensorcast_split" else ())
    last = b.elementwise("moe.group_by_source", "aten.cat.default", "copy", inputs=(routed,),
                         outputs=(routed,), flops=0, deps=tuple(outs), **ins,
                         signature=(pieces, (routed,)), extra={"list_inputs": 0})
    last = _unpermute_and_sum(b, routed, idx, last, topk_w, **ins)
    if spec.shared_inter:
        last = _shared_expert(b, spec.shared_inter, t, deps, last, stream=True, **ins)
    return last
