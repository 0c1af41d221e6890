"""Chrome trace of engine iterations (one row per engine, one slice per iteration or
run of identical decode iterations)."""

from __future__ import annotations

import json
from pathlib import Path


def iteration_events(engines) -> list[dict]:
    events: list[dict] = []
    for pid, engine in enumerate(engines):
        events.append({"ph": "M", "name": "process_name", "pid": pid,
                       "args": {"name": engine.name}})
        for start, dt, steps, decode, chunks in engine.stats.trace or []:
            kind = "decode" if not chunks else ("mixed" if decode else "prefill")
            events.append({"ph": "X", "pid": pid, "tid": 0, "name": kind,
                           "ts": start * 1e6, "dur": dt * 1e6,
                           "args": {"iterations": steps, "decode_requests": decode,
                                    "prefill_chunks": list(chunks)}})
    return events


def write_iteration_trace(engines, path: Path) -> None:
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps({"traceEvents": iteration_events(engines)}), encoding="utf-8")
    tmp.replace(path)
