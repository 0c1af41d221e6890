"""Chrome Trace Event JSON (opens in Perfetto and chrome://tracing).

Without a plan-level schedule, tasks are laid out back to back in dependency order on
one process per pipeline stage, with one thread per stream (compute, comm)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perfcast.estimate import StepResult
from perfcast.workload.tensors import TaskKind


def chrome_trace_events(result: StepResult, *, expand_layers: bool = True) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    stages = sorted({ct.task.stage for ct in result.costed.tasks})
    for s in stages:
        events.append({"ph": "M", "name": "process_name", "pid": s, "tid": 0,
                       "args": {"name": f"stage {s} ({result.system.name})"}})
        for tid, stream in ((0, "compute"), (1, "comm")):
            events.append({"ph": "M", "name": "thread_name", "pid": s, "tid": tid,
                           "args": {"name": stream}})
    # Expand repeated layer blocks in order: all tasks of a block for layer l, then l+1.
    blocks: list[list] = []
    for ct in result.costed.tasks:
        key = (ct.task.stage, ct.task.layers)
        if blocks and blocks[-1][0] == key:
            blocks[-1][1].append(ct)
        else:
            blocks.append([key, [ct]])
    ts_us = 0.0
    for (stage, layers), cts in blocks:
        reps = range(layers[0], layers[1] + 1) if (layers and expand_layers) else [None]
        for layer in reps:
            for ct in cts:
                t = ct.task
                est = ct.resolution.estimate
                calls = 1 if layer is not None else t.count
                dur = est.latency_s * (t.count // max(len(reps), 1) if layer is not None else calls)
                name = t.lineage if layer is None else f"L{layer}.{t.group}"
                events.append({
                    "ph": "X", "name": name, "cat": t.operation, "pid": stage,
                    "tid": 1 if t.kind is TaskKind.COMMUNICATION else 0,
                    "ts": round(ts_us, 3), "dur": round(dur * 1e6, 3),
                    "args": {"operator": t.operator, "method": est.method.value,
                             "provider": est.provider, "bound": est.bottleneck,
                             "confidence": est.confidence, "flops": t.work.flops,
                             "bytes": t.work.bytes_total, **_evidence_args(ct.resolution)}})
                ts_us += dur * 1e6
    return events


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
    doc = {"traceEvents": chrome_trace_events(result), "displayTimeUnit": "ns",
           "otherData": {"model": result.graph.model.name, "device": result.system.name,
                         "task_graph_digest": result.graph.digest}}
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    tmp.replace(p)
