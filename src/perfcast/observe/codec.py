"""The files of a stored observation set, and how a set is rebuilt (and verified) from them.

    manifest.json          format, digest, kind, the manifest (and the records' digest)
    observations.json      serving sets: every observation (source, facts, row values)
    records/               kernel sets: a PerformanceDatabase folder (Parquet + manifest)

Values are written as plain JSON; identity is never read back from a file: `load_set`
rebuilds the records and recomputes the content digest, which must be the folder name.
"""

from __future__ import annotations

import json
from pathlib import Path

from perfcast.core.errors import ConfigError, InvalidEvidenceError, PerfcastError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.database import PerformanceDatabase
from perfcast.observe.model import (
    FORMAT,
    ObservationManifest,
    ObservationSet,
    ObservationSource,
    ServingObservation,
    SourceFile,
)

MANIFEST = "manifest.json"
OBSERVATIONS = "observations.json"
RECORDS = "records"


# -- JSON form of the records (plain values; canonical identity is recomputed on load) --
def _source_json(s: SourceFile) -> dict:
    return {"name": s.name, "sha256": s.sha256, "format": s.format, "rows": s.rows,
            "revision": s.revision, "columns": list(s.columns),
            "environment": dict(s.environment)}


def manifest_json(m: ObservationManifest) -> dict:
    return {"kind": m.kind, "importer": m.importer, "importer_revision": m.importer_revision,
            "system": m.system, "rows": m.rows, "sources": [_source_json(s) for s in m.sources],
            "environment": {k: list(v) for k, v in m.environment.items()},
            "skipped": [dict(s) for s in m.skipped]}


def manifest_from_json(d: dict) -> ObservationManifest:
    return ObservationManifest(
        kind=d["kind"], importer=d["importer"], importer_revision=d["importer_revision"],
        system=d["system"], rows=int(d["rows"]),
        sources=tuple(SourceFile(name=s["name"], sha256=s["sha256"], format=s["format"],
                                 rows=int(s["rows"]), revision=s["revision"],
                                 columns=tuple(s["columns"]),
                                 environment=FrozenDict(s["environment"]))
                      for s in d["sources"]),
        environment=FrozenDict({k: tuple(v) for k, v in d["environment"].items()}),
        skipped=tuple(FrozenDict(s) for s in d["skipped"]))


def _observation_json(o: ServingObservation) -> dict:
    s = o.source
    return {"source": {"file": s.file, "sha256": s.sha256, "row": s.row,
                       "record_id": s.record_id},
            "environment": dict(o.environment), "values": dict(o.values)}


def _observation_from_json(d: dict) -> ServingObservation:
    s = d["source"]
    return ServingObservation(
        source=ObservationSource(file=s["file"], sha256=s["sha256"], row=s["row"],
                                 record_id=s["record_id"]),
        environment=FrozenDict(d["environment"]), values=FrozenDict(d["values"]))


def save_set(obs: ObservationSet, folder: Path) -> None:
    """Write a set's files into `folder` (which must exist)."""
    if obs.kind == "serving":
        rows = [_observation_json(o) for o in obs.observations()]
        (folder / OBSERVATIONS).write_text(json.dumps(rows, sort_keys=True), encoding="utf-8")
    else:
        obs.database.save(folder / RECORDS)
    head = {"format": FORMAT, "digest": obs.digest, "kind": obs.kind,
            "manifest": manifest_json(obs.manifest)}
    if obs.kind == "kernels":
        head["records_digest"] = obs.database.digest
    (folder / MANIFEST).write_text(json.dumps(head, indent=1, sort_keys=True), encoding="utf-8")


def load_set(folder: Path) -> ObservationSet:
    """Rebuild a set from its folder and check that its digest is the folder's name."""
    try:
        head = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        if head.get("format") != FORMAT:
            raise ConfigError(f"unsupported format {head.get('format')!r}", field="format",
                              expected=FORMAT)
        manifest = manifest_from_json(head["manifest"])
        if head["kind"] == "serving":
            rows = json.loads((folder / OBSERVATIONS).read_text(encoding="utf-8"))
            obs = ObservationSet("serving", manifest,
                                 serving=[_observation_from_json(r) for r in rows])
        else:
            stored = PerformanceDatabase.load(folder / RECORDS)
            # recompute the records' digest from the rows (the stored one is not trusted)
            db = PerformanceDatabase(stored.table, name=stored.name, sources=stored.sources)
            if db.digest != head.get("records_digest"):
                raise InvalidEvidenceError(f"records digest {db.digest} is not the "
                                           f"manifest's {head.get('records_digest')}")
            obs = ObservationSet("kernels", manifest, records=db)
    except (OSError, ValueError, KeyError, TypeError, PerfcastError) as exc:
        raise InvalidEvidenceError(
            f"observation set {folder} is unreadable or was changed: {exc}") from None
    if obs.digest != "sha256:" + folder.name:
        raise InvalidEvidenceError(
            f"observation set {folder} was changed: its content digest is {obs.digest}, "
            "not the folder's name")
    return obs
