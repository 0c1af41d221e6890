"""The fields of the real CANN 8.5 mapping that steer a lookup beyond kernel names:
`project_full_shape`, `embedded_compute`, `embedded_communication`,
`runtime_comm_variants`, `latency_policy`, `query_selection_policy`,
`tp_linear_projection`, `require_all_sub_kernels`, `degenerate_bmm_kernel_type`,
`query_mode: mtp_projection`, `compute_subcategory`, `expected_input_formats`,
`primary_kernel_type`. Each changes the answer when present (or is flagged by
`profiling validate` where no perfcast path reads it), and a malformed value is refused
with the field named."""

import shutil
from types import SimpleNamespace

import pytest
import yaml
from profiling_helpers import REAL_MAPPING, op

from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.data_source import LookupMiss
from perfcast.evidence.profiling.kernel_csv import KernelTables
from perfcast.evidence.profiling.op_mapping import load_op_mapping, op_mapping_from_dict
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.evidence.profiling.query_paths.common import Candidate, find_candidate
from perfcast.workload import ParallelPlan

BF = "bf16"
HEAD = ('"Input Shapes","Input Data Types","Input Formats","Output Shapes",'
        '"Output Data Types","Output Formats"')
COMM_HEAD = "message_bytes,num_devices,topology_tier,Duration(us)"
DFC = "tensor_cast.dispatch_ffn_combine.default"
DFC_Q = "tensor_cast.dispatch_ffn_combine_quant.default"
# TensorCast's projection of a DFC call on x (2, 2048), indices (2, 8), 16 local experts
# of gate-up (2048, 1536) and down (768, 2048) weights
DFC_ROW = ('"2,2048;16,2048,1536;16,768,2048;2,8;24576;32768;2,8",'
           'DT_BF16;{w};{w};INT32;INT64;INT64;FLOAT,ND;ND;ND;ND;ND;ND;ND,"2,8,2048",DT_BF16,ND')


def real_mapping():
    return yaml.safe_load(REAL_MAPPING.read_text())


def database(tmp_path, mapping=None, csvs=(), comm=()):
    """A database under the real mapping (edited by `mapping(doc)`), with CSV texts."""
    db = tmp_path / "db"
    (db / "hccl").mkdir(parents=True)
    doc = real_mapping()
    doc["communication_data_ref"] = "hccl"
    if mapping is not None:
        mapping(doc)
    (db / "op_mapping.yaml").write_text(yaml.safe_dump(doc))
    for name, text in csvs:
        (db / f"{name}.csv").write_text(text)
    for name, text in comm:
        (db / "hccl" / f"{name}.csv").write_text(text)
    return db


def dfc_call(name=DFC, xdt=BF):
    return op(name, [((2, 2048), xdt), ((2, 8), "int64")], [((2, 8, 2048), BF)],
              groups=16, k=2048, n=1536, participants=4)


def refused(doc_edit, match):
    doc = real_mapping()
    doc_edit(doc)
    with pytest.raises(ConfigError, match=match):
        op_mapping_from_dict(doc, "op_mapping.yaml")


def ops(doc):
    return doc["operator_mappings"]


# -- project_full_shape ------------------------------------------------------------------
def test_project_full_shape_queries_the_seven_physical_inputs(tmp_path, a3):
    csv = HEAD + ',"EP Size","Average Duration(us)"\n' + DFC_ROW.format(w="DT_BF16") + ",4,80\n"
    ds = ProfilingDataSource(database(tmp_path, csvs=[("DispatchFFNCombine", csv)]), a3,
                             ParallelPlan(tp=4, ep=4))
    r = ds.lookup(dfc_call())
    assert r.latency_us == 80.0 and r.shape_match_info.shape_match_rule == \
        "projected_full_shape"
    assert r.shape_match_info.simulation_shapes[1:3] == ((16, 2048, 1536), (16, 768, 2048))
    # without the field the call's own two tensors are matched, and miss these rows
    db2 = database(tmp_path / "b", lambda d: ops(d)[DFC].pop("project_full_shape"),
                   csvs=[("DispatchFFNCombine", csv)])
    assert isinstance(ProfilingDataSource(db2, a3, ParallelPlan(tp=4, ep=4)).lookup(
        dfc_call()), LookupMiss)
    # an operator whose weight layout perfcast does not know is a miss that says so
    miss = ds.lookup(dfc_call("tensor_cast.dispatch_ffn_combine_fp8.default"))
    assert miss.reason == "invalid_args" and "project_full_shape" in miss.detail
    refused(lambda d: ops(d)[DFC].update(project_full_shape="yes"),
            "dispatch_ffn_combine.default.project_full_shape")
    refused(lambda d: ops(d)["aten.mm.default"].update(project_full_shape=True),
            "only one that reads it")


