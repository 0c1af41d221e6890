import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfcast.cli.collect import derive_database_path
from perfcast.cli.main import app
from perfcast.collect.tables import read_table
from perfcast.core.errors import ConfigError

runner = CliRunner()


def test_database_path_is_derived_like_tensorcast():
    assert derive_database_path(None, "ATLAS_800_A3_752T_128G_DIE", "0.18.0", "2.9.0", "8.5") == \
        Path("perf_database/ATLAS_800_A3_752T_128G_DIE/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5")
    assert derive_database_path(None, "D", "vllm0.18.0_torch2.9.0_cann8.5", "", "").name == \
        "vllm0.18.0_torch2.9.0_cann8.5"
    with pytest.raises(ConfigError, match="--torch-version, --cann-version"):
        derive_database_path(None, "D", "0.18.0", "", "")


def test_parse_then_grid_from_the_command_line(fixtures, tmp_path):
    db = tmp_path / "db"
    res = runner.invoke(app, ["collect", "parse", "--profiling-path", str(fixtures / "ascend_prof"),
                              "--database-path", str(db)])
    assert res.exit_code == 0, res.output
    assert "parsed 5 kernel calls from 1 file(s) into 2 CSV(s)" in res.output
    cfg = tmp_path / "m" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 5120, "num_attention_heads": 40,
                               "num_key_value_heads": 8, "intermediate_size": 25600,
                               "num_hidden_layers": 2, "vocab_size": 1000}))
    res = runner.invoke(app, ["collect", "grid", "--database-path", str(db), "--target-models",
                              str(cfg), "--rows", "5", "--seed", "3", "--tp-sizes", "4"])
    assert res.exit_code == 0, res.output
    assert "MatMulV2: +5 rows" in res.output
    rows = read_table(db / "MatMulV2.csv").rows
    assert len(rows) == 2 + 5
    # new rows keep the template's FRACTAL_NZ weight tiling: (n/16, k/16, 16, 16)
    assert all(r["Input Formats"] == "ND;FRACTAL_NZ" for r in rows)
    for r in rows[2:]:
        (m, k), (n16, k16, h0, w0) = [tuple(map(int, t.split(","))) for t in
                                      r["Input Shapes"].split(";")]
        assert (h0, w0) == (16, 16) and k16 * 16 == k
        # tp=4 projections of the config: qkv n=(10+2*2)*128, o_proj, gate_up, down
        assert (n16 * 16, k) in {(1792, 5120), (5120, 1280), (12800, 5120), (5120, 6400)}


def test_malformed_profile_exits_2_with_the_row(fixtures, tmp_path):
    bad = tmp_path / "kernel_details.csv"
    text = (fixtures / "ascend_prof/PROF_001/ASCEND_PROFILER_OUTPUT/kernel_details.csv").read_text()
    bad.write_text(text.replace(",45.0,", ",4.5.0,"))
    res = runner.invoke(app, ["collect", "parse", "--profiling-path", str(bad),
                              "--database-path", str(tmp_path / "db")])
    assert res.exit_code == 2
    assert "row 4" in res.output and "Duration(us)" in res.output
    assert not (tmp_path / "db").exists()


def test_comm_output_csv_needs_one_op(tmp_path):
    res = runner.invoke(app, ["collect", "comm", "--ops", "all_reduce,all_gather",
                              "--output-csv", str(tmp_path / "x.csv")])
    assert res.exit_code == 2 and "--output-csv" in res.output


def test_replay_cpu_from_the_command_line(tmp_path):
    pytest.importorskip("torch")
    db = tmp_path / "db"
    db.mkdir()
    (db / "aten__mm.csv").write_text(
        "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Average Duration(us)\n"
        ',CPU,"4,8;8,2",FLOAT;FLOAT,ND;ND,\n,CPU,"4,8;8,3",FLOAT;FLOAT,ND;ND,7\n')
    res = runner.invoke(app, ["collect", "replay", "--database-path", str(db), "--update-mode",
                              "missing-only", "--repeat-count", "2", "--warmup", "0",
                              "--device", "local_cpu"])
    assert res.exit_code == 0, res.output
    assert "replayed 1 rows on cpu (local_cpu), 0 failed, 1 skipped" in res.output
    assert len(list((db / "reports").glob("profile_update_report_*.md"))) == 1
    from perfcast.collect.tables import read_table

    row = read_table(db / "aten__mm.csv").rows[0]
    assert (row["MicroBench Backend"], row["MicroBench Device"]) == ("cpu", "local_cpu")


def test_list_flags_take_several_values_as_in_the_spec_examples():
    from perfcast.cli.collect import join_list_values

    args = ["--ops", "all_reduce", "all_gather", "--grid-shape", "48", "8", "2",
            "--num-devices", "16", "2", "--dtype", "fp32"]
    assert join_list_values(args) == ["--ops", "all_reduce,all_gather", "--grid-shape", "48",
                                      "8", "2", "--num-devices", "16,2", "--dtype", "fp32"]
    # end to end: the second op is parsed (and rejected) instead of being a stray argument
    res = runner.invoke(app, ["collect", "comm", "--ops", "all_reduce", "bogus",
                              "--grid-shape", "48", "8", "2", "--num-devices", "16", "2"])
    assert res.exit_code == 2 and "unknown op(s) bogus" in res.output
