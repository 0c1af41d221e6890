"""Bad and misleading inputs of `estimate`, `validate silicon`, `collect` and `profiling`
through the CLI: exit code 2 (or the documented one), a message naming the file, field or
row, no traceback, nothing half-written; and the answers say truthfully what they are."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ASCEND_DB = FIXTURES / "msmodeling" / "a3_qwen3_8b"
AIC_H100 = FIXTURES / "aiconfigurator" / "h100_sxm"
SILICON = FIXTURES / "silicon" / "h100_sxm_slice.csv"
ATLAS = "atlas_800_a3_752t_128g_die"
QWEN = ["estimate", "Qwen/Qwen3-8B", "--calibration", "none"]

runner = CliRunner()


def run(*args, columns=250):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": str(columns)})


def refused(r, *words):
    """Exit 2, one clear line naming every word, no traceback."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    for w in words:
        assert w in r.output, (w, r.output)


@pytest.fixture(scope="module")
def h100_snapshot(tmp_path_factory):
    """The AIConfigurator H100 fixture saved as a database (its records say h100_sxm)."""
    from perfcast.evidence.importers.aiconfigurator import import_system

    folder = tmp_path_factory.mktemp("ev") / "h100"
    import_system(AIC_H100, hardware="h100_sxm").save(folder)
    return folder


# -- item 2: evidence of one device answering another ------------------------------------
def test_profiling_database_of_another_device_is_refused():
    r = run(*QWEN, "--device", "h100_sxm", "--performance-model", "profiling",
            "--profiling-database", ASCEND_DB)
    refused(r, "ATLAS_800_A3_752T_128G_DIE", "h100_sxm", "op_mapping.yaml",
            "--allow-foreign-evidence")


def test_profiling_database_without_device_is_refused(tmp_path):
    db = tmp_path / "db"
    shutil.copytree(ASCEND_DB, db)
    text = (db / "op_mapping.yaml").read_text()
    (db / "op_mapping.yaml").write_text(text.replace("device: ATLAS_800_A3_752T_128G_DIE\n", ""))
    r = run(*QWEN, "--device", ATLAS, "--performance-model", "profiling",
            "--profiling-database", db)
    refused(r, "declares no device", ATLAS)


def test_allow_foreign_evidence_marks_every_profiling_answer():
    args = [*QWEN, "--device", "h100_sxm", "--performance-model", "profiling",
            "--profiling-database", ASCEND_DB, "--allow-foreign-evidence"]
    r = run(*args, "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    prof = [op for op in doc["ops"] if op["provider"] == "profiling"]
    assert prof and all(op["foreign_evidence"] == {"measured_on": "ATLAS_800_A3_752T_128G_DIE",
                                                   "used_for": "h100_sxm"} for op in prof)
    assert all(any("foreign evidence" in a for a in op["assumptions"]) for op in prof)
    assert not any("foreign_evidence" in op for op in doc["ops"] if op["provider"] != "profiling")
    assert doc["sources"]["profiling_database"]["foreign_measured_on"] == \
        "ATLAS_800_A3_752T_128G_DIE"
    table = run(*args).output
    assert "measured*" in table and "*: evidence measured on ATLAS_800_A3_752T_128G_DIE" in table


def test_evidence_snapshot_of_another_system_is_refused(h100_snapshot, tmp_path):
    r = run(*QWEN, "--device", "h200_sxm", "--evidence", h100_snapshot, "--store", tmp_path)
    refused(r, "h100_sxm", "h200_sxm", "--evidence", str(h100_snapshot))


def test_foreign_snapshot_is_asked_at_its_system_and_marked(h100_snapshot, tmp_path):
    r = run("estimate", "meta-llama/Llama-3.1-8B", "--device", "h200_sxm", "--evidence",
            h100_snapshot, "--store", tmp_path, "--runtime", "vllm", "--runtime-version",
            "0.19.0", "--implementation", "vllm_flash_attn", "--implementation",
            "gemm=vllm_default", "--allow-foreign-evidence", "--format", "json",
            "--calibration", "none")
    assert r.exit_code == 0, r.output
    ops = json.loads(r.stdout)["ops"]
    measured = [op for op in ops if op["provider"] in ("database", "interpolation")]
    assert measured and all(op["foreign_evidence"]["measured_on"] == "h100_sxm"
                            and op["validity"]["measured_on"] == "h100_sxm" for op in measured)


# -- item 5: --evidence with the profiling model ---------------------------------------
def test_analytic_and_profiling_with_evidence_is_refused(h100_snapshot, tmp_path):
    r = run(*QWEN, "--device", ATLAS, "--performance-model", "analytic", "profiling",
            "--profiling-database", ASCEND_DB, "--evidence", h100_snapshot, "--store", tmp_path)
    refused(r, "--performance-model", "'analytic' model would answer from the evidence")


def test_profiling_and_evidence_share_one_resolver_and_are_both_named(h100_snapshot, tmp_path):
    import pyarrow as pa

    from perfcast.evidence.database import PerformanceDatabase

    ev = tmp_path / "atlas_ev"   # relabelled for the test: records of the estimate's device
    table = PerformanceDatabase.load(h100_snapshot).table
    i = table.column_names.index("hardware")
    PerformanceDatabase(table.set_column(i, "hardware", pa.array([ATLAS] * table.num_rows)),
                        name="atlas").save(ev)
    r = run(*QWEN, "--device", ATLAS, "--performance-model", "profiling",
            "--profiling-database", ASCEND_DB, "--evidence", ev, "--store", tmp_path / "s",
            "--format", "json", "--attempts")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["sources"]["profiling_database"]["path"] == str(ASCEND_DB)
    assert [e["ref"] for e in doc["sources"]["evidence"]] == [str(ev)]
    norm = next(op for op in doc["ops"] if op["lineage"] == "L0-35.attn.input_norm")
    asked = [a["provider"] for a in norm["attempts"]]
    assert asked[:3] == ["profiling", "database", "interpolation"]


# -- item 6: evidence that answers nothing says why --------------------------------------
def test_evidence_answering_nothing_says_why_and_what_it_holds(h100_snapshot, tmp_path):
    r = run("estimate", "meta-llama/Llama-3.1-8B", "--evidence", h100_snapshot, "--store",
            tmp_path, "--runtime", "vLLM", "--runtime-version", "0.19", "--format", "json",
            "--calibration", "none")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc["providers"]) == {"roofline"} and sum(doc["providers"].values()) == \
        len(doc["ops"])
    (warning,) = doc["warnings"]
    for word in ("answered none", "runtime 'vLLM'", "version '0.19'", "runtimes:", "vllm",
                 "0.19.0", "implementations:", "vllm_flash_attn"):
        assert word in warning, word
    assert "warning: the evidence answered none" in r.output     # on stderr too