# -- embedded_compute and embedded_communication ------------------------------------------
def quant_db(tmp_path, edit=None, alltoall_rows=("65536,4,1,30", "1048576,4,1,50")):
    lat = ',"EP Size","Average Duration(us)"\n'
    return database(tmp_path, edit, csvs=[
        ("DispatchFFNCombine", HEAD + lat + DFC_ROW.format(w="INT8") + ",4,80\n"
         + DFC_ROW.format(w="INT8") + ",2,60\n"),
        ("AddRmsNormBias", HEAD + ',"Average Duration(us)"\n'
         '"2,2048;2,2048;2048;2048",DT_BF16;DT_BF16;DT_BF16;DT_BF16,ND;ND;ND;ND,'
         '"2,2048",DT_BF16,ND,3\n'),
        ("Cast", HEAD + ',"Average Duration(us)"\n"2,8",DT_BF16,ND,"2,8",FLOAT,ND,2\n'
         '"2,8",DT_BF16,ND,"2,8",DT_BF16,ND,9\n')],
        comm=[("hcom_alltoall_", COMM_HEAD + "\n" + "\n".join(alltoall_rows) + "\n")])


def test_embedded_compute_and_communication_add_their_kernels(tmp_path, a3):
    plan = ParallelPlan(tp=4, ep=4)
    r = ProfilingDataSource(quant_db(tmp_path), a3, plan).lookup(dfc_call(DFC_Q))
    # DFC 80 + AddRmsNormBias 3 + the Cast to FLOAT 2 (not the bf16 one) + the all-to-all
    # of x bytes x top-k = 2*2048*2*8 = 65536 B
    assert [k for k, _ in r.details["sub_kernel_durations"]] == \
        ["DispatchFFNCombine", "AddRmsNormBias", "Cast", "hcom_alltoall_"]
    assert r.latency_us == pytest.approx(80 + 3 + 2 + 30)
    assert r.details["embedded_communication"]["message_bytes"] == 65536
    # without the fields: the DFC kernel alone
    def plain(d):
        for k in ("embedded_compute", "embedded_communication"):
            ops(d)[DFC_Q].pop(k)
    assert ProfilingDataSource(quant_db(tmp_path / "b", plain), a3, plan).lookup(
        dfc_call(DFC_Q)).latency_us == 80.0
    # the all-to-all runs over the EP group: another group size misses, as does a message
    # outside the measured sizes (never a time without it)
    assert ProfilingDataSource(quant_db(tmp_path / "c"), a3, ParallelPlan(tp=4, ep=2)).lookup(
        dfc_call(DFC_Q)).reason == "moe_embedded_communication_context_mismatch"
    far = quant_db(tmp_path / "d", alltoall_rows=("1048576,4,1,50", "2097152,4,1,70"))
    assert ProfilingDataSource(far, a3, plan).lookup(dfc_call(DFC_Q)).reason == \
        "moe_embedded_communication_miss:hcom_alltoall_"
    refused(lambda d: ops(d)[DFC_Q]["embedded_compute"][0].update(input_projection="x"),
            "embedded_compute")
    refused(lambda d: ops(d)[DFC_Q]["embedded_communication"].update(
        message_bytes_mode="full_output"), "embedded_communication.message_bytes_mode")


