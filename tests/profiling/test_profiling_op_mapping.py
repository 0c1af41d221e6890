"""op_mapping.yaml loading (the real CANN 8.5 file) and the database validator."""

import shutil

import pytest
from profiling_helpers import DB, FIA_DB, REAL_MAPPING

from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.op_mapping import load_op_mapping
from perfcast.evidence.profiling.validate import validate_database

needs_reference = pytest.mark.skipif(not REAL_MAPPING.is_file(),
                                     reason="shared reference data not present")


@needs_reference
def test_real_mapping_loads():
    m = load_op_mapping(REAL_MAPPING)
    assert len(m.operator_mappings) == 147
    mm = m.get("aten.mm.default")
    assert mm.kernel_types == ("MatMulV2", "MatMulV3", "MatMulCommon")
    assert m.get("tensor_cast.all_reduce.default").category == "communication"
    assert m.get("tensor_cast.attention.default").query_mode == "attention_special"
    mla = m.get("tensor_cast.multihead_latent_attention.default")
    assert mla.composite and mla.decomposer and not mla.kernel_type
    assert m.get("tensor_cast.matmul_all_reduce.default").sub_kernels[-1] == "hcom_allReduce_"
    assert m.get("aten.embedding.default").tc_input_count == 2
    assert m.get("aten.view.default").zero_cost
    # fields the mapping parser does not type are kept in `extra`; the lookup fields are read
    sql = m.get("tensor_cast.static_quant_linear.default")
    assert "decomposer_options" in m.get("tensor_cast.mlapo.default").extra
    assert sql.expected_input_formats == ("ND", "FRACTAL_NZ") and sql.extra == {}
    assert sql.tp_linear_projection == ("input", (16384,))
    assert m.communication_data_ref == "../../hccl/v8.5/"
    assert m.interpolation_policy["kernel_overrides"]["FusedInferAttentionScore"] == {
        "axis_transform": "sqrt_seq"}
    assert m.metadata["cann_version"] == "8.5"


@needs_reference
def test_real_mapping_validates_schema_but_lacks_csvs(tmp_path):
    shutil.copy(REAL_MAPPING, tmp_path / "op_mapping.yaml")
    report = validate_database(tmp_path)
    schema_errors = [i for i in report.errors if not i.where.endswith(".csv")]
    assert schema_errors == []
    assert any(i.where == "MatMulV2.csv" for i in report.errors)
    # kernel_type next to zero_cost is flagged, not fatal
    assert any("shift_and_update_input_ids" in i.where and i.severity == "warning"
               for i in report.issues)


def test_fixture_databases_validate_clean():
    assert validate_database(DB).ok
    assert validate_database(FIA_DB).ok


def write(tmp_path, mapping, **csvs):
    (tmp_path / "op_mapping.yaml").write_text(mapping)
    for name, text in csvs.items():
        (tmp_path / f"{name}.csv").write_text(text)
    return validate_database(tmp_path)


def test_mutual_exclusions_and_required_fields(tmp_path):
    report = write(tmp_path, """
unknown_top_level: 1
operator_mappings:
  "a.composite_with_kernel.default": {composite: true, kernel_type: X, sub_kernels: [X]}
  "b.zero_and_accepted.default": {zero_cost: true, accepted_miss: "no kernel"}
  "c.no_kernel.default": {notes: "forgot kernel_type", future_field: 3}
  "d.decomposer_only.default": {decomposer: true}
  "e.bad_category.default": {kernel_type: X, category: storage}
""", X="Input Shapes,Input Data Types,Average Duration(us)\n\"8,8\",DT_BF16,1.0\n")
    msgs = {(i.where.split(".")[1], i.message.split(" ")[0]) for i in report.errors}
    assert ("a", "kernel_type") in msgs
    assert ("b", "zero_cost") in msgs
    assert ("c", "kernel_type") in msgs
    assert ("d", "decomposer:") in msgs
    assert ("e", "category") in msgs
    assert not any("unknown_top_level" in str(i) or "future_field" in str(i)
                   for i in report.issues)


def test_missing_csv_and_columns_per_path(tmp_path):
    report = write(tmp_path, """
operator_mappings:
  "aten.mm.default": {kernel_type: MatMulV2, alternate_kernel_types: [MatMulV3]}
  "aten.add.Tensor": {kernel_type: Add, query_mode: elementwise}
  "tensor_cast.all_reduce.default": {kernel_type: hcom_allReduce_, category: communication}
  "tensor_cast.attention.default": {kernel_type: FIA, query_mode: attention_special}
""", MatMulV2="Input Shapes,Average Duration(us)\n\"8,8\",1.0\n",
        Add="Input Shapes,Input Data Types,Average Duration(us)\n\"8,8\",DT_BF16,1.0\n",
        hcom_allReduce_="message_bytes,Duration(us)\n64,1.0\n",
        FIA="Input Shapes,Input Data Types,Average Duration(us)\n\"8,8,8\",DT_BF16,1.0\n")
    text = "\n".join(str(i) for i in report.errors)
    assert "MatMulV3.csv: missing" in text
    assert "MatMulV2.csv: compute path needs column(s): Input Data Types" in text
    assert "Add.csv: elementwise path needs column(s): Output Shapes; Output Data Types" in text
    assert "hcom_allReduce_.csv: communication path needs column(s): num_devices" in text
    assert "FIA.csv: attention_special path needs column(s): Runtime avg_seq_len or avg_seq_len" \
        in text


def test_type_errors_name_the_field(tmp_path):
    (tmp_path / "op_mapping.yaml").write_text(
        "operator_mappings:\n  aten.mm.default:\n    kernel_type: MatMulV2\n    tc_input_count: two\n")
    with pytest.raises(ConfigError, match=r"operator_mappings.aten.mm.default.tc_input_count"):
        load_op_mapping(tmp_path)
    with pytest.raises(ConfigError, match="op_mapping.yaml"):
        load_op_mapping(tmp_path / "nowhere")
