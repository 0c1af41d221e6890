"""MoE and collective queries against the AIConfigurator fixture slices: weight format
(fp8_block, mxfp4) as the tables' dtype, one kernel per (operation, dtype), bf16
collectives from NCCL's fp16 rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostQuery, CostSubject
from perfcast.evidence.queries import query_for_task
from perfcast.hardware import load_system
from perfcast.serving.evidence import evidence_loader
from perfcast.evidence.importers.aiconfigurator_corrections import (
    balanced_equivalent_tokens,
    balanced_routing_scale,
)
from perfcast.evidence.measured_view import evidence_dtype
from perfcast.evidence.factory import build_resolver
from perfcast.workload import Batch, ParallelPlan, load_model_spec
from perfcast.workload.build import build_task_graph
from perfcast.workload.tensors import TensorSpec

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator"
H100 = ROOT / "h100_sxm"


def rows(rel: str, **eq) -> list[dict]:
    data = pq.read_table(H100 / rel).to_pylist()
    return [r for r in data if all(r[k] == v for k, v in eq.items())]


def moe_resolution(model: str, backend: str, version: str, plan: ParallelPlan, decode: int):
    ev = evidence_loader(ROOT)("h100_sxm", backend, version)
    system = load_system("h100_sxm")
    resolver = build_resolver(system, ev.providers, launch_in_kernel_times=False)
    graph = build_task_graph(load_model_spec(model), plan, Batch.decode(decode, 1000))
    task = next(t for t in graph.tasks if t.operation == "moe")
    query = query_for_task(task, system.name, ev.context)
    return query, resolver.resolve(query).estimate


def test_weight_format_is_the_tables_dtype():
    def q(op, dtype, weight):
        return CostQuery(subject=CostSubject.OPERATOR, operation=op, hardware="h100_sxm",
                         dtype=dtype, inputs=(TensorSpec((8, 64), "bf16"),
                                              TensorSpec((64, 64), weight)))
    assert evidence_dtype(q("moe", "fp8", "fp8_block")) == "fp8_block"
    assert evidence_dtype(q("gemm", "fp8", "fp8")) == "fp8"
    assert evidence_dtype(q("moe", "bf16", "mxfp4")) == "mxfp4"   # w4a16: math in bf16
    assert evidence_dtype(q("gemm", "bf16", "bf16")) == "bf16"
    assert evidence_dtype(q("attention", "bf16", "fp8")) == "bf16"  # not weight-keyed


def test_block_scaled_fp8_moe_reads_fp8_block_rows():
    # Qwen3-235B-A22B-FP8 (128x128 block scales), TP 4 = EP 4, one decode token (one
    # token activates top-k experts under any routing, so the table row is read as is)
    query, est = moe_resolution("Qwen/Qwen3-235B-A22B-FP8", "trtllm", "1.3.0rc20",
                                ParallelPlan(tp=4, ep=4), 1)
    assert query.dims["tokens"] == 1 and query.dims["moe_ep"] == 4
    block = rows("moe/trtllm/1.3.0rc20/moe_perf.parquet", moe_dtype="fp8_block",
                 num_tokens=1, distribution="balanced")[0]
    tensor = rows("moe/trtllm/1.3.0rc20/moe_perf.parquet", moe_dtype="fp8",
                  num_tokens=1, distribution="balanced")[0]
    assert block["latency"] != tensor["latency"]
    assert est.provider == "database"
    assert est.latency_s == pytest.approx(block["latency"] * 1e-3, rel=1e-9)
    assert any("fp8_block" in a for a in est.assumptions)


def test_balanced_equivalent_tokens_by_hand():
    # top-8 of 128: T=16 random tokens activate 128 * (1 - (15/16)^16) = 82.43 experts,
    # which the table's spread routing reaches with 82.43 / 8 = 10.30 tokens
    assert balanced_equivalent_tokens(16, 8, 128) == pytest.approx(10.30, abs=0.01)
    assert balanced_equivalent_tokens(1, 8, 128) == pytest.approx(1.0)
    assert balanced_equivalent_tokens(4096, 8, 128) == pytest.approx(4096)   # all active
    ts = [balanced_equivalent_tokens(t, 8, 128) for t in range(1, 300)]
    assert all(b > a for a, b in zip(ts, ts[1:]))                           # monotone
    assert all(t <= n for t, n in zip(ts, range(1, 300)))


def test_moe_table_read_at_equal_active_experts():
    # 16 decode tokens: the balanced row at 16 tokens reads all 32 local experts of an
    # EP-4 rank; random routing reaches 20.6 of them, as the table does at 10.3 tokens
    query, est = moe_resolution("Qwen/Qwen3-235B-A22B-FP8", "trtllm", "1.3.0rc20",
                                ParallelPlan(tp=4, ep=4), 16)
    t8, t16 = (rows("moe/trtllm/1.3.0rc20/moe_perf.parquet", moe_dtype="fp8_block",
                    num_tokens=n, distribution="balanced")[0]["latency"] * 1e-3 for n in (8, 16))
    assert t8 < est.latency_s < (t8 + t16) / 2
    assert any("10.30 balanced-routing tokens" in a for a in est.assumptions)


def test_balanced_routing_scale_by_hand():
    # top-8 of 128 at 32 tokens: the table's row reaches all 128 experts, random routing
    # 128 * (1 - (15/16)^32) = 111.8 of them: 1 - 0.1268 = 0.8732 of the row
    assert balanced_routing_scale(32, 8, 128) == pytest.approx(0.8732, abs=1e-4)
    assert balanced_routing_scale(16, 8, 128) == 1.0      # T k = E: token mapping instead
    assert balanced_routing_scale(8192, 8, 128) == pytest.approx(1.0)
    scales = [balanced_routing_scale(t, 8, 128) for t in range(17, 300)]
    assert all(0.0 < a <= b <= 1.0 for a, b in zip(scales, scales[1:]))
    # continuity at T k = E: the mapped row (10.3 tokens) and the scaled all-experts row
    # stand for the same 82.4 active experts; just past it the scale is 1 - (15/16)^17
    assert balanced_routing_scale(17, 8, 128) == pytest.approx(1 - (15 / 16) ** 17)


def test_moe_row_in_all_experts_region_scaled_by_active_fraction():
    # 32 decode tokens, EP 4: the balanced row at 32 tokens reads all 32 local experts;
    # random routing reaches 0.8732 of them
    query, est = moe_resolution("Qwen/Qwen3-235B-A22B-FP8", "trtllm", "1.3.0rc20",
                                ParallelPlan(tp=4, ep=4), 32)
    t32 = rows("moe/trtllm/1.3.0rc20/moe_perf.parquet", moe_dtype="fp8_block",
               num_tokens=32, distribution="balanced")[0]["latency"] * 1e-3
    assert query.dims["tokens"] == 32
    assert est.latency_s == pytest.approx(0.8732 * t32, rel=1e-3)
    assert any("scaled by 0.873" in a for a in est.assumptions)


def test_one_moe_kernel_per_dtype():
    ev = evidence_loader(ROOT)("h100_sxm", "vllm", "0.24.0")
    mx = rows("moe/vllm/0.24.0/moe_perf.parquet", moe_dtype="w4a16_mxfp4")
    bf = rows("moe/vllm/0.24.0/moe_perf.parquet", moe_dtype="bfloat16")
    assert ev.context.implementation_for("moe", "mxfp4") == mx[0]["kernel_source"]
    assert ev.context.implementation_for("moe", "bf16") == bf[0]["kernel_source"]
    assert mx[0]["kernel_source"] != bf[0]["kernel_source"]
    # gpt-oss-120b experts (mxfp4 weights, bf16 math) on one GPU, one decode token
    query, est = moe_resolution("openai/gpt-oss-120b", "vllm", "0.24.0", ParallelPlan(), 1)
    assert query.dtype == "bf16"
    row = [r for r in mx if r["num_tokens"] == 1 and r["distribution"] == "balanced"][0]
    assert est.provider == "database"
    assert est.latency_s == pytest.approx(row["latency"] * 1e-3, rel=1e-9)


def test_bf16_collective_reads_nccl_half_rows():
    ev = evidence_loader(ROOT)("h100_sxm", "trtllm", "1.3.0rc20")
    half = rows("comm/nccl/2.27.3/nccl_perf.parquet", op_name="all_gather", nccl_dtype="half",
                num_gpus=4)
    size = half[3]["message_size"]
    same = [r["latency"] for r in half if r["message_size"] == size]  # repeated runs: mean
    system = load_system("h100_sxm")
    dims = {"message_bytes": size * 2, "participants": 4,   # 2 bytes per bf16/fp16 element
            **dict(ev.context.operation_dimensions["all_gather"])}  # the nccl_version
    query = CostQuery(subject=CostSubject.COMMUNICATION, operation="all_gather",
                      hardware=system.name, dtype="bf16", engine="network",
                      message_bytes=size * 2, participants=4, dims=FrozenDict(dims),
                      context=ev.context)
    resolver = build_resolver(system, ev.providers, launch_in_kernel_times=False)
    est = resolver.resolve(query).estimate
    assert est.provider == "database"
    assert est.latency_s == pytest.approx(sum(same) / len(same) * 1e-3, rel=1e-9)
    assert any("fp16 rows of the same message bytes" in a for a in est.assumptions)


def resolve_group(model, backend, version, plan, decode, group):
    ev = evidence_loader(ROOT)("h100_sxm", backend, version)
    system = load_system("h100_sxm")
    resolver = build_resolver(system, ev.providers, launch_in_kernel_times=False)
    graph = build_task_graph(load_model_spec(model), plan, Batch.decode(decode, 1000))
    task = next(t for t in graph.tasks if t.group == group)
    return resolver.resolve(query_for_task(task, system.name, ev.context)).estimate


def test_measured_moe_module_covers_permute_and_unpermute():
    # the trtllm 1.3.0rc20 slice measures Qwen3-235B's MoE module at EP 4: its permute
    # and unpermute are timed inside it, declared zero and attributed to its records
    args = ("Qwen/Qwen3-235B-A22B-FP8", "trtllm", "1.3.0rc20", ParallelPlan(tp=4, ep=4), 1)
    module = resolve_group(*args, "moe.experts")
    for group in ("moe.permute", "moe.unpermute"):
        est = resolve_group(*args, group)
        assert est.latency_s == 0.0 and est.match_kind.value == "declared"
        assert est.raw_record_ids == module.raw_record_ids
        assert "inside the measured moe module" in est.assumptions[0]
    assert resolve_group(*args, "moe.gating").provider == "roofline"   # not declared covered
    # EP 8 is not in the slice: the module falls to the roofline, permute keeps its cost
    ep8 = ("Qwen/Qwen3-235B-A22B-FP8", "trtllm", "1.3.0rc20", ParallelPlan(tp=8, ep=8), 1)
    assert resolve_group(*ep8, "moe.experts").provider == "roofline"
    permute = resolve_group(*ep8, "moe.permute")
    assert permute.provider == "roofline" and permute.latency_s > 0
