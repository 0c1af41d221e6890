"""Engine policies against hand-worked iteration sequences: the same arrivals give a
different sequence of iterations under each engine family's rules (linear step cost
a + b x tokens; every expected sequence below is worked out in the comments)."""

from __future__ import annotations

import pytest

from perfcast.core.errors import ConfigError
from perfcast.serving.backends import Admission, Policy, SchedulerConfig
from perfcast.serving.engines import (POLICY_CLASSES, CapacitySchedulerPolicy, SGLangPolicy,
                                      TRTLLMPolicy, VLLMV1Policy)
from perfcast.serving.engines.base import Iteration
from perfcast.serving.requests import LengthDistribution, OpenLoopClient, Request
from perfcast.serving.simulator import simulate
from tests.serving.fakes import LinearCost, engine

A, B = 0.010, 0.0001


class _Two(OpenLoopClient):
    """Requests with given (prompt, output) lengths, all arriving at t = 0."""

    def __init__(self, lengths):
        super().__init__(LengthDistribution(1, 1), len(lengths),
                         arrival_times_s=[0.0] * len(lengths))
        self.lengths = lengths

    def initial(self):
        return [Request(i, 0.0, p, o) for i, (p, o) in enumerate(self.lengths)]


def _sequence(e):
    return [(it.decode_requests, it.prefill_chunks, it.steps) for it in e.stats.trace]


def _run(lengths, **kw):
    e = engine(LinearCost(A, B), **kw)
    res = simulate(_Two(lengths), [e], num_gpus=1)
    assert res.metrics.completed_requests == len(lengths)
    return e, {r.rid: r for r in res.finished}


def test_policy_objects_per_engine_family():
    assert POLICY_CLASSES == {Policy.DECODE_FIRST: VLLMV1Policy,
                              Policy.PREFILL_FIRST: SGLangPolicy,
                              Policy.INFLIGHT: TRTLLMPolicy}
    assert isinstance(engine(policy="inflight").policy, TRTLLMPolicy)
    assert SchedulerConfig(policy="prefill_first").policy is Policy.PREFILL_FIRST
    with pytest.raises(ConfigError, match="unknown scheduler policy"):
        SchedulerConfig(policy="fastest")


# Two requests at t = 0: prompts 150 and 60 tokens, 3 output tokens each; token budget
# 100, KV blocks of 32 tokens, KV capacity unbounded.
LENGTHS = [(150, 3), (60, 3)]


def test_vllm_v1_decodes_first_then_the_running_chunk_then_new_requests():
    # 1: R0's first 100 tokens. 2: R0's last 50, then R1 cut to the 50 left.
    # 3: R0 decodes (1 token of budget), R1's last 10 tokens. 4: both decode, R0 ends.
    # 5: R1 decodes its last token.
    e, reqs = _run(LENGTHS, policy="decode_first", budget=100, block=32)
    assert _sequence(e) == [(0, (100,), 1), (0, (50, 50), 1), (1, (10,), 1),
                            (2, (), 1), (1, (), 1)]
    it1, it2, it3 = A + 100 * B, A + 100 * B, A + 11 * B
    assert reqs[0].first_token_s == pytest.approx(it1 + it2)
    assert reqs[1].first_token_s == pytest.approx(it1 + it2 + it3)


def test_sglang_prefill_first_runs_the_last_chunk_alone():
    # 1, 2 as vLLM; 3: R1's last 10 tokens alone (a prefill batch runs without the
    # decodes); then one run of 2 decode iterations of both requests.
    e, reqs = _run(LENGTHS, policy="prefill_first", budget=100, block=32, mix=False)
    assert _sequence(e) == [(0, (100,), 1), (0, (50, 50), 1), (0, (10,), 1), (2, (), 2)]
    assert reqs[1].first_token_s == pytest.approx(3 * A + 210 * B)
    # R0's second token waits behind R1's chunk: it comes with the decode run's first step
    assert reqs[0].finish_s == pytest.approx(3 * A + 210 * B + 2 * (A + 2 * B))


