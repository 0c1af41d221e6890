"""A local, append-only, content-addressed store of evidence database snapshots.

Layout (root: `--store`, else `$PERFCAST_EVIDENCE_STORE`, else
`<user data dir>/perfcast/evidence`):

    snapshots/<sha256 hex>/manifest.json + records.parquet   (never rewritten)
    imports.jsonl                                            (one line per import)

`put` writes a snapshot into a temporary folder inside the root and renames it into
place, so a failed import leaves nothing behind; putting the same content twice finds
the existing snapshot and returns its digest.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from perfcast.core.errors import ConfigError, InvalidEvidenceError
from perfcast.core.paths import store_root
from perfcast.evidence.database import MANIFEST, PARQUET_FILE, PerformanceDatabase

ENV = "PERFCAST_EVIDENCE_STORE"


def default_root() -> Path:
    return store_root(ENV, "evidence")


class EvidenceStore:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else default_root()

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    def put(self, db: PerformanceDatabase, *, note: str = "") -> str:
        """Store a snapshot (atomically); return its digest."""
        hexd = db.digest.split(":", 1)[1]
        target = self.snapshots / hexd
        created = False
        if not (target / MANIFEST).exists():
            self.snapshots.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
            try:
                db.save(tmp)
                try:
                    os.rename(tmp, target)
                    created = True
                except OSError:
                    if not (target / MANIFEST).exists():
                        raise
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        with open(self.root / "imports.jsonl", "a") as log:
            log.write(json.dumps({"digest": db.digest, "name": db.name, "rows": len(db),
                                  "new": created, "note": note,
                                  "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                 sort_keys=True) + "\n")
        return db.digest

    def digests(self) -> list[str]:
        if not self.snapshots.exists():
            return []
        return sorted("sha256:" + p.name for p in self.snapshots.iterdir()
                      if (p / MANIFEST).exists())

    def resolve(self, ref: str) -> str:
        """Full digest for a digest or unique hex prefix (at least 4 characters)."""
        hexref = ref.split(":", 1)[1] if ref.startswith("sha256:") else ref
        if len(hexref) < 4:
            raise ConfigError(f"snapshot reference {ref!r} is too short",
                              expected="a digest or a prefix of at least 4 hex characters")
        found = [d for d in self.digests() if d[7:].startswith(hexref)]
        if not found:
            raise ConfigError(f"no snapshot {ref!r} in the evidence store {self.root}",
                              expected="a digest from `perfcast evidence list`, a saved "
                                       "database folder or an AIConfigurator folder")
        if len(found) > 1:
            raise ConfigError(f"snapshot prefix {ref!r} is ambiguous: "
                              + ", ".join(d[:19] for d in found), expected="a longer prefix")
        return found[0]

    def manifest(self, ref: str) -> dict:
        digest = self.resolve(ref)
        return json.loads((self.snapshots / digest[7:] / MANIFEST).read_text())

    def get(self, ref: str) -> PerformanceDatabase:
        """The snapshot; its rows are read on demand (`PerformanceDatabase.load`). A
        snapshot stored by an earlier version (no file digest in its manifest) is
        verified in full once and rewritten in the current layout: the same content
        and digest, with row-group statistics, the file's sha256 and the catalog."""
        folder = self.snapshots / self.resolve(ref)[7:]
        db = PerformanceDatabase.load(folder)
        if db.digest != "sha256:" + folder.name:  # the manifest vouches for a lazy load
            raise InvalidEvidenceError(f"{folder}: manifest digest {db.digest} is not the "
                                       "snapshot's name (edited or misplaced manifest)")
        if not db.is_lazy and json.loads((folder / MANIFEST).read_text()).get(
                "file", PARQUET_FILE) == PARQUET_FILE:
            self._upgrade(folder, db)
        return db

    def _upgrade(self, folder: Path, db: PerformanceDatabase) -> None:
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        try:
            db.save(tmp)
            if json.loads((tmp / MANIFEST).read_text())["digest"] != db.digest:
                return
            # data first: an old manifest over the new file still verifies (same content)
            os.replace(tmp / PARQUET_FILE, folder / PARQUET_FILE)
            os.replace(tmp / MANIFEST, folder / MANIFEST)
        except OSError:
            pass  # a read-only store keeps working, only slower
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def list(self) -> list[dict]:
        return [json.loads((self.snapshots / d[7:] / MANIFEST).read_text())
                for d in self.digests()]


def open_evidence(ref: str, *, hardware: str, store: EvidenceStore | None = None
                  ) -> PerformanceDatabase:
    """A saved database folder, an AIConfigurator folder (imported on the fly), or a
    snapshot digest / unique prefix from the store."""
    path = Path(ref)
    if path.exists():
        if (path / MANIFEST).exists():
            return PerformanceDatabase.load(path)
        if path.is_dir():
            from perfcast.evidence.importers.aiconfigurator import import_system

            return import_system(path, hardware=hardware)
        raise ConfigError("not an evidence source", source=str(path),
                          expected="a saved database folder (manifest.json), an "
                                   "AIConfigurator folder or a snapshot digest")
    return (store or EvidenceStore()).get(ref)
