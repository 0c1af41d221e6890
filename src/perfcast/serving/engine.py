"""One serving engine (an agg replica, a prefill worker or a decode worker).

The engine runs iterations. Each iteration its policy (perfcast.serving.engines: one
module per engine family, see docs/serving.md) picks decode tokens and prefill chunks
under the token budget, the running-request limit and the KV capacity; the step cost
model prices it; then tokens are emitted at the end of the iteration. All decoding
requests advance together, so runs of decode-only iterations between two events (a
request finishing, an arrival, the KV cache filling up) are priced in one vectorised
call instead of step by step.

KV cache: capacity in tokens; each request's last block is counted whole
(`block_tokens - 1` slack). `reserve_full` admits a request only when its prompt and
all its output fit; `incremental` admits on the prompt and, when decode growth does
not fit, preempts the newest request (recompute: its prompt plus generated tokens are
prefilled again later). A request that cannot fit even alone is rejected with a
reason; nothing crashes and nothing is silently dropped.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from perfcast.serving.backends import Admission, KVCacheConfig, SchedulerConfig
from perfcast.serving.engines import POLICY_CLASSES
from perfcast.serving.engines.base import EnginePolicy, Event, EventKind, Iteration, Role
from perfcast.serving.explain import RequestPhases
from perfcast.serving.requests import Request
from perfcast.serving.step_cost import RUN_HEAD_MAX, StepCostModel, StepShape

__all__ = ["Engine", "EngineStats", "Event", "EventKind", "Iteration", "Role"]


@dataclass
class EngineStats:
    steps: int = 0
    busy_s: float = 0.0
    kv_peak_tokens: float = 0.0
    kv_token_seconds: float = 0.0
    preemptions: int = 0
    itl_values: list = field(default_factory=list)
    itl_weights: list = field(default_factory=list)
    trace: list[Iteration] | None = None
    # busy time split (recorded with explain or a trace): compute, communication,
    # kernel launch, host
    split_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])


INF = float("inf")


def run_sum(durations) -> float:
    """Seconds of a run of iterations: numpy's sum of an array; a short list
    (StepCostModel.decode_run_head) summed one after another, as numpy sums so few."""
    if type(durations) is not list:
        return float(durations.sum())
    total = 0.0
    for d in durations:
        total += d
    return total


class Engine:
    def __init__(self, name: str, cost: StepCostModel, scheduler: SchedulerConfig,
                 kv: KVCacheConfig, kv_capacity_tokens: int, *, role: Role | str = Role.AGG,
                 record_trace: bool = False, explain: bool = False, pipeline=None,
                 replica: object = None) -> None:
        """`pipeline`: the replica's shared pipeline stages (a PipelinedCost) when this
        engine is one of its virtual engines (pp > 1); `replica`: what identifies the
        server it belongs to (one front-end each), by default the engine itself."""
        try:
            self.role = Role(role)
        except ValueError:
            raise ValueError(f"unknown engine role {role!r}") from None
        self.name = name
        self.replica = self if replica is None else replica
        self.cost = cost
        self.pipeline = pipeline
        # speculative decoding (serving/speculative.py): tokens a decoding request emits
        # per iteration and KV slots reserved beyond its tokens (1 and 0 without it)
        self.tokens_per_step = float(getattr(cost, "tokens_per_decode_step", 1.0))
        self.lookahead = int(getattr(cost, "kv_lookahead_tokens", 0))
        self.sched = scheduler
        self.kv = kv
        self.capacity = int(kv_capacity_tokens)
        self.clock = 0.0
        self.max_running = scheduler.max_running_requests
        if scheduler.client_in_flight:
            self.max_running = min(self.max_running, scheduler.client_in_flight)
        if scheduler.mix_decode_and_prefill:
            self.max_running = min(self.max_running, scheduler.token_budget)
        self.incremental = kv.admission is Admission.INCREMENTAL
        self.pending: list = []          # heap (arrival_s, seq, request)
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.decoding: list = []         # heap (finish_counter, seq, request)
        self.running: dict[int, Request] = {}  # admission order, for preemption
        self.counter = 0                 # decode iterations so far
        self.n_decoding = 0
        self.n_measured_decoding = 0
        self.sum_ctx = 0.0               # sum of cached tokens of decoding requests
        self.kv_used = 0.0
        self.last_decode_end = 0.0
        self.newcomers: list[Request] = []
        self._seq = 0
        self.stats = EngineStats(trace=[] if record_trace else None)
        # per-request phase records (explain); shared by the engines of one simulation
        self.phases: dict[int, RequestPhases] | None = {} if explain else None
        self.decode_clock = 0.0          # summed duration of iterations that decoded
        self._split = record_trace or explain
        self.policy = POLICY_CLASSES[scheduler.policy](self)
        self._records = record_trace or self.policy.wants_iterations
        # the step model's short-run path (StepCostModel.decode_run_head), if it has one
        self._run_head = getattr(cost, "decode_run_head", None) if pipeline is None else None
        # need_tokens' constants
        self._prefill_role = self.role is Role.PREFILL
        self._reserve_whole = not self.incremental or self._prefill_role
        self._need_slack = kv.block_tokens - 1 + (0 if self._prefill_role else self.lookahead)
        # whether the policy caps decode runs (EnginePolicy.max_decode_steps: never)
        self._caps_runs = type(self.policy).max_decode_steps is not EnginePolicy.max_decode_steps

    # -- arrivals --------------------------------------------------------------------------
    def need_tokens(self, r: Request) -> int:
        """KV tokens reserved when `r` is admitted."""
        slack = self._need_slack
        if self._reserve_whole:   # not incremental, or a prefill worker
            extra = 0 if self._prefill_role else r.output_tokens - r.generated
            return r.prefill_target + extra + slack
        return r.prefill_target + slack

    def generated_of(self, r: Request) -> int:
        """Tokens `r` has generated so far (decoding requests advance lazily)."""
        if r.active and r.prefilled >= r.prefill_target:
            return r.generated + self._emitted(r, self.counter - r.join_counter)
        return r.generated

    def _grown(self, iterations):
        """KV tokens (per request) that `iterations` decode iterations add."""
        tps = self.tokens_per_step
        return iterations if tps == 1.0 else iterations * tps

    def _emitted(self, r: Request, iterations: int) -> int:
        """Tokens `r` has emitted in `iterations` decode iterations since it joined."""
        if self.tokens_per_step == 1.0:
            return iterations
        return min(r.output_tokens - r.generated, int(iterations * self.tokens_per_step + 1e-9))

    def submit(self, r: Request, time_s: float) -> Event | None:
        """Queue a request arriving at `time_s`; a request that can never run is rejected."""
        whole = r.prefill_target + (0 if self.role is Role.PREFILL
                                    else r.output_tokens + self.lookahead) \
            + self.kv.block_tokens - 1
        if whole > self.capacity:
            r.reject_reason = (f"needs {whole} KV tokens, engine {self.name} holds "
                               f"{self.capacity}")
            return Event(EventKind.REJECTED, r, time_s)
        if (not self.sched.chunked_prefill and self.role is not Role.DECODE
                and r.prefill_target > self.sched.token_budget):
            r.reject_reason = (f"prompt of {r.prefill_target} tokens exceeds the token budget "
                               f"{self.sched.token_budget} without chunked prefill")
            return Event(EventKind.REJECTED, r, time_s)
        if self.phases is not None and self.role is not Role.DECODE:
            ph = self.phases[r.rid] = RequestPhases()
            ph.seen_s = time_s
        self._seq += 1
        heapq.heappush(self.pending, (time_s, self._seq, r))
        return None

    def next_time(self) -> float:
        if self.waiting or self.prefilling or self.n_decoding:
            return self.clock
        if self.pending:
            return max(self.clock, self.pending[0][0])
        return float("inf")

    def _take_arrivals(self) -> None:
        while self.pending and self.pending[0][0] <= self.clock:
            self.waiting.append(heapq.heappop(self.pending)[2])

    # -- KV accounting -----------------------------------------------------------------------
    def admit(self, r: Request) -> None:
        r.kv_base = self.need_tokens(r)
        self.kv_used += r.kv_base
        self.running[r.rid] = r
        r.active = True

    def _release(self, r: Request, growth: int = 0) -> None:
        """Free a request's KV: its admission reservation plus, under incremental
        admission, the `growth` tokens its decode iterations added."""
        alloc = r.kv_base + (growth if self.incremental else 0)
        self.kv_used -= alloc
        self.running.pop(r.rid, None)
        r.active = False

    def join_decode(self, r: Request) -> None:
        r.join_counter = self.counter
        self._seq += 1
        r.seq = self._seq
        left = r.output_tokens - r.generated
        if self.tokens_per_step != 1.0:  # iterations to emit `left` tokens
            left = math.ceil(left / self.tokens_per_step - 1e-9)
        heapq.heappush(self.decoding, (self.counter + left, self._seq, r))
        self.n_decoding += 1
        self.n_measured_decoding += r.measured
        self.sum_ctx += r.prefill_target
        self.newcomers.append(r)
        if r.first_token_s is None:   # a decode worker's arrival: its first streamed token
            r.first_token_s = r.last_token_s = self.clock
            if self.phases is not None:
                self.phases[r.rid].engine_first_s = self.clock
        if self.phases is not None:
            self.phases[r.rid].decode_join = self.decode_clock

    def _leave_decode(self, r: Request) -> None:
        self.n_decoding -= 1
        self.n_measured_decoding -= r.measured
        self.sum_ctx -= r.prefill_target + self._grown(self.counter - r.join_counter)
        if self.phases is not None:
            ph = self.phases[r.rid]
            ph.decode_s += self.decode_clock - ph.decode_join

    # -- scheduling ----------------------------------------------------------------------------
    def _preempt_for_growth(self) -> None:
        """Incremental KV: make room for one more token per decoding request by sending
        the newest running requests back to the queue (recompute)."""
        preempted = False
        while self.n_decoding and self.kv_used + self._grown(self.n_decoding) > self.capacity:
            victim = next(reversed(self.running.values()))
            growth = emitted = 0
            if victim.prefilled >= victim.prefill_target and victim.generated > 0:
                iterations = self.counter - victim.join_counter
                growth = self._grown(iterations)
                emitted = self._emitted(victim, iterations)
                self._leave_decode(victim)
                self.decoding = [e for e in self.decoding if e[2] is not victim]
                heapq.heapify(self.decoding)
                self.newcomers = [r for r in self.newcomers if r is not victim]
            else:
                self.prefilling.remove(victim)
            self._release(victim, growth)
            victim.generated += emitted
            victim.prefill_target = victim.input_tokens + victim.generated
            victim.prefilled = 0
            victim.preemptions += 1
            self.stats.preemptions += 1
            self.waiting.appendleft(victim)
            preempted = True
        if preempted:
            self.policy.on_preempt()

    # -- one macro step ---------------------------------------------------------------------------
    def advance(self, horizon_s: float = float("inf")) -> list[Event]:
        """Run one iteration, or a run of identical decode-only iterations that all start
        before `horizon_s` and before the next arrival. Returns the events it caused."""
        if not (self.waiting or self.prefilling or self.n_decoding):
            if not self.pending:
                return []
            self.policy.on_idle()
            self.clock = max(self.clock, self.pending[0][0])
        pending = self.pending
        if pending and pending[0][0] <= self.clock:
            self._take_arrivals()
        events: list[Event] = []
        n = self.n_decoding
        if self.incremental and n and self.kv_used + (
                n if self.tokens_per_step == 1.0 else n * self.tokens_per_step) > self.capacity:
            self._preempt_for_growth()
        chunks, decode = self.policy.plan()
        if not chunks and not decode:
            if not self.running and self.waiting:
                # nothing holds resources, yet the head cannot start: it never will
                r = self.waiting.popleft()
                r.reject_reason = f"cannot be scheduled on engine {self.name} even when idle"
                return events + [Event(EventKind.REJECTED, r, self.clock)]
            if self.pending:
                self.clock = max(self.clock, self.pending[0][0])
            return events
        if chunks:
            return self._mixed_step(chunks, decode)
        return self._decode_run(horizon_s)

    def _mixed_step(self, chunks: list[tuple[Request, int]], decode: bool) -> list[Event]:
        n = self.n_decoding if decode else 0
        shape = StepShape(n, self.sum_ctx / n if n else 0.0,
                          tuple((q, r.prefilled) for r, q in chunks))
        start = self.clock
        if self.pipeline is None:
            dt = self.cost.step_s(shape)
            end = start + dt
        else:
            end = self.pipeline.step_end(start, shape)
            dt = end - start
        self._account(start, dt, shape)
        events: list[Event] = []
        if decode:
            events += self._decode_tokens(end, steps=1, durations=None, total=dt)
        phases = self.phases
        for r, q in chunks:
            if phases is not None and r.first_token_s is None:
                ph = phases[r.rid]
                if ph.first_chunk_start_s is None:
                    ph.first_chunk_start_s = start
                ph.prefill_s += dt
            r.prefilled += q
            if r.prefilled < r.prefill_target:
                continue
            self.prefilling.remove(r)
            r.generated += 1
            r.last_token_s = end
            if r.first_token_s is None:
                r.first_token_s = end
            if self.role is Role.PREFILL:
                self._release(r)
                events.append(Event(EventKind.PREFILLED, r, end))
            elif r.generated >= r.output_tokens:
                self._release(r)
                r.finish_s = end
                events.append(Event(EventKind.FINISHED, r, end))
            else:
                self.join_decode(r)
        self.clock = end
        return events

    def _decode_run(self, horizon_s: float) -> list[Event]:
        n = self.n_decoding
        k = self.decoding[0][0] - self.counter
        if self.incremental:   # min(k, ... // self._grown(n)), inline
            tps = self.tokens_per_step
            room = int((self.capacity - self.kv_used) // (n if tps == 1.0 else n * tps))
            if room < k:
                k = room
        if self._caps_runs:
            cap = self.policy.max_decode_steps()
            if cap is not None:
                k = min(k, cap)
        if k < 1:
            k = 1
        pipe = self.pipeline
        limit = horizon_s
        if self.pending:
            limit = min(limit, self.pending[0][0])
        head = None
        context = self.sum_ctx / n
        if self._run_head is not None and (limit < INF or k <= RUN_HEAD_MAX):
            head = self._run_head(n, context, k, self.clock, limit)
        if head is not None:   # a short run (or one cut short), in plain floats (same values)
            durations, k = head, len(head)
        elif pipe is not None:   # iterations on the shared stages, reserved one by one
            durations = pipe.decode_run(self.clock, n, context, k, limit)
            k = len(durations)
        else:
            durations = self.cost.decode_run_s(n, context, k)
            if limit < INF and k > 1:
                starts = self.clock + np.concatenate(([0.0], np.cumsum(durations[:-1])))
                k = max(1, int(np.searchsorted(starts, limit, side="left")))
                durations = durations[:k]
        start = self.clock
        if type(durations) is list:   # run_sum, inline
            total = 0.0
            for d in durations:
                total += d
        else:
            total = float(durations.sum())
        # the shape only matters to a time split or an iteration record
        shape = StepShape(n, context) if self._split or self._records else None
        growth = n * (k - 1) / 2   # self._grown of it, inline
        tps = self.tokens_per_step
        if tps != 1.0:
            growth = growth * tps
        self._account(start, total, shape, k, growth)
        end = start + total
        events = self._decode_tokens(end, k, durations, total)
        self.clock = end
        return events

    def _decode_tokens(self, end: float, steps: int, durations, total: float) -> list[Event]:
        """Every decoding request emits `steps` tokens; the last ends at `end`.
        `durations`: None (one step), a numpy array or a short list (decode_run_head)."""
        n = self.n_decoding
        if durations is None or len(durations) == 1:
            first_end = end
        elif type(durations) is list:   # end - run_sum(durations[1:]), inline
            rest = 0.0
            for d in durations[1:]:
                rest += d
            first_end = end - rest
        else:
            first_end = end - float(durations[1:].sum())
        # ITL samples: newcomers measured from their last token, the rest from the
        # previous decode iteration, then `steps - 1` more iterations for everyone
        st = self.stats
        measured_new = 0
        if self.newcomers:
            for r in self.newcomers:
                if r.measured:
                    measured_new += 1
                    st.itl_values.append(first_end - r.last_token_s)
                    st.itl_weights.append(1.0)
            self.newcomers = []
        measured_old = self.n_measured_decoding - measured_new
        if measured_old > 0:
            st.itl_values.append(first_end - self.last_decode_end)
            st.itl_weights.append(float(measured_old))
        if durations is not None and steps > 1 and self.n_measured_decoding:
            st.itl_values.extend(durations[1:] if type(durations) is list
                                 else durations[1:].tolist())
            st.itl_weights.extend([float(self.n_measured_decoding)] * (steps - 1))
        self.counter += steps
        tps = self.tokens_per_step   # self._grown(n * steps), inline
        grown = n * steps if tps == 1.0 else n * steps * tps
        self.sum_ctx += grown
        self.decode_clock += total
        if self.incremental:
            self.kv_used += grown
        self.last_decode_end = end
        events: list[Event] = []
        decoding, counter = self.decoding, self.counter
        while decoding and decoding[0][0] <= counter:
            _, _, r = heapq.heappop(decoding)
            r.generated = r.output_tokens
            r.last_token_s = end
            self._leave_decode(r)
            iterations = counter - r.join_counter   # self._grown of it, inline
            self._release(r, iterations if tps == 1.0 else iterations * tps)
            r.finish_s = end
            events.append(Event(EventKind.FINISHED, r, end))
        return events

    def _account(self, start: float, dt: float, shape: StepShape | None, steps: int = 1,
                 kv_growth: float = 0.0) -> None:
        """Statistics of an iteration (or decode run); `shape` is needed only with a time
        split or iteration records (`_split`, `_records`)."""
        st = self.stats
        st.steps += steps
        st.busy_s += dt
        used = self.kv_used + kv_growth
        st.kv_token_seconds += used * dt
        peak = self.kv_used + (2 * kv_growth)
        if peak > st.kv_peak_tokens:   # max(), without the call
            st.kv_peak_tokens = peak
        split = (0.0, 0.0, 0.0, 0.0)
        if self._split:
            fn = getattr(self.cost, "iteration_split", None)
            split = fn(shape, dt, steps) if fn is not None else (dt, 0.0, 0.0, 0.0)
            acc = st.split_s
            for i in range(4):
                acc[i] += split[i]
        if not self._records:
            return
        record = Iteration(start, dt, steps, shape.decode_requests,
                           tuple(q for q, _ in shape.prefill), *split)
        if st.trace is not None:
            st.trace.append(record)
        self.policy.on_iteration(record)
