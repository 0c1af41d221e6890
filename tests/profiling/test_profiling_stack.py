"""A profiling database's device and software stack, shown and compared with the
estimate's before any lookup: a device mismatch stops the run, a software one is a stated
assumption."""

import json
import shutil

from profiling_helpers import DB, REAL_MAPPING
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.evidence.profiling.op_mapping import load_op_mapping
from perfcast.evidence.profiling.stack import stack_compatibility

ATLAS = "atlas_800_a3_752t_128g_die"
BASE = ["estimate", "Qwen/Qwen3-8B", "--device", ATLAS, "--calibration", "none",
        "--performance-model", "profiling", "--decode", "--num-queries", "8",
        "--context-length", "2048", "--query-length", "1"]
runner = CliRunner()


def test_the_real_mapping_against_a_matching_and_a_newer_runtime():
    mapping = load_op_mapping(REAL_MAPPING)
    same = stack_compatibility(mapping, ATLAS, "v0.18.0")
    assert (same["version"], same["cann_version"], same["pytorch_version"]) == \
        ("0.18.0", "8.5", "2.9.0")
    c = same["compatibility"]
    assert c["device"] == {"database": "ATLAS_800_A3_752T_128G_DIE",
                           "database_catalog_id": ATLAS, "estimate": ATLAS, "same": True}
    assert c["version"]["status"] == "same"
    assert c["cann_version"]["status"] == c["pytorch_version"]["status"] == "not_stated"
    assert same["warnings"] == []
    (taken,) = same["assumptions"]
    assert "CANN 8.5" in taken and "PyTorch 2.9.0" in taken
    newer = stack_compatibility(mapping, ATLAS, "0.19.0")
    assert newer["compatibility"]["version"] == {
        "database": "0.18.0", "estimate": "0.19.0", "status": "differs",
        "estimate_flag": "--runtime-version"}
    (warning,) = newer["warnings"]
    assert "0.18.0" in warning and "0.19.0" in warning and warning in newer["assumptions"]
    # no runtime version stated: the database's is taken over, and said so
    unstated = stack_compatibility(mapping, ATLAS)
    assert unstated["compatibility"]["version"]["status"] == "not_stated"
    assert "no --runtime-version given" in unstated["assumptions"][0]
    # another device: compared, not equal (the estimate refuses it; see below)
    assert stack_compatibility(mapping, "h100_sxm")["compatibility"]["device"]["same"] is False


def _without(tmp_path, *lines):
    d = tmp_path / "db"
    shutil.copytree(DB, d)
    text = (d / "op_mapping.yaml").read_text()
    for line in lines:
        assert line in text
        text = text.replace(line, "")
    (d / "op_mapping.yaml").write_text(text)
    return d


def test_undeclared_fields_are_a_warning(tmp_path):
    d = _without(tmp_path, 'cann_version: "8.5"\n', 'pytorch_version: "2.9.0"\n')
    info = stack_compatibility(load_op_mapping(d), ATLAS, "0.18.0")
    assert info["cann_version"] is None
    assert info["compatibility"]["cann_version"]["status"] == "undeclared"
    (warning,) = info["warnings"]
    assert "declares no cann_version, pytorch_version" in warning


def test_estimate_json_shows_the_stack_and_warns_on_a_difference():
    r = runner.invoke(app, [*BASE, "--profiling-database", str(DB), "--format", "json",
                            "--runtime-version", "0.19.0"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    db = doc["sources"]["profiling_database"]
    assert (db["version"], db["cann_version"], db["pytorch_version"]) == ("0.18.0", "8.5",
                                                                           "2.9.0")
    assert db["compatibility"]["version"]["status"] == "differs"
    assert any("0.19.0" in w for w in doc["warnings"])
    same = runner.invoke(app, [*BASE, "--profiling-database", str(DB), "--format", "json",
                               "--runtime-version", "0.18.0"])
    assert json.loads(same.stdout)["warnings"] == []


def test_estimate_table_shows_the_stack_and_its_assumptions():
    r = runner.invoke(app, [*BASE, "--profiling-database", str(DB)],
                      env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "device ATLAS_800_A3_752T_128G_DIE, version 0.18.0, CANN 8.5, PyTorch 2.9.0" \
        in r.output
    assert "assumption: software stack: the estimate assumes the profiling database's" \
        in r.output


def test_a_device_mismatch_names_both_before_any_lookup(monkeypatch):
    from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource

    def no_lookup(self, op):
        raise AssertionError("looked up before the device check")
    monkeypatch.setattr(ProfilingDataSource, "lookup", no_lookup)
    r = runner.invoke(app, [*BASE[:3], "h100_sxm", *BASE[4:], "--profiling-database",
                            str(DB)])
    assert r.exit_code == 2
    assert "ATLAS_800_A3_752T_128G_DIE" in r.output and "h100_sxm" in r.output
