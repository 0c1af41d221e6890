"""Request-level metrics of a simulation: latency statistics and throughputs.

Definitions (those of benchmark_serving):
* TTFT: first token time - arrival (so it includes every queueing delay before the
  first token); TPOT: (e2e - TTFT) / (output tokens - 1), for requests with more than
  one output token (it excludes the first token); ITL: every gap between consecutive tokens
  of a request (weighted over all measured requests); E2E: finish - arrival.
* frontend_queue_ms: time a request waited for the server front-end's turn beyond its
  fixed latency (part of TTFT; zero unless the backend serialises front-end work).
* throughput_tokens_per_s: output tokens of measured requests / (last finish - first
  arrival of measured requests); per GPU: divided by every GPU of the deployment;
  per user: 1000 / mean TPOT (the decode speed one user sees).
* prefix_cache_hit_rate: prompt tokens of measured requests found in the prefix cache
  on arrival / all their prompt tokens (0 without prefix caching).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfcast.serving.requests import Request

STAT_KEYS = ("mean", "p50", "p90", "p99")


def percentiles(values: np.ndarray, qs: Sequence[float]) -> list[float]:
    """`np.percentile(values, qs)` (its default linear method) of a 1-d float array
    without NaNs, in the same float operations: numpy's own path imports `numpy.ma`
    (~20 ms of a CLI call) to sort out masked arrays."""
    if np.isnan(values).any():
        return [float(p) for p in np.percentile(values, list(qs))]
    s = np.sort(values).tolist()
    n = len(s)
    out = []
    for q in qs:
        virtual = (n - 1) * (q / 100)
        if virtual >= n - 1:   # at or past the last value: numpy takes index -1 twice
            prev = nxt = -1
        else:
            prev = math.floor(virtual)
            nxt = prev + 1
        t = virtual - prev
        a, b = s[prev], s[nxt]
        diff = b - a
        out.append(b - diff * (1 - t) if t >= 0.5 else a + diff * t)
    return out


def summary_ms(values_s: Sequence[float] | np.ndarray,
               weights: Sequence[float] | np.ndarray | None = None) -> dict[str, float | None]:
    v = np.asarray(values_s, dtype=float) * 1e3
    if v.size == 0:
        return {k: None for k in STAT_KEYS}
    if weights is None:
        p50, p90, p99 = percentiles(v, (50, 90, 99))
        return {"mean": float(v.mean()), "p50": p50, "p90": p90, "p99": p99}
    w = np.asarray(weights, dtype=float)
    order = np.argsort(v)
    v, w = v[order], w[order]
    cum = np.cumsum(w)
    total = cum[-1]

    def q(p: float) -> float:
        return float(v[min(int(np.searchsorted(cum, p * total, side="left")), len(v) - 1)])

    return {"mean": float((v * w).sum() / total), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


@dataclass(frozen=True)
class ServingMetrics:
    ttft_ms: dict
    tpot_ms: dict
    itl_ms: dict
    e2e_ms: dict
    throughput_tokens_per_s: float
    input_throughput_tokens_per_s: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    request_throughput_per_s: float
    completed_requests: int
    rejected_requests: int
    preemptions: int
    kv_utilization_mean: float
    kv_utilization_peak: float
    duration_s: float
    num_gpus: int
    frontend_queue_ms: dict
    prefix_cache_hit_rate: float = 0.0

    def to_json(self) -> dict:
        return dict(self.__dict__)


def compute_metrics(finished: Sequence[Request], rejected: Sequence[Request], engines,
                    num_gpus: int, *, itl: bool = True) -> ServingMetrics:
    """The metrics of a finished simulation. `itl=False` leaves `itl_ms` empty (`{}`, not
    the statistics of no samples) for callers that read no ITL statistic: its weighted
    percentiles sort every inter-token gap of the run."""
    done = [r for r in finished if r.measured]
    ttft = [r.first_token_s - r.arrival_s for r in done]
    e2e = [r.finish_s - r.arrival_s for r in done]
    tpot = [(r.finish_s - r.first_token_s) / (r.output_tokens - 1) for r in done
            if r.output_tokens > 1]
    itl_v: list[float] = []
    itl_w: list[float] = []
    kv_ts = busy = 0.0
    peak = 0.0
    preempt = 0
    for e in engines:
        if itl:
            itl_v.extend(e.stats.itl_values)
            itl_w.extend(e.stats.itl_weights)
        if e.capacity:
            kv_ts += e.stats.kv_token_seconds / e.capacity
            peak = max(peak, e.stats.kv_peak_tokens / e.capacity)
        busy += e.stats.busy_s
        preempt += e.stats.preemptions
    if done:
        t0 = min(r.arrival_s for r in done)
        t1 = max(r.finish_s for r in done)
        duration = max(t1 - t0, 1e-12)
    else:
        duration = 0.0
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.input_tokens for r in done)
    thr = out_tokens / duration if duration else 0.0
    tpot_s = summary_ms(tpot)
    return ServingMetrics(
        ttft_ms=summary_ms(ttft), tpot_ms=tpot_s,
        itl_ms=summary_ms(itl_v, itl_w or None) if itl else {},
        e2e_ms=summary_ms(e2e), throughput_tokens_per_s=thr,
        input_throughput_tokens_per_s=in_tokens / duration if duration else 0.0,
        tokens_per_s_per_gpu=thr / num_gpus if num_gpus else 0.0,
        tokens_per_s_per_user=(1000.0 / tpot_s["mean"]) if tpot_s["mean"] else 0.0,
        request_throughput_per_s=len(done) / duration if duration else 0.0,
        completed_requests=len(done), rejected_requests=len(rejected), preemptions=preempt,
        kv_utilization_mean=kv_ts / busy if busy else 0.0, kv_utilization_peak=peak,
        duration_s=duration, num_gpus=num_gpus,
        frontend_queue_ms=summary_ms([r.frontend_wait_s for r in done]),
        prefix_cache_hit_rate=(sum(r.cached_tokens for r in done) / in_tokens
                               if in_tokens else 0.0))