# -- runtime_comm_variants -----------------------------------------------------------------
def test_sequence_parallel_uses_the_reduce_scatter_variant(tmp_path, a3):
    name = "tensor_cast.static_quant_linear_all_reduce.default"
    db = database(tmp_path, csvs=[("QuantBatchMatmulV3", HEAD + ',"Average Duration(us)"\n'
                                   '"8,4096;192,256,16,32;6144;6144",INT8;INT8;FLOAT;FLOAT,'
                                   'ND;FRACTAL_NZ;ND;ND,"8,6144",DT_BF16,ND,10\n')],
                  comm=[("hcom_allReduce_", COMM_HEAD + "\n98304,4,1,20\n"),
                        ("hcom_reduceScatter_", COMM_HEAD + "\n16384,4,1,12\n32768,4,1,16\n")])
    call = op(name, [((8, 4096), "int8"), ((4096, 6144), "int8")], [((8, 6144), BF)],
              participants=4)
    r = ProfilingDataSource(db, a3, ParallelPlan(tp=4)).lookup(call)
    assert r.details["sub_kernel_durations"] == [("QuantBatchMatmulV3", 10.0),
                                                 ("hcom_allReduce_", 20.0)]
    # SP: reduce-scatter of the per-rank output, 98304 / 4 = 24576 B, bracket_linear
    # between the 16384 and 32768 rows
    r = ProfilingDataSource(db, a3, ParallelPlan(tp=4, sp=True)).lookup(call)
    assert r.details["sub_kernel_durations"] == [("QuantBatchMatmulV3", 10.0),
                                                 ("hcom_reduceScatter_", 14.0)]
    variant = "operator_mappings.tensor_cast.static_quant_linear_all_reduce.default" \
              ".runtime_comm_variants"
    refused(lambda d: ops(d)[name]["runtime_comm_variants"]["sequence_parallel"].update(
        source_kernel_type="hcom_allGather_"), variant + ".sequence_parallel.source_kernel_type")
    refused(lambda d: ops(d)[name]["runtime_comm_variants"].update(context_parallel={}),
            "unknown runtime switch")


# -- latency_policy and query_selection_policy ---------------------------------------------
PROF_HEAD = ('"Accelerator Core","Input Shapes","Input Data Types","Input Formats",'
             '"Profiling Average Duration(us)","Profiling Average aicore_time(us)",'
             '"Profiling Average aiv_time(us)"')


def test_core_envelope_fallback_replaces_an_outlier_duration(tmp_path, a3):
    csv = PROF_HEAD + '\nMIX_AIC,"8,4096",DT_BF16,ND,40,12,10\nMIX_AIC,"8,64",DT_BF16,ND,14,12,10\n'

    def lookup(edit):
        db = database(tmp_path / str(id(edit)), edit, csvs=[("QuantBatchMatmulV3", csv)])
        tables = KernelTables(db)
        ctx = SimpleNamespace(tables=tables, mapping=load_op_mapping(db))
        return [find_candidate(ctx, ["QuantBatchMatmulV3"],
                               lambda t, r, i=i: Candidate(r.latency_us, t.kernel_type, t, r)
                               if r.index == i else None).latency_us for i in (0, 1)]
    # ratio 1.5 (the real mapping): 40 / 12 > 1.5 -> 12; 14 / 12 <= 1.5 stays
    assert lookup(None) == [12.0, 14.0]
    assert lookup(lambda d: d["latency_policy"]["kernel_overrides"].pop(
        "QuantBatchMatmulV3")) == [40.0, 14.0]
    refused(lambda d: d["latency_policy"]["kernel_overrides"]["QuantBatchMatmulV3"][
        "profiling_core_envelope_fallback"].update(max_duration_to_core_ratio="high"),
        "latency_policy.kernel_overrides.QuantBatchMatmulV3.profiling_core_envelope_fallback")


def nearest_two(tmp_path, kernel, edit, csv, device=""):
    db = database(tmp_path, edit, csvs=[(kernel, csv)])
    ctx = SimpleNamespace(tables=KernelTables(db, None, device), mapping=load_op_mapping(db))
    return find_candidate(ctx, [kernel], lambda t, r: Candidate(r.latency_us, kernel, t, r),
                          nearest=True)


