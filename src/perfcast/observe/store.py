"""A local, append-only, content-addressed store of observation sets.

Layout (root: `--store`, else `$PERFCAST_OBSERVATION_STORE`, else
`<user data dir>/perfcast/observations`):

    sets/<sha256 hex>/manifest.json + observations.json | records/   (see observe.codec)
    imports.jsonl                                                     (one line per import)

Writing is the evidence store's (`EvidenceStore.put`): into a temporary folder inside
the root, renamed into place, so a failed import leaves nothing behind; the same
content twice finds the existing folder. `get` rebuilds the set from its files and
recomputes its digest: an edited, missing or corrupt file raises InvalidEvidenceError
naming the folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from perfcast.core.errors import ConfigError
from perfcast.core.paths import store_root
from perfcast.evidence.store import EvidenceStore
from perfcast.observe.codec import MANIFEST, load_set, manifest_from_json
from perfcast.observe.model import ObservationSet, set_summary

ENV = "PERFCAST_OBSERVATION_STORE"


def default_root() -> Path:
    return store_root(ENV, "observations")


class ObservationStore(EvidenceStore):
    """`put(set) -> digest`, `get(ref)`, `list()`, `resolve(ref)`, `digests()`."""

    def __init__(self, root: str | Path | None = None) -> None:
        super().__init__(root or default_root())

    @property
    def snapshots(self) -> Path:
        return self.root / "sets"

    sets = snapshots

    def put(self, obs: ObservationSet, *, note: str = "") -> str:  # type: ignore[override]
        """Store a set (atomically; idempotent); return its digest."""
        return super().put(obs, note=note)  # type: ignore[arg-type]

    def resolve(self, ref: str) -> str:
        """Full digest for a digest or unique hex prefix (at least 4 characters)."""
        hexref = ref.split(":", 1)[1] if ref.startswith("sha256:") else ref
        if len(hexref) < 4:
            raise ConfigError(f"observation set reference {ref!r} is too short",
                              expected="a digest or a prefix of at least 4 hex characters")
        found = [d for d in self.digests() if d[7:].startswith(hexref)]
        if not found:
            raise ConfigError(f"no observation set {ref!r} in the store {self.root}",
                              expected="a digest from `perfcast observe list`")
        if len(found) > 1:
            raise ConfigError(f"observation set prefix {ref!r} is ambiguous: "
                              + ", ".join(d[:19] for d in found), expected="a longer prefix")
        return found[0]

    def get(self, ref: str) -> ObservationSet:
        """The set, verified: its content digest must be its folder's name."""
        return load_set(self.sets / self.resolve(ref)[7:])

    def list(self) -> list[dict]:
        """One summary per stored set (read from the manifests, not verified)."""
        out = []
        for d in self.digests():
            try:
                head = json.loads((self.sets / d[7:] / MANIFEST).read_text(encoding="utf-8"))
                m = manifest_from_json(head["manifest"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                out.append({"observation_set": d, "error": f"unreadable manifest ({exc})"})
                continue
            out.append(set_summary(d, m))
        return out
