"""`--calibration REV|default|none` on serve / search / validate silicon."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from perfcast.calibrate import default_revision
from perfcast.calibrate.serving import serving_overheads
from perfcast.cli.main import app
from perfcast.serving.backends import load_backend
from perfcast.serving.deploy import ServeConfig, run_serving

ARGS = ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "4", "--isl", "256", "--osl", "32",
        "--format", "json", "--backend", "trtllm"]


def _serve(*extra: str) -> dict:
    res = CliRunner().invoke(app, [*ARGS, *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_none_reproduces_the_physics_only_numbers():
    physics = run_serving(ServeConfig(model="Qwen/Qwen3-0.6B", backend=load_backend("trtllm"),
                                      isl=256, osl=32, concurrency=4)).metrics.to_json()
    none = _serve("--calibration", "none")
    assert none["calibration"] == "none"
    assert none["ttft_ms"] == physics["ttft_ms"] and none["tpot_ms"] == physics["tpot_ms"]


def test_default_applies_the_shipped_revision():
    rev = default_revision()
    fitted = serving_overheads(rev.part("serving_overheads"))["trtllm"]
    m = _serve()
    assert m["calibration"] == rev.digest
    from perfcast.evidence.calibrated import calibrated_providers
    from perfcast.hardware import load_system
    curves = calibrated_providers(load_system("h100_sxm"), rev)
    assert curves                    # the default revision's curves cover H100
    expect = run_serving(ServeConfig(
        model="Qwen/Qwen3-0.6B", backend=load_backend("trtllm").with_overheads(**fitted),
        isl=256, osl=32, concurrency=4), evidence=curves).metrics.to_json()
    assert m["ttft_ms"] == expect["ttft_ms"]
    assert m["ttft_ms"]["mean"] != _serve("--calibration", "none")["ttft_ms"]["mean"]


def test_a_revision_file_and_a_bad_reference(tmp_path):
    path = tmp_path / "rev.json"
    path.write_text(json.dumps(default_revision().to_json()))
    assert _serve("--calibration", str(path))["calibration"] == default_revision().digest
    res = CliRunner().invoke(app, [*ARGS, "--calibration", "feedface"])
    assert res.exit_code != 0 and "no calibration revision" in res.output


def test_shipped_revision_records_its_fit_and_held_out_scores():
    rev = default_revision()
    part = rev.part("serving_overheads")
    assert part is not None
    assert len(part.fitted_on["observation_sets"]) >= 2
    assert set(part.fitted_on["systems"]) >= {"h100_sxm", "h200_sxm"}
    summary = part.cv["summary"]
    for scheme in ("model", "backend", "system"):
        assert summary[scheme]["held_out"]["rows"] > 1000
    for p in part.parameters:
        assert p.lower <= p.value <= p.upper


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_every_backend_has_fitted_overheads_in_the_default(backend):
    fitted = serving_overheads(default_revision().part("serving_overheads"))
    assert set(fitted[backend]) >= {"frontend_overhead_s", "step_overhead_s"}