def test_sglang_mixed_chunk_lets_decodes_ride_along():
    # enable_mixed_chunk: iteration 3 carries R0's decode and R1's 10 tokens (budget
    # 100 - 1 running request), as vLLM does
    e, _ = _run(LENGTHS, policy="prefill_first", budget=100, block=32, mix=False,
                mixed_chunk=True)
    assert _sequence(e)[:3] == [(0, (100,), 1), (0, (50, 50), 1), (1, (10,), 1)]


def test_trtllm_chunked_context_cuts_chunks_to_whole_kv_blocks():
    # enable_chunked_context, chunk unit = tokens_per_block 32:
    # 1: R0 gets 96 (3 blocks; 4 tokens left, R1 cannot take a whole block);
    # 2: R0's last 54 (it finishes the prompt) and 32 of R1 (14 left, under a block);
    # 3: R0 decodes, R1's last 28; 4: both decode, R0 ends; 5: R1 ends.
    e, reqs = _run(LENGTHS, policy="inflight", budget=100, block=32, chunked=True)
    assert _sequence(e) == [(0, (96,), 1), (0, (54, 32), 1), (1, (28,), 1),
                            (2, (), 1), (1, (), 1)]
    assert reqs[0].first_token_s == pytest.approx(2 * A + (96 + 54 + 32) * B)


def test_trtllm_without_chunked_context_takes_whole_prompts_only():
    # the 150-token prompt never fits a 100-token budget whole: rejected with a reason;
    # with budget 160: 1: R0 whole (150, R1's 60 does not fit the 10 left);
    # 2: R0 decodes + R1 whole; 3: both decode, R0 ends; 4: R1 ends
    e = engine(LinearCost(A, B), policy="inflight", budget=100, chunked=False)
    res = simulate(_Two(LENGTHS), [e], num_gpus=1)
    assert [r.rid for r in res.rejected] == [0] and "without chunked prefill" in \
        res.rejected[0].reject_reason
    e, _ = _run(LENGTHS, policy="inflight", budget=160, chunked=False)
    assert _sequence(e) == [(0, (150,), 1), (1, (60,), 1), (2, (), 1), (1, (), 1)]


# KV capacity 250 tokens (blocks of 1), two requests of 100 prompt + 50 output tokens.
CAPACITY_LENGTHS = [(100, 50), (100, 50)]


def test_trtllm_guaranteed_no_evict_waits_for_the_whole_output():
    # each request reserves 150 tokens: R1 waits until R0 has finished
    admission = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT.admission
    assert admission is Admission.RESERVE_FULL
    e, _ = _run(CAPACITY_LENGTHS, policy="inflight", capacity=250, admission=admission)
    assert e.policy.capacity_policy is CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    assert _sequence(e) == [(0, (100,), 1), (1, (), 49), (0, (100,), 1), (1, (), 49)]
    assert e.stats.preemptions == 0


def test_trtllm_max_utilization_admits_both_then_pauses_the_newest():
    # both prompts fit (200 of 250); 25 decode steps fill the cache (2 tokens a step);
    # R1 (the newest) is paused: its 100 + 25 tokens are freed and R1 (26 tokens
    # generated) must recompute 126 tokens; R0 decodes its last 24 tokens alone, then
    # R1's 126-token context, then R1's last 23 tokens.
    admission = CapacitySchedulerPolicy.MAX_UTILIZATION.admission
    e, reqs = _run(CAPACITY_LENGTHS, policy="inflight", capacity=250, admission=admission)
    assert e.policy.capacity_policy is CapacitySchedulerPolicy.MAX_UTILIZATION
    assert _sequence(e) == [(0, (100, 100), 1), (2, (), 25), (1, (), 24), (0, (126,), 1),
                            (1, (), 23)]
    assert e.stats.preemptions == 1 and reqs[1].preemptions == 1