def test_require_semantic_unique_refuses_equally_near_rows(tmp_path):
    csv = '"Input Shapes","Average Duration(us)"\n"8,128",5\n"8,128",7\n'
    found = nearest_two(tmp_path / "a", "FusedInferAttentionScore", None, csv)
    assert found.reason == "ambiguous_semantic_match:FusedInferAttentionScore"
    found = nearest_two(tmp_path / "b", "FusedInferAttentionScore",
                        lambda d: d.pop("query_selection_policy"), csv)
    assert found.latency_us == 5.0
    refused(lambda d: d["query_selection_policy"]["kernel_overrides"][
        "LightningIndexer"].update(require_semantic_unique="yes"), "require_semantic_unique")


def test_prefer_profiling_rows_breaks_a_tie_for_the_profiled_row(tmp_path, a3):
    # row 0 measured on this device (micro-bench duration), row 1 replayed elsewhere
    # (priced by its profiled duration)
    csv = ('"Input Shapes","MicroBench Device","Average Duration(us)",'
           '"Profiling Average Duration(us)"\n'
           f'"8,128",{a3.name},5,6\n"8,128",ATLAS_800I_A2_280T_64G,4,9\n')
    kept = nearest_two(tmp_path / "a", "ScatterNdUpdate", None, csv, a3.name)
    assert kept.latency_us == 9.0
    plain = nearest_two(tmp_path / "b", "ScatterNdUpdate", lambda d: d["latency_policy"][
        "kernel_overrides"].pop("ScatterNdUpdate"), csv, a3.name)
    assert plain.latency_us == 5.0
    refused(lambda d: d["latency_policy"]["kernel_overrides"]["ScatterNdUpdate"].update(
        prefer_rows=True), "unknown field 'prefer_rows'")


def test_the_real_mapping_loads_its_fields():
    m = load_op_mapping(REAL_MAPPING)
    assert m.get(DFC).project_full_shape and not m.get(DFC).embedded_compute
    assert [s["kernel_type"] for s in m.get(DFC_Q).embedded_compute] == ["AddRmsNormBias", "Cast"]
    assert m.latency_overrides["QuantBatchMatmulV3"] == {
        "profiling_core_envelope_fallback": {"max_duration_to_core_ratio": 1.5}}
    assert set(m.selection_overrides) == {"FusedInferAttentionScore", "KvRmsNormRopeCache",
                                          "LightningIndexer", "SparseFlashAttention"}


def test_collect_grid_rows_follow_the_fields(tmp_path, a3):
    """The rows `collect grid` writes for a call are the ones its lookup reads: the
    projected DFC row, the embedded kernels and collective, the SP reduce-scatter."""
    from perfcast.collect.query_rows import kernel_rows

    ds = ProfilingDataSource(quant_db(tmp_path), a3, ParallelPlan(tp=4, ep=4))
    rows, why = kernel_rows(ds, dfc_call(DFC_Q))
    assert why == "" and [r.kernel_type for r in rows] == \
        ["DispatchFFNCombine", "AddRmsNormBias", "Cast", "hcom_alltoall_"]
    assert [s for s, _, _ in rows[0].inputs] == [(2, 2048), (16, 2048, 1536), (16, 768, 2048),
                                                  (2, 8), (24576,), (32768,), (2, 8)]
    assert rows[2].outputs == (((2, 8), "fp32"),)
    assert dict(rows[3].columns)["message_bytes"] == "65536"
    name = "tensor_cast.static_quant_linear_all_reduce.default"
    call = op(name, [((8, 4096), "int8"), ((4096, 6144), "int8")], [((8, 6144), BF)],
              participants=4)
    db = database(tmp_path / "sp", csvs=[("QuantBatchMatmulV3", HEAD + ',"Average Duration(us)"\n')])
    for sp, kernel, mb in ((False, "hcom_allReduce_", "98304"), (True, "hcom_reduceScatter_", "24576")):
        rows, _ = kernel_rows(ProfilingDataSource(db, a3, ParallelPlan(tp=4, sp=sp)), call)
        assert (rows[1].kernel_type, dict(rows[1].columns)["message_bytes"]) == (kernel, mb)


