import os

import pytest

from perfcast.collect.tables import (
    csv_name,
    format_shapes,
    parse_shapes,
    read_table,
    row_latency_us,
    write_files_atomic,
)
from perfcast.core.errors import ConfigError


def test_shape_encoding_round_trips_absent_slots():
    text = "128,4,128;12307,128,128;;2048,2048;128"
    shapes = parse_shapes(text)
    assert shapes == ((128, 4, 128), (12307, 128, 128), None, (2048, 2048), (128,))
    assert format_shapes(shapes) == text


def test_literal_quotes_from_msprof_are_stripped():
    assert parse_shapes('"128,4,128;"') == ((128, 4, 128), None)


def test_malformed_shape_names_file_row_and_column():
    with pytest.raises(ConfigError) as err:
        parse_shapes("4,x;3", source="a.csv", row=7, column="Input Shapes")
    msg = str(err.value)
    assert "a.csv, row 7" in msg and "Input Shapes" in msg and "'4,x'" in msg


def test_csv_name_keeps_ascend_names_and_sanitises_torch_names():
    assert csv_name("MatMulV2") == "MatMulV2.csv"
    assert csv_name("hcom_allReduce_") == "hcom_allReduce_.csv"
    assert csv_name("aten::mm") == "aten__mm.csv"


def test_latency_priority_matches_contract():
    assert row_latency_us({"Average Duration(us)": "", "Profiling Average Duration(us)": "3",
                           "Duration(us)": "9"}) == (3.0, "Profiling Average Duration(us)")
    assert row_latency_us({"Average Duration(us)": "0", "Duration(us)": "9"}) == (9.0, "Duration(us)")
    assert row_latency_us({"Average Duration(us)": "N/A"}) is None


def test_reference_fixture_reads(tmp_path):
    ref = "/work/shared/reference/msmodeling/fia_fixture_TransposeBatchMatMul.csv"
    if not os.path.exists(ref):
        pytest.skip("shared reference data not mounted")
    t = read_table(ref)
    assert t.kernel_type == "fia_fixture_TransposeBatchMatMul"
    assert [row_latency_us(r)[0] for r in t.rows] == [15.0, 12.0]


def test_failed_staging_leaves_targets_and_no_temporaries(tmp_path):
    a, b = tmp_path / "A.csv", tmp_path / "B.csv"
    a.write_text("old\n")
    with pytest.raises(TypeError):
        write_files_atomic({a: "new\n", b: 12345})  # second file cannot be staged
    assert a.read_text() == "old\n"
    assert not b.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A.csv"]
