"""Kernel choice by the engine's dispatch rules (evidence/dispatch/*.yaml)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from perfcast.core.errors import ConfigError
from perfcast.evidence.kernel_dispatch import dispatch_rules, parse_rules
from perfcast.workload.model_spec import load_model_spec
from perfcast.workload.quant import precision_for_model

FIXTURE = (Path(__file__).parents[1] / "fixtures" / "aiconfigurator"
           / "vllm_0.24.0_h100_fp8_block_kernels.csv")

VLLM = dispatch_rules("vllm")


def choose(device, fmt, m, n=4096, k=4096, version="0.24.0", model_type=None):
    c = VLLM.choose(version=version, device=device, operation="gemm", weight_format=fmt,
                    m=m, n=n, k=k, model_type=model_type)
    return c.kernel if c else None


def test_every_measured_vllm_fp8_block_row_is_the_kernel_the_rules_choose():
    # AIConfigurator's collector runs vLLM's own linear layer and records the kernel
    # class that served each shape: the rules must reproduce that choice row by row
    rows = list(csv.DictReader(FIXTURE.open()))
    assert {r["kernel_source"] for r in rows} == {
        "FlashInferFp8BlockScaledMMKernel", "DeepGemmFp8BlockScaledMMKernel",
        "CutlassFp8BlockScaledMMKernel"}
    wrong = [r for r in rows if choose("h100_sxm", "fp8_block", int(r["m"]), int(r["n"]),
                                       int(r["k"])) != r["kernel_source"]]
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("model, fmt", [("Qwen/Qwen3-32B-FP8", "fp8_block"),
                                        ("Qwen/Qwen3-32B-FP8-Static-PerTensor", "fp8")])
def test_checkpoint_format_selects_the_kernel_list(model, fmt):
    # HF fp8 with weight_block_size -> the block-scaled list; ModelOpt FP8 -> per-tensor
    assert precision_for_model(load_model_spec(model)).weight == fmt


@pytest.mark.parametrize("device, fmt, m, kernel", [
    # Hopper, block-scaled: FlashInfer's swapAB kernel below 32 rows, DeepGEMM above
    ("h100_sxm", "fp8_block", 8, "FlashInferFp8BlockScaledMMKernel"),
    ("h200_sxm", "fp8_block", 31, "FlashInferFp8BlockScaledMMKernel"),
    ("h200_sxm", "fp8_block", 32, "DeepGemmFp8BlockScaledMMKernel"),
    ("h100_sxm", "fp8_block", 8192, "DeepGemmFp8BlockScaledMMKernel"),
    # Blackwell: FlashInfer's block-scale GEMM is SM90-only, DeepGEMM at every M
    ("b200_sxm", "fp8_block", 8, "DeepGemmFp8BlockScaledMMKernel"),
    ("gb300", "fp8_block", 8192, "DeepGemmFp8BlockScaledMMKernel"),
    # per-tensor fp8: CUTLASS on Hopper, FlashInfer from compute capability 100
    ("h100_sxm", "fp8", 8, "CutlassFP8ScaledMMLinearKernel"),
    ("h100_sxm", "fp8", 8192, "CutlassFP8ScaledMMLinearKernel"),
    ("b200_sxm", "fp8", 8, "FlashInferFP8ScaledMMLinearKernel"),
    ("b200_sxm", "fp8", 8192, "FlashInferFP8ScaledMMLinearKernel"),
])
def test_hopper_and_blackwell_pick_the_engines_kernels(device, fmt, m, kernel):
    assert choose(device, fmt, m) == kernel


@pytest.mark.parametrize("version", ["0.11.2", "0.12.0", "0.15.1"])
def test_before_flashinfer_swapab_was_on_by_default_deepgemm_serves_every_m(version):
    # FlashInfer's SM90 swapAB path existed only behind an opt-in flag: DeepGEMM at every M
    for device, m in (("h200_sxm", 8), ("h200_sxm", 4096), ("b200_sxm", 8)):
        assert choose(device, "fp8_block", m, version=version) == "DeepGemmFp8BlockScaledMMKernel"
    assert choose("h100_sxm", "fp8_block", 8, n=32, version=version) == \
        "CutlassFp8BlockScaledMMKernel"
    assert choose("h100_sxm", "fp8", 8, version=version) == "CutlassFP8ScaledMMLinearKernel"
    assert choose("b200_sxm", "fp8", 8, version=version) is None   # not established


def test_unaligned_shapes_fall_back_to_cutlass_and_blackwell_exclusions_apply():
    assert choose("h100_sxm", "fp8_block", 8, n=32, k=4096) == "CutlassFp8BlockScaledMMKernel"
    assert choose("b200_sxm", "fp8_block", 8, k=64) == "CutlassFp8BlockScaledMMKernel"
    # DeepGEMM's E8M0 accuracy exclusion holds on Blackwell only
    assert choose("b200_sxm", "fp8_block", 4096, model_type="qwen3_5_moe_text") == \
        "CutlassFp8BlockScaledMMKernel"
    assert choose("h100_sxm", "fp8_block", 4096, model_type="qwen3_5_moe_text") == \
        "DeepGemmFp8BlockScaledMMKernel"


def test_choice_names_rule_and_source_and_refuses_to_guess():
    c = VLLM.choose(version="0.24.0", device="h200_sxm", operation="gemm",
                    weight_format="fp8_block", m=4, n=4096, k=4096)
    assert c.rule == "vllm.fp8_block.flashinfer_swapab_small_m"
    assert "flashinfer.py" in c.source and c.kernel in c.describe()
    # a version no rule set covers, a device without a compute capability, unknown formats
    assert choose("h100_sxm", "fp8_block", 8, version="0.16.1") is None
    assert choose("h100_sxm", "fp8_block", 8, version="0.10.2") is None
    why = VLLM.why_not(version="0.16.1", device="h100_sxm", operation="gemm",
                       weight_format="fp8_block")
    assert "no vllm dispatch rules for version 0.16.1" in why and "< 0.16.0" in why
    assert choose("mi300x", "fp8_block", 8) is None
    assert "compute capability of mi300x unknown" in VLLM.why_not(
        version="0.24.0", device="mi300x", operation="gemm", weight_format="fp8_block")
    assert choose("h100_sxm", "int4", 8) is None
    assert dispatch_rules("no-such-engine") is None


def test_rule_files_are_validated():
    doc = {"engine": "x", "rule_sets": [{"versions": {"min": "1.0"}, "versions_source": "s",
           "operations": {"gemm": {"fp8": {"source": "s", "candidates": [
               {"kernel": "K", "rule": "r", "source": "s", "when": {"m_bellow": 3}}]}}}}]}
    with pytest.raises(ConfigError, match="unknown condition 'm_bellow'"):
        parse_rules(doc, {}, "x.yaml")
    doc["rule_sets"][0].pop("versions_source")
    with pytest.raises(ConfigError, match="versions_source"):
        parse_rules(doc, {}, "x.yaml")
