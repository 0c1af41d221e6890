"""EmpiricalPerformanceModel as the first provider of a CostResolver."""

import pytest
from profiling_helpers import DB

from perfcast.core.errors import InvalidEvidenceError
from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.evidence.factory import analytic_providers, build_resolver
from perfcast.evidence.contracts import AttemptOutcome, EstimateMethod, MatchKind
from perfcast.evidence.profiling.empirical import EmpiricalPerformanceModel
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.evidence.queries import query_for_task
from perfcast.evidence.resolver import CostResolver
from perfcast.workload import Batch, ParallelPlan


@pytest.fixture
def pm(a3, ds):
    return EmpiricalPerformanceModel(a3, ds, fallback_model=build_resolver(a3))


@pytest.fixture
def step(a3, pm):
    request = EstimateRequest(model="Qwen/Qwen3-8B", device=a3, plan=ParallelPlan(tp=2),
                              batch=Batch.decode(8, 2048))
    resolver = CostResolver([pm, *analytic_providers(a3)])
    return estimate_step(request, resolver)


def test_full_hit_is_measured_with_statistics(step):
    ct = step.costed.by_lineage()["L0-35.attn.qkv_proj"]
    est = ct.resolution.estimate
    assert (est.provider, est.method, est.match_kind) == ("profiling", EstimateMethod.MEASURED,
                                                           MatchKind.EXACT)
    assert est.latency_s == pytest.approx(26.1e-6)
    s = est.statistics
    assert (s["source"], s["kernel_type"], s["shape_match_rule"]) == ("MEASURED", "MatMulV2",
                                                                      "transpose")
    assert s["kernel_shapes"] == "8,4096;3072,4096" and s["simulation_shapes"] == "8,4096;4096,3072"
    assert est.raw_record_ids == ("MatMulV2.csv#1",)
    # the analytic latency is kept as the M5 weight, and equals the roofline answer
    roof = build_resolver(step.system).resolve(query_for_task(ct.task, step.system.name))
    assert s["analytic_latency_s"] == pytest.approx(roof.estimate.latency_s)


def test_full_miss_falls_back_with_reason_in_attempts(step):
    # TensorCast's rms_norm(x [1,T,h], weight [h]) hits the real-layout row (T,h);(h)
    norm = step.costed.by_lineage()["L0-35.attn.input_norm"].resolution.estimate
    assert (norm.provider, norm.statistics["kernel_shapes"],
            norm.statistics["shape_match_rule"]) == ("profiling", "8,4096;4096", "batch_strip")
    # its k-norm at TP2 (4 kv heads per rank): the database holds 8 heads (TP1) only
    ct = step.costed.by_lineage()["L0-35.attn.k_norm"]
    est = ct.resolution.estimate
    assert est.provider == "roofline" and est.method is EstimateMethod.ANALYTICAL
    first = ct.resolution.attempts[0]
    assert (first.provider, first.outcome) == ("profiling", AttemptOutcome.MISS)
    # the input count is right, the shape is not held
    assert first.reason.startswith("shape_mismatch")


def test_communication_and_attention_hits(step):
    by = step.costed.by_lineage()
    assert by["L0-35.attn.all_reduce"].resolution.estimate.latency_s == pytest.approx(10.5e-6)
    att = by["L0-35.attn.core"].resolution.estimate
    assert att.latency_s == pytest.approx(31.0e-6) and att.statistics["csv_avg_seq_len"] == 2048


def _partial_query(a3):
    from perfcast.core.frozen import FrozenDict
    from perfcast.evidence.contracts import CostQuery, CostSubject
    from perfcast.workload.tensors import TensorSpec
    # MLA prefill: FIA (96,16,128) at 64 has a row (20.0 us), MatMulV2 (96,512) none
    return CostQuery(subject=CostSubject.OPERATOR, operation="mla_attention",
                     hardware=a3.name, dtype="bf16", flops=1e9, bytes_read=1e6,
                     operator="tensor_cast.multihead_latent_attention.default",
                     inputs=(TensorSpec((96, 16, 192), "bf16"),),
                     dims=FrozenDict(batch=1, q_tokens=96, kv_len=64, heads=16,
                                     kv_lora_rank=512, qk_nope_head_dim=128,
                                     qk_rope_head_dim=64, v_head_dim=128, kv_dtype="bf16"))


