"""Plan-level composition: streams, overlap, pipeline schedules and the timeline.

Summing task latencies ignores overlap, serialisation, bubbles and contention; those are
properties of a plan on resources. `schedule_plan` places every costed task on its
device's streams, schedules it with a discrete-event list scheduler and returns a
`Timeline` (makespan, critical path, exposed communication, idle/bubble time).

The names below load their module on first use (`perfcast serve` needs only
`plan.resources` and should not pay for the scheduler and the timeline).
"""

import importlib

_MODULES = {
    "schedule_plan": "compose",
    "PipelineSchedule": "pipeline", "bubble_fraction": "pipeline", "split_batch": "pipeline",
    "OverlapMode": "resources", "Placement": "resources", "ResourceModel": "resources",
    "Problem": "scheduler", "Schedule": "scheduler", "simulate": "scheduler",
    "DeviceLane": "timeline", "PlanOptions": "timeline", "ScheduledTask": "timeline",
    "Timeline": "timeline",
}

__all__ = sorted(_MODULES)


def __getattr__(name: str):
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULES})
