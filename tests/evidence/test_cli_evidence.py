"""`perfcast evidence ...` and `perfcast estimate --evidence` end to end (fixtures only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app

FIX = Path(__file__).parents[1] / "fixtures" / "aiconfigurator" / "h100_sxm"
runner = CliRunner()


def run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    result = run("evidence", "import", "aiconfigurator", FIX, "--system", "h100_sxm",
                 "--store", root)
    assert result.exit_code == 0, result.output
    return root


def digest_of(store):
    return json.loads(run("evidence", "list", "--store", store, "--format", "json").output)


def test_import_is_idempotent_and_logged(store):
    again = run("evidence", "import", "aiconfigurator", FIX, "--system", "h100_sxm",
                "--store", store)
    assert again.exit_code == 0
    snaps = digest_of(store)
    assert len(snaps) == 1 and again.output.startswith(snaps[0]["digest"])
    log = (store / "imports.jsonl").read_text().splitlines()
    assert [json.loads(x)["new"] for x in log] == [True, False]
    show = json.loads(run("evidence", "show", snaps[0]["digest"][7:15], "--store", store,
                          "--format", "json").stdout)
    assert show["rows"] == snaps[0]["rows"]
    assert any("skipped" in s for s in show["sources"])


def test_failed_import_leaves_nothing(tmp_path):
    bad = tmp_path / "sys" / "gemm" / "vllm" / "0.19.0"
    shutil.copytree(FIX / "gemm" / "vllm" / "0.19.0", bad)
    t = pq.read_table(bad / "gemm_perf.parquet")
    lat = t.column("latency").to_pylist()
    lat[3] = -1.0
    pq.write_table(t.set_column(t.column_names.index("latency"), "latency", [lat]),
                   bad / "gemm_perf.parquet")
    store = tmp_path / "store"
    result = run("evidence", "import", "aiconfigurator", tmp_path / "sys", "--system",
                 "h100_sxm", "--store", store)
    assert result.exit_code == 2
    assert "gemm_perf.parquet" in result.output and "row 3" in result.output
    assert not store.exists() or not any((store / "snapshots").glob("*"))
    assert not list(store.glob(".tmp-*")) if store.exists() else True


def test_single_query_returns_the_measured_row(store):
    ref = digest_of(store)[0]["digest"][7:15]
    row = pq.read_table(FIX / "gemm/vllm/0.19.0/gemm_perf.parquet").filter(
        (pc.field("m") == 128) & (pc.field("gemm_dtype") == "bfloat16")).to_pylist()[0]
    result = run("evidence", "query", ref, "--store", store, "--operation", "gemm",
                 "--dtype", "bf16", "--runtime", "vllm", "--runtime-version", "0.19.0",
                 "--implementation", "vllm_default", "--dim", "m=128", "--dim", "n=4096",
                 "--dim", "k=4096", "--policy", "exact")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["latency_s"] == pytest.approx(row["latency"] * 1e-3)
    assert out["method"] == "measured" and out["provider"] == "database"
    assert out["raw_record_ids"] and out["attempts"][0]["outcome"] == "hit"


def test_queries_file_answers_every_line(store, tmp_path):
    ref = digest_of(store)[0]["digest"][7:15]
    base = {"operation": "gemm", "hardware": "h100_sxm", "dtype": "bf16", "runtime": "vllm",
            "runtime_version": "0.19.0", "implementation": "vllm_default"}
    lines = [{**base, "dims": {"m": 2048, "n": 4096, "k": 4096}},
             {**base, "dims": {"m": 2000, "n": 4096, "k": 4096}},
             {**base, "dims": {"m": 2000, "n": 8192, "k": 4096}},
             {**base, "dtype": "fp7", "dims": {"m": 1}}]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = run("evidence", "query", ref, "--store", store, "--queries", path)
    outs = [json.loads(x) for x in result.stdout.splitlines()]
    assert [o.get("method") for o in outs] == ["measured", "interpolated", "analytical", None]
    assert [o["line"] for o in outs] == [1, 2, 3, 4]
    assert "fp7" in outs[3]["error"]
    assert result.exit_code == 1


def test_query_on_an_aiconfigurator_folder_imports_on_the_fly(tmp_path):
    result = run("evidence", "query", FIX / "comm" / "vllm", "--store", tmp_path,
                 "--operation", "all_reduce", "--runtime", "vllm", "--runtime-version",
                 "0.19.0", "--implementation", "vLLM_custom_graph", "--dim",
                 "message_bytes=3000000", "--dim", "participants=4", "--dim",
                 "backend=vllm_graph")
    out = json.loads(result.output)
    assert out["method"] == "interpolated" and out["provider"] == "interpolation"


def test_estimate_uses_measured_attention(store):
    ref = digest_of(store)[0]["digest"][7:15]
    args = ["estimate", "meta-llama/Llama-3.1-8B", "--num-queries", "2", "--query-length",
            "1024", "--format", "json", "--evidence", ref, "--store", store, "--runtime",
            "vllm", "--runtime-version", "0.19.0", "--implementation", "vllm_flash_attn",
            "--implementation", "gemm=vllm_default"]
    out = json.loads(run(*args).output)
    by_op = {op["lineage"]: op for op in out["ops"]}
    attn = [op for op in out["ops"] if op["operator"].endswith("attention.default")]
    assert attn and all(op["provider"] == "database" and op["method"] == "measured"
                        for op in attn)
    o_proj = [op for name, op in by_op.items() if "o_proj" in name]
    assert o_proj and o_proj[0]["method"] == "measured"  # n = k = 4096 is in the slice
    plain = json.loads(run("estimate", "meta-llama/Llama-3.1-8B", "--num-queries", "2",
                           "--query-length", "1024", "--format", "json",
                           "--calibration", "none").output)
    assert all(op["provider"] in ("roofline", "collective_model") for op in plain["ops"])


def _gemm_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: lab\nsubject: operator\nsource: lab\nsource_revision: r1\n"
                    "method: measured\nlatency_column: t_us\nlatency_unit: us\n"
                    "operation: gemm\nhardware: h100_sxm\ndatatype: bf16\n"
                    "selector_columns: {m: M, n: N, k: K}\n"
                    "selector_types: {m: int, n: int, k: int}\n")
    return spec


def test_import_vidur_and_table_then_coverage(tmp_path):
    vidur = Path(__file__).parents[1] / "fixtures" / "vidur" / "h100_Llama-2-7b-hf_mlp.csv"
    out = run("evidence", "import", "vidur", vidur, "--system", "h100_sxm", "--dtype", "fp16",
              "--store", tmp_path)
    assert out.exit_code == 0, out.output
    spec = _gemm_spec(tmp_path)
    table = tmp_path / "lab.csv"
    table.write_text("M,N,K,t_us\n64,4096,4096,12.5\n128,4096,4096,13.0\n")
    out = run("evidence", "import", "table", table, "--spec", spec, "--store", tmp_path)
    assert out.exit_code == 0, out.output
    digest = out.output.split()[0]
    cov = json.loads(run("evidence", "coverage", digest[7:15], "--store", tmp_path,
                         "--format", "json").output)
    assert cov[0].pop("latency_s") == pytest.approx([12.5e-6, 13.0e-6])
    # both rows run near their roofline time: screened, not flagged
    assert cov == [{"operation": "gemm", "hardware": "h100_sxm", "dtype": "bf16", "rows": 2,
                    "axes": {"k": [4096, 4096], "m": [64, 128], "n": [4096, 4096]},
                    "screen": {"screened": 2, "below_roofline": 0, "slower_than_factor": 0}}]
    assert len(digest_of(tmp_path)) == 2
    bad = run("evidence", "import", "table", table, "--spec", tmp_path / "nope.yaml",
              "--store", tmp_path)
    assert bad.exit_code == 2 and "nope.yaml" in bad.output


def test_import_reports_implausible_rows_and_stores_the_fitted_overheads(tmp_path):
    spec = _gemm_spec(tmp_path)
    # small-work rows at 4 us + weight bytes at 2.7 TB/s, and one planted row 50x slower
    # than its roofline plus one launch
    lines = ["M,N,K,t_us"]
    for m in (1, 2, 4, 8, 16):
        for n in (256, 512, 1024, 2048):
            lines.append(f"{m},{n},1024,{4.0 + n * 1024 * 2 / 2.7e6:.4f}")
    lines.append("8,2048,2048,1000.0")
    table = tmp_path / "lab.csv"
    table.write_text("\n".join(lines) + "\n")
    out = run("evidence", "import", "table", table, "--spec", spec, "--store", tmp_path)
    assert out.exit_code == 0, out.output
    assert "plausibility screen flagged gemm/bf16/-: 1 slower than 10x" in out.output
    digest = out.output.split()[0]
    derived = tmp_path / "derived" / digest[7:] / "harness_overhead.v1.json"
    assert derived.exists() and f"stored in {derived}" in out.output
    doc = json.loads(derived.read_text())
    # the robust fit is not moved by the planted row: the intercept is the 4 us per call
    assert doc["source_revision"] == digest and doc["entries"][0]["rows"] == 21
    assert doc["entries"][0]["intercept_s"] == pytest.approx(4e-6, abs=0.2e-6)
    cov = json.loads(run("evidence", "coverage", digest[7:15], "--store", tmp_path,
                         "--format", "json").stdout)
    assert cov[0]["screen"] == {"screened": 21, "below_roofline": 0, "slower_than_factor": 1}
