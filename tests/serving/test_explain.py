"""`serve --explain`: per-request phases add up to TTFT and e2e exactly, closed forms
for a lone request, and the iteration split adds up to the busy time."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.serving.explain import E2E_PHASES, TTFT_PHASES, explain_json, request_phases
from perfcast.serving.requests import ClosedLoopClient, LengthDistribution, OpenLoopClient
from perfcast.serving.simulator import simulate
from tests.serving.fakes import LinearCost, engine

A, B = 0.010, 0.0001


def _check_additive(res):
    assert res.phases is not None
    for r in res.finished:
        ph = request_phases(r, res.phases[r.rid])
        assert sum(ph[k] for k in TTFT_PHASES) == pytest.approx(r.first_token_s - r.arrival_s,
                                                                abs=1e-12)
        assert sum(ph[k] for k in E2E_PHASES) == pytest.approx(r.finish_s - r.arrival_s,
                                                               abs=1e-12)
        assert min(ph.values()) >= -1e-12, ph


def test_lone_request_phases_in_closed_form():
    fe, fc = 0.020, 0.050
    client = ClosedLoopClient(1, LengthDistribution(500, 21), num_requests=1)
    res = simulate(client, [engine(LinearCost(A, B), explain=True)], num_gpus=1,
                   frontend_s=fe, first_chunk_s=fc)
    _check_additive(res)
    doc = explain_json(res.finished, res.phases, res.engines)
    p = {k: v["mean"] for k, v in doc["phases"].items()}
    assert p["frontend"] == pytest.approx(20.0)
    assert p["prefill"] == pytest.approx((A + 500 * B) * 1e3)          # 60 ms
    assert p["first_chunk"] == pytest.approx(50.0)
    assert p["decode"] == pytest.approx(20 * (A + B) * 1e3)            # 202 ms
    for k in ("frontend_queue", "queue", "prefill_waits", "kv_transfer", "decode_queue",
              "decode_waits"):
        assert p[k] == pytest.approx(0.0, abs=1e-9)
    ttft = fe + A + 500 * B + fc
    assert doc["phases"]["first_chunk"]["share_of_ttft"] == pytest.approx(fc / ttft)
    assert doc["phases"]["first_chunk"]["share_of_e2e"] is None        # overlaps decoding
    assert doc["phases"]["decode"]["share_of_ttft"] is None
    # LinearCost's split: the fixed part is host time, the per-token part compute
    split = doc["iterations"]["agg"]
    assert split["host_ms"] == pytest.approx(21 * A * 1e3)
    assert split["compute_ms"] == pytest.approx((500 + 20) * B * 1e3)
    assert split["busy_ms"] == pytest.approx(split["host_ms"] + split["compute_ms"])


def test_queue_and_chunk_waits_are_separated():
    # budget 100, two 150-token prompts at t = 0 (vLLM V1): R0 takes iterations 1-2
    # (100 + 50), R1 starts in iteration 2 (50 tokens), gets 99 in iteration 3 (R0's
    # decode takes one token of budget) and its last token in iteration 4: R1 queue =
    # iteration 1, prefill = iterations 2 + 3 + 4, no waits between its chunks
    client = OpenLoopClient(LengthDistribution(150, 2), 2, arrival_times_s=[0.0, 0.0])
    res = simulate(client, [engine(LinearCost(A, B), budget=100, explain=True)], num_gpus=1)
    _check_additive(res)
    r1 = next(r for r in res.finished if r.rid == 1)
    ph = request_phases(r1, res.phases[1])
    assert ph["queue"] == pytest.approx(A + 100 * B)
    assert ph["prefill"] == pytest.approx((A + 100 * B) + (A + 100 * B) + (A + B))
    assert ph["prefill_waits"] == pytest.approx(0.0, abs=1e-12)
    # SGLang (prefill first, no mixing) runs R1's last 100 tokens alone (iteration 3)
    # while R0, prefilled in iteration 2, waits for its second token
    client = OpenLoopClient(LengthDistribution(150, 3), 2, arrival_times_s=[0.0, 0.0])
    res = simulate(client, [engine(LinearCost(A, B), policy="prefill_first", budget=100,
                                   mix=False, explain=True)], num_gpus=1)
    _check_additive(res)
    r0 = next(r for r in res.finished if r.rid == 0)
    assert request_phases(r0, res.phases[0])["decode_waits"] == pytest.approx(A + 100 * B)


@pytest.mark.parametrize("policy,admission,capacity", [
    ("decode_first", "incremental", 4 * 130), ("prefill_first", "incremental", 4 * 130),
    ("inflight", "reserve_full", 10**9), ("decode_first", "incremental", 10**9)])
def test_phases_add_up_for_every_request(policy, admission, capacity):
    client = ClosedLoopClient(8, LengthDistribution(300, 80, ratio=0.3), num_requests=48,
                              seed=5)
    e = engine(LinearCost(A, B), policy=policy, admission=admission, capacity=capacity,
               budget=256, chunked=True, mix=policy != "prefill_first", explain=True)
    res = simulate(client, [e], num_gpus=1, frontend_s=0.004, first_chunk_s=0.002,
                   frontend_service_s=0.003)
    assert res.metrics.completed_requests == 48
    _check_additive(res)
    doc = explain_json(res.finished, res.phases, res.engines)
    assert doc["ttft_ms"]["mean"] == pytest.approx(res.metrics.ttft_ms["mean"])
    shares = sum(v["share_of_e2e"] for v in doc["phases"].values() if v["share_of_e2e"])
    assert shares == pytest.approx(1.0)
    assert doc["phases"]["frontend_queue"]["mean"] == pytest.approx(
        res.metrics.frontend_queue_ms["mean"])


def test_disaggregated_phases_include_the_kv_transfer():
    client = ClosedLoopClient(6, LengthDistribution(300, 40, ratio=0.5), num_requests=30)
    decoders = [engine(LinearCost(2 * A, B), role="decode", name=f"d{i}", explain=True)
                for i in range(2)]
    res = simulate(client, [engine(LinearCost(A, B), role="prefill", name="p0", explain=True)],
                   decode_engines=decoders, transfer_s=lambda r: 0.003, num_gpus=3)
    _check_additive(res)
    doc = explain_json(res.finished, res.phases, res.engines)
    assert doc["phases"]["kv_transfer"]["mean"] == pytest.approx(3.0)
    assert set(doc["iterations"]) == {"prefill", "decode"}


def test_a_full_decode_worker_delays_the_first_token_not_the_tpot():
    """Disaggregated serving streams the client's tokens from the decode worker, so a
    request whose cache arrives while every running slot is taken gets its first token
    when a slot frees: the wait is in its TTFT (phase decode_queue), not its TPOT.
    Two 200-token prompts at t = 0, 11 output tokens, one decode slot: R0 decodes at
    once; R1's first token comes at the first decode iteration after R0 finished."""
    xfer = 0.002
    client = OpenLoopClient(LengthDistribution(200, 11), 2, arrival_times_s=[0.0, 0.0])
    prefill = engine(LinearCost(A, B), role="prefill", name="p0", explain=True)
    decode = engine(LinearCost(2 * A, B), role="decode", name="d0", max_running=1,
                    explain=True)
    res = simulate(client, [prefill], decode_engines=[decode], transfer_s=lambda r: xfer,
                   num_gpus=2)
    _check_additive(res)
    r0, r1 = sorted(res.finished, key=lambda r: r.rid)
    prefill_both = A + 400 * B           # both prompts in one prefill iteration
    step = 2 * A + B                     # one decode iteration of one request
    assert r0.first_token_s == pytest.approx(prefill_both + xfer)
    assert r0.finish_s == pytest.approx(r0.first_token_s + 10 * step)
    assert r1.first_token_s == pytest.approx(r0.finish_s)
    assert r1.finish_s - r1.first_token_s == pytest.approx(10 * step)   # same TPOT
    ph = request_phases(r1, res.phases[1])
    assert ph["kv_transfer"] == pytest.approx(xfer)
    assert ph["decode_queue"] == pytest.approx(r0.finish_s - (prefill_both + xfer))
    assert request_phases(r0, res.phases[0])["decode_queue"] == pytest.approx(0.0, abs=1e-12)


