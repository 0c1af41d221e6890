"""perfcast's estimate of a TensorCast step against a database holding one row per
kernel call of that TensorCast run (real CANN 8.5 mapping, real CSV format; rows built
from TensorCast's calls by `tensorcast_database.py`, never from perfcast's graph)."""

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from tensorcast_database import (
    TENSORCAST,
    fractal_nz,
    rows_for_call,
    run_flags,
    topology_tier,
    unanswerable_calls,
    write_database,
)

from perfcast.cli.estimate import EstimateArgs, run_estimate

ROOT = Path(__file__).resolve().parents[2]
CASES = ["qwen3_8b_decode_tp1", "qwen3_8b_prefill_tp1", "qwen3_32b_decode_tp4",
         "qwen3_8b_decode_w8a8",
         # vLLM-Ascend's MC2 fusion (matmul + all-reduce as one composite call)
         "qwen3_32b_decode_tp4_mc2", "qwen3_8b_decode_w8a8_tp4_mc2",
         # MoE: routed experts as grouped matmuls over per-expert pieces (EP), as one
         # matmul per expert (EP1), and as vLLM-Ascend's DispatchFFNCombine
         "qwen3_30b_a3b_decode_ep", "qwen3_30b_a3b_prefill_ep", "qwen3_30b_a3b_decode_tp4",
         "qwen3_235b_a22b_decode_ep8", "qwen3_30b_a3b_decode_ep_fused",
         # W8A8 MoE: quantised rows into grouped_matmul_quant(_swiglu)
         "qwen3_30b_a3b_decode_w8a8_ep"]
# Operators a case may still miss: the calls no database under the real mapping answers
# (`unanswerable_calls`), documented in docs/profiling.md ("A database of TensorCast's own
# calls"): the RoPE tables' gathers, for which the mapping says the NPU runs no Index
# kernel (rule R7 of the generator), and the max and exp of the Qwen3-MoE router's
# softmax (TensorCast's compile decomposes it; the mapping lists no entry for them).
# M1 >= 98% / M5 >= 99% where those calls leave room for it; below that, every call the
# mapping can answer must hit.
M1_FLOOR, M5_FLOOR = 0.98, 0.99


