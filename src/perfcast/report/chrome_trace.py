"""Chrome Trace Event JSON (opens in Perfetto and chrome://tracing).

* a plan's Timeline: one process per device (the representative device of each
  pipeline stage), one thread per stream (compute, comm.<tier>, p2p, ...), one complete
  event ("ph": "X") per task instance at its scheduled start and duration, so overlap
  between streams is visible;
* a serving simulation's engine iterations: one process per engine, one slice per
  iteration or run of identical decode iterations (perfcast.serving.engines.Iteration).

Times are microseconds, as the format requires."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perfcast.plan.step import StepResult
from perfcast.plan import ScheduledTask, Timeline


def timeline_trace_events(timeline: Timeline, *, device_label: str = "") -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    tids: dict[tuple[int, str], int] = {}
    for lane in timeline.devices:
        label = f"{lane.name} ({lane.copies} x {device_label})" if device_label else lane.name
        events.append({"ph": "M", "name": "process_name", "pid": lane.stage, "tid": 0,
                       "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": lane.stage, "tid": 0,
                       "args": {"sort_index": lane.stage}})
        for tid, stream in enumerate(lane.streams):
            tids[(lane.stage, stream)] = tid
            events.append({"ph": "M", "name": "thread_name", "pid": lane.stage, "tid": tid,
                           "args": {"name": stream}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": lane.stage,
                           "tid": tid, "args": {"sort_index": tid}})
    multi = timeline.units > 1
    for st in timeline.tasks:
        t = st.costed.task
        args = _instance_args(st)
        if multi:
            args["microbatch"] = st.unit
        events.append({
            "ph": "X", "name": f"{st.lineage}@mb{st.unit}" if multi else st.lineage,
            "cat": t.operation, "pid": st.stage, "tid": tids[(st.stage, st.stream)],
            "ts": st.start_s * 1e6, "dur": (st.end_s - st.start_s) * 1e6, "args": args})
    return events


def _instance_args(st: ScheduledTask) -> dict[str, Any]:
    """What a slice shows when clicked: identity, provenance and the work it stands for."""
    t = st.costed.task
    est = st.costed.resolution.estimate
    return {"lineage": st.lineage, "costed_lineage": t.lineage, "operator": t.operator,
            "calls": st.calls, "method": est.method.value, "provider": est.provider,
            "bound": est.bottleneck, "confidence": est.confidence,
            "uncontended_us": st.uncontended_s * 1e6, "flops": t.work.flops * st.calls,
            "bytes": t.work.bytes_total * st.calls, **_evidence_args(st.costed.resolution)}


def chrome_trace_events(result: StepResult) -> list[dict[str, Any]]:
    if result.timeline is None:
        raise ValueError("the step result has no timeline; estimate it with "
                         "perfcast.plan.step.estimate_step")
    return timeline_trace_events(result.timeline, device_label=result.system.name)


def _evidence_args(resolution) -> dict[str, Any]:
    """Provider statistics (profiling: source, confidence, kernel_type, shape_match_rule,
    kernel_shapes, ...) and, after a fallback, why the earlier providers missed."""
    est = resolution.estimate
    args: dict[str, Any] = dict(est.statistics)
    missed = [a for a in resolution.attempts if a.outcome.value == "miss"]
    if missed:
        args["miss_reason"] = "; ".join(f"{a.provider}: {a.reason}" for a in missed)
        if est.method.value == "analytical":
            args.setdefault("shape_match_rule", "analytic")
            args.setdefault("source", "analytic")
    return args


def write_chrome_trace(result: StepResult, path: str | Path) -> None:
    tl = result.timeline
    doc = {"traceEvents": chrome_trace_events(result), "displayTimeUnit": "ns",
           "otherData": {"model": result.graph.model.name, "device": result.system.name,
                         "task_graph_digest": result.graph.digest,
                         "makespan_s": tl.makespan_s, "sum_of_tasks_s": tl.sum_of_tasks_s,
                         "overlap": tl.options.overlap, "pp_schedule": tl.options.pp_schedule,
                         "num_microbatches": tl.options.num_microbatches,
                         "full_timeline": tl.options.full_timeline}}
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    tmp.replace(p)


def iteration_trace_events(engines) -> list[dict[str, Any]]:
    """Engine iteration records (engines built with `record_trace=True`) as slices named
    prefill | mixed | decode, with the batch and the busy-time split as arguments."""
    events: list[dict[str, Any]] = []
    for pid, engine in enumerate(engines):
        events.append({"ph": "M", "name": "process_name", "pid": pid,
                       "args": {"name": engine.name}})
        for it in engine.stats.trace or []:
            events.append({"ph": "X", "pid": pid, "tid": 0, "name": it.kind,
                           "ts": it.start_s * 1e6, "dur": it.duration_s * 1e6,
                           "args": {"iterations": it.steps,
                                    "decode_requests": it.decode_requests,
                                    "prefill_chunks": list(it.prefill_chunks),
                                    "compute_us": it.compute_s * 1e6,
                                    "communication_us": it.communication_s * 1e6,
                                    "launch_us": it.launch_s * 1e6,
                                    "host_us": it.host_s * 1e6}})
    return events


def write_iteration_trace(engines, path: str | Path) -> None:
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps({"traceEvents": iteration_trace_events(engines)}),
                   encoding="utf-8")
    tmp.replace(p)