def test_table_says_how_many_ops_each_provider_answered(h100_snapshot, tmp_path):
    r = run("estimate", "meta-llama/Llama-3.1-8B", "--evidence", h100_snapshot, "--store",
            tmp_path, "--runtime", "vllm", "--runtime-version", "0.19.0", "--implementation",
            "vllm_flash_attn", "--implementation", "gemm=vllm_default", "--calibration", "none")
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("ops answered by:"))
    assert "database" in line and "roofline" in line
    assert f"evidence: {h100_snapshot}" in r.output and "warning" not in r.output


# -- item 11: the method truthfully, full provenance in JSON -----------------------------
def test_interpolated_answers_are_not_shown_as_measured():
    args = [*QWEN, "--device", ATLAS, "--tp-size", "2", "--decode", "--context-length", "3072",
            "--num-queries", "8", "--query-length", "1", "--performance-model", "profiling",
            "--profiling-database", ASCEND_DB, "--interpolate"]
    doc = json.loads(run(*args, "--format", "json").stdout)
    core = next(o for o in doc["ops"] if o["lineage"] == "L0-35.attn.core")
    assert (core["method"], core["match_kind"], core["bound"]) == ("interpolated",
                                                                   "interpolated", "-")
    assert core["uncertainty"]["kind"] and core["source_revision"]
    assert core["validity"]["hardware"] == ATLAS
    assert {"m1", "m2", "m3", "m4", "m5"} <= set(doc["empirical_metrics"])
    table = run(*args, "--wide").output
    row = next(x for x in table.splitlines() if "L0-35.attn.core" in x)
    assert "interpolated" in row and "measured" not in row


# -- item 12: output paths and inputs checked before any work ----------------------------
@pytest.mark.parametrize("flag", ["--chrome-trace", "--export-empirical-metrics"])
def test_estimate_output_in_a_missing_folder_fails_first(tmp_path, flag, monkeypatch):
    import perfcast.cli.estimate as cli

    monkeypatch.setattr(cli, "estimate_step", lambda *a, **k: pytest.fail("computed"))
    extra = ["--performance-model", "profiling", "--profiling-database", ASCEND_DB,
             "--device", ATLAS]
    r = run(*QWEN, *extra, flag, tmp_path / "nowhere" / "out.json")
    refused(r, flag, "does not exist")
    assert not (tmp_path / "nowhere").exists()


def test_validate_silicon_bad_paths(tmp_path, monkeypatch):
    import perfcast.serving.silicon as silicon

    monkeypatch.setattr(silicon, "validate_rows", lambda *a, **k: pytest.fail("computed"))
    refused(run("validate", "silicon", tmp_path / "missing.csv"), "missing.csv", "does not exist")
    refused(run("validate", "silicon", SILICON, "-o", tmp_path / "no" / "out.csv", "--format",
                "csv"), "--output", "does not exist")


