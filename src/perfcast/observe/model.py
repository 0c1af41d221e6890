"""Observation sets: measured results as immutable, content-addressed records.

An `ObservationSet` holds what one import read: its `kind` (`serving`: end-to-end
deployments; `kernels`: measured kernel calls), the observations, and an
`ObservationManifest` (source files with their sha256, importer and revision, row
counts, environment facts).

Every observation keeps its source (`ObservationSource`: file, file sha256, 1-based
row/line number, record id) and the environment facts its source states (system,
backend, backend version, container image, device, ...). Facts are recorded, never
interpreted: no rule keys on a provenance string.

Kernel observations are stored as one `PerformanceDatabase` (columnar: an AIConfigurator
system holds millions of rows); `KernelObservation`s are built from its records on
demand. The set's digest is `content_digest("perfcast.ObservationSet", ...)` over the
kind, the manifest and the observations (serving: every observation; kernels: the
records' content digest, itself a hash of every column).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfcast.core.canonical import Record, content_digest
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.records import PerformanceRecord

FORMAT = "perfcast.observe/1"
DIGEST_DOMAIN = "perfcast.ObservationSet"
KINDS = ("serving", "kernels")


@dataclass(frozen=True)
class ObservationSource(Record):
    """Where one observation was read: file (relative to the import root), its sha256,
    the 1-based line (CSV, header = line 1) or data row (Parquet), None when the
    observation aggregates several events (a profiler trace), and the record id."""

    file: str
    sha256: str
    row: int | None
    record_id: str


@dataclass(frozen=True)
class SourceFile(Record):
    """One file an import read. `revision` tells two imports of the same bytes apart
    (an AIConfigurator table borrowed by another version through `reuse.yaml`);
    `columns` is a CSV's header in file order; `environment` the facts the source
    states for all of its rows."""

    name: str
    sha256: str
    format: str
    rows: int
    revision: str = ""
    columns: tuple[str, ...] = ()
    environment: FrozenDict[str, str] = field(default_factory=FrozenDict)


@dataclass(frozen=True)
class ObservationManifest(Record):
    """What an import read and with what. `environment`: each fact and the distinct
    values its observations state; `skipped`: what the import saw and did not read
    (an unsupported table), with the reason."""

    kind: str
    importer: str
    importer_revision: str
    system: str
    rows: int
    sources: tuple[SourceFile, ...]
    environment: FrozenDict[str, tuple[str, ...]] = field(default_factory=FrozenDict)
    skipped: tuple[FrozenDict[str, str], ...] = ()

    def source(self, sha256: str, revision: str | None = None) -> SourceFile:
        for s in self.sources:
            if s.sha256 == sha256 and (revision is None or s.revision == revision):
                return s
        raise KeyError(f"no source file {sha256} {revision or ''}".strip())


@dataclass(frozen=True)
class ServingObservation(Record):
    """One measured deployment: every column of its CSV row, verbatim."""

    source: ObservationSource
    environment: FrozenDict[str, str]
    values: FrozenDict[str, str]


@dataclass(frozen=True)
class KernelObservation(Record):
    """One measured kernel latency: the evidence record, the concrete kernel or
    implementation its source names ("" when none) and the model-operation lineage id
    it was recorded under ("" when the source has none)."""

    source: ObservationSource
    environment: FrozenDict[str, str]
    record: PerformanceRecord
    kernel: str = ""
    lineage: str = ""


Observation = ServingObservation | KernelObservation

_TRAILING_INT = re.compile(r"#(?:row)?(\d+)$")
# how a format's record ids count rows: "...#<0-based data row>" or "...#row<line>"
ROW_FROM_RECORD_ID = {"aiconfigurator_parquet": 1, "ascend_kernel_csv": 0}


def row_of(fmt: str, record_id: str) -> int | None:
    """1-based row/line of a record id in a source of format `fmt` (None: aggregated)."""
    offset = ROW_FROM_RECORD_ID.get(fmt)
    m = _TRAILING_INT.search(record_id)
    if offset is None or m is None:
        return None
    return int(m.group(1)) + offset


def kernel_of(record: PerformanceRecord) -> str:
    """The concrete kernel a record names: its `implementation` selector, the GPU kernel
    names a trace linked to the op, or the Ascend kernel type of its CSV."""
    impl = record.selector.get("implementation")
    if isinstance(impl, str) and impl:
        return impl
    return record.metadata.get("kernel_names", "") or record.metadata.get("kernel_type", "")


def environment_summary(envs: Sequence[Mapping[str, str]]) -> FrozenDict[str, tuple[str, ...]]:
    facts: dict[str, set[str]] = {}
    for env in envs:
        for k, v in env.items():
            facts.setdefault(k, set()).add(v)
    return FrozenDict({k: tuple(sorted(v)) for k, v in facts.items()})


def _source_of(manifest: ObservationManifest, sha256: str, revision: str) -> SourceFile:
    """The manifest's entry for a record's (source digest, source revision): the same
    bytes imported under two revisions are two entries."""
    try:
        return manifest.source(sha256, revision)
    except KeyError:
        return manifest.source(sha256)


def _check_sources(records: PerformanceDatabase, manifest: ObservationManifest) -> None:
    """Every record's source file is in the manifest (no observation without a source)."""
    pairs = records.table.select(["source_digest", "source_revision"]).group_by(
        ["source_digest", "source_revision"]).aggregate([]).to_pylist()
    for pair in pairs:
        try:
            _source_of(manifest, pair["source_digest"], pair["source_revision"])
        except KeyError:
            raise ConfigError(f"records of source {pair['source_digest']} "
                              f"({pair['source_revision']}) have no source file in the "
                              "manifest", field="sources") from None


