"""Feed-forward blocks: the dense SwiGLU MLP and the routed MoE layer.

MoE placement (see `ParallelPlan`): the `dp x tp` devices of a stage hold the experts
as `ep x moe_tp`. A DP rank's `tp` devices hold the same tokens. Dispatch modes:

| mode         | tokens reach experts by                 | combine                              |
|--------------|-----------------------------------------|--------------------------------------|
| none         | one device                              | -                                    |
| all_reduce   | already replicated on the TP group      | all_reduce over tp (shared experts fused) |
| all_to_all   | each device sends its 1/tp slice, top-k copies | all_to_all back, all_gather over tp |
| all_gather   | all_gather over the dp ranks            | reduce_scatter over dp x tp, all_gather over tp |

Routing model: tokens spread evenly over experts; the most loaded EP rank receives
`expert_imbalance` times the mean. An EP rank's expert is *active* when at least one
routed row reaches it: E_local * (1 - (1 - topk/E)^tokens) in expectation; only active
experts' weights are read.
"""

from __future__ import annotations

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.workload.families.common import (
    check_divisible,
    dynamic_quantize,
    norm_rows,
    separate_activation_quant,
    sequence_parallel,
    tp_all_reduce,
)
from perfcast.workload.families.traits import ArchTraits, MoeSpec
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.tensors import TensorSpec


def dense_mlp(b: GraphBuilder, layers: tuple[int, ...], deps: tuple[str, ...], stage: int, *,
              inter: int, prefix: str = "mlp", combine: bool = True) -> str:
    """Column-parallel gate/up, SwiGLU, row-parallel down, then the TP all-reduce
    (skipped with `combine=False` when a later collective sums the partial output)."""
    m = b.model
    tp = b.plan.tp
    inter_l = check_divisible(inter, tp, f"{prefix} intermediate_size", "tp_size")
    tokens = b.local_batch.tokens
    act = b.precision.activation
    up = b.gemm(f"{prefix}.gate_up_proj", tokens, 2 * inter_l, m.hidden_size, layers=layers,
                deps=deps, weight_shards=tp, stage=stage)
    gated = TensorSpec((tokens, 2 * inter_l), act)
    half = TensorSpec((1, tokens, inter_l), act)  # TensorCast passes gate and up apart
    swi = b.elementwise(f"{prefix}.act", "tensor_cast.swiglu.default", "activation",
                        inputs=(gated,), outputs=(TensorSpec((tokens, inter_l), act),),
                        flops=5 * tokens * inter_l, layers=layers, deps=(up,), stage=stage,
                        signature=((half, half), (half,)) if b.stack.tensorcast_tensors
                        else None)
    if separate_activation_quant(b, f"{prefix}.down_proj"):
        swi = dynamic_quantize(b, f"{prefix}.down_proj_quant", tokens, inter_l, layers=layers,
                               deps=(swi,), stage=stage, stream=True)
    down = b.gemm(f"{prefix}.down_proj", tokens, m.hidden_size, inter_l, layers=layers,
                  deps=(swi,), weight_shards=tp, stage=stage)
    if not combine:
        return down
    return tp_all_reduce(b, f"{prefix}.all_reduce", tokens, m.hidden_size, tp, layers=layers,
                         deps=(down,), stage=stage) or down


