"""Comparison oracles: `InferenceBaseline.lookup()` answers after perfcast has costed a
step, for comparison only. A baseline is not a cost provider: it has no `supports()` or
`estimate()`, and `CostResolver` refuses to install one (`comparison_oracle`), so a
validation baseline never leaks into an estimate. To cost with Vidur rows, import them
(`VidurProfileImporter.from_csv`) and install `PerformanceDatabaseProvider(database)`:
an explicit, separate decision.

`VidurProfileBaseline.from_csv(attention_csv=..., compute_csv=..., network_csv=...,
hardware_name=..., dtype=..., source_revision=..., model_name=..., attention_backend=...,
block_size=...)` reads Vidur's profiles with the importer's mapping (docs/evidence.md),
milliseconds as seconds. The caller pins the Vidur revision, the hardware and the dtype
(Vidur records none); a pinned attention backend or block size that an attention row
contradicts is an error. The baseline's revision is the digest of the files and that
identity.

`lookup(query)` answers only an exact match: one Vidur record whose selector holds every
dim of the query and its stated context (the attention backend is the `implementation`).
Anything else is None, not covered; never zero, never the nearest row.
"""

from __future__ import annotations

import csv
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from perfcast.core.canonical import content_digest
from perfcast.core.errors import ConfigError
from perfcast.evidence.contracts import CostQuery, MatchKind, Miss
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.importers.common import file_digest, system_id
from perfcast.evidence.importers.vidur import VidurProfileImporter
from perfcast.evidence.provider_db import PerformanceDatabaseProvider


@dataclass(frozen=True)
class BaselineReference:
    """What an oracle measured for one query."""

    latency_s: float
    baseline: str                  # the oracle's name
    baseline_revision: str         # digest of its files and pinned identity
    source_revision: str           # the upstream revision the caller pinned
    raw_record_ids: tuple[str, ...]


class InferenceBaseline(ABC):
    """An external comparison oracle: `lookup()` only. `CostResolver` refuses it."""

    comparison_oracle = True
    name: str = "baseline"
    revision: str = ""

    @abstractmethod
    def lookup(self, query: CostQuery) -> BaselineReference | None:
        """The oracle's answer to `query`, or None where it holds none."""


PROFILES = {"attention_csv": "is_prefill", "compute_csv": "num_tokens",
            "network_csv": "collective"}


def _header(path: Path) -> list[str]:
    try:
        with open(path, newline="") as f:
            return next(csv.reader(f), [])
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc}", source=str(path)) from None


def _check_pinned(path: Path, column: str, pinned: str) -> None:
    """Every attention row's `column` equals the caller's pinned value."""
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if str(row.get(column, "")).strip() != pinned:
                raise ConfigError(f"row {i} (line {i + 2}): {row.get(column)!r}, but the "
                                  f"baseline is pinned to {pinned!r}", source=str(path),
                                  field=column, expected=f"a profile of {column} {pinned}")


class VidurProfileBaseline(InferenceBaseline):
    """Exact-match comparison baseline over Vidur's public CSV profiles."""

    name = "vidur_baseline"

    def __init__(self, database: PerformanceDatabase, *, revision: str,
                 source_revision: str, identity: dict) -> None:
        self._rows = PerformanceDatabaseProvider(database, name=self.name)
        self.revision = revision
        self.source_revision = source_revision
        self.identity = dict(identity)

    def __len__(self) -> int:
        return len(self._rows.database)

    @classmethod
    def from_csv(cls, attention_csv: str | Path | None = None,
                 compute_csv: str | Path | None = None,
                 network_csv: str | Path | None = None, *, hardware_name: str, dtype: str,
                 source_revision: str, model_name: str = "", attention_backend: str = "",
                 block_size: int | None = None) -> VidurProfileBaseline:
        given = {k: Path(v) for k, v in (("attention_csv", attention_csv),
                                         ("compute_csv", compute_csv),
                                         ("network_csv", network_csv)) if v}
        if not given:
            raise ConfigError("no Vidur profile given", field="attention_csv",
                              expected="attention_csv, compute_csv and/or network_csv")
        if not str(source_revision).strip():
            raise ConfigError("a baseline needs the Vidur revision its profiles come from",
                              field="source_revision", expected="a pinned Vidur commit")
        hardware = system_id(hardware_name, field="hardware_name")
        parts, files = [], {}
        for key, path in given.items():
            marker = PROFILES[key]
            others = [k for k, m in PROFILES.items() if k != key and m in _header(path)]
            if marker not in _header(path) or others:
                raise ConfigError(f"is not a Vidur {key.removesuffix('_csv')} profile",
                                  source=str(path), field=key,
                                  expected=f"a CSV with a {marker!r} column")
            if key == "attention_csv":
                if attention_backend:
                    _check_pinned(path, "attention_backend", attention_backend)
                if block_size is not None:
                    _check_pinned(path, "block_size", str(int(block_size)))
            parts.append(VidurProfileImporter.from_csv(path, hardware=hardware, dtype=dtype,
                                                       source_revision=source_revision))
            files[key] = {"name": path.name, "sha256": file_digest(path)}
        identity = {"hardware": hardware, "dtype": dtype, "model_name": model_name,
                    "attention_backend": attention_backend, "block_size": block_size,
                    "source_revision": source_revision}
        db = PerformanceDatabase.concat(parts, name="vidur baseline") if len(parts) > 1 \
            else parts[0]
        revision = content_digest("perfcast.VidurProfileBaseline",
                                  {"files": files, "identity": identity})
        return cls(db, revision=revision, source_revision=source_revision, identity=identity)

    def lookup(self, query: CostQuery) -> BaselineReference | None:
        if self._rows.supports(query) is not True:
            return None
        answer = self._rows.estimate(query)
        if isinstance(answer, Miss) or answer.match_kind is not MatchKind.EXACT:
            return None
        return BaselineReference(answer.latency_s, self.name, self.revision,
                                 answer.source_revision, answer.raw_record_ids)


__all__ = ["BaselineReference", "InferenceBaseline", "VidurProfileBaseline"]
