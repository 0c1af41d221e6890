"""Prefix caching: a cached prefix costs no prefill compute; the request starts with it
prefilled, so its chunks attend over it. Hit rate 0 is no caching, exactly; hit rate h
leaves (1 - h) x ISL tokens to prefill over h x ISL cached ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.core.errors import ConfigError
from perfcast.evidence.contracts import CostQueryContext
from perfcast.hardware import load_system
from perfcast.serving.backends import load_backend
from perfcast.serving.deploy import Pool, ServeConfig, StepModelCache, run_serving
from perfcast.serving.requests import (BlockLRU, ClosedLoopClient, DeclaredHitRate,
                                       LengthDistribution)
from perfcast.serving.simulator import simulate
from perfcast.serving.step_cost import StepShape
from perfcast.workload import ParallelPlan, load_model_spec
from tests.serving.fakes import engine

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
MODEL = "Qwen/Qwen3-0.6B"


class ContextCost:
    """a + b x tokens + c x (chunk tokens x cached tokens) per iteration; records shapes."""

    def __init__(self, a=0.010, b=1e-4, c=1e-8) -> None:
        self.a, self.b, self.c = a, b, c
        self.shapes: list[StepShape] = []

    def step_s(self, shape: StepShape) -> float:
        self.shapes.append(shape)
        return self.a + self.b * shape.tokens + self.c * sum(q * ctx for q, ctx in shape.prefill)

    def decode_run_s(self, requests, context0, steps):
        import numpy as np

        return np.full(steps, self.a + self.b * requests)


def _run_fake(hit_rate, isl=1000, osl=5, clients=1, n=1):
    cost = ContextCost()
    client = ClosedLoopClient(clients, LengthDistribution(isl, osl), num_requests=n)
    if hit_rate is not None:
        client.prefix_cache = DeclaredHitRate(hit_rate)
    res = simulate(client, [engine(cost)], num_gpus=1)
    return res, cost


@pytest.mark.parametrize("h, cached", [(0.3, 300), (0.5, 500), (0.7, 700), (1.0, 999)])
def test_one_request_ttft_is_the_uncached_prefill_over_the_cached_context(h, cached):
    res, cost = _run_fake(h)
    q = 1000 - cached                   # at h = 1 the last prompt token is still computed
    assert res.metrics.ttft_ms["mean"] == pytest.approx(
        (cost.a + cost.b * q + cost.c * q * cached) * 1e3)
    assert cost.shapes[0].prefill == ((q, cached),)
    assert res.metrics.prefix_cache_hit_rate == pytest.approx(cached / 1000)


def test_hit_rate_cuts_the_prefill_tokens_by_h():
    n, isl = 24, 800
    tokens = []
    for h in (None, 0.25):
        res, cost = _run_fake(h, isl=isl, clients=4, n=n)
        assert res.metrics.completed_requests == n and not res.metrics.preemptions
        tokens.append(sum(q for s in cost.shapes for q, _ in s.prefill))
    assert tokens == [n * isl, n * (isl - 200)]


def test_hit_rate_zero_equals_no_caching_exactly():
    cfg = ServeConfig(model=MODEL, isl=512, osl=16, range_ratio=0.5, concurrency=4,
                      num_requests=24)
    plain = run_serving(cfg).metrics.to_json()
    zero = run_serving(ServeConfig(**{**cfg.__dict__, "prefix_cache_hit_rate": 0.0}))
    assert zero.metrics.to_json() == plain
    half = run_serving(ServeConfig(**{**cfg.__dict__, "prefix_cache_hit_rate": 0.5}))
    assert half.metrics.ttft_ms["mean"] < plain["ttft_ms"]["mean"]


def test_one_request_ttft_on_the_step_cost_model_is_the_uncached_chunk():
    """With the physics-only vLLM file (no front-end time) one request's TTFT is one
    iteration: a chunk of (1 - h) x ISL tokens over h x ISL cached tokens."""
    isl, h = 2048, 0.75
    spec, system, backend = load_model_spec(MODEL), load_system("h100_sxm"), load_backend("vllm")
    cache = StepModelCache()
    cfg = ServeConfig(model=spec, system=system, backend=backend, isl=isl, osl=4,
                      concurrency=1, num_requests=1, prefix_cache_hit_rate=h)
    res = run_serving(cfg, cache=cache)
    step = cache.get(spec, ParallelPlan(), system, backend, None, (),
                     CostQueryContext(runtime=backend.name, runtime_revision=""), True)
    ov = backend.overheads
    chunk = step.step_s(StepShape(0, 0.0, ((isl // 4, 3 * isl // 4),)))
    want = ov.frontend_overhead_s + chunk + ov.first_chunk_overhead_s
    assert res.metrics.ttft_ms["mean"] == pytest.approx(want * 1e3, rel=1e-12)
    full = step.step_s(StepShape(0, 0.0, ((isl, 0),)))
    assert chunk < full


def test_declared_hit_rate_is_a_fraction():
    with pytest.raises(ConfigError, match="--prefix-cache-hit-rate"):
        DeclaredHitRate(1.5)


def test_lru_hits_the_leading_blocks_seen_before_and_evicts_the_least_recent():
    lru = BlockLRU(capacity_blocks=4, block_tokens=512)
    assert lru.lookup(1500, (0, 1, 2)) == 0
    assert lru.lookup(1200, (0, 3, 4)) == 512        # block 0 only: 3 and 4 are new
    # held now (oldest first): 1, 2, 0, 3, 4 -> 1 was evicted (capacity 4)
    assert lru.lookup(1100, (0, 1, 5)) == 512        # 1 is gone: the run stops there
    assert lru.lookup(1536, (0, 1, 5)) == 1535       # all three held: all but the last token
    assert lru.lookup(600, (9, 0)) == 0              # a prefix must start at the first block


def test_mooncake_hash_ids_give_the_shared_prefix_hits():
    res = CliRunner().invoke(app, ["serve", MODEL, "--trace", str(TRACES / "mooncake.jsonl"),
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    pc = m["inputs"]["prefix_cache"]
    assert pc["source"] == "trace_hash_ids" and pc["block_tokens"] == 512
    assert pc["capacity_blocks"] > 100        # the 0.6B model's KV cache holds them all
    # requests 2-4 find blocks [0], [0, 1], [0]: 512 + 1024 + 512 of 4400 prompt tokens
    assert m["prefix_cache_hit_rate"] == pytest.approx(2048 / 4400)
    off = CliRunner().invoke(app, ["serve", MODEL, "--trace", str(TRACES / "mooncake.jsonl"),
                                   "--prefix-cache-hit-rate", "0", "--format", "json"])
    m0 = json.loads(off.stdout)
    assert m0["prefix_cache_hit_rate"] == 0.0 and m0["inputs"]["prefix_cache"]["source"] == "hit_rate"
    assert m["ttft_ms"]["mean"] < m0["ttft_ms"]["mean"]


def test_disaggregated_prefill_pool_finds_the_cached_prefix():
    base = ServeConfig(model=MODEL, mode="disagg", pool=Pool(ParallelPlan()),
                       decode_pool=Pool(ParallelPlan()), isl=1024, osl=8, concurrency=2,
                       num_requests=8)
    cold = run_serving(base).metrics
    warm = run_serving(ServeConfig(**{**base.__dict__, "prefix_cache_hit_rate": 0.5})).metrics
    assert warm.prefix_cache_hit_rate == pytest.approx(0.5)
    assert warm.ttft_ms["mean"] < cold.ttft_ms["mean"]