def _fidelity():
    spec = importlib.util.spec_from_file_location(
        "tensorcast_fidelity", ROOT / "benchmarks" / "tensorcast_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


fid = _fidelity()


def estimate(case: str, db: Path, **override):
    """perfcast's estimate of the TensorCast run's step (its flags mapped one to one)."""
    doc = fid.load_fixture(TENSORCAST / f"{case}.json")
    args = {**fid.perfcast_args(doc.tensorcast_args), **override}
    return run_estimate(EstimateArgs(model=doc.model, performance_model=["profiling"],
                                     profiling_database=str(db), **args))


@pytest.mark.parametrize("case", CASES)
def test_tensorcast_step_hits_its_own_kernel_rows(case, tmp_path):
    db = write_database(case, tmp_path)
    run = estimate(case, db)
    m = run.metrics
    total = m["m1"]["m1_total"]
    unanswerable = unanswerable_calls(case)
    ceiling = 1 - sum(unanswerable.values()) / total
    assert m["m1"]["m1_raw_op_count_hr"] >= min(M1_FLOOR, ceiling - 1e-9), (m["m1"], ceiling)
    if ceiling >= M1_FLOOR:
        assert m["m5"]["m5_simulated_latency_coverage"] >= M5_FLOOR, m["m5"]
    missed: dict[str, int] = {}
    for r in m["misses"]:
        assert r["reason"] in ("csv_not_found", "shape_mismatch", "unmapped"), r
        missed[r["func_name"]] = missed.get(r["func_name"], 0) + r["count"]
    assert missed == unanswerable
    # every row of the database answers some call: nothing in it is unreachable
    used = {rid for ct in run.results["profiling"].costed.tasks
            for rid in ct.resolution.estimate.raw_record_ids}
    rows = set()
    for p in sorted(db.glob("*.csv")) + sorted((db / "../../hccl/v8.5").resolve().glob("*.csv")):
        with open(p) as f:
            rows |= {f"{p.stem}.csv#{i}" for i, _ in enumerate(csv.DictReader(f))}
    assert rows and rows <= used, sorted(rows - used)


def test_another_step_does_not_hit_these_rows(tmp_path):
    db = write_database("qwen3_8b_decode_tp1", tmp_path)
    run = estimate("qwen3_8b_decode_tp1", db, num_queries=24)
    m = run.metrics
    # 24 tokens are neither the 8 the rows hold nor 8 padded to a tile (16, 32, 64)
    hits = {r.task.operator for r in run.results["profiling"].costed.tasks
            if r.resolution.estimate.provider == "profiling"}
    assert hits == set() and m["m1"]["m1_hit"] == 0, hits


def _call(case, op, nth=0):
    doc = json.loads((TENSORCAST / f"{case}.json").read_text())
    return [c for c in doc["calls"] if c["op"].removeprefix("torch.ops.") == op][nth], \
        run_flags(doc["provenance"]["tensorcast_args"])


@pytest.fixture(scope="module")
def mapping():
    import yaml
    from tensorcast_database import REAL_MAPPING
    return yaml.safe_load(REAL_MAPPING.read_text())["operator_mappings"]


def test_generator_rules_on_real_calls(mapping):
    # R5 RoPE: TensorCast passes (k [1,kv,T,d], q [1,heads,T,d], cos, sin); its
    # normaliser swaps them into the kernel's (B,S,H,D) slots
    call, flags = _call("qwen3_32b_decode_tp4", "tensor_cast.apply_rope.default")
    [(kernel, comm, row)] = rows_for_call(call, mapping, flags)
    assert (kernel, comm) == ("_triton_rope", False)
    assert row["Input Shapes"] == "8,16,128;8,2,128;8,128"
    assert row["Input Data Types"] == "DT_BF16;FLOAT;DT_BF16"
    # R5 + R6 reshape_and_cache on a decode step: the Triton variant, 5 CSV inputs
    call, flags = _call("qwen3_32b_decode_tp4", "tensor_cast.reshape_and_cache.default")
    [(kernel, _, row)] = rows_for_call(call, mapping, flags)
    assert kernel == "reshape_and_cache_200000000"
    assert row["Input Shapes"] == "8,1,256;8,1,256;65,128,2,128;65,128,2,128;8"
    # R5 quantised linear: x, the int8 weight in FRACTAL_NZ, then the kernel's two scales
    call, flags = _call("qwen3_8b_decode_w8a8", "tensor_cast.static_quant_linear.default")
    [(kernel, _, row)] = rows_for_call(call, mapping, flags)
    assert kernel == "QuantBatchMatmulV3"
    assert row["Input Shapes"] == "8,4096;192,256,16,32;6144;6144"
    assert row["Input Formats"] == "ND;FRACTAL_NZ;ND;ND"
    assert fractal_nz((4096, 6144), "bfloat16") == (256, 384, 16, 16)
    # R5 kernel_types_by_input_rank: a rank-3 dynamic quantise goes to AscendQuantV2
    call, flags = _call("qwen3_8b_decode_w8a8", "tensor_cast.dynamic_quantize_symmetric.default", 1)
    [(kernel, _, row)] = rows_for_call(call, mapping, flags)
    assert (kernel, row["Input Shapes"]) == ("AscendQuantV2", "8,12288;12288;12288")
    # R1: message bytes of the first tensor, TP group, TensorCast's tier on the A3 grid
    call, flags = _call("qwen3_32b_decode_tp4", "tensor_cast.all_reduce.default")
    [(kernel, comm, row)] = rows_for_call(call, mapping, flags)
    assert (kernel, comm, row["message_bytes"], row["num_devices"], row["topology_tier"]) == \
        ("hcom_allReduce_", True, 8 * 5120 * 2, 4, 1)
    assert topology_tier(range(2)) == 2 and topology_tier(range(16)) == 1 and \
        topology_tier(range(32)) == 0
    # R2: q (T, heads*d) as (T, heads, d), avg_seq_len = context + query length
    call, flags = _call("qwen3_8b_decode_tp1", "tensor_cast.attention.default")
    [(kernel, _, row)] = rows_for_call(call, mapping, flags)
    assert row["Input Shapes"].startswith("8,32,128;65,128,8,128") and row["avg_seq_len"] == 1025
    # R7: the RoPE table gather has no NPU kernel; the prefill's last-position gather does
    call, flags = _call("qwen3_8b_decode_tp1", "aten.index.Tensor")
    assert rows_for_call(call, mapping, flags) == []
    call, flags = _call("qwen3_8b_prefill_tp1", "aten.index.Tensor", 1)
    [(kernel, _, row)] = rows_for_call(call, mapping, flags)
    assert (kernel, row["Input Shapes"]) == ("Index", "512,4096;1")
    # R4 MC2: the compute sub-kernel's row and the all-reduce of the bf16 output
    call, flags = _call("qwen3_8b_decode_w8a8_tp4_mc2",
                        "tensor_cast.static_quant_linear_all_reduce.default")
    [(k1, c1, r1), (k2, c2, r2)] = rows_for_call(call, mapping, flags)
    assert (k1, c1, k2, c2) == ("QuantBatchMatmulV3", False, "hcom_allReduce_", True)
    assert (r2["message_bytes"], r2["num_devices"]) == (8 * 4096 * 2, 4)
    # R0: zero-cost views get no row
    call, flags = _call("qwen3_8b_decode_tp1", "aten.view.default")
    assert rows_for_call(call, mapping, flags) == []


def test_a3_fixture_holds_the_rows_of_the_qwen3_8b_runs():
    """tests/fixtures/msmodeling/a3_qwen3_8b holds, under its own mapping, every row this
    generator derives from the Qwen3-8B TP1 decode and prefill runs."""
    from profiling_helpers import DB
    from tensorcast_database import database_rows, row_key
    for case in ("qwen3_8b_decode_tp1", "qwen3_8b_prefill_tp1"):
        for (kernel, comm), rows in database_rows(case, DB / "op_mapping.yaml").items():
            with open((DB / "hccl" if comm else DB) / f"{kernel}.csv", newline="") as f:
                have = {row_key(r) for r in csv.DictReader(f)}
            for row in rows:
                assert row_key({k: str(v) for k, v in row.items()}) in have, (kernel, row)


def test_kernel_types_by_input_rank_orders_the_kernels(tmp_path, a3):
    """The real mapping's dynamic_quantize_symmetric tries AscendQuantV2 first for a
    rank-3 input and DynamicQuant first for a rank-2 one, as TensorCast's
    `_lookup_compute` does, even when both CSVs hold a matching row."""
    import shutil

    from profiling_helpers import REAL_MAPPING, op

    from perfcast.core.errors import ConfigError
    from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource

    shutil.copyfile(REAL_MAPPING, tmp_path / "op_mapping.yaml")
    head = ",".join(f'"{c}"' if " " in c else c for c in
                    ["Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
                     "Output Data Types", "Output Formats", "Average Duration(us)"])
    (tmp_path / "DynamicQuant.csv").write_text(
        head + '\n"8,12288",DT_BF16,ND,"8,12288;8",INT8;FLOAT,ND;ND,5.0\n')
    (tmp_path / "AscendQuantV2.csv").write_text(
        head + '\n"8,12288;12288;12288",DT_BF16;FLOAT;FLOAT,ND;ND;ND,"8,12288",INT8,ND,7.0\n')
    ds = ProfilingDataSource(tmp_path, a3)
    name = "tensor_cast.dynamic_quantize_symmetric.default"
    r3 = ds.lookup(op(name, [((1, 8, 12288), "fp16")]))
    r2 = ds.lookup(op(name, [((8, 12288), "fp16")]))
    assert (r3.details["kernel_type"], r3.latency_us) == ("AscendQuantV2", 7.0)
    assert (r2.details["kernel_type"], r2.latency_us) == ("DynamicQuant", 5.0)
    text = (tmp_path / "op_mapping.yaml").read_text().replace(
        "3: [AscendQuantV2, AscendQuantV2Aicore, DynamicQuant]", "3: AscendQuantV2")
    (tmp_path / "op_mapping.yaml").write_text(text)
    with pytest.raises(ConfigError, match="kernel_types_by_input_rank"):
        ProfilingDataSource(tmp_path, a3).lookup(op(name, [((1, 8, 12288), "fp16")]))