# -- tp_linear_projection -------------------------------------------------------------------
SQL = "tensor_cast.static_quant_linear.default"
# the per-rank QuantBatchMatmulV3 row of a linear whose 16,384-wide input the real mapping
# declares logical (global): at TP8 the kernel sees 2,048 of it
QBMM = HEAD + ',"Average Duration(us)"\n"8,2048;2048,7168",INT8;INT8,ND;ND,"8,7168",DT_BF16,ND,30\n'


def sql_call():
    return op(SQL, [((8, 16384), "int8"), ((16384, 7168), "int8"), ((), "fp32"), ((), "fp32")],
              [((8, 7168), BF)])


def test_tp_linear_projection_looks_a_logical_dim_up_at_its_rank_shape(tmp_path, a3):
    db = database(tmp_path, csvs=[("QuantBatchMatmulV3", QBMM)])
    r = ProfilingDataSource(db, a3, ParallelPlan(tp=8)).lookup(sql_call())
    assert r.latency_us == 30.0
    assert r.shape_match_info.simulation_shapes == ((8, 2048), (2048, 7168))
    # TP1: nothing to project; without the field the logical shape misses the row
    assert isinstance(ProfilingDataSource(db, a3, ParallelPlan(tp=1)).lookup(sql_call()),
                      LookupMiss)
    db2 = database(tmp_path / "b", lambda d: ops(d)[SQL].pop("tp_linear_projection"),
                   csvs=[("QuantBatchMatmulV3", QBMM)])
    assert isinstance(ProfilingDataSource(db2, a3, ParallelPlan(tp=8)).lookup(sql_call()),
                      LookupMiss)
    # a dim the TP size does not divide is an explicit miss
    miss = ProfilingDataSource(db, a3, ParallelPlan(tp=3)).lookup(sql_call())
    assert isinstance(miss, LookupMiss) and miss.reason == "tp_projection_invalid"


@pytest.mark.parametrize("rule, match", [
    ({"shard_axis": "middle", "logical_global_dims": [16384]}, "shard_axis"),
    ({"shard_axis": "input", "logical_global_dims": []}, "logical_global_dims"),
    ({"shard_axis": "input", "logical_global_dims": [16384], "otherwise": "x"}, "otherwise"),
    ({"shard_axis": "input", "logical_global_dims": [16384], "extra": 1}, "tp_linear_projection"),
])
def test_a_malformed_tp_linear_projection_is_refused(rule, match):
    refused(lambda d: ops(d)[SQL].__setitem__("tp_linear_projection", rule), match)


def table(*rows: str) -> str:
    """A kernel CSV in the real per-kernel columns, one text per data row."""
    return HEAD + ',"Average Duration(us)"\n' + "".join(r + "\n" for r in rows)


# -- require_all_sub_kernels ---------------------------------------------------------------
MLAPO_Q = "tensor_cast.mlapo_quant.default"
CASES = REAL_MAPPING.parents[1] / "tensorcast"


def tensorcast_call(case: str, operator: str):
    """The first call of `operator` in a committed TensorCast dump, as an OpInvokeInfo."""
    import json
    doc = json.loads((CASES / f"{case}.json").read_text())
    c = next(c for c in doc["calls"] if c["op"].removeprefix("torch.ops.") == operator)
    return op(operator, [tuple(i) for i in c["inputs"]], [tuple(o) for o in c["outputs"]])


