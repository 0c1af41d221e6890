"""Discrete-event serving simulation: clients, a router and one or more engines.

Aggregated mode: every request runs on one engine (replicas share the clients by a
least-outstanding-requests router). Disaggregated mode: a prefill pool computes the
prompt and the first token, the KV cache moves to a decode worker over the
interconnect (`transfer_s(request)`), and the decode pool generates the rest; the
client sees the first token when the KV cache has arrived at the decode worker.

Engines advance under conservative synchronisation: the engine with the earliest next
event runs one macro step bounded by the other engines' clocks, so no request can
arrive at an engine in the past of a decision it already took.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perfcast.serving.engine import Engine, Event, EventKind
from perfcast.serving.explain import RequestPhases
from perfcast.serving.metrics import ServingMetrics, compute_metrics
from perfcast.serving.requests import Client, Request


@dataclass
class SimulationResult:
    metrics: ServingMetrics
    finished: list[Request]
    rejected: list[Request]
    engines: list[Engine]
    # per-request phase records (engines built with explain=True), by request id
    phases: dict[int, RequestPhases] | None = None


class _Router:
    def __init__(self, engines: Sequence[Engine]) -> None:
        self.engines = list(engines)
        self.outstanding = {id(e): 0 for e in self.engines}
        self.turn = 0

    def pick(self) -> Engine:
        n = len(self.engines)
        best = None
        for i in range(n):
            e = self.engines[(self.turn + i) % n]
            if best is None or self.outstanding[id(e)] < self.outstanding[id(best)]:
                best = e
        self.turn = (self.turn + 1) % n
        self.outstanding[id(best)] += 1
        return best

    def done(self, engine: Engine) -> None:
        self.outstanding[id(engine)] -= 1


def simulate(client: Client, engines: Sequence[Engine], *, num_gpus: int,
             decode_engines: Sequence[Engine] = (),
             transfer_s: Callable[[Request], float] | None = None,
             kv_transfer: Callable[[Request, Engine, Engine, float], float] | None = None,
             frontend_s: float = 0.0, first_chunk_s: float = 0.0,
             frontend_service_s: float = 0.0, handoff_s: float = 0.0,
             max_iterations: int = 50_000_000, itl_summary: bool = True) -> SimulationResult:
    """Run `client` against `engines` (agg), or against prefill `engines` feeding
    `decode_engines` (disagg) until every request has finished or been rejected.
    `kv_transfer(request, prefill engine, decode engine, prefill end)`: seconds until
    the cache arrives (shared links); else `transfer_s(request)`.
    `frontend_s`: server time before the engine sees a request (HTTP, tokenisation).
    `first_chunk_s`: time from the engine's first token to the client's first streamed
    chunk; it delays only what the client sees first (TTFT grows by it, e2e does not,
    so TPOT = (e2e - TTFT) / (output - 1) shrinks), never the engine's schedule.
    `frontend_service_s`: server work per request done one request at a time (one
    event loop per front engine: chat template, tokenisation, submission), in arrival
    order; the engine sees a request at max(arrival + frontend_s, end of its turn). At
    low load only its excess over `frontend_s` shows; bursts of arrivals and request
    rates near 1 / frontend_service_s queue there, in TTFT, with fewer requests in the
    engine. `handoff_s` (disagg): from the prefill worker's end of a request to the decode
    worker taking it in, beyond the cache's transfer (the front-end's second dispatch,
    the transfer's setup and completion notice); it delays the decode worker's schedule
    and so TTFT and e2e alike. `itl_summary=False`: the metrics' `itl_ms` is left empty (see
    `metrics.compute_metrics`)."""
    disagg = bool(decode_engines)
    front = _Router(engines)
    back = _Router(decode_engines) if disagg else None
    owner: dict[int, Engine] = {}
    everything = [*engines, *decode_engines]
    finished: list[Request] = []
    rejected: list[Request] = []
    frontend_free_s = {e.replica: 0.0 for e in engines}   # one server process per replica
    phases = None
    if any(e.phases is not None for e in everything):
        phases = {}
        for e in everything:   # one record per request across prefill and decode engines
            e.phases = phases

    def issue(reqs: list[Request]) -> None:
        for r in reqs:
            e = front.pick()
            owner[r.rid] = e
            seen_s = r.arrival_s + frontend_s
            if frontend_service_s > 0.0:
                turn_end = max(r.arrival_s, frontend_free_s[e.replica]) + frontend_service_s
                frontend_free_s[e.replica] = turn_end
                r.frontend_wait_s = max(0.0, turn_end - seen_s)
                seen_s = max(seen_s, turn_end)
            ev = e.submit(r, seen_s)
            changed.append(e)
            if ev is not None:
                handle(ev, e)

    def handle(ev: Event, engine: Engine) -> None:
        r = ev.request
        if ev.kind is EventKind.PREFILLED:
            front.done(engine)
            d = back.pick()
            if kv_transfer is not None:
                xfer = kv_transfer(r, engine, d, ev.time_s)
            else:
                xfer = transfer_s(r) if transfer_s else 0.0
            r.transfer_s = xfer
            arrive = ev.time_s + xfer + handoff_s
            if phases is not None:
                ph = phases[r.rid]
                ph.prefill_end_s, ph.kv_arrival_s = ev.time_s, ev.time_s + xfer
                ph.handoff_end_s = arrive
            # the client's tokens stream from the decode worker: the first one when that
            # worker takes the request in (Engine.join_decode), after the cache arrived
            # and a running slot was free
            r.first_token_s = None
            r.last_token_s = arrive
            owner[r.rid] = d
            rej = d.submit(r, arrive)
            changed.append(d)
            if rej is not None:
                handle(rej, d)
            return
        (back if (disagg and engine in decode_engines) else front).done(engine)
        if ev.kind is EventKind.REJECTED:
            rejected.append(r)
        else:
            if phases is not None and phases[r.rid].engine_first_s is None:
                ph = phases[r.rid]
                ph.prefill_end_s = ph.kv_arrival_s = ph.handoff_end_s = r.first_token_s
                ph.engine_first_s = r.first_token_s
            if first_chunk_s and r.output_tokens > 1 and r.first_token_s is not None:
                r.first_token_s = min(r.first_token_s + first_chunk_s, r.finish_s)
            finished.append(r)
        issue(client.on_finish(r, ev.time_s))

    # an engine's next_time changes only when it advances or receives a request: those
    # are recomputed, the others' are kept
    changed: list[Engine] = []
    position = {e: i for i, e in enumerate(everything)}
    issue(client.initial())
    inf = float("inf")
    count = len(everything)
    times = [e.next_time() for e in everything]
    changed.clear()
    for _ in range(max_iterations):
        if changed:
            for e in changed:
                times[position[e]] = e.next_time()
            changed.clear()
        if count == 1:   # nothing else bounds its step
            i, earliest, horizon = 0, times[0], inf
        elif count == 2:   # the first earliest engine; the other's time bounds its step
            a, b = times
            i, earliest, horizon = (1, b, a) if b < a else (0, a, b)
        else:
            earliest = min(times)
            i = times.index(earliest)
            others = times.copy()
            others[i] = inf   # the others' earliest
            horizon = min(others)
        if earliest == inf:
            break
        engine = everything[i]
        changed.append(engine)
        for ev in engine.advance(horizon):
            handle(ev, engine)
    else:  # pragma: no cover - safety net
        raise RuntimeError("simulation did not finish within max_iterations")
    metrics = compute_metrics(finished, rejected, everything, num_gpus, itl=itl_summary)
    return SimulationResult(metrics, finished, rejected, everything, phases)
