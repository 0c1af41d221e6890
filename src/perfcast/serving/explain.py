"""Where a request's time goes (`perfcast serve --explain`).

Engines record, per request, a few times and sums while they run (no per-token work:
a request's decode time is read off a per-engine clock of decode-iteration time, as
its token count is read off the iteration counter). From them every finished request's
TTFT and end-to-end latency split exactly into phases:

* frontend: fixed front-end time before the engine sees the request;
* frontend_queue: waiting for the front-end's turn (serialised front-end work);
* queue: in the engine before the first iteration that computed one of its chunks;
* prefill: iterations that computed its prompt chunks (a chunk's whole iteration);
* prefill_waits: between its first chunk and its first token, iterations without it;
* kv_transfer: prefill -> decode worker KV move (disaggregated serving);
* handoff: the rest of the prefill -> decode handoff (disaggregated serving: the
  front-end's second dispatch, the transfer's setup and completion notice; the fitted
  `disagg_handoff` of the calibration revision);
* decode_queue: the cache has arrived, the decode worker has no free running slot yet
  (disaggregated serving: the client's tokens stream from the decode worker, so its
  first token waits for that slot);
* first_chunk: engine's first token -> the client's first streamed chunk (TTFT only;
  the decode phases overlap it);
* decode: iterations in which it emitted a token after the first;
* decode_waits: after the first token, time outside its decode iterations (others'
  prefill batches in prefill-first engines, preemption).

TTFT = frontend + frontend_queue + queue + prefill + prefill_waits + kv_transfer +
handoff + decode_queue + first_chunk; e2e = the same without first_chunk, plus decode +
decode_waits.

Busy time of the engines splits into compute kernels, communication (collective
tasks), kernel launch gaps and exposed host time (perfcast.serving.step_cost).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from perfcast.serving.metrics import summary_ms

TTFT_PHASES = ("frontend", "frontend_queue", "queue", "prefill", "prefill_waits",
               "kv_transfer", "handoff", "decode_queue", "first_chunk")
E2E_PHASES = ("frontend", "frontend_queue", "queue", "prefill", "prefill_waits",
              "kv_transfer", "handoff", "decode_queue", "decode", "decode_waits")
PHASES = (*TTFT_PHASES, "decode", "decode_waits")
SPLIT = ("compute", "communication", "launch", "host")


class RequestPhases:
    """Times one request's engines recorded (seconds)."""

    __slots__ = ("seen_s", "first_chunk_start_s", "prefill_s", "prefill_end_s",
                 "kv_arrival_s", "handoff_end_s", "decode_join", "decode_s", "engine_first_s")

    def __init__(self) -> None:
        self.seen_s = 0.0                  # the (front) engine received it
        self.first_chunk_start_s: float | None = None
        self.prefill_s = 0.0
        self.prefill_end_s: float | None = None   # its first token was computed
        self.kv_arrival_s: float | None = None    # its cache reached the decode worker
        self.handoff_end_s: float | None = None   # the decode worker may take it in
        self.decode_join = 0.0
        self.decode_s = 0.0
        self.engine_first_s: float | None = None  # first token where it decodes


def request_phases(r, ph: RequestPhases) -> dict[str, float]:
    """Phase durations (s) of one finished request; they add up to its TTFT and e2e."""
    prefill_end = ph.prefill_end_s
    start = ph.first_chunk_start_s if ph.first_chunk_start_s is not None else prefill_end
    base = ph.engine_first_s
    return {
        "frontend": ph.seen_s - r.arrival_s - r.frontend_wait_s,
        "frontend_queue": r.frontend_wait_s,
        "queue": start - ph.seen_s,
        "prefill": ph.prefill_s,
        "prefill_waits": prefill_end - start - ph.prefill_s,
        "kv_transfer": ph.kv_arrival_s - prefill_end,
        "handoff": ph.handoff_end_s - ph.kv_arrival_s,
        "decode_queue": base - ph.handoff_end_s,
        "first_chunk": r.first_token_s - base,
        "decode": ph.decode_s,
        "decode_waits": r.finish_s - base - ph.decode_s,
    }


def explain_json(finished: Sequence, phases: dict[int, RequestPhases], engines) -> dict:
    """The `explain` object of `perfcast serve --format json --explain`."""
    done = [r for r in finished if r.measured and r.rid in phases]
    rows = [request_phases(r, phases[r.rid]) for r in done]
    ttft = np.array([r.first_token_s - r.arrival_s for r in done], dtype=float)
    e2e = np.array([r.finish_s - r.arrival_s for r in done], dtype=float)
    ttft_total, e2e_total = float(ttft.sum()), float(e2e.sum())
    out_phases = {}
    for name in PHASES:
        values = np.array([row[name] for row in rows], dtype=float)
        stats = summary_ms(values)
        total = float(values.sum())
        stats["share_of_ttft"] = (total / ttft_total if ttft_total else 0.0) \
            if name in TTFT_PHASES else None
        stats["share_of_e2e"] = (total / e2e_total if e2e_total else 0.0) \
            if name in E2E_PHASES else None
        out_phases[name] = stats
    return {"requests": len(done), "phases": out_phases,
            "ttft_ms": summary_ms(ttft), "e2e_ms": summary_ms(e2e),
            "iterations": iteration_split(engines)}


def iteration_split(engines) -> dict:
    """Busy time of the engines by role: compute, communication, launch, host (ms and
    shares of busy time)."""
    by_role: dict[str, list[float]] = {}
    for e in engines:
        acc = by_role.setdefault(str(e.role), [0.0] * 5)
        acc[0] += e.stats.busy_s
        for i, v in enumerate(e.stats.split_s):
            acc[i + 1] += v
    out = {}
    for role, (busy, *parts) in by_role.items():
        entry = {"busy_ms": busy * 1e3}
        for name, v in zip(SPLIT, parts):
            entry[f"{name}_ms"] = v * 1e3
            entry[f"{name}_share"] = v / busy if busy else 0.0
        out[role] = entry
    return out


def explain_lines(doc: dict) -> list[tuple[str, ...]]:
    """Rows (phase, mean, p50, p90, p99, % of TTFT, % of e2e) for a table."""
    def pct(v):
        return "-" if v is None else f"{0.0 if abs(v) < 5e-4 else 100 * v:.1f}%"

    def ms(v):   # remainders of float sums: -1e-17 reads as 0.00, not -0.00
        return "-" if v is None else f"{0.0 if abs(v) < 5e-3 else v:.2f}"

    rows = []
    for name, s in doc["phases"].items():
        rows.append((name, *(ms(s[k]) for k in ("mean", "p50", "p90", "p99")),
                     pct(s["share_of_ttft"]), pct(s["share_of_e2e"])))
    return rows
