"""A step cost model with hand-checkable costs: a + b x tokens per iteration."""

from __future__ import annotations

import numpy as np

from perfcast.serving.backends import KVCacheConfig, SchedulerConfig
from perfcast.serving.engine import Engine
from perfcast.serving.step_cost import StepShape


class LinearCost:
    def __init__(self, fixed_s: float = 0.010, per_token_s: float = 0.0001) -> None:
        self.a = fixed_s
        self.b = per_token_s

    def step_s(self, shape: StepShape) -> float:
        return self.a + self.b * shape.tokens

    def decode_run_s(self, requests: int, context0: float, steps: int) -> np.ndarray:
        return np.full(steps, self.a + self.b * requests)

    def iteration_split(self, shape: StepShape, total_s: float, steps: int = 1):
        """(compute, communication, launch, host): the per-token part is compute, the
        fixed part host time."""
        host = self.a * steps
        return total_s - host, 0.0, 0.0, host


def engine(cost=None, *, policy="decode_first", budget=100_000, max_running=1024,
           chunked=True, mix=True, admission="reserve_full", capacity=10**9, block=1,
           role="agg", trace=True, name="e0", mixed_chunk=False, conservativeness=0.0,
           explain=False) -> Engine:
    sched = SchedulerConfig(policy=policy, token_budget=budget, max_running_requests=max_running,
                            chunked_prefill=chunked, mix_decode_and_prefill=mix,
                            enable_mixed_chunk=mixed_chunk,
                            schedule_conservativeness=conservativeness)
    kv = KVCacheConfig(admission=admission, block_tokens=block)
    return Engine(name, cost or LinearCost(), sched, kv, capacity, role=role, record_trace=trace,
                  explain=explain)
