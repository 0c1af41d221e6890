"""The simulator against closed-form cases, on a linear step cost (a + b x tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from perfcast.serving.requests import ClosedLoopClient, LengthDistribution, OpenLoopClient
from perfcast.serving.simulator import simulate
from tests.serving.fakes import LinearCost, engine

A, B = 0.010, 0.0001  # 10 ms per iteration + 0.1 ms per token


def test_single_request_ttft_is_one_prefill_step_and_tpot_one_decode_step():
    cost = LinearCost(A, B)
    client = ClosedLoopClient(1, LengthDistribution(500, 20), num_requests=1)
    res = simulate(client, [engine(cost)], num_gpus=1)
    m = res.metrics
    assert m.completed_requests == 1
    assert m.ttft_ms["mean"] == pytest.approx((A + 500 * B) * 1e3)      # 60 ms
    assert m.tpot_ms["mean"] == pytest.approx((A + 1 * B) * 1e3)        # 10.1 ms
    assert m.e2e_ms["mean"] == pytest.approx((A + 500 * B + 19 * (A + B)) * 1e3)
    assert m.itl_ms["mean"] == pytest.approx((A + B) * 1e3)


@pytest.mark.parametrize("policy", ["decode_first", "prefill_first", "inflight"])
def test_closed_loop_fixed_lengths_reaches_the_analytic_steady_state(policy):
    """C equal requests arrive together, are prefilled in one iteration, decode together
    and finish together; the next wave repeats. Every metric has a closed form."""
    c, isl, osl, waves = 16, 200, 50, 5
    cost = LinearCost(A, B)
    client = ClosedLoopClient(c, LengthDistribution(isl, osl), num_requests=c * waves)
    res = simulate(client, [engine(cost, policy=policy, chunked=policy != "inflight")],
                   num_gpus=2)
    m = res.metrics
    prefill = A + B * c * isl          # 0.33 s
    decode = A + B * c                  # 11.6 ms
    cycle = prefill + (osl - 1) * decode
    assert m.completed_requests == c * waves
    assert m.ttft_ms["mean"] == pytest.approx(prefill * 1e3)
    assert m.tpot_ms["p99"] == pytest.approx(decode * 1e3)
    assert m.throughput_tokens_per_s == pytest.approx(c * osl / cycle)
    assert m.tokens_per_s_per_gpu == pytest.approx(c * osl / cycle / 2)
    assert m.tokens_per_s_per_user == pytest.approx(1 / decode)
    assert m.request_throughput_per_s == pytest.approx(c / cycle)


def test_closed_loop_with_staggered_lengths_matches_decode_steady_state():
    """Long outputs, short prompts: almost every iteration is a decode of C requests,
    so TPOT approaches the decode iteration at batch C (prefill chunks add a little)."""
    c = 32
    cost = LinearCost(A, B)
    client = ClosedLoopClient(c, LengthDistribution(16, 400, ratio=0.8), num_requests=10 * c,
                              seed=3)
    m = simulate(client, [engine(cost)], num_gpus=1).metrics
    decode = A + B * c
    assert decode * 1e3 <= m.tpot_ms["mean"] <= 1.02 * (A + B * (c + 16)) * 1e3
    # throughput: C requests in flight, each emitting a token per iteration
    assert m.throughput_tokens_per_s == pytest.approx(c / decode, rel=0.05)


def test_littles_law_holds_in_open_loop():
    rate = 20.0  # requests per second, well below capacity
    cost = LinearCost(0.005, 0.00005)
    client = OpenLoopClient(LengthDistribution(256, 64, ratio=0.5), 3000, rate_per_s=rate,
                            seed=7)
    res = simulate(client, [engine(cost)], num_gpus=1)
    reqs = res.finished
    assert len(reqs) == 3000 and not res.rejected
    # time-average number in the system, by sweeping arrival/finish events
    events = sorted([(r.arrival_s, 1) for r in reqs] + [(r.finish_s, -1) for r in reqs])
    area, n, last = 0.0, 0, events[0][0]
    for t, d in events:
        area += n * (t - last)
        n, last = n + d, t
    horizon = events[-1][0] - events[0][0]
    mean_in_system = area / horizon
    mean_latency = np.mean([r.finish_s - r.arrival_s for r in reqs])
    assert mean_in_system == pytest.approx(rate * mean_latency, rel=0.06)


def _max_running(e):
    seen = 0
    for it in e.stats.trace:
        seen = max(seen, it.decode_requests + len(it.prefill_chunks))
    return seen


def test_kv_capacity_makes_requests_wait_not_crash():
    # each request needs 100 + 50 tokens; capacity holds three of them
    e = engine(capacity=3 * 150, admission="reserve_full")
    client = ClosedLoopClient(8, LengthDistribution(100, 50), num_requests=24)
    res = simulate(client, [e], num_gpus=1)
    assert res.metrics.completed_requests == 24 and not res.rejected
    assert _max_running(e) == 3
    free = simulate(ClosedLoopClient(8, LengthDistribution(100, 50), num_requests=24),
                    [engine()], num_gpus=1)
    assert res.metrics.ttft_ms["mean"] > 2 * free.metrics.ttft_ms["mean"]


def test_incremental_kv_preempts_and_everything_finishes():
    e = engine(capacity=4 * 130, admission="incremental")
    client = ClosedLoopClient(8, LengthDistribution(100, 80), num_requests=32)
    res = simulate(client, [e], num_gpus=1)
    assert res.metrics.completed_requests == 32 and not res.rejected
    assert res.metrics.preemptions > 0
    assert e.kv_used == pytest.approx(0.0)


def test_request_larger_than_the_cache_is_rejected_with_a_reason():
    e = engine(capacity=1000)
    client = ClosedLoopClient(2, LengthDistribution(900, 200), num_requests=4)
    res = simulate(client, [e], num_gpus=1)
    assert len(res.rejected) == 4 and res.metrics.completed_requests == 0
    assert "KV tokens" in res.rejected[0].reject_reason


def test_prefill_first_never_mixes_and_inflight_takes_whole_prompts():
    client = ClosedLoopClient(8, LengthDistribution(300, 40, ratio=0.5), num_requests=40, seed=1)
    e = engine(policy="prefill_first", budget=1000, mix=False)
    simulate(client, [e], num_gpus=1)
    assert all(not (it.decode_requests and it.prefill_chunks) for it in e.stats.trace)
    assert any(it.prefill_chunks for it in e.stats.trace)
    client = ClosedLoopClient(8, LengthDistribution(300, 40, ratio=0.5), num_requests=40, seed=1)
    e = engine(policy="inflight", budget=700, chunked=False)
    res = simulate(client, [e], num_gpus=1)
    assert res.metrics.completed_requests == 40
    prompts = {int(r.input_tokens) for r in res.finished}
    for it in e.stats.trace:
        assert all(q in prompts for q in it.prefill_chunks)
        assert sum(it.prefill_chunks) + it.decode_requests <= 700


def test_decode_first_chunks_fill_the_budget_after_decodes():
    client = ClosedLoopClient(8, LengthDistribution(3000, 30), num_requests=16)
    e = engine(budget=1024)
    simulate(client, [e], num_gpus=1)
    for it in e.stats.trace:
        assert it.decode_requests + sum(it.prefill_chunks) <= 1024
    assert max(sum(it.prefill_chunks) for it in e.stats.trace) == 1024


def test_warmup_requests_are_excluded():
    client = ClosedLoopClient(4, LengthDistribution(100, 10), num_requests=12, warmup_requests=8)
    res = simulate(client, [engine()], num_gpus=1)
    assert res.metrics.completed_requests == 12
    assert len(res.finished) == 20


def test_disaggregated_single_request():
    cost_p, cost_d = LinearCost(A, B), LinearCost(2 * A, B)
    client = ClosedLoopClient(1, LengthDistribution(400, 11), num_requests=1)
    res = simulate(client, [engine(cost_p, role="prefill", name="p0")],
                   decode_engines=[engine(cost_d, role="decode", name="d0")],
                   transfer_s=lambda r: 0.003, num_gpus=2)
    m = res.metrics
    assert m.ttft_ms["mean"] == pytest.approx((A + 400 * B + 0.003) * 1e3)
    assert m.tpot_ms["mean"] == pytest.approx((2 * A + B) * 1e3)


def test_disaggregated_closed_loop_finishes_all_requests_on_two_decode_workers():
    client = ClosedLoopClient(12, LengthDistribution(300, 60, ratio=0.8), num_requests=120)
    decoders = [engine(role="decode", name=f"d{i}") for i in range(2)]
    res = simulate(client, [engine(role="prefill", name="p0")], decode_engines=decoders,
                   transfer_s=lambda r: 0.001, num_gpus=3)
    assert res.metrics.completed_requests == 120
    assert all(d.stats.steps > 0 for d in decoders)
    assert all(r.first_token_s >= r.arrival_s for r in res.finished)


@pytest.mark.parametrize("admission", ["incremental", "reserve_full"])
def test_kv_is_fully_released_including_one_token_outputs(admission):
    e = engine(capacity=5000, admission=admission, block=16)
    client = ClosedLoopClient(4, LengthDistribution(300, 2, ratio=0.5), num_requests=40, seed=2)
    res = simulate(client, [e], num_gpus=1)
    assert any(r.output_tokens == 1 for r in res.finished)
    assert res.metrics.completed_requests == 40
    assert e.kv_used == pytest.approx(0.0) and not e.running


def test_first_chunk_overhead_shifts_ttft_only_and_frontend_delays_the_engine():
    """One request: the front-end time is spent before the engine (TTFT and e2e grow by
    it); the first-chunk time only delays the first chunk the client sees, so TTFT grows
    by it, e2e does not, and TPOT = (e2e - TTFT) / (n - 1) shrinks by it / (n - 1)."""
    cost = LinearCost(A, B)
    fe, fc = 0.020, 0.050
    client = ClosedLoopClient(1, LengthDistribution(500, 21), num_requests=1)
    m = simulate(client, [engine(cost)], num_gpus=1, frontend_s=fe, first_chunk_s=fc).metrics
    prefill, decode = A + 500 * B, A + B
    assert m.ttft_ms["mean"] == pytest.approx((fe + prefill + fc) * 1e3)          # 130 ms
    assert m.e2e_ms["mean"] == pytest.approx((fe + prefill + 20 * decode) * 1e3)  # 282 ms
    assert m.tpot_ms["mean"] == pytest.approx((20 * decode - fc) / 20 * 1e3)      # 7.6 ms


def test_first_chunk_overhead_does_not_delay_the_closed_loop():
    """The client issues its next request when the last token arrives, so a first-chunk
    delay leaves the engine's schedule (and the run's throughput) unchanged, while a
    front-end delay of the same size stretches every request's cycle."""
    cost = LinearCost(A, B)

    def run(**kw):
        client = ClosedLoopClient(4, LengthDistribution(100, 30), num_requests=40)
        return simulate(client, [engine(cost)], num_gpus=1, **kw).metrics

    base, chunk, front = run(), run(first_chunk_s=0.05), run(frontend_s=0.05)
    assert chunk.throughput_tokens_per_s == pytest.approx(base.throughput_tokens_per_s)
    assert chunk.ttft_ms["mean"] == pytest.approx(base.ttft_ms["mean"] + 50.0)
    assert front.throughput_tokens_per_s < 0.9 * base.throughput_tokens_per_s


