"""Quantisation from checkpoints and from TensorCast-style actions."""

import pytest

from perfcast.core.errors import ConfigError, UnsupportedModelError
from perfcast.workload import Batch, ParallelPlan, build_task_graph, load_model_spec
from perfcast.workload.quant import groups_for_module, precision_for_model


def graph(model_id, precision=None, plan=ParallelPlan(), batch=Batch.decode(8, 1024)):
    return build_task_graph(load_model_spec(model_id), plan, batch, precision)


def task(g, lineage):
    return next(t for t in g.tasks if t.lineage == lineage)


def test_deepseek_fp8_block_weights_and_scales():
    g = graph("deepseek-ai/DeepSeek-V3")
    assert (g.precision.weight, g.precision.linear_activation) == ("fp8_block", "fp8")
    o = task(g, "L3-60.mla.o_proj")
    assert o.operator == "tensor_cast.fp8_linear.default"
    assert o.work.compute_dtype == "fp8"
    k, n = 128 * 128, 7168
    # 1 byte per weight + one fp32 scale per 128x128 block
    assert o.attributes["weight_bytes"] == k * n + k * n / (128 * 128) * 4
    # the router and the LM head stay bf16, as serving engines run them
    assert task(g, "L3-60.moe.router").attributes["weight_dtype"] == "bf16"
    assert task(g, "final.lm_head").operator == "aten.mm.default"
    # routed experts: grouped fp8 GEMM with fp8 activations
    ex = task(g, "L3-60.moe.experts")
    assert (ex.attributes["weight_dtype"], ex.work.compute_dtype) == ("fp8_block", "fp8")


def test_gpt_oss_mxfp4_experts_with_bf16_attention():
    g = graph("openai/gpt-oss-120b")
    ex = task(g, "L0-34:2.moe.experts")  # MoE in every layer; runs follow the windows
    assert ex.operator == "tensor_cast.grouped_matmul_mxfp4.default"
    assert ex.attributes["weight_dtype"] == "mxfp4"
    per_expert = 3 * 2880 * 2880
    # 0.5 byte per weight + one e8m0 scale per 32 weights, biases in bf16
    expected = 128 * (per_expert * 0.5 + per_expert / 32) + 128 * (2 * 2880 + 2880) * 2
    assert ex.attributes["weight_bytes"] == pytest.approx(expected)
    # modules_to_not_convert: model.layers.*.self_attn, router, lm_head
    assert task(g, "L0-34:2.attn.qkv_proj").attributes["weight_dtype"] == "bf16"
    assert task(g, "L1-35:2.moe.router").attributes["weight_dtype"] == "bf16"


def test_modelopt_nvfp4_from_hf_quant_config():
    m = load_model_spec("nvidia/DeepSeek-V3.1-NVFP4")
    assert m.quant_config["quantization"]["quant_algo"] == "NVFP4"
    g = build_task_graph(m, ParallelPlan(), Batch.decode(8, 1024))
    assert g.precision.kv_cache == "fp8"  # kv_cache_quant_algo
    assert task(g, "L3-60.moe.experts").attributes["weight_dtype"] == "nvfp4"
    # exclude_modules lists every layer's MLA projections
    assert task(g, "L3-60.mla.q_b_proj").attributes["weight_dtype"] == "bf16"
    assert g.memory.kv_bytes_per_token == ((0, (512 + 64) * 1 * 61),)


def test_modelopt_fp8_per_tensor_dense():
    g = graph("Qwen/Qwen3-32B-FP8-Static-PerTensor")
    qkv = task(g, "L0-63.attn.qkv_proj")
    assert qkv.attributes["weight_dtype"] == "fp8" and qkv.work.compute_dtype == "fp8"
    assert qkv.attributes["weight_bytes"] == qkv.attributes["weight_params"]  # no block scales
    assert g.precision.kv_cache == "fp8"


