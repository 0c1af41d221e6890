"""TensorCast's expert-parallel MoE layer, call for call (stack `tensorcast`).

`FusedMoETensorCast` (Ascend/msmodeling 84fec85, tensor_cast/layers/moe_layer.py): each
TP rank takes its slice of the tokens (`tensor_split`), runs the router and the top-k
gating on it, permutes the slice (`init_routing_v2`), sends the rows over the EP group
(`all_to_all`), regroups them by expert (`tensor_cast.cat`), runs the grouped gate/up GEMM
with SwiGLU and the grouped down GEMM, regroups them by source (`aten.cat`), sends them
back, unpermutes, weights and sums the top-k rows, adds the shared expert (run on the
slice with unsharded weights) and all-gathers the slices over TP.

Routing (`OpStack.moe_routing`): `tensorcast_split` is `get_split_sizes`: a source rank's
`P = slice x topk` routed rows go to experts 0, 1, ... in turn (`P // E` each, one more
for the first `P % E`), and every source sends the busiest rank (rank 0) the same rows,
so it computes `ep x` its own share; `expected` spreads the rows evenly (x
`expert_imbalance`) as the default graph does.
"""

from __future__ import annotations

import math

from perfcast.core.dtypes import dtype_bytes
from perfcast.workload.families.common import check_divisible
from perfcast.workload.families.traits import ArchTraits, MoeSpec
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.tensors import TensorSpec


def applies(b: GraphBuilder) -> bool:
    plan = b.plan
    return (b.stack.moe_ep_dispatch == "all_to_all" and plan.moe_dispatch == "auto"
            and plan.ep > 1 and plan.moe_tp_size == 1 and plan.dp == 1)


def tensorcast_ep_moe(b: GraphBuilder, layers: tuple[int, ...], deps: tuple[str, ...],
                      stage: int, *, spec: MoeSpec, traits: ArchTraits) -> str:
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

    router = b.gemm("moe.router", t, e, h, deps=deps, weight_shards=1,
                    extra={"bias_params": e} if traits.router_bias else None, **ins)
    topk_w, topk_i = _gating(b, router, t, e, k, **ins)
    idx = TensorSpec((t, k), "int64")
    x = TensorSpec((t, h), act)
    sent = TensorSpec((pairs, h), act)
    got = TensorSpec((n_rows, h), act)
    last = b.elementwise("moe.permute", "tensor_cast.init_routing_v2.default", "moe_permute",
                         inputs=(x, idx), outputs=(sent,), flops=0, deps=(topk_i,), **ins)
    last = b.collective("moe.dispatch", "all_to_all", deps=(last,), participants=ep,
                        message_bytes=pairs * h * act_b,
                        shapes=((pairs, h), (n_rows, h)), **ins)
    last = b.elementwise("moe.group_by_expert", "tensor_cast.cat.default", "copy",
                         inputs=(got,), outputs=(got,), flops=0, deps=(last,), **ins,
                         signature=((), (got,)))
    inter = spec.inter
    gate_up_w, down_w = h * 2 * inter, inter * h
    resident = {"weight_dtype": w_dt, "act_dtype": a_dt, "weight_shards": ep,
                "routed_rows": rows, "active_local_experts": float(groups)}
    mid = TensorSpec((n_rows, inter), act)
    last = b.compute(
        "moe.experts.gate_up", "tensor_cast.grouped_matmul_swiglu.default", "moe",
        flops=2.0 * rows * h * 2 * inter + 5.0 * rows * inter,
        bytes_read=rows * h * dtype_bytes(a_dt) + groups * gate_up_w * w_b,
        bytes_written=rows * inter * act_b, inputs=(), outputs=(mid,),
        axes={"m": n_rows, "n": 2 * inter, "k": h, "groups": groups}, deps=(last,),
        compute_dtype=act, **ins,
        extra={**resident, "weight_params": local * gate_up_w,
               "weight_bytes": local * gate_up_w * w_b,
               "active_weight_params": k * gate_up_w / ep})
    last = b.compute(
        "moe.experts.down", "tensor_cast.grouped_matmul.default", "moe",
        flops=2.0 * rows * inter * h, bytes_read=rows * inter * act_b + groups * down_w * w_b,
        bytes_written=rows * h * act_b, inputs=(), outputs=(got,),
        axes={"m": n_rows, "n": h, "k": inter, "groups": groups}, deps=(last,),
        compute_dtype=act, **ins,
        extra={**resident, "weight_params": local * down_w, "weight_bytes": local * down_w * w_b,
               "active_weight_params": k * down_w / ep})
    last = b.elementwise("moe.group_by_source", "aten.cat.default", "copy", inputs=(got,),
                         outputs=(got,), flops=0, deps=(last,), **ins, signature=((), (got,)))
    last = b.collective("moe.combine", "all_to_all", deps=(last,), participants=ep,
                        message_bytes=n_rows * h * act_b, shapes=((n_rows, h), (pairs, h)),
                        **ins)
    per_k = TensorSpec((t, k, h), act)
    last = b.elementwise("moe.unpermute", "tensor_cast.unpermute_tokens.default",
                         "moe_unpermute", inputs=(sent, idx), outputs=(per_k,), flops=0,
                         deps=(last,), **ins)
    last = b.elementwise("moe.weight", "aten.mul.Tensor", "mul",
                         inputs=(per_k, TensorSpec((t, k, 1), act)), outputs=(per_k,),
                         flops=t * k * h, deps=(last, topk_w), **ins)
    last = b.elementwise("moe.sum_topk", "aten.sum.dim_IntList", "sum", inputs=(per_k,),
                         outputs=(x,), flops=t * k * h, deps=(last,), **ins)
    if spec.shared_inter:
        last = _shared_expert(b, spec.shared_inter, t, deps, last, **ins)
    if tp > 1:
        last = b.collective("moe.tp_all_gather", "all_gather", deps=(last,), participants=tp,
                            message_bytes=t * tp * h * act_b, shapes=((t, h), (t * tp, h)),
                            **ins)
    return last


