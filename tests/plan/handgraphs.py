"""Hand-made costed graphs with round latencies, so schedules can be checked by hand."""

from __future__ import annotations

from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostEstimate, EstimateMethod, MatchKind, Resolution
from perfcast.evidence.costing import CostedGraph, CostedTask
from perfcast.hardware import load_system
from perfcast.workload import (
    Batch,
    Engine,
    MemoryFacts,
    ParallelPlan,
    Precision,
    Task,
    TaskGraph,
    TaskKind,
    Work,
    load_model_spec,
)

MS = 1e-3
SYSTEM = load_system("h100_sxm")  # tiers: nvlink (groups of up to 8), infiniband (beyond)


def task(lineage: str, latency_s: float, deps=(), *, comm: bool = False, participants: int = 8,
         stage: int = 0, layers: tuple[int, int] | None = None, calls_per_layer: int = 1,
         bandwidth_s: float | None = None, stream: str = "",
         operation: str = "", stride: int = 1) -> CostedTask:
    """A task whose every call costs `latency_s`. Collectives (`comm=True`) carry
    `participants` (which picks the tier) and optionally the bandwidth part of the cost."""
    reps = len(range(layers[0], layers[1] + 1, stride)) if layers else 1
    group = lineage.split(".", 1)[1] if layers else lineage
    op = operation or ("all_reduce" if comm else "gemm")
    work = Work(engine=Engine.NETWORK if comm else Engine.MATRIX,
                participants=participants if comm else 0)
    attrs = {"stream": stream} if stream else {}
    t = Task(lineage=lineage, group=group, operator=f"hand.{op}", operation=op,
             kind=TaskKind.COMMUNICATION if comm else TaskKind.COMPUTE, inputs=(), outputs=(),
             work=work, deps=tuple(deps), count=reps * calls_per_layer, stage=stage,
             layers=layers, attributes=FrozenDict(attrs))
    comps = FrozenDict({"bandwidth_s": bandwidth_s, "latency_s": latency_s - bandwidth_s}) \
        if bandwidth_s is not None else FrozenDict()
    est = CostEstimate(latency_s=latency_s, method=EstimateMethod.ANALYTICAL,
                       match_kind=MatchKind.DECLARED, provider="hand", provider_revision="1",
                       components=comps)
    return CostedTask(t, Resolution(estimate=est, attempts=(), policy="hand"))


_MODEL = load_model_spec("meta-llama/Llama-3.1-8B")


def graph(*tasks: CostedTask, pp: int = 1) -> CostedGraph:
    tg = TaskGraph(model=_MODEL, plan=ParallelPlan(pp=pp), batch=Batch.prefill(1, 1),
                   precision=Precision(), tasks=tuple(ct.task for ct in tasks),
                   memory=MemoryFacts(0.0, 0.0, 0.0))
    return CostedGraph(graph=tg, hardware=SYSTEM.name, resolver_identity="hand",
                       tasks=tuple(tasks))
