"""`estimate_training`: one training step through the workload, evidence and plan layers.

    request -> forward graph (inference builder) -> per chunk: forward / backward /
    backward+DP graphs -> CostResolver (the same providers as `estimate_step`) ->
    each chunk pass scheduled on one device (`schedule_plan`: TP comm exposed or
    overlapped by the dependency graph) -> the pipeline (`plan.training`: 1F1B or
    interleaved, p2p, DP tails, optimizer) -> step time, breakdown, memory, MFU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from perfcast.core.dtypes import DType, dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostQueryContext
from perfcast.evidence.costing import CostedGraph, cost_graph
from perfcast.evidence.resolver import CostResolver
from perfcast.hardware import System, load_system
from perfcast.plan import PlanOptions, schedule_plan
from perfcast.plan.training import PassCosts, TrainingSchedule, schedule_training
from perfcast.training.chunks import (
    DEVICE_SMS,
    TE_COMM_SMS,
    ChunkGraphs,
    Tiers,
    build_chunk,
    collective_task,
    tiers_for,
)
from perfcast.training.graph import (
    ADAM_FLOPS_PER_PARAM,
    ATTENTION_OPS,
    GRAD_BYTES,
    PARAM_BYTES,
    forward_graph,
)
from perfcast.training.layout import TrainingLayout, check_layout
from perfcast.training.memory import DeviceMemory, most_loaded, rank_memory
from perfcast.workload import Batch, MemoryFacts, ModelSpec, ParallelPlan, Precision, TaskGraph
from perfcast.workload import load_model_spec
from perfcast.workload.families.traits import NUM_EXPERTS_KEYS
from perfcast.workload.tensors import Engine, Task, TaskKind, TensorSpec, Work

TRAINING_DTYPES = ("bf16", "fp16", "fp8")
ATTENTION_KERNELS = ("flash", "unfused")
BREAKDOWN_KEYS = ("forward", "backward", "recompute", "optimizer", "pp_bubble",
                  "dp_comm_exposed", "tp_comm_exposed")
FLOP_CONVENTION = (
    "model FLOPs = forward + backward FLOPs of the exact task graph of every microbatch "
    "(2 FLOPs per multiply-add; causal attention; backward = 2 x forward: dgrad and wgrad "
    "GEMMs, attention gradients), without any recomputation, work replicated over TP "
    "ranks counted once; MFU = model FLOPs / (devices x matrix peak of the dtype x step "
    "time). HFU counts what the devices run: plus selective/full recompute, "
    "FlashAttention's in-kernel recompute of QK^T (0.5 x forward attention) or, with the "
    "unfused kernel, the full s x s square of its batched GEMMs and its softmax and "
    "dropout, and replicated work")
DP_GROUPS = ("dp.", "zero3.", "bwd.zero3.")


@dataclass(frozen=True)
class TrainingRequest:
    model: str | ModelSpec
    device: str | System = "h100_sxm"
    layout: TrainingLayout = field(default_factory=TrainingLayout)
    global_batch_size: int = 512
    micro_batch_size: int = 1
    seq_length: int = 2048
    dtype: str = "bf16"
    context: CostQueryContext = field(default_factory=CostQueryContext)
    # DP gradient reduction bucketed per layer and overlapped with the backward pass
    # (Megatron --overlap-grad-reduce); False: one reduction after the last backward
    overlap_grad_reduce: bool = True
    attention_kernel: str = "flash"   # flash | unfused (materialised softmax: memory only)
    # TP collectives pipelined with their GEMMs (Megatron --tp-comm-overlap); False: each
    # runs where the dependency graph puts it (exposed when the next op needs its result)
    tp_comm_overlap: bool = False
    # DP gradient bucket size in parameters (Megatron --ddp-bucket-size); 0: one bucket per
    # layer. A layer's gradients go as ceil(layer params / bucket) equal collectives.
    grad_bucket_params: int = 0
    # ZeRO-1/2: the updated parameters are all-gathered bucket by bucket under the next
    # step's first forward pass (Megatron --overlap-param-gather; its default is off:
    # megatron/training/arguments.py, `action='store_true', default=False`); False: one
    # all-gather after the optimizer step, exposed
    overlap_param_gather: bool = False
    # weight gradients accumulated over the microbatches inside the wgrad GEMMs (Megatron-LM
    # gradient_accumulation_fusion, on by default since 83b1e42f30 of 2022-02; Megatron-
    # Core). False: autograd adds each microbatch's 16-bit weight gradient into `.grad` in
    # place after the first (Megatron-LM of 2021, torch or local DDP without contiguous
    # buffers: 2 + 2 bytes read, 2 written per parameter per microbatch)
    gradient_accumulation_fusion: bool = True
    # Megatron-LM's --cross-entropy-loss-fusion (store_true, default off; before 2024 there
    # was no fused path). Off: the loss runs the memory passes of vocab_parallel_cross_entropy
    # over the fp32-cast logits (graph.CROSS_ENTROPY_PASSES, 38 bytes per 16-bit logit forward,
    # 14 backward); on: one read of the logits
    cross_entropy_loss_fusion: bool = False


@dataclass(frozen=True)
class PassTime:
    """One chunk pass scheduled alone on its device."""

    makespan_s: float
    tp_exposed_s: float
    dp_exposed_s: float
    recompute_s: float


@dataclass(frozen=True)
class ChunkCosts:
    forward: CostedGraph
    backward: CostedGraph
    backward_dp: CostedGraph
    forward_time: PassTime
    backward_time: PassTime
    backward_dp_time: PassTime


@dataclass(frozen=True)
class TrainingResult:
    request: TrainingRequest
    system: System
    model: ModelSpec
    microbatches: int
    chunks: tuple[ChunkGraphs, ...]
    costs: tuple[ChunkCosts, ...]        # per chunk (identical chunks share one object)
    schedule: TrainingSchedule
    memory: DeviceMemory                 # the most loaded rank
    rank_memory: tuple[DeviceMemory, ...]
    breakdown_s: dict
    model_flops: float
    hardware_flops: float
    peak_flops_per_device: float
    optimizer_costed: tuple[CostedGraph, ...] = ()

    @property
    def step_time_s(self) -> float:
        return self.schedule.makespan_s

    @property
    def tokens_per_s(self) -> float:
        r = self.request
        return r.global_batch_size * r.seq_length / self.step_time_s

    @property
    def num_devices(self) -> int:
        return self.request.layout.num_devices

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.num_devices * self.peak_flops_per_device
                                   * self.step_time_s)

    @property
    def hfu(self) -> float:
        return self.hardware_flops / (self.num_devices * self.peak_flops_per_device
                                      * self.step_time_s)

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def memory_bytes(self) -> dict:
        return self.memory.as_dict()

    def to_json(self, *, include_ops: bool = True) -> dict:
        from perfcast.training.report import training_json

        return training_json(self, include_ops=include_ops)


def training_precision(dtype: str) -> Precision:
    """bf16 / fp16: every tensor in that dtype; fp8: GEMM inputs fp8 (weights cast per
    GEMM, as Transformer Engine does), everything else bf16."""
    if dtype not in TRAINING_DTYPES:
        raise ConfigError(f"has value {dtype!r}", field="--dtype",
                          expected=" | ".join(TRAINING_DTYPES))
    if dtype == "fp8":
        return Precision(weight="fp8", activation="bf16", kv_cache="bf16", attention="bf16",
                         linear_activation="fp8")
    return Precision.uniform(dtype)


def is_moe(model: ModelSpec) -> bool:
    return any(model.raw.get(k) for k in NUM_EXPERTS_KEYS)


def training_plan(layout: TrainingLayout, moe: bool) -> ParallelPlan:
    """The inference ParallelPlan whose forward graph is one microbatch of training:
    pp x virtual chunks as stages; with EP, the graph spans one expert-parallel group
    (ep / tp DP ranks), experts not tensor-split, all-to-all dispatch."""
    if moe and layout.ep > 1:
        return ParallelPlan(tp=layout.tp, pp=layout.chunks, dp=layout.expert_dp_groups,
                            ep=layout.ep, moe_tp=1, sp=layout.sequence_parallel,
                            moe_dispatch="all_to_all")
    return ParallelPlan(tp=layout.tp, pp=layout.chunks, sp=layout.sequence_parallel)


def microbatch_batch(layout: TrainingLayout, micro_batch_size: int, seq_length: int,
                     graph_dp: int) -> Batch:
    """One microbatch of every DP rank the graph spans. Under context parallelism a rank
    holds seq / cp tokens of each sequence and, with Megatron's load-balanced split,
    exactly 1/cp of the causal (query, key) pairs: a prefill of q = s / cp tokens over
    (s - q) / 2 earlier ones has q (s + 1) / 2 pairs = s (s + 1) / (2 cp)."""
    q = seq_length // layout.cp
    return Batch.prefill(micro_batch_size * graph_dp, q, (seq_length - q) // 2)


def _signature(c: ChunkGraphs) -> tuple:
    def sig(g: TaskGraph) -> tuple:
        return tuple((t.group, t.operation, t.count, t.work.flops, t.work.bytes_read,
                      t.work.bytes_written, t.work.message_bytes, t.work.participants,
                      t.work.axes.get("tier", ""), len(t.deps)) for t in g.tasks)
    return (sig(c.forward), sig(c.backward_dp))


def contended(costed: CostedGraph, system: System) -> CostedGraph:
    """A GEMM that overlaps a TP collective through Transformer Engine's userbuffers
    (`tp_overlap_method`, set by `chunks.overlap_tp_comm`) shares the device with the
    collective's kernels: TE launches it on S - n of the S SMs (`set_sm_margin`, true for
    the `pipeline` and `bulk` methods, n = `num_sm` = 16: `initialize_ub` defaults,
    transformer_engine/pytorch/module/base.py at d0067d0da6; common/comm_gemm_overlap/
    comm_gemm_overlap.cpp `_math_sms = sm_count - num_comm_sm`), so the resolver's answer
    for the GEMM on the whole device, less its launch overhead, is stretched by S / (S - n):
    its tensor-core work runs on fewer SMs for the whole kernel. `ring_exchange` uses the copy engines (no SM taken;
    their share of HBM bandwidth is not modelled)."""
    if not any("tp_overlap_method" in ct.task.attributes for ct in costed.tasks):
        return costed
    sms = DEVICE_SMS.get(system.device.name)
    if sms is None:
        raise ConfigError(f"--tp-comm-overlap on {system.device.name}: its SM count is not "
                          f"known to the contention model", field="--tp-comm-overlap",
                          expected=" | ".join(sorted(DEVICE_SMS)) + " (or no overlap)")
    out = []
    for ct in costed.tasks:
        n = TE_COMM_SMS.get(str(ct.task.attributes.get("tp_overlap_method", "")), 0)
        if n:
            est = ct.resolution.estimate
            factor = sms / (sms - n)
            comps = dict(est.components)
            launch = float(comps.get("launch_s", 0.0))  # the launch does not use SMs
            comps["contention_s"] = (est.latency_s - launch) * (factor - 1)
            est = replace(est, latency_s=est.latency_s + comps["contention_s"],
                          components=FrozenDict(comps),
                          assumptions=(*est.assumptions,
                                       f"overlaps a TP collective (TE userbuffers "
                                       f"{ct.task.attributes['tp_overlap_method']}): runs on "
                                       f"{sms - n} of {sms} SMs, latency x {factor:.4f}"))
            ct = replace(ct, resolution=replace(ct.resolution, estimate=est))
        out.append(ct)
    return replace(costed, tasks=tuple(out))


def attention_backward_at_forward_efficiency(backward: CostedGraph, forward: CostedGraph
                                             ) -> CostedGraph:
    """An attention core's backward (`attention_backward`: the roofline of its 2.5 x
    forward FLOPs, no measured backward kernels) is priced at no better efficiency than
    the resolver's answer for its own forward: latency = max(roofline, forward latency
    less its launch x hardware FLOP ratio + launch). FlashAttention-2's backward kernel
    reaches up to 63% of the A100's peak, its forward up to 73% (Dao 2023, arXiv
    2307.08691, section 4.1, Figures 5-6: in every setting there the backward runs fewer
    FLOP/s than the forward), so the forward's efficiency is an optimistic bound for it."""
    fwd = forward.by_lineage()
    out, changed = [], False
    for ct in backward.tasks:
        t = ct.task
        f = fwd.get(str(t.attributes.get("backward_of", "")))
        if (t.operation.endswith("_backward") and f is not None
                and f.task.operation in ATTENTION_OPS and f.task.work.flops > 0):
            est = ct.resolution.estimate
            f_est = f.resolution.estimate
            ratio = t.work.flops / f.task.work.flops
            launch = float(est.components.get("launch_s", 0.0))
            scaled = (f_est.latency_s - float(f_est.components.get("launch_s", 0.0))) \
                * ratio + launch
            if scaled > est.latency_s * (1 + 1e-9):  # not a rounding difference
                comps = dict(est.components)
                comps["forward_efficiency_s"] = scaled - est.latency_s
                est = replace(est, latency_s=scaled, components=FrozenDict(comps),
                              assumptions=(*est.assumptions,
                                           f"at the efficiency of its forward "
                                           f"({f_est.provider}): {ratio:g} x its latency"))
                ct = replace(ct, resolution=replace(ct.resolution, estimate=est))
                changed = True
        out.append(ct)
    return replace(backward, tasks=tuple(out)) if changed else backward


def _pass_time(costed: CostedGraph, system: System) -> PassTime:
    tl = schedule_plan([costed], system, PlanOptions())
    path = [tl.tasks[i] for i in tl.critical_path]
    comm = [(st.end_s - st.start_s, st.costed.task.group) for st in path if st.is_comm]
    total = sum(d for d, _ in comm)
    dp = sum(d for d, g in comm if g.startswith(DP_GROUPS))
    dp_share = dp / total if total > 0 else 0.0
    recompute = sum(ct.total_latency_s for ct in costed.tasks
                    if "recompute_of" in ct.task.attributes
                    and ct.task.kind is TaskKind.COMPUTE)
    return PassTime(makespan_s=tl.makespan_s, tp_exposed_s=tl.exposed_comm_s * (1 - dp_share),
                    dp_exposed_s=tl.exposed_comm_s * dp_share, recompute_s=recompute)


def _single(task: Task, graph: TaskGraph, system: System, resolver: CostResolver,
            context: CostQueryContext) -> CostedGraph:
    g = TaskGraph(model=graph.model, plan=graph.plan, batch=graph.batch,
                  precision=graph.precision, tasks=(task,),
                  memory=MemoryFacts(weights=0.0, kv_cache=0.0, activations=0.0),
                  conventions=graph.conventions)
    return cost_graph(g, system.name, resolver, context)


# The passes of Megatron-LM's mixed-precision optimizer step over the parameters a device
# updates (Float16OptimizerWithFloat16Params.step, megatron/optimizer/optimizer.py at
# de7dc40f88: copy the 16-bit gradients to fp32 main gradients, unscale them and check for
# inf/nan (fp16 loss scaling only), their L2 norm for --clip-grad (default 1.0; the
# conditional rescale is not counted), Adam (apex FusedAdam: reads master, gradient, m, v,
# writes master, m, v), copy the fp32 master to the 16-bit weight; the distributed
# optimizer runs the same passes over its shard): (name, bytes read, bytes written, FLOPs)
# per parameter
OPTIMIZER_PASSES = (("copy_grads", 2, 4, 0), ("unscale", 4, 4, 1), ("grad_norm", 4, 0, 2),
                    ("adam", 16, 12, ADAM_FLOPS_PER_PARAM), ("copy_params", 4, 2, 0))


def optimizer_tasks(local_params: float, devices: int, dtype: str) -> list[Task]:
    """The optimizer step's passes (`OPTIMIZER_PASSES`) over `local_params` parameters; the
    unscale pass only under fp16 (Megatron's grad scaler)."""
    n = max(1, int(local_params))
    out = []
    for name, read, written, flops in OPTIMIZER_PASSES:
        if name == "unscale" and dtype != "fp16":
            continue
        out.append(Task(lineage=f"optimizer.{name}", group=f"optimizer.{name}",
                        operator=f"tensor_cast.optimizer_{name}.default",
                        operation="optimizer_step", kind=TaskKind.COMPUTE,
                        inputs=(TensorSpec((n,), "fp32"),), outputs=(TensorSpec((n,), "fp32"),),
                        work=Work(flops=flops * local_params, engine=Engine.VECTOR,
                                  compute_dtype="fp32", bytes_read=read * local_params,
                                  bytes_written=written * local_params,
                                  axes=FrozenDict({"numel": n, "tokens": n})),
                        deps=(out[-1].lineage,) if out else (), devices=devices))
    return out


def _flops(chunks: list[ChunkGraphs], per_chunk_scale: float) -> tuple[float, float]:
    """(model, hardware) FLOPs of the step from the chunk graphs of one microbatch."""
    model = hardware = 0.0
    for c in chunks:
        for g in (c.forward, c.backward):
            for t in g.tasks:
                calls = t.count * t.devices
                hardware += t.work.flops * calls
                if "recompute_of" in t.attributes:
                    continue
                unique = calls / int(t.attributes.get("replicas", 1))
                model += float(t.attributes.get("model_flops", t.work.flops)) * unique
    return model * per_chunk_scale, hardware * per_chunk_scale


def estimate_training(request: TrainingRequest, resolver: CostResolver | None = None, *,
                      full_schedule: bool = False) -> TrainingResult:
    """Step time, breakdown, memory and MFU of one training step (module docstring).
    `full_schedule` schedules every microbatch (else long steps are extrapolated from
    3p and 4p microbatches, `plan.training.COMPRESS_FACTOR`)."""
    from perfcast.evidence.factory import build_resolver

    lay = request.layout
    if request.attention_kernel not in ATTENTION_KERNELS:
        raise ConfigError(f"has value {request.attention_kernel!r}", field="attention_kernel",
                          expected=" | ".join(ATTENTION_KERNELS))
    precision = training_precision(request.dtype)
    bucket = request.grad_bucket_params
    if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0:
        raise ConfigError(f"has value {bucket!r}", field="--ddp-bucket-size",
                          expected="a non-negative integer (parameters; 0: one per layer)")
    system = request.device if isinstance(request.device, System) \
        else load_system(request.device)
    model = request.model if isinstance(request.model, ModelSpec) \
        else load_model_spec(request.model)
    moe = is_moe(model)
    m = check_layout(lay, model, global_batch_size=request.global_batch_size,
                     micro_batch_size=request.micro_batch_size,
                     seq_length=request.seq_length, moe=moe)
    plan = training_plan(lay, moe)
    batch = microbatch_batch(lay, request.micro_batch_size, request.seq_length, plan.dp)
    # with the embedding / loss accounted for in the pipeline split the graph is cut over
    # their slots too; `build_chunk` then drops the layer a slot stands for
    slots = lay.pipeline_slots(model.num_layers)
    graph = forward_graph(model if slots == model.num_layers
                          else replace(model, num_layers=slots), plan, batch, precision)
    tiers = tiers_for(system, lay)
    from perfcast.workload.families.gpt import ATTN_DROPOUT_KEYS, dropout_p

    attn_dropout = dropout_p(model, ATTN_DROPOUT_KEYS) > 0
    chunks = [build_chunk(graph, c, lay, tiers, attention_kernel=request.attention_kernel,
                          attention_dropout=attn_dropout,
                          tp_comm_overlap=request.tp_comm_overlap,
                          grad_bucket_params=request.grad_bucket_params,
                          cross_entropy_loss_fusion=request.cross_entropy_loss_fusion)
              for c in range(lay.chunks)]
    resolver = resolver or build_resolver(system)
    ctx = request.context
    by_sig: dict[tuple, ChunkCosts] = {}
    costs: list[ChunkCosts] = []
    for c in chunks:
        key = _signature(c)
        if key not in by_sig:
            fwd = contended(cost_graph(c.forward, system.name, resolver, ctx), system)
            bwd, bdp = (contended(attention_backward_at_forward_efficiency(
                cost_graph(g, system.name, resolver, ctx), fwd), system)
                for g in (c.backward, c.backward_dp))
            by_sig[key] = ChunkCosts(fwd, bwd, bdp, _pass_time(fwd, system),
                                     _pass_time(bwd, system), _pass_time(bdp, system))
        costs.append(by_sig[key])
    p2p_bytes, p2p_s = _p2p(graph, lay, tiers, system, resolver, ctx, chunks[0])
    every = lay.zero_stage >= 2
    tails = [max(cc.backward_dp_time.makespan_s - cc.backward_time.makespan_s, 0.0)
             for cc in costs]
    dp_after = [0.0] * lay.pp
    if not request.overlap_grad_reduce:
        # not overlapped: a chunk's gradient collectives run after its backward pass (every
        # pass under ZeRO-2/3), or after the rank's last pass (ZeRO-0/1)
        unhidden = [sum(ct.total_latency_s for ct in cc.backward_dp.tasks
                        if ct.task.group.startswith("dp.")) for cc in costs]
        if every:
            tails = unhidden
        else:
            for c, t in zip(chunks, unhidden):
                dp_after[c.device] += t
            tails = [0.0] * lay.chunks
    for d, t in _embedding_sync(graph, lay, tiers, system, resolver, ctx, chunks).items():
        dp_after[d] += t
    optimizer_s, gather_s, opt_costed = _optimizer(chunks, lay, graph, tiers, system,
                                                   resolver, ctx, request.dtype)
    first_extra: list[float] = []
    first_gather: list[float] = []
    if request.overlap_param_gather:
        if lay.zero_stage not in (1, 2):
            raise ConfigError(f"--overlap-param-gather with --zero-stage={lay.zero_stage}",
                              field="--overlap-param-gather",
                              expected="--zero-stage 1 or 2 (the distributed optimizer's "
                                       "parameter all-gather)")
        if lay.data_ranks > 1:
            split = [overlapped_param_gather_s(c, cc.forward, lay, tiers, system, resolver,
                                               ctx) for c, cc in zip(chunks, costs)]
            first_gather = [a for a, _ in split]
            first_extra = [b for _, b in split]
            gather_s = [0.0] * lay.pp
    accumulate = [0.0] * lay.chunks
    if not request.gradient_accumulation_fusion and m > 1:
        accumulate = _grad_accumulation_s(chunks, m, system, resolver, ctx)
    sched = schedule_training(lay.pp, m, lay.virtual_pipeline, PassCosts(
        forward_s=[cc.forward_time.makespan_s for cc in costs],
        backward_s=[cc.backward_time.makespan_s + a for cc, a in zip(costs, accumulate)],
        p2p_s=p2p_s,
        dp_tail_s=tails,
        dp_every_microbatch=every, dp_after_s=dp_after, optimizer_s=optimizer_s,
        param_gather_s=gather_s, param_gather_first_s=first_gather,
        first_forward_extra_s=first_extra), full=full_schedule)
    ranks = rank_memory(chunks, lay, m, system.device.memory.capacity_bytes, p2p_bytes)
    breakdown = _breakdown(sched, costs, lay, m, optimizer_s, first_extra, accumulate)
    scale = request.global_batch_size / (request.micro_batch_size * plan.dp) * lay.cp
    model_flops, hw_flops = _flops(chunks, scale)
    peak = _peak(system, precision)
    return TrainingResult(request=request, system=system, model=model, microbatches=m,
                          chunks=tuple(chunks), costs=tuple(costs), schedule=sched,
                          memory=most_loaded(ranks), rank_memory=tuple(ranks),
                          breakdown_s=breakdown, model_flops=model_flops,
                          hardware_flops=hw_flops, peak_flops_per_device=peak,
                          optimizer_costed=tuple(opt_costed))


def _peak(system: System, precision: Precision) -> float:
    eng = system.device.engine("matrix")
    key = "fp8" if DType(precision.linear_activation or precision.activation) is DType.FP8 \
        else DType(precision.activation).value
    rate = eng.peak_ops_per_s.get(key)
    if rate is None:
        raise ConfigError(f"device {system.device.name} has no {key} matrix rate",
                          field="--dtype", expected="a dtype the device's matrix engine runs")
    return float(rate)


def _p2p(graph: TaskGraph, lay: TrainingLayout, tiers: Tiers, system: System,
         resolver: CostResolver, ctx, first: ChunkGraphs) -> tuple[float, float]:
    """(bytes, seconds) of one activation transfer between consecutive chunks."""
    if lay.chunks == 1:
        return 0.0, 0.0
    tokens = graph.batch.tokens // max(graph.plan.dp, 1)
    if lay.sequence_parallel and lay.tp > 1:
        tokens = -(-tokens // lay.tp)
    message = tokens * graph.model.hidden_size * dtype_bytes(graph.precision.activation)
    task = collective_task("pp.send_recv", "pp.send_recv", "send_recv", message, 2, tiers.pp,
                       devices=first.forward.tasks[0].devices)
    costed = _single(task, first.forward, system, resolver, ctx)
    return message, costed.tasks[0].latency_s


def _grad_accumulation_s(chunks: list[ChunkGraphs], m: int, system: System,
                         resolver: CostResolver, ctx) -> list[float]:
    """Per chunk, the time one backward pass spends adding its weight gradients into the
    accumulated ones (`gradient_accumulation_fusion` off): an elementwise add over the
    chunk's parameters (16-bit: reads both, writes the sum) in m - 1 of the m microbatches,
    spread evenly over them."""
    out = []
    for c in chunks:
        n = c.params + c.expert_params
        if n <= 0:
            out.append(0.0)
            continue
        k = max(1, int(n))
        task = Task(lineage="bwd.grad_accumulate", group="bwd.grad_accumulate",
                    operator="aten.add_.Tensor", operation="add", kind=TaskKind.COMPUTE,
                    inputs=(TensorSpec((k,), "bf16"), TensorSpec((k,), "bf16")),
                    outputs=(TensorSpec((k,), "bf16"),),
                    work=Work(flops=n, engine=Engine.VECTOR, compute_dtype="bf16",
                              bytes_read=2 * GRAD_BYTES * n, bytes_written=GRAD_BYTES * n,
                              axes=FrozenDict({"numel": k, "tokens": k})),
                    devices=c.forward.tasks[0].devices if c.forward.tasks else 1)
        one = _single(task, c.forward, system, resolver, ctx).tasks[0].latency_s
        out.append(one * (m - 1) / m)
    return out


def _embedding_sync(graph: TaskGraph, lay: TrainingLayout, tiers: Tiers, system: System,
                    resolver: CostResolver, ctx, chunks) -> dict[int, float]:
    """Tied embeddings under PP: the first and the last rank hold copies of the table and
    all-reduce its gradient after the backward pass (Megatron-LM), per rank seconds."""
    if not (graph.model.tie_word_embeddings and lay.pp > 1):
        return {}
    lookup = next(t for t in chunks[0].forward.tasks if t.group == "embed.lookup")
    message = float(lookup.attributes["weight_params"]) * 2.0
    tier = system.tier_for_group((lay.pp - 1) * lay.tp * lay.cp * lay.dp + 1).name
    task = collective_task("dp.embedding_grad_all_reduce", "dp.embedding_grad_all_reduce",
                           "all_reduce", message, 2, tier, devices=lookup.devices)
    seconds = _single(task, chunks[0].forward, system, resolver, ctx).tasks[0].latency_s
    return {0: seconds, lay.pp - 1: seconds}


def _optimizer(chunks, lay: TrainingLayout, graph: TaskGraph, tiers: Tiers, system: System,
               resolver: CostResolver, ctx, dtype: str) -> tuple[list[float], list[float],
                                                                list]:
    opt, gather, costed_all = [], [], []
    z = lay.zero_stage
    for d in range(lay.pp):
        mine = [c for c in chunks if c.device == d]
        dense = sum(c.params for c in mine)
        expert = sum(c.expert_params for c in mine)
        local = (dense / lay.data_ranks + expert / lay.expert_data_ranks) if z >= 1 \
            else dense + expert
        devices = mine[0].forward.tasks[0].devices
        costed = [_single(t, mine[0].forward, system, resolver, ctx)
                  for t in optimizer_tasks(local, devices, dtype)]
        costed_all.extend(costed)
        opt.append(sum(c.tasks[0].total_latency_s for c in costed))
        g = 0.0
        if z in (1, 2) and lay.data_ranks > 1:
            task = collective_task("dp.param_all_gather", "dp.param_all_gather", "all_gather",
                               (dense + expert * lay.data_ranks / lay.expert_data_ranks) * 2.0,
                               lay.data_ranks, tiers.dp, devices=devices)
            c = _single(task, mine[0].forward, system, resolver, ctx)
            costed_all.append(c)
            g = c.tasks[0].total_latency_s
        gather.append(g)
    return opt, gather, costed_all


def param_gather_segments(forward: CostedGraph, last_chunk_holds_head: bool
                          ) -> list[tuple[float, float]]:
    """(parameters, compute seconds) of the forward pass's parameter buckets in the order
    the forward needs them: one per layer (as the gradient buckets), one for the weights
    outside the layers before them (embedding) and one after them (final norm, LM head);
    a segment's seconds are its tasks' latencies (one layer of a layer run)."""
    segs: list[list[float]] = []
    key_of_prev = None
    for ct in forward.tasks:
        t = ct.task
        key = t.lineage.split(".", 1)[0] if t.layers is not None else ""
        params = float(t.attributes.get("weight_params", 0) or 0)
        if t.group == "final.lm_head" and not params and last_chunk_holds_head:
            params = float(t.inputs[1].numel)  # tied head: the last stage's own copy
        per_call = ct.latency_s if t.layers is not None else ct.total_latency_s
        if key != key_of_prev:
            reps = t.count if t.layers is not None else 1
            segs.append([0.0, 0.0, float(max(1, reps))])
            key_of_prev = key
        segs[-1][0] += params
        segs[-1][1] += per_call
    out: list[tuple[float, float]] = []
    for params, seconds, reps in segs:
        for _ in range(int(reps)):
            if params == 0 and out:  # no weights: the previous bucket's compute goes on
                out[-1] = (out[-1][0], out[-1][1] + seconds)
            else:
                out.append((params, seconds))
    return out


def overlapped_param_gather_s(chunk: ChunkGraphs, forward: CostedGraph, lay: TrainingLayout,
                              tiers: Tiers, system: System, resolver: CostResolver,
                              ctx) -> tuple[float, float]:
    """ZeRO-1/2's parameter all-gather overlapped with the chunk's first forward pass
    (Megatron `--overlap-param-gather`, distributed optimizer at f2e5db402c,
    megatron/core/optimizer/distrib_optimizer.py: the first bucket's all-gather is
    launched asynchronously in the step's `zero_grad`, i.e. at its start; a forward
    pre-hook waits for its module's bucket and then dispatches the next one,
    `_finish_param_sync_helper`, so one all-gather is in flight at a time). Buckets
    B_1..B_k in forward order with gather times g_i and compute f_i: returns (g_1, the
    extra time the pass takes for the later buckets, sum_{i<k} max(0, g_{i+1} - f_i)).
    The pipeline schedules g_1 from the step's start (`PassCosts.param_gather_first_s`).
    Expert parameters are gathered as dense ones (over dp x cp)."""
    segs = param_gather_segments(forward, chunk.chunk == lay.chunks - 1 and lay.chunks > 1)
    cache: dict[float, float] = {}
    devices = chunk.forward.tasks[0].devices

    def gather(params: float) -> float:
        if params not in cache:
            task = collective_task("dp.param_all_gather", "dp.param_all_gather",
                                   "all_gather", params * PARAM_BYTES, lay.data_ranks,
                                   tiers.dp, devices=devices)
            cache[params] = (_single(task, chunk.forward, system, resolver, ctx)
                             .tasks[0].total_latency_s) if params > 0 else 0.0
        return cache[params]

    if not segs:
        return 0.0, 0.0
    g = [gather(p) for p, _ in segs]
    return g[0], pipelined_gather_wait(g, [f for _, f in segs]) - g[0]


def pipelined_gather_wait(gather_s: list[float], compute_s: list[float]) -> float:
    """How much longer k compute segments take when segment i first needs gather i and
    gather i + 1 is dispatched when segment i starts: g_1 + sum_{i<k} max(0, g_{i+1} - f_i)."""
    if not gather_s:
        return 0.0
    return gather_s[0] + sum(max(0.0, g - f) for g, f in zip(gather_s[1:], compute_s))


def _breakdown(sched: TrainingSchedule, costs: list[ChunkCosts], lay: TrainingLayout,
               m: int, optimizer_s: list[float], first_extra: list[float] = (),
               accumulate: list[float] = ()) -> dict:
    """Time of the rank that finishes last, split so the parts add up to the step time
    (the gradient accumulation adds count as backward)."""
    from perfcast.plan.training import training_order

    d = max(range(lay.pp), key=sched.rank_end_s)
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    for op in training_order(lay.pp, m, lay.virtual_pipeline)[d]:
        cc = costs[op.chunk]
        pt = cc.forward_time if op.kind == "F" else cc.backward_time
        out["tp_comm_exposed"] += pt.tp_exposed_s
        out["dp_comm_exposed"] += pt.dp_exposed_s
        compute = pt.makespan_s - pt.tp_exposed_s - pt.dp_exposed_s
        if op.kind == "F":
            out["forward"] += compute
        else:
            out["recompute"] += pt.recompute_s
            out["backward"] += compute - pt.recompute_s \
                + (accumulate[op.chunk] if accumulate else 0.0)
    wait = sched.param_gather_wait_s[d] if sched.param_gather_wait_s else 0.0
    if first_extra:
        # the first forward of each of the rank's chunks waiting for its later buckets
        out["dp_comm_exposed"] += sum(first_extra[c] for c in range(d, lay.chunks, lay.pp))
    # ... and, idle before it, for its first bucket (not hidden by the pipeline fill)
    out["dp_comm_exposed"] += wait
    out["pp_bubble"] = max(sched.bubble_s(d) - wait, 0.0)
    out["optimizer"] = optimizer_s[d]
    out["dp_comm_exposed"] += max(sched.makespan_s - sched.last_pass_end_s[d]
                                  - optimizer_s[d], 0.0)
    return out
