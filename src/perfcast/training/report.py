"""The JSON document, table and Chrome trace of `perfcast train`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from perfcast.report.step import ops_json
from perfcast.training.estimate import BREAKDOWN_KEYS, FLOP_CONVENTION, TrainingResult

PASS_NAMES = {"forward": "forward", "backward": "backward", "backward_dp": "backward+dp"}


def _ops(result: TrainingResult) -> list[dict[str, Any]]:
    """Every op of every distinct chunk pass, as `estimate --format json` lists them, with
    the chunk pass it belongs to, the chunks that run it and its calls per step."""
    seen: dict[int, list[int]] = {}
    for c, cc in zip(result.chunks, result.costs):
        seen.setdefault(id(cc), []).append(c.chunk)
    m = result.microbatches
    every = result.request.layout.zero_stage >= 2
    out = []
    done = set()
    for cc in result.costs:
        if id(cc) in done:
            continue
        done.add(id(cc))
        chunk_ids = seen[id(cc)]
        passes = (("forward", cc.forward, m), ("backward", cc.backward, 0 if every else m - 1),
                  ("backward_dp", cc.backward_dp, m if every else 1))
        for name, costed, runs in passes:
            if runs == 0:
                continue
            for op in ops_json(costed, result.system.name):
                op["pass"] = PASS_NAMES[name]
                op["chunks"] = chunk_ids
                op["runs_per_step"] = runs
                out.append(op)
    for costed in result.optimizer_costed:
        for op in ops_json(costed, result.system.name):
            op["pass"] = "optimizer"
            op["runs_per_step"] = 1
            out.append(op)
    return out


def training_json(result: TrainingResult, *, include_ops: bool = True) -> dict[str, Any]:
    r = result.request
    lay = r.layout
    sched = result.schedule
    doc: dict[str, Any] = {
        "model": result.model.name,
        "device": result.system.name,
        "num_devices": lay.num_devices,
        "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "ep": lay.ep,
                   "virtual_pipeline": lay.virtual_pipeline,
                   "sequence_parallel": lay.sequence_parallel, "recompute": lay.recompute,
                   "zero_stage": lay.zero_stage},
        "global_batch_size": r.global_batch_size, "micro_batch_size": r.micro_batch_size,
        "seq_length": r.seq_length, "dtype": r.dtype, "microbatches": result.microbatches,
        "step_time_s": result.step_time_s,
        "tokens_per_s": result.tokens_per_s,
        "mfu": result.mfu,
        "hfu": result.hfu,
        "model_flops": result.model_flops,
        "hardware_flops": result.hardware_flops,
        "peak_flops_per_device": result.peak_flops_per_device,
        "flop_convention": FLOP_CONVENTION,
        "memory_bytes": result.memory_bytes,
        "memory_rank": result.memory.rank,
        "fits": result.fits,
        "breakdown_s": {k: result.breakdown_s[k] for k in BREAKDOWN_KEYS},
        "critical_path": _compact_path(result),
        "pipeline": {"schedule": "interleaved-1f1b" if lay.virtual_pipeline > 1 else "1f1b",
                     "microbatches": result.microbatches, "instances": len(sched.labels),
                     "scheduled_microbatches": sched.scheduled_microbatches
                     or result.microbatches,
                     "bubble_s": {f"rank{d}": sched.bubble_s(d) for d in range(lay.pp)}},
        "resolver": result.costs[0].forward.resolver_identity,
    }
    if not result.fits:
        doc["memory_error"] = result.memory.does_not_fit()
    if include_ops:
        doc["ops"] = _ops(result)
    return doc


def _compact_path(result: TrainingResult, limit: int = 64) -> list[str]:
    """The critical path of the pipeline schedule (passes, transfers, DP, optimizer);
    long paths keep their first and last `limit / 2` entries."""
    path = result.schedule.critical_path_labels()
    if len(path) <= limit:
        return path
    half = limit // 2
    return path[:half] + [f"... {len(path) - limit} more ..."] + path[-half:]


def write_training_trace(result: TrainingResult, path: str | Path) -> None:
    """Chrome Trace Event JSON: one process per pipeline rank, one thread per stream
    (compute, p2p, comm.dp), one slice per pass, transfer, DP tail and optimizer step."""
    sched = result.schedule
    events: list[dict[str, Any]] = []
    tids: dict[tuple[int, str], int] = {}
    for d in range(sched.pp):
        events.append({"ph": "M", "name": "process_name", "pid": d, "tid": 0,
                       "args": {"name": f"pipeline rank {d} ({result.request.layout.tp} x "
                                        f"{result.system.name} per replica)"}})
    for i, label in enumerate(sched.labels):
        key = (sched.rank[i], sched.stream[i])
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == key[0]])
            events.append({"ph": "M", "name": "thread_name", "pid": key[0], "tid": tids[key],
                           "args": {"name": key[1]}})
        start, end = sched.schedule.start_s[i], sched.schedule.end_s[i]
        events.append({"ph": "X", "name": label, "cat": sched.kind[i], "pid": key[0],
                       "tid": tids[key], "ts": start * 1e6, "dur": (end - start) * 1e6})
    doc = {"traceEvents": events, "displayTimeUnit": "ns",
           "otherData": {"model": result.model.name, "device": result.system.name,
                         "step_time_s": result.step_time_s}}
    Path(path).write_text(json.dumps(doc), encoding="utf-8")


def print_training(result: TrainingResult, console) -> None:
    from rich.table import Table

    r = result.request
    lay = r.layout
    virtual = f" (V{lay.virtual_pipeline})" if lay.virtual_pipeline > 1 else ""
    sp = "on" if lay.sequence_parallel else "off"
    console.print(f"[bold]{result.model.name}[/] on {lay.num_devices} x {result.system.name}: "
                  f"TP{lay.tp} PP{lay.pp}{virtual} "
                  f"DP{lay.dp} CP{lay.cp} EP{lay.ep}, SP {sp}, "
                  f"recompute {lay.recompute}, ZeRO-{lay.zero_stage}, {r.dtype}; "
                  f"{r.global_batch_size} x {r.seq_length} tokens, {result.microbatches} "
                  f"microbatches of {r.micro_batch_size}")
    console.print(f"step {result.step_time_s:.4f} s   {result.tokens_per_s:,.0f} tokens/s   "
                  f"MFU {result.mfu:.1%}   HFU {result.hfu:.1%}")
    t = Table(title="step breakdown (rank that finishes last)")
    t.add_column("part")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for k in BREAKDOWN_KEYS:
        v = result.breakdown_s[k]
        t.add_row(k, f"{v:.4f}", f"{v / result.step_time_s:.1%}")
    console.print(t)
    m = Table(title=f"memory per device (pipeline rank {result.memory.rank}, most loaded)")
    m.add_column("part")
    m.add_column("GiB", justify="right")
    for k, v in result.memory_bytes.items():
        m.add_row(k, f"{v / 2**30:.2f}")
    console.print(m)
    if not result.fits:
        console.print(f"[red]{result.memory.does_not_fit()}[/]")
    console.print(f"FLOPs: {FLOP_CONVENTION}", style="dim")