def moe_ffn(b: GraphBuilder, layers: tuple[int, ...], deps: tuple[str, ...], stage: int, *,
            spec: MoeSpec, traits: ArchTraits) -> str:
    """Router, top-k gating, dispatch, routed experts, combine, shared experts."""
    from perfcast.workload.families import moe_tensorcast

    m, plan = b.model, b.plan
    plan.check_moe_layout()
    if moe_tensorcast.applies(b):
        return moe_tensorcast.tensorcast_ep_moe(b, layers, deps, stage, spec=spec,
                                                traits=traits)
    tp, dp, ep = plan.tp, plan.dp, plan.ep
    devices = plan.devices_per_stage
    moe_tp = plan.moe_tp_size
    e, k, h = spec.num_experts, spec.topk, m.hidden_size
    if ep > e:
        raise ConfigError(f"ep_size={ep} exceeds the {e} routed experts", source=m.source,
                          field="ep_size", expected=f"at most {e}")
    local_experts = check_divisible(e, ep, "routed experts", "ep_size")
    inter_l = check_divisible(spec.inter, moe_tp, "moe_intermediate_size", "moe_tp_size")
    mode = plan.moe_dispatch_mode
    if mode == "all_to_all" and moe_tp != 1:
        raise ConfigError(f"all_to_all dispatch needs moe_tp_size=1, got {moe_tp}",
                          field="moe_dispatch", expected="all_gather or all_reduce with moe_tp > 1")
    if mode == "all_reduce" and dp != 1:
        raise ConfigError("all_reduce dispatch needs replicated tokens (dp_size=1)",
                          field="moe_dispatch", expected="all_to_all or all_gather with dp > 1")
    act = b.precision.activation
    act_b = dtype_bytes(act)
    t_rank = b.local_batch.tokens          # tokens of the busiest DP rank, on each of its tp
    t_all = b.batch.tokens                 # tokens entering this MoE layer over the stage
    t_pad = t_rank * dp                    # equal-size collective buffers over the DP ranks
    pairs = t_all * k / ep * plan.expert_imbalance   # routed rows on the busiest EP rank
    active = local_experts * (1.0 - (1.0 - k / e) ** t_all)
    # axis names of measured MoE tables (AIConfigurator moe_perf as perfcast imports it)
    moe_axes = {"tokens": t_all, "hidden_size": h, "inter_size": spec.inter, "topk": k,
                "num_experts": e, "moe_ep": ep, "moe_tp": moe_tp,
                "local_experts": local_experts, "tokens_per_rank": t_rank,
                "distribution": "balanced" if plan.expert_imbalance == 1.0
                else f"imbalance_{plan.expert_imbalance:g}"}

    # permute and unpermute run inside a fused MoE module: they carry the module's
    # identity so measured module evidence can state that it already covers them
    w_dt, a_dt = b.precision.linear("moe.experts")
    module_axes = {"module": "moe", "module.weight_dtype": str(w_dt),
                   "module.act_dtype": str(a_dt),
                   **{f"module.{name}": v for name, v in moe_axes.items()}}

    router_extra = {"bias_params": e} if traits.router_bias else None
    router = b.gemm("moe.router", t_rank, e, h, layers=layers, deps=deps, stage=stage,
                    weight_shards=1, replicas=tp, extra=router_extra)
    logits = TensorSpec((t_rank, e), "fp32")
    gate = b.elementwise("moe.gating", "tensor_cast.moe_gating_top_k_softmax.default",
                         "moe_gating", inputs=(logits,),
                         outputs=(TensorSpec((t_rank, k), "fp32"), TensorSpec((t_rank, k), "int32")),
                         flops=5 * t_rank * e, layers=layers, deps=(router,), stage=stage,
                         replicas=tp, extra={"topk": k, "num_experts": e})

    # tokens this device routes itself and the rows it sends/gets back
    if mode == "all_to_all":
        t_src = t_rank / tp
        src_rows = t_src * k
    else:
        t_src = t_rank if mode != "all_gather" else t_pad
        src_rows = pairs
    last = gate
    if mode == "all_gather":
        last = b.collective("moe.dispatch_all_gather", "all_gather", layers=layers,
                            deps=(last,), stage=stage, participants=dp,
                            message_bytes=t_pad * h * act_b)
    permute = b.elementwise(
        "moe.permute", "tensor_cast.init_routing_v2.default", "moe_permute",
        inputs=(TensorSpec((_ceil(t_src), h), act), TensorSpec((_ceil(t_src), k), "int32")),
        outputs=(TensorSpec((_ceil(src_rows), h), act),), flops=0, layers=layers,
        deps=(last,), stage=stage, replicas=moe_tp, axes=module_axes)
    last = permute
    if mode == "all_to_all":
        disp_dt = b.precision.linear("moe.experts")[1]
        last = b.collective("moe.dispatch", "all_to_all", layers=layers, deps=(last,),
                            stage=stage, participants=devices, dtype=disp_dt,
                            message_bytes=src_rows * h * dtype_bytes(disp_dt))
    shards = ep * moe_tp
    per_expert = 3 * h * spec.inter
    experts = b.moe_experts(
        "moe.experts", pairs=pairs, hidden=h, inter_local=inter_l, local_experts=local_experts,
        active_local_experts=active, weight_shards=shards,
        active_weight_params=k * per_expert / shards, bias=traits.expert_bias,
        moe_tp=moe_tp, layers=layers,
        deps=(last,), stage=stage, axes=moe_axes)
    last = experts
    if mode == "all_to_all":
        last = b.collective("moe.combine", "all_to_all", layers=layers, deps=(last,),
                            stage=stage, participants=devices, message_bytes=src_rows * h * act_b)
    unpermute = b.elementwise(
        "moe.unpermute", "tensor_cast.unpermute_tokens.default", "moe_unpermute",
        inputs=(TensorSpec((_ceil(src_rows), h), act),),
        outputs=(TensorSpec((_ceil(t_src), h), act),), flops=2 * src_rows * h,
        layers=layers, deps=(last,), stage=stage, replicas=moe_tp, axes=module_axes)
    last = unpermute
    shared = None
    if spec.shared_inter:
        shared = dense_mlp(b, layers, deps, stage, inter=spec.shared_inter,
                           prefix="moe.shared_experts", combine=mode != "all_reduce")
        if traits.shared_expert_gate:
            shared = b.gemm("moe.shared_experts.gate", t_rank, 1, h, layers=layers,
                            deps=(shared,), stage=stage, weight_shards=1, replicas=tp)
    if mode == "all_gather":
        last = b.collective("moe.combine_reduce_scatter", "reduce_scatter", layers=layers,
                            deps=(last,), stage=stage, participants=devices,
                            message_bytes=t_pad * h * act_b)
    # under sequence parallelism the dp modes already leave each TP rank its token slice
    sliced = sequence_parallel(b) and mode in ("all_gather", "all_to_all")
    if mode in ("all_gather", "all_to_all") and tp > 1 and not sliced:
        last = b.collective("moe.tp_all_gather", "all_gather", layers=layers, deps=(last,),
                            stage=stage, participants=tp, message_bytes=t_rank * h * act_b)
    if shared is not None:
        # routed + shared output; under all_reduce dispatch both are TP partial sums
        rows, replicas = norm_rows(b, t_rank) if sliced else (t_rank, tp)
        last = b.elementwise(
            "moe.add_shared", "aten.add.Tensor", "add",
            inputs=(TensorSpec((rows, h), act), TensorSpec((rows, h), act)),
            outputs=(TensorSpec((rows, h), act),), flops=rows * h, layers=layers,
            deps=(last, shared), stage=stage, replicas=replicas)
    if mode == "all_reduce":
        last = tp_all_reduce(b, "moe.all_reduce", t_rank, h, tp, layers=layers, deps=(last,),
                             stage=stage) or last
    return last


def _ceil(x: float) -> int:
    return max(1, int(-(-x // 1)))
