"""Verified snapshots load lazily and answer exactly like the whole database in memory."""

from __future__ import annotations

import json
import shutil

import pytest
from evidence_helpers import gemm_query, make_record

import perfcast.evidence.database as database
from perfcast.core.errors import AmbiguousEvidenceError, InvalidEvidenceError
from perfcast.evidence.factory import build_resolver
from perfcast.evidence.catalog import Catalog, build_catalog
from perfcast.evidence.chain import evidence_providers, resolution_json
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.store import EvidenceStore
from perfcast.hardware import load_system


def _records():
    out = []
    i = 0
    for runtime, revision, impl, scale in (("vllm", "0.19.0", "cutlass", 1.0),
                                           ("vllm", "0.19.0", "triton", 1.3),
                                           ("vllm", "0.24.0", "cutlass", 0.9),
                                           ("sglang", "0.5.14", "cutlass", 1.1)):
        for m in (16, 64, 256):
            for n in (1024, 4096):
                i += 1
                sel = {"m": m, "n": n, "k": 4096, "runtime": runtime,
                       "runtime_revision": revision, "implementation": impl}
                out.append(make_record(scale * 1e-6 * m * n / 1024, sel, rid=f"g{i}",
                                       source="aic", revision=f"{runtime}/{revision}"))
    # runtime-free records, a second group at the same specificity (ambiguous), an
    # int-typed runtime (never equal to the string a query states) and another dtype
    out.append(make_record(5e-6, {"m": 16, "n": 1024, "k": 4096}, rid="free-a", source="a"))
    out.append(make_record(6e-6, {"m": 16, "n": 1024, "k": 4096}, rid="free-b", source="b"))
    out.append(make_record(7e-6, {"m": 64, "n": 1024, "k": 4096}, rid="free-c", source="a"))
    out.append(make_record(8e-6, {"m": 64, "n": 1024, "k": 4096, "runtime": 7}, rid="int-rt",
                           source="a"))
    out.append(make_record(9e-6, {"m": 64, "n": 1024, "k": 4096, "runtime": "vllm"},
                           rid="fp8", dtype="fp8", source="a"))
    return out


QUERIES = [
    dict(m=64, n=1024, k=4096, runtime="vllm", revision="0.19.0", implementation="cutlass"),
    dict(m=64, n=4096, k=4096, runtime="vllm", revision="0.19.0", implementation="triton"),
    dict(m=100, n=1024, k=4096, runtime="vllm", revision="0.19.0", implementation="cutlass"),
    dict(m=100, n=2048, k=4096, runtime="vllm", revision="0.24.0", implementation="cutlass"),
    dict(m=64, n=1024, k=4096, runtime="vllm", revision="0.19.0"),            # no kernel
    dict(m=64, n=1024, k=4096, runtime="vllm", revision="0.19.0", implementation="nope"),
    dict(m=64, n=1024, k=4096, runtime="trtllm", revision="1.0", implementation="cutlass"),
    dict(m=64, n=1024, k=4096),                                              # free record
    dict(m=64, n=1024, k=4096, runtime="sglang"),
    dict(m=64, n=1024, k=4096, runtime="vllm", dtype="fp8"),
    dict(m=64, n=1024, k=4096, dtype="fp8"),                                 # needs runtime
    dict(m=16, n=1024, k=4096),                                              # ambiguous
    dict(m=64, n=1024, k=4096.0, runtime="vllm", revision="0.19.0", implementation="cutlass"),
    dict(m=5000, n=1024, k=4096, runtime="vllm", revision="0.19.0", implementation="cutlass"),
]


def _answers(db, system):
    resolver = build_resolver(system, evidence=evidence_providers([db], system, "interpolate"))
    out = []
    for q in QUERIES:
        q = dict(q)
        query = gemm_query(q.pop("m"), q.pop("n"), q.pop("k"), **q)
        try:
            out.append(resolution_json(resolver.resolve(query)))
        except AmbiguousEvidenceError as exc:
            out.append(("ambiguous", str(exc)))
    return out


