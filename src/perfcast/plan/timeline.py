"""The Timeline: when every task instance ran, where, and what the plan adds up to.

* `makespan_s`: end of the last instance (the step latency of the plan);
* `sum_of_tasks_s`: plain sum of every scheduled instance's uncontended duration (what
  adding up task latencies would claim; the gap to the makespan is what overlap and
  pipelining buy, or what contention costs);
* `critical_path`: from the instance that ends last, back through what released each
  start (its last-finishing predecessor, or the task before it on its stream);
* `exposed_comm_s`: communication time on the critical path (what the makespan would
  lose, to first order, if those transfers were free);
* compressed timelines hold four representative layers per long block; their makespan, idle
  and exposed communication are extrapolated to all layers (`perfcast.plan.compose`),
  so those three are fields, not sums over `tasks`;
* `idle_s[d]`: time device d has no instance running on any stream within the makespan;
  `bubble_s` is its mean over devices (pipeline fill/drain and waiting);
* ids: `lineage` is the costing lineage (`L12.attn.o_proj` per layer in a full
  timeline, `L0-39.attn.o_proj` for a compressed block); `unit` is the microbatch (or
  half-microbatch) index; `instance_id` joins them (`L12.attn.o_proj@mb3`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from perfcast.evidence.costing import CostedTask
from perfcast.workload.tensors import TaskKind


class ScheduledTask(NamedTuple):
    """One scheduled instance (a NamedTuple: ten thousand of them build in a few ms)."""

    lineage: str
    unit: int
    stage: int
    stream: str
    start_s: float
    end_s: float
    uncontended_s: float  # duration had it run alone on its link
    calls: int
    costed: CostedTask

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def is_comm(self) -> bool:
        return self.costed.task.kind is TaskKind.COMMUNICATION


@dataclass(frozen=True)
class PlanOptions:
    num_microbatches: int = 1
    pp_schedule: str = "gpipe"
    overlap: str = "comm"
    full_timeline: bool = False


@dataclass(frozen=True)
class DeviceLane:
    """One process of the trace: the representative device of a pipeline stage."""

    stage: int
    name: str
    copies: int  # devices running identical work (tp x dp)
    streams: tuple[str, ...]


@dataclass(frozen=True)
class Timeline:
    options: PlanOptions
    units: int
    tasks: tuple[ScheduledTask, ...]
    devices: tuple[DeviceLane, ...]
    makespan_s: float
    sum_of_tasks_s: float
    critical_path: tuple[int, ...]  # indices into `tasks`
    idle_s: tuple[float, ...]       # per device, same order as `devices`
    exposed_comm_s: float
    extrapolated_layers: int = 0    # compressed mode: layers extrapolated to (0: all scheduled)

    def instance_id(self, i: int) -> str:
        t = self.tasks[i]
        return t.lineage if self.units == 1 else f"{t.lineage}@mb{t.unit}"

    def critical_path_ids(self) -> list[str]:
        return [self.instance_id(i) for i in self.critical_path]

    @property
    def bubble_s(self) -> float:
        return sum(self.idle_s) / len(self.idle_s) if self.idle_s else 0.0

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.makespan_s if self.makespan_s > 0 else 0.0

    def busy_s(self, stage: int, stream: str | None = None) -> float:
        """Union length of the intervals on one device (or one of its streams)."""
        return union_length((t.start_s, t.end_s) for t in self.tasks
                            if t.stage == stage and (stream is None or t.stream == stream))

    def summary(self) -> dict:
        return {"makespan_s": self.makespan_s, "sum_of_tasks_s": self.sum_of_tasks_s,
                "exposed_comm_s": self.exposed_comm_s, "bubble_s": self.bubble_s,
                "bubble_fraction": self.bubble_fraction,
                "critical_path": self.critical_path_ids(),
                "idle_s": {d.name: idle for d, idle in zip(self.devices, self.idle_s)},
                "num_microbatches": self.options.num_microbatches,
                "units": self.units, "pp_schedule": self.options.pp_schedule,
                "overlap": self.options.overlap, "full_timeline": self.options.full_timeline,
                "scheduled_instances": len(self.tasks),
                "extrapolated_layers": self.extrapolated_layers}


def union_length(intervals) -> float:
    total = 0.0
    cur_a = cur_b = None
    for a, b in sorted(intervals):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        elif b > cur_b:
            cur_b = b
    if cur_b is not None:
        total += cur_b - cur_a
    return total
