"""Requests and the clients that issue them (closed loop, open loop Poisson or given
arrival times, replay of a request trace), and the prefix cache a client's requests
find (a declared hit rate, or an LRU of the trace's block hashes)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfcast.core.errors import ConfigError
from perfcast.serving.limits import MAX_SIMULATED_REQUESTS, check_request_count  # noqa: F401 (re-export)


class Request:
    """One inference request and its progress through an engine (mutable state)."""

    __slots__ = ("rid", "arrival_s", "input_tokens", "output_tokens", "measured",
                 "prefill_target", "prefilled", "generated", "first_token_s", "last_token_s",
                 "finish_s", "kv_base", "join_counter", "seq", "preemptions", "reject_reason",
                 "transfer_s", "active", "frontend_wait_s", "cached_tokens")

    def __init__(self, rid: int, arrival_s: float, input_tokens: int, output_tokens: int,
                 measured: bool = True) -> None:
        self.rid = rid
        self.arrival_s = arrival_s
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.measured = measured
        self.prefill_target = input_tokens   # tokens to (re)compute before decoding
        self.prefilled = 0
        self.generated = 0
        self.first_token_s: float | None = None
        self.last_token_s = 0.0
        self.finish_s: float | None = None
        self.kv_base = 0
        self.join_counter = 0
        self.seq = 0
        self.preemptions = 0
        self.reject_reason = ""
        self.transfer_s = 0.0
        self.active = False
        self.frontend_wait_s = 0.0    # waiting for the front-end's turn (simulate)
        self.cached_tokens = 0        # prompt tokens found in the prefix cache on arrival

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Request({self.rid}, in={self.input_tokens}, out={self.output_tokens}, "
                f"prefilled={self.prefilled}, generated={self.generated})")


@dataclass(frozen=True)
class LengthDistribution:
    """Input/output lengths: fixed (`ratio=1`) or uniform integers in
    [ratio*isl, isl] and [ratio*osl, osl] (benchmark_serving's `--random-range-ratio`)."""

    isl: int
    osl: int
    ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.isl < 1 or self.osl < 1:
            raise ConfigError(f"isl={self.isl}, osl={self.osl}", field="isl/osl",
                              expected="positive integers")
        if not 0.0 < self.ratio <= 1.0:
            raise ConfigError(f"ratio={self.ratio}", field="range_ratio", expected="in (0, 1]")

    @property
    def fixed(self) -> bool:
        return self.ratio >= 1.0

    def sample(self, n: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        """`n` lengths; `rng` draws them (None: fixed lengths draw nothing)."""
        if self.fixed:
            return np.full(n, self.isl), np.full(n, self.osl)
        lo_i = max(1, int(self.isl * self.ratio))
        lo_o = max(1, int(self.osl * self.ratio))
        return (rng.integers(lo_i, self.isl + 1, n), rng.integers(lo_o, self.osl + 1, n))

    @property
    def mean_input(self) -> float:
        return self.isl if self.ratio >= 1 else (max(1, int(self.isl * self.ratio)) + self.isl) / 2

    @property
    def mean_output(self) -> float:
        return self.osl if self.ratio >= 1 else (max(1, int(self.osl * self.ratio)) + self.osl) / 2


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: arrival (seconds from the trace's first), lengths, and
    the hashes of its prompt's blocks when the trace records them (Mooncake `hash_ids`)."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] = ()


class DeclaredHitRate:
    """Every prompt finds the fraction `hit_rate` of its tokens (rounded down) in the
    cache, at most all but its last token: the engine computes the last prompt token to
    sample the first output token (vLLM `kv_cache_manager.get_computed_blocks`:
    `max_cache_hit_length = request.num_tokens - 1`)."""

    source = "hit_rate"

    def __init__(self, hit_rate: float) -> None:
        if not 0.0 <= hit_rate <= 1.0:
            raise ConfigError(f"has value {hit_rate}", field="--prefix-cache-hit-rate",
                              expected="a fraction in [0, 1]")
        self.hit_rate = hit_rate

    def lookup(self, input_tokens: int, block_hashes: Sequence[int]) -> int:
        # the epsilon keeps 0.7 x 1000 at 700, not 699 (binary fractions)
        cached = math.floor(self.hit_rate * input_tokens + 1e-9)
        return max(0, min(cached, input_tokens - 1))


class BlockLRU:
    """A prefix cache of `capacity_blocks` blocks of `block_tokens` tokens, named by the
    trace's block hashes and evicted least recently used first. A prompt's cached
    prefix is its leading run of blocks already held (a block's hash covers its whole
    prefix, as in vLLM's chained block hashes); then every block of the prompt becomes
    the most recently used. Lookup and insertion happen when a request is issued."""

    source = "trace_hash_ids"

    def __init__(self, capacity_blocks: int, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ConfigError(f"block of {block_tokens} tokens", field="block_tokens",
                              expected="a positive integer")
        self.capacity_blocks = max(0, int(capacity_blocks))
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def lookup(self, input_tokens: int, block_hashes: Sequence[int]) -> int:
        held = self._blocks
        hits = 0
        for h in block_hashes:
            if h not in held:
                break
            hits += 1
        for h in block_hashes:
            if h in held:
                held.move_to_end(h)
            else:
                held[h] = None
        while len(held) > self.capacity_blocks:
            held.popitem(last=False)
        return max(0, min(hits * self.block_tokens, input_tokens - 1))


class Client:
    """Issues requests to the system under test and is told when each one finishes.
    With a `prefix_cache` (set before the simulation starts), each request starts with
    the cached part of its prompt already prefilled (`Request.prefilled`)."""

    def __init__(self, lengths: LengthDistribution | None, num_requests: int,
                 warmup_requests: int, seed: int) -> None:
        if num_requests < 1 or warmup_requests < 0:
            raise ConfigError(f"num_requests={num_requests}, warmup={warmup_requests}",
                              field="num_requests", expected="num_requests >= 1, warmup >= 0")
        total = num_requests + warmup_requests
        self._seed, self._rng = seed, None
        if lengths is not None:
            self.inputs, self.outputs = lengths.sample(total, None if lengths.fixed else self.rng)
        self.block_hashes: Sequence[Sequence[int]] | None = None
        self.prefix_cache: DeclaredHitRate | BlockLRU | None = None
        self.lengths = lengths
        self.num_requests = num_requests
        self.warmup_requests = warmup_requests
        self.issued = 0

    @property
    def rng(self) -> np.random.Generator:
        """The client's random stream, made on first use (fixed lengths in a closed loop
        draw nothing, and numpy.random is slow to import)."""
        if self._rng is None:
            self._rng = np.random.default_rng(self._seed)
        return self._rng

    @property
    def total(self) -> int:
        return self.num_requests + self.warmup_requests

    def _make(self, arrival_s: float) -> Request:
        i = self.issued
        self.issued += 1
        r = Request(i, arrival_s, int(self.inputs[i]), int(self.outputs[i]),
                    measured=i >= self.warmup_requests)
        if self.prefix_cache is not None:
            hashes = self.block_hashes[i] if self.block_hashes is not None else ()
            r.cached_tokens = r.prefilled = self.prefix_cache.lookup(r.input_tokens, hashes)
        return r

    def initial(self) -> list[Request]:
        raise NotImplementedError

    def on_finish(self, request: Request, time_s: float) -> list[Request]:
        return []


class ClosedLoopClient(Client):
    """`concurrency` users; each sends its next request when the previous one ends
    (all start at t=0, as benchmark_serving's `--max-concurrency` does). The first
    `warmup_requests` issued are excluded from the metrics."""

    def __init__(self, concurrency: int, lengths: LengthDistribution, num_requests: int,
                 warmup_requests: int = 0, seed: int = 0) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency={concurrency}", field="concurrency",
                              expected="a positive integer")
        super().__init__(lengths, num_requests, warmup_requests, seed)
        self.concurrency = concurrency

    def initial(self) -> list[Request]:
        return [self._make(0.0) for _ in range(min(self.concurrency, self.total))]

    def on_finish(self, request: Request, time_s: float) -> list[Request]:
        return [self._make(time_s)] if self.issued < self.total else []


class OpenLoopClient(Client):
    """Arrivals independent of completions: Poisson at `rate_per_s`, or given times."""

    def __init__(self, lengths: LengthDistribution, num_requests: int, *,
                 rate_per_s: float | None = None, arrival_times_s: list[float] | None = None,
                 warmup_requests: int = 0, seed: int = 0) -> None:
        super().__init__(lengths, num_requests, warmup_requests, seed)
        if arrival_times_s is not None:
            times = np.asarray(sorted(arrival_times_s), dtype=float)
            if len(times) < self.total:
                raise ConfigError(f"trace has {len(times)} arrivals", field="arrival_times",
                                  expected=f"at least {self.total}")
            self.times = times[: self.total]
        elif rate_per_s and rate_per_s > 0:
            self.times = np.cumsum(self.rng.exponential(1.0 / rate_per_s, self.total))
        else:
            raise ConfigError("an open-loop client needs a rate or a trace", field="rate",
                              expected="a positive request rate (req/s) or arrival times")

    def initial(self) -> list[Request]:
        return [self._make(float(t)) for t in self.times]


class TraceClient(OpenLoopClient):
    """Replays the first `warmup_requests + num_requests` requests of a trace (in
    arrival order): each arrives at its recorded time with its recorded lengths."""

    def __init__(self, requests: Sequence[TraceRequest], num_requests: int,
                 warmup_requests: int = 0) -> None:
        total = num_requests + warmup_requests
        if len(requests) < total:
            raise ConfigError(f"holds {len(requests)} requests", field="--trace",
                              expected=f"at least {total} (--num-requests + --warmup-requests)")
        Client.__init__(self, None, num_requests, warmup_requests, 0)
        chosen = sorted(requests, key=lambda q: q.arrival_s)[:total]
        self.times = np.array([q.arrival_s for q in chosen], dtype=float)
        self.inputs = np.array([q.input_tokens for q in chosen], dtype=np.int64)
        self.outputs = np.array([q.output_tokens for q in chosen], dtype=np.int64)
        self.block_hashes = [q.block_hashes for q in chosen]