@pytest.fixture
def saved(tmp_path, monkeypatch):
    monkeypatch.setattr(database, "ROW_GROUP", 4)  # many row groups: exercises pruning
    db = PerformanceDatabase.from_records(_records(), name="lazy-test")
    db.save(tmp_path / "db")
    return db, tmp_path / "db"


def test_lazy_snapshot_answers_like_the_database_in_memory(saved):
    db, folder = saved
    system = load_system("h100_sxm")
    lazy = PerformanceDatabase.load(folder)
    assert lazy.is_lazy and lazy.digest == db.digest and len(lazy) == len(db)
    got, want = _answers(lazy, system), _answers(db, system)
    assert got == want
    assert lazy.is_lazy  # answering read slices only, never the whole table
    kinds = [w[0] if isinstance(w, tuple) else w["method"] for w in want]
    # the set covers hits, interpolation, misses down to the roofline and ambiguity
    assert {"measured", "interpolated", "analytical", "ambiguous"} <= set(kinds)
    reasons = [a["reason"] for w in got if isinstance(w, dict) for a in w["attempts"]]
    assert "no partition matches the query's fixed selectors (records need runtime)" \
        in reasons
    assert lazy.table.num_rows == len(db)  # and the whole table is there on request
    assert database._table_digest(lazy.table) == db.digest


def test_select_keeps_database_order_and_only_matching_rows(saved):
    db, folder = saved
    lazy = PerformanceDatabase.load(folder)
    core = ("operator", "gemm", "h100_sxm", "bf16")
    ctx = {"runtime": "vllm", "runtime_revision": "0.19.0"}
    got = lazy.select(core, ctx).table.column("record_id").to_pylist()
    assert got == db.select(core, ctx).table.column("record_id").to_pylist()
    # rows without an implementation selector do not exist here; rows requiring one do not
    # match a query that states none; runtime-free rows always qualify
    assert got == ["free-a", "free-b", "free-c"]
    ctx["implementation"] = "triton"
    assert lazy.select(core, ctx).table.column("record_id").to_pylist() == \
        ["g7", "g8", "g9", "g10", "g11", "g12", "free-a", "free-b", "free-c"]


def test_catalog_round_trips_through_the_manifest(saved):
    db, folder = saved
    manifest = json.loads((folder / "manifest.json").read_text())
    cat = Catalog.from_json(manifest["catalog"])
    assert cat == build_catalog(db.table)
    gemm = cat.schemas[("operator", "gemm", "h100_sxm", "bf16")]
    assert [len(s) for s in gemm] == [6, 4, 3]  # most specific first
    assert cat.str_values["sel.str.runtime"] == {"vllm", "sglang"}


def test_changed_file_is_refused(saved):
    _, folder = saved
    data = bytearray((folder / "records.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "records.parquet").write_bytes(bytes(data))
    with pytest.raises(InvalidEvidenceError, match="file sha256"):
        PerformanceDatabase.load(folder)


def test_store_upgrades_a_snapshot_written_without_file_digest(saved, tmp_path):
    db, folder = saved
    store = EvidenceStore(tmp_path / "store")
    digest = store.put(db)
    snap = store.snapshots / digest[7:]
    manifest = json.loads((snap / "manifest.json").read_text())
    for key in ("file_sha256", "catalog"):  # as the previous version wrote it
        del manifest[key]
    (snap / "manifest.json").write_text(json.dumps(manifest))
    first = store.get(digest[:12])
    assert not first.is_lazy and first.digest == digest  # verified in full
    upgraded = json.loads((snap / "manifest.json").read_text())
    assert upgraded["digest"] == digest and upgraded["file_sha256"].startswith("sha256:")
    again = store.get(digest[:12])
    assert again.is_lazy and again.digest == digest
    system = load_system("h100_sxm")
    assert _answers(again, system) == _answers(db, system)
    shutil.rmtree(snap)


def test_store_refuses_a_manifest_naming_another_digest(saved, tmp_path):
    db, _ = saved
    store = EvidenceStore(tmp_path / "store")
    digest = store.put(db)
    manifest_path = store.snapshots / digest[7:] / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["digest"] = "sha256:" + "1" * 64
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(InvalidEvidenceError, match="not the snapshot's name"):
        store.get(digest)