def test_require_all_sub_kernels_turns_a_partial_composite_into_a_miss(tmp_path, a3):
    from perfcast.evidence.profiling.data_source import QuerySource
    from perfcast.evidence.profiling.decomposers import decompose_mlapo

    # the mlapo call of a real DeepSeek-V3 TP8 decode, decomposed by perfcast's mlapo
    # decomposer under the real mlapo_quant entry; rows for its two GEMMs only (the RmsNorm
    # and KvRmsNormRopeCache sub-kernels have none)
    call = tensorcast_call("deepseek_v3_decode_tp8", "tensor_cast.mlapo.default")
    call = op(MLAPO_Q, call.inputs, call.outputs)
    gemms = table('"4,7168;2112,7168",DT_BF16;DT_BF16,ND;ND,"4,2112",DT_BF16,ND,20',
                  '"4,1536;3072,1536",DT_BF16;DT_BF16,ND;ND,"4,3072",DT_BF16,ND,10')

    def lookup(edit):
        db = database(tmp_path / str(id(edit)), edit, csvs=[("MatMulV2", gemms)])
        return ProfilingDataSource(db, a3, ParallelPlan(tp=8),
                                   decomposers={MLAPO_Q: decompose_mlapo}).lookup(call)
    miss = lookup(None)
    assert isinstance(miss, LookupMiss)
    assert miss.reason == "sub_kernel_miss:RmsNorm,KvRmsNormRopeCache"
    assert "require_all_sub_kernels" in miss.detail
    partial = lookup(lambda d: ops(d)[MLAPO_Q].pop("require_all_sub_kernels"))
    assert partial.source is QuerySource.PARTIAL and partial.latency_us == 30.0
    refused(lambda d: ops(d)[MLAPO_Q].update(require_all_sub_kernels="yes"),
            "mlapo_quant.default.require_all_sub_kernels")


# -- degenerate_bmm_kernel_type ------------------------------------------------------------
BMM = "aten.bmm.default"
MUL = table('"1,32,1;1,1,2048",DT_BF16;DT_BF16,ND;ND,"1,32,2048",DT_BF16,ND,4',
            '"1,32,2;1,2,2048",DT_BF16;DT_BF16,ND;ND,"1,32,2048",DT_BF16,ND,6')
BMM_ROWS = table('"16,4,128;16,128,512",DT_BF16;DT_BF16,ND;ND,"16,4,512",DT_BF16,ND,8')


def test_degenerate_bmm_kernel_type_answers_a_k1_bmm(tmp_path, a3):
    def lookup(edit, k):
        db = database(tmp_path / f"{id(edit)}{k}", edit,
                      csvs=[("BatchMatMulV2", BMM_ROWS), ("Mul", MUL)])
        return ProfilingDataSource(db, a3).lookup(
            op(BMM, [((1, 32, k), BF), ((1, k, 2048), BF)], [((1, 32, 2048), BF)]))
    # GLM-5's sampling bmm (1,32,1) @ (1,1,T) (the mapping's note) is priced by its Mul row
    r = lookup(None, 1)
    assert (r.details["kernel_type"], r.latency_us) == ("Mul", 4.0)
    # without the field, or for K=2 (not degenerate), the bmm kernels alone are asked
    assert lookup(lambda d: ops(d)[BMM].pop("degenerate_bmm_kernel_type"), 1).reason == \
        "shape_mismatch"
    assert lookup(None, 2).reason == "shape_mismatch"


