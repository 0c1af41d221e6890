"""benchmarks/tensorcast_fidelity.py against the real TensorCast dumps in
tests/fixtures/tensorcast/ (made by benchmarks/tensorcast/dump.py; see docs/profiling.md,
"Comparing with TensorCast")."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "tensorcast"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "tensorcast_fidelity", ROOT / "benchmarks" / "tensorcast_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


fid = _load_benchmark()

# Today's measured match fraction (under the stack the case's --compilation-config implies,
# `stack_for`: `tensorcast`, or `vllm-ascend-0.18` with fusion passes on) minus 0.02 where
# below 1, so it cannot regress; issue 18's target is 0.90. Every case matches every call.
FLOORS = {
    "deepseek_v3_decode_tp16_ep16": 1.0,
    "deepseek_v3_decode_tp8": 1.0,
    "deepseek_v3_decode_w8a8_tp16_ep16": 1.0,  # mlapo_quant, grouped_matmul_quant*
    "deepseek_v3_decode_w8a8_tp8": 1.0,  # mlapo_quant, per-expert static_quant_linear
    "deepseek_v3_prefill_tp16_ep16": 1.0,
    "qwen3_235b_a22b_decode_ep8": 1.0,
    "qwen3_30b_a3b_decode_ep": 1.0,
    "qwen3_30b_a3b_decode_ep_fused": 1.0,  # stack vllm-ascend-0.18 (dispatch_ffn_combine, MC2)
    "qwen3_30b_a3b_decode_tp4": 1.0,
    "qwen3_30b_a3b_decode_w8a8_ep": 1.0,  # W8A8 EP: grouped_matmul_quant*, quantised rows
    "qwen3_30b_a3b_prefill_ep": 1.0,
    "qwen3_32b_decode_tp4": 1.0,
    "qwen3_32b_decode_tp4_mc2": 1.0,  # stack vllm-ascend-0.18 (matmul_all_reduce)
    "qwen3_32b_decode_w8a8_tp4": 1.0,
    "qwen3_32b_prefill_tp4": 1.0,
    "qwen3_8b_decode_ctx1000": 1.0,  # 1,001 tokens a request: block table 3 x 8, 24 cache blocks
    "qwen3_8b_decode_tp1": 1.0,
    "qwen3_8b_decode_w8a8": 1.0,
    "qwen3_8b_decode_w8a8_tp4_mc2": 1.0,  # stack vllm-ascend-0.18 (static_quant_linear_all_reduce)
    "qwen3_8b_prefill_tp1": 1.0,
}


def test_match_counts_a_multiset_by_signature():
    a = ("aten.mm.default", ((8, 4096), (4096, 6144)))
    b = ("tensor_cast.rms_norm.default", ((1, 8, 4096), (4096,)))
    c = ("tensor_cast.add_rms_norm.default", ((8, 4096), (8, 4096), (4096,)))
    tc = [(a, ("fp16", "fp16"), 3), (b, ("fp16", "fp16"), 2)]
    pc = [(a, ("bf16", "bf16"), 1), (a, ("fp16", "fp16"), 1), (c, ("bf16",) * 3, 4)]
    total, matched, matched_dt, tc_left, pc_left = fid.match(tc, pc)
    assert (total, matched, matched_dt) == (5, 2, 1)
    assert dict(tc_left) == {a: 1, b: 2}
    assert dict(pc_left) == {c: 4}


def test_signature_uses_table_inputs_unless_asked_for_all():
    call = {"op": "torch.ops.aten.index.Tensor", "inputs": [[[40960, 128], "float16"]],
            "list_inputs": {"1": [[[8], "int64"]]}, "count": 2}
    assert fid.tc_signature(call) == (("aten.index.Tensor", ((40960, 128),)), ("fp16",))
    assert fid.tc_signature(call, "all") == (
        ("aten.index.Tensor", ((40960, 128), (8,))), ("fp16", "int64"))


def test_view_ops_are_recognised_by_name_without_overload():
    assert fid.is_view("aten.view.default") and fid.is_view("aten.split_with_sizes.default")
    assert fid.is_view("torch.ops.aten.select.int") and fid.is_view("aten._unsafe_view.default")
    assert not fid.is_view("aten.mm.default") and not fid.is_view("aten.add.Tensor")
    assert not fid.is_view("tensor_cast.reshape_and_cache.default")


def test_tensorcast_flags_map_to_perfcast_fields():
    args = ["/m", "--device", "ATLAS_800_A3_752T_128G_DIE", "--num-queries", "8",
            "--query-length", "1", "--context-length", "1024", "--decode", "--tp-size", "4",
            "--ep-size", "4", "--num-devices", "4", "--compile", "--dump-input-shapes"]
    got = fid.perfcast_args(args)
    assert got == {"device": "atlas_800_a3_752t_128g_die", "num_queries": 8, "query_length": 1,
                   "context_length": 1024, "decode": True, "tp_size": 4, "ep_size": 4,
                   "num_devices": 4, "quantize_linear_action": "W8A8_DYNAMIC",
                   "stack": "tensorcast"}


def test_compilation_config_picks_the_stack_that_runs_those_fusions():
    base = ["/m", "--decode", "--tp-size", "4"]
    assert fid.stack_for(base) == ("tensorcast", [])
    both = base + ["--compilation-config", "enable_dispatch_ffn_combine",
                   "enable-matmul-allreduce", "--compile"]
    assert fid.compilation_config(both) == ["enable_dispatch_ffn_combine",
                                            "enable_matmul_allreduce"]
    assert fid.stack_for(both) == ("vllm-ascend-0.18", [])
    mc2 = base + ["--compilation-config", "enable_matmul_allreduce"]
    assert fid.stack_for(mc2) == ("vllm-ascend-0.18", ["dispatch_ffn_combine"])
    with pytest.raises(ValueError, match="no perfcast fusion"):
        fid.stack_for(base + ["--compilation-config", "enable_multistream"])


CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def test_every_fixture_case_has_a_floor():
    assert CASES, "no TensorCast fixtures"
    assert sorted(FLOORS) == CASES


@pytest.mark.parametrize("case", CASES)
def test_fixture_is_a_whole_tensorcast_run(case):
    doc = json.loads((FIXTURES / f"{case}.json").read_text())
    prov = doc["provenance"]
    assert len(prov["msmodeling_commit"]) == 40 and prov["versions"]["torch"].startswith("2.13")
    assert "--compile" in prov["tensorcast_args"]
    assert sum(c["count"] for c in doc["calls"]) == doc["totals"]["calls"]
    flops = sum((c["mma_ops"] + c["gp_ops"]) * c["count"] for c in doc["calls"])
    assert flops == doc["totals"]["flops_per_device"]


@pytest.mark.parametrize("inputs", ["table", "all"])
@pytest.mark.parametrize("case", CASES)
def test_match_fraction_does_not_regress(case, inputs):
    # "all": the tensors of list arguments too (indices, per-expert rows and weights)
    rec = fid.compare(fid.load_fixture(FIXTURES / f"{case}.json"), inputs=inputs)
    assert rec["matched"] <= rec["tensorcast_calls"]
    assert rec["fraction"] >= FLOORS[case], (rec["fraction"], rec["unmatched"][:3])
