"""Per-chunk training graphs: forward, backward, DP gradient and ZeRO collectives.

Collective groups follow Megatron-LM's rank order (tp innermost, then cp, dp, pp): a
group of n ranks with stride s spans s (n - 1) + 1 consecutive devices, and its tier is
the innermost one that holds that span (`System.tier_for_group`). The DP, ZeRO, CP and
pipeline collectives training adds name it in their `tier` axis so cost and stream agree;
TP groups (and EP groups without CP) are contiguous, so the collective model's default
tier for their size is already theirs and the inference graph's tasks stay as they are.
Gradient buckets are one layer's gradients (per layer run, issued as soon as that layer's
weight gradients exist) plus one bucket for the parameters outside the layers (embedding,
final norm, LM head).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.frozen import FrozenDict
from perfcast.hardware import System
from perfcast.training.graph import (
    ATTENTION_OPS,
    GRAD_BYTES,
    PARAM_BYTES,
    backward_tasks,
    chunk_forward_tasks,
    drop_tasks,
    expand_unfused_attention,
    saved_activation_bytes,
)
from perfcast.training.layout import TrainingLayout
from perfcast.workload import MemoryFacts, TaskGraph
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.tensors import Engine, Task, TaskKind, TensorSpec, Work


@dataclass(frozen=True)
class Tiers:
    tp: str
    cp: str
    dp: str
    pp: str


def tiers_for(system: System, layout: TrainingLayout) -> Tiers:
    def span(n: int, stride: int) -> str:
        return system.tier_for_group(stride * (n - 1) + 1).name

    tp, cp, dp = layout.tp, layout.cp, layout.dp
    return Tiers(tp=span(tp, 1), cp=span(cp, tp), dp=span(dp, tp * cp),
                 pp=span(2, tp * cp * dp) if layout.pp > 1 else span(1, 1))


@dataclass(frozen=True)
class ChunkGraphs:
    """Work of one model chunk for one microbatch, on one device (stage 0 of each graph).

    `backward_dp` = `backward` plus the chunk's DP gradient collectives (per layer run);
    under ZeRO-2/3 every microbatch runs it, otherwise only the last. `params` /
    `expert_params`: parameters one device holds (after TP/EP sharding, before ZeRO);
    `saved_bytes`: activations kept between this chunk's forward and backward;
    `layer_saved_bytes`: per layer run (lineage prefix), the bytes of one layer."""

    chunk: int
    device: int
    forward: TaskGraph
    backward: TaskGraph
    backward_dp: TaskGraph
    params: float
    expert_params: float
    saved_bytes: float
    layer_saved_bytes: FrozenDict
    max_layer_params: float  # the most parameters (dense + expert) of one bucket: a layer


def _params(tasks: list[Task], last_chunk_holds_head: bool) -> tuple[float, float, dict]:
    """(dense, expert) parameters on one device, and per layer run (dense, expert) per layer."""
    dense = expert = 0.0
    runs: dict[str, list[float]] = {}
    for t in tasks:
        local = float(t.attributes.get("weight_params", 0) or 0)
        if t.group == "final.lm_head" and not local and last_chunk_holds_head:
            local = float(t.inputs[1].numel)  # tied head: the last stage holds its own copy
        if not local:
            continue
        reps = int(t.attributes.get("layer_count", t.count))
        is_expert = t.operation == "moe"
        if is_expert:
            expert += local * reps
        else:
            dense += local * reps
        key = t.lineage.split(".", 1)[0] if t.layers is not None else ""
        slot = runs.setdefault(key, [0.0, 0.0])
        slot[1 if is_expert else 0] += local if t.layers is not None else local * reps
    return dense, expert, runs


def collective_task(lineage: str, group: str, operation: str, message: float,
                    participants: int, tier: str, *, deps=(), layers=None, count: int = 1,
                    devices: int = 1, dtype: str = "bf16",
                    attributes: dict | None = None) -> Task:
    """A collective that training adds (DP, ZeRO, CP, pipeline), on its named tier."""
    n = max(1, int(message / dtype_bytes(dtype)))
    return Task(lineage=lineage, group=group, operator=f"tensor_cast.{operation}.default",
                operation=operation, kind=TaskKind.COMMUNICATION,
                inputs=(TensorSpec((n,), dtype),), outputs=(TensorSpec((n,), dtype),),
                work=Work(engine=Engine.NETWORK, compute_dtype=dtype, message_bytes=message,
                          participants=participants,
                          axes=FrozenDict({"message_bytes": int(message),
                                           "participants": participants, "tier": tier})),
                deps=tuple(deps), count=count, devices=devices, stage=0, layers=layers,
                attributes=FrozenDict(attributes or {}))


def _cp_exchange(tasks: list[Task], layout: TrainingLayout, tiers: Tiers) -> list[Task]:
    """Context parallelism: each attention core first gathers the K and V of the whole
    sequence from the cp ranks (ring attention's transfers as one all-gather, not
    overlapped with the core); its backward mirrors it (reduce-scatter of dK, dV)."""
    if layout.cp == 1:
        return tasks
    out = []
    for t in tasks:
        if t.operation in ATTENTION_OPS:
            k, v = t.inputs[1], t.inputs[2]
            message = k.nbytes + v.nbytes
            prefix = t.lineage[: len(t.lineage) - len(t.group)]
            group = "attn.cp_kv_all_gather" + t.group[len("attn.core"):]
            g = collective_task(prefix + group, group, "all_gather", message, layout.cp, tiers.cp,
                            deps=t.deps, layers=t.layers, count=t.count, devices=t.devices,
                            dtype=k.dtype)
            out.append(g)
            t = replace(t, deps=(g.lineage,))
        out.append(t)
    return out


# SMs Transformer Engine's userbuffers communication kernels occupy while they overlap a
# GEMM (`initialize_ub` defaults, transformer_engine/pytorch/module/base.py at d0067d0da6
# and at 8c0a0c934 of 2024-07): `num_sm` 16 for the `pipeline` (GEMM + reduce-scatter:
# proj_fprop, fc2_fprop) and `bulk` methods (qkv/fc1 dgrad + all-gather of the input for
# the wgrad, qkv/fc1 wgrad + reduce-scatter of the dgrad); `ring_exchange` (all-gather +
# GEMM: qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad) moves data with the copy engines
# (`use_ce` true) and takes no SM from the GEMM.
TE_COMM_SMS = {"pipeline": 16, "bulk": 16, "ring_exchange": 0}
# SMs per device: NVIDIA A100 whitepaper (108 SMs on A100), H100 whitepaper (132 SMs on H100
# SXM5); H200 is the same GH100 configuration with more memory.
DEVICE_SMS = {"a100_sxm": 108, "h100_sxm": 132, "h200_sxm": 132}


def te_overlap_method(comm: Task, gemm_before: bool) -> str:
    """The TE userbuffers method that overlaps this TP collective with its GEMM: a
    reduction after its GEMM is `pipeline` (forward) or `bulk` (backward, the input-gradient
    reduce-scatter); the sequence-parallel re-gather of a wgrad's input is `bulk`; the
    all-gather that feeds a GEMM (forward input, output-gradient before a dgrad) is
    `ring_exchange`."""
    if gemm_before or comm.operation != "all_gather":
        return "bulk" if comm.group.startswith("bwd.") else "pipeline"
    return "bulk" if comm.group.endswith("input_all_gather") else "ring_exchange"


def overlap_tp_comm(tasks: list[Task], tp: int) -> list[Task]:
    """TP communication overlapped with its GEMM (Megatron/Transformer Engine
    `--tp-comm-overlap`: the collective is split into chunks pipelined with the GEMM), as
    a dependency change: a TP collective that follows a GEMM (row-parallel output, dgrad)
    starts with that GEMM, one that feeds a GEMM (sequence-parallel all-gather) runs beside
    it, and whoever consumed either waits for both, so the pair takes max(GEMM, comm)
    plus what contention adds, instead of their sum. The GEMM of a pair is marked with its
    TE method (`tp_overlap_method`): the contention it suffers is priced after the
    resolver (`estimate.contended`)."""
    if tp == 1:
        return tasks
    by = {t.lineage: t for t in tasks}
    deps = {t.lineage: list(t.deps) for t in tasks}
    consumers: dict[str, list[str]] = {t.lineage: [] for t in tasks}
    for t in tasks:
        for d in t.deps:
            consumers[d].append(t.lineage)
    method: dict[str, str] = {}  # GEMM lineage -> TE method of the collective it overlaps
    for t in tasks:
        if t.kind is not TaskKind.COMMUNICATION or t.work.participants != tp:
            continue
        c = t.lineage
        gemm_before = [d for d in deps[c] if by[d].operation == "gemm"]
        gemm_after = [x for x in consumers[c] if by[x].operation == "gemm"]
        if len(deps[c]) == 1 and gemm_before:
            g = gemm_before[0]
            deps[c] = list(deps[g])
            method[g] = te_overlap_method(t, True)
            for x in consumers[c]:
                deps[x].append(g)
        elif gemm_after:
            for g in gemm_after:
                method[g] = te_overlap_method(t, False)
                deps[g] = [d for d in deps[g] if d != c] + [d for d in deps[c]
                                                             if d not in deps[g]]
                for x in consumers[g]:
                    deps[x].append(c)
    out = []
    for t in tasks:
        t = replace(t, deps=tuple(dict.fromkeys(deps[t.lineage])))
        if t.lineage in method:
            attrs = dict(t.attributes)
            attrs["tp_overlap_method"] = method[t.lineage]
            t = replace(t, attributes=FrozenDict(attrs))
        out.append(t)
    return out


def _zero3_gathers(tasks: list[Task], runs: dict, layout: TrainingLayout, tiers: Tiers,
                   *, backward: bool) -> list[Task]:
    """ZeRO-3: before each layer (and before the chunk's other weighted ops) the layer's
    parameters are all-gathered over the dp x cp ranks; its GEMMs wait for them."""
    if layout.zero_stage < 3 or layout.data_ranks == 1:
        return tasks
    gathers: dict[str, Task] = {}
    for t in tasks:
        key = t.lineage.split(".", 1)[0] if t.layers is not None else ""
        if key in gathers or key not in runs:
            continue
        dense, expert = runs[key]
        prefix = key + "." if key else ""
        group = ("bwd." if backward else "") + "zero3.param_all_gather"
        message = (dense + expert * layout.data_ranks / layout.expert_data_ranks) \
            * PARAM_BYTES
        gathers[key] = collective_task(prefix + group, group, "all_gather", message,
                                   layout.data_ranks, tiers.dp, layers=t.layers,
                                   count=t.count if t.layers is not None else 1,
                                   devices=t.devices)
    out = list(gathers.values())
    for t in tasks:
        key = t.lineage.split(".", 1)[0] if t.layers is not None else ""
        if key in gathers and t.operation in ("gemm", "moe", "moe_backward"):
            t = replace(t, deps=(*t.deps, gathers[key].lineage))
        out.append(t)
    return out


def _dp_gradient_tasks(backward: list[Task], runs: dict, layout: TrainingLayout,
                       tiers: Tiers, bucket_params: int = 0) -> list[Task]:
    """Gradient collectives per layer run (each layer's buckets, after its weight
    gradients) and for the parameters outside the layers: all-reduce (ZeRO-0) or
    reduce-scatter (ZeRO-1/2/3) over dp x cp; expert gradients over dp x cp x tp / ep.
    `bucket_params` > 0 splits a layer's gradients into buckets of at most that many
    parameters (n equal collectives per layer); 0: one bucket per layer. Buckets never
    span layers."""
    op = "all_reduce" if layout.zero_stage == 0 else "reduce_scatter"

    def split(params: float) -> tuple[int, float]:
        n = max(1, -(-int(params) // bucket_params)) if bucket_params else 1
        return n, params / n

    out = []
    wgrads: dict[str, list[Task]] = {}
    for t in backward:
        if t.group.endswith(".wgrad") or t.operation in ("moe_backward", "norm_backward",
                                                         "embedding_backward"):
            key = t.lineage.split(".", 1)[0] if t.layers is not None else ""
            wgrads.setdefault(key, []).append(t)
    for key, (dense, expert) in runs.items():
        producers = wgrads.get(key, [])
        if not producers:
            continue
        first = producers[0]
        prefix = key + "." if key else ""
        count = first.count if first.layers is not None else 1
        common = dict(layers=first.layers, devices=first.devices,
                      deps=tuple(p.lineage for p in producers), attributes={"async": True})
        if dense and layout.data_ranks > 1:
            n, size = split(dense)
            out.append(collective_task(prefix + f"dp.grad_{op}", f"dp.grad_{op}", op,
                                       size * GRAD_BYTES, layout.data_ranks, tiers.dp,
                                       count=count * n, **common))
        if expert and layout.expert_data_ranks > 1:
            n, size = split(expert)
            out.append(collective_task(prefix + f"dp.expert_grad_{op}", f"dp.expert_grad_{op}",
                                       op, size * GRAD_BYTES, layout.expert_data_ranks,
                                       tiers.dp, count=count * n, **common))
    return out


def drop_one_layer(tasks: list[Task], *, first: bool) -> list[Task]:
    """The chunk's tasks with one transformer layer fewer: its first layer (`first`: the
    slot the input embedding takes) or its last (the loss's slot). The run holding that
    layer repeats one time fewer; a run of one layer goes, and who depended on its tasks
    depends on what they depended on."""
    runs = {t.lineage.split(".", 1)[0]: t.layers for t in tasks if t.layers is not None}
    if not runs:
        return tasks
    key = (min if first else max)(runs, key=lambda k: runs[k][0] if first else runs[k][1])
    a, b = runs[key]
    step = next(int(t.attributes.get("layer_step", 1)) for t in tasks
                if t.lineage.startswith(key + "."))
    reps = len(range(a, b + 1, step))
    if reps == 1:
        return drop_tasks(tasks, {t.lineage for t in tasks if t.lineage.startswith(key + ".")})
    layers = (a + step, b) if first else (a, b - step)
    if step > 1:
        layers = (*layers, step)
    new_key = GraphBuilder.layer_prefix(layers)[:-1]

    def renamed(lineage: str) -> str:
        return new_key + lineage[len(key):] if lineage.startswith(key + ".") else lineage

    out = []
    for t in tasks:
        deps = tuple(renamed(d) for d in t.deps)
        if not t.lineage.startswith(key + "."):
            out.append(t if deps == t.deps else replace(t, deps=deps))
            continue
        attrs = dict(t.attributes)
        if "layer_count" in attrs:
            attrs["layer_count"] = int(attrs["layer_count"]) // reps * (reps - 1)
        out.append(replace(t, lineage=renamed(t.lineage), deps=deps,
                           count=t.count // reps * (reps - 1), layers=layers[:2],
                           attributes=FrozenDict(attrs)))
    return out


def build_chunk(graph: TaskGraph, chunk: int, layout: TrainingLayout, tiers: Tiers, *,
                attention_kernel: str, attention_dropout: bool,
                tp_comm_overlap: bool = False, grad_bucket_params: int = 0,
                cross_entropy_loss_fusion: bool = False) -> ChunkGraphs:
    """The ChunkGraphs of chunk `chunk` of the forward graph `graph` (all chunks)."""
    chunks = layout.chunks
    last = chunk == chunks - 1
    forward = chunk_forward_tasks(graph, chunk, last,
                                  cross_entropy_loss_fusion=cross_entropy_loss_fusion)
    if chunk == 0 and layout.account_for_embedding_in_pipeline_split:
        forward = drop_one_layer(forward, first=True)
    if last and layout.account_for_loss_in_pipeline_split:
        forward = drop_one_layer(forward, first=False)
    forward = _cp_exchange(forward, layout, tiers)
    dense, expert, runs = _params(forward, last and chunks > 1)
    saved, per_layer = saved_activation_bytes(
        forward, tp=layout.tp, recompute=layout.recompute, attention_kernel=attention_kernel,
        attention_dropout=attention_dropout)
    if attention_kernel == "unfused":
        forward = expand_unfused_attention(forward, dropout=attention_dropout)
    backward = backward_tasks(forward, graph.model.num_layers, tp=layout.tp,
                              sp=layout.sequence_parallel and layout.tp > 1,
                              recompute=layout.recompute)
    if tp_comm_overlap:
        forward = overlap_tp_comm(forward, layout.tp)
        backward = overlap_tp_comm(backward, layout.tp)
    forward = _zero3_gathers(forward, runs, layout, tiers, backward=False)
    backward = _zero3_gathers(backward, runs, layout, tiers, backward=True)
    dp = _dp_gradient_tasks(backward, runs, layout, tiers, grad_bucket_params)
    empty = MemoryFacts(weights=0.0, kv_cache=0.0, activations=0.0)

    def as_graph(tasks: list[Task], what: str) -> TaskGraph:
        conventions = dict(graph.conventions)
        conventions["training_pass"] = what
        return TaskGraph(model=graph.model, plan=graph.plan, batch=graph.batch,
                         precision=graph.precision, tasks=tuple(tasks), memory=empty,
                         conventions=FrozenDict(conventions))

    return ChunkGraphs(chunk=chunk, device=chunk % layout.pp,
                       forward=as_graph(forward, "forward"),
                       backward=as_graph(backward, "backward"),
                       backward_dp=as_graph(backward + dp, "backward+dp"),
                       params=dense, expert_params=expert, saved_bytes=saved,
                       layer_saved_bytes=FrozenDict(per_layer),
                       max_layer_params=max((d + e for d, e in runs.values()), default=0.0))
