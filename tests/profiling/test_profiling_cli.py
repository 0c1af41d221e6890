"""`perfcast estimate --performance-model ...` and `perfcast profiling validate`."""

import json

import pytest
from profiling_helpers import DB
from typer.testing import CliRunner

from perfcast.cli.main import app

runner = CliRunner()
BASE = ["estimate", "Qwen/Qwen3-8B", "--device", "atlas_800_a3_752t_128g_die"]


def test_smoke_both_models_and_metrics_file(tmp_path):
    out = tmp_path / "out.json"
    r = runner.invoke(app, [*BASE, "--performance-model", "analytic", "profiling",
                            "--profiling-database", str(DB), "--export-empirical-metrics",
                            str(out)])
    assert r.exit_code == 0, r.output
    assert "performance model: analytic" in r.output and "performance model: profiling" in r.output
    doc = json.loads(out.read_text())
    assert {"m1", "m2", "m3", "m4", "m5", "misses"} <= set(doc)
    assert 0 < doc["m5"]["m5_simulated_latency_coverage"] < 1


def test_json_holds_both_models(tmp_path):
    r = runner.invoke(app, [*BASE, "--performance-model", "analytic", "profiling",
                            "--profiling-database", str(DB), "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert set(doc["models"]) == {"analytic", "profiling"}
    analytic, prof = doc["models"]["analytic"], doc["models"]["profiling"]
    assert {op["provider"] for op in analytic["ops"]} <= {"roofline", "collective_model"}
    qkv = next(op for op in prof["ops"] if op["lineage"] == "L0-35.attn.qkv_proj")
    assert (qkv["method"], qkv["provider"]) == ("measured", "profiling")
    assert qkv["statistics"]["kernel_type"] == "MatMulV3"
    assert qkv["latency_s"] == pytest.approx(36 * 205.0e-6)
    assert prof["latency_s"] == pytest.approx(sum(op["latency_s"] for op in prof["ops"]))


def test_analytic_does_not_construct_a_data_source(monkeypatch):
    import perfcast.evidence.profiling.profiling_data_source as pds

    def boom(*a, **k):
        raise AssertionError("ProfilingDataSource constructed in analytic mode")
    monkeypatch.setattr(pds.ProfilingDataSource, "__init__", boom)
    r = runner.invoke(app, [*BASE, "--performance-model", "analytic", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert "models" not in json.loads(r.output)


def test_profiling_requires_a_database():
    r = runner.invoke(app, [*BASE, "--performance-model", "profiling"])
    assert r.exit_code == 2 and "--profiling-database" in r.output


def test_profiling_only_flags_need_profiling(tmp_path):
    r = runner.invoke(app, [*BASE, "--export-empirical-metrics", str(tmp_path / "m.json")])
    assert r.exit_code == 2 and "--export-empirical-metrics" in r.output
    r = runner.invoke(app, [*BASE, "--performance-model", "analytic", "extra"])
    assert r.exit_code == 2 and "unexpected argument" in r.output


def test_interpolate_is_an_explicit_switch():
    args = [*BASE, "--tp-size", "2", "--decode", "--context-length", "3072",
            "--num-queries", "8", "--query-length", "1", "--performance-model", "profiling",
            "--profiling-database", str(DB), "--format", "json"]
    exact = json.loads(runner.invoke(app, args).output)
    interp = json.loads(runner.invoke(app, [*args, "--interpolate"]).output)
    core = lambda d: next(o for o in d["ops"] if o["lineage"] == "L0-35.attn.core")  # noqa: E731
    assert core(exact)["provider"] == "roofline"
    assert (core(interp)["method"], core(interp)["provider"]) == ("interpolated", "profiling")


def test_chrome_trace_args(tmp_path):
    trace = tmp_path / "t.json"
    # the prefill of the TensorCast run qwen3_8b_prefill_tp1 (512 tokens)
    r = runner.invoke(app, [*BASE, "--query-length", "512", "--performance-model", "profiling",
                            "--profiling-database", str(DB), "--chrome-trace", str(trace)])
    assert r.exit_code == 0, r.output
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    mm = next(e for e in events if e["name"] == "L0.attn.qkv_proj")["args"]
    assert {"source", "confidence", "kernel_type", "shape_match_rule", "kernel_shapes"} <= set(mm)
    norm = next(e for e in events if e["name"] == "L0.attn.input_norm")["args"]
    assert (norm["kernel_type"], norm["shape_match_rule"], norm["kernel_shapes"]) == (
        "RmsNorm", "batch_strip", "512,4096;4096")
    rope = next(e for e in events if e["name"] == "L0.attn.rope")["args"]
    assert (rope["kernel_type"], rope["kernel_shapes"]) == (
        "_triton_rope", "512,32,128;512,8,128;512,128")
    # 1024 tokens: no row of that RmsNorm shape
    r = runner.invoke(app, [*BASE, "--performance-model", "profiling", "--profiling-database",
                            str(DB), "--chrome-trace", str(trace)])
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    norm = next(e for e in events if e["name"] == "L0.attn.input_norm")["args"]
    assert norm["shape_match_rule"] == "analytic" and "shape_mismatch" in norm["miss_reason"]


def test_validate_command(tmp_path):
    r = runner.invoke(app, ["profiling", "validate", str(DB)])
    assert r.exit_code == 0 and "0 errors" in r.output
    (tmp_path / "op_mapping.yaml").write_text(
        "operator_mappings:\n  aten.mm.default: {kernel_type: MatMulV2}\n")
    r = runner.invoke(app, ["profiling", "validate", str(tmp_path)])
    assert r.exit_code == 1 and "MatMulV2.csv: missing" in r.output
