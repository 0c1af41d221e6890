"""EvidenceStore: content addressing, idempotence, atomic writes, references."""

from __future__ import annotations

import pytest
from evidence_helpers import make_record

from perfcast.core.errors import ConfigError
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.store import ENV, EvidenceStore, default_root, open_evidence


def db(latency=1e-3):
    return PerformanceDatabase.from_records([make_record(latency, {"m": 1})], name="t")


def test_put_is_content_addressed_and_idempotent(tmp_path):
    store = EvidenceStore(tmp_path)
    d1 = store.put(db())
    assert store.put(db()) == d1
    assert store.digests() == [d1]
    assert store.get(d1[7:13]).digest == d1
    assert open_evidence(d1, hardware="h100_sxm", store=store).digest == d1


def test_a_write_that_fails_halfway_leaves_nothing(tmp_path, monkeypatch):
    store = EvidenceStore(tmp_path)

    def broken_save(self, folder, fmt="parquet"):
        (folder / "records.parquet").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(PerformanceDatabase, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        store.put(db())
    assert store.digests() == []
    assert [p.name for p in tmp_path.iterdir() if p.name != "snapshots"] == []


def test_references_must_be_unique_and_known(tmp_path):
    store = EvidenceStore(tmp_path)
    real = store.put(db())
    for fake in ("abcd" + "1" * 60, "abcd" + "2" * 60):  # two snapshots sharing a prefix
        (store.snapshots / fake).mkdir()
        (store.snapshots / fake / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match="too short"):
        store.resolve("ab")
    with pytest.raises(ConfigError, match="no snapshot"):
        store.resolve("ffffffffff")
    with pytest.raises(ConfigError, match="ambiguous"):
        store.resolve("abcd")
    assert store.resolve("abcd1") == "sha256:abcd" + "1" * 60
    assert store.resolve(real[7:15]) == real


def test_default_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path / "x"))
    assert default_root() == tmp_path / "x"
    monkeypatch.delenv(ENV)
    assert default_root().name == "evidence"
