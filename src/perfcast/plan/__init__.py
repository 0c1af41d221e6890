"""Plan-level composition: streams, overlap, pipeline schedules and the timeline.

Summing task latencies ignores overlap, serialisation, bubbles and contention; those are
properties of a plan on resources. `schedule_plan` places every costed task on its
device's streams, schedules it with a discrete-event list scheduler and returns a
`Timeline` (makespan, critical path, exposed communication, idle/bubble time).
"""

from perfcast.plan.compose import schedule_plan
from perfcast.plan.pipeline import PipelineSchedule, bubble_fraction, split_batch
from perfcast.plan.resources import OverlapMode, Placement, ResourceModel
from perfcast.plan.scheduler import Problem, Schedule, simulate
from perfcast.plan.timeline import DeviceLane, PlanOptions, ScheduledTask, Timeline

__all__ = [
    "DeviceLane", "OverlapMode", "PipelineSchedule", "PlanOptions", "Placement", "Problem",
    "ResourceModel", "Schedule", "ScheduledTask", "Timeline", "bubble_fraction",
    "schedule_plan", "simulate", "split_batch",
]
