"""Serving observations from the silicon-sample CSV: verbatim rows, facts, strict errors."""

from __future__ import annotations

import csv
import hashlib

import pytest
from observe_helpers import SILICON

from perfcast.core.errors import ConfigError
from perfcast.observe import import_silicon
from perfcast.observe.silicon import container_images
from perfcast.serving.silicon import read_rows


def _rewrite(path, row: int, column: str, value: str) -> None:
    """Set one cell (row = 1-based data row) of a CSV, keeping every other byte's meaning."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    rows[row][rows[0].index(column)] = value
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)


def test_rows_come_back_exactly_as_the_serving_reader_reads_them():
    obs = import_silicon(SILICON)
    rows = obs.silicon_rows()
    assert rows == read_rows(SILICON)
    assert [list(r) for r in rows] == [list(r) for r in read_rows(SILICON)]  # column order
    assert len(obs) == 5 and obs.kind == "serving"


def test_each_observation_keeps_its_source_and_facts():
    obs = import_silicon(SILICON)
    sha = "sha256:" + hashlib.sha256(SILICON.read_bytes()).hexdigest()
    first, _, third, fourth, _ = list(obs.observations())
    assert (first.source.file, first.source.sha256, first.source.row) == \
        ("h100_sxm_slice.csv", sha, 2)           # header is line 1
    assert first.source.record_id == first.values["id"]
    assert dict(first.environment) == {"system": "h100_sxm", "backend": "trtllm",
                                       "backend_version": "1.0.0rc3"}
    assert "backend_version" not in third.environment          # empty in the file
    assert fourth.environment["container_image"] == "vllm/vllm-openai:v0.18.0"
    assert fourth.values["silicon_data_source"].endswith("image=vllm/vllm-openai:v0.18.0")
    m = obs.manifest
    assert (m.sources[0].sha256, m.sources[0].rows, m.rows) == (sha, 5, 5)
    assert m.sources[0].columns[0] == "id" and len(m.sources[0].columns) == 34
    assert m.environment["container_image"] == ("lmsysorg/sglang:v0.5.8-cu130",
                                                "vllm/vllm-openai:v0.18.0")


def test_container_images_bare_or_tagged():
    text = ("db-dump/2026-04-27; config_id=494; silicon_concurrency=6; "
            "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1.post3")
    assert container_images(text) == ["nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1.post3"]
    assert container_images("source_file=a.csv; image=lmsysorg/sglang:v0.5.9-cu130") == \
        ["lmsysorg/sglang:v0.5.9-cu130"]
    assert container_images("source_file=/Users/x/data/h100_sxm/trtllm/1.0.0rc3/m.csv") == []


@pytest.mark.parametrize("column, value, message", [
    ("silicon_ttft_ms", "n/a", "is not a number"),
    ("isl", "-1024", "non-negative whole number"),
    ("silicon_tpot_ms", "0", "must be positive"),
    ("tp_size", "1.5", "non-negative whole number"),
    ("model_path", "", "is empty"),
])
def test_a_bad_value_names_file_row_and_field(silicon_copy, column, value, message):
    _rewrite(silicon_copy, 3, column, value)
    with pytest.raises(ConfigError) as err:
        import_silicon(silicon_copy)
    text = str(err.value)
    assert str(silicon_copy) in text and "row 4" in text   # data row 3 is line 4
    assert f"field '{column}'" in text and message in text


def test_a_missing_column_names_file_and_column(tmp_path):
    with open(SILICON, newline="", encoding="utf-8") as fh:
        rows = [r[:-1] for r in csv.reader(fh)]            # drop silicon_tpot_ms
    path = tmp_path / "short.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    with pytest.raises(ConfigError, match=r"short\.csv: field 'silicon_tpot_ms': missing"):
        import_silicon(path)


def test_a_row_with_a_missing_cell_and_a_repeated_id_are_refused(silicon_copy, tmp_path):
    lines = silicon_copy.read_text(encoding="utf-8").splitlines(keepends=True)
    cut = tmp_path / "cut.csv"
    cut.write_text(lines[0] + lines[1].rsplit(",", 1)[0] + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"row 2: field 'silicon_tpot_ms': has 33 fields"):
        import_silicon(cut)
    twice = tmp_path / "twice.csv"
    twice.write_text(lines[0] + lines[1] + lines[1], encoding="utf-8")
    with pytest.raises(ConfigError, match=r"row 3: field 'id': id .* already used on row 2"):
        import_silicon(twice)


def test_the_full_reference_files_import_unchanged():
    from pathlib import Path

    ref = Path("/work/shared/reference/silicon")
    if not ref.is_dir():
        pytest.skip("shared reference data not present")
    for path in sorted(ref.glob("*.csv")):
        obs = import_silicon(path)
        assert obs.silicon_rows() == read_rows(path)
