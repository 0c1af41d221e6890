"""The interface every engine policy implements, and the records an engine emits.

An engine (perfcast.serving.engine.Engine) owns the requests, the KV accounting, the
clock and the vectorised decode runs; its policy decides, each iteration:

* `can_admit(r)`: whether the waiting request at the head of the queue may start now;
* `plan()`: the next batch: prefill chunks and whether the decoding requests run;
* `on_iteration(record)`: account for a finished iteration (or run of decode
  iterations), e.g. SGLang's decaying new-token ratio;

plus `on_idle()` and `on_preempt()` for engines whose state follows those events.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from perfcast.serving.requests import Request

if TYPE_CHECKING:  # pragma: no cover
    from perfcast.serving.engine import Engine


class Role(StrEnum):
    AGG = "agg"
    PREFILL = "prefill"
    DECODE = "decode"


class EventKind(StrEnum):
    FINISHED = "finished"
    PREFILLED = "prefilled"    # prefill worker: first token computed, KV ready to move
    REJECTED = "rejected"


@dataclass(frozen=True)
class Event:
    kind: EventKind
    request: Request
    time_s: float


@dataclass(frozen=True)
class Iteration:
    """One engine iteration, or a run of `steps` identical decode-only iterations.

    `compute_s + communication_s + launch_s + host_s == duration_s`: kernel time of
    compute tasks, of collective tasks, the gaps kernel launches leave, and host time
    the GPU waited for (all of it without an overlap scheduler, the excess over the
    GPU time with one)."""

    start_s: float
    duration_s: float
    steps: int
    decode_requests: int
    prefill_chunks: tuple[int, ...]
    compute_s: float
    communication_s: float
    launch_s: float
    host_s: float

    @property
    def kind(self) -> str:
        if not self.prefill_chunks:
            return "decode"
        return "mixed" if self.decode_requests else "prefill"


Chunks = list[tuple[Request, int]]


class EnginePolicy:
    """Scheduling rules of one engine family (subclasses: one module per family)."""

    name = "base"
    wants_iterations = False   # whether on_iteration needs every Iteration record

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sched = engine.sched

    # -- the interface ---------------------------------------------------------------
    def can_admit(self, r: Request) -> bool:
        """Running-request limit and KV room for the request's admission reservation."""
        e = self.engine
        return len(e.running) < e.max_running and e.kv_used + e.need_tokens(r) <= e.capacity

    def plan(self) -> tuple[Chunks, bool]:
        """(prefill chunks, whether the decoding requests run) of the next iteration."""
        raise NotImplementedError

    def on_iteration(self, record: Iteration) -> None:
        """A finished iteration (or decode run) of this engine."""

    def on_idle(self) -> None:
        """The engine found nothing to run."""

    def on_preempt(self) -> None:
        """The engine sent running requests back to the queue (KV ran out)."""

    def max_decode_steps(self) -> int | None:
        """At most this many decode iterations before the next `plan()` (None: up to the
        next event), for policies that count iterations."""
        return None

    # -- shared helpers --------------------------------------------------------------
    def chunk_size(self, need: int, budget: int) -> int:
        """Tokens of a `need`-token prompt remainder computed under `budget`."""
        return min(need, budget)

    def fill(self, budget: int) -> Chunks:
        """Chunks under `budget`: running chunked prefills first, then new requests in
        arrival order while they can be admitted. Without chunked prefill a prompt
        joins only when it fits whole (the queue waits behind it)."""
        e = self.engine
        chunks: Chunks = []
        chunked = self.sched.chunked_prefill
        for r in e.prefilling:
            if budget <= 0:
                break
            q = self.chunk_size(r.prefill_target - r.prefilled, budget)
            if q <= 0:
                break
            chunks.append((r, q))
            budget -= q
        while e.waiting and budget > 0:
            r = e.waiting[0]
            if r.prefilled >= r.prefill_target:   # decode-role arrival: no prefill
                if not self.can_admit(r):
                    break
                e.waiting.popleft()
                e.admit(r)
                e.join_decode(r)
                continue
            need = r.prefill_target - r.prefilled
            if not chunked and need > budget:
                break
            q = self.chunk_size(need, budget)
            if q <= 0 or not self.can_admit(r):
                break
            e.waiting.popleft()
            e.admit(r)
            e.prefilling.append(r)
            chunks.append((r, q))
            budget -= q
        return chunks
