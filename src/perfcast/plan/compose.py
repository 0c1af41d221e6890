"""Compose costed graphs into a Timeline: the plan-level evaluation.

Full timeline: every layer of every unit is an instance. Compressed (the default): with
L = the fewest layers of any block longer than SHORT_BLOCK_LAYERS, each long block is
scheduled with k representative layers (each standing for 1/L of its layers, plus up to
four real layers for what it has beyond L) for k = 1 and k = 4; makespan, per-device
idle time and exposed communication are extrapolated linearly to k = L:
`X = X_1 + (L - 1) / 3 * (X_4 - X_1)`. This is exact for chains, for overlap inside a
layer and for pipelines whose stage times grow by a fixed amount per layer, and it keeps
the steady state of patterns that cross layer boundaries, such as two-microbatch
interleaving (one half's all-reduce under the other half's next GEMMs). The Timeline's
tasks are those of the k = 4 schedule; `extrapolated_layers` records L.
"""

from __future__ import annotations

from collections.abc import Sequence

from perfcast.core.errors import ConfigError
from perfcast.evidence.costing import CostedGraph
from perfcast.hardware.model import System
from perfcast.plan.expand import SHORT_BLOCK_LAYERS, Expanded, block_lengths, expand_units
from perfcast.plan.pipeline import PipelineSchedule
from perfcast.plan.resources import COMPUTE_STREAM, OverlapMode, ResourceModel
from perfcast.plan.scheduler import Schedule, simulate
from perfcast.plan.timeline import DeviceLane, PlanOptions, ScheduledTask, Timeline, union_length
from perfcast.workload.tensors import TaskKind

# compressed mode schedules each long block with this many representative layers and
# extrapolates; the slope averages layers 2-4, past the first layer's start-up, which
# covers the periodic patterns seen in two-microbatch ping-pong (period 1 to 3 layers)
REP_LAYERS = (1, 4)


def schedule_plan(units: Sequence[CostedGraph], system: System | None,
                  options: PlanOptions = PlanOptions()) -> Timeline:
    """Schedule `units` (one costed graph per microbatch, or per half-microbatch under
    two-microbatch overlap, in order) on the plan's devices and streams. Pass the same
    CostedGraph object for identical units: their instance template is built once."""
    overlap = OverlapMode.parse(options.overlap)
    pp_schedule = PipelineSchedule.parse(options.pp_schedule)
    expected = options.num_microbatches * overlap.halves
    if len(units) != expected:
        raise ConfigError(f"got {len(units)} costed units for {options.num_microbatches} "
                          f"microbatch(es) under overlap={overlap.value}",
                          field="units", expected=str(expected))
    stages = sorted({ct.task.stage for u in units for ct in u.tasks})
    limit = pp_schedule.max_in_flight(len(stages))
    resources = ResourceModel(system, overlap)

    def run(rep_layers: int | None, ref_layers: int = 1) -> tuple[Expanded, Schedule]:
        exp = expand_units(units, resources, rep_layers=rep_layers, ref_layers=ref_layers,
                           per_stage_in_flight=overlap.halves,
                           max_in_flight=None if limit is None else limit * overlap.halves)
        return exp, simulate(exp.problem)

    sum_s = sum(ct.total_latency_s for u in units for ct in u.tasks)
    long_blocks = [n for u in units for n in block_lengths(u) if n > SHORT_BLOCK_LAYERS]
    if options.full_timeline or not long_blocks:
        return _timeline(options, units, stages, *run(None), sum_s)
    ref = min(long_blocks)
    a = _timeline(options, units, stages, *run(REP_LAYERS[0], ref), sum_s, with_tasks=False)
    b = _timeline(options, units, stages, *run(REP_LAYERS[1], ref), sum_s)
    steps = (ref - REP_LAYERS[0]) / (REP_LAYERS[1] - REP_LAYERS[0])

    def grow(x_a: float, x_b: float) -> float:
        return max(x_a + steps * (x_b - x_a), 0.0)

    makespan = max(grow(a.makespan_s, b.makespan_s), b.makespan_s)
    return Timeline(options=options, units=b.units, tasks=b.tasks, devices=b.devices,
                    makespan_s=makespan, sum_of_tasks_s=sum_s, critical_path=b.critical_path,
                    idle_s=tuple(grow(x, y) for x, y in zip(a.idle_s, b.idle_s)),
                    exposed_comm_s=grow(a.exposed_comm_s, b.exposed_comm_s),
                    extrapolated_layers=ref)


def _timeline(options: PlanOptions, units: Sequence[CostedGraph], stages: list[int],
              exp: Expanded, sched: Schedule, sum_s: float, *, with_tasks: bool = True) -> Timeline:
    prob = exp.problem
    start, end = sched.start_s, sched.end_s
    stage_of = [exp.templates[u].stage[i] for u, i in zip(exp.unit_of, exp.local_of)]
    makespan = sched.makespan_s
    copies = {ct.task.stage: ct.task.devices for u in units for ct in u.tasks}
    spans: dict[int, list[tuple[float, float]]] = {s: [] for s in stages}
    for g, s in enumerate(stage_of):
        spans[s].append((start[g], end[g]))
    lanes, idle = [], []
    for s in stages:
        streams = sorted({n for st, n in exp.streams if st == s},
                         key=lambda n: (n != COMPUTE_STREAM, n))
        lanes.append(DeviceLane(stage=s, name=f"stage{s}", copies=copies.get(s, 1),
                                streams=tuple(streams)))
        idle.append(max(makespan - union_length(spans[s]), 0.0))
    path = tuple(sched.critical_path())
    comm = TaskKind.COMMUNICATION
    exposed = 0.0
    for g in path:
        tpl = exp.templates[exp.unit_of[g]]
        if tpl.costed[exp.local_of[g]].task.kind is comm:
            exposed += end[g] - start[g]
    tasks = []
    if with_tasks:
        for g, (u, i) in enumerate(zip(exp.unit_of, exp.local_of)):
            tpl = exp.templates[u]
            tasks.append(ScheduledTask(
                lineage=tpl.lineage[i], unit=u, stage=tpl.stage[i], stream=tpl.stream[i],
                start_s=start[g], end_s=end[g], uncontended_s=prob.duration_s[g],
                calls=tpl.calls[i], costed=tpl.costed[i]))
    return Timeline(options=options, units=len(units), tasks=tuple(tasks),
                    devices=tuple(lanes), makespan_s=makespan, sum_of_tasks_s=sum_s,
                    critical_path=path if with_tasks else (), idle_s=tuple(idle),
                    exposed_comm_s=exposed, extrapolated_layers=0)
