"""ObservationStore: content addressing, idempotence, verified loads, atomic writes."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from observe_helpers import AIC_H100, FIA, SILICON, A3

from perfcast.core.errors import ConfigError, InvalidEvidenceError
from perfcast.evidence.database import file_sha256
from perfcast.observe import ObservationStore, default_root, import_kernels, import_silicon
from perfcast.observe import codec
from perfcast.observe import store as store_mod


def test_put_get_round_trip_serving(tmp_path):
    store = ObservationStore(tmp_path)
    obs = import_silicon(SILICON)
    digest = store.put(obs)
    assert digest == obs.digest and (tmp_path / "sets" / digest[7:] / "manifest.json").is_file()
    back = store.get(digest[7:15])
    assert back == obs and back.digest == digest
    assert back.manifest == obs.manifest
    assert list(back.observations()) == list(obs.observations())
    assert back.silicon_rows() == obs.silicon_rows()


def test_put_get_round_trip_kernels(tmp_path):
    store = ObservationStore(tmp_path)
    obs = import_kernels(FIA, system=A3)
    digest = store.put(obs)
    back = store.get(digest)
    assert back.digest == digest and back.manifest == obs.manifest
    assert back.kernel_records() == obs.kernel_records()
    assert [o.source for o in back.observations()] == [o.source for o in obs.observations()]


def test_same_content_same_digest_and_one_folder(tmp_path):
    store = ObservationStore(tmp_path / "store")
    copy = tmp_path / "elsewhere" / SILICON.name
    copy.parent.mkdir()
    copy.write_bytes(SILICON.read_bytes())
    a, b = import_silicon(SILICON), import_silicon(copy)
    assert a.digest == b.digest
    assert store.put(a) == store.put(b)
    assert len(store.digests()) == 1
    log = [json.loads(line) for line in (tmp_path / "store" / "imports.jsonl").open()]
    assert [e["new"] for e in log] == [True, False]
    # one changed byte of content is another set
    copy.write_text(SILICON.read_text().replace("h100_sxm,fp8", "h100_sxm,bf16", 1))
    assert import_silicon(copy).digest != a.digest


def test_kernel_sets_are_content_addressed_too():
    a = import_kernels(AIC_H100 / "gemm", system="h100_sxm")
    b = import_kernels(AIC_H100 / "gemm", system="h100_sxm")
    assert a.digest == b.digest
    assert import_kernels(AIC_H100 / "gemm" / "vllm", system="h100_sxm").digest != a.digest


def _edit_json(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_editing_a_stored_serving_file_is_detected(tmp_path):
    store = ObservationStore(tmp_path)
    digest = store.put(import_silicon(SILICON))
    folder = tmp_path / "sets" / digest[7:]

    def faster(rows):
        rows[0]["values"]["silicon_ttft_ms"] = "1.0"

    _edit_json(folder / "observations.json", faster)
    with pytest.raises(InvalidEvidenceError, match=digest[7:]) as err:
        store.get(digest)
    assert "was changed" in str(err.value)


def test_editing_a_manifest_fact_is_detected(tmp_path):
    store = ObservationStore(tmp_path)
    digest = store.put(import_silicon(SILICON))
    folder = tmp_path / "sets" / digest[7:]

    def relabel(head):
        head["manifest"]["sources"][0]["environment"] = {"system": "h200_sxm"}

    _edit_json(folder / "manifest.json", relabel)
    with pytest.raises(InvalidEvidenceError, match=digest[7:]):
        store.get(digest)


def test_rewriting_kernel_records_is_detected_even_with_a_matching_file_hash(tmp_path):
    store = ObservationStore(tmp_path)
    digest = store.put(import_kernels(FIA, system=A3))
    records = tmp_path / "sets" / digest[7:] / "records"
    table = pq.read_table(records / "records.parquet")
    faster = pc.multiply(table.column("latency_s"), 0.5)
    pq.write_table(table.set_column(table.column_names.index("latency_s"), "latency_s",
                                    faster), records / "records.parquet")
    # a careful edit also updates the records' own manifest to the new file's hash
    _edit_json(records / "manifest.json",
               lambda m: m.update(file_sha256=file_sha256(records / "records.parquet")))
    with pytest.raises(InvalidEvidenceError, match=digest[7:]):
        store.get(digest)


def test_a_missing_file_is_detected(tmp_path):
    store = ObservationStore(tmp_path)
    digest = store.put(import_silicon(SILICON))
    (tmp_path / "sets" / digest[7:] / "observations.json").unlink()
    with pytest.raises(InvalidEvidenceError, match="unreadable or was changed"):
        store.get(digest)


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    store = ObservationStore(tmp_path)

    def broken(obs, folder):
        (folder / "observations.json").write_text("[")
        raise OSError("disk full")

    monkeypatch.setattr(codec, "save_set", broken)
    with pytest.raises(OSError, match="disk full"):
        store.put(import_silicon(SILICON))
    assert store.digests() == []
    assert [p.name for p in tmp_path.iterdir()] == ["sets"]


def test_references_and_listing(tmp_path):
    store = ObservationStore(tmp_path)
    serving = store.put(import_silicon(SILICON))
    kernels = store.put(import_kernels(FIA, system=A3))
    with pytest.raises(ConfigError, match="too short"):
        store.resolve("ab")
    with pytest.raises(ConfigError, match="no observation set"):
        store.resolve("0000000000")
    assert store.resolve(serving[:15]) == serving
    listed = {s["observation_set"]: s for s in store.list()}
    assert set(listed) == {serving, kernels}
    assert (listed[serving]["kind"], listed[serving]["rows"]) == ("serving", 5)
    assert (listed[kernels]["kind"], listed[kernels]["rows"], listed[kernels]["system"]) == \
        ("kernels", 9, A3)
    assert listed[kernels]["environment"]["device"] == ["ATLAS_800_A3_752T_128G_DIE"]


def test_default_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(store_mod.ENV, str(tmp_path / "x"))
    assert default_root() == tmp_path / "x"
    monkeypatch.delenv(store_mod.ENV)
    assert default_root().name == "observations"


def test_observation_sets_are_immutable():
    obs = import_silicon(SILICON)
    with pytest.raises(AttributeError):
        obs.kind = "kernels"
    first = next(iter(obs.observations()))
    with pytest.raises(AttributeError):
        first.values = {}
    assert isinstance(obs.manifest.sources, tuple)
