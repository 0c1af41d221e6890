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


def engine(cost=None, *, policy="decode_first", budget=100_000, max_running=1024,
           chunked=True, mix=True, admission="reserve_full", capacity=10**9, block=1,
           role="agg", trace=True, name="e0") -> Engine:
    sched = SchedulerConfig(policy=policy, token_budget=budget, max_running_requests=max_running,
                            chunked_prefill=chunked, mix_decode_and_prefill=mix)
    kv = KVCacheConfig(admission=admission, block_tokens=block)
    return Engine(name, cost or LinearCost(), sched, kv, capacity, role=role, record_trace=trace)
