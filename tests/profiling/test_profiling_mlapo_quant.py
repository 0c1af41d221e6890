"""TensorCast's `mlapo_quant` (W8A8 MLA preprocessing) against the real CANN 8.5 mapping
and `mla_preprocess_0_mix_aic` rows in the per-kernel CSV format.

The call is the one of a real TensorCast run (tests/fixtures/tensorcast/
deepseek_v3_decode_w8a8_tp8.json: DeepSeek-V3 W8A8_DYNAMIC, TP8, 4 requests of 1 token
over 2,048). The mapping declares the opaque kernel for a decode without sequence
parallelism (`visible_kernel_regime.requires_sequence_parallel`, otherwise
`opaque_kernel_query`), read by TensorCast's `_query_mlapo_preprocess`
(profiling_data_source.py, msModeling 84fec853): the row's `Runtime <field>` columns
are the call's semantic key, and its tensors the kernel's CANN 8.5 layout
(`_build_mla_preprocess_expected_shapes`). The rows below are written out literally
from that function for DeepSeek-V3 (hidden 7168 = 224 x 32, q_lora 1536 = 48 x 32,
fused 1536 + 512 + 64 = 2112, 16 local heads x 192 = 3072, one 128-token block), not by
perfcast's own layout function. TensorCast checks the dtypes of inputs 0, 1 and 5 (bf16
hidden, int8 weights), the weights' format and ND bf16 outputs; the other input dtypes
are written as bf16 / INT32 slots and are not read. Latencies are illustrative round
numbers, not measurements."""

import csv
import json
import shutil
from pathlib import Path

import pytest
from profiling_helpers import REAL_MAPPING, op

from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.decomposers import (
    decompose_mlapo_quant,
    mla_preprocess_layout,
)
from perfcast.evidence.profiling.metrics import MetricsCollector
from perfcast.evidence.profiling.op_mapping import parse_operator_mapping
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.workload import ParallelPlan

CASE = (Path(__file__).resolve().parents[1]
        / "fixtures/tensorcast/deepseek_v3_decode_w8a8_tp8.json")
KERNEL = "mla_preprocess_0_mix_aic"
OP = "tensor_cast.mlapo_quant.default"
RUNTIME = ["num_tokens", "hidden_size", "local_num_heads", "q_lora_rank", "kv_lora_rank",
           "qk_nope_head_dim", "qk_rope_head_dim", "block_size", "cache_mode", "quant_mode",
           "enable_inner_out", "weight_quantized", "weight_format"]
COLUMNS = ["Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
           "Output Data Types", "Output Formats", "Average Duration(us)",
           *(f"Runtime {k}" for k in RUNTIME), "Runtime metadata_completeness"]
# DeepSeek-V3 at TP8, T tokens (one cache block of 128 up to 128 tokens)
IN_SHAPES = ("{t},7168;1,224,2112,32;2112;1536;1536;1,48,3072,32;3072;512;{t},64;{t},64;"
             "16,128,512;1,128,1,512;1,128,1,64;{t};1;1;2112;1;1;3072;1;1")
OUT_SHAPES = "{t},16,512;1,128,1,512;{t},16,64;1,128,1,64;{t},1536"
IN_DTYPES = ";".join(["DT_BF16", "DT_INT8", "DT_BF16", "DT_BF16", "DT_BF16", "DT_INT8",
                      "DT_BF16", "DT_BF16", "DT_BF16", "DT_BF16", "DT_BF16", "DT_BF16",
                      "DT_BF16", "INT32"] + ["DT_BF16"] * 8)
IN_FORMATS = ";".join(["ND", "FRACTAL_NZ", "ND", "ND", "ND", "FRACTAL_NZ"] + ["ND"] * 16)
KEY = {"hidden_size": 7168, "local_num_heads": 16, "q_lora_rank": 1536, "kv_lora_rank": 512,
       "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "block_size": 128,
       "cache_mode": "krope_ctkv", "quant_mode": "per_tensor_quant_asymm",
       "enable_inner_out": "true", "weight_quantized": "true", "weight_format": "FRACTAL_NZ"}