# -- query_mode: mtp_projection -----------------------------------------------------------
def test_mtp_projection_looks_the_concat_projection_up_on_its_kernel(tmp_path, a3):
    # the MTP block's eh_proj of DeepSeek-V3 under W8A8: (T, 2h) x (2h, h) -> (T, h)
    call = op(SQL, [((8, 14336), "int8"), ((14336, 7168), "int8"), ((), "fp32"), ((), "fp32")],
              [((8, 7168), BF)])
    mm = table('"8,14336;7168,14336",DT_BF16;DT_BF16,ND;ND,"8,7168",DT_BF16,ND,25')
    qbmm = table('"8,14336;224,896,16,32;7168;7168",INT8;INT8;FLOAT;FLOAT,'
                 'ND;FRACTAL_NZ;ND;ND,"8,7168",DT_BF16,ND,40')

    def lookup(edit=None, csvs=(("MatMulV2", mm), ("QuantBatchMatmulV3", qbmm)), c=call):
        db = database(tmp_path / f"{id(edit)}{len(csvs)}{id(c)}", edit, csvs=csvs)
        return ProfilingDataSource(db, a3, ParallelPlan(tp=1)).lookup(c)
    r = lookup()
    assert (r.details["kernel_type"], r.latency_us) == ("MatMulV2", 25.0)
    assert r.details["query_mode"] == "mtp_projection"
    assert r.shape_match_info.simulation_shapes == ((8, 14336), (14336, 7168))

    def plain(d):
        ops(d)[SQL].pop("query_mode")
        ops(d)[SQL].pop("mtp_projection_kernel_type")
    # without the fields, or without a MatMulV2 row, the quantised kernel answers
    assert lookup(plain).details["kernel_type"] == "QuantBatchMatmulV3"
    assert lookup(csvs=(("QuantBatchMatmulV3", qbmm),)).latency_us == 40.0
    # a linear that is not 2H -> H never asks the projection kernel
    other = op(SQL, [((8, 7168), "int8"), ((7168, 7168), "int8")], [((8, 7168), BF)])
    rows = table('"8,7168;7168,7168",DT_BF16;DT_BF16,ND;ND,"8,7168",DT_BF16,ND,25')
    assert isinstance(lookup(csvs=(("MatMulV2", rows),), c=other), LookupMiss)


# -- compute_subcategory and expected_input_formats (--interpolate) ------------------------
def interpolate(tmp_path, edit, csvs, call):
    from perfcast.evidence.profiling.interpolating_data_source import InterpolatingDataSource

    db = database(tmp_path / str(id(edit)), edit, csvs=csvs)
    return InterpolatingDataSource(ProfilingDataSource(db, a3_system(), ParallelPlan(tp=1))
                                   ).lookup(call)


def a3_system():
    from perfcast.hardware import load_system
    return load_system("atlas_800_a3_752t_128g_die")


def qbmm_row(m, weight, fmt, us):
    return (f'"{m},7168;{weight};2048;2048",INT8;INT8;FLOAT;FLOAT,ND;{fmt};ND;ND,'
            f'"{m},2048",DT_BF16,ND,{us}')


# rows of a W8A8 linear (K 7168, N 2048): NZ weights (the stored layout) at M 4 and 16,
# ND weights at M 6 and 12
QBMM_RANGE = table(qbmm_row(4, "64,448,16,32", "FRACTAL_NZ", 10),
                   qbmm_row(16, "64,448,16,32", "FRACTAL_NZ", 22),
                   qbmm_row(6, "2048,7168", "ND", 30), qbmm_row(12, "2048,7168", "ND", 42))


def test_quantized_matmul_interpolates_within_its_format_regime(tmp_path):
    call = op(SQL, [((8, 7168), "int8"), ((7168, 2048), "int8"), ((), "fp32"), ((), "fp32")],
              [((8, 2048), BF)])
    csvs = [("QuantBatchMatmulV3", QBMM_RANGE)]
    r = interpolate(tmp_path, None, csvs, call)
    # the NZ rows only (expected_input_formats [ND, FRACTAL_NZ]): 10 + 12 * 4/12
    assert r.latency_us == pytest.approx(14.0) and r.details["bracket"] == [4.0, 16.0]
    assert r.details["interpolation_path"] == "quantized_matmul_1d"
    # the formats are read: [ND, ND] brackets on the ND rows, 30 + 12 * 2/6
    nd = interpolate(tmp_path / "nd", lambda d: ops(d)[SQL].update(
        expected_input_formats=["ND", "ND"]), csvs, call)
    assert nd.latency_us == pytest.approx(34.0)
    # without a subcategory the first-dim path takes the nearest rows of any format
    plain = interpolate(tmp_path / "p", lambda d: ops(d)[SQL].pop("compute_subcategory"),
                        csvs, call)
    assert plain.details["bracket"] == [6.0, 12.0]
    # the regime includes the output dtype: an fp32 output has no rows
    fp32 = op(SQL, call.inputs, [((8, 2048), "fp32")])
    assert isinstance(interpolate(tmp_path / "f", None, csvs, fp32), LookupMiss)
    # one format per matched input, else a miss that says so
    short = interpolate(tmp_path / "s", lambda d: ops(d)[SQL].update(
        expected_input_formats=["ND"]), csvs, call)
    assert short.reason == "quantized_matmul_formats_mismatch"
    refused(lambda d: ops(d)[SQL].update(expected_input_formats="ND"),
            "static_quant_linear.default.expected_input_formats")


