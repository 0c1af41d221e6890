"""Training layout search: for a model, a device type and GPU budgets, enumerate the
layouts (TP, PP, DP, CP, EP, virtual pipeline, micro-batch, SP, recompute, ZeRO stage) that
divide, estimate each one's training step, keep those that fit memory, rank them by step
time and mark the Pareto front of step time against devices.

Every layout is one `estimate_training` call through the same resolver as `perfcast
train`, except a dense layout whose weights, gradients and optimizer state alone exceed the
device memory (`static_lower_bound_bytes`): it does not fit whatever its activations, and is
not costed. Layouts are evaluated in chunks that share one resolver (and its cache): in
local processes (`executor="local"`), inline (`"inline"`), or on a Ray cluster (`"ray"`,
optional extra: `pip install ray`).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from perfcast.core.errors import ConfigError, PerfcastError
from perfcast.core.executor import map_tasks
from perfcast.evidence.contracts import CostQueryContext
from perfcast.workload import ModelSpec, load_model_spec

RECOMPUTE_CHOICES = ("none", "selective", "full")
# why a layout is not among the ranked ones (TrainCandidate.failure)
FAILURE_REASONS = {
    "does_not_fit": "the most loaded device needs more memory than it has",
    "invalid_layout": "the estimator rejected the layout (e.g. a size that does not divide)",
}
# layouts per task handed to a worker (they share one resolver)
CHUNK = 16


@dataclass(frozen=True)
class TrainSearchSpace:
    """What to enumerate. Sizes that cannot apply are skipped, not tried: SP needs TP > 1,
    a virtual pipeline needs PP > 1, ZeRO needs DP > 1, EP > 1 needs experts."""

    model: str | ModelSpec
    device: str = "h100_sxm"
    num_devices: tuple[int, ...] = (8,)
    global_batch_size: int = 512
    seq_length: int = 2048
    dtype: str = "bf16"
    tp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    pp_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    cp_sizes: tuple[int, ...] = (1,)
    ep_sizes: tuple[int, ...] = (1,)
    virtual_pipeline_sizes: tuple[int, ...] = (1, 2)
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4)
    sequence_parallel: tuple[bool, ...] = (False, True)
    recompute: tuple[str, ...] = RECOMPUTE_CHOICES
    zero_stages: tuple[int, ...] = (0, 1)
    # a resolver factory (picklable, called once per chunk of layouts): None = the
    # analytic providers of the device alone (`perfcast train --calibration none`)
    resolver_factory: Callable[[], object] | None = None
    # evidence selectors of every query (runtime, implementation, ...), as `perfcast train`
    context: CostQueryContext = field(default_factory=CostQueryContext)
    # options of every layout (TrainingRequest's): DP gradients bucketed under the backward,
    # TP collectives pipelined with their GEMMs
    overlap_grad_reduce: bool = True
    tp_comm_overlap: bool = False


def layout_label(layout, micro_batch_size: int) -> str:
    """`tp8 pp4 v2 dp2 mb1 sp rc-full z1` for a TrainingLayout (or anything with its
    fields); sizes of 1 and options off are left out except TP, PP, DP and mb."""
    parts = [f"tp{layout.tp}", f"pp{layout.pp}"]
    if layout.virtual_pipeline > 1:
        parts.append(f"v{layout.virtual_pipeline}")
    parts.append(f"dp{layout.dp}")
    for name, size in (("cp", layout.cp), ("ep", layout.ep)):
        if size > 1:
            parts.append(f"{name}{size}")
    parts.append(f"mb{micro_batch_size}")
    if layout.sequence_parallel:
        parts.append("sp")
    if layout.recompute != "none":
        parts.append(f"rc-{layout.recompute}")
    if layout.zero_stage:
        parts.append(f"z{layout.zero_stage}")
    return " ".join(parts)


@dataclass(frozen=True)
class LayoutChoice:
    """One point of the space: the layout fields of `TrainingLayout` and the micro-batch."""

    num_devices: int
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    virtual_pipeline: int
    micro_batch_size: int
    sequence_parallel: bool
    recompute: str
    zero_stage: int

    def label(self) -> str:
        return layout_label(self, self.micro_batch_size)

    def layout_fields(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "ep": self.ep,
                "virtual_pipeline": self.virtual_pipeline,
                "sequence_parallel": self.sequence_parallel, "recompute": self.recompute,
                "zero_stage": self.zero_stage}


@dataclass
class TrainCandidate:
    label: str
    num_devices: int
    layout: dict
    micro_batch_size: int
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    fits: bool = False
    memory_bytes: dict = field(default_factory=dict)
    breakdown_s: dict = field(default_factory=dict)
    failure: str = ""                 # a key of FAILURE_REASONS, "" when ranked
    error: str = ""
    pareto: bool = False
    # cost answers per provider (each distinct chunk pass's tasks counted once)
    answered_by: dict = field(default_factory=dict)

    @property
    def ranked(self) -> bool:
        return not self.failure and self.step_time_s is not None

    @property
    def device_seconds(self) -> float | None:
        return None if self.step_time_s is None else self.step_time_s * self.num_devices

    def to_json(self) -> dict:
        d = asdict(self)
        d["device_seconds"] = self.device_seconds
        return d


def _num_experts(model: ModelSpec) -> int:
    from perfcast.workload.families.traits import NUM_EXPERTS_KEYS

    values = [model.get(k) for k in NUM_EXPERTS_KEYS]
    return max([v for v in values if isinstance(v, int)] or [1])


@dataclass(frozen=True)
class Enumeration:
    choices: tuple[LayoutChoice, ...]
    # combinations of the sizes that do not divide (check_layout's first reason, count)
    skipped: int = 0
    first_skip_reason: str = ""


def layout_choices(space: TrainSearchSpace, model: ModelSpec) -> Enumeration:
    """Every combination of the sizes that `check_layout` accepts (devices = TP x PP x DP
    x CP; layers by PP x V, heads by TP, the global batch by micro-batch x DP, the
    interleaved schedule's microbatches by PP, the sequence by 2 x CP, EP out of DP x TP).
    Combinations that could not differ are not generated: SP without TP, V > 1 without PP,
    ZeRO without DP, EP > 1 on a dense model."""
    from perfcast.training.layout import TrainingLayout, check_layout

    moe = _num_experts(model) > 1
    out, skipped, reason = [], 0, ""
    for n in sorted(set(space.num_devices)):
        for tp, cp, pp in itertools.product(space.tp_sizes, space.cp_sizes, space.pp_sizes):
            if n % (tp * cp * pp):
                continue
            dp = n // (tp * cp * pp)
            for v, b, e, sp, rc, z in itertools.product(
                    space.virtual_pipeline_sizes, space.micro_batch_sizes, space.ep_sizes,
                    space.sequence_parallel, space.recompute, space.zero_stages):
                if (v > 1 and pp == 1) or (sp and tp == 1) or (z and dp == 1) \
                        or (e > 1 and not moe):
                    continue
                c = LayoutChoice(n, tp, pp, dp, cp, e, v, b, sp, rc, z)
                try:
                    check_layout(TrainingLayout(**c.layout_fields()), model,
                                 global_batch_size=space.global_batch_size,
                                 micro_batch_size=b, seq_length=space.seq_length, moe=moe)
                except ConfigError as exc:
                    skipped += 1
                    reason = reason or f"{c.label()} ({n} GPUs): {exc}"
                    continue
                out.append(c)
    return Enumeration(tuple(out), skipped, reason)


@functools.lru_cache(maxsize=8)
def _dense_params(model: ModelSpec) -> float | None:
    """Parameters of a dense model (from its forward graph's weights); None for MoE."""
    from perfcast.workload import Batch, ParallelPlan, Precision, build_task_graph

    if _num_experts(model) > 1:
        return None
    graph = build_task_graph(model, ParallelPlan(), Batch.prefill(1, 16, 0),
                             Precision.uniform("bf16"))
    return graph.param_count()


def static_lower_bound_bytes(params: float, c: LayoutChoice) -> float:
    """Weights, gradients and Adam state of the most loaded device, at least: its share is
    at least params / (TP x PP) (each parameter sits in one stage, TP only splits), at 2
    + 2 + 12 bytes each, ZeRO dividing by DP x CP from stage 3, 2, 1 respectively."""
    from perfcast.training.graph import GRAD_BYTES, OPTIMIZER_BYTES, PARAM_BYTES

    share = params / (c.tp * c.pp)
    ranks = c.dp * c.cp
    per_param = sum(b / (ranks if c.zero_stage >= stage else 1)
                    for b, stage in ((PARAM_BYTES, 3), (GRAD_BYTES, 2), (OPTIMIZER_BYTES, 1)))
    return share * per_param


def evaluate_chunk(space: TrainSearchSpace, choices: Sequence[LayoutChoice]
                   ) -> list[TrainCandidate]:
    """Estimate a chunk of layouts with one shared resolver. A dense layout whose
    weights, gradients and optimizer state alone exceed the device's memory is marked
    `does_not_fit` from that bound, without costing its step."""
    from perfcast.evidence.factory import build_resolver
    from perfcast.hardware import load_system
    from perfcast.training import TrainingLayout, TrainingRequest, estimate_training

    model = space.model if isinstance(space.model, ModelSpec) else load_model_spec(space.model)
    system = load_system(space.device)
    resolver = space.resolver_factory() if space.resolver_factory else build_resolver(system)
    params = _dense_params(model)
    capacity = float(system.device.memory.capacity_bytes)
    out = []
    for c in choices:
        cand = TrainCandidate(c.label(), c.num_devices, c.layout_fields(), c.micro_batch_size)
        bound = static_lower_bound_bytes(params, c) if params else 0.0
        if bound > capacity:
            cand.failure = "does_not_fit"
            cand.memory_bytes = {"static_lower_bound": bound, "capacity": capacity}
            cand.error = (f"weights, gradients and optimizer state alone need at least "
                          f"{bound / 2**30:.1f} GiB of {capacity / 2**30:.1f} GiB per device")
            out.append(cand)
            continue
        try:
            req = TrainingRequest(model=model, device=system,
                                  layout=TrainingLayout(**c.layout_fields()),
                                  global_batch_size=space.global_batch_size,
                                  micro_batch_size=c.micro_batch_size,
                                  seq_length=space.seq_length, dtype=space.dtype,
                                  context=space.context,
                                  overlap_grad_reduce=space.overlap_grad_reduce,
                                  tp_comm_overlap=space.tp_comm_overlap)
            res = estimate_training(req, resolver=resolver)
        except PerfcastError as exc:
            cand.failure, cand.error = "invalid_layout", str(exc)
            out.append(cand)
            continue
        cand.step_time_s, cand.tokens_per_s = res.step_time_s, res.tokens_per_s
        cand.mfu, cand.hfu, cand.fits = res.mfu, res.hfu, bool(res.fits)
        cand.memory_bytes, cand.breakdown_s = dict(res.memory_bytes), dict(res.breakdown_s)
        cand.answered_by = _answers(res)
        if not cand.fits:
            cand.failure = "does_not_fit"
        out.append(cand)
    return out


def _answers(res) -> dict[str, int]:
    counts: Counter = Counter()
    for cc in {id(c): c for c in res.costs}.values():
        for g in (cc.forward, cc.backward_dp):
            counts.update(ct.resolution.estimate.provider for ct in g.tasks)
    for g in res.optimizer_costed:
        counts.update(ct.resolution.estimate.provider for ct in g.tasks)
    return dict(sorted(counts.items()))


def provenance(cands: Sequence[TrainCandidate]) -> dict[str, int]:
    """Cost answers per provider summed over the estimated layouts."""
    total: Counter = Counter()
    for c in cands:
        total.update(c.answered_by)
    return dict(total.most_common())


def _run_chunk(args: tuple[TrainSearchSpace, Sequence[LayoutChoice]]) -> list[TrainCandidate]:
    return evaluate_chunk(*args)


def _check(space: TrainSearchSpace) -> None:
    for name in ("num_devices", "tp_sizes", "pp_sizes", "cp_sizes", "ep_sizes",
                 "virtual_pipeline_sizes", "micro_batch_sizes"):
        values = getattr(space, name)
        if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                             for v in values):
            raise ConfigError(f"has value {values!r}", field=name,
                              expected="positive integers")
    for name in ("global_batch_size", "seq_length"):
        value = getattr(space, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"has value {value!r}", field=name, expected="a positive integer")
    bad = [r for r in space.recompute if r not in RECOMPUTE_CHOICES]
    if bad or not space.recompute:
        raise ConfigError(f"has value {list(space.recompute)!r}", field="recompute",
                          expected=" | ".join(RECOMPUTE_CHOICES))
    if not space.zero_stages or any(z not in (0, 1, 2, 3) for z in space.zero_stages):
        raise ConfigError(f"has value {list(space.zero_stages)!r}", field="zero_stages",
                          expected="0, 1, 2 or 3")


@dataclass
class TrainSearchResult:
    candidates: list[TrainCandidate]
    skipped: int                      # size combinations that do not divide
    first_skip_reason: str
    wall_s: float


def search(space: TrainSearchSpace, *, executor: str = "local", workers: int | None = None,
           chunk: int = CHUNK, on_start: Callable[[int], None] | None = None,
           on_progress: Callable[[int], None] | None = None) -> TrainSearchResult:
    """Evaluate every layout of the space; `on_start(layouts)` once they are known and
    `on_progress(layouts done)` as chunks finish. Marks the Pareto front."""
    t0 = time.perf_counter()
    _check(space)
    model = space.model if isinstance(space.model, ModelSpec) else load_model_spec(space.model)
    enum = layout_choices(space, model)
    choices = enum.choices
    if not choices:
        raise ConfigError(
            f"no layout of TP {list(space.tp_sizes)}, PP {list(space.pp_sizes)}, CP "
            f"{list(space.cp_sizes)} and micro-batch {list(space.micro_batch_sizes)} divides "
            f"{list(space.num_devices)} devices and global batch {space.global_batch_size}"
            + (f"; e.g. {enum.first_skip_reason}" if enum.first_skip_reason else ""),
            field="--num-devices", expected="a budget and sizes that some layout divides")
    if on_start is not None:
        on_start(len(choices))
    bound = space if isinstance(space.model, ModelSpec) else _with_model(space, model)
    tasks = [(bound, choices[i:i + chunk]) for i in range(0, len(choices), chunk)]
    state = {"done": 0}

    def done(i: int) -> None:
        state["done"] += len(tasks[i][1])
        if on_progress is not None:
            on_progress(state["done"])

    groups = map_tasks(_run_chunk, tasks, executor, workers, done)
    cands = [c for g in groups for c in g]
    for c in pareto_front(cands):
        c.pareto = True
    return TrainSearchResult(cands, enum.skipped, enum.first_skip_reason,
                             time.perf_counter() - t0)


def _with_model(space: TrainSearchSpace, model: ModelSpec) -> TrainSearchSpace:
    from dataclasses import replace

    return replace(space, model=model)


def ranked(cands: Sequence[TrainCandidate]) -> list[TrainCandidate]:
    """Layouts that fit, fastest step first (ties: fewer devices first)."""
    return sorted((c for c in cands if c.ranked), key=lambda c: (c.step_time_s, c.num_devices))


def pareto_front(cands: Sequence[TrainCandidate]) -> list[TrainCandidate]:
    """Fitting layouts no other fitting layout beats on both step time and devices (one
    per point: the first in `ranked` order), fewest devices first."""
    front: list[TrainCandidate] = []
    for c in sorted(ranked(cands), key=lambda c: (c.num_devices, c.step_time_s)):
        if not front or c.step_time_s < front[-1].step_time_s:
            front.append(c)
    return front


def best_per_budget(cands: Sequence[TrainCandidate]) -> dict[int, TrainCandidate]:
    out: dict[int, TrainCandidate] = {}
    for c in ranked(cands):
        out.setdefault(c.num_devices, c)
    return dict(sorted(out.items()))


def failure_counts(cands: Sequence[TrainCandidate]) -> dict[str, int]:
    counts = Counter(c.failure for c in cands if c.failure)
    return {r: counts[r] for r in FAILURE_REASONS if counts[r]}