def test_linear_actions_override_the_checkpoint():
    m = load_model_spec("deepseek-ai/DeepSeek-V3")
    w8a8 = precision_for_model(m, linear_action="W8A8_DYNAMIC")
    g = build_task_graph(m, ParallelPlan(), Batch.decode(8, 1024), w8a8)
    o = task(g, "L3-60.mla.o_proj")
    assert o.operator == "tensor_cast.static_quant_linear.default"
    assert o.work.compute_dtype == "int8"
    assert task(g, "L3-60.moe.experts").operator == "tensor_cast.grouped_matmul_quant.default"
    w4a16 = precision_for_model(m, linear_action="W4A16")
    o4 = task(build_task_graph(m, ParallelPlan(), Batch.decode(8, 1024), w4a16), "L3-60.mla.o_proj")
    assert o4.work.compute_dtype == "bf16"  # weight-only: dequantised to bf16
    k, n = 16384, 7168
    assert o4.attributes["weight_bytes"] == k * n / 2 + k * n / 128 * 2  # bf16 group scales
    off = precision_for_model(m, linear_action="DISABLED")
    assert (off.weight, off.linear_activation, dict(off.linear_overrides)) == ("bf16", "", {})


def test_attention_action_and_kv_cache_dtype():
    m = load_model_spec("meta-llama/Llama-3.1-8B")
    base = build_task_graph(m, ParallelPlan(), Batch.decode(8, 1024))
    fp8 = build_task_graph(m, ParallelPlan(), Batch.decode(8, 1024),
                           precision_for_model(m, kv_cache_dtype="fp8"))
    assert fp8.memory.kv_cache == base.memory.kv_cache / 2
    int8 = precision_for_model(m, attention_action="INT8")
    assert (int8.attention, int8.kv_cache) == ("int8", "int8")
    with pytest.raises(ConfigError, match="--quantize-linear-action"):
        precision_for_model(m, linear_action="W3A5")
    with pytest.raises(ConfigError, match="--kv-cache-dtype"):
        precision_for_model(m, kv_cache_dtype="nvfp4")


def test_unknown_quant_method_names_the_field():
    from dataclasses import replace

    from perfcast.core.frozen import freeze

    m = load_model_spec("Qwen/Qwen3-8B")
    odd = replace(m, raw=freeze({**m.raw, "quantization_config": {"quant_method": "bitsandbytes"}}))
    with pytest.raises(UnsupportedModelError, match="quantization_config.quant_method"):
        precision_for_model(odd)


@pytest.mark.parametrize("name,groups", [
    ("model.layers.*.self_attn", ("attn", "mla")),
    ("model.layers.3.mlp.gate", ("moe.router",)),
    ("model.layers.3.mlp.gate_proj", ("mlp.gate_up_proj",)),
    ("model.layers.0.self_attn.kv_a_proj_with_mqa", ("mla.kv_a_proj",)),
    ("model.layers.5.mlp.experts.17.down_proj", ("moe.experts",)),
    ("model.layers.5.mlp.shared_experts.down_proj", ("moe.shared_experts",)),
    ("lm_head", ("final.lm_head",)),
    ("model.layers.0.input_layernorm", ()),
])
def test_module_names_map_to_lineage_groups(name, groups):
    assert groups_for_module(name) == groups


def test_quantised_attention_uses_the_quant_operators():
    m = load_model_spec("meta-llama/Llama-3.1-8B")
    g = build_task_graph(m, ParallelPlan(), Batch.decode(2, 100),
                         precision_for_model(m, attention_action="INT8"))
    core = task(g, "L0-31.attn.core")
    assert core.operator == "tensor_cast.attention_quant.default"
    assert core.work.axes["kv_dtype"] == "int8"
    v3 = load_model_spec("deepseek-ai/DeepSeek-V3")
    g = build_task_graph(v3, ParallelPlan(), Batch.decode(2, 100),
                         precision_for_model(v3, attention_action="FP8"))
    assert task(g, "L3-60.mla.core").operator == \
        "tensor_cast.multihead_latent_attention_quant.default"
