"""`perfcast observe import silicon` -> `perfcast calibrate fit|list|show` -> `--calibration`
on a small real slice of the public H100 rows (16 TRT-LLM rows, two models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app

HERE = Path(__file__).resolve().parent
SLICE = HERE.parents[0] / "fixtures" / "calibrate" / "silicon_small.csv"
CONFIGS = HERE.parents[2] / "shared" / "reference" / "model_configs"


def run(*args: str) -> str:
    """stdout of one command (progress goes to stderr)."""
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    obs, cal = str(root / "obs"), str(root / "cal")
    imported = json.loads(run("observe", "import", "silicon", str(SLICE), "--store", obs))
    assert imported["rows"] == 16
    out = run("calibrate", "fit", "--observations", imported["observation_set"][:16],
              "--observation-store", obs, "--store", cal, "--model-configs", str(CONFIGS),
              "--cv", "model", "--min-train-rows", "6", "--workers", "1", "--format", "json")
    return json.loads(out), obs, cal, imported["observation_set"]


def test_fit_prints_revision_parameters_fitted_on_and_cv(fitted):
    doc, _, _, digest = fitted
    assert doc["revision"].startswith("sha256:")
    assert doc["fitted_on"]["observation_sets"] == [digest]
    assert "serving.trtllm.frontend_overhead_us" in doc["parameters"]
    cv = doc["cv"]
    assert cv["group_by"] == "model"
    groups = {f["group"] for f in cv["folds"]}
    assert groups == {"Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct"}
    for fold in cv["folds"]:
        assert fold["rows"] == 8 and fold["train_rows"] == 8
        assert fold["held_out"]["ttft_mape"] is not None
        assert fold["in_sample"]["method"] == "linearised"
    assert cv["summary"]["held_out"]["rows"] == 16


def test_list_show_and_use_the_stored_revision(fitted):
    doc, _, cal, _ = fitted
    listed = json.loads(run("calibrate", "list", "--store", cal, "--format", "json"))
    assert doc["revision"] in {x["revision"] for x in listed}
    shown = json.loads(run("calibrate", "show", doc["revision"][7:20], "--store", cal,
                           "--format", "json"))
    assert shown["revision"] == doc["revision"]
    assert "leave one model out" in run("calibrate", "show", doc["revision"], "--store", cal)
    import os
    os.environ["PERFCAST_CALIBRATION_STORE"] = cal
    try:
        m = json.loads(run("serve", "meta-llama/Llama-3.1-8B", "--backend", "trtllm",
                           "--concurrency", "2", "--isl", "128", "--osl", "16",
                           "--calibration", doc["revision"][7:20], "--format", "json"))
    finally:
        del os.environ["PERFCAST_CALIBRATION_STORE"]
    assert m["calibration"] == doc["revision"]
    assert m["calibration_held_out_error"]["leave_one_model_out"]["rows"] == 16


def test_fit_refuses_kernel_observations_and_bad_digests(fitted):
    _, obs, cal, _ = fitted
    res = CliRunner().invoke(app, ["calibrate", "fit", "--observations", "0000ffff",
                                   "--observation-store", obs, "--store", cal, "--cv", "model"])
    assert res.exit_code != 0 and "0000ffff" in res.output


def test_fit_kernels_refuses_serving_observations(fitted):
    _, obs, cal, digest = fitted
    res = CliRunner().invoke(app, ["calibrate", "fit-kernels", "--observations", digest,
                                   "--observation-store", obs, "--store", cal])
    assert res.exit_code != 0 and "holds serving observations" in res.output


def test_fit_progress_moves_the_bar_on_passes_and_prints_phases():
    import io

    from rich.console import Console

    from perfcast.cli.calibrate import _report

    out, moves = io.StringIO(), []
    console = Console(file=out, width=120)
    _report("linearise: 3/12 passes", console, lambda d, t: moves.append((d, t)))
    _report("fold model=x: fitted on 40 rows", console, lambda d, t: moves.append((d, t)))
    assert moves == [(3, 12)]
    assert "fold model=x" in out.getvalue() and "passes" not in out.getvalue()


def test_fit_with_disagg_handoff_says_when_there_are_too_few_disagg_rows(fitted, tmp_path):
    """`--disagg-handoff` on agg rows only: the overheads are fitted, the handoff is not,
    and the run says why (the handoff's own fit: tests/calibrate/test_disagg_handoff.py)."""
    _, obs, _, digest = fitted
    res = CliRunner().invoke(app, [
        "calibrate", "fit", "--observations", digest[:16], "--observation-store", obs,
        "--store", str(tmp_path / "cal"), "--model-configs", str(CONFIGS), "--cv", "model",
        "--min-train-rows", "6", "--workers", "1", "--format", "json", "--disagg-handoff"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert "disagg_handoff" not in doc and "serving.trtllm.frontend_overhead_us" in doc["parameters"]
    assert "disagg handoff not fitted: 0 disagg rows" in res.output + getattr(res, "stderr", "")
