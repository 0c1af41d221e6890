"""Requests and the clients that issue them (closed loop, open loop Poisson or trace)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfcast.core.errors import ConfigError


class Request:
    """One inference request and its progress through an engine (mutable state)."""

    __slots__ = ("rid", "arrival_s", "input_tokens", "output_tokens", "measured",
                 "prefill_target", "prefilled", "generated", "first_token_s", "last_token_s",
                 "finish_s", "kv_base", "join_counter", "seq", "preemptions", "reject_reason",
                 "transfer_s", "active", "frontend_wait_s")

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

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        if self.ratio >= 1.0:
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


class Client:
    """Issues requests to the system under test and is told when each one finishes."""

    def __init__(self, lengths: LengthDistribution, num_requests: int, warmup_requests: int,
                 seed: int) -> None:
        if num_requests < 1 or warmup_requests < 0:
            raise ConfigError(f"num_requests={num_requests}, warmup={warmup_requests}",
                              field="num_requests", expected="num_requests >= 1, warmup >= 0")
        total = num_requests + warmup_requests
        rng = np.random.default_rng(seed)
        self.inputs, self.outputs = lengths.sample(total, rng)
        self.rng = rng
        self.lengths = lengths
        self.num_requests = num_requests
        self.warmup_requests = warmup_requests
        self.issued = 0

    @property
    def total(self) -> int:
        return self.num_requests + self.warmup_requests

    def _make(self, arrival_s: float) -> Request:
        i = self.issued
        self.issued += 1
        return Request(i, arrival_s, int(self.inputs[i]), int(self.outputs[i]),
                       measured=i >= self.warmup_requests)

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


# Requests one simulation may issue without `--allow-long-run`: 50,000 requests of
# Qwen3-8B (1024 in, 128 out, C=5000) simulate in about 8 s on one core; ten times that
# takes minutes, which is more often a typo (`--concurrency 1000000`) than a wish.
MAX_SIMULATED_REQUESTS = 100_000


def check_request_count(requests: int, field: str, allow: bool) -> None:
    """Refuse simulations of more than MAX_SIMULATED_REQUESTS requests unless allowed."""
    if requests > MAX_SIMULATED_REQUESTS and not allow:
        raise ConfigError(f"asks for {requests:,} simulated requests", field=field,
                          expected=f"at most {MAX_SIMULATED_REQUESTS:,} (more takes minutes "
                                   "to simulate), or --allow-long-run")
