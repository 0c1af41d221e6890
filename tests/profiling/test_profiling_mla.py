"""DeepSeek-V3 MLA as TensorCast calls it, against the real Ascend FIA/TBMM fixture.

The fixture (tests/fixtures/msmodeling/fia_fixture, a verbatim copy of Ascend
msmodeling's FIA test database) holds the DeepSeek-V3 TP8 decode sub-kernels: two
TransposeBatchMatMul rows (token-first (T, H, d)) and the FIA row Q (4,16,1,512) at
avg_seq_len 2048."""

import json

import pytest
from profiling_helpers import FIA_DB, measured_per_layer, v3_decode_step
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.evidence.factory import analytic_providers, build_resolver
from perfcast.evidence.profiling.empirical import EmpiricalPerformanceModel
from perfcast.evidence.profiling.metrics import MetricsCollector
from perfcast.evidence.resolver import CostResolver
from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.workload import Batch, ParallelPlan

V3 = "deepseek-ai/DeepSeek-V3"
FIXTURE_US = [["TransposeBatchMatMul", 15.0], ["FusedInferAttentionScore", 28.0],
              ["TransposeBatchMatMul", 12.0]]


@pytest.fixture(scope="module")
def v3_decode(a3):
    return v3_decode_step(a3, FIA_DB)


def test_every_mla_layer_is_a_full_measured_hit(v3_decode):
    measured_per_layer(v3_decode, "tensor_cast.multihead_latent_attention.default",
                       FIXTURE_US, 55.0e-6)
    collector = MetricsCollector()
    collector.collect_from_costed(v3_decode.costed)
    assert all(r.hit for r in collector.records if "multihead_latent" in r.func_name)


def test_the_call_carries_tensorcasts_inputs(v3_decode):
    core = v3_decode.costed.by_lineage()["L3-60.mla.core"].task
    # q, paged latent cache (65 blocks of 128 = 4 x 2,050 slots), block table, query_start_loc,
    # seq_lens, query_lens, W_UK_T, W_UV, kv_b_proj (layers/mla.py, core/input_generator.py)
    assert [t.shape for t in core.inputs] == [
        (4, 16, 192), (65, 128, 576), (4, 17), (5,), (4,), (4,), (16, 128, 512),
        (16, 512, 128), (512, 4096)]
    assert core.outputs[0].shape == (4, 16, 128)
    cache = v3_decode.costed.by_lineage()["L3-60.mla.kv_cache_write"].task
    assert cache.operator == "tensor_cast.concat_and_cache_mla.default"
    assert [t.shape for t in cache.inputs] == [(4, 512), (4, 64), (65, 128, 576), (4,)]


def test_cli_profiling_estimate_is_measured_per_layer(tmp_path):
    # the done-when run: `estimate --performance-model profiling --profiling-database`
    r = CliRunner().invoke(app, [
        "estimate", V3, "--device", "atlas_800_a3_752t_128g_die", "--tp-size", "8",
        "--num-queries", "4", "--query-length", "1", "--context-length", "2048", "--decode",
        "--performance-model", "profiling", "--profiling-database", str(FIA_DB),
        "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])
    ops = [o for o in doc["ops"] if o["operator"].startswith("tensor_cast.multihead_latent")]
    assert ops and all(o["method"] == "measured" and not o.get("partial") for o in ops)
    assert all(o["avg_latency_s"] == pytest.approx(55.0e-6) for o in ops)


def test_real_cann_mapping_with_the_fixture_csvs(a3, tmp_path):
    # the real CANN 8.5 mapping lists no MLA sub_kernels: BatchMatMulV2 is tried first for
    # q @ W_UK_T (no CSV here), then TransposeBatchMatMul token-first
    import shutil

    from profiling_helpers import REAL_MAPPING, op

    from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
    shutil.copy(REAL_MAPPING, tmp_path / "op_mapping.yaml")
    for csv in FIA_DB.glob("*.csv"):
        shutil.copy(csv, tmp_path / csv.name)
    ds = ProfilingDataSource(tmp_path, a3, ParallelPlan(tp=8))
    r = ds.lookup(op("tensor_cast.multihead_latent_attention.default",
                     [((4, 16, 192), "bf16")], batch=4, q_tokens=1, kv_len=2049, heads=16,
                     kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                     v_head_dim=128, kv_dtype="bf16"))
    assert r.source.name == "MEASURED" and r.latency_us == pytest.approx(55.0)
    assert [list(d) for d in r.details["sub_kernel_durations"]] == FIXTURE_US


def test_partial_layer_prices_the_missing_bmms_and_is_a_miss(a3, tmp_path):
    # without TransposeBatchMatMul.csv only FIA hits: the two bmms are priced by the
    # analytic model (never left out) and M1-M5 count the op as a miss
    import shutil

    from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
    for name in ("op_mapping.yaml", "FusedInferAttentionScore.csv"):
        shutil.copy(FIA_DB / name, tmp_path / name)
    plan = ParallelPlan(tp=8)
    pm = EmpiricalPerformanceModel(a3, ProfilingDataSource(tmp_path, a3, plan),
                                   fallback_model=build_resolver(a3))
    request = EstimateRequest(model=V3, device=a3, plan=plan, batch=Batch.decode(4, 2048),
                              mla_call="tensorcast")
    step = estimate_step(request, CostResolver([pm, *analytic_providers(a3)]))
    est = step.costed.by_lineage()["L3-60.mla.core"].resolution.estimate
    s = est.statistics
    assert s["source"] == "PARTIAL" and s["missed_kernels"] == (
        "TransposeBatchMatMul,TransposeBatchMatMul")
    assert s["measured_latency_s"] == pytest.approx(28.0e-6)
    assert s["analytic_sub_kernels_s"] > 0
    assert est.latency_s == pytest.approx(28.0e-6 + s["analytic_sub_kernels_s"])
    collector = MetricsCollector()
    collector.collect_from_costed(step.costed)
    mla = [r for r in collector.records if "multihead_latent" in r.func_name]
    assert mla and not any(r.hit for r in mla)
    assert {r.reason for r in mla} == {"partial:TransposeBatchMatMul,TransposeBatchMatMul"}
    assert collector.m1()["m1_hit"] == 0


def test_mla_call_flag():
    from perfcast.cli.estimate import mla_call_for
    from perfcast.core.errors import ConfigError
    assert mla_call_for("auto", ["profiling"]) == "tensorcast"
    assert mla_call_for("auto", ["analytic"]) == "auto"  # the stack decides
    assert mla_call_for("auto", ["analytic", "profiling"]) == "tensorcast"
    assert mla_call_for("split", ["profiling"]) == "split"
    with pytest.raises(ConfigError, match="--mla-call"):
        mla_call_for("fused", ["analytic"])


def test_mla_call_auto_follows_the_stack():
    from perfcast.plan.step import EstimateRequest, estimate_step
    from perfcast.workload import Batch, ParallelPlan
    ops = lambda device: {t.operator for t in estimate_step(EstimateRequest(  # noqa: E731
        model="deepseek-ai/DeepSeek-V3", device=device, plan=ParallelPlan(tp=8),
        batch=Batch.decode(4, 2048))).graph.tasks}
    assert "tensor_cast.mlapo.default" in ops("atlas_800_a3_752t_128g_die")  # tensorcast
    assert "tensor_cast.mlapo.default" not in ops("h200_sxm")  # default stack: split
