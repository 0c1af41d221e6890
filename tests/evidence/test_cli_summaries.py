"""What `evidence list`, `show` and `import` tell the user: an empty store says so, a
snapshot is summarised (JSON only on request), skips are counted per reason, and a long
import reports progress."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.evidence.importers.aiconfigurator import import_system

FIX = Path(__file__).parents[1] / "fixtures" / "aiconfigurator" / "h100_sxm"
runner = CliRunner()


def run(*args):
    return runner.invoke(app, ["evidence", *map(str, args)])


def test_an_empty_store_says_so_and_a_full_one_has_a_header(tmp_path):
    empty = run("list", "--store", tmp_path)
    assert empty.exit_code == 0 and "is empty" in empty.output
    assert json.loads(run("list", "--store", tmp_path, "--format", "json").stdout) == []
    assert run("import", "aiconfigurator", FIX / "gemm", "--store", tmp_path).exit_code == 0
    lines = run("list", "--store", tmp_path).stdout.splitlines()
    assert lines[0].split() == ["snapshot", "records", "name"] and len(lines) == 2


def test_show_summarises_and_dumps_json_only_on_request(tmp_path):
    out = run("import", "aiconfigurator", FIX, "--store", tmp_path)
    assert out.exit_code == 0, out.output
    digest = out.stdout.split()[0]
    # skips are explained with a count per reason
    assert "skipped 2 table(s):" in out.stdout
    assert "2 unsupported table: mla/trtllm/1.3.0rc20/mla_context_module_perf" in out.stdout
    text = run("show", digest[7:15], "--store", tmp_path).stdout
    assert not text.lstrip().startswith("{")
    assert f"snapshot  {digest}" in text and "records   2026" in text
    assert "  gemm             h100_sxm     bf16            244" in text
    assert "selectors: " in text and "message_bytes" in text
    assert "sources (14):" in text and "skipped (2):" in text
    manifest = json.loads(run("show", digest[7:15], "--store", tmp_path, "--format",
                              "json").stdout)
    assert manifest["digest"] == digest and manifest["rows"] == 2026


def test_table_imports_name_the_columns_they_did_not_use(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: lab\nsubject: operator\nsource: lab\nsource_revision: r1\n"
                    "method: measured\nlatency_column: t_us\nlatency_unit: us\n"
                    "operation: gemm\nhardware: H100\ndatatype: bf16\n"
                    "selector_columns: {m: M}\nselector_types: {m: int}\n")
    table = tmp_path / "lab.csv"
    table.write_text("M,t_us,host,note\n64,12.5,a,x\n")
    out = run("import", "table", table, "--spec", spec, "--store", tmp_path / "s")
    assert out.exit_code == 0, out.output
    assert "not imported: column(s) host, note of lab.csv (not in the import spec)" in out.stdout
    cov = json.loads(run("coverage", out.stdout.split()[0][7:15], "--store", tmp_path / "s",
                         "--format", "json").stdout)
    assert cov[0]["hardware"] == "h100_sxm"  # the alias is stored as its catalog name


def test_the_import_reports_progress_per_table(tmp_path, monkeypatch):
    seen = []
    calls = []
    import_system(FIX / "gemm", progress=lambda name, done, total: seen.append((name, done,
                                                                               total)))
    assert [s[1:] for s in seen] == [(i, 4) for i in range(4)]
    assert seen[0][0] == "trtllm/1.3.0rc20/gemm_perf.parquet"

    @contextlib.contextmanager
    def recorder(label, total=None):
        yield lambda done, total: calls.append((label, done, total))

    import perfcast.cli.progress as progress

    monkeypatch.setattr(progress, "progress_bar", recorder)
    shutil.copytree(FIX / "gemm", tmp_path / "h100_sxm" / "gemm")
    assert run("import", "aiconfigurator", tmp_path / "h100_sxm", "--store",
               tmp_path / "s").exit_code == 0
    assert ("importing tables", 3, 4) in calls and ("writing snapshot", 1, 1) in calls
