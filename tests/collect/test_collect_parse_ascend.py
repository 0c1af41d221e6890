import shutil

import pytest

from perfcast.collect.parse import find_profiles, parse_profiling
from perfcast.collect.tables import read_table
from perfcast.core.errors import ConfigError

REF_COLUMNS = ["OP State", "Accelerator Core", "Input Shapes", "Input Data Types",
               "Input Formats", "Output Shapes", "Output Data Types", "Output Formats",
               "Average Duration(us)", "Median Duration(us)", "Std Duration(us)"]


def test_kernel_details_folder_becomes_per_kernel_csvs(fixtures, tmp_path):
    result = parse_profiling(fixtures / "ascend_prof", tmp_path)
    # op_stats.csv in the same folder is not a kernel_details file and is skipped
    assert [p.name for p in result.sources] == ["kernel_details.csv"]
    assert result.samples == 5 and result.skipped_communication == 1
    # the hcom_ call has no message size here; hcom_*.csv is the `collect comm` format
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "MatMulV2.csv", "RmsNorm.csv", "collection_manifest.json"]
    mm = read_table(tmp_path / "MatMulV2.csv")
    # same column layout as the TensorCast per-kernel fixture CSVs
    assert mm.header[:len(REF_COLUMNS)] == REF_COLUMNS
    rows = {r["Input Shapes"]: r for r in mm.rows}
    small = rows["128,5120;80,320,16,16"]   # weight in FRACTAL_NZ tiles
    assert small["Input Formats"] == "ND;FRACTAL_NZ"
    assert small["Input Data Types"] == "DT_BF16;DT_BF16"
    assert float(small["Average Duration(us)"]) == pytest.approx(20.7)   # (20.1 + 21.3) / 2
    assert float(small["Median Duration(us)"]) == pytest.approx(20.7)
    assert float(small["Std Duration(us)"]) == pytest.approx(0.6)        # population std
    assert small["Count"] == "2"
    assert float(small["Average aicore_time(us)"]) == pytest.approx(18.5)
    assert float(small["Average cube_utilization(%)"]) == pytest.approx(60.55)
    assert "Average aiv_time(us)" not in mm.header                        # only N/A samples
    assert float(rows["1024,5120;80,320,16,16"]["Average Duration(us)"]) == 45.0
    norm = read_table(tmp_path / "RmsNorm.csv").rows[0]
    assert norm["Output Data Types"] == "DT_BF16;FLOAT"
    assert float(norm["Average Duration(us)"]) == 6.5


def test_op_summary_is_recognised_by_content_not_name(fixtures, tmp_path):
    renamed = tmp_path / "whatever.csv"
    shutil.copy(fixtures / "op_summary_0_1_1.csv", renamed)
    assert find_profiles(renamed) == [(renamed, "ascend")]
    db = tmp_path / "db"
    parse_profiling(renamed, db)
    row = read_table(db / "MatMulV3.csv").rows[0]
    assert row["Input Shapes"] == "4096,5120;5120,25600"        # msprof's literal quotes dropped
    assert row["Accelerator Core"] == "AI_CORE"                  # from Task Type
    assert float(row["Average Duration(us)"]) == pytest.approx(310.0)
    assert float(row["Average aic_mac_ratio"]) == pytest.approx(0.915)


def test_manifest_records_profile_digests_and_provenance(fixtures, tmp_path):
    import hashlib
    import json

    parse_profiling(fixtures / "ascend_prof", tmp_path, {"device": "ATLAS_800_A3_752T_128G_DIE",
                                                         "cann_version": "8.5"})
    parse_profiling(fixtures / "op_summary_0_1_1.csv", tmp_path)
    runs = json.loads((tmp_path / "collection_manifest.json").read_text())["runs"]
    assert len(runs) == 2 and runs[0]["cann_version"] == "8.5"
    src = fixtures / "ascend_prof/PROF_001/ASCEND_PROFILER_OUTPUT/kernel_details.csv"
    assert runs[0]["profiles"] == [{"path": str(src), "kind": "ascend",
                                    "sha256": hashlib.sha256(src.read_bytes()).hexdigest()}]


def test_merge_replaces_same_key_and_keeps_others(fixtures, tmp_path):
    parse_profiling(fixtures / "ascend_prof", tmp_path)
    src = tmp_path / "one.csv"
    lines = (fixtures / "ascend_prof/PROF_001/ASCEND_PROFILER_OUTPUT/kernel_details.csv"
             ).read_text().splitlines()
    src.write_text("\n".join([lines[0], lines[3].replace(",45.0,", ",50.0,")]) + "\n")
    parse_profiling(src, tmp_path)
    rows = {r["Input Shapes"]: r for r in read_table(tmp_path / "MatMulV2.csv").rows}
    assert float(rows["1024,5120;80,320,16,16"]["Average Duration(us)"]) == 50.0
    assert float(rows["128,5120;80,320,16,16"]["Average Duration(us)"]) == pytest.approx(20.7)


@pytest.mark.parametrize("old,new,column", [
    (",21.3,", ",abc,", "Duration(us)"),
    (",21.3,", ",-1,", "Duration(us)"),
    ('"128,5120;80,320,16,16",DT_BF16;DT_BF16,ND;FRACTAL_NZ,"128,1280",DT_BF16,ND,N/A,19.0',
     '"128,51x0;80,320,16,16",DT_BF16;DT_BF16,ND;FRACTAL_NZ,"128,1280",DT_BF16,ND,N/A,19.0',
     "Input Shapes"),
    (",19.0,34960,", ",fast,34960,", "aicore_time(us)"),
])
def test_malformed_row_fails_naming_file_row_column_and_writes_nothing(
        fixtures, tmp_path, old, new, column):
    src = tmp_path / "prof" / "kernel_details_0.csv"
    src.parent.mkdir()
    text = (fixtures / "ascend_prof/PROF_001/ASCEND_PROFILER_OUTPUT/kernel_details.csv").read_text()
    assert old in text
    src.write_text(text.replace(old, new, 1))
    db = tmp_path / "db"
    with pytest.raises(ConfigError) as err:
        parse_profiling(tmp_path / "prof", db)
    msg = str(err.value)
    assert str(src) in msg and "row 3" in msg and column in msg
    assert not db.exists() or not any(db.iterdir())


def test_unrecognised_file_is_a_clear_error(tmp_path):
    f = tmp_path / "notes.csv"
    f.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="neither an Ascend kernel_details"):
        parse_profiling(f, tmp_path / "db")
