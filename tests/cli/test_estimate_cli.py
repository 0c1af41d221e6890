import json

from typer.testing import CliRunner

from perfcast.cli.main import app

runner = CliRunner()


def run(*args):
    result = runner.invoke(app, list(args), env={"COLUMNS": "250"})
    return result


def test_json_fields_and_consistency():
    r = run("estimate", "meta-llama/Llama-3.1-70B", "--device", "h100_sxm", "--tp-size", "8",
            "--num-queries", "64", "--query-length", "1", "--context-length", "4096", "--decode",
            "--format", "json", "--calibration", "none")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["calibration"] == {"revision": "none", "analytic_efficiency": False}
    for key in ("latency_s", "tokens_per_s_per_device", "work", "memory_bytes", "ops"):
        assert key in doc
    assert set(doc["memory_bytes"]) >= {"weights", "kv_cache", "activations", "total", "capacity"}
    op = doc["ops"][0]
    assert set(op) >= {"lineage", "operator", "count", "latency_s", "method", "provider",
                       "flops", "bytes"}
    assert abs(sum(o["latency_s"] for o in doc["ops"]) - doc["latency_s"]) < 1e-12
    assert abs(sum(o["flops"] for o in doc["ops"]) - doc["work"]["flops"]) <= 1e-6 * doc["work"]["flops"]
    assert doc["tokens_per_s_per_device"] == 64 / doc["latency_s"] / 8
    # 70B bf16 over 8 GPUs is about 17.6 GB of weights per device
    assert 16e9 < doc["memory_bytes"]["weights"] < 18.5e9
    assert {o["method"] for o in doc["ops"]} == {"analytical"}
    assert any(o["operator"] == "tensor_cast.all_reduce.default" for o in doc["ops"])


def test_json_ops_carry_input_and_output_tensors():
    r = run("estimate", "meta-llama/Llama-3.1-70B", "--tp-size", "8", "--num-queries", "4",
            "--query-length", "1", "--context-length", "100", "--decode", "--format", "json",
            "--calibration", "none")
    assert r.exit_code == 0, r.output
    ops = {o["group"]: o for o in json.loads(r.output)["ops"]}
    # the o-projection of 4 decode tokens: x [4, 64 heads x 128 / tp 8] times W [1024, 8192]
    o_proj = ops["attn.o_proj"]
    assert o_proj["inputs"][0] == [[4, 1024], "bf16"]
    assert [[4, 8192], "bf16"] in o_proj["outputs"]
    assert ops["embed.lookup"]["inputs"][0] == [[4], "int64"]
    assert all(isinstance(o["inputs"], list) and isinstance(o["outputs"], list)
               for o in ops.values())


def test_table_output_and_memory_warning():
    r = run("estimate", "meta-llama/Llama-3.1-405B", "--device", "h100_sxm", "--tp-size", "1",
            "--query-length", "16")
    assert r.exit_code == 0, r.output
    assert "does not fit" in r.output
    assert "tokens/s per device" in r.output


def test_chrome_trace_is_valid_trace_event_json(tmp_path):
    trace = tmp_path / "t.json"
    r = run("estimate", "Qwen/Qwen3-8B", "--tp-size", "2", "--query-length", "128",
            "--chrome-trace", str(trace), "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in spans)
    assert {e["name"] for e in events if e["ph"] == "M"} >= {"process_name", "thread_name"}
    # every layer appears: 36 layers of Qwen3-8B
    assert any(e["name"].startswith("L35.") for e in spans)


def test_dump_input_shapes_groups_by_shape():
    r = run("estimate", "Qwen/Qwen3-8B", "--query-length", "64", "--dump-input-shapes")
    assert r.exit_code == 0, r.output
    assert "input shapes" in r.output
    assert "64,4096;4096,6144" in r.output  # qkv_proj: [tokens, hidden] x [hidden, (32+2*8)*128]


def test_errors_are_one_clear_line():
    r = run("estimate", "no/such-model")
    assert r.exit_code == 2
    r = run("estimate", "Qwen/Qwen3-8B", "--device", "nope")
    assert r.exit_code == 2 and "unknown device 'nope'" in r.output
    r = run("estimate", "Qwen/Qwen3-8B", "--decode")
    assert r.exit_code == 2 and "--context-length" in r.output


def test_default_calibration_answers_fitted_classes_and_names_its_revision():
    from perfcast.calibrate import default_revision
    args = ("estimate", "meta-llama/Llama-3.1-70B", "--tp-size", "8", "--num-queries", "64",
            "--query-length", "1", "--context-length", "4096", "--decode", "--format", "json")
    doc = json.loads(run(*args).output)
    digest = default_revision().digest
    assert doc["calibration"] == {"revision": digest, "analytic_efficiency": True}
    calibrated = [o for o in doc["ops"] if o["method"] == "calibrated"]
    assert {o["operator"] for o in calibrated} >= {"aten.mm.default",
                                                   "tensor_cast.attention.default"}
    physics = {o["lineage"]: o for o in json.loads(
        run(*args, "--calibration", "none").output)["ops"]}
    for o in doc["ops"]:             # everything else is the physics-only answer
        if o["method"] != "calibrated":
            assert o["latency_s"] == physics[o["lineage"]]["latency_s"]
    # on a device of the same vendor the curves were not fitted on, they apply without
    # records of it, and every such answer says so; on another vendor's, nothing
    b200 = json.loads(run(*args, "--device", "b200_sxm").output)
    assert b200["calibration"]["analytic_efficiency"] is True
    moved = [o for o in b200["ops"] if o["method"] == "calibrated"]
    assert moved and all(any("applied to b200_sxm without any record of it" in a
                             for a in o["assumptions"]) for o in moved)
    mi300x = json.loads(run(*args, "--device", "mi300x").output)
    assert mi300x["calibration"]["analytic_efficiency"] is False
    assert all(o["method"] != "calibrated" for o in mi300x["ops"])


def test_table_names_a_stack_other_than_the_default():
    args = ("estimate", "Qwen/Qwen3-8B", "--num-queries", "8", "--query-length", "1",
            "--context-length", "1024", "--decode")
    ascend = run(*args, "--device", "atlas_800_a3_752t_128g_die")
    assert ascend.exit_code == 0, ascend.output
    assert "operator stack: tensorcast" in ascend.output  # --stack auto on an Ascend NPU
    gpu = run(*args, "--device", "h100_sxm")
    assert gpu.exit_code == 0 and "operator stack" not in gpu.output
    assert "operator stack: tensorcast" in run(*args, "--device", "h100_sxm", "--stack",
                                               "tensorcast").output