def test_the_disagg_handoff_delays_the_decode_admission_not_the_tpot():
    """The same two requests with a handoff H: each reaches the decode worker H later
    than its cache, so R0's first token and its end move by H (TPOT unchanged), the
    `handoff` phase holds H and the phases still add up to TTFT and e2e."""
    xfer, handoff = 0.002, 0.150
    runs = []
    for h in (0.0, handoff):
        client = OpenLoopClient(LengthDistribution(200, 11), 2, arrival_times_s=[0.0, 0.0])
        prefill = engine(LinearCost(A, B), role="prefill", name="p0", explain=True)
        decode = engine(LinearCost(2 * A, B), role="decode", name="d0", max_running=1,
                        explain=True)
        runs.append(simulate(client, [prefill], decode_engines=[decode],
                             transfer_s=lambda r: xfer, num_gpus=2, handoff_s=h))
    _check_additive(runs[1])
    (a0, _), (b0, b1) = (sorted(r.finished, key=lambda q: q.rid) for r in runs)
    assert b0.first_token_s == pytest.approx(a0.first_token_s + handoff)
    assert b0.finish_s - b0.first_token_s == pytest.approx(a0.finish_s - a0.first_token_s)
    ph = request_phases(b0, runs[1].phases[0])
    assert ph["kv_transfer"] == pytest.approx(xfer)
    assert ph["handoff"] == pytest.approx(handoff)
    assert ph["decode_queue"] == pytest.approx(0.0, abs=1e-12)
    assert request_phases(b1, runs[1].phases[1])["handoff"] == pytest.approx(handoff)


