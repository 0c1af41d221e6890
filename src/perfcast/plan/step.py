"""One step of a model on a system: build the task graph, cost it through the resolver,
schedule it as a plan (`perfcast estimate`).

>>> from perfcast.plan.step import estimate_step, EstimateRequest
>>> result = estimate_step(EstimateRequest(model="meta-llama/Llama-3.1-8B", device="h100_sxm"))
>>> result.latency_s  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfcast.evidence.contracts import CostQueryContext
from perfcast.evidence.costing import CostedGraph, cost_graph
from perfcast.evidence.factory import build_resolver
from perfcast.evidence.resolver import CostResolver
from perfcast.hardware import System, load_system
from perfcast.plan import (
    OverlapMode,
    PipelineSchedule,
    PlanOptions,
    Timeline,
    schedule_plan,
    split_batch,
)
from perfcast.workload import (
    Batch,
    ModelSpec,
    ParallelPlan,
    Precision,
    TaskGraph,
    build_task_graph,
    load_model_spec,
)
from perfcast.workload.stacks import resolve_mla_call, resolve_stack


@dataclass(frozen=True)
class EstimateRequest:
    model: str | ModelSpec
    device: str | System = "h100_sxm"
    plan: ParallelPlan = field(default_factory=ParallelPlan)
    batch: Batch = field(default_factory=lambda: Batch.prefill(1, 1024))
    precision: Precision | None = None
    logits: str = "last"
    roofline_mode: str = "roofline"
    context: CostQueryContext = field(default_factory=CostQueryContext)
    # plan-level composition (perfcast.plan)
    num_microbatches: int = 1
    pp_schedule: str = "gpipe"      # gpipe | 1f1b
    overlap: str = "comm"           # none | comm | two-microbatch
    full_timeline: bool = False     # expand every layer (else representative layers, extrapolated)
    # workload options (perfcast.workload.build_task_graph)
    mtp_layers: int = 0
    mla_form: str = "auto"
    mla_call: str = "auto"          # auto | split | tensorcast (perfcast.workload.families.mla)
    block_size: int = 0
    reserve_bytes: float = 0.0
    stack: str = "auto"             # perfcast.workload.stacks: auto | default | tensorcast


@dataclass(frozen=True)
class StepResult:
    """`graph`/`costed` hold the whole step's work (the per-op table); `timeline` is the
    plan that schedules it (per microbatch graphs when the step is split)."""

    request: EstimateRequest
    system: System
    graph: TaskGraph
    costed: CostedGraph
    timeline: Timeline | None = None

    @property
    def latency_s(self) -> float:
        """Step latency: the plan's makespan (the plain sum when no plan was scheduled)."""
        return self.timeline.makespan_s if self.timeline is not None else self.sum_of_tasks_s

    @property
    def sum_of_tasks_s(self) -> float:
        """Plain sum of the whole step's task latencies (no overlap, no pipelining)."""
        return self.costed.sum_of_tasks_s()

    @property
    def tokens(self) -> int:
        return self.graph.batch.tokens

    @property
    def tokens_per_s_per_device(self) -> float:
        lat = self.latency_s
        return self.tokens / lat / self.graph.num_devices if lat > 0 else 0.0


def build_step_graph(request: EstimateRequest, model: ModelSpec, batch: Batch,
                 system: System) -> TaskGraph:
    """The task graph of `batch` (the whole step or one microbatch) under the request.
    `mla_call="auto"` is TensorCast's one MLA call under a stack with TensorCast's
    tensors, perfcast's split tasks otherwise."""
    stack = resolve_stack(request.stack, system.device.vendor)
    return build_task_graph(model, request.plan, batch, request.precision,
                            logits=request.logits, mtp_layers=request.mtp_layers,
                            mla_form=request.mla_form, block_size=request.block_size,
                            reserve_bytes=request.reserve_bytes, stack=stack,
                            mla_call=resolve_mla_call(request.mla_call, stack))


def estimate_step(request: EstimateRequest, resolver: CostResolver | None = None) -> StepResult:
    PipelineSchedule.parse(request.pp_schedule)  # bad plan options fail before any costing
    halves = OverlapMode.parse(request.overlap).halves
    system = request.device if isinstance(request.device, System) else load_system(request.device)
    model = request.model if isinstance(request.model, ModelSpec) else load_model_spec(request.model)
    graph = build_step_graph(request, model, request.batch, system)
    resolver = resolver or build_resolver(system, roofline_mode=request.roofline_mode)
    costed = cost_graph(graph, system.name, resolver, request.context)
    options = PlanOptions(num_microbatches=request.num_microbatches,
                          pp_schedule=request.pp_schedule, overlap=request.overlap,
                          full_timeline=request.full_timeline)
    parts = request.num_microbatches * halves
    units = [costed]
    if parts > 1:
        by_batch: dict = {}
        units = []
        note = f"{request.num_microbatches} x {halves} halves (--overlap two-microbatch)" \
            if halves > 1 else ""
        for part in split_batch(request.batch, parts, note=note):
            if part not in by_batch:
                by_batch[part] = cost_graph(build_step_graph(request, model, part, system), system.name,
                                            resolver, request.context)
            units.append(by_batch[part])
    timeline = schedule_plan(units, system, options)
    return StepResult(request=request, system=system, graph=graph, costed=costed,
                      timeline=timeline)