def row(tokens: int, us: float, **changes) -> dict:
    cells = {"Input Shapes": IN_SHAPES.format(t=tokens), "Input Data Types": IN_DTYPES,
             "Input Formats": IN_FORMATS, "Output Shapes": OUT_SHAPES.format(t=tokens),
             "Output Data Types": ";".join(["DT_BF16"] * 5),
             "Output Formats": ";".join(["ND"] * 5), "Average Duration(us)": us,
             **{f"Runtime {k}": v for k, v in {"num_tokens": tokens, **KEY}.items()},
             "Runtime metadata_completeness": "profile_shapes_only"}
    cells.update(changes)
    return cells


def write_database(root: Path, rows: list[dict], columns=COLUMNS) -> Path:
    shutil.copy(REAL_MAPPING, root / "op_mapping.yaml")
    with open(root / f"{KERNEL}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return root


def tensorcast_call() -> dict:
    doc = json.loads(CASE.read_text())
    return next(c for c in doc["calls"] if c["op"].removeprefix("torch.ops.") == OP)


def call(tokens: int = 4, **dims):
    """TensorCast's call (its tensors; fp16 as bf16, as the kernel reads it) at `tokens`
    tokens, with the integer arguments perfcast's task carries as axes."""
    ins = [((tokens, *s[1:]) if i == 0 else (1, tokens, 64) if i in (1, 2) else tuple(s),
            "bf16" if d == "float16" else {"float32": "fp32"}.get(d, d))
           for i, (s, d) in enumerate(tensorcast_call()["inputs"])]
    return op(OP, ins, **{"num_heads": 16, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                          "kv_lora_rank": 512, "q_lora_rank": 1536, "tp_size": 8,
                          "sequence_parallel": 0, **dims})


def w8a8_step(system, database):
    """DeepSeek-V3 W8A8_DYNAMIC TP8 decode, 4 requests over 2,048, the tensorcast stack,
    costed by the profiling model on `database` (analytic fallback)."""
    from perfcast.evidence.factory import analytic_providers, build_resolver
    from perfcast.evidence.profiling.empirical import EmpiricalPerformanceModel
    from perfcast.evidence.resolver import CostResolver
    from perfcast.plan.step import EstimateRequest, estimate_step
    from perfcast.workload import Batch
    from perfcast.workload import load_model_spec
    from perfcast.workload.quant import precision_for_model

    plan = ParallelPlan(tp=8)
    model = load_model_spec("deepseek-ai/DeepSeek-V3")
    pm = EmpiricalPerformanceModel(system, ProfilingDataSource(database, system, plan),
                                   fallback_model=build_resolver(system))
    request = EstimateRequest(model=model, device=system, plan=plan,
                              batch=Batch.decode(4, 2048),
                              precision=precision_for_model(model, linear_action="W8A8_DYNAMIC"))
    return estimate_step(request, CostResolver([pm, *analytic_providers(system)]))


def mlapo_estimates(step):
    calls = [ct for ct in step.costed.tasks if ct.task.operator == OP]
    assert sum(ct.task.count for ct in calls) == 61
    return [ct.resolution.estimate for ct in calls]


def test_perfcasts_mlapo_quant_call_is_tensorcasts(a3, tmp_path):
    tc = tensorcast_call()
    step = w8a8_step(a3, write_database(tmp_path, []))
    task = next(ct.task for ct in step.costed.tasks if ct.task.operator == OP)
    fp = {"float16": "bf16", "float32": "fp32", "int8": "int8"}
    assert [(list(t.shape), t.dtype) for t in task.inputs] == [
        (s, fp[d]) for s, d in tc["inputs"]]
    assert [(list(t.shape), t.dtype) for t in task.outputs] == [
        (s, fp[d]) for s, d in tc["outputs"]]
    assert tc["count"] == 61


def test_the_call_hits_its_opaque_kernel_row_on_every_layer(a3, tmp_path):
    step = w8a8_step(a3, write_database(tmp_path, [row(2, 30.0), row(4, 41.0)]))
    for est in mlapo_estimates(step):
        assert est.provider == "profiling" and est.statistics["source"] == "MEASURED"
        assert est.latency_s == pytest.approx(41.0e-6)
        assert json.loads(est.statistics["sub_kernel_durations"]) == [[KERNEL, 41.0]]
    collector = MetricsCollector()
    collector.collect_from_costed(step.costed)
    recs = [r for r in collector.records if r.func_name == OP]
    assert recs and all(r.hit for r in recs)


def test_a_miss_falls_back_to_the_analytic_model_never_partial(a3, tmp_path):
    # the only row is of another cache mode: no row answers, the call is priced whole
    # by the analytic model and counts as a miss with TensorCast's reason
    step = w8a8_step(a3, write_database(tmp_path, [row(4, 41.0, **{
        "Runtime cache_mode": "int8_nzcache"})]))
    for est in mlapo_estimates(step):
        assert est.provider != "profiling" and est.latency_s > 0
    collector = MetricsCollector()
    collector.collect_from_costed(step.costed)
    recs = [r for r in collector.records if r.func_name == OP]
    assert recs and {r.reason for r in recs} == {
        "sub_kernel_miss:mla_preprocess_0_mix_aic"}
    r = ProfilingDataSource(tmp_path, a3, ParallelPlan(tp=8)).lookup(call())
    assert not hasattr(r, "source") and "sub_kernel_miss" in r.reason


def test_num_tokens_is_interpolated_between_rows_only(a3, tmp_path):
    ds = ProfilingDataSource(write_database(tmp_path, [row(2, 30.0), row(8, 60.0)]), a3,
                             ParallelPlan(tp=8))
    r = ds.lookup(call(4))
    assert r.source.name == "INTERPOLATED" and r.latency_us == pytest.approx(40.0)
    assert r.sub_kernel_shapes[0].shape_match_rule == "mlapo_num_tokens_bounded_interpolation"
    assert ds.lookup(call(8)).latency_us == pytest.approx(60.0)
    assert "sub_kernel_miss" in str(ds.lookup(call(16)))  # above the rows: no extrapolation


@pytest.mark.parametrize("changes", [
    {"Runtime metadata_completeness": "legacy"},          # TensorCast skips legacy rows
    {"Runtime local_num_heads": 8},                       # another TP's heads
    {"Runtime weight_format": "ND", "Input Formats": IN_FORMATS.replace("FRACTAL_NZ", "ND")},
    {"Input Shapes": IN_SHAPES.format(t=4).replace("1,48,3072,32", "1,48,1536,32")},
    {"Input Data Types": IN_DTYPES.replace("DT_INT8", "DT_BF16")},
    {"Output Formats": "ND;FRACTAL_NZ;ND;ND;ND"},
])
def test_a_row_is_read_only_with_the_calls_key_and_the_kernels_layout(a3, tmp_path, changes):
    ds = ProfilingDataSource(write_database(tmp_path, [row(4, 41.0, **changes)]), a3,
                             ParallelPlan(tp=8))
    assert "sub_kernel_miss:mla_preprocess_0_mix_aic" in str(ds.lookup(call()))


def test_rows_without_the_runtime_columns_say_so(a3, tmp_path):
    from perfcast.evidence.profiling.decomposers import query_mla_preprocess

    ds = ProfilingDataSource(write_database(tmp_path, [row(4, 41.0)], COLUMNS[:7]), a3,
                             ParallelPlan(tp=8))
    spec = decompose_mlapo_quant(call(), ds.mapping.get(OP))[0]
    miss = query_mla_preprocess(ds, spec)
    assert miss.reason.startswith("semantic_context_missing:csv:Runtime block_size")


def test_calls_outside_the_kernels_contract_miss_with_a_reason(a3, tmp_path):
    from perfcast.evidence.profiling.decomposers import query_mla_preprocess

    ds = ProfilingDataSource(write_database(tmp_path, [row(4, 41.0)]), a3, ParallelPlan(tp=8))
    spec = decompose_mlapo_quant(call(2048), ds.mapping.get(OP))[0]
    assert query_mla_preprocess(ds, spec).reason == \
        "semantic_key_mismatch:mlapo_preprocess:num_tokens_out_of_range"


def entry(**options):
    return parse_operator_mapping(OP, {"composite": True, "decomposer": True,
                                       "require_all_sub_kernels": True,
                                       "decomposer_options": options}, "t")


def _real_options() -> dict:
    import yaml
    return yaml.safe_load(REAL_MAPPING.read_text())["operator_mappings"][OP][
        "decomposer_options"]


def test_decomposer_takes_the_regime_the_mapping_declares():
    opts = _real_options()
    opaque = decompose_mlapo_quant(call(), entry(**opts))
    assert [s.kernel_type for s in opaque] == [KERNEL]
    assert dict(opaque[0].runtime) == {
        "num_tokens": 4, "hidden_size": 7168, "local_num_heads": 16, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "block_size": 128, "cache_mode": "krope_ctkv", "quant_mode": "per_tensor_quant_asymm",
        "enable_inner_out": True, "weight_quantized": True, "weight_format": "FRACTAL_NZ"}
    # sequence parallel: the visible kernels at T / tp tokens (projection_token_partition)
    visible = decompose_mlapo_quant(call(16, sequence_parallel=1), entry(**opts))
    assert [(s.kernel_type, s.input_shapes) for s in visible[:5]] == [
        ("AscendQuantV2", ((2, 7168), (7168,), (7168,))),
        ("QuantBatchMatmulV3", ((2, 7168), (2112, 7168))),
        ("RmsNorm", ((2, 1536), (1536,))),
        ("AscendQuantV2", ((2, 1536), (1536,), (1536,))),
        ("QuantBatchMatmulV3", ((2, 1536), (3072, 1536)))]
    assert visible[1].inputs == [((2, 7168), "int8"), ((2112, 7168), "int8")]
    assert visible[5].kernel_type == "KvRmsNormRopeCache" and visible[5].input_shapes[0] == \
        (2, 1, 1, 576)
    assert decompose_mlapo_quant(call(15, sequence_parallel=1), entry(**opts)) is None
    # no opaque kernel declared, bf16 weights or missing integer arguments: not decomposed
    no_opaque = {k: v for k, v in opts.items() if k != "opaque_kernel"}
    assert decompose_mlapo_quant(call(), entry(**no_opaque)) is None
    bf16 = op(OP, [(t.shape, "bf16" if t.dtype == "int8" else t.dtype) for t in call().inputs],
              **dict(call().dims))
    assert decompose_mlapo_quant(bf16, entry(**opts)) is None
    assert decompose_mlapo_quant(op(OP, call().inputs), entry(**opts)) is None
    with pytest.raises(ConfigError, match="opaque_kernel.block_size"):
        decompose_mlapo_quant(call(), entry(**{**opts, "opaque_kernel": {
            **opts["opaque_kernel"], "block_size": "128"}}))


def test_layout_is_tensorcasts_for_deepseek_v3():
    ins, outs = mla_preprocess_layout(4, 7168, 16, 1536, 512, 128, 64, 128)
    assert ";".join(",".join(map(str, s)) for s in ins) == IN_SHAPES.format(t=4)
    assert ";".join(",".join(map(str, s)) for s in outs) == OUT_SHAPES.format(t=4)
    assert mla_preprocess_layout(4, 7100, 16, 1536, 512, 128, 64, 128) is None


def test_visible_kernels_are_all_or_nothing(a3, tmp_path):
    # sequence parallel: the visible regime. One of its six kernels has a row (RmsNorm at
    # T / tp = 2 tokens); the real mapping's require_all_sub_kernels makes that a miss,
    # not a PARTIAL answer (TensorCast's _lookup_composite_decomposed)
    db = write_database(tmp_path, [row(4, 41.0)])
    with open(db / "RmsNorm.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS[:7])
        w.writerow(["2,1536;1536", "DT_BF16;DT_BF16", "ND;ND", "2,1536", "DT_BF16", "ND", 3.0])
    ds = ProfilingDataSource(db, a3, ParallelPlan(tp=8))
    sp_call = call(16, sequence_parallel=1)
    r = ds.lookup(sp_call)
    assert "sub_kernel_miss:AscendQuantV2,QuantBatchMatmulV3" in str(r)
    assert "require_all_sub_kernels" in str(r)
    import yaml
    doc = yaml.safe_load((db / "op_mapping.yaml").read_text())
    del doc["operator_mappings"][OP]["require_all_sub_kernels"]
    (db / "op_mapping.yaml").write_text(yaml.safe_dump(doc))
    r = ProfilingDataSource(db, a3, ParallelPlan(tp=8)).lookup(sp_call)
    assert r.source.name == "PARTIAL" and r.details["hit_kernels"] == ["RmsNorm"]


def test_collect_grid_writes_no_row_for_the_opaque_kernel(a3, tmp_path):
    # its row is keyed by Runtime columns (semantics the profiled server states), which a
    # theory grid row cannot: the call is counted as needing a row the grid does not write
    from perfcast.collect.query_rows import kernel_rows

    ds = ProfilingDataSource(write_database(tmp_path, []), a3, ParallelPlan(tp=8))
    assert kernel_rows(ds, call()) == ([], "opaque_kernel:mla_preprocess_0_mix_aic")