def test_serve_explain_through_the_cli():
    args = ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "4", "--isl", "256", "--osl", "32"]
    res = CliRunner().invoke(app, [*args, "--format", "json", "--explain"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    ex = m["explain"]
    assert ex["requests"] == m["completed_requests"] == 40
    assert ex["ttft_ms"]["mean"] == pytest.approx(m["ttft_ms"]["mean"])
    assert sum(ex["phases"][k]["mean"] for k in TTFT_PHASES) == pytest.approx(
        m["ttft_ms"]["mean"])
    assert sum(ex["phases"][k]["mean"] for k in E2E_PHASES) == pytest.approx(
        m["e2e_ms"]["mean"])
    split = ex["iterations"]["agg"]
    assert split["compute_ms"] > 0 and split["launch_ms"] > 0
    assert sum(split[f"{k}_ms"] for k in ("compute", "communication", "launch", "host")) == \
        pytest.approx(split["busy_ms"])
    plain = json.loads(CliRunner().invoke(app, [*args, "--format", "json"]).stdout)
    assert "explain" not in plain
    assert plain["ttft_ms"] == m["ttft_ms"]          # recording changes nothing
    table = CliRunner().invoke(app, [*args, "--explain"])
    assert table.exit_code == 0 and "where the time goes" in table.stdout
    assert "prefill_waits" in table.stdout


def test_workbench_figure_stacks_the_phases_of_each_latency():
    from perfcast.workbench.figures import explain_figure

    client = ClosedLoopClient(1, LengthDistribution(500, 21), num_requests=1)
    res = simulate(client, [engine(LinearCost(A, B), explain=True)], num_gpus=1,
                   frontend_s=0.02, first_chunk_s=0.05)
    doc = explain_json(res.finished, res.phases, res.engines)
    fig = explain_figure(doc)
    bars = {t["name"]: dict(zip(t["y"], t["x"])) for t in fig["data"]}
    assert set(bars) == {"frontend", "prefill", "first_chunk", "decode"}   # nonzero phases
    assert sum(b["TTFT"] for b in bars.values()) == pytest.approx(doc["ttft_ms"]["mean"])
    assert sum(b["e2e"] for b in bars.values()) == pytest.approx(doc["e2e_ms"]["mean"])
    assert bars["first_chunk"]["e2e"] == 0.0 and bars["decode"]["TTFT"] == 0.0
