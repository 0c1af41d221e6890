"""The JSON API against the CLI: the same inputs give the same record as `--format json`
(one schema, one function); bad inputs are 422/400 naming the field, never a 500."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from tests.workbench.conftest import PERFCAST, SILICON

runner = CliRunner()


def cli_json(server, *args: str):
    r = runner.invoke(app, list(args), env=server["env"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def wait(api, job_id: str, timeout_s: float = 120) -> dict:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        j = api.get(f"/api/jobs/{job_id}").json()
        if j["state"] != "running":
            return j
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} still running after {timeout_s} s")


def h100(server) -> str:
    return server["snapshots"]["aiconfigurator:h100_sxm"]


def test_estimate_is_the_cli_record(api, server):
    body = {"model": "meta-llama/Llama-3.1-8B", "tp_size": 2, "num_queries": 4,
            "query_length": 256, "attempts": True}
    got = api.post("/api/estimate", json=body)
    assert got.status_code == 200, got.text
    want = cli_json(server, "estimate", "meta-llama/Llama-3.1-8B", "--tp-size", "2",
                    "--num-queries", "4", "--query-length", "256", "--attempts",
                    "--format", "json")
    assert got.json() == want
    assert got.json()["ops"][0]["attempts"]


def test_estimate_with_evidence_is_the_cli_record(api, server):
    digest = h100(server)
    body = {"model": "meta-llama/Llama-3.1-8B", "num_queries": 8, "query_length": 1,
            "context_length": 1024, "decode": True, "evidence": [digest[7:19]],
            "runtime": "vllm", "runtime_version": "0.19.0",
            "implementation": ["vllm_flash_attn", "gemm=vllm_default"]}
    got = api.post("/api/estimate", json=body).json()
    want = cli_json(server, "estimate", "meta-llama/Llama-3.1-8B", "--num-queries", "8",
                    "--query-length", "1", "--context-length", "1024", "--decode",
                    "--evidence", digest[7:19], "--runtime", "vllm", "--runtime-version",
                    "0.19.0", "--implementation", "vllm_flash_attn", "--implementation",
                    "gemm=vllm_default", "--format", "json")
    assert got == want
    assert {"measured", "interpolated"} & {o["method"] for o in got["ops"]}


def test_chrome_trace_is_the_cli_trace(api, server, tmp_path):
    body = {"model": "Qwen/Qwen3-8B", "tp_size": 2, "query_length": 128}
    got = api.post("/api/estimate/trace", json=body)
    assert got.status_code == 200, got.text
    path = tmp_path / "t.json"
    r = runner.invoke(app, ["estimate", "Qwen/Qwen3-8B", "--tp-size", "2", "--query-length",
                            "128", "--chrome-trace", str(path)], env=server["env"])
    assert r.exit_code == 0, r.output
    assert got.json() == json.loads(path.read_text())
    assert any(e["name"].startswith("L35.") for e in got.json()["traceEvents"])


def test_serve_is_the_cli_record(api, server):
    body = {"model": "meta-llama/Llama-3.1-8B", "concurrency": 4, "num_requests": 8,
            "isl": 256, "osl": 16}
    got = api.post("/api/serve", json=body)
    assert got.status_code == 200, got.text
    want = cli_json(server, "serve", "meta-llama/Llama-3.1-8B", "--concurrency", "4",
                    "--num-requests", "8", "--isl", "256", "--osl", "16", "--format", "json")
    assert got.json() == want
    assert got.json()["ttft_ms"]["p99"] >= got.json()["ttft_ms"]["p50"] > 0


SEARCH = {"model": "meta-llama/Llama-3.1-8B", "gpus": 2, "isl": 256, "osl": 16,
          "concurrency": "2,4", "tp_sizes": "1,2", "modes": "agg,disagg", "max_tpot_ms": 50.0}


def test_search_job_reports_progress_and_the_cli_record(api, server):
    started = api.post("/api/search", json=SEARCH)
    assert started.status_code == 202, started.text
    job = wait(api, started.json()["id"])
    assert job["state"] == "done", job
    want = cli_json(server, "search", "meta-llama/Llama-3.1-8B", "--gpus", "2", "--isl", "256",
                    "--osl", "16", "--concurrency", "2,4", "--tp-sizes", "1,2", "--modes",
                    "agg,disagg", "--max-tpot-ms", "50", "--format", "json")
    assert job["result"] == want
    # agg 2xtp1, agg 1xtp2, disagg 1xtp1 + 1xtp1: one progress step per layout
    assert job["done"] == job["total"] == 3
    assert len(want["configurations"]) == want["evaluated"] == 6
    assert any(c["pareto"] for c in want["configurations"])
    # what the Pareto page simulates for a clicked configuration is that configuration
    from perfcast.workbench.figures import serve_args_for

    for row in (want["configurations"][0], want["configurations"][-1]):
        served = api.post("/api/serve", json=serve_args_for(want, row)).json()
        assert served["inputs"]["mode"] == row["mode"]
        assert served["tokens_per_s_per_gpu"] == row["tokens_per_s_per_gpu"]
        assert served["tpot_ms"]["mean"] == row["tpot_ms"]


def test_two_searches_at_once_both_complete_and_one_can_be_cancelled(api):
    a = api.post("/api/search", json=SEARCH).json()["id"]
    b = api.post("/api/search", json={**SEARCH, "concurrency": "2"}).json()["id"]
    big = api.post("/api/search", json={**SEARCH, "gpus": 8, "tp_sizes": "1,2,4,8",
                                        "concurrency": "4,8,16,32,64"}).json()["id"]
    cancelled = api.post(f"/api/jobs/{big}/cancel").json()
    assert cancelled["state"] == "cancelled"
    ja, jb = wait(api, a), wait(api, b)
    assert ja["state"] == jb["state"] == "done"
    assert jb["result"]["evaluated"] == 3 and ja["result"]["evaluated"] == 6
    j = api.get(f"/api/jobs/{big}").json()
    assert j["state"] == "cancelled" and j["result"] is None
    assert {x["id"] for x in api.get("/api/jobs").json()} >= {a, b, big}


def test_validate_job_is_the_cli_record(api, server):
    started = api.post("/api/validate", json={"file": str(SILICON), "calibration": "none"})
    assert started.status_code == 202, started.text
    job = wait(api, started.json()["id"])
    assert job["state"] == "done", job
    want = cli_json(server, "validate", "silicon", str(SILICON), "--calibration", "none",
                    "--format", "json")
    assert job["result"] == want
    assert job["total"] == len(want["rows"]) == 5


def test_evidence_records_are_the_cli_records(api, server):
    digest = h100(server)
    assert api.get("/api/evidence").json() == cli_json(server, "evidence", "list", "--format",
                                                       "json")
    assert api.get(f"/api/evidence/{digest[7:15]}").json() == cli_json(
        server, "evidence", "show", digest[7:15], "--format", "json")
    assert api.get(f"/api/evidence/{digest}/coverage").json() == cli_json(
        server, "evidence", "coverage", digest, "--format", "json")
    q = {"operation": "gemm", "dtype": "bf16", "runtime": "vllm", "runtime_version": "0.19.0",
         "implementation": "vllm_default", "dims": {"m": 100, "n": 4096, "k": 4096}}
    got = api.post(f"/api/evidence/{digest}/query", json=q)
    assert got.status_code == 200, got.text
    want = cli_json(server, "evidence", "query", digest, "--operation", "gemm", "--dtype",
                    "bf16", "--runtime", "vllm", "--runtime-version", "0.19.0",
                    "--implementation", "vllm_default", "--dim", "m=100", "--dim", "n=4096",
                    "--dim", "k=4096")
    assert got.json() == want
    assert got.json()["method"] == "interpolated" and got.json()["raw_record_ids"]


def test_observation_and_calibration_records_are_the_cli_records(api, server):
    sets = api.get("/api/observations").json()
    assert sets == cli_json(server, "observe", "list", "--format", "json")
    assert len(sets) == 1 and sets[0]["rows"] == 5
    ref = sets[0]["observation_set"]
    assert api.get(f"/api/observations/{ref[7:15]}").json() == cli_json(
        server, "observe", "show", ref[7:15], "--format", "json")
    assert api.get("/api/calibrations").json() == cli_json(server, "calibrate", "list",
                                                           "--format", "json")
    assert api.get("/api/calibrations/default").json() == cli_json(
        server, "calibrate", "show", "default", "--format", "json")


@pytest.mark.parametrize("path, body, status, field", [
    ("/api/estimate", {"model": "meta-llama/Llama-3.1-8B", "tp_size": "two"}, 422, "tp_size"),
    ("/api/estimate", {"tp_size": 2}, 422, "model"),
    ("/api/estimate", {"model": "meta-llama/Llama-3.1-8B", "device": "h999"}, 400, "--device"),
    ("/api/estimate", {"model": "meta-llama/Llama-3.1-8B", "decode": True}, 400,
     "--context-length"),
    ("/api/estimate", {"model": "meta-llama/Llama-3.1-8B",
                       "export_empirical_metrics": "/tmp/m.json"}, 400,
     "export_empirical_metrics"),
    ("/api/serve", {"model": "meta-llama/Llama-3.1-8B", "concurrency": 4,
                    "request_rate": 2.0}, 400, "--concurrency"),
    ("/api/search", {"model": "meta-llama/Llama-3.1-8B", "tp_sizes": "1,x"}, 400, "--tp-sizes"),
    ("/api/search", {"model": "meta-llama/Llama-3.1-8B", "slo_percentile": 75}, 400,
     "--slo-percentile"),
    ("/api/validate", {"file": "/nonexistent/rows.csv"}, 400, None),
])
def test_bad_inputs_name_the_field(api, path, body, status, field):
    r = api.post(path, json=body)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    if status == 422:
        assert any(field in e["loc"] for e in detail)
    else:
        assert detail["field"] == field and detail["error"]


def test_unknown_references_are_400_or_404(api):
    r = api.get("/api/evidence/ffffffff")
    assert r.status_code == 400 and "no snapshot" in r.json()["detail"]["error"]
    assert api.get("/api/observations/ffffffff").status_code == 400
    assert api.get("/api/calibrations/ffffffff").status_code == 400
    assert api.get("/api/jobs/search-999").status_code == 404
    r = api.post("/api/evidence/ffffffff/query", json={"dims": {}})
    assert r.status_code == 422 and any("operation" in e["loc"] for e in r.json()["detail"])
    r = api.get("/api/evidence/ffff/curves", params={"operation": "moe"})
    assert r.status_code == 400 and r.json()["detail"]["field"] == "operation"


def test_openapi_page_documents_the_api(api):
    assert api.get("/docs").status_code == 200
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/api/estimate", "/api/serve", "/api/search", "/api/validate", "/api/jobs/{job_id}",
            "/api/evidence", "/api/evidence/{ref}/query", "/api/observations",
            "/api/calibrations/{ref}"} <= set(paths)
    # what the offline Swagger UI (4.x) reads: the same API as OpenAPI 3.0
    doc30 = api.get("/openapi-3.0.json").json()
    assert doc30["openapi"] == "3.0.3" and set(doc30["paths"]) == set(paths)
    assert '{"type": "null"}' not in json.dumps(doc30)
    assert api.get("/_swagger/swagger-ui-bundle.js").status_code == 200


def test_listening_beyond_loopback_warns(server, tmp_path):
    from tests.workbench.conftest import free_port

    proc = subprocess.Popen([*PERFCAST, "workbench", "--host", "0.0.0.0", "--port",
                             str(free_port())], env=server["env"], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    try:
        line = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert line.startswith("warning: the workbench listens on 0.0.0.0")


def test_bad_port_is_refused():
    r = subprocess.run([*PERFCAST, "workbench", "--port", "70000"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--port" in r.stderr