def test_validate_silicon_shows_progress_while_simulating(monkeypatch):
    import perfcast.serving.silicon as silicon

    seen = {}

    def fake(rows, **kw):
        seen.update(kw)
        kw["progress"](len(rows), len(rows))
        return []
    monkeypatch.setattr(silicon, "validate_rows", fake)
    r = run("validate", "silicon", SILICON, "--format", "json", "--calibration", "none",
            "--workers", "1")
    assert r.exit_code == 0, r.output
    assert callable(seen["progress"])


def test_validate_silicon_refuses_a_negative_worker_count():
    refused(run("validate", "silicon", SILICON, "--workers", "-1"), "--workers", ">= 0")


# -- item 16: readable at 80 columns and when piped --------------------------------------
def test_table_fits_80_columns_without_cutting_names():
    r = run(*QWEN, "--tp-size", "2", "--query-length", "64", columns=80)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(x) for x in lines) <= 80
    assert "…" not in r.output
    body = "\n".join(lines)
    for word in ("all_reduce", "add_rms_norm", "analytical", "roofline", "--wide"):
        assert word in body, word
    wide = run(*QWEN, "--tp-size", "2", "--query-length", "64", "--wide", columns=80).output
    assert "tensor_cast.all_reduce.default" in wide and "bound" in wide and "…" not in wide


# -- items 3, 9: collect replay and import --------------------------------------------
def _ascend_db(tmp_path, durations=("", "7")):
    db = tmp_path / "db"
    db.mkdir()
    (db / "op_mapping.yaml").write_text("device: ATLAS_800_A3_752T_128G_DIE\n"
                                        "operator_mappings: {}\n")
    rows = "".join(f',CPU,"4,8;8,{i + 2}",DT_BF16;DT_BF16,ND;ND,{d}\n'
                   for i, d in enumerate(durations))
    (db / "aten__mm.csv").write_text("OP State,Accelerator Core,Input Shapes,Input Data Types,"
                                     "Input Formats,Average Duration(us)\n" + rows)
    return db


def test_replay_refuses_cpu_timings_into_an_ascend_database(tmp_path):
    db = _ascend_db(tmp_path)
    before = (db / "aten__mm.csv").read_text()
    r = run("collect", "replay", "--database-path", db, "--backend", "cpu")
    refused(r, "--backend", "ATLAS_800_A3_752T_128G_DIE", "--backend npu")
    # the default is the device's own backend (npu), which cannot run here
    refused(run("collect", "replay", "--database-path", db), "backend npu cannot run here")
    assert (db / "aten__mm.csv").read_text() == before and not (db / "reports").exists()


def test_replay_device_flag_contradicting_the_database_is_refused(tmp_path):
    db = _ascend_db(tmp_path)
    refused(run("collect", "replay", "--database-path", db, "--device", "h100_sxm"),
            "ATLAS_800_A3_752T_128G_DIE", "h100_sxm", "--device")


def test_collect_import_reports_text_durations_with_rows(tmp_path):
    db = _ascend_db(tmp_path, durations=("abc", "7", "-3", "9"))
    out = tmp_path / "snap"
    r = run("collect", "import", "--database-path", db, "--hardware", ATLAS, "--output", out,
            "--kernel-types", "aten::mm")
    assert r.exit_code == 0, r.output
    assert "skipped 2 row(s) of aten__mm.csv" in r.output and "line(s) 2, 4" in r.output
    assert "2 records" in r.output


def test_collect_import_as_another_device_is_refused(tmp_path):
    db = _ascend_db(tmp_path, durations=("5",))
    r = run("collect", "import", "--database-path", db, "--hardware", "h100_sxm", "--output",
            tmp_path / "snap")
    refused(r, "ATLAS_800_A3_752T_128G_DIE", "h100_sxm", "--hardware")
    assert not (tmp_path / "snap").exists()


def test_profiling_validate_reports_text_durations(tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    (db / "op_mapping.yaml").write_text("device: X\noperator_mappings:\n"
                                        "  aten.mm.default: {kernel_type: MatMulV2}\n")
    (db / "MatMulV2.csv").write_text("Input Shapes,Input Data Types,Average Duration(us)\n"
                                     '"4,8;8,2",DT_BF16;DT_BF16,fast\n'
                                     '"4,8;8,3",DT_BF16;DT_BF16,7\n'
                                     '"4,8;8,4",DT_BF16;DT_BF16,\n')
    r = run("profiling", "validate", db)
    assert r.exit_code == 0, r.output
    assert "MatMulV2.csv: 1 row(s) skipped" in r.output and "line(s) 2)" in r.output
