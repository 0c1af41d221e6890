"""Import a collected database (per-kernel CSVs + hcom_*.csv) as evidence records.

Each row with a valid latency (contract priority `Average Duration(us)`, `Profiling
Average Duration(us)`, `Duration(us)`) becomes one record in the shape of perfcast's
`PerformanceRecord`: subject, operation, hardware, canonical dtype, a typed selector
(the row's semantic axes from kernel_types.yaml -- GEMM `m, n, k`, attention `batch,
q_tokens, kv_len, heads, kv_heads, head_dim, ...`; collectives `message_bytes,
participants` -- plus `runtime`/`runtime_revision` when given), latency in seconds and
provenance (source, revision, importer, sha256 of the CSV, method, raw record id).

Collective rows are converted from HCCL counting to perfcast's: all_gather and
reduce_scatter `message_bytes` are multiplied by `num_devices` (full buffer).

Rows are read for the `hardware` they are imported as: a database that declares another
device is refused (naming both); a row replayed on another device (`MicroBench Device`)
contributes only its profiled duration, if any; rows whose duration is text, negative
or not finite are skipped. `ImportSkips` counts both, with CSV line numbers.

Two kernel types that give the same (operation, hardware, dtype, selector) -- e.g.
`aten::linear` and the `aten::addmm` it calls, in one torch trace -- would be two
equally specific evidence groups; the import refuses them and names both, so the user
picks one with `kernel_types`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfcast.collect.comm import COMM_FILES
from perfcast.collect.kernel_types import axes_of, spec_for
from perfcast.collect.tables import (
    AVG,
    COMM_PREFIX,
    COUNT,
    INPUT_DTYPES,
    INPUT_FORMATS,
    INPUT_SHAPES,
    LATENCY_PRIORITY,
    MB_DEVICE,
    STD,
    default_mode,
    load_database,
    parse_shapes,
    split_list,
    valid_duration,
)
from perfcast.core.dtypes import parse_dtype
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.profiling.devices import same_device
from perfcast.evidence.profiling.kernel_csv import duration_cell

IMPORTER = "perfcast.collect.evidence"
IMPORTER_REVISION = "1"
DEFAULT_OPERATIONS = ("gemm", "attention")
COMM_OPERATIONS = {file: op for op, file in COMM_FILES.items()}
COMM_OPERATIONS["hcom_alltoall_"] = "all_to_all"
FULL_BUFFER_OPERATIONS = ("all_gather", "reduce_scatter")


@dataclass(frozen=True)
class CollectedRecord:
    """One measured row, field for field what `PerformanceRecord` holds."""

    subject: str                          # operator | communication
    operation: str
    hardware: str
    dtype: str
    selector: FrozenDict
    latency_s: float
    provenance: FrozenDict                # source, source_revision, importer, ...
    metadata: FrozenDict = field(default_factory=FrozenDict)


@dataclass
class ImportSkips:
    """Rows left out of an import, by CSV file name: CSV line numbers."""

    bad_durations: dict[str, list[int]] = field(default_factory=dict)
    foreign: dict[str, list[int]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        from perfcast.evidence.profiling.validate import line_list

        out = [f"skipped {len(rows)} row(s) of {name}: the duration is not a non-negative "
               f"number (line(s) {line_list(rows)})" for name, rows in self.bad_durations.items()]
        out += [f"{len(rows)} row(s) of {name} were replayed on another device; their replayed "
                f"durations are not imported (line(s) {line_list(rows)})"
                for name, rows in self.foreign.items()]
        return out


def row_duration(row: dict, table, hardware: str, skips: ImportSkips | None, line: int
                 ) -> tuple[float, str] | None:
    """(latency_us, column) of a row read for `hardware`, recording why a row is skipped."""
    name = table.path.name if table.path else table.kernel_type
    measured_on = (row.get(MB_DEVICE) or "").strip()
    columns = LATENCY_PRIORITY
    if measured_on and not same_device(measured_on, hardware):
        if skips is not None:
            skips.foreign.setdefault(name, []).append(line)
        columns = tuple(c for c in LATENCY_PRIORITY if c != AVG)
    for column in columns:
        if column not in row:
            continue
        value = duration_cell(row.get(column) or "")
        if value == "bad":
            if skips is not None:
                skips.bad_durations.setdefault(name, []).append(line)
            return None
        if value:
            return value, column
    return None


def check_hardware(database_path: Path, hardware: str) -> None:
    """Refuse importing a database declared for one device as another."""
    from perfcast.collect.devices import declared_device

    declared = declared_device(database_path)
    if declared and not same_device(declared, hardware):
        raise ConfigError(f"the database was measured on {declared}, not {hardware}",
                          source=str(database_path), field="--hardware",
                          expected=f"--hardware {declared.lower()}")


def sha256_file(path: Path) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def collected_records(database_path: Path, *, hardware: str, runtime: str = "",
                      runtime_revision: str = "", kernel_types: Sequence[str] = (),
                      operations: Sequence[str] = DEFAULT_OPERATIONS,
                      comm_dtype: str = "bf16", source: str = "perfcast-collect",
                      source_revision: str = "", skips: ImportSkips | None = None
                      ) -> list[CollectedRecord]:
    """Records of every usable row. `kernel_types` restricts compute CSVs (names or file
    stems); `operations` restricts compute operations (collectives are always read);
    `skips` collects the rows left out and why."""
    root = Path(database_path)
    check_hardware(root, hardware)
    tables = load_database(root)
    context = {k: v for k, v in (("runtime", runtime), ("runtime_revision", runtime_revision)) if v}
    revision = source_revision or root.name
    wanted = {spec_for(k).kernel_type if spec_for(k) else k for k in kernel_types}
    out: list[CollectedRecord] = []
    owners: dict[tuple, str] = {}
    for stem, table in sorted(tables.items()):
        digest = sha256_file(table.path)

        def prov(index: int) -> FrozenDict:
            return FrozenDict(source=source, source_revision=revision, importer=IMPORTER,
                              importer_revision=IMPORTER_REVISION, source_digest=digest,
                              method="measured", raw_record_id=f"{table.path.name}#row{index + 2}")

        if stem.startswith(COMM_PREFIX):
            out += _comm_records(table, stem, hardware, context, comm_dtype, prov, skips)
            continue
        spec = spec_for(stem)
        if spec is None or spec.operation not in operations:
            continue
        if wanted and spec.kernel_type not in wanted:
            continue
        src = str(table.path)
        for i, row in enumerate(table.rows):
            found = row_duration(row, table, hardware, skips, i + 2)
            if found is None:
                continue
            slots = parse_shapes(row.get(INPUT_SHAPES, ""), source=src, row=i + 2)
            axes = axes_of(spec, slots, split_list(row.get(INPUT_FORMATS, "")), row)
            dtypes = split_list(row.get(INPUT_DTYPES, ""))
            if axes is None or not dtypes:
                continue
            dtype = parse_dtype(dtypes[0], source=f"{src}, row {i + 2}",
                                field=INPUT_DTYPES).value
            selector = FrozenDict({**{k: v for k, v in axes.items()
                                      if k not in ("q_tokens_total",)}, **context})
            key = (spec.operation, dtype, tuple(selector.items()))
            if owners.setdefault(key, spec.kernel_type) != spec.kernel_type:
                raise ConfigError(
                    f"{owners[key]} and {spec.kernel_type} both measure {spec.operation} "
                    f"{dict(axes)} ({dtype}); they would be two conflicting evidence groups",
                    source=str(root), field="kernel_types",
                    expected="one of them selected with kernel_types")
            out.append(CollectedRecord(
                subject="operator", operation=spec.operation, hardware=hardware, dtype=dtype,
                selector=selector, latency_s=found[0] * 1e-6, provenance=prov(i),
                metadata=_metadata(row, spec.kernel_type, found[1])))
    return out


def _metadata(row: dict, kernel_type: str, column: str) -> FrozenDict:
    meta = {"kernel_type": kernel_type, "latency_column": column}
    for col in (COUNT, STD):
        if (row.get(col) or "").strip():
            meta[col] = row[col].strip()
    return FrozenDict(meta)


def _comm_records(table, stem: str, hardware: str, context: dict, comm_dtype: str,
                  prov, skips: ImportSkips | None = None) -> list[CollectedRecord]:
    operation = COMM_OPERATIONS.get(stem)
    if operation is None:
        return []
    src = str(table.path)
    missing = [c for c in ("message_bytes", "num_devices") if c not in table.header]
    if missing:
        raise ConfigError(f"lacks column(s) {', '.join(missing)}", source=src,
                          expected="message_bytes, num_devices, Duration(us)")
    out = []
    for i, row in enumerate(table.rows):
        found = row_duration(row, table, hardware, skips, i + 2)
        if found is None:
            continue
        mb = valid_duration(row, "message_bytes")
        n = valid_duration(row, "num_devices")
        if mb is None or n is None or mb != int(mb) or n != int(n):
            raise ConfigError("needs positive integer message_bytes and num_devices",
                              source=f"{src}, row {i + 2}", field="message_bytes/num_devices")
        full = int(mb) * (int(n) if operation in FULL_BUFFER_OPERATIONS else 1)
        dtype = parse_dtype((row.get("dtype") or "").strip() or comm_dtype,
                            source=f"{src}, row {i + 2}", field="dtype").value
        meta = {"kernel_type": stem, "latency_column": found[1],
                "hccl_message_bytes": str(int(mb))}
        if (row.get("topology_tier") or "").strip():
            meta["topology_tier"] = row["topology_tier"].strip()
        out.append(CollectedRecord(
            subject="communication", operation=operation, hardware=hardware, dtype=dtype,
            selector=FrozenDict({"message_bytes": full, "participants": int(n), **context}),
            latency_s=found[0] * 1e-6, provenance=prov(i), metadata=FrozenDict(meta)))
    return out


def to_performance_records(records: Sequence[CollectedRecord]):
    """The records as `perfcast.evidence.records.PerformanceRecord`s."""
    from perfcast.evidence.contracts import CostSubject, EstimateMethod
    from perfcast.evidence.records import EvidenceProvenance, PerformanceRecord

    out = []
    for r in records:
        p = r.provenance
        out.append(PerformanceRecord(
            subject=CostSubject(r.subject), operation=r.operation, hardware=r.hardware,
            dtype=r.dtype, selector=r.selector, latency_s=float(r.latency_s),
            provenance=EvidenceProvenance(
                source=p["source"], source_revision=p["source_revision"],
                importer=p["importer"], importer_revision=p["importer_revision"],
                source_digest=p["source_digest"], method=EstimateMethod(p["method"]),
                raw_record_id=p["raw_record_id"]),
            metadata=r.metadata))
    return out


def collected_database(database_path: Path, *, name: str = "", **options):
    """A `PerformanceDatabase` (immutable, content-addressed) of a collected database;
    `options` are those of `collected_records`. Its manifest sources list the folder and
    the collection manifest's profile digests."""
    import json

    from perfcast.collect.parse import MANIFEST
    from perfcast.evidence.database import PerformanceDatabase

    root = Path(database_path)
    records = collected_records(root, **options)
    if not records:
        skipped = options.get("skips")
        why = "; ".join(skipped.lines()) if skipped is not None else ""
        raise ConfigError("holds no row with a valid latency to import"
                          + (f" ({why})" if why else ""), source=str(root),
                          expected="replayed or profiled rows (Average Duration(us) > 0)")
    source = {"path": str(root), "importer": IMPORTER, "importer_revision": IMPORTER_REVISION}
    manifest = root / MANIFEST
    if manifest.is_file():
        source["collection_runs"] = json.loads(manifest.read_text(encoding="utf-8"))["runs"]
    return PerformanceDatabase.from_records(to_performance_records(records),
                                            name=name or root.name, sources=[source])


def save_database_atomic(database, folder: Path, *, fmt: str = "parquet") -> Path:
    """Save a PerformanceDatabase into `folder` so that the folder either holds the old
    snapshot or the complete new one: it is written to a sibling temporary folder first,
    then renamed into place."""
    import os
    import shutil
    import tempfile

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        # mkdtemp creates 0700: keep the old folder's mode, else the umask's default
        mode = folder.stat().st_mode & 0o7777 if folder.is_dir() else default_mode(True)
        os.chmod(tmp, mode)
        database.save(tmp, fmt=fmt)
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
            os.replace(folder, old / folder.name)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder
