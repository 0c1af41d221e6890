"""The training step as task graphs: forward, backward, recompute, loss, DP and ZeRO work.

The forward of one microbatch is the inference workload builder's graph
(`build_task_graph`, `logits="all"`, `training=True`) with the model cut into
pp x virtual_pipeline chunks; per chunk it drops what training does not run (KV-cache
writes, the logits all-gather, pipeline transfers, which the pipeline layer schedules)
and adds the vocab-parallel cross-entropy loss on the last chunk. Everything else is
derived from the forward tasks, so any family the inference builders know trains:

* weighted GEMM [m,k]x[k,n] -> `.dgrad` [m,n]x[n,k] and `.wgrad` [k,m]x[m,n], 2mnk each;
* attention cores -> `<op>_backward`: 2 x forward model FLOPs (dQ, dK, dV, dP) plus
  FlashAttention's in-kernel recompute of QK^T (0.5 x forward) as hardware FLOPs;
* other compute ops -> `<op>_backward`: 2 x forward FLOPs, reads the forward's inputs
  and outputs (saved input + output gradient), writes its inputs' gradients;
* collectives are mirrored: all_reduce -> all_reduce, all_gather <-> reduce_scatter,
  all_to_all -> all_to_all (MoE dispatch and combine in both directions); the
  vocab-parallel embedding's forward all-reduce and the loss's all-reduces have no
  backward (their gradients are local) while the LM head's input gradient is all-reduced
  over TP; under sequence parallelism
  each weighted GEMM whose input was all-gathered re-gathers it for its wgrad (Megatron
  keeps only the slice);
* recompute: `full` re-runs each layer's forward tasks (`recompute.*`, same work and
  so the same resolver answers as the forward) before that layer's backward; `selective`
  re-runs the attention cores only.

Backward tasks keep the forward lineage with `bwd.` before the group
(`L0-5.bwd.mlp.down_proj.dgrad`); their `layers` hold mirrored indices (N - 1 - layer)
so that the plan layer chains them last layer first (the real ones are in the attribute
`forward_layers`). The graphs never hold a duration.
"""

from __future__ import annotations

from dataclasses import replace

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.frozen import FrozenDict
from perfcast.workload import Batch, ParallelPlan, Precision, TaskGraph
from perfcast.workload import build_task_graph
from perfcast.workload.model_spec import ModelSpec
from perfcast.workload.tensors import Engine, Task, TaskKind, TensorSpec, Work

ATTENTION_OPS = frozenset({"attention", "mla_attention", "mla_sparse_attention"})
# collective of the backward pass that mirrors a forward collective
MIRROR_COLLECTIVE = {"all_reduce": "all_reduce", "all_gather": "reduce_scatter",
                     "reduce_scatter": "all_gather", "all_to_all": "all_to_all"}
# forward groups training does not run, or whose backward is local
DROPPED_OPERATIONS = frozenset({"kv_cache_write", "send_recv"})
DROPPED_GROUPS = frozenset({"final.logits_all_gather"})
# the vocab-parallel embedding's gradient is local; so is the vocab-parallel cross
# entropy's (softmax - one-hot on each rank's vocabulary slice)
NO_BACKWARD_GROUPS = frozenset({"embed.all_reduce", "loss.all_reduce"})
# FLOPs of a backward task / forward FLOPs: model FLOPs (what the math needs) and hardware
# FLOPs (what the kernel runs; FlashAttention recomputes QK^T in its backward)
MODEL_BACKWARD_FACTOR = 2.0
HARDWARE_BACKWARD_FACTOR = {"attention": 2.5, "mla_attention": 2.5, "mla_sparse_attention": 2.5}
ADAM_FLOPS_PER_PARAM = 14  # moments (7), bias-corrected update (5), weight decay (2)
# Bytes per parameter (ZeRO paper accounting, Rajbhandari et al. 2020): 16-bit weights and
# gradients, fp32 master weights + Adam first and second moments as optimizer state
PARAM_BYTES = 2
GRAD_BYTES = 2
OPTIMIZER_BYTES = 12


def forward_graph(model: ModelSpec, plan: ParallelPlan, batch: Batch, precision: Precision
                  ) -> TaskGraph:
    """The inference builder's forward graph of one microbatch (all chunks)."""
    return build_task_graph(model, plan, batch, precision, logits="all", training=True)


def chunk_forward_tasks(graph: TaskGraph, chunk: int, last: bool, *,
                        cross_entropy_loss_fusion: bool = False) -> list[Task]:
    """Forward tasks of one chunk as training runs them (stage 0, see module docstring)."""
    tasks = [t for t in graph.tasks if t.stage == chunk]
    drop = {t.lineage for t in tasks if t.operation in DROPPED_OPERATIONS
            or t.group in DROPPED_GROUPS}
    kept = drop_tasks(tasks, drop)
    present = {t.lineage for t in kept}
    out = [replace(t, stage=0, deps=tuple(d for d in t.deps if d in present)) for t in kept]
    if last:
        out.extend(loss_tasks(graph, out, fused=cross_entropy_loss_fusion))
    return out


def drop_tasks(tasks: list[Task], drop: set[str]) -> list[Task]:
    """Remove `drop`; who depended on a removed task depends on its deps instead."""
    deps_of = {t.lineage: t.deps for t in tasks}

    def resolve(d: str) -> tuple[str, ...]:
        if d not in drop:
            return (d,)
        return tuple(x for dd in deps_of.get(d, ()) for x in resolve(dd))

    out = []
    for t in tasks:
        if t.lineage in drop:
            continue
        new = tuple(dict.fromkeys(x for d in t.deps for x in resolve(d)))
        out.append(t if new == t.deps else replace(t, deps=new))
    return out


# Megatron-LM's vocab_parallel_cross_entropy without `--cross-entropy-loss-fusion` (the
# only path before that flag and its default since, off: megatron/training/arguments.py at
# f2e5db402c): the passes over the rank's logits, (pass, bytes read, bytes written) per
# logit in fp32 after the cast of the 16-bit logits (megatron/mpu/cross_entropy.py and
# megatron/model/gpt_model.py `output.float()` at de7dc40f88 and 2e90a342f5;
# megatron/core/tensor_parallel/cross_entropy.py `calculate_logits_max` at f2e5db402c).
# Forward: the cast, the max, the in-place subtract, exp (out= in place), the sum, the
# in-place divide to the softmax kept for backward; backward: the in-place multiply by the
# loss gradient and the cast's backward to the logits' dtype. Per-token work (the target
# gather, the log, the target's -1) is not counted.
CROSS_ENTROPY_PASSES = (("cast_fp32", None, 4), ("max", 4, 0), ("sub", 4, 4), ("exp", 4, 4),
                        ("sum", 4, 0), ("div", 4, 4))
CROSS_ENTROPY_BACKWARD_PASSES = (("mul", 4, 4), ("cast_back", 4, None))


def cross_entropy_bytes(logit_bytes: int) -> tuple[float, float, float, float]:
    """(forward read, forward written, backward read, backward written) per logit of the
    unfused passes; `None` in a pass is the logits' own size (no cast when they are fp32)."""
    def total(passes):
        r = w = 0.0
        for _, read, written in passes:
            if logit_bytes == 4 and None in (read, written):
                continue            # .float() of an fp32 tensor is the tensor itself
            r += logit_bytes if read is None else read
            w += logit_bytes if written is None else written
        return r, w

    return (*total(CROSS_ENTROPY_PASSES), *total(CROSS_ENTROPY_BACKWARD_PASSES))


def loss_tasks(graph: TaskGraph, tasks: list[Task], *, fused: bool = False) -> list[Task]:
    """Vocab-parallel cross-entropy over the logits (Megatron-LM): per token the max,
    the sum of exponentials and the target logit are all-reduced over TP (three
    all-reduces of one fp32 per token); ~5 FLOPs per logit (cast, subtract, exp, sum).
    Unfused (Megatron's default): the memory passes of CROSS_ENTROPY_PASSES forward and
    CROSS_ENTROPY_BACKWARD_PASSES backward, one task each way. `fused`
    (`--cross-entropy-loss-fusion`): one read of the logits forward, the generic backward."""
    head = next(t for t in tasks if t.group == "final.lm_head")
    logits = head.outputs[0]
    tokens, local_vocab = logits.shape[0], logits.shape[1]
    devices = head.devices
    n = float(tokens * local_vocab)
    if fused:
        read, written, attrs = logits.nbytes, tokens * 4.0, FrozenDict()
    else:
        fr, fw, br, bw = cross_entropy_bytes(dtype_bytes(logits.dtype))
        read, written = fr * n, fw * n + tokens * 4.0
        attrs = FrozenDict({"backward_bytes_read": br * n + tokens * 4.0,
                            "backward_bytes_written": bw * n})
    ce = Task(lineage="loss.cross_entropy", group="loss.cross_entropy",
              operator="tensor_cast.vocab_parallel_cross_entropy.default",
              operation="cross_entropy", kind=TaskKind.COMPUTE,
              inputs=(logits,), outputs=(TensorSpec((tokens,), "fp32"),),
              work=Work(flops=5.0 * n, engine=Engine.VECTOR,
                        compute_dtype="fp32", bytes_read=read, bytes_written=written,
                        axes=FrozenDict({"tokens": tokens, "numel": tokens * local_vocab})),
              deps=(head.lineage,), devices=devices, attributes=attrs)
    out = [ce]
    tp = graph.plan.tp
    if tp > 1:
        out.append(Task(lineage="loss.all_reduce", group="loss.all_reduce",
                        operator="tensor_cast.all_reduce.default", operation="all_reduce",
                        kind=TaskKind.COMMUNICATION, inputs=(TensorSpec((tokens,), "fp32"),),
                        outputs=(TensorSpec((tokens,), "fp32"),),
                        work=Work(engine=Engine.NETWORK, compute_dtype="fp32",
                                  message_bytes=tokens * 4.0, participants=tp,
                                  axes=FrozenDict({"message_bytes": tokens * 4,
                                                   "participants": tp})),
                        deps=(ce.lineage,), count=3, devices=devices))
    return out


# -- backward -------------------------------------------------------------------------

def _mirror_layers(t: Task, num_layers: int) -> tuple[int, int] | None:
    if t.layers is None:
        return None
    return (num_layers - 1 - t.layers[1], num_layers - 1 - t.layers[0])


def _bwd_lineage(t: Task, part: str = "") -> tuple[str, str]:
    prefix = t.lineage[: len(t.lineage) - len(t.group)]
    group = f"bwd.{t.group}" + (f".{part}" if part else "")
    return prefix + group, group


def _task(t: Task, lineage: str, group: str, *, operation: str, operator: str, work: Work,
          inputs, outputs, deps, num_layers: int, kind: TaskKind = TaskKind.COMPUTE,
          attributes: dict | None = None, count: int | None = None) -> Task:
    attrs = dict(attributes or {})
    if t.layers is not None:
        attrs["forward_layers"] = f"{t.layers[0]}-{t.layers[1]}"
    for key in ("replicas", "layer_step"):
        if key in t.attributes:
            attrs[key] = t.attributes[key]
    return Task(lineage=lineage, group=group, operator=operator, operation=operation,
                kind=kind, inputs=tuple(inputs), outputs=tuple(outputs), work=work,
                deps=tuple(dict.fromkeys(deps)), count=t.count if count is None else count,
                devices=t.devices, stage=0, layers=_mirror_layers(t, num_layers),
                attributes=FrozenDict(attrs))


def _gemm_backward(t: Task, deps, num_layers: int, regather: str | None) -> list[Task]:
    """dgrad and wgrad GEMMs of a weighted linear (or the two operand gradients of a
    product of activations)."""
    ax = t.work.axes
    m, n, k = int(ax["m"]), int(ax["n"]), int(ax["k"])
    batch = int(ax.get("batch", 1))
    w_dt = t.inputs[1].dtype
    o_dt = t.outputs[0].dtype
    weighted = "weight_params" in t.attributes
    flops = 2.0 * m * n * k * batch
    # each of the two backward GEMMs runs the forward's FLOPs and carries its model FLOPs
    model = float(t.attributes.get("model_flops", flops))
    out = []

    def gemm(part, mm, nn, kk, read, written, ins, outs, extra_deps=()):
        lin, grp = _bwd_lineage(t, part)
        axes = {"m": mm, "n": nn, "k": kk}
        if batch > 1:
            axes["batch"] = batch
        work = Work(flops=flops, engine=Engine.MATRIX, compute_dtype=t.work.compute_dtype,
                    bytes_read=read, bytes_written=written, axes=FrozenDict(axes))
        out.append(_task(t, lin, grp, operation="gemm", operator=t.operator, work=work,
                         inputs=ins, outputs=outs, deps=(*deps, *extra_deps),
                         num_layers=num_layers, attributes={"backward_of": t.lineage,
                                                            "model_flops": model}))
        return lin

    dy = TensorSpec((batch, m, n) if batch > 1 else (m, n), o_dt)
    x = t.inputs[0]
    w = t.inputs[1]
    gemm("dgrad", m, k, n, dy.nbytes + w.nbytes, x.nbytes, (dy, w), (x,))
    if weighted:
        g_dt = w_dt if dtype_bytes(w_dt) >= GRAD_BYTES else "bf16"  # fp8 GEMMs: 16-bit grads
        gemm("wgrad", k, n, m, x.nbytes + dy.nbytes, w.numel * dtype_bytes(g_dt), (x, dy),
             (TensorSpec(w.shape, g_dt),), extra_deps=(regather,) if regather else ())
    else:
        gemm("dgrad_b", k, n, m, x.nbytes + dy.nbytes, w.nbytes, (x, dy), (w,))
    return out


def _compute_backward(t: Task, deps, num_layers: int) -> Task:
    op = t.operation
    fwd = t.work
    factor = HARDWARE_BACKWARD_FACTOR.get(op, MODEL_BACKWARD_FACTOR)
    lin, grp = _bwd_lineage(t)
    axes = dict(fwd.axes)
    if op in ATTENTION_OPS:
        axes["phase"] = "backward"
    a = t.attributes
    # a forward task may declare its backward's work (the unfused attention's softmax and
    # dropout: what their backward kernels read and write)
    work = Work(flops=float(a.get("backward_flops", fwd.flops * factor)), engine=fwd.engine,
                compute_dtype=fwd.compute_dtype,
                bytes_read=float(a.get("backward_bytes_read",
                                       fwd.bytes_read + fwd.bytes_written)),
                bytes_written=float(a.get("backward_bytes_written", fwd.bytes_read)),
                axes=FrozenDict(axes))
    operator = t.operator.rsplit(".", 1)[0] + "_backward.default" \
        if t.operator.endswith(".default") else t.operator + "_backward"
    return _task(t, lin, grp, operation=f"{op}_backward", operator=operator, work=work,
                 inputs=t.outputs + t.inputs, outputs=t.inputs, deps=deps,
                 num_layers=num_layers,
                 attributes={"backward_of": t.lineage,
                             "model_flops": float(a.get("model_flops", fwd.flops))
                             * MODEL_BACKWARD_FACTOR})


def _collective(t: Task, lineage: str, group: str, operation: str, deps, num_layers: int,
                message: float | None = None) -> Task:
    w = t.work
    msg = w.message_bytes if message is None else message
    axes = dict(w.axes)
    axes["message_bytes"] = int(msg)
    work = Work(engine=Engine.NETWORK, compute_dtype=w.compute_dtype, message_bytes=msg,
                participants=w.participants, axes=FrozenDict(axes))
    return _task(t, lineage, group, operation=operation,
                 operator=f"tensor_cast.{operation}.default", work=work, inputs=t.inputs,
                 outputs=t.outputs, deps=deps, num_layers=num_layers,
                 kind=TaskKind.COMMUNICATION, attributes={"backward_of": t.lineage})


def backward_tasks(forward: list[Task], num_layers: int, *, tp: int, sp: bool,
                   recompute: str) -> list[Task]:
    """Backward (and recompute) tasks of one chunk's forward tasks, in execution order."""
    consumers: dict[str, list[str]] = {t.lineage: [] for t in forward}
    for t in forward:
        for d in t.deps:
            consumers[d].append(t.lineage)
    by = {t.lineage: t for t in forward}
    grad_in: dict[str, tuple[str, ...]] = {}  # forward lineage -> tasks producing its input grads
    out: list[Task] = []
    recomputed = _recompute_tasks(forward, num_layers, recompute)
    recompute_sinks = _sinks_by_block(recomputed)
    emitted_recompute: set = set()  # recompute blocks and unfused cores emitted
    for t in reversed(forward):
        deps = tuple(x for c in consumers[t.lineage] for x in grad_in[c])
        block = _block_key(t)
        if block is not None and block in recompute_sinks:
            in_block = any(by[c].layers is not None and _block_key(by[c]) == block
                           for c in consumers[t.lineage])
            if block not in emitted_recompute:
                emitted_recompute.add(block)
                out.extend(r for r in recomputed if _block_key_of_recompute(r) == block)
            if not in_block:
                deps = deps + recompute_sinks[block]
        if recompute == "selective" and t.operation in ATTENTION_OPS:
            r = _recompute_copy(t, num_layers, deps_map={}, keep_deps=deps)
            out.append(r)
            deps = deps + (r.lineage,)
        core = t.attributes.get("unfused_core") if recompute == "selective" else None
        if core is not None and core not in emitted_recompute:
            # selective recompute of the unfused core: QK^T, softmax, dropout, PV again
            # (Megatron-LM checkpoints core_attention), before the core's backward
            emitted_recompute.add(core)
            names: dict[str, str] = {}
            for i, c in enumerate(x for x in forward if x.attributes.get("unfused_core")
                                  == core):
                r = _recompute_copy(c, num_layers, names, keep_deps=deps if i == 0 else None)
                names[c.lineage] = r.lineage
                out.append(r)
            deps = deps + (out[-1].lineage,)
        if t.kind is TaskKind.VIEW or t.group in NO_BACKWARD_GROUPS:
            grad_in[t.lineage] = deps
            continue
        if t.kind is TaskKind.COMMUNICATION:
            op = MIRROR_COLLECTIVE.get(t.operation)
            if op is None:
                grad_in[t.lineage] = deps
                continue
            lin, grp = _bwd_lineage(t)
            out.append(_collective(t, lin, grp, op, deps, num_layers))
            grad_in[t.lineage] = (lin,)
            continue
        if t.operation == "gemm":
            regather = None
            gathered = [d for d in t.deps if by[d].kind is TaskKind.COMMUNICATION
                        and by[d].group.endswith("sp_all_gather")]
            if sp and gathered and "weight_params" in t.attributes:
                g = by[gathered[0]]
                lin, grp = _bwd_lineage(t, "input_all_gather")
                out.append(_collective(g, lin, grp, "all_gather", deps, num_layers))
                out[-1] = replace(out[-1], layers=_mirror_layers(t, num_layers))
                regather = lin
            tasks = _gemm_backward(t, deps, num_layers, regather)
            out.extend(tasks)
            grad_in[t.lineage] = (tasks[0].lineage,)
            if t.group == "final.lm_head" and tp > 1 and not sp:
                x = t.inputs[0]
                lin, grp = _bwd_lineage(t, "input_all_reduce")
                message = x.numel * dtype_bytes(x.dtype)
                ar = Task(lineage=lin, group=grp, operator="tensor_cast.all_reduce.default",
                          operation="all_reduce", kind=TaskKind.COMMUNICATION, inputs=(x,),
                          outputs=(x,), work=Work(engine=Engine.NETWORK,
                                                  compute_dtype=x.dtype,
                                                  message_bytes=message, participants=tp,
                                                  axes=FrozenDict({"message_bytes": message,
                                                                   "participants": tp})),
                          deps=(tasks[0].lineage,), devices=t.devices)
                out.append(ar)
                grad_in[t.lineage] = (lin,)
            continue
        b = _compute_backward(t, deps, num_layers)
        out.append(b)
        grad_in[t.lineage] = (b.lineage,)
    return out


def _block_key(t: Task) -> tuple | None:
    if t.layers is None:
        return None
    return (t.layers[0], t.layers[1], t.lineage.split(".", 1)[0])


def _block_key_of_recompute(r: Task) -> tuple:
    first, last = (int(x) for x in str(r.attributes["forward_layers"]).split("-"))
    return (first, last, r.lineage.split(".", 1)[0])


def _recompute_copy(t: Task, num_layers: int, deps_map: dict[str, str],
                    keep_deps: tuple[str, ...] | None = None) -> Task:
    prefix = t.lineage[: len(t.lineage) - len(t.group)]
    group = f"recompute.{t.group}"
    deps = keep_deps if keep_deps is not None else tuple(
        deps_map[d] for d in t.deps if d in deps_map)
    attrs = {k: v for k, v in t.attributes.items() if k not in (
        "weight_params", "weight_bytes", "weight_shards", "active_weight_params",
        "kv_cache_bytes_per_token")}
    attrs["recompute_of"] = t.lineage
    if t.layers is not None:
        attrs["forward_layers"] = f"{t.layers[0]}-{t.layers[1]}"
    return replace(t, lineage=prefix + group, group=group, deps=deps, stage=0,
                   layers=_mirror_layers(t, num_layers), attributes=FrozenDict(attrs))


def _recompute_tasks(forward: list[Task], num_layers: int, recompute: str) -> list[Task]:
    """Full recompute: a copy of every layer task (per layer run), chained as the forward."""
    if recompute != "full":
        return []
    out = []
    names: dict[tuple, dict[str, str]] = {}  # per layer run: forward -> recompute lineage
    for t in forward:
        if t.layers is None:
            continue
        block = names.setdefault(_block_key(t), {})
        r = _recompute_copy(t, num_layers, block)
        block[t.lineage] = r.lineage
        out.append(r)
    return out


def _sinks_by_block(recomputed: list[Task]) -> dict[tuple, tuple[str, ...]]:
    used = {d for r in recomputed for d in r.deps}
    sinks: dict[tuple, list[str]] = {}
    for r in recomputed:
        if r.lineage not in used:
            sinks.setdefault(_block_key_of_recompute(r), []).append(r.lineage)
    return {k: tuple(v) for k, v in sinks.items()}


# -- saved activations -------------------------------------------------------------------

def saved_activation_bytes(forward: list[Task], *, tp: int, recompute: str,
                           attention_kernel: str = "flash",
                           attention_dropout: bool = False) -> tuple[float, dict[str, float]]:
    """Bytes one microbatch of this chunk keeps for its backward pass, and per layer run
    (lineage prefix) the bytes of one layer. Each saved tensor is counted once (keyed by
    its producer), as Korthikanti et al. 2022 count them:

    * a weighted GEMM keeps its input (the slice, 1/tp, when the input was all-gathered
      under sequence parallelism); a product of two activations keeps both;
    * a norm keeps its input; an activation function its input; dropout its 1-byte mask;
    * an attention core keeps Q, K, V; FlashAttention (`flash`) adds the fp32 softmax
      statistics (one per head and query), the `unfused` kernel keeps the softmax output
      (2 bytes per score), and with attention dropout its mask (1) and output (2);
      selective recompute keeps neither (it recomputes them);
    * routed experts keep their input rows and the gate/up output and activation output;
    * the loss keeps fp32 logits;
    * full recompute keeps only each layer's input (the first task's input).
    """
    by = {t.lineage: t for t in forward}
    keys: dict[tuple, float] = {}
    per_run: dict[str, dict[tuple, float]] = {}

    def keep(t: Task, key: tuple, nbytes: float) -> None:
        keys[key] = nbytes
        if t.layers is not None:
            per_run.setdefault(t.lineage.split(".", 1)[0], {})[key] = nbytes

    full = recompute == "full"
    for t in forward:
        if t.kind is not TaskKind.COMPUTE:
            continue
        if full and t.layers is not None:
            continue
        op = t.operation
        dep = t.deps[0] if t.deps else t.lineage
        if op == "gemm":
            if "weight_params" in t.attributes:
                x = t.inputs[0].nbytes
                if dep in by and by[dep].group.endswith("sp_all_gather"):
                    x /= tp
                    dep = by[dep].deps[0] if by[dep].deps else dep
                keep(t, (dep, "out"), x)
            else:
                keep(t, (t.lineage, "a"), t.inputs[0].nbytes)
                keep(t, (t.lineage, "b"), t.inputs[1].nbytes)
        elif op in ATTENTION_OPS:
            qkv = sum(x.nbytes for x in t.inputs[:3])
            ax = t.work.axes
            heads, q = int(ax["heads"]), int(ax["q_tokens"]) * int(ax["batch"])
            extra = 0.0
            if recompute != "selective":
                if attention_kernel == "unfused":
                    scores = heads * q * int(ax["kv_len"])
                    extra = scores * (2 + (3 if attention_dropout else 0))
                else:
                    extra = heads * q * 4.0
            keep(t, (t.lineage, "qkv"), qkv + extra)
        elif op == "norm":
            keep(t, (t.lineage, "in"), t.inputs[0].nbytes)
        elif op == "activation":
            keep(t, (dep, "out"), t.inputs[0].nbytes)
        elif op == "dropout":
            keep(t, (t.lineage, "mask"), t.outputs[-1].nbytes)
        elif op == "moe":
            rows = t.inputs[0].shape[0]
            up_n = t.inputs[1].shape[2]
            inter = t.inputs[2].shape[1]
            keep(t, (t.lineage, "rows"), t.inputs[0].nbytes
                 + rows * (up_n + inter) * dtype_bytes(t.outputs[0].dtype))
        elif op == "cross_entropy":
            keep(t, (t.lineage, "logits"), t.inputs[0].numel * 4.0)
    total = 0.0
    for key, nbytes in keys.items():
        total += nbytes * _layers_of(forward, key, by)
    layer = {run: sum(v.values()) for run, v in per_run.items()}
    if full:
        for t in forward:
            if t.layers is None:
                continue
            run = t.lineage.split(".", 1)[0]
            if run in layer:
                continue
            first = t  # the run's first task: its input is the layer input
            x = first.inputs[0].nbytes
            layer[run] = x
            total += x * (first.count or 1)
    return total, layer


def _layers_of(forward: list[Task], key: tuple, by: dict[str, Task]) -> int:
    """How many layers a saved tensor exists in: the layer count of the task that keeps it."""
    t = by.get(key[0])
    if t is not None and t.layers is not None:
        return max(1, t.count)
    # keyed by a producer outside the block: find the consumer inside it
    for c in forward:
        if c.layers is not None and key[0] in c.deps:
            return max(1, c.count)
    return 1


# -- unfused attention (Megatron-LM's CoreAttention before FlashAttention) ---------------

# FLOPs per score element of the vector kernels (fp32 math on 16-bit scores):
# FusedScaleMaskSoftmax forward: scale, running max, exp(x - max), sum, normalise (5);
# its backward y (g - sum(g y)) times the scale: g y, sum, subtract, multiply, scale (5);
# dropout: random draw, compare, scale (3, as families.gpt.dropout); its backward
# multiplies the gradient by mask / (1 - p) (2).
SOFTMAX_FLOPS = 5
SOFTMAX_BACKWARD_FLOPS = 5
DROPOUT_FLOPS = 3
DROPOUT_BACKWARD_FLOPS = 2


def unfused_attention_tasks(t: Task, *, dropout: bool) -> list[Task]:
    """The attention core `t` as Megatron-LM's unfused CoreAttention runs it
    (megatron/model/transformer.py at de7dc40f88; megatron/core/transformer/
    dot_product_attention.py today), with E = batch x heads x q x kv score elements:

    * `scores`: torch.baddbmm(buffer, Q, K^T, beta=0, alpha=1/sqrt(d)) over the full q x kv
      square (no causal skipping): 2 E d FLOPs, reads Q and K (repeated to every query
      head), writes 2E bytes (16-bit scores);
    * `softmax`: the fused causal kernel (ScaledUpperTriangMaskedSoftmax,
      scaled_upper_triang_masked_softmax.h): each row reads its causal part only (P =
      batch x heads x q (kv + 1) / 2 when q = kv) and writes the whole row (zeros above
      the diagonal): reads 2P, writes 2E; its backward reads the gradient and the saved
      output of the causal part (4P) and writes 2E;
    * `dropout` (attention dropout > 0): torch.nn.Dropout -> aten.native_dropout, reads 2E,
      writes the 16-bit output and a bool mask (3E); its backward reads the gradient and
      the mask (3E) and writes 2E;
    * `context`: torch.bmm(probs, V), 2 E dv FLOPs over the full square, reads 2E + V.

    The backward of the two batched GEMMs follows from `_gemm_backward` (two bmm each:
    dQ = dS K, dK = dS^T Q; dP = dC V^T, dV = P^T dC). Model FLOPs do not change: the two
    bmm carry the causal core's model FLOPs (split qk : v), softmax and dropout none;
    their hardware FLOPs are the full square. The memory model keeps counting the core
    as one op (`saved_activation_bytes`: softmax output, mask, dropout output)."""
    ax = t.work.axes
    b, q, kv = int(ax["batch"]), int(ax["q_tokens"]), int(ax["kv_len"])
    heads, d = int(ax["heads"]), int(ax["head_dim"])
    dv = int(ax.get("v_head_dim", d))
    dt = t.inputs[0].dtype
    nb = dtype_bytes(dt)
    n = b * heads
    scores = float(n) * q * kv
    # causal part of each row: query at position p (of kv - q + p + 1 keys)
    causal = float(n) * (q * (kv - q) + q * (q + 1) / 2)
    model = float(t.attributes.get("model_flops", t.work.flops))
    prefix = t.lineage[: len(t.lineage) - len(t.group)]
    base = {k: v for k, v in t.attributes.items()
            if k not in ("kv_cache_bytes_per_token", "cache_window")}
    base["unfused_core"] = t.lineage
    common = dict(layers=t.layers, count=t.count, devices=t.devices, stage=t.stage)
    q_t = TensorSpec((n, q, d), dt)
    k_t = TensorSpec((n, d, kv), dt)
    v_t = TensorSpec((n, kv, dv), dt)
    s_t = TensorSpec((n, q, kv), dt)
    c_t = TensorSpec((n, q, dv), dt)

    def task(part, operator, operation, engine, flops, read, written, ins, outs, deps,
             axes, **attrs) -> Task:
        a = dict(base)
        a.update(attrs)
        return Task(lineage=prefix + f"{t.group}.{part}", group=f"{t.group}.{part}",
                    operator=operator, operation=operation, kind=TaskKind.COMPUTE,
                    inputs=ins, outputs=outs,
                    work=Work(flops=flops, engine=engine,
                              compute_dtype=t.work.compute_dtype if engine is Engine.MATRIX
                              else "fp32", bytes_read=read, bytes_written=written,
                              axes=FrozenDict(axes)),
                    deps=tuple(deps), attributes=FrozenDict(a), **common)

    qk_share = d / (d + dv)
    out = [task("scores", "aten.bmm.default", "gemm", Engine.MATRIX, 2.0 * scores * d,
                q_t.nbytes + k_t.nbytes, scores * nb, (q_t, k_t), (s_t,), t.deps,
                {"m": q, "n": kv, "k": d, "batch": n}, model_flops=model * qk_share)]
    elem = {"tokens": n * q, "numel": int(scores)}
    out.append(task("softmax", "aten._softmax.default", "softmax", Engine.VECTOR,
                    SOFTMAX_FLOPS * causal, causal * nb, scores * nb, (s_t,), (s_t,),
                    (out[-1].lineage,), elem, model_flops=0.0,
                    backward_flops=SOFTMAX_BACKWARD_FLOPS * causal,
                    backward_bytes_read=2 * causal * nb, backward_bytes_written=scores * nb))
    if dropout:
        mask = TensorSpec((n, q, kv), "bool")
        out.append(task("dropout", "aten.native_dropout.default", "dropout", Engine.VECTOR,
                        DROPOUT_FLOPS * scores, scores * nb, scores * (nb + 1), (s_t,),
                        (s_t, mask), (out[-1].lineage,), elem, model_flops=0.0,
                        backward_flops=DROPOUT_BACKWARD_FLOPS * scores,
                        backward_bytes_read=scores * (nb + 1),
                        backward_bytes_written=scores * nb))
    out.append(task("context", "aten.bmm.default", "gemm", Engine.MATRIX, 2.0 * scores * dv,
                    scores * nb + v_t.nbytes, c_t.nbytes, (s_t, v_t), (c_t,),
                    (out[-1].lineage,), {"m": q, "n": dv, "k": kv, "batch": n},
                    model_flops=model * (1 - qk_share)))
    return out


def expand_unfused_attention(tasks: list[Task], *, dropout: bool) -> list[Task]:
    """Replace each attention core by its unfused tasks; its consumers wait for the last."""
    out: list[Task] = []
    last: dict[str, str] = {}
    for t in tasks:
        if t.operation == "attention":
            parts = unfused_attention_tasks(t, dropout=dropout)
            last[t.lineage] = parts[-1].lineage
            out.extend(parts)
            continue
        if any(d in last for d in t.deps):
            t = replace(t, deps=tuple(last.get(d, d) for d in t.deps))
        out.append(t)
    return out
