"""`serve` and `search` say what they simulated and where their numbers came from;
an arrival rate means open loop; search says why configurations failed."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.serving.search import SearchSpace, default_ep_sizes, failure_counts, search
from perfcast.workload import load_model_spec

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator"
SMALL = ["--isl", "256", "--osl", "16"]


def _serve(*args, model="Qwen/Qwen3-0.6B"):
    res = CliRunner().invoke(app, ["serve", model, *SMALL, "--format", "json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_request_rate_alone_runs_open_loop():
    m = _serve("--request-rate", "2")
    # open loop: the documented 200 requests, not 10 x the 8 default clients
    assert m["completed_requests"] == 200
    client = m["inputs"]["client"]
    assert client["kind"] == "open_loop_poisson" and client["concurrency"] is None
    assert client["request_rate_per_s"] == 2.0
    closed = _serve("--concurrency", "8", "--num-requests", "200")
    assert closed["inputs"]["client"]["kind"] == "closed_loop"
    # 2 req/s arrive far apart: no prefill waits for another, unlike 8 clients at t=0
    assert m["ttft_ms"]["mean"] < closed["ttft_ms"]["mean"]


def test_serve_json_echoes_inputs_and_provenance():
    m = _serve("--concurrency", "4", "--tp-size", "2", "--backend", "sglang",
               "--backend-version", "0.5.9")
    inp = m["inputs"]
    assert inp["model"] == "Qwen/Qwen3-0.6B" and inp["model_digest"].startswith("sha256:")
    assert inp["device"] == "h100_sxm" and inp["system_digest"].startswith("sha256:")
    assert inp["backend"] == "sglang" and inp["backend_version"] == "0.5.9"
    assert inp["layout"]["tp"] == 2 and inp["mode"] == "agg"
    assert inp["client"] == {"kind": "closed_loop", "concurrency": 4, "request_rate_per_s": None,
                             "arrival_trace": None, "num_requests": 40, "isl": 256, "osl": 16,
                             "range_ratio": 1.0, "warmup_requests": 0, "seed": 0}
    prov = m["provenance"]
    assert prov["calibration"] == m["calibration"] != "none"
    assert prov["answers"] and all(a["method"] == "calibrated" for a in prov["answers"])
    answered = sum(a["queries"] for a in prov["answers"])
    assert prov["cost_queries"] == answered + prov["analytic"]["queries"]
    physics = _serve("--concurrency", "4", "--calibration", "none")["provenance"]
    assert physics["answers"] == [] and physics["analytic"]["queries"] is None
    assert physics["calibration"] == "none"


def test_serve_provenance_names_measured_evidence():
    m = _serve("--concurrency", "2", "--evidence-root", str(ROOT), "--backend-version",
               "0.19.0", "--calibration", "none", model="meta-llama/Llama-3.1-8B")
    prov = m["provenance"]
    assert prov["evidence"]["version"] == "0.19.0" and prov["evidence"]["root"] == str(ROOT)
    measured = [a for a in prov["answers"] if a["provider"] in ("database", "interpolation")]
    assert measured and all(a["provider_revision"].startswith("sha256:") for a in measured)
    assert {a["method"] for a in measured} <= {"measured", "interpolated"}
    assert prov["cost_queries"] == sum(a["queries"] for a in prov["answers"]) + \
        prov["analytic"]["queries"]


def test_serve_table_shows_inputs_and_provenance():
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", *SMALL, "--request-rate", "3"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    for text in ("model      Qwen/Qwen3-0.6B", "device     h100_sxm", "backend    vllm",
                 "open loop, Poisson 3 req/s", "numbers from:", "calibration revision",
                 "cost queries analytic"):
        assert text in out, text


def test_serve_table_shows_the_speculative_settings():
    res = CliRunner().invoke(app, ["serve", "Qwen/Qwen3-0.6B", *SMALL, "--concurrency", "2",
                                   "--speculative", "ngram", "--num-speculative-tokens", "2",
                                   "--acceptance", "0.7,0.5"])
    assert res.exit_code == 0, res.output
    # 1 + 0.7 + 0.7 x 0.5 tokens per verify step
    assert ("speculate ngram, 2 drafted tokens per step, acceptance 0.7, 0.5 (2.05 tokens "
            "per verify step)") in " ".join(res.stdout.split())


def test_remote_code_note_is_printed_once(tmp_path):
    cfg = json.loads(Path(load_model_spec("Qwen/Qwen3-0.6B").source).read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_x.X"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    res = CliRunner().invoke(app, ["serve", str(path), *SMALL, "--concurrency", "2",
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    assert res.stderr.count("never runs model code") == 1
    assert json.loads(res.stdout)["inputs"]["notes"]


SPACE = SearchSpace(model="Qwen/Qwen3-0.6B", gpus=2, isl=256, osl=16, concurrencies=(2, 16),
                    tp_sizes=(1, 2), modes=("agg",), prompts_per_concurrency=2)


def test_slo_percentile_judges_on_that_statistic():
    base = search(SPACE, executor="inline")
    worst = max(base, key=lambda c: c.metrics["ttft_ms"]["p99"] / c.metrics["ttft_ms"]["mean"])
    limit = (worst.metrics["ttft_ms"]["mean"] + worst.metrics["ttft_ms"]["p99"]) / 2
    assert worst.metrics["ttft_ms"]["mean"] < limit < worst.metrics["ttft_ms"]["p99"]
    key = (worst.layout, worst.concurrency)
    by_mean = {(x.layout, x.concurrency): x for x in search(
        SearchSpace(**{**SPACE.__dict__, "max_ttft_ms": limit}), executor="inline")}
    by_p99 = {(x.layout, x.concurrency): x for x in search(
        SearchSpace(**{**SPACE.__dict__, "max_ttft_ms": limit, "slo_statistic": "p99"}),
        executor="inline")}
    assert by_mean[key].meets_slo and not by_p99[key].meets_slo
    assert by_p99[key].failures == ("ttft_above_slo",)


def test_search_counts_failures_and_shows_nearest_misses():
    res = CliRunner().invoke(app, ["search", "Qwen/Qwen3-0.6B", "--gpus", "2", *SMALL,
                                   "--concurrency", "2,16", "--tp-sizes", "1,2", "--modes",
                                   "agg", "--executor", "inline", "--max-ttft-ms", "0.001",
                                   "--max-tpot-ms", "1000", "--slo-percentile", "90",
                                   "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["slo"] == {"statistic": "p90", "max_ttft_ms": 0.001, "max_tpot_ms": 1000.0}
    assert doc["meet_slo"] == 0 and doc["failures"] == {"ttft_above_slo": doc["evaluated"]}
    near = doc["nearest_misses"]
    assert near and near == sorted(near, key=lambda c: c["slo_excess"])
    assert near[0]["slo_excess"] > 1
    assert doc["inputs"]["model"] == "Qwen/Qwen3-0.6B" and doc["inputs"]["device"] == "h100_sxm"
    assert doc["provenance"]["cost_queries"] > 0
    table = CliRunner().invoke(app, ["search", "Qwen/Qwen3-0.6B", "--gpus", "2", *SMALL,
                                     "--concurrency", "2", "--tp-sizes", "1", "--modes", "agg",
                                     "--executor", "inline", "--max-ttft-ms", "0.001"])
    assert table.exit_code == 0, table.output
    for text in ("nearest misses", "ttft_above_slo", "judged on the mean", "numbers from:"):
        assert text in table.stdout, text


def test_failure_reasons_include_simulation_errors():
    # Llama-3.1-70B does not fit one H100: every single-GPU layout fails, with its reason
    cands = search(SearchSpace(model="meta-llama/Llama-3.1-70B", gpus=1, isl=256, osl=16,
                               concurrencies=(2,), tp_sizes=(1,), modes=("agg",),
                               prompts_per_concurrency=1), executor="inline")
    assert failure_counts(cands) == {"simulation_error": 1}
    assert "KV cache" in cands[0].error


def test_moe_default_ep_sizes_include_ep_equal_tp():
    moe = load_model_spec("Qwen/Qwen3-30B-A3B")
    assert default_ep_sizes(moe, (1, 2, 4), (1,)) == (1, 2, 4)
    assert default_ep_sizes(load_model_spec("Qwen/Qwen3-0.6B"), (1, 2, 4), (1,)) == (1,)
    res = CliRunner().invoke(app, ["search", "Qwen/Qwen3-30B-A3B", "--gpus", "2", *SMALL,
                                   "--concurrency", "2", "--tp-sizes", "2", "--modes", "agg",
                                   "--executor", "inline", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["inputs"]["ep_sizes"] == [1, 2]
    assert "agg 1xtp2ep2" in {c["layout"] for c in doc["top"]}


def test_search_reports_progress_per_layout():
    seen = {"total": None, "done": 0}

    def start(total):
        seen["total"] = total

    def done():
        seen["done"] += 1

    for executor in ("inline", "local"):
        seen.update(total=None, done=0)
        search(SPACE, executor=executor, workers=2, on_start=start, on_done=done)
        assert seen["total"] == 2 and seen["done"] == 2, executor
