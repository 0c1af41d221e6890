"""`perfcast train`: JSON fields, Chrome trace, errors naming the flag (exit 2)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from perfcast.cli.main import app

BASE = ["train", "megatron/gpt-1.7b", "--device", "h100_sxm", "--global-batch-size", "16",
        "--micro-batch-size", "2", "--seq-length", "1024"]


def run(*args):
    return CliRunner().invoke(app, [*BASE, *args])


def test_json_has_the_documented_fields():
    r = run("--num-devices", "8", "--tp-size", "2", "--pp-size", "2", "--dp-size", "2",
            "--virtual-pipeline-size", "2", "--sequence-parallel", "--recompute", "selective",
            "--zero-stage", "1", "--format", "json", "--calibration", "none")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    for key in ("step_time_s", "tokens_per_s", "mfu", "hfu", "flop_convention", "ops"):
        assert key in doc
    assert set(doc["memory_bytes"]) == {"weights", "gradients", "optimizer", "activations",
                                        "buffers", "total", "capacity"}
    assert set(doc["breakdown_s"]) == {"forward", "backward", "recompute", "optimizer",
                                       "pp_bubble", "dp_comm_exposed", "tp_comm_exposed"}
    assert sum(doc["breakdown_s"].values()) == doc["step_time_s"] or abs(
        sum(doc["breakdown_s"].values()) - doc["step_time_s"]) < 1e-9 * doc["step_time_s"]
    op = doc["ops"][0]
    for key in ("lineage", "operator", "latency_s", "method", "provider", "flops", "pass"):
        assert key in op
    assert {o["pass"] for o in doc["ops"]} == {"forward", "backward", "backward+dp",
                                               "optimizer"}
    assert 0 < doc["mfu"] <= doc["hfu"] < 1
    # the step ends with the last rank's optimizer step (or ZeRO's parameter all-gather)
    assert doc["critical_path"][-1].split("@")[0] in ("optimizer", "dp.param_all_gather")


def test_chrome_trace_is_written(tmp_path):
    path = tmp_path / "train.json"
    r = run("--num-devices", "4", "--pp-size", "2", "--dp-size", "2", "--chrome-trace",
            str(path))
    assert r.exit_code == 0, r.output
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    # 16 / (2 x 2) = 4 microbatches: 4 forward + 4 backward passes on each of 2 ranks
    assert sum(1 for e in slices if e["cat"] in ("F", "B")) == 16
    assert {e["pid"] for e in slices} == {0, 1}


def test_errors_name_the_flag_and_exit_2():
    cases = [(["--num-devices", "6", "--tp-size", "2", "--dp-size", "2"], "--num-devices"),
             (["--num-devices", "5", "--pp-size", "5"], "--pp-size"),
             (["--num-devices", "3", "--dp-size", "3"], "--global-batch-size"),
             (["--num-devices", "5", "--tp-size", "5"], "--tp-size"),
             (["--num-devices", "1", "--recompute", "some"], "--recompute"),
             (["--num-devices", "1", "--dtype", "int8"], "--dtype")]
    for args, flag in cases:
        r = run(*args)
        assert r.exit_code == 2, (args, r.output)
        assert flag in r.output and "Traceback" not in r.output, (args, r.output)


def test_evidence_answers_training_gemms_through_the_estimate_options():
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator" / "h100_sxm"
    r = CliRunner().invoke(app, [
        "train", "meta-llama/Llama-3.1-8B", "--num-devices", "8", "--tp-size", "2",
        "--dp-size", "4", "--global-batch-size", "32", "--micro-batch-size", "1",
        "--seq-length", "4096", "--evidence", str(fixture), "--runtime", "vllm",
        "--runtime-version", "0.19.0", "--implementation", "gemm=vllm_default",
        "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output[r.output.index("{"):])
    assert doc["sources"]["evidence"][0]["hardware"] == ["h100_sxm"]
    measured = [o for o in doc["ops"] if o["method"] in ("measured", "interpolated")]
    assert measured and all(o["operator"] == "aten.mm.default" for o in measured)


def test_overlap_param_gather_flag():
    args = ("--num-devices", "8", "--dp-size", "8", "--zero-stage", "1", "--format", "json",
            "--calibration", "none")
    off = json.loads(run(*args).output)
    r = run(*args, "--overlap-param-gather")
    assert r.exit_code == 0, r.output
    on = json.loads(r.output)
    assert on["step_time_s"] < off["step_time_s"]
    bad = run("--num-devices", "8", "--dp-size", "8", "--overlap-param-gather")
    assert bad.exit_code == 2 and "--overlap-param-gather" in bad.output


def test_pipeline_split_flags():
    args = ("--num-devices", "8", "--pp-size", "2", "--dp-size", "4", "--format", "json",
            "--calibration", "none")
    flags = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
    r = run(*args, *flags)
    assert r.exit_code == 0, r.output
    # 24 layers + 2 slots = 13 per rank, one layer fewer on each: 12 + 12, the even split
    assert json.loads(r.output)["step_time_s"] == json.loads(run(*args).output)["step_time_s"]
    bad = run("--num-devices", "8", "--pp-size", "4", "--dp-size", "2", *flags)
    assert bad.exit_code == 2 and "--pp-size" in bad.output and "26" in bad.output


def test_no_gradient_accumulation_fusion_flag():
    args = ("--num-devices", "8", "--dp-size", "8", "--format", "json", "--calibration", "none")
    fused = json.loads(run(*args).output)
    r = run(*args, "--no-gradient-accumulation-fusion")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["step_time_s"] == fused["step_time_s"]  # 16 / (2 x 8) = 1 microbatch
    args = ("--num-devices", "2", "--dp-size", "2", "--format", "json", "--calibration", "none")
    fused = json.loads(run(*args).output)
    r = run(*args, "--no-gradient-accumulation-fusion")
    assert json.loads(r.output)["step_time_s"] > fused["step_time_s"]  # 4 microbatches


def test_cross_entropy_loss_fusion_flag():
    args = ("--num-devices", "2", "--dp-size", "2", "--format", "json", "--calibration", "none")
    unfused = json.loads(run(*args).output)
    r = run(*args, "--cross-entropy-loss-fusion")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["step_time_s"] < unfused["step_time_s"]
