"""The Ascend per-kernel CSV encoding and the remaining shape rules."""

import pytest
from profiling_helpers import FIA_DB, op
from test_profiling_data_source import hit, missed

from perfcast.evidence.profiling.kernel_csv import parse_shapes, read_kernel_table
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource

BF = "bf16"


def test_fia_reference_row_slots_stay_aligned():
    t = read_kernel_table("FusedInferAttentionScore", FIA_DB / "FusedInferAttentionScore.csv")
    row = t.rows[0]
    # "128,4,128;12307,128,128;12307,128,128;;2048,2048;128;128;;..." with DT_UNDEFINED holes
    assert row.input_shapes[:5] == ((128, 4, 128), (12307, 128, 128), (12307, 128, 128),
                                    (2048, 2048), (128,))
    assert row.input_dtypes[:5] == ("bf16", "bf16", "bf16", "int8", "int64")
    assert row.latency_us == 58.2 and t.latency_column == "Average Duration(us)"
    assert len(t.rows) == 10 and t.record_id(row) == "FusedInferAttentionScore.csv#0"


def test_parse_shapes():
    assert parse_shapes('"4,16,128;;16,128,512;;"') == [(4, 16, 128), None, (16, 128, 512)]
    assert parse_shapes("") == []


def test_latency_column_priority(tmp_path):
    p = tmp_path / "K.csv"
    p.write_text("Duration(us),Profiling Average Duration(us),Average Duration(us),Input Shapes\n"
                 "9,8,7,\"1\"\n")
    assert read_kernel_table("K", p).rows[0].latency_us == 7.0
    p.write_text("Duration(us),Profiling Average Duration(us),Input Shapes\n9,8,\"1\"\n")
    assert read_kernel_table("K", p).rows[0].latency_us == 8.0
    p.write_text("Duration(us),Input Shapes\n9,\"1\"\n,\"2\"\n")
    t = read_kernel_table("K", p)
    assert [r.latency_us for r in t.rows] == [9.0]  # a row without a duration is no evidence


def test_flatten_and_merge_rules(ds):
    # RmsNorm (x, gamma): perfcast (2, 64, 7168) flattens to the CSV's (128, 7168)
    r = hit(ds.lookup(op("tensor_cast.rms_norm.default", [((2, 64, 7168), BF), ((7168,), BF)])))
    assert (r.latency_us, r.shape_match_info.shape_match_rule) == (6.5, "flatten_3d")
    # DynamicQuant merges per-head (T, H, D) into (T, H*D): via the static composite
    r = hit(ds.lookup(op("tensor_cast.rms_norm_dynamic_quant_symmetric.default",
                         [((128, 56, 128), BF)])))
    assert r.kernel_type == "DynamicQuant" and r.sub_kernel_shapes[0].shape_match_rule == \
        "merge_last_dims"
    # SwiGlu admits neither
    assert missed(ds.lookup(op("tensor_cast.swiglu.default", [((2, 4, 12288), BF)])))


def test_comm_csv_without_required_columns_is_raw_format(tmp_path, a3):
    (tmp_path / "op_mapping.yaml").write_text(
        "operator_mappings:\n  tensor_cast.all_reduce.default:\n"
        "    kernel_type: hcom_allReduce_\n    category: communication\n")
    (tmp_path / "hcom_allReduce_.csv").write_text("Input Shapes,Duration(us)\n\"32768\",9.0\n")
    src = ProfilingDataSource(tmp_path, a3)
    m = missed(src.lookup(op("tensor_cast.all_reduce.default", [((32768,), BF)],
                             message_bytes=65536, participants=2)))
    assert m.reason == "csv_format_raw"
    assert missed(src.lookup(op("tensor_cast.all_reduce.default", [((32768,), BF)]))
                  ).reason == "invalid_args"


def test_unreadable_database_is_a_clear_error(tmp_path):
    from perfcast.core.errors import ConfigError
    with pytest.raises(ConfigError, match="--profiling-database"):
        ProfilingDataSource(tmp_path / "missing")
    with pytest.raises(ConfigError, match="op_mapping.yaml"):
        ProfilingDataSource(tmp_path)


def test_rows_replayed_on_another_device_never_answer_it(tmp_path):
    p = tmp_path / "K.csv"
    p.write_text("Input Shapes,Average Duration(us),Profiling Average Duration(us),"
                 "MicroBench Device\n"
                 '"4,8",664673,12,cpu\n'                      # CPU replay over a profiled row
                 '"4,9",700000,,cpu\n'                        # CPU replay of a grid row
                 '"4,10",30,,ATLAS_800_A3_752T_128G_DIE\n'    # replayed on the device
                 '"4,11",bogus,,\n')
    t = read_kernel_table("K", p, "atlas_800_a3_752t_128g_die")
    assert [(r.input_shapes, r.latency_us) for r in t.rows] == [(((4, 8),), 12.0),
                                                                (((4, 10),), 30.0)]
    assert t.foreign_rows == (2, 3) and t.bad_durations == (5,)
    cpu = read_kernel_table("K", p, "cpu")
    assert [r.latency_us for r in cpu.rows] == [664673.0, 700000.0]  # the NPU row has no CPU time


def test_method_label_is_truthful():
    from perfcast.evidence.contracts import CostEstimate, EstimateMethod, MatchKind, Uncertainty
    from perfcast.report.step import method_label

    def est(**kw):
        return CostEstimate(latency_s=1e-6, provider="profiling", provider_revision="r",
                            **{"method": EstimateMethod.MEASURED,
                               "match_kind": MatchKind.EXACT, **kw})
    assert method_label(est()) == "measured"
    assert method_label(est(method=EstimateMethod.INTERPOLATED)) == "interpolated"
    assert method_label(est(match_kind=MatchKind.SUBSET,
                            uncertainty=Uncertainty(kind="partial", rel_std=None))) == "partial"
    from perfcast.core.frozen import FrozenDict
    assert method_label(est(validity=FrozenDict(measured_on="x"))) == "measured*"
