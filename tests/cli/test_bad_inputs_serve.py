"""Bad inputs to `serve` and `search`: exit code 2, one message naming the file / flag /
field, no traceback, nothing written. Checks that must come before any computation are
tested with an unknown model too: the check's message, not the model's, must win."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.hardware.catalog_loader import _catalog_dir
from perfcast.workload import load_model_spec

SMALL = ["--isl", "128", "--osl", "8"]


def _fails(args, *texts, tmp_path: Path | None = None):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert res.output.startswith("error: ") or "\nerror: " in res.output, res.output
    for text in texts:
        assert text in res.output, (text, res.output)
    if tmp_path is not None:   # nothing half-written
        assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()
                      and p.suffix in (".tmp", ".json", ".html", ".png")) == []
    return res.output


# -- client mode: an arrival rate or trace means open loop --------------------------------

@pytest.mark.parametrize("extra, flag", [
    (["--request-rate", "2", "--concurrency", "4"], "--request-rate"),
    (["--arrival-trace", "TRACE", "--concurrency", "4"], "--arrival-trace"),
    (["--arrival-trace", "TRACE", "--request-rate", "2"], "--request-rate"),
])
def test_open_and_closed_loop_flags_exclude_each_other(tmp_path, extra, flag):
    trace = tmp_path / "arrivals.txt"
    trace.write_text("0\n1\n")
    args = [str(trace) if a == "TRACE" else a for a in extra]
    _fails(["serve", "Qwen/Qwen3-0.6B", *SMALL, *args], flag)


@pytest.mark.parametrize("extra, field", [(["--request-rate", "0"], "--request-rate"),
                                          (["--request-rate", "-3"], "--request-rate"),
                                          (["--concurrency", "0"], "--concurrency"),
                                          (["--num-requests", "-1"], "--num-requests")])
def test_non_positive_clients_and_rates(extra, field):
    _fails(["serve", "Qwen/Qwen3-0.6B", *SMALL, *extra], field)


def test_missing_arrival_trace_is_a_normal_error(tmp_path):
    missing = tmp_path / "nope.txt"
    _fails(["serve", "Qwen/Qwen3-0.6B", "--arrival-trace", str(missing)], str(missing),
           "--arrival-trace")


def test_short_arrival_trace_names_the_file(tmp_path):
    trace = tmp_path / "arrivals.txt"
    trace.write_text("0\n1\n")
    _fails(["serve", "Qwen/Qwen3-0.6B", "--arrival-trace", str(trace), "--num-requests", "5"],
           str(trace), "2 arrivals")


# -- output paths are checked before any work ----------------------------------------------

def test_serve_chrome_trace_in_missing_folder_fails_first(tmp_path):
    out = tmp_path / "missing" / "trace.json"
    _fails(["serve", "no/such-model", "--chrome-trace", str(out)], "--chrome-trace",
           str(out.parent), tmp_path=tmp_path)


@pytest.mark.parametrize("name, text", [("missing/front.html", "does not exist"),
                                        ("front.svg", "unknown plot format")])
def test_search_plot_path_is_checked_before_searching(tmp_path, name, text):
    _fails(["search", "no/such-model", "--plot", str(tmp_path / name)], "--plot", text,
           tmp_path=tmp_path)


# -- request counts that would take minutes ---------------------------------------------------

@pytest.mark.parametrize("command, extra", [
    ("serve", ["--concurrency", "1000000"]),
    ("serve", ["--num-requests", "5000000"]),
    ("search", ["--concurrency", "4,1000000"]),
])
def test_huge_request_counts_are_refused_before_simulating(command, extra):
    # the guard fires before the (unknown) model is even read
    _fails([command, "no/such-model", *extra], "100,000", "--allow-long-run")


def test_allow_long_run_lifts_the_guard():
    out = _fails(["serve", "no/such-model", "--concurrency", "1000000", "--allow-long-run"],
                 "unknown model")
    assert "--allow-long-run" not in out


def test_slo_percentile_must_be_50_90_or_99():
    _fails(["search", "Qwen/Qwen3-0.6B", "--slo-percentile", "95"], "--slo-percentile",
           "50, 90 or 99")


# -- device YAML -------------------------------------------------------------------------------

def _device(tmp_path, edit) -> Path:
    data = yaml.safe_load((_catalog_dir() / "h100_sxm.yaml").read_text())
    data["name"] = "mine"
    edit(data)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("command", ["serve", "search"])
def test_device_yaml_unknown_key_names_file_and_key(tmp_path, command):
    path = _device(tmp_path, lambda d: d.update(efficency={"matrix": 0.5}))
    _fails([command, "Qwen/Qwen3-0.6B", "--device", str(path)], str(path), "efficency",
           "keys among")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["device"]["memory"].update(bandwidth_gb_per_s=0), "bandwidth_gb_per_s"),
    (lambda d: d["device"]["matrix_engine"]["peak_tflops"].update(bf16=0), "peak_tflops.bf16"),
    (lambda d: d["interconnect"][0].update(bandwidth_gb_per_s=0),
     "interconnect[0].bandwidth_gb_per_s"),
])
def test_device_yaml_zero_rates_are_refused(tmp_path, edit, field):
    path = _device(tmp_path, edit)
    _fails(["serve", "Qwen/Qwen3-0.6B", *SMALL, "--concurrency", "2", "--device", str(path)],
           str(path), field, "positive")


# -- model configs -----------------------------------------------------------------------------

def _config(tmp_path, **changes) -> Path:
    cfg = json.loads(Path(load_model_spec("Qwen/Qwen3-0.6B").source).read_text())
    cfg.update(changes)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("changes, field", [
    ({"hidden_size": 1000, "num_attention_heads": 16, "num_key_value_heads": 8,
      "head_dim": None}, "head_dim"),
    ({"vocab_size": 10**12}, "vocab_size"),
    ({"hidden_size": 10**9}, "hidden_size"),
    ({"num_hidden_layers": 10**7}, "num_hidden_layers"),
])
@pytest.mark.parametrize("command", ["serve", "search"])
def test_bad_model_configs_name_file_and_field(tmp_path, changes, field, command):
    path = _config(tmp_path, **changes)
    _fails([command, str(path), *SMALL], str(path), f"'{field}'")