def test_sglang_conservativeness_reserves_future_decode_tokens():
    # capacity 400: prompts 100 + 100 fit, but with schedule_conservativeness 1 R0's
    # admission reserves min(200, 4096) output tokens and R1's check needs
    # 100 + 100 + 200 (R0 in the same batch) + 200 > 400; while R0 decodes, R1 needs
    # (100 + g) + 100 + 0.7... x (200 - g - 1) + 200 > 400 for every g: it waits for R0.
    lengths = [(100, 200), (100, 200)]
    e, _ = _run(lengths, policy="prefill_first", capacity=400, admission="incremental",
                conservativeness=1.0, mix=False)
    assert _sequence(e) == [(0, (100,), 1), (1, (), 199), (0, (100,), 1), (1, (), 199)]
    e, _ = _run(lengths, policy="prefill_first", capacity=400, admission="incremental",
                conservativeness=0.0, mix=False)
    assert _sequence(e)[0] == (0, (100, 100), 1)    # off: admission on the prompt alone


def test_sglang_reservation_from_the_decode_heap_equals_the_sum_over_running(monkeypatch):
    # the heap-keyed sum must equal min(remaining, 4096) summed over every running
    # request outside the batch, at every admission check of a run that queues, chunks,
    # decodes long outputs (> 4096 tokens left) and preempts
    checks = []
    fast = SGLangPolicy._running_clipped_remaining

    def checked(self):
        got = fast(self)
        batch = {id(r) for r in self._batch}
        want = sum(min(self._remaining(r), 4096) for r in self.engine.running.values()
                   if id(r) not in batch)
        checks.append((got, want))
        return got

    monkeypatch.setattr(SGLangPolicy, "_running_clipped_remaining", checked)
    lengths = [(300 + 37 * i, 5000 if i % 3 == 0 else 150 + 11 * i) for i in range(12)]
    e, _ = _run(lengths, policy="prefill_first", capacity=9000, admission="incremental",
                conservativeness=1.0, budget=2048)
    assert len(checks) > 10 and any(w > 0 for _, w in checks) and e.stats.preemptions
    assert [g for g, _ in checks] == [w for _, w in checks]


def test_sglang_new_token_ratio_decays_resets_and_follows_retraction():
    e = engine(policy="prefill_first", conservativeness=2.0)
    p = e.policy
    assert p.ratio == pytest.approx(1.0)                 # min(0.7 x 2, 1)
    assert p.min_ratio == pytest.approx(0.14)
    p.on_iteration(Iteration(0.0, 1.0, 300, 8, (), 1.0, 0.0, 0.0, 0.0))
    assert p.ratio == pytest.approx(1.0 - 300 * (1.0 - 0.14) / 600)
    p.on_iteration(Iteration(0.0, 1.0, 10_000, 8, (), 1.0, 0.0, 0.0, 0.0))
    assert p.ratio == pytest.approx(0.14)                # floor
    p.on_idle()
    assert p.ratio == pytest.approx(1.0)
    # retraction: (decoded + 20 x running) / max new tokens of the survivors
    r = Request(0, 0.0, 10, 400)
    r.generated = 30
    e.running[0] = r
    p.on_preempt()
    assert p.ratio == pytest.approx((30 + 20) / 400)


def test_iteration_records_are_typed_and_split_adds_up():
    e, _ = _run(LENGTHS, policy="decode_first", budget=100, block=32)
    it = e.stats.trace[0]
    assert isinstance(it, Iteration) and it.kind == "prefill"
    assert [i.kind for i in e.stats.trace] == ["prefill", "prefill", "mixed", "decode",
                                               "decode"]
    for i in e.stats.trace:
        assert i.compute_s + i.communication_s + i.launch_s + i.host_s == pytest.approx(
            i.duration_s)


