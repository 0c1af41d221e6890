"""Compose costed graphs into a Timeline: the plan-level evaluation."""

from __future__ import annotations

from collections.abc import Sequence

from perfcast.core.errors import ConfigError
from perfcast.evidence.costing import CostedGraph
from perfcast.hardware.model import System
from perfcast.plan.expand import expand_units
from perfcast.plan.pipeline import PipelineSchedule
from perfcast.plan.resources import COMPUTE_STREAM, OverlapMode, ResourceModel
from perfcast.plan.scheduler import simulate
from perfcast.plan.timeline import DeviceLane, PlanOptions, ScheduledTask, Timeline, union_length


def schedule_plan(units: Sequence[CostedGraph], system: System | None,
                  options: PlanOptions = PlanOptions()) -> Timeline:
    """Schedule `units` (one costed graph per microbatch, or per half-microbatch under
    two-microbatch overlap, in order) on the plan's devices and streams."""
    overlap = OverlapMode.parse(options.overlap)
    pp_schedule = PipelineSchedule.parse(options.pp_schedule)
    expected = options.num_microbatches * overlap.halves
    if len(units) != expected:
        raise ConfigError(f"got {len(units)} costed units for {options.num_microbatches} "
                          f"microbatch(es) under overlap={overlap.value}",
                          field="units", expected=str(expected))
    stages = sorted({ct.task.stage for u in units for ct in u.tasks})
    limit = pp_schedule.max_in_flight(len(stages))
    exp = expand_units(units, ResourceModel(system, overlap), full=options.full_timeline,
                       per_stage_in_flight=overlap.halves,
                       max_in_flight=None if limit is None else limit * overlap.halves)
    sched = simulate(exp.problem)
    prob = exp.problem
    tasks = []
    for g, (u, i) in enumerate(zip(exp.unit_of, exp.local_of)):
        tpl = exp.templates[u]
        tasks.append(ScheduledTask(
            lineage=tpl.lineage[i], unit=u, stage=tpl.stage[i], stream=tpl.stream[i],
            start_s=sched.start_s[g], end_s=sched.end_s[g], uncontended_s=prob.duration_s[g],
            calls=tpl.calls[i], costed=tpl.costed[i]))
    makespan = sched.makespan_s
    copies = {ct.task.stage: ct.task.devices for u in units for ct in u.tasks}
    lanes, idle = [], []
    for s in stages:
        streams = sorted({n for st, n in exp.streams if st == s},
                         key=lambda n: (n != COMPUTE_STREAM, n))
        lanes.append(DeviceLane(stage=s, name=f"stage{s}", copies=copies.get(s, 1),
                                streams=tuple(streams)))
        busy = union_length((t.start_s, t.end_s) for t in tasks if t.stage == s)
        idle.append(max(makespan - busy, 0.0))
    return Timeline(options=options, units=len(units), tasks=tuple(tasks),
                    devices=tuple(lanes), makespan_s=makespan,
                    sum_of_tasks_s=sum(prob.duration_s),
                    critical_path=tuple(sched.critical_path()), idle_s=tuple(idle))
