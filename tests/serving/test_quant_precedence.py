"""Which precision a silicon row ran: its labels, unless the device cannot run them."""

from __future__ import annotations

from pathlib import Path

from perfcast.serving.silicon import ModelResolver, load_rules, row_config

CONFIGS = Path(__file__).resolve().parents[3] / "shared" / "reference" / "model_configs"


def config(model: str, system: str, gemm: str, moe: str, precision: str = "fp8"):
    row = {"id": "x", "backend": "trtllm", "backend_version": "1.0.0", "model_path": model,
           "system": system, "precision": precision, "mode": "agg", "isl": "1024",
           "osl": "128", "gemm_quant_mode": gemm, "moe_quant_mode": moe, "batch_size": "8",
           "tp_size": "8", "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "1",
           "moe_ep_size": "8", "silicon_ttft_ms": "1", "silicon_tpot_ms": "1"}
    rules = load_rules()
    cfg, notes = row_config(row, ModelResolver(CONFIGS, rules), rules)
    return cfg.precision, notes


def test_fp4_label_on_fp4_hardware_is_what_ran():
    # DeepSeek-R1's checkpoint is fp8 (block); the row says nvfp4 on a GPU with FP4
    # tensor cores: an NVFP4 checkpoint of that model ran, half the expert bytes
    p, notes = config("deepseek-ai/DeepSeek-R1", "b200_sxm", "nvfp4", "nvfp4", "fp4")
    assert p.linear("moe.experts")[0] == "nvfp4"
    assert p.weight == "nvfp4"
    assert p.kv_cache == "fp8"


def test_fp4_label_on_hopper_falls_back_to_the_checkpoint_and_says_so():
    p, notes = config("openai/gpt-oss-120b", "h100_sxm", "nvfp4", "nvfp4", "fp4")
    assert p.linear("moe.experts")[0] == "mxfp4"     # the checkpoint's experts
    assert any("nvfp4 matrix units" in n and "h100_sxm lacks" in n for n in notes)


def test_label_overrides_an_unquantised_checkpoint():
    p, notes = config("Qwen/Qwen3-32B", "h100_sxm", "fp8", "")
    assert p.weight == "fp8"
    assert "precision from the row's labels: linears fp8" in notes[-1]
    p, _ = config("Qwen/Qwen3-32B", "h100_sxm", "", "", "")
    assert p.weight == "bf16"


def test_label_naming_the_checkpoint_scheme_keeps_its_unquantised_modules():
    plain, _ = config("Qwen/Qwen3-235B-A22B-FP8", "h100_sxm", "", "", "")
    same, notes = config("Qwen/Qwen3-235B-A22B-FP8", "h100_sxm", "fp8_block", "fp8_block")
    assert same.linear_overrides == plain.linear_overrides
    assert (same.weight, same.linear("moe.experts")) == (plain.weight,
                                                         plain.linear("moe.experts"))
    assert not any("instead of the checkpoint" in n for n in notes)


def test_moe_label_applies_to_routed_experts_only():
    p, _ = config("Qwen/Qwen3.5-397B-A17B", "h200_sxm", "fp8", "fp8_block")
    assert p.weight == "fp8"
    assert p.linear("moe.experts")[0] == "fp8_block"


def test_per_tensor_label_on_a_block_fp8_checkpoint_keeps_the_block_scales():
    # fp8 and fp8_block are one weight format; an engine loads the checkpoint's scales
    p, _ = config("Qwen/Qwen3-235B-A22B-FP8", "h200_sxm", "fp8", "fp8")
    plain, _ = config("Qwen/Qwen3-235B-A22B-FP8", "h200_sxm", "", "", "")
    assert p.linear("moe.experts") == plain.linear("moe.experts")
    assert p.weight == plain.weight


def test_aiconfigurator_spellings_of_the_labels_are_read():
    """The labels in AIConfigurator's own vocabulary (sdk/common.py GEMMQuantMode):
    bfloat16 is unquantised, int8_wo int8 weights on bf16 activations, sq (SmoothQuant)
    int8 on int8, fp8_static fp8; an unknown one is refused with the known list."""
    linears = {g: config("Qwen/Qwen3-32B", "a100_sxm", g, "", "")[0].linear("attn.qkv")
               for g in ("bfloat16", "int8_wo", "sq")}
    assert linears == {"bfloat16": ("bf16", "bf16"), "int8_wo": ("int8", "bf16"),
                       "sq": ("int8", "int8")}
    p, _ = config("Qwen/Qwen3-32B", "h100_sxm", "fp8_static", "")
    assert p.linear("attn.qkv") == ("fp8", "fp8")
    import pytest

    from perfcast.serving.silicon import RowError
    with pytest.raises(RowError, match=r"gemm_quant_mode 'fp7' is not modelled \(known: "):
        config("Qwen/Qwen3-32B", "h100_sxm", "fp7", "")
