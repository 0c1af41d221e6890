"""Family selection, layer patterns, config errors and the estimate CLI flags."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from perfcast.cli.estimate import build_plan
from perfcast.cli.main import app
from perfcast.core.errors import ConfigError, UnsupportedModelError
from perfcast.core.frozen import freeze
from perfcast.workload import Batch, ParallelPlan, build_task_graph, load_model_spec
from perfcast.workload.families.traits import LayerKind, layer_kinds, layer_runs


def with_raw(model_id, **changes):
    m = load_model_spec(model_id)
    raw = {k: v for k, v in {**m.raw, **changes}.items() if v is not ...}
    return replace(m, raw=freeze(raw))


def test_layer_runs_group_by_kind_and_stride():
    dense, moe = LayerKind(None, "dense"), LayerKind(None, "moe")
    kinds = [dense] * 3 + [moe] * 58
    assert layer_runs(kinds, 0, 60) == [(dense, (0, 2, 1)), (moe, (3, 60, 1))]
    s, f = LayerKind(128, "moe"), LayerKind(None, "moe")
    assert layer_runs([s, f] * 18, 0, 35) == [(s, (0, 34, 2)), (f, (1, 35, 2))]
    # a pipeline stage starting mid-pattern
    assert layer_runs([s, f] * 18, 17, 35) == [(f, (17, 35, 2)), (s, (18, 34, 2))]


def test_qwen_moe_layout_fields():
    m = with_raw("Qwen/Qwen3-30B-A3B", mlp_only_layers=[0, 1], decoder_sparse_step=1)
    kinds = layer_kinds(m, moe=True)
    assert [k.ffn for k in kinds[:3]] == ["dense", "dense", "moe"]
    g = build_task_graph(m, ParallelPlan(), Batch.decode(4, 100))
    assert {"L0-1.mlp.gate_up_proj", "L2-47.moe.experts"} <= {t.lineage for t in g.tasks}


@pytest.mark.parametrize("model_type", ["nemotron_h", "deepseek_v4", "bert"])
def test_unsupported_model_type_is_named(model_type):
    m = replace(load_model_spec("Qwen/Qwen3-8B"), model_type=model_type)
    with pytest.raises(UnsupportedModelError, match=f"model_type '{model_type}'"):
        build_task_graph(m, ParallelPlan(), Batch.decode(1, 10))


def test_unknown_layer_type_fails_naming_the_field():
    m = with_raw("openai/gpt-oss-20b", layer_types=["linear_attention"] * 24)
    with pytest.raises(UnsupportedModelError, match="layer_types.*linear_attention"):
        build_task_graph(m, ParallelPlan(), Batch.decode(1, 10))


def test_missing_moe_field_fails_naming_it():
    m = with_raw("mistralai/Mixtral-8x7B-v0.1", num_local_experts=...)
    with pytest.raises(ConfigError, match="n_routed_experts or num_local_experts or num_experts"):
        build_task_graph(m, ParallelPlan(), Batch.decode(1, 10))
    m = with_raw("mistralai/Mixtral-8x7B-v0.1", num_experts_per_tok=9)
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        build_task_graph(m, ParallelPlan(), Batch.decode(1, 10))


def test_minimax_m2_per_layer_qk_norm_and_catalog():
    g = build_task_graph(load_model_spec("MiniMaxAI/MiniMax-M2.5"), ParallelPlan(tp=8),
                         Batch.decode(4, 100))
    qkn = next(t for t in g.tasks if t.group == "attn.qk_norm")
    assert qkn.attributes["weight_params"] == (48 + 8) * 128 / 8  # whole q/k widths, TP split
    assert g.param_count() == pytest.approx(229e9, rel=0.01)


def test_build_plan_num_devices_semantics():
    assert build_plan(2, 1, 0, 8, 0, 8) == ParallelPlan(tp=2, dp=4, ep=8)
    assert build_plan(8, 1, 0, 1, 0, 0) == ParallelPlan(tp=8)
    with pytest.raises(ConfigError, match="--num-devices=8 but tp x dp x pp"):
        build_plan(2, 1, 2, 1, 0, 8)
    with pytest.raises(ConfigError, match="not a multiple"):
        build_plan(3, 1, 0, 1, 0, 8)


def test_moe_dispatch_mode_rules():
    assert ParallelPlan().moe_dispatch_mode == "none"
    assert ParallelPlan(tp=8, ep=8).moe_dispatch_mode == "all_reduce"
    assert ParallelPlan(dp=8, ep=8).moe_dispatch_mode == "all_to_all"
    assert ParallelPlan(tp=2, dp=4, ep=4).moe_dispatch_mode == "all_gather"


def test_cli_estimate_with_ep_and_attention_dp():
    result = CliRunner().invoke(app, [
        "estimate", "deepseek-ai/DeepSeek-V3", "--device", "h200_sxm", "--num-devices", "8",
        "--ep-size", "8", "--num-queries", "64", "--query-length", "1", "--context-length",
        "2048", "--decode", "--kv-cache-dtype", "fp8", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    lineages = {op["lineage"] for op in doc["ops"]}
    assert {"L3-60.moe.experts", "L3-60.moe.dispatch", "L3-60.moe.combine",
            "L0-2.mla.kv_a_proj", "L3-60.mla.core"} <= lineages
    assert doc["precision"]["kv_cache"] == "fp8"


def test_cli_rejects_dtype_with_quant_flags_and_bad_actions():
    runner = CliRunner()
    r = runner.invoke(app, ["estimate", "Qwen/Qwen3-8B", "--dtype", "fp8",
                            "--quantize-linear-action", "FP8"])
    assert r.exit_code != 0 and "--dtype" in r.output
    r = runner.invoke(app, ["estimate", "Qwen/Qwen3-8B", "--quantize-linear-action", "W9A9"])
    assert r.exit_code != 0 and "--quantize-linear-action" in r.output
    r = runner.invoke(app, ["estimate", "mistralai/Mixtral-8x7B-v0.1", "--tp-size", "2",
                            "--ep-size", "3"])
    assert r.exit_code != 0 and "ep_size" in r.output


@pytest.mark.parametrize("model_id", [m for m in __import__(
    "perfcast.workload", fromlist=["builtin_models"]).builtin_models()])
def test_every_builtin_model_builds_on_common_layouts(model_id):
    m = load_model_spec(model_id)
    single = build_task_graph(m, ParallelPlan(), Batch.decode(16, 512))
    assert single.param_count() > 0 and single.memory.kv_cache > 0
    tp = 8 if m.num_heads % 8 == 0 and m.num_kv_heads % 8 == 0 else 1
    g = build_task_graph(m, ParallelPlan(tp=tp), Batch.prefill(2, 256))
    assert g.param_count() == pytest.approx(single.param_count(), rel=1e-9)


def test_hf_quant_config_is_read_beside_a_config_folder(tmp_path):
    from perfcast.workload import builtin_models

    src = load_model_spec("Qwen/Qwen3-8B")
    (tmp_path / "config.json").write_text(json.dumps(dict(src.raw)), encoding="utf-8")
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(
        {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                          "exclude_modules": ["lm_head"]}}), encoding="utf-8")
    g = build_task_graph(load_model_spec(tmp_path), ParallelPlan(), Batch.decode(1, 10))
    assert (g.precision.weight, g.precision.kv_cache) == ("fp8", "fp8")
    (tmp_path / "hf_quant_config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="hf_quant_config.json"):
        load_model_spec(tmp_path)
    assert not [m for m in builtin_models() if "quant_config" in m]


def test_qwen2_moe_shared_expert_with_gate():
    # fields of the published Qwen1.5-MoE-A2.7B config (14.3B total, 2.7B activated)
    from perfcast.workload import model_spec_from_config

    cfg = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"],
           "hidden_size": 2048, "intermediate_size": 5632, "moe_intermediate_size": 1408,
           "shared_expert_intermediate_size": 5632, "num_experts": 60,
           "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_attention_heads": 16,
           "num_key_value_heads": 16, "vocab_size": 151936, "decoder_sparse_step": 1,
           "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    m = model_spec_from_config(cfg, name="qwen1.5-moe-a2.7b")
    g = build_task_graph(m, ParallelPlan(tp=2), Batch.decode(4, 100))
    assert g.param_count() == pytest.approx(14.3e9, rel=0.01)
    assert g.param_count(active=True) == pytest.approx(2.7e9, rel=0.01)
    gate = next(t for t in g.tasks if t.group == "moe.shared_experts.gate")
    assert gate.work.axes["n"] == 1
    up = next(t for t in g.tasks if t.group == "moe.shared_experts.gate_up_proj")
    assert up.work.axes["n"] == 2 * 5632 // 2
