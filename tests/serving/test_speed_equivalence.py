"""Speed paths that must not change a prediction: a decode run cut short by the horizon,
costed in plain floats (StepCostModel.decode_run_head), equals the numpy array path bit
for bit, and whole simulations give the same request times with and without it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from perfcast.evidence.factory import build_resolver
from perfcast.hardware import load_system
from perfcast.serving.backends import CudaGraphConfig, Overheads
from perfcast.serving.deploy import Pool, ServeConfig, run_serving
from perfcast.serving.step_cost import RUN_HEAD_MAX, StepCostModel
from perfcast.workload import ParallelPlan, load_model_spec

SYSTEM = load_system("h100_sxm")
MODEL = load_model_spec("Qwen/Qwen3-8B")


def array_path(m: StepCostModel, requests, context0, steps, clock, limit) -> list[float]:
    """What Engine._decode_run keeps of decode_run_s for a run cut at `limit`."""
    d = m.decode_run_s(requests, context0, steps)
    starts = clock + np.concatenate(([0.0], np.cumsum(d[:-1])))
    return d[:max(1, int(np.searchsorted(starts, limit, side="left")))].tolist()


@pytest.mark.parametrize("overlapped", [False, True])
def test_decode_run_head_equals_the_array_path_bit_for_bit(overlapped):
    ov = Overheads(kernel_launch_graph_s=2e-6, kernel_launch_eager_s=6e-6,
                   step_overhead_s=3e-3 if overlapped else 4e-4,
                   per_request_overhead_s=1e-5, host_overlapped=overlapped)
    m = StepCostModel(MODEL, ParallelPlan(tp=2), SYSTEM,
                      build_resolver(SYSTEM, launch_in_kernel_times=False), overheads=ov,
                      cuda_graph=CudaGraphConfig(max_batch=64))
    rng = random.Random(7)
    lengths = set()
    for _ in range(400):
        requests = rng.choice([1, 3, 8, 17, 64, 100])
        context0 = rng.choice([0.5, 1.0, 7.0, 12.0, 383.25, 4095.5, 20000.0]) + rng.random()
        steps = rng.choice([1, 2, 3, 5, 7, 40, 700])
        clock = rng.uniform(0.0, 50.0)
        # no horizon: Engine._decode_run takes a run of up to RUN_HEAD_MAX steps whole
        limit = clock + rng.uniform(-0.01, 0.2) if rng.random() < 0.7 else float("inf")
        head = m.decode_run_head(requests, context0, steps, clock, limit)
        expected = array_path(m, requests, context0, steps, clock, limit)
        if head is None:
            assert len(expected) > RUN_HEAD_MAX
            continue
        lengths.add(len(head))
        assert head == expected   # exact float equality, element by element
        assert sum(head[1:], 0.0) == float(np.array(expected)[1:].sum())
        total = head[0]
        for d in head[1:]:
            total += d
        assert total == float(np.array(expected).sum())
    assert {1, 2} <= lengths and max(lengths) > 2   # the cases were exercised


def _times(monkeypatch, use_head: bool, **kw):
    if not use_head:
        monkeypatch.setattr(StepCostModel, "decode_run_head", lambda self, *a: None)
    res = run_serving(ServeConfig(model="Qwen/Qwen3-8B", **kw))
    monkeypatch.undo()
    return [(r.rid, r.first_token_s, r.finish_s) for r in res.finished], res.metrics.to_json()


@pytest.mark.parametrize("kw", [
    dict(pool=Pool(ParallelPlan(tp=1), 4), isl=900, osl=150, range_ratio=0.5, concurrency=24,
         num_requests=60),
    dict(mode="disagg", pool=Pool(ParallelPlan(tp=1), 1), decode_pool=Pool(ParallelPlan(tp=1), 2),
         isl=700, osl=90, range_ratio=0.6, concurrency=16, num_requests=40),
], ids=["agg-4-replicas", "disagg-1p2d"])
def test_simulations_are_identical_with_and_without_the_short_run_path(monkeypatch, kw):
    calls = []
    real = StepCostModel.decode_run_head

    def counting(self, *a):
        out = real(self, *a)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(StepCostModel, "decode_run_head", counting)
    fast = run_serving(ServeConfig(model="Qwen/Qwen3-8B", **kw))
    monkeypatch.undo()
    assert any(calls)   # the short-run path served some decode runs
    slow_times, slow_metrics = _times(monkeypatch, False, **kw)
    assert [(r.rid, r.first_token_s, r.finish_s) for r in fast.finished] == slow_times
    assert fast.metrics.to_json() == slow_metrics


def test_search_through_ray_equals_local_processes():
    """`--executor ray` (a local cluster, started here) gives the same candidates."""
    pytest.importorskip("ray")
    from perfcast.serving.search import SearchSpace, candidate_json, search

    space = SearchSpace(model="Qwen/Qwen3-0.6B", gpus=2, isl=256, osl=32,
                        concurrencies=(2, 8), tp_sizes=(1, 2), prompts_per_concurrency=2)
    local = [candidate_json(c) for c in search(space, executor="local", workers=2)]
    ray = [candidate_json(c) for c in search(space, executor="ray")]
    assert len(local) == 6 and not any(c["error"] for c in local)
    assert ray == local


def test_percentiles_equal_numpys_linear_percentile_bit_for_bit():
    from perfcast.serving.metrics import percentiles

    rng = np.random.default_rng(3)
    qs = (0, 1, 25, 50, 66.7, 90, 99, 99.9, 100)
    for trial in range(3000):
        n = int(rng.integers(1, 200))
        v = [rng.random(n) * 1e3, rng.integers(0, 4, n) * 0.37,
             np.exp(rng.normal(size=n) * 5)][trial % 3]
        assert percentiles(v, qs) == [float(p) for p in np.percentile(v, list(qs))]
    with_nan = np.array([1.0, np.nan, 3.0])
    assert np.isnan(percentiles(with_nan, (50,))[0])


def test_unrolled_decode_attention_equals_the_generic_interpolation_bit_for_bit():
    """kernel_parts' and _decode_gpu_at's unrolled attn_decode (`_attn_decode_sums`)
    equals context_term's bilinear interpolation through Part arithmetic, at grid nodes,
    between them and below context 1."""
    m = StepCostModel(MODEL, ParallelPlan(tp=2), SYSTEM,
                      build_resolver(SYSTEM, launch_in_kernel_times=False))
    rng = random.Random(3)
    for _ in range(300):
        requests = rng.choice([1, 2, 3, 5, 8, 13, 64, 100])
        context = rng.choice([0.25, 1.0, 2.0, 6.0, 7.5, 1024.0, 3000.0]) + rng.choice([0.0, rng.random()])
        y = context if context >= 1.0 else 1.0
        fast = m._attn_decode_sums(requests, y)
        slow = m.context_term(m.attn_decode_exact, requests, context)
        assert fast == (slow.kernel_s, slow.kernels, slow.comm_s)


def test_kernel_parts_is_the_same_with_and_without_the_unrolled_decode_term():
    from perfcast.serving.step_cost import StepShape

    m = StepCostModel(MODEL, ParallelPlan(tp=2), SYSTEM,
                      build_resolver(SYSTEM, launch_in_kernel_times=False),
                      cuda_graph=CudaGraphConfig(max_batch=64))
    shapes = [StepShape(17, 431.37, ((96, 0), (512, 1024))), StepShape(3, 0.5),
              StepShape(64, 2048.0), StepShape(0, 0.0, ((300, 0),)), StepShape(5, 12.125)]
    fast = [m.kernel_parts(s) for s in shapes]
    m._plain_decode = False
    assert [m.kernel_parts(s) for s in shapes] == fast
