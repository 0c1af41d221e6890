"""`perfcast evidence query`: every field of a query line is honoured (hardware included),
answers carry their line, blank lines are reported, folders name their own system, and
non-positive dims are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app

FIX = Path(__file__).parents[1] / "fixtures" / "aiconfigurator" / "h100_sxm"
GEMM = {"operation": "gemm", "runtime": "vllm", "runtime_version": "0.19.0",
        "implementation": "vllm_default", "dims": {"m": 128, "n": 4096, "k": 4096}}
runner = CliRunner()


def query(*args):
    return runner.invoke(app, ["evidence", "query", *map(str, args)])


def lines_file(tmp_path, *lines) -> Path:
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_a_line_for_another_system_gets_that_systems_roofline(tmp_path):
    path = lines_file(tmp_path, {**GEMM, "hardware": "h200_sxm"}, "", GEMM)
    result = query(FIX / "gemm", "--queries", path, "--store", tmp_path)
    assert result.exit_code == 0, result.output
    h200, h100 = (json.loads(x) for x in result.stdout.splitlines())
    assert h200["line"] == 1 and h100["line"] == 3
    assert h200["method"] == "analytical" and h200["validity"]["hardware"] == "h200_sxm"
    assert h100["method"] == "measured"
    assert "skipped 1 blank line(s): 2" in result.output
    assert "holds evidence for h100_sxm, not h200_sxm" in result.output


def test_a_folder_keeps_its_own_system_whatever_hardware_is_asked(tmp_path):
    args = ["--operation", "gemm", "--runtime", "vllm", "--runtime-version", "0.19.0",
            "--implementation", "vllm_default", "--dim", "m=128", "--dim", "n=4096",
            "--dim", "k=4096", "--store", tmp_path]
    out = json.loads(query(FIX / "gemm", "--hardware", "h200_sxm", *args).stdout)
    assert out["method"] == "analytical" and out["validity"]["hardware"] == "h200_sxm"
    assert json.loads(query(FIX / "gemm", *args).stdout)["method"] == "measured"


def test_flags_fill_the_fields_a_line_leaves_out(tmp_path):
    path = lines_file(tmp_path, {"dims": {"m": 128}}, {"dims": {"m": 128}, "runtime": "sglang"})
    result = query(FIX / "gemm", "--queries", path, "--store", tmp_path, "--operation", "gemm",
                   "--runtime", "vllm", "--runtime-version", "0.19.0", "--implementation",
                   "vllm_default", "--dim", "n=4096", "--dim", "k=4096", "--policy", "exact")
    first, second = (json.loads(x) for x in result.stdout.splitlines())
    assert first["method"] == "measured"
    assert second["method"] == "analytical"  # the line's runtime wins over the flag


@pytest.mark.parametrize("line,field", [
    ({**GEMM, "hardware": "h999"}, "hardware"),
    ({**GEMM, "dims": {"m": -5, "n": 4096, "k": 4096}}, "dims.m"),
    ({**GEMM, "dims": {"m": 0, "n": 4096, "k": 4096}}, "dims.m"),
    ({**GEMM, "runtime_version": 0.19}, "runtime_version"),
    ({**GEMM, "engine": "tensor"}, "engine"),
    ({"operation": "all_reduce", "dims": {"message_bytes": 4096, "participants": 2.5}},
     "dims.participants"),
    ([1, 2], None),
])
def test_a_bad_line_is_answered_with_its_error(tmp_path, line, field):
    path = lines_file(tmp_path, GEMM, line)
    result = query(FIX / "gemm", "--queries", path, "--store", tmp_path)
    assert result.exit_code == 1 and "Traceback" not in result.output
    good, bad = (json.loads(x) for x in result.stdout.splitlines())
    assert good["line"] == 1 and bad["line"] == 2 and f"{path}:2" in bad["error"]
    if field:
        assert f"field '{field}'" in bad["error"]
    assert "1 of 2 queries failed" in result.output


@pytest.mark.parametrize("dim", ["m=-5", "m=0", "m=nan"])
def test_non_positive_dims_on_the_command_line_are_refused(tmp_path, dim):
    result = query(FIX / "gemm", "--store", tmp_path, "--operation", "gemm", "--dim", dim,
                   "--dim", "n=4096", "--dim", "k=4096")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "field '--dim m'" in result.output and "not a positive number" in result.output
