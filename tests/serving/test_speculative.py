"""Speculative decoding: acceptance math, verify and draft costs from the graph builder,
and the effect on TPOT and throughput in closed form."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.core.errors import ConfigError
from perfcast.evidence.costing import cost_graph
from perfcast.evidence.factory import build_resolver
from perfcast.evidence.queries import query_for_task
from perfcast.hardware import load_system
from perfcast.serving.backends import Overheads
from perfcast.serving.requests import ClosedLoopClient, LengthDistribution
from perfcast.serving.simulator import simulate
from perfcast.serving.speculative import (SpeculativeConfig, SpeculativeStepCost,
                                          eagle_draft_spec, expected_accepted,
                                          parse_acceptance, speculative_step)
from perfcast.serving.step_cost import StepCostModel, StepShape
from perfcast.workload import Batch, ParallelPlan, load_model_spec
from perfcast.workload.build import build_task_graph
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.quant import precision_for_model
from tests.serving.fakes import engine

SYSTEM = load_system("h100_sxm")
RESOLVER = build_resolver(SYSTEM, launch_in_kernel_times=False)
NO_OVERHEAD = Overheads(0.0, 0.0, 0.0, 0.0)
QWEN = load_model_spec("Qwen/Qwen3-8B")
TP2 = ParallelPlan(tp=2)


def target(model=QWEN, plan=TP2, interpolate=False) -> StepCostModel:
    return StepCostModel(model, plan, SYSTEM, RESOLVER, overheads=NO_OVERHEAD,
                         interpolate=interpolate)


def graph_s(graph, keep=lambda t: True) -> float:
    """Resolver-costed sum of the graph's tasks (independent of the step model's terms)."""
    costed = cost_graph(graph, SYSTEM.name, RESOLVER)
    return sum(ct.total_latency_s for ct in costed.tasks if keep(ct.task))


# -- acceptance ----------------------------------------------------------------------------------
def test_expected_accepted_is_the_sum_of_prefix_products():
    assert expected_accepted((0.8, 0.5, 0.5)) == pytest.approx(0.8 + 0.4 + 0.2)
    assert expected_accepted((1.0, 1.0, 1.0)) == 3.0
    assert expected_accepted((0.0, 1.0, 1.0)) == 0.0   # draft 1 rejected: nothing after counts


@pytest.mark.parametrize("k,acceptance,tokens", [
    (3, (1.5,), 2.5),              # one number: mean accepted drafts per verify step
    (3, (0.8, 0.5, 0.5), 2.4),     # per-position rates
    (1, (0.7,), 1.7),              # K = 1: mean and rate coincide
    (4, (0.0,), 1.0),
    (4, (4.0,), 5.0),
])
def test_tokens_per_verify_step(k, acceptance, tokens):
    cfg = SpeculativeConfig("mtp", k, acceptance)
    assert cfg.tokens_per_step == pytest.approx(tokens)


def test_acceptance_text_reads_one_number_or_a_list():
    assert parse_acceptance("2.1") == (2.1,)
    assert parse_acceptance("0.9, 0.7,0.5") == (0.9, 0.7, 0.5)
    with pytest.raises(ConfigError, match="acceptance"):
        parse_acceptance("0.9,high")


@pytest.mark.parametrize("kwargs,field", [
    (dict(method="medusa", num_speculative_tokens=2, acceptance=(1.0,)), "speculative"),
    (dict(method="mtp", num_speculative_tokens=0, acceptance=(0.0,)), "num_speculative_tokens"),
    (dict(method="mtp", num_speculative_tokens=65, acceptance=(1.0,)), "num_speculative_tokens"),
    (dict(method="mtp", num_speculative_tokens=3, acceptance=(3.5,)), "acceptance"),
    (dict(method="mtp", num_speculative_tokens=3, acceptance=(-0.1,)), "acceptance"),
    (dict(method="mtp", num_speculative_tokens=2, acceptance=(0.9, 1.2)), "acceptance"),
    (dict(method="mtp", num_speculative_tokens=3, acceptance=(0.9, 0.8)), "acceptance"),
    (dict(method="mtp", num_speculative_tokens=1, acceptance=(1.5,)), "acceptance"),
    (dict(method="eagle", num_speculative_tokens=2, acceptance=(float("nan"),)), "acceptance"),
    (dict(method="mtp", num_speculative_tokens=2, acceptance=(1.0,), draft_model="x.json"),
     "draft_model"),
])
def test_bad_settings_fail_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        SpeculativeConfig(**kwargs)


# -- verify step and drafts against directly costed graphs --------------------------------------
R, CTX = 16, 1500


def test_ngram_verify_step_is_the_target_over_k_plus_1_tokens_per_request():
    """n-gram drafts cost no GPU time; the verify step is the target's graph of R requests
    x (K+1) query tokens over their context with logits for every token."""
    k = 3
    spec = SpeculativeStepCost(target(), SpeculativeConfig("ngram", k, (1.0,)))
    graph = build_task_graph(QWEN, TP2, Batch.decode(R, CTX, query_length=k + 1), logits="all")
    assert spec.draft_s(StepShape(R, CTX)) == 0.0
    assert spec.step_s(StepShape(R, CTX)) == pytest.approx(graph_s(graph), rel=1e-9)


def test_mtp_draft_is_the_models_mtp_module_run_k_times():
    """MiniMax-M2.5 declares MTP modules (GQA + MoE). Pass 1 covers the verify step's
    R x (K+1) tokens, passes 2..K one token per request; each is the graph with the MTP
    module minus the graph without it, plus the embedding lookup the module repeats."""
    model = load_model_spec("MiniMaxAI/MiniMax-M2.5")
    plan = ParallelPlan(tp=8, ep=8)
    k = 3
    spec = SpeculativeStepCost(target(model, plan), SpeculativeConfig("mtp", k, (1.5,)))

    def module(batch):
        with_mtp = build_task_graph(model, plan, batch, mtp_layers=1)
        without = build_task_graph(model, plan, batch)
        return (graph_s(with_mtp) - graph_s(without)
                + graph_s(without, lambda t: t.lineage.startswith("embed.")))

    expected = module(Batch.decode(R, CTX, query_length=k + 1))
    expected += sum(module(Batch.decode(R, CTX + j)) for j in range(1, k))
    assert spec.draft_s(StepShape(R, CTX)) == pytest.approx(expected, rel=1e-9)


def test_mtp_needs_a_model_that_declares_mtp_layers():
    with pytest.raises(ConfigError, match="declares no MTP module"):
        SpeculativeStepCost(target(), SpeculativeConfig("mtp", 2, (1.0,)))


def test_eagle_draft_is_a_one_layer_head_plus_its_fc_projection():
    """EAGLE-1 with K=1: one pass of a one-layer Llama head of the target's width over
    the 2R tokens of the verify step, logits for the R requests, plus `fc` (2h -> h)."""
    cfg = SpeculativeConfig("eagle", 1, (0.6,))
    spec = SpeculativeStepCost(target(), cfg)
    head = eagle_draft_spec(QWEN, cfg)
    assert (head.num_layers, head.hidden_size, head.num_kv_heads) == (1, QWEN.hidden_size,
                                                                      QWEN.num_kv_heads)
    batch = Batch.decode(R, CTX, query_length=2)
    graph = build_task_graph(head, TP2, batch)
    b = GraphBuilder(head, TP2, batch, precision_for_model(head))
    b.gemm("fc", 2 * R, head.hidden_size, 2 * head.hidden_size, weight_shards=1, replicas=2)
    fc_s = sum(RESOLVER.resolve(query_for_task(t, SYSTEM.name)).estimate.latency_s * t.count
               for t in b.tasks)
    assert fc_s > 0
    assert spec.draft_s(StepShape(R, CTX)) == pytest.approx(graph_s(graph) + fc_s, rel=1e-9)


def test_eagle3_head_uses_its_draft_vocabulary(tmp_path):
    """An EAGLE-3 head config with `draft_vocab_size` computes fewer logits: cheaper."""
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLMEagle3"],
           "hidden_size": QWEN.hidden_size, "num_attention_heads": QWEN.num_heads,
           "num_key_value_heads": QWEN.num_kv_heads, "head_dim": QWEN.head_dim,
           "intermediate_size": QWEN.intermediate_size, "num_hidden_layers": 1,
           "vocab_size": QWEN.vocab_size, "torch_dtype": "bfloat16"}
    full = tmp_path / "full.json"
    small = tmp_path / "small.json"
    full.write_text(json.dumps(cfg))
    small.write_text(json.dumps({**cfg, "draft_vocab_size": 32000}))
    shape = StepShape(R, CTX)
    t = target()
    full_s = SpeculativeStepCost(t, SpeculativeConfig("eagle3", 3, (1.0,),
                                                      draft_model=str(full))).draft_s(shape)
    small_s = SpeculativeStepCost(t, SpeculativeConfig("eagle3", 3, (1.0,),
                                                       draft_model=str(small))).draft_s(shape)
    assert 0 < small_s < full_s


def test_draft_layers_add_weights_and_kv_per_token():
    """The EAGLE head's one layer adds 1/36 of Qwen3-8B's per-token KV bytes (same KV
    heads and head dim); n-gram adds nothing."""
    t = target()
    base = t.memory_facts()
    eagle = SpeculativeStepCost(t, SpeculativeConfig("eagle", 2, (1.0,))).memory_facts()
    ngram = SpeculativeStepCost(t, SpeculativeConfig("ngram", 2, (1.0,))).memory_facts()
    per_token = dict(base.kv_bytes_per_token)[0]
    assert dict(eagle.kv_bytes_per_token)[0] == pytest.approx(per_token * (1 + 1 / 36))
    assert eagle.weights > base.weights
    assert ngram == base


def test_no_speculation_keeps_the_step_model():
    t = target()
    assert speculative_step(t, None) is t


def test_interpolated_verify_steps_stay_close_to_exact():
    cfg = SpeculativeConfig("eagle", 3, (1.2,))
    exact = SpeculativeStepCost(target(), cfg)
    interp = SpeculativeStepCost(target(interpolate=True), cfg)
    for shape in (StepShape(37, 1900.0), StepShape(5, 333.0, ((700, 0),)), StepShape(90, 5000.0)):
        assert interp.step_s(shape) == pytest.approx(exact.step_s(shape), rel=0.03)


# -- the engine: tokens per verify step, KV growth, TPOT in closed form ------------------------
C, ISL, OSL = 4, 200, 33   # one wave of C equal requests; 32 tokens after the first


def run(cost, *, osl=OSL, admission="reserve_full", capacity=10**9, requests=C):
    client = ClosedLoopClient(C, LengthDistribution(ISL, osl), num_requests=requests)
    e = engine(cost, admission=admission, capacity=capacity, block=16)
    return simulate(client, [e], num_gpus=2), e


def interp_target():
    return target(interpolate=True)


def test_acceptance_zero_is_slower_by_exactly_the_draft_cost():
    """No draft accepted: one token per iteration as without speculation; each iteration
    pays the verify step's K extra tokens per request (n-gram: verify only) and the draft
    (EAGLE): TPOT(eagle) - TPOT(ngram) = mean draft time of the decode iterations."""
    base = run(interp_target())[0].metrics.tpot_ms["mean"]
    ngram_cost = SpeculativeStepCost(interp_target(), SpeculativeConfig("ngram", 3, (0.0,)))
    eagle_cost = SpeculativeStepCost(interp_target(), SpeculativeConfig("eagle", 3, (0.0,)))
    ngram = run(ngram_cost)[0].metrics.tpot_ms["mean"]
    eagle = run(eagle_cost)[0].metrics.tpot_ms["mean"]
    draft_ms = sum(eagle_cost.draft_s(StepShape(C, ISL + i)) for i in range(OSL - 1)) \
        / (OSL - 1) * 1e3
    assert ngram > base
    assert eagle - ngram == pytest.approx(draft_ms, rel=1e-9)


def test_all_drafts_accepted_emit_k_plus_1_tokens_per_verify_step():
    """Rates 1,1,1 (K=3): every iteration emits 4 tokens per request and the context grows
    by 4, so TPOT = sum of the 8 iteration times / 32 = mean step time / (K+1)."""
    cost = SpeculativeStepCost(interp_target(), SpeculativeConfig("eagle", 3, (1.0, 1.0, 1.0)))
    res, e = run(cost)
    steps = [cost.step_s(StepShape(C, ISL + 4 * i)) for i in range(8)]
    assert res.metrics.tpot_ms["mean"] == pytest.approx(sum(steps) / 32 * 1e3, rel=1e-9)
    assert res.metrics.tpot_ms["mean"] == pytest.approx(np.mean(steps) / 4 * 1e3, rel=1e-9)
    decode_iterations = sum(it.steps for it in e.stats.trace if it.decode_requests)
    assert decode_iterations == 8


def test_fractional_acceptance_rounds_the_last_verify_step_up():
    """2.5 tokens per step: 32 tokens take ceil(32 / 2.5) = 13 iterations."""
    cost = SpeculativeStepCost(interp_target(), SpeculativeConfig("ngram", 3, (1.5,)))
    res, e = run(cost)
    steps = [cost.step_s(StepShape(C, ISL + 2.5 * i)) for i in range(13)]
    assert res.metrics.tpot_ms["mean"] == pytest.approx(sum(steps) / 32 * 1e3, rel=1e-9)


def test_speculation_raises_throughput_when_drafts_are_accepted():
    base = run(interp_target())[0].metrics
    fast = run(SpeculativeStepCost(interp_target(),
                                   SpeculativeConfig("eagle", 3, (0.9, 0.8, 0.7))))[0].metrics
    assert fast.throughput_tokens_per_s > 1.5 * base.throughput_tokens_per_s
    assert fast.tpot_ms["mean"] < base.tpot_ms["mean"] / 1.5


def test_kv_grows_by_the_emitted_tokens_and_is_all_released():
    """Incremental admission under a small cache: requests are preempted and resumed;
    every KV token added (1 + accepted per iteration, K lookahead slots) is freed again."""
    cost = SpeculativeStepCost(interp_target(), SpeculativeConfig("ngram", 4, (2.2,)))
    res, e = run(cost, osl=120, admission="incremental", capacity=700, requests=12)
    assert res.metrics.completed_requests == 12
    assert e.stats.preemptions > 0
    assert e.kv_used == pytest.approx(0.0, abs=1e-6)
    assert all(r.generated == r.output_tokens for r in res.finished)


# -- perfcast serve --------------------------------------------------------------------------
SERVE = ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "4", "--isl", "256", "--osl", "33",
         "--num-requests", "8", "--format", "json"]


def test_serve_speculative_flags_reach_the_json_and_speed_up_decoding():
    runner = CliRunner()
    plain = runner.invoke(app, SERVE)
    spec = runner.invoke(app, SERVE + ["--speculative", "eagle", "--num-speculative-tokens",
                                       "3", "--acceptance", "0.9,0.8,0.7"])
    assert plain.exit_code == 0 and spec.exit_code == 0, spec.output
    p, s = json.loads(plain.stdout), json.loads(spec.stdout)
    assert p["inputs"]["speculative"] is None
    assert s["inputs"]["speculative"]["method"] == "eagle"
    assert s["inputs"]["speculative"]["accepted_tokens_per_step"] == pytest.approx(
        0.9 + 0.72 + 0.504)
    assert s["tpot_ms"]["mean"] < p["tpot_ms"]["mean"]


@pytest.mark.parametrize("extra,message", [
    (["--num-speculative-tokens", "3"], "without --speculative"),
    (["--acceptance", "1.0"], "without --speculative"),
    (["--speculative", "eagle", "--num-speculative-tokens", "2"], "needs the draft length"),
    (["--speculative", "eagle", "--num-speculative-tokens", "2", "--acceptance", "2.5"],
     "outside 0..2"),
    (["--speculative", "mtp", "--num-speculative-tokens", "2", "--acceptance", "1"],
     "declares no MTP module"),
])
def test_serve_speculative_errors_are_clear(extra, message):
    res = CliRunner().invoke(app, SERVE + extra)
    assert res.exit_code != 0
    assert message in res.output


def test_disagg_decode_pool_emits_k_plus_1_tokens_per_verify_step():
    """Disaggregated: the decode engine runs the verify steps. All drafts accepted (K=3):
    32 tokens after the first take 8 decode iterations, and the decode engine's TPOT is
    its 8 step times / 32, as in agg; the prefill engine runs no decode step."""
    cost = SpeculativeStepCost(interp_target(), SpeculativeConfig("eagle", 3, (1.0, 1.0, 1.0)))
    client = ClosedLoopClient(C, LengthDistribution(ISL, OSL), num_requests=C)
    prefill = engine(cost, role="prefill", name="p0", block=16)
    decode = engine(cost, role="decode", name="d0", block=16)
    res = simulate(client, [prefill], decode_engines=[decode], transfer_s=lambda r: 0.0,
                   num_gpus=2)
    assert sum(it.steps for it in decode.stats.trace if it.decode_requests) == 8
    assert not any(it.decode_requests for it in prefill.stats.trace)
    steps = [cost.step_s(StepShape(C, ISL + 4 * i)) for i in range(8)]
    assert res.metrics.tpot_ms["mean"] == pytest.approx(sum(steps) / 32 * 1e3, rel=1e-6)