DQ = "tensor_cast.dynamic_quantize_symmetric.default"
# DynamicQuant rows in the real fixtures' layout: per-token FLOAT scales
DQ_ROWS = table('"4,4096",DT_BF16,ND,"4,4096;4",INT8;FLOAT,ND;ND,5',
                '"16,4096",DT_BF16,ND,"16,4096;16",INT8;FLOAT,ND;ND,9')


def dq_call(scale, dtype=BF):
    return op(DQ, [((8, 4096), dtype)], [((8, 4096), "int8"), (scale, "fp32")])


def test_compute_scale_interpolates_rows_of_the_same_scale_mode(tmp_path):
    csvs = [("DynamicQuant", DQ_ROWS)]
    r = interpolate(tmp_path, None, csvs, dq_call((8,)))
    assert r.latency_us == pytest.approx(5 + 4 * 4 / 12)
    assert r.details["interpolation_path"] == "compute_scale_1d"
    # TensorCast's own call returns a 0-d (per-tensor) scale: no per-token row answers it,
    # nor an fp16 input the bf16 rows (the regime keeps them apart)
    assert isinstance(interpolate(tmp_path / "t", None, csvs, dq_call(())), LookupMiss)
    assert isinstance(interpolate(tmp_path / "h", None, csvs, dq_call((8,), "fp16")),
                      LookupMiss)
    # without the subcategory the first-dim path interpolates the per-tensor call anyway
    plain = interpolate(tmp_path / "p", lambda d: ops(d)[DQ].pop("compute_subcategory"),
                        csvs, dq_call(()))
    assert plain.latency_us == pytest.approx(r.latency_us)
    # an unknown subcategory is a miss that names it, and validate warns
    bad = interpolate(tmp_path / "u", lambda d: ops(d)[DQ].update(compute_subcategory="scale"),
                      csvs, dq_call((8,)))
    assert bad.reason == "compute_subcategory_unknown" and "'scale'" in bad.detail


# -- primary_kernel_type and the fields validate flags --------------------------------------
def test_validate_flags_lookup_fields_no_path_reads(tmp_path, a3):
    from perfcast.evidence.profiling.validate import validate_database

    def edit(d):
        ops(d)[DQ]["compute_subcategory"] = "scale"
        ops(d)["aten.mm.default"]["expected_input_formats"] = ["ND", "ND"]
        ops(d)["aten.mm.default"]["mtp_projection_kernel_type"] = "MatMulV2"
        ops(d)["aten.mm.default"]["require_all_sub_kernels"] = True
        ops(d)["tensor_cast.mlapo.default"]["require_all_sub_kernels"] = True
    db = database(tmp_path, edit)
    warned = {(i.where.removeprefix("operator_mappings."), i.message.split(" ")[0])
              for i in validate_database(db).warnings}
    assert {("tensor_cast.dsa_indexer.default", "primary_kernel_type"),
            ("aten.mm.default", "require_all_sub_kernels"), (DQ, "compute_subcategory"),
            ("aten.mm.default", "expected_input_formats"),
            ("aten.mm.default", "mtp_projection_kernel_type")} <= warned
    # mlapo has a decomposer: its require_all_sub_kernels is read, not flagged
    assert ("tensor_cast.mlapo.default", "require_all_sub_kernels") not in warned
    # the DSA indexer's lookup says why it has no answer
    miss = ProfilingDataSource(db, a3).lookup(op("tensor_cast.dsa_indexer.default",
                                                 [((4, 7168), BF)]))
    assert miss.reason == "no_sub_kernels" and "primary_kernel_type LightningIndexer" in \
        miss.detail
