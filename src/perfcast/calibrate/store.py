"""A local, append-only store of calibration revisions, and the revision shipped with
the package.

Layout (root: `--store`, else `$PERFCAST_CALIBRATION_STORE`, else
`<user data dir>/perfcast/calibration`): `revisions/<sha256 hex>.json`, written to a
temporary file and renamed into place, verified against its digest on every load.
"""

from __future__ import annotations

import json
import os
import tempfile
from importlib import resources
from pathlib import Path

from perfcast.calibrate.revision import CalibrationRevision, dumps, plain
from perfcast.core.errors import ConfigError
from perfcast.core.paths import store_root

ENV = "PERFCAST_CALIBRATION_STORE"
DEFAULT_FILE = "default_revision.json"


def default_root() -> Path:
    return store_root(ENV, "calibration")


def read_revision(path: Path) -> CalibrationRevision:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read calibration revision: {exc}", source=str(path)) from None
    return CalibrationRevision.from_json(doc, source=str(path))


def default_revision_path() -> Path:
    """Where the package's shipped revision file is."""
    return Path(str(resources.files("perfcast.calibrate").joinpath(DEFAULT_FILE)))


def default_revision() -> CalibrationRevision:
    """The revision shipped with the package (docs/calibration.md gives its scores)."""
    path = default_revision_path()
    if not path.is_file():
        raise ConfigError("this installation ships no default calibration revision",
                          source=str(path), expected="--calibration none or a revision file")
    return read_revision(path)


class CalibrationStore:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else default_root()

    @property
    def folder(self) -> Path:
        return self.root / "revisions"

    def put(self, rev: CalibrationRevision) -> str:
        hexd = rev.digest.split(":", 1)[1]
        target = self.folder / f"{hexd}.json"
        if target.is_file():
            return rev.digest
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=self.folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(dumps(rev))
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return rev.digest

    def digests(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return sorted("sha256:" + p.stem for p in self.folder.glob("*.json")
                      if not p.name.startswith("."))

    def resolve(self, ref: str) -> str:
        hexpart = ref.split(":", 1)[-1]
        hits = [d for d in self.digests() if d.split(":", 1)[1].startswith(hexpart)]
        if not hits:
            raise ConfigError(f"no calibration revision {ref!r} in {self.folder}",
                              field="--calibration", expected="a digest or unique prefix "
                              "(perfcast calibrate list), default, none, or a JSON file")
        if len(hits) > 1:
            raise ConfigError(f"calibration revision prefix {ref!r} is ambiguous "
                              f"({len(hits)} matches)", field="--calibration")
        return hits[0]

    def get(self, ref: str) -> CalibrationRevision:
        digest = self.resolve(ref)
        path = self.folder / (digest.split(":", 1)[1] + ".json")
        rev = read_revision(path)
        if rev.digest != digest:
            raise ConfigError(f"stored revision does not match its file name ({rev.digest}): "
                              "the file was changed after it was written", source=str(path))
        return rev

    def list(self) -> list[dict]:
        out = []
        for d in self.digests():
            rev = self.get(d)
            out.append(summary(rev))
        return out


def summary(rev: CalibrationRevision) -> dict:
    return {"revision": rev.digest, "name": rev.name, "code_version": rev.code_version,
            "parts": [p.name for p in rev.parts],
            "parameters": sum(len(p.parameters) for p in rev.parts),
            "fitted_on": plain(rev.fitted_on()),
            "cv": {p.name: plain(p.cv.get("summary", {})) for p in rev.parts}}


def load_calibration(ref: str | None, *, store: CalibrationStore | None = None
                     ) -> CalibrationRevision | None:
    """`--calibration REV|default|none|FILE` -> a revision (None for `none`)."""
    if ref is None or ref == "default":
        return default_revision()
    if ref == "none":
        return None
    path = Path(ref)
    if path.suffix == ".json" and path.is_file():
        return read_revision(path)
    return (store or CalibrationStore()).get(ref)
