"""`perfcast serve`: one deployment -> metrics JSON with the documented keys."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from perfcast.cli.main import app

KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "throughput_tokens_per_s",
        "tokens_per_s_per_gpu", "tokens_per_s_per_user")


def test_serve_json_keys_and_consistency(tmp_path):
    trace = tmp_path / "trace.json"
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "4", "--isl",
                                   "256", "--osl", "32", "--format", "json", "--chrome-trace",
                                   str(trace)])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    for key in KEYS:
        assert key in m
    for key in KEYS[:4]:
        assert set(m[key]) == {"mean", "p50", "p90", "p99"}
        assert m[key]["p50"] <= m[key]["p99"]
    assert m["completed_requests"] == 40
    assert m["tokens_per_s_per_gpu"] == m["throughput_tokens_per_s"] / m["num_gpus"]
    assert m["e2e_ms"]["mean"] > m["ttft_ms"]["mean"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "decode" for e in events)


def test_serve_disagg_and_open_loop_run():
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--mode", "disagg",
                                   "--decode-workers", "2",
                                   "--request-rate", "5", "--num-requests", "30", "--isl", "128",
                                   "--osl", "16", "--format", "json", "--backend", "sglang"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    assert m["completed_requests"] == 30 and m["num_gpus"] == 3
    # SGLang's own fraction on the default H100 (0.5.3+, TP 1, 8,192-token chunks), for
    # both roles; capacity is one replica's, so one decode worker of two counts
    kv = m["inputs"]["kv_cache"]
    assert set(kv) == {"prefill", "decode"}
    for role in kv.values():
        assert role["memory_fraction"] == 0.836 and role["fraction_from"] == "engine"
        assert role["capacity_tokens"] > 0
    assert kv["prefill"]["capacity_tokens"] == kv["decode"]["capacity_tokens"]
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "2", "--isl",
                                   "128", "--osl", "8", "--format", "json"])
    assert json.loads(res.stdout)["inputs"]["kv_cache"]["agg"]["fraction_from"] == "setting"
    table = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--concurrency", "2", "--isl",
                                     "128", "--osl", "8", "--backend", "sglang"])
    assert "kv cache   fraction 0.836 (the engine's own), " in table.output


def test_decode_slots_move_the_decode_wait_into_ttft():
    """--decode-max-running-requests caps each decode worker's running requests: with 8
    clients on 2 decode workers of 2 slots, half the requests wait for a slot, and since
    the tokens stream from the decode worker that wait is TTFT, not TPOT."""
    base = ["serve", "Qwen/Qwen3-0.6B", "--mode", "disagg", "--decode-workers", "2",
            "--concurrency", "8", "--num-requests", "40", "--isl", "256", "--osl", "64",
            "--format", "json", "--calibration", "none"]
    free = CliRunner().invoke(app, base)
    capped = CliRunner().invoke(app, [*base, "--decode-max-running-requests", "2"])
    assert free.exit_code == 0 and capped.exit_code == 0, (free.output, capped.output)
    f, c = json.loads(free.stdout), json.loads(capped.stdout)
    assert c["inputs"]["scheduler"]["decode_max_running_requests"] == 2
    assert f["inputs"]["scheduler"]["decode_max_running_requests"] is None
    # a waiting request waits about one other request's whole decode (63 iterations)
    assert c["ttft_ms"]["mean"] > f["ttft_ms"]["mean"] + 20 * c["tpot_ms"]["mean"]
    assert c["tpot_ms"]["mean"] < f["tpot_ms"]["mean"]   # smaller decode batches
    agg = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--decode-max-running-requests",
                                   "2"])
    assert agg.exit_code == 2 and "--mode disagg" in agg.output
    bad = CliRunner().invoke(app, [*base, "--decode-max-running-requests", "0"])
    assert bad.exit_code == 2 and "--decode-max-running-requests" in bad.output


def test_serve_bad_input_is_one_line_error():
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--policy", "fifo"])
    assert res.exit_code == 2
    assert "policy" in res.output


def test_serve_open_loop_trace(tmp_path):
    trace = tmp_path / "arrivals.txt"
    trace.write_text("# seconds\n0.0\n0.5\n1.0\n30.0\n")
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--arrival-trace", str(trace),
                                   "--isl", "128", "--osl", "8", "--format", "json"])
    assert res.exit_code == 0, res.output
    m = json.loads(res.stdout)
    assert m["completed_requests"] == 4
    # requests far apart never queue: the slowest TTFT is one prefill plus the frontend
    assert m["ttft_ms"]["p99"] < 2 * m["ttft_ms"]["p50"]
    bad = tmp_path / "bad.txt"
    bad.write_text("soon\n")
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--arrival-trace", str(bad)])
    assert res.exit_code == 2 and "line 1" in res.output
