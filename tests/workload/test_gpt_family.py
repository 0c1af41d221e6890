"""GPT-style families (gpt2, gpt_neox, gpt_bigcode): config spellings, parameters counted
by hand, learned vs rotary positions, multi-query attention, parallel residual."""

from __future__ import annotations

import pytest

from perfcast.core.errors import UnsupportedModelError
from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.workload import Batch, ParallelPlan, build_task_graph, model_spec_from_config

# GPT-2 small as published (HF gpt2 config.json fields)
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
        "vocab_size": 50257, "activation_function": "gelu_new"}


def test_gpt2_config_spelling_and_hand_counted_parameters():
    m = model_spec_from_config(GPT2)
    assert (m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size) == (768, 12, 12, 3072)
    assert m.tie_word_embeddings  # GPT2Config's default
    h, L, V, P = 768, 12, 50257, 1024
    # per layer: qkv 3h^2 + o h^2 + MLP 8h^2, two LayerNorms of 2h; tables V h and P h;
    # final LayerNorm 2h (linear biases are not counted: 0.08M of GPT-2 small's 124.4M)
    expected = L * (12 * h * h + 4 * h) + V * h + P * h + 2 * h
    g = build_task_graph(m, ParallelPlan(), Batch.prefill(1, 128))
    assert g.param_count() == expected
    groups = {t.group for t in g.tasks}
    assert "embed.position_add" in groups and "attn.rope" not in groups
    assert {t.operator for t in g.tasks if t.operation == "norm"} == {
        "tensor_cast.add_layer_norm.default"}


def test_gpt_bigcode_multi_query_has_one_kv_head():
    m = model_spec_from_config({**GPT2, "model_type": "gpt_bigcode", "multi_query": True})
    assert m.num_kv_heads == 1
    g = build_task_graph(m, ParallelPlan(), Batch.prefill(1, 128))
    qkv = next(t for t in g.tasks if t.group == "attn.qkv_proj")
    assert qkv.work.axes["n"] == 768 + 2 * 64


def test_gpt_neox_rotary_parallel_residual_untied_head():
    m = model_spec_from_config({"model_type": "gpt_neox", "hidden_size": 512,
                                "num_hidden_layers": 2, "num_attention_heads": 8,
                                "intermediate_size": 2048, "vocab_size": 1000,
                                "hidden_act": "gelu", "rotary_pct": 0.25,
                                "use_parallel_residual": True})
    g = build_task_graph(m, ParallelPlan(tp=2), Batch.prefill(2, 64))
    by = {t.group: t for t in g.tasks}
    assert "attn.rope" in by and "embed.position_add" not in by
    # the MLP's norm reads the layer input, not the attention output
    assert by["mlp.post_attn_norm"].deps == by["attn.input_norm"].deps
    assert by["final.lm_head"].attributes["weight_params"] == 500 * 512  # untied, vocab/tp


def test_inference_estimate_runs_on_a_catalog_gpt_and_refuses_other_activations():
    r = estimate_step(EstimateRequest(model="megatron/gpt-1.7b", device="h100_sxm",
                                      batch=Batch.prefill(1, 512)))
    assert r.latency_s > 0
    with pytest.raises(UnsupportedModelError, match="activation_function|hidden_act"):
        build_task_graph(model_spec_from_config({**GPT2, "activation_function": "relu"}),
                         ParallelPlan(), Batch.prefill(1, 16))