def _gating(b: GraphBuilder, router: str, t: int, e: int, k: int, **ins) -> tuple[str, str]:
    """Top-k gating of the slice's router logits; returns (weights, indices) lineages.
    A softmax router under `softmax_gating: aten_ops` is the chain TensorCast's compiled
    graph keeps; other routers (sigmoid scoring, grouped top-k) its fused op."""
    act = b.precision.activation
    m = b.model
    logits = TensorSpec((t, e), act)
    f32 = TensorSpec((t, e), "fp32")
    col = TensorSpec((t, 1), "fp32")
    top = TensorSpec((t, k), "fp32")
    softmax = str(m.raw.get("scoring_func", "softmax")) == "softmax"
    if not (softmax and b.stack.softmax_gating == "aten_ops"):
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
                   **ins) -> str:
    """The shared expert on this rank's token slice with its whole (unsharded) weights,
    added to the routed output."""
    h = b.model.hidden_size
    act = b.precision.activation
    up = b.gemm("moe.shared_experts.gate_up_proj", t, 2 * inter, h, deps=deps, **ins)
    half = TensorSpec((t, inter), act)
    swi = b.elementwise("moe.shared_experts.act", "tensor_cast.swiglu.default", "activation",
                        inputs=(TensorSpec((t, 2 * inter), act),), outputs=(half,),
                        flops=5 * t * inter, deps=(up,), signature=((half, half), (half,)),
                        **ins)
    down = b.gemm("moe.shared_experts.down_proj", t, h, inter, deps=(swi,), **ins)
    x = TensorSpec((t, h), act)
    return b.elementwise("moe.add_shared", "aten.add.Tensor", "add", inputs=(x, x),
                         outputs=(x,), flops=t * h, deps=(routed, down), **ins)
