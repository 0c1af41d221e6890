"""A local, append-only, content-addressed store of evidence database snapshots.

Layout (root: `--store`, else `$PERFCAST_EVIDENCE_STORE`, else
`<user data dir>/perfcast/evidence`):

    snapshots/<sha256 hex>/manifest.json + records.parquet   (never rewritten)
    imports.jsonl                                            (one line per import)

`put` writes a snapshot into a temporary folder inside the root and renames it into
place, so a failed import leaves nothing behind; putting the same content twice finds
the existing snapshot and returns its digest.

A temporary folder `.tmp-<id>` is created under an exclusive lock on `.tmp-<id>.lock`
(fcntl). An import killed mid-way leaves both; the next store open removes every
temporary whose lock no live process holds (and lockless ones older than an hour, left by
earlier versions) and lists them in `EvidenceStore.removed`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: stale temporaries are judged by age alone
    fcntl = None

from perfcast.core.errors import ConfigError, InvalidEvidenceError
from perfcast.core.paths import store_root
from perfcast.evidence.database import MANIFEST, PARQUET_FILE, PerformanceDatabase

ENV = "PERFCAST_EVIDENCE_STORE"
TMP_PREFIX = ".tmp-"
LOCK_SUFFIX = ".lock"
LOCKLESS_STALE_S = 3600.0


def default_root() -> Path:
    return store_root(ENV, "evidence")


def _try_lock(path: Path):
    """An open file holding an exclusive lock on `path`, or None when a live process
    holds it (or it cannot be opened)."""
    try:
        fh = open(path, "a")
    except OSError:
        return None
    if fcntl is None:
        return fh
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        return None
    return fh


@contextlib.contextmanager
def locked_temporary(root: Path) -> Iterator[Path]:
    """A fresh `.tmp-<id>` folder in `root`, locked while the block runs and removed
    (with its lock file) afterwards."""
    fd, lock_name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=LOCK_SUFFIX, dir=root)
    lock = Path(lock_name)
    with os.fdopen(fd, "a") as fh:
        if fcntl is not None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        tmp = lock.with_name(lock.name[:-len(LOCK_SUFFIX)])
        try:
            tmp.mkdir()
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            lock.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def remove_stale_temporaries(root: Path) -> list[Path]:
    """Remove the temporaries of imports that died: those whose lock no process holds,
    and lockless ones (earlier versions) older than an hour. Returns what was removed."""
    if not root.is_dir():
        return []
    removed = []
    now = time.time()
    for path in sorted(root.glob(TMP_PREFIX + "*")):
        if path.name.endswith(LOCK_SUFFIX):
            folder, lock = path.with_name(path.name[:-len(LOCK_SUFFIX)]), path
        else:
            folder, lock = path, path.with_name(path.name + LOCK_SUFFIX)
        if path == lock and folder.exists():
            continue  # handled with its folder
        if lock.exists():
            if not folder.exists() and now - _mtime(lock) < 60:
                continue  # an import between creating its lock and its folder
            fh = _try_lock(lock)
            if fh is None:
                continue  # a live import
            with fh:
                gone = folder.exists()
                shutil.rmtree(folder, ignore_errors=True)
                lock.unlink(missing_ok=True)
            if gone:
                removed.append(folder)
            continue
        if now - _mtime(folder) > LOCKLESS_STALE_S and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class EvidenceStore:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else default_root()
        # temporaries of killed imports, removed on open (the CLI says so)
        self.removed: list[Path] = remove_stale_temporaries(self.root)

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
            with locked_temporary(self.root) as tmp:
                db.save(tmp)
                try:
                    os.rename(tmp, target)
                    created = True
                except OSError:
                    if not (target / MANIFEST).exists():
                        raise
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
        try:
            with locked_temporary(self.root) as tmp:
                db.save(tmp)
                if json.loads((tmp / MANIFEST).read_text())["digest"] != db.digest:
                    return
                # data first: an old manifest over the new file still verifies (same content)
                os.replace(tmp / PARQUET_FILE, folder / PARQUET_FILE)
                os.replace(tmp / MANIFEST, folder / MANIFEST)
        except OSError:
            pass  # a read-only store keeps working, only slower

    def list(self) -> list[dict]:
        return [json.loads((self.snapshots / d[7:] / MANIFEST).read_text())
                for d in self.digests()]


def open_evidence(ref: str, *, hardware: str | None = None,
                  store: EvidenceStore | None = None) -> PerformanceDatabase:
    """A saved database folder, an AIConfigurator folder (imported on the fly), or a
    snapshot digest / unique prefix from the store.

    An AIConfigurator folder's rows are labelled with the system its layout
    (`<system>/<family>/...`) or its tables' `device` column names; `hardware` labels
    them only when neither names one."""
    path = Path(ref)
    if path.exists():
        if (path / MANIFEST).exists():
            return PerformanceDatabase.load(path)
        if path.is_dir():
            from perfcast.evidence.importers.aiconfigurator import import_system

            try:
                return import_system(path)
            except ConfigError as exc:
                if hardware is None or exc.field != "device" or "cannot tell" not in str(exc):
                    raise
            return import_system(path, hardware=hardware)
        raise ConfigError("not an evidence source", source=str(path),
                          expected="a saved database folder (manifest.json), an "
                                   "AIConfigurator folder or a snapshot digest")
    return (store or EvidenceStore()).get(ref)


def systems_of(db: PerformanceDatabase) -> list[str]:
    """The systems (hardware labels) a database holds rows for (no rows read)."""
    return sorted({core[2] for core in db.catalog.schemas})


def counts(db: PerformanceDatabase) -> list[dict]:
    """Rows per (operation, hardware, dtype), reading only those columns of a snapshot."""
    import pyarrow.parquet as pq

    cols = ["operation", "hardware", "dtype"]
    table = pq.read_table(db._lazy.path, columns=cols) if db.is_lazy else db.table.select(cols)
    grouped = table.group_by(cols).aggregate([("operation", "count")])
    return sorted(({"operation": r["operation"], "hardware": r["hardware"],
                    "dtype": r["dtype"], "rows": r["operation_count"]}
                   for r in grouped.to_pylist()),
                  key=lambda r: (r["operation"], r["hardware"], r["dtype"]))
