"""KV transfer between the prefill and decode pools: per-link concurrency in closed form
and the tier that joins the pools."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from perfcast.hardware import load_system
from perfcast.serving.deploy import Pool, ServeConfig, run_serving
from perfcast.serving.kv_transfer import KVLinks, Link, kv_tier, transfer_s
from perfcast.serving.requests import ClosedLoopClient, LengthDistribution
from perfcast.serving.simulator import simulate
from perfcast.workload import ParallelPlan
from tests.serving.fakes import LinearCost, engine

T = 0.004   # one transfer alone on its links


def _workers(n: int, role: str) -> list:
    return [SimpleNamespace(name=f"{role}{i}") for i in range(n)]


@pytest.mark.parametrize("n", [1, 2, 5])
def test_n_equal_transfers_on_one_link_take_n_times_one(n):
    links = KVLinks(lambda r: T, lambda e: 1)
    p, d = _workers(1, "prefill")[0], _workers(1, "decode")[0]
    waits = [links(None, p, d, 0.0) for _ in range(n)]
    assert waits == pytest.approx([T * (i + 1) for i in range(n)])
    assert max(waits) == pytest.approx(n * T)


@pytest.mark.parametrize("n", [2, 5])
def test_transfers_on_separate_links_take_the_time_of_one(n):
    links = KVLinks(lambda r: T, lambda e: 1)
    ps, ds = _workers(n, "prefill"), _workers(n, "decode")
    waits = [links(None, p, d, 0.0) for p, d in zip(ps, ds)]
    assert waits == pytest.approx([T] * n)


def test_one_sender_to_many_receivers_queues_on_the_sender_link():
    links = KVLinks(lambda r: T, lambda e: 1)
    p = _workers(1, "prefill")[0]
    waits = [links(None, p, d, 0.0) for d in _workers(3, "decode")]
    assert waits == pytest.approx([T, 2 * T, 3 * T])


def test_attention_dp_ranks_are_parallel_channels():
    links = KVLinks(lambda r: T, lambda e: 4)
    p, d = _workers(1, "prefill")[0], _workers(1, "decode")[0]
    waits = [links(None, p, d, 0.0) for _ in range(8)]
    assert waits == pytest.approx([T] * 4 + [2 * T] * 4)


def test_a_transfer_after_the_link_is_free_does_not_wait():
    links = KVLinks(lambda r: T, lambda e: 1)
    p, d = _workers(1, "prefill")[0], _workers(1, "decode")[0]
    assert links(None, p, d, 0.0) == pytest.approx(T)
    assert links(None, p, d, 10 * T) == pytest.approx(T)
    with pytest.raises(ValueError):
        Link(0)


A, B = 0.010, 0.0001


def _disagg(prefill_workers: int, decode_workers: int, clients: int):
    links = KVLinks(lambda r: T, lambda e: 1)
    client = ClosedLoopClient(clients, LengthDistribution(400, 11), num_requests=clients)
    return simulate(client,
                    [engine(LinearCost(A, B), role="prefill", name=f"p{i}")
                     for i in range(prefill_workers)],
                    decode_engines=[engine(LinearCost(A, B), role="decode", name=f"d{i}")
                                    for i in range(decode_workers)],
                    kv_transfer=links, num_gpus=prefill_workers + decode_workers)


def test_simulated_transfers_share_one_prefill_link():
    """Two prompts prefilled in one iteration on one prefill worker: the second cache
    leaves after the first, so TTFTs are prefill + T and prefill + 2T."""
    res = _disagg(1, 2, 2)
    prefill = A + 2 * 400 * B
    assert sorted(r.transfer_s for r in res.finished) == pytest.approx([T, 2 * T])
    assert res.metrics.ttft_ms["mean"] == pytest.approx((prefill + 1.5 * T) * 1e3)


def test_simulated_transfers_on_separate_links_do_not_wait():
    res = _disagg(2, 2, 2)
    assert [r.transfer_s for r in res.finished] == pytest.approx([T, T])
    assert res.metrics.ttft_ms["mean"] == pytest.approx((A + 400 * B + T) * 1e3)


@pytest.mark.parametrize("prefill_gpus, decode_gpus, tier", [
    (4, 4, "nvlink"), (1, 7, "nvlink"), (8, 8, "infiniband"), (8, 1, "infiniband")])
def test_tier_nvlink_within_a_node_scale_out_across_nodes(prefill_gpus, decode_gpus, tier):
    assert kv_tier(load_system("h100_sxm"), prefill_gpus, decode_gpus).name == tier


def test_transfer_time_is_the_tier_bandwidth():
    """h100_sxm catalog: NVLink 450 GB/s per device x 0.80 efficiency + 3 us; InfiniBand
    50 GB/s x 0.80 + 10 us."""
    system, size = load_system("h100_sxm"), 64e6
    assert transfer_s(size, kv_tier(system, 4, 4)) == pytest.approx(size / 360e9 + 3e-6)
    assert transfer_s(size, kv_tier(system, 8, 8)) == pytest.approx(size / 40e9 + 10e-6)


@pytest.mark.parametrize("decode_tp, tier", [(1, "nvlink"), (8, "infiniband")])
def test_deployment_moves_each_prompt_cache_over_the_joining_tier(decode_tp, tier):
    """Llama-3.1-8B, one request of 1,000 tokens: bf16 KV is 32 layers x 8 KV heads x 128
    x 2 (K, V) x 2 bytes = 128 KiB per token; a TP1 prefill device holds all of it."""
    system = load_system("h100_sxm")
    cfg = ServeConfig(model="meta-llama/Llama-3.1-8B", system=system, backend="vllm",
                      mode="disagg", pool=Pool(ParallelPlan(tp=1)),
                      decode_pool=Pool(ParallelPlan(tp=decode_tp)), isl=1000, osl=4,
                      concurrency=1, num_requests=1)
    res = run_serving(cfg)
    (r,) = res.finished
    expected = transfer_s(1000 * 32 * 8 * 128 * 2 * 2, system.tier_named(tier))
    assert r.transfer_s == pytest.approx(expected, rel=0.02)


def test_decode_slots_are_not_capped_by_the_prefill_token_budget():
    """A decode worker's step has one token per running request: 8 slots run 8 requests
    at once although the backend's token budget (the prefill worker's) is 4 tokens."""
    from perfcast.serving.backends import load_backend

    backend = load_backend("trtllm").with_scheduler(token_budget=4)
    cfg = ServeConfig(model="meta-llama/Llama-3.1-8B", system="h100_sxm", backend=backend,
                      mode="disagg", pool=Pool(ParallelPlan(tp=1)),
                      decode_pool=Pool(ParallelPlan(tp=1)), decode_max_running_requests=8,
                      isl=4, osl=51, range_ratio=1.0, concurrency=8, num_requests=16)
    m = run_serving(cfg).metrics
    # no request waits for a slot (half of them would wait a whole decode, 50 x TPOT):
    # the last first token comes after 8 one-prompt prefill steps
    assert m.ttft_ms["p99"] < 0.5 * 50 * m.tpot_ms["p50"]
