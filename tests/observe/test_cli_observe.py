"""`perfcast observe`: import, list and show through the CLI, errors without tracebacks."""

from __future__ import annotations

import csv
import json

from observe_helpers import A3, FIA, SILICON
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.observe import ObservationStore

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, ["observe", *map(str, args)])


def test_import_list_show_silicon(tmp_path):
    store = tmp_path / "store"
    res = _run("import", "silicon", SILICON, "--store", store)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["rows"] == 5 and out["kind"] == "serving"
    digest = out["observation_set"]
    assert digest.startswith("sha256:") and len(digest) == 71
    assert ObservationStore(store).get(digest).silicon_rows()[0]["id"].startswith("meta_llama")
    assert "reading" in res.stderr                        # progress goes to stderr
    log = json.loads((store / "imports.jsonl").read_text().splitlines()[0])
    assert log["note"] == f"imported from {SILICON.resolve()}" and log["new"] is True
    listed = json.loads(_run("list", "--store", store, "--format", "json").stdout)
    assert [s["observation_set"] for s in listed] == [digest]
    table = _run("list", "--store", store).stdout
    assert digest[7:19] in table and "serving" in table
    shown = json.loads(_run("show", digest[7:17], "--store", store, "--format", "json").stdout)
    assert shown["observation_set"] == digest and shown["verified"] is True
    assert shown["sources"][0]["name"] == SILICON.name and shown["rows"] == 5
    text = _run("show", digest[7:17], "--store", store).stdout
    assert "(verified)" in text and "container_image" in text


def test_import_kernels_is_idempotent(tmp_path):
    store = tmp_path / "store"
    first = _run("import", "kernels", FIA, "--system", A3, "--store", store)
    again = _run("import", "kernels", FIA, "--system", A3, "--store", store)
    assert first.exit_code == again.exit_code == 0, first.output
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert a["observation_set"] == b["observation_set"] and a["rows"] == 9
    assert len(ObservationStore(store).digests()) == 1


def test_a_bad_file_is_named_and_nothing_is_stored(tmp_path):
    with open(SILICON, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    rows[2][rows[0].index("silicon_ttft_ms")] = "fast"
    bad = tmp_path / "bad.csv"
    with open(bad, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    store = tmp_path / "store"
    res = _run("import", "silicon", bad, "--store", store)
    assert res.exit_code == 2
    assert "bad.csv, row 3: field 'silicon_ttft_ms': is not a number" in res.stderr
    assert "Traceback" not in res.output
    assert ObservationStore(store).digests() == []


def test_kernel_errors_are_one_line(tmp_path):
    store = tmp_path / "store"
    res = _run("import", "kernels", FIA, "--system", "h100_sxm", "--store", store)
    assert res.exit_code == 2 and "says device 'ATLAS_800_A3_752T_128G_DIE'" in res.stderr
    assert "Traceback" not in res.output
    missing = _run("show", "abcdef12", "--store", store)
    assert missing.exit_code == 2 and "no observation set 'abcdef12'" in missing.stderr
    assert ObservationStore(store).digests() == []
