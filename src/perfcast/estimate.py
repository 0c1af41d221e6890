"""High-level API: estimate one step of a model on a system.

>>> from perfcast.estimate import estimate_step, EstimateRequest
>>> result = estimate_step(EstimateRequest(model="meta-llama/Llama-3.1-8B", device="h100_sxm"))
>>> result.latency_s  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from perfcast.evidence.collectives import CollectiveCostProvider
from perfcast.evidence.contracts import CostProvider, CostQueryContext
from perfcast.evidence.costing import CostedGraph, cost_graph
from perfcast.evidence.resolver import CostResolver
from perfcast.evidence.roofline import RooflineCostProvider
from perfcast.hardware import System, load_system
from perfcast.workload import (
    Batch,
    ModelSpec,
    ParallelPlan,
    Precision,
    TaskGraph,
    build_task_graph,
    load_model_spec,
)


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
    mtp_layers: int = 0
    mla_form: str = "auto"
    block_size: int = 0
    reserve_bytes: float = 0.0


@dataclass(frozen=True)
class StepResult:
    request: EstimateRequest
    system: System
    graph: TaskGraph
    costed: CostedGraph

    @property
    def latency_s(self) -> float:
        return self.costed.sum_of_tasks_s()

    @property
    def tokens(self) -> int:
        return self.graph.batch.tokens

    @property
    def tokens_per_s_per_device(self) -> float:
        lat = self.latency_s
        return self.tokens / lat / self.graph.num_devices if lat > 0 else 0.0

    @property
    def memory_fits(self) -> bool:
        return self.graph.memory.total <= self.system.device.memory.capacity_bytes


def default_providers(system: System, *, roofline_mode: str = "roofline") -> list[CostProvider]:
    return [RooflineCostProvider(system, mode=roofline_mode), CollectiveCostProvider(system)]


def make_resolver(system: System, evidence: Sequence[CostProvider] = (), *,
                  roofline_mode: str = "roofline") -> CostResolver:
    """Measured/interpolated providers first (in the given order), then analytic models."""
    return CostResolver([*evidence, *default_providers(system, roofline_mode=roofline_mode)])


def estimate_step(request: EstimateRequest, resolver: CostResolver | None = None) -> StepResult:
    system = request.device if isinstance(request.device, System) else load_system(request.device)
    model = request.model if isinstance(request.model, ModelSpec) else load_model_spec(request.model)
    graph = build_task_graph(model, request.plan, request.batch, request.precision,
                             logits=request.logits, mtp_layers=request.mtp_layers,
                             mla_form=request.mla_form, block_size=request.block_size,
                             reserve_bytes=request.reserve_bytes)
    resolver = resolver or make_resolver(system, roofline_mode=request.roofline_mode)
    costed = cost_graph(graph, system.name, resolver, request.context)
    return StepResult(request=request, system=system, graph=graph, costed=costed)
