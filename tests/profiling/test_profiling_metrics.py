"""M1-M5 on hand-built records, and from a real costed step."""

import json

import pytest

from perfcast.evidence.profiling.metrics import EmpiricalOpRecord, MetricsCollector


def rec(func, hit, count=1, kernel="K", reason="", shapes=((8, 8),), analytic=1e-6):
    return EmpiricalOpRecord(func, func, count, hit, kernel if hit else "", reason,
                             tuple(shapes), analytic, analytic)


@pytest.fixture
def collector():
    c = MetricsCollector()
    c.collect_from_records([
        rec("aten.mm.default", True, count=3, analytic=4e-6),
        rec("aten.mm.default", False, reason="shape_mismatch", shapes=((9, 8),), analytic=2e-6),
        rec("aten.add.Tensor", True, analytic=1e-6),
        rec("aten.view.default", True, kernel="zero_cost", count=5, analytic=0.0),
        rec("aten.detach.default", True, kernel="accepted_miss", analytic=0.0),
        rec("tensor_cast.rms_norm.default", False, reason="input_count_mismatch", count=2,
            analytic=3e-6),
        rec("tensor_cast.multihead_latent_attention.default", False,
            reason="partial:MatMulV2", analytic=5e-6),
    ])
    return c


def test_m1_counts_invocations_and_partial_as_miss(collector):
    m1 = collector.m1()
    # hits: mm 3 + add 1 + view 5 + detach 1 = 10; misses: mm 1 + rms 2 + mla 1 = 4
    assert (m1["m1_hit"], m1["m1_miss"], m1["m1_total"]) == (10, 4, 14)
    assert m1["m1_raw_op_count_hr"] == pytest.approx(10 / 14)


def test_m2_pessimistic_and_m3_without_zero_cost(collector):
    m2, m3 = collector.m2_m3()
    # ops: mm (hit+miss -> miss), add hit, view hit, detach hit, rms miss, MLA group miss
    assert (m2["m2_fused_hit"], m2["m2_fused_total"]) == (3, 6)
    # without view and detach
    assert (m3["m3_fused_hit_no_zc"], m3["m3_fused_total_no_zc"]) == (1, 4)


def test_fused_group_counts_once_and_is_hit_only_if_all_members_hit():
    c = MetricsCollector()
    c.collect_from_records([rec("tensor_cast.init_routing_v2.default", True),
                            rec("tensor_cast.grouped_matmul.default", True),
                            rec("tensor_cast.unpermute_tokens.default", True)])
    assert c.m2_m3()[0]["m2_fused_total"] == 1 and c.m2_m3()[0]["m2_fused_hit"] == 1
    c.collect_from_records([rec("tensor_cast.all_to_all.default", False, reason="shape_mismatch")])
    assert c.m2_m3()[0]["m2_fused_hit"] == 0 and c.m2_m3()[0]["m2_fused_total"] == 1


def test_m4_unique_shapes_without_zero_cost(collector):
    m4 = collector.m4()
    # hit shapes: (mm,(8,8)), (add,(8,8)); miss shapes: (mm,(9,8)), (rms,(8,8)), (mla,(8,8))
    assert (m4["m4_hit_shapes"], m4["m4_total_shapes"]) == (2, 5)
    assert {"func_name": "aten.mm.default", "shape": [[9, 8]]} in m4["m4_miss_shape_list"]


def test_m5_weighted_by_analytic_latency(collector):
    m5 = collector.m5()
    hit = 3 * 4e-6 + 1e-6
    total = hit + 2e-6 + 2 * 3e-6 + 5e-6
    assert m5["m5_hit_latency_sum_s"] == pytest.approx(hit)
    assert m5["m5_simulated_latency_coverage"] == pytest.approx(hit / total)


def test_export_json_shape(collector, tmp_path):
    out = tmp_path / "m.json"
    collector.export_hit_miss_report(out)
    doc = json.loads(out.read_text())
    assert {"m1", "m2", "m3", "m4", "m5", "misses"} <= set(doc)
    assert "m5_simulated_latency_coverage" in doc["m5"]
    groups = doc["miss_groups"]
    assert groups["input_count_mismatch"]["ops"] == {"tensor_cast.rms_norm.default": 2}
    assert groups["partial:MatMulV2"]["ops"] == {
        "tensor_cast.multihead_latent_attention.default": 1}
    assert len(doc["misses"]) == 3


def test_empty_report():
    doc = MetricsCollector().report()
    assert doc["m1"]["m1_total"] == 0 and doc["m5"]["m5_simulated_latency_coverage"] == 0.0


def test_metrics_from_a_costed_step(a3, ds):
    from perfcast.plan.step import EstimateRequest, estimate_step
    from perfcast.evidence.factory import analytic_providers, build_resolver
    from perfcast.evidence.profiling.empirical import EmpiricalPerformanceModel
    from perfcast.evidence.resolver import CostResolver
    from perfcast.workload import Batch, ParallelPlan

    pm = EmpiricalPerformanceModel(a3, ds, fallback_model=build_resolver(a3))
    # the step of the TensorCast run qwen3_8b_decode_tp1, whose calls (stack `tensorcast`
    # on Ascend) the database holds rows for: every call hits but the two gathers of the
    # RoPE tables, for which the NPU runs no Index kernel (the mapping's note)
    r = estimate_step(EstimateRequest(model="Qwen/Qwen3-8B", device=a3, plan=ParallelPlan(tp=1),
                                      batch=Batch.decode(8, 1024)),
                      CostResolver([pm, *analytic_providers(a3)]))
    c = MetricsCollector()
    c.collect_from_costed(r.costed)
    m1 = c.m1()
    assert m1["m1_total"] == sum(ct.task.count for ct in r.costed.tasks)
    assert m1["m1_miss"] == 2 and c.m5()["m5_simulated_latency_coverage"] > 0.999
    assert {(rr.func_name, rr.tc_shapes, rr.reason.split(" (")[0]) for rr in c.records
            if not rr.hit} == {("aten.index.Tensor", ((40960, 128), (8,)), "shape_mismatch")}
    assert {rr.kernel_type for rr in c.records if rr.hit} == {
        "GatherV2", "RmsNorm", "MatMulV2", "_triton_rope", "ReshapeAndCacheNdKernel",
        "FusedInferAttentionScore", "AddRmsNormBias", "SwiGlu", "Add"}
    # TP2: the per-rank head counts of the k-norm, RoPE and KV-cache write are not held
    r = estimate_step(EstimateRequest(model="Qwen/Qwen3-8B", device=a3, plan=ParallelPlan(tp=2),
                                      batch=Batch.decode(8, 2048)),
                      CostResolver([pm, *analytic_providers(a3)]))
    c = MetricsCollector()
    c.collect_from_costed(r.costed)
    misses = {rr.func_name for rr in c.records if not rr.hit}
    assert misses == {"tensor_cast.rms_norm.default", "tensor_cast.apply_rope.default",
                      "tensor_cast.reshape_and_cache.default", "aten.index.Tensor"}
    assert {rr.reason.split(" (")[0] for rr in c.records if not rr.hit} == {"shape_mismatch"}
    # analytic weights of misses are the latencies actually used (roofline)
    for rr in c.records:
        if not rr.hit:
            assert rr.analytic_latency_s == rr.latency_s
