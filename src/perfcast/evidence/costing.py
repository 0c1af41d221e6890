"""Cost every task of a TaskGraph through one resolver: the CostedGraph."""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.evidence.contracts import CostQueryContext, Resolution
from perfcast.evidence.queries import query_for_task
from perfcast.evidence.resolver import CostResolver
from perfcast.workload.graph import TaskGraph
from perfcast.workload.tensors import Task, TaskKind


@dataclass(frozen=True)
class CostedTask:
    task: Task
    resolution: Resolution

    @property
    def latency_s(self) -> float:
        """Latency of one call."""
        return self.resolution.estimate.latency_s

    @property
    def total_latency_s(self) -> float:
        """Latency of all `count` calls on one device."""
        return self.resolution.estimate.latency_s * self.task.count


@dataclass(frozen=True)
class CostedGraph:
    """One CostEstimate per task (workload stays duration-free; costs live here)."""

    graph: TaskGraph
    hardware: str
    resolver_identity: str
    tasks: tuple[CostedTask, ...]

    def sum_of_tasks_s(self) -> float:
        """Plain sum of every call on the path of one token batch through all stages."""
        return sum(ct.total_latency_s for ct in self.tasks)

    def comm_s(self) -> float:
        return sum(ct.total_latency_s for ct in self.tasks
                   if ct.task.kind is TaskKind.COMMUNICATION)

    def by_lineage(self) -> dict[str, CostedTask]:
        return {ct.task.lineage: ct for ct in self.tasks}


def cost_graph(graph: TaskGraph, hardware: str, resolver: CostResolver,
               context: CostQueryContext | None = None) -> CostedGraph:
    costed = []
    for task in graph.tasks:
        query = query_for_task(task, hardware, context)
        costed.append(CostedTask(task, resolver.resolve(query)))
    return CostedGraph(graph=graph, hardware=hardware, resolver_identity=resolver.identity,
                       tasks=tuple(costed))