class ObservationSet:
    """Immutable observations of one import. Build with `ObservationSet.serving(...)` or
    `ObservationSet.kernels(...)` (the importers do); read with `observations()`,
    `silicon_rows()` and `kernel_records()`."""

    __slots__ = ("_kind", "_manifest", "_serving", "_records", "_digest")

    def __init__(self, kind: str, manifest: ObservationManifest, *,
                 serving: Sequence[ServingObservation] = (),
                 records: PerformanceDatabase | None = None) -> None:
        if kind not in KINDS:
            raise ConfigError(f"unknown observation kind {kind!r}", field="kind",
                              expected=" | ".join(KINDS))
        if manifest.kind != kind:
            raise ConfigError(f"manifest kind {manifest.kind!r} is not {kind!r}", field="kind")
        if kind == "kernels" and records is None:
            raise ConfigError("a kernel observation set needs its records", field="records")
        if kind == "serving" and records is not None:
            raise ConfigError("a serving observation set holds no kernel records",
                              field="records")
        count = len(records) if records is not None else len(serving)
        if records is not None:
            _check_sources(records, manifest)
        if count != manifest.rows:
            raise ConfigError(f"manifest says {manifest.rows} rows, the set holds {count}",
                              field="rows")
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_manifest", manifest)
        object.__setattr__(self, "_serving", tuple(serving))
        object.__setattr__(self, "_records", records)
        object.__setattr__(self, "_digest", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("ObservationSet is immutable")

    # identity ------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self._kind

    @property
    def manifest(self) -> ObservationManifest:
        return self._manifest

    @property
    def digest(self) -> str:
        if self._digest is None:
            content = self._serving if self._kind == "serving" else \
                {"records": self._records.digest}
            object.__setattr__(self, "_digest", content_digest(DIGEST_DOMAIN, {
                "format": FORMAT, "kind": self._kind, "manifest": self._manifest,
                "observations": content}))
        return self._digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObservationSet) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __len__(self) -> int:
        return self._manifest.rows

    def __repr__(self) -> str:
        return f"ObservationSet({self._kind}, {len(self)} rows, {self.digest[:19]})"

    @property
    def name(self) -> str:
        """A label for logs: the kind and the first source files."""
        names = [s.name for s in self._manifest.sources]
        more = f" (+{len(names) - 3})" if len(names) > 3 else ""
        return f"{self._kind}:" + ",".join(names[:3]) + more

    def save(self, folder: str | Path) -> Path:
        """Write the set's files into `folder` (layout: `perfcast.observe.codec`)."""
        from perfcast.observe.codec import save_set

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_set(self, folder)
        return folder

    # reading -------------------------------------------------------------------------
    @property
    def database(self) -> PerformanceDatabase:
        """The kernel records as one columnar database (kernel sets only)."""
        if self._records is None:
            raise ConfigError("a serving observation set has no kernel records",
                              field="kind", expected="kernels")
        return self._records

    def observations(self) -> Iterator[Observation]:
        if self._kind == "serving":
            yield from self._serving
            return
        for rec in self._records.records():
            p = rec.provenance
            src = _source_of(self._manifest, p.source_digest, p.source_revision)
            yield KernelObservation(
                source=ObservationSource(file=src.name, sha256=src.sha256,
                                         row=row_of(src.format, p.raw_record_id),
                                         record_id=p.raw_record_id),
                environment=src.environment, record=rec, kernel=kernel_of(rec),
                lineage=rec.metadata.get("lineage", ""))

    def silicon_rows(self) -> list[dict[str, str]]:
        """The rows as `csv.DictReader` reads them (what `perfcast.serving.silicon.read_rows`
        returns): one dict per row, keys in the file's column order, values verbatim."""
        if self._kind != "serving":
            raise ConfigError("silicon_rows() needs a serving observation set",
                              field="kind", expected="serving")
        columns = {s.sha256: s.columns for s in self._manifest.sources}
        return [{c: o.values[c] for c in columns[o.source.sha256]} for o in self._serving]

    def kernel_records(self) -> list[PerformanceRecord]:
        """The `PerformanceRecord`s the evidence importers produce for these sources."""
        if self._kind != "kernels":
            raise ConfigError("kernel_records() needs a kernel observation set",
                              field="kind", expected="kernels")
        return list(self._records.records())


def set_summary(digest: str, m: ObservationManifest) -> dict:
    """What `perfcast observe list` prints for one set."""
    return {"observation_set": digest, "kind": m.kind, "rows": m.rows, "system": m.system,
            "importer": m.importer, "importer_revision": m.importer_revision,
            "sources": len(m.sources), "skipped": len(m.skipped),
            "environment": {k: list(v) for k, v in m.environment.items()}}