def test_engine_family_options_through_the_cli():
    import json

    from typer.testing import CliRunner

    from perfcast.cli.main import app

    base = ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "4", "--isl", "128", "--osl", "8",
            "--format", "json"]
    res = CliRunner().invoke(app, [*base, "--backend", "trtllm", "--capacity-scheduler-policy",
                                   "MAX_UTILIZATION"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["inputs"]["scheduler"]["kv_admission"] == "incremental"
    res = CliRunner().invoke(app, [*base, "--backend", "sglang", "--schedule-conservativeness",
                                   "1.0", "--enable-mixed-chunk"])
    assert res.exit_code == 0, res.output
    sched = json.loads(res.stdout)["inputs"]["scheduler"]
    assert sched["schedule_conservativeness"] == 1.0 and sched["enable_mixed_chunk"] is True
    res = CliRunner().invoke(app, [*base, "--backend", "trtllm", "--attention-dp-balance"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["inputs"]["scheduler"]["attention_dp_balance"] is True
    res = CliRunner().invoke(app, [*base, "--backend", "vllm", "--enable-mixed-chunk"])
    assert res.exit_code == 2 and "prefill_first" in res.output
    res = CliRunner().invoke(app, [*base, "--backend", "trtllm", "--capacity-scheduler-policy",
                                   "FASTEST"])
    assert res.exit_code == 2 and "GUARANTEED_NO_EVICT" in res.output


class _DP2(LinearCost):
    dp = 2     # two attention-DP ranks stepping together


def _arrivals(spec):
    class _At(OpenLoopClient):
        def __init__(self):
            super().__init__(LengthDistribution(1, 1), len(spec),
                             arrival_times_s=[t for t, _, _ in spec])

        def initial(self):
            return [Request(i, t, p, o) for i, (t, p, o) in enumerate(spec)]
    return _At()


def _adp_engine(balance):
    e = engine(_DP2(A, B), policy="inflight", chunked=False)
    e.sched = SchedulerConfig(policy="inflight", token_budget=100_000, chunked_prefill=False,
                              attention_dp_balance=balance, attention_dp_timeout_iters=5,
                              attention_dp_batching_wait_iters=3)
    e.policy = TRTLLMPolicy(e)
    e._records = True
    return e


def test_trtllm_attention_dp_balance_holds_a_lone_context_until_the_timeout():
    # dp 2; R0, R1 (100 + 100 tokens) at t = 0, R2 (100 + 5) at 50 ms.
    # 1: R0 + R1 prefill (0 ms - 30 ms); 2: two decode steps of 10.2 ms start before
    # R2 arrives; then R2 is one context for two ranks while both ranks generate: held
    # for timeout_iters - 1 = 4 decode iterations, then it runs with the decodes.
    spec = [(0.0, 100, 100), (0.0, 100, 100), (0.05, 100, 5)]
    e = _adp_engine(True)
    simulate(_arrivals(spec), [e], num_gpus=2)
    assert _sequence(e)[:4] == [(0, (100, 100), 1), (2, (), 2), (2, (), 4), (2, (100,), 1)]
    e = _adp_engine(False)
    simulate(_arrivals(spec), [e], num_gpus=2)
    assert _sequence(e)[:3] == [(0, (100, 100), 1), (2, (), 2), (2, (100,), 1)]


def test_trtllm_attention_dp_balance_batches_contexts_for_a_few_iterations():
    # two contexts (one per rank) at 50 ms while both ranks generate: they wait
    # batching_wait_iters = 3 iterations, then run together with the decodes
    spec = [(0.0, 100, 100), (0.0, 100, 100), (0.05, 100, 5), (0.05, 100, 5)]
    e = _adp_engine(True)
    simulate(_arrivals(spec), [e], num_gpus=2)
    assert _sequence(e)[:4] == [(0, (100, 100), 1), (2, (), 2), (2, (), 3),
                                (2, (100, 100), 1)]