def test_partial_prices_missed_sub_kernels_analytically(a3, pm):
    from dataclasses import replace

    from perfcast.core.frozen import FrozenDict
    q = _partial_query(a3)
    est = pm.estimate(q)
    # the missed MatMulV2 (96,512)x(512,4096) is priced by the analytic model from its work
    gemm = replace(q, operation="gemm", flops=2.0 * 96 * 512 * 4096,
                   bytes_read=(96 * 512 + 512 * 4096) * 2.0, bytes_written=96 * 4096 * 2.0,
                   dims=FrozenDict(m=96, n=4096, k=512), operator="", inputs=())
    analytic = build_resolver(a3).resolve(gemm).estimate.latency_s
    assert analytic > 0
    assert est.latency_s == pytest.approx(20.0e-6 + analytic)
    assert est.statistics["measured_latency_s"] == pytest.approx(20.0e-6)
    assert est.statistics["analytic_sub_kernels_s"] == pytest.approx(analytic)
    assert est.match_kind is MatchKind.SUBSET and est.statistics["source"] == "PARTIAL"
    assert "MatMulV2" in est.assumptions[0] and "analytic model" in est.assumptions[0]


def test_partial_without_analytic_model_is_a_miss(a3, ds):
    # a PARTIAL time that left the missed sub-kernel out would be wrong: fall back instead
    from perfcast.evidence.contracts import Miss
    bare = EmpiricalPerformanceModel(a3, ds)
    assert isinstance(bare.estimate(_partial_query(a3)), Miss)
    res = CostResolver([bare, *analytic_providers(a3)]).resolve(_partial_query(a3))
    assert res.estimate.provider == "roofline"
    assert "partial composite" in res.attempts[0].reason


def test_zero_cost_is_declared(a3, pm):
    from perfcast.evidence.contracts import CostQuery, CostSubject
    q = CostQuery(subject=CostSubject.OPERATOR, operation="view", hardware=a3.name,
                  dtype="bf16", operator="aten.view.default")
    est = CostResolver([pm]).resolve(q).estimate
    assert est.latency_s == 0.0 and est.match_kind is MatchKind.DECLARED


def test_other_hardware_is_unsupported(ds, pm):
    from perfcast.evidence.contracts import CostQuery, CostSubject
    q = CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware="h100_sxm",
                  dtype="bf16", operator="aten.mm.default")
    assert pm.supports(q) is not True


def test_broken_csv_is_an_error_not_a_fallback(a3, tmp_path):
    (tmp_path / "op_mapping.yaml").write_text(
        "operator_mappings:\n  aten.mm.default:\n    kernel_type: MatMulV2\n")
    (tmp_path / "MatMulV2.csv").write_text("Input Shapes,Input Data Types\n\"8,8;8,8\",DT_BF16\n")
    pm = EmpiricalPerformanceModel(a3, ProfilingDataSource(tmp_path, a3))
    request = EstimateRequest(model="Qwen/Qwen3-0.6B", device=a3)
    with pytest.raises(InvalidEvidenceError, match="no latency column"):
        estimate_step(request, CostResolver([pm, *analytic_providers(a3)]))


def test_revision_tracks_the_database(a3, tmp_path):
    import shutil
    shutil.copytree(DB, tmp_path / "db")
    r1 = EmpiricalPerformanceModel(a3, ProfilingDataSource(tmp_path / "db", a3)).revision
    with open(tmp_path / "db" / "Add.csv", "a") as f:
        f.write('"2,4096;2,4096",DT_BF16;DT_BF16,ND;ND,"2,4096",DT_BF16,ND,2.0\n')
    r2 = EmpiricalPerformanceModel(a3, ProfilingDataSource(tmp_path / "db", a3)).revision
    assert r1 != r2


def test_path_specific_debug_statistics(step, a3, pm):
    by = step.costed.by_lineage()
    comm = by["L0-35.attn.all_reduce"].resolution.estimate.statistics
    assert (comm["topology_tier"], comm["num_devices"], comm["shape_match_rule"]) == (2, 2, "comm")
    att = by["L0-35.attn.core"].resolution.estimate.statistics
    assert (att["avg_seq_len"], att["num_kv_heads"], att["sparse_mode"]) == (2049, 4, 3)
    from perfcast.core.frozen import FrozenDict
    from perfcast.evidence.contracts import CostQuery, CostSubject
    from perfcast.workload.tensors import TensorSpec
    q = CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware=a3.name, dtype="bf16",
                  flops=2 * 8 * 2048 * 4096, operator="tensor_cast.matmul_all_reduce.default",
                  inputs=(TensorSpec((8, 2048), "bf16"), TensorSpec((2048, 4096), "bf16")),
                  outputs=(TensorSpec((8, 4096), "bf16"),), dims=FrozenDict(participants=2))
    s = pm.estimate(q).statistics
    import json
    subs = json.loads(s["sub_kernel_shapes"])
    assert [x["kernel_type"] for x in subs] == ["MatMulV2", "hcom_allReduce_"]
    assert subs[0]["kernel_shapes"] == "8,2048;4096,2048" and subs[1]["shape_match_rule"] == "comm"
    assert json.loads(s["sub_kernel_durations"]) == [["MatMulV2", 19.8], ["hcom_allReduce_", 10.5]]
