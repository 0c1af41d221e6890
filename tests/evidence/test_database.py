"""PerformanceDatabase: content digests, round trips, validation."""

from __future__ import annotations

import json

import pytest
from evidence_helpers import make_record

from perfcast.core.errors import ConfigError, InvalidEvidenceError
from perfcast.evidence.database import PerformanceDatabase


def _db(*extra):
    return PerformanceDatabase.from_records([
        make_record(1e-3, {"m": 1, "n": 2, "k": 3}, rid="a"),
        make_record(2e-3, {"m": 1, "n": 2, "k": 3, "runtime": "vllm"}, rid="b"),
        make_record(3e-3, {"m": 1.5, "flag": True, "backend": "x"}, rid="c"),
        *extra,
    ], name="t")


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_round_trip_keeps_digest_and_records(tmp_path, fmt):
    db = _db()
    db.save(tmp_path / "db", fmt=fmt)
    back = PerformanceDatabase.load(tmp_path / "db")
    assert back.digest == db.digest
    assert list(back.records()) == list(db.records())
    manifest = json.loads((tmp_path / "db" / "manifest.json").read_text())
    assert manifest["digest"] == db.digest and manifest["rows"] == 3


def test_digest_is_deterministic_and_content_sensitive():
    assert _db().digest == _db().digest
    other = _db(make_record(4e-3, {"m": 9}, rid="d"))
    assert other.digest != _db().digest


@pytest.mark.parametrize("a,b", [(1, 1.0), (1, True), (1.0, True), ("1", 1)])
def test_selector_types_change_the_digest(a, b):
    da = PerformanceDatabase.from_records([make_record(1e-3, {"m": a})])
    db = PerformanceDatabase.from_records([make_record(1e-3, {"m": b})])
    assert da.digest != db.digest
    assert type(next(da.records()).selector["m"]) is type(a)
    assert type(next(db.records()).selector["m"]) is type(b)


def test_tampered_file_is_rejected(tmp_path):
    db = _db()
    db.save(tmp_path / "db", fmt="json")
    path = tmp_path / "db" / "records.json"
    path.write_text(path.read_text().replace("0.001", "0.002"))
    with pytest.raises(InvalidEvidenceError, match="does not match the manifest"):
        PerformanceDatabase.load(tmp_path / "db")


@pytest.mark.parametrize("latency", [0.0, -1e-3, float("nan"), float("inf")])
def test_invalid_latency_is_rejected(latency):
    with pytest.raises(ConfigError, match="latency"):
        make_record(latency, {"m": 1})
    good = _db()
    cols = {c: good.table.column(c) for c in good.table.column_names}
    cols["latency_s"] = [latency, 1e-3, 1e-3]
    with pytest.raises(ConfigError, match="latency_s"):
        PerformanceDatabase.from_columns(cols)


def test_missing_manifest_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="manifest.json"):
        PerformanceDatabase.load(tmp_path)


def test_concat_fills_absent_selectors_with_null():
    a = PerformanceDatabase.from_records([make_record(1e-3, {"m": 1})])
    b = PerformanceDatabase.from_records([make_record(2e-3, {"k": "x"})])
    both = PerformanceDatabase.concat([a, b])
    assert [dict(r.selector) for r in both.records()] == [{"m": 1}, {"k": "x"}]