def test_frontend_service_serialises_a_burst_and_hides_at_low_load():
    """Four one-token requests arrive together at a front-end that serves one request at
    a time (30 ms each) behind a 5 ms front-end latency: the engine sees request k at
    30 ms x (k + 1) and prefills it in 20 ms, so TTFT_k = 30 (k + 1) + 20 ms exactly. A
    lone request whose service time fits inside the front-end latency is not delayed."""
    cost = LinearCost(A, B)                       # 100-token prefill: 20 ms
    client = OpenLoopClient(LengthDistribution(100, 1), 4, arrival_times_s=[0.0] * 4)
    res = simulate(client, [engine(cost)], num_gpus=1, frontend_s=0.005,
                   frontend_service_s=0.030)
    ttfts = sorted(r.first_token_s - r.arrival_s for r in res.finished)
    assert ttfts == pytest.approx([0.050, 0.080, 0.110, 0.140])
    # the wait beyond the 5 ms latency is reported: 25, 55, 85, 115 ms
    assert res.metrics.frontend_queue_ms["mean"] == pytest.approx(70.0)

    alone = OpenLoopClient(LengthDistribution(100, 1), 1, arrival_times_s=[0.0])
    m = simulate(alone, [engine(cost)], num_gpus=1, frontend_s=0.005,
                 frontend_service_s=0.004).metrics
    assert m.ttft_ms["mean"] == pytest.approx(25.0)
    assert m.frontend_queue_ms["mean"] == 0.0
