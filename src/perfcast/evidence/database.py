"""`PerformanceDatabase`: an immutable, content-addressed, columnar set of records.

Storage is one Arrow table (a million GEMM rows must load in about a second, so
records are not Python objects until asked for). Columns:

| column | type | meaning |
|---|---|---|
| record_id | string | raw record id inside the source (provenance.raw_record_id) |
| subject, operation, hardware, dtype | string | core identity (dtype canonical) |
| latency_s | float64 | one sample, seconds, finite and > 0 |
| source, source_revision, importer, importer_revision, source_digest, method | string | provenance group |
| metadata | string | canonical JSON of source metadata, or "" |
| sel.<type>.<key> | bool / int64 / float64 / string | selector value of `key`; null = not in the selector |

A selector key may appear under several types (`sel.int.m` and `sel.float.m`): the
column name carries the type, so 1, 1.0 and True never collide.

The digest is sha256 over the format tag and every column (sorted by name) in row
order: values, validity and type. Saving to Parquet or JSON and loading back yields
the same digest; the manifest records it and loading checks it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfcast.core.canonical import canonical_json
from perfcast.core.dtypes import DType
from perfcast.core.errors import ConfigError, InvalidEvidenceError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostSubject, EstimateMethod
from perfcast.evidence.records import (
    SELECTOR_TYPES,
    EvidenceProvenance,
    PerformanceRecord,
    selector_type_name,
)

FORMAT = "perfcast.evidence.db/1"
MANIFEST = "manifest.json"
PARQUET_FILE = "records.parquet"
JSON_FILE = "records.json"

CORE_COLUMNS = ("subject", "operation", "hardware", "dtype")
PROVENANCE_COLUMNS = ("source", "source_revision", "importer", "importer_revision",
                      "source_digest", "method")
STRING_COLUMNS = ("record_id", *CORE_COLUMNS, *PROVENANCE_COLUMNS, "metadata")
SEL_PREFIX = "sel."
SEL_ARROW: dict[str, pa.DataType] = {"bool": pa.bool_(), "int": pa.int64(),
                                     "float": pa.float64(), "str": pa.string()}
_SUBJECTS = {s.value for s in CostSubject}
_METHODS = {m.value for m in EstimateMethod}
_DTYPES = {d.value for d in DType} | {""}


def selector_column(key: str, kind: str) -> str:
    return f"{SEL_PREFIX}{kind}.{key}"


def parse_selector_column(name: str) -> tuple[str, str]:
    """'sel.int.m' -> ('m', 'int')."""
    _, kind, key = name.split(".", 2)
    return key, kind


class PerformanceDatabase:
    """Immutable records + a digest. Build with `from_records`, `from_columns` or `load`."""

    def __init__(self, table: pa.Table, *, name: str = "",
                 sources: Sequence[Mapping] = ()) -> None:
        self.table = _normalise(table)
        self.name = name
        self.sources = tuple(dict(s) for s in sources)  # manifest only, not in the digest
        self._digest: str | None = None
        self._row_codes = None  # integer codes cached by perfcast.evidence.selectors

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = _table_digest(self.table)
        return self._digest

    # construction ----------------------------------------------------------------
    @classmethod
    def from_columns(cls, columns: Mapping[str, object], *, name: str = "",
                     sources: Sequence[Mapping] = ()) -> PerformanceDatabase:
        arrays = {k: v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(v)
                  for k, v in columns.items()}
        return cls(pa.table(arrays), name=name, sources=sources)

    @classmethod
    def from_records(cls, records: Iterable[PerformanceRecord], *, name: str = "",
                     sources: Sequence[Mapping] = ()) -> PerformanceDatabase:
        records = list(records)
        cols: dict[str, list] = {c: [] for c in (*STRING_COLUMNS, "latency_s")}
        sel_cols: dict[str, list] = {}
        for i, r in enumerate(records):
            p = r.provenance
            values = {"record_id": p.raw_record_id, "subject": r.subject.value,
                      "operation": r.operation, "hardware": r.hardware, "dtype": r.dtype,
                      "source": p.source, "source_revision": p.source_revision,
                      "importer": p.importer, "importer_revision": p.importer_revision,
                      "source_digest": p.source_digest, "method": p.method.value,
                      "metadata": canonical_json(dict(r.metadata)).decode() if r.metadata else "",
                      "latency_s": r.latency_s}
            for c, v in values.items():
                cols[c].append(v)
            for key, value in r.selector.items():
                col = selector_column(key, selector_type_name(value))
                sel_cols.setdefault(col, [None] * i).append(value)
            for col, vals in sel_cols.items():
                if len(vals) < i + 1:
                    vals.append(None)
        arrays = {c: pa.array(v, type=pa.float64() if c == "latency_s" else pa.string())
                  for c, v in cols.items()}
        for col, vals in sel_cols.items():
            arrays[col] = pa.array(vals, type=SEL_ARROW[parse_selector_column(col)[1]])
        return cls(pa.table(arrays) if records else _empty_table(), name=name,
                   sources=sources)

    @classmethod
    def concat(cls, databases: Sequence[PerformanceDatabase], *,
               name: str = "") -> PerformanceDatabase:
        if not databases:
            raise ValueError("concat needs at least one database")
        table = pa.concat_tables([d.table for d in databases], promote_options="default")
        return cls(table, name=name or databases[0].name,
                   sources=[s for d in databases for s in d.sources])

    # reading ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def selector_columns(self) -> tuple[str, ...]:
        return tuple(c for c in self.table.column_names if c.startswith(SEL_PREFIX))

    def records(self) -> Iterator[PerformanceRecord]:
        for row in self.table.to_pylist():
            yield _row_record(row)

    def record_at(self, index: int) -> PerformanceRecord:
        return _row_record(self.table.slice(index, 1).to_pylist()[0])

    def manifest(self) -> dict:
        return {"format": FORMAT, "digest": self.digest, "name": self.name,
                "rows": len(self), "columns": sorted(self.table.column_names),
                "sources": list(self.sources)}

    # persistence -----------------------------------------------------------------
    def save(self, folder: str | Path, *, fmt: str = "parquet") -> Path:
        """Write `records.parquet` (or `records.json`) and `manifest.json` into `folder`."""
        import pyarrow.parquet as pq

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        manifest = self.manifest()
        if fmt == "parquet":
            pq.write_table(self.table, folder / PARQUET_FILE)
            manifest["file"] = PARQUET_FILE
        elif fmt == "json":
            rows = [{k: v for k, v in row.items() if v is not None}
                    for row in self.table.to_pylist()]
            (folder / JSON_FILE).write_bytes(canonical_json({"format": FORMAT, "rows": rows}))
            manifest["file"] = JSON_FILE
        else:
            raise ValueError(f"unknown database format {fmt!r}; expected parquet or json")
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> PerformanceDatabase:
        import pyarrow.parquet as pq

        folder = Path(folder)
        mpath = folder / MANIFEST
        try:
            manifest = json.loads(mpath.read_text())
        except FileNotFoundError:
            raise ConfigError("no evidence manifest", source=str(mpath)) from None
        if manifest.get("format") != FORMAT:
            raise ConfigError(f"unsupported format {manifest.get('format')!r}",
                              source=str(mpath), field="format", expected=FORMAT)
        data = folder / manifest.get("file", PARQUET_FILE)
        if data.suffix == ".json":
            payload = json.loads(data.read_text())
            table = _table_from_rows(payload["rows"], manifest.get("columns", ()))
        else:
            table = pq.read_table(data)
        db = cls(table, name=manifest.get("name", ""), sources=manifest.get("sources", ()))
        if db.digest != manifest.get("digest"):
            raise InvalidEvidenceError(
                f"{data}: content digest {db.digest} does not match the manifest's "
                f"{manifest.get('digest')} (file changed or corrupt)")
        return db


def _row_record(row: Mapping) -> PerformanceRecord:
    selector = {}
    for col, value in row.items():
        if col.startswith(SEL_PREFIX) and value is not None:
            selector[parse_selector_column(col)[0]] = value
    meta = json.loads(row["metadata"]) if row["metadata"] else {}
    prov = EvidenceProvenance(
        source=row["source"], source_revision=row["source_revision"], importer=row["importer"],
        importer_revision=row["importer_revision"], source_digest=row["source_digest"],
        method=EstimateMethod(row["method"]), raw_record_id=row["record_id"])
    return PerformanceRecord(
        subject=CostSubject(row["subject"]), operation=row["operation"],
        hardware=row["hardware"], dtype=row["dtype"], selector=FrozenDict(selector),
        latency_s=float(row["latency_s"]), provenance=prov, metadata=FrozenDict(meta))


def _empty_table() -> pa.Table:
    return pa.table({c: pa.array([], type=pa.float64() if c == "latency_s" else pa.string())
                     for c in (*STRING_COLUMNS, "latency_s")})


def _table_from_rows(rows: list[dict], columns: Sequence[str]) -> pa.Table:
    names = list(columns) or sorted({k for r in rows for k in r})
    arrays = {}
    for name in names:
        if name.startswith(SEL_PREFIX):
            typ = SEL_ARROW[parse_selector_column(name)[1]]
        else:
            typ = pa.float64() if name == "latency_s" else pa.string()
        arrays[name] = pa.array([r.get(name) for r in rows], type=typ)
    return pa.table(arrays) if rows else _empty_table()


def _normalise(table: pa.Table) -> pa.Table:
    """Check the schema and values; return the table with canonical types, sorted columns."""
    missing = [c for c in (*STRING_COLUMNS, "latency_s") if c not in table.column_names]
    if missing:
        raise ConfigError(f"database table lacks columns {missing}",
                          expected="the columns listed in perfcast.evidence.database")
    arrays = {}
    for name in sorted(table.column_names):
        col = table.column(name)
        if name.startswith(SEL_PREFIX):
            try:
                key, kind = parse_selector_column(name)
            except ValueError:
                raise ConfigError(f"bad selector column {name!r}",
                                  expected="sel.<bool|int|float|str>.<key>") from None
            if kind not in SELECTOR_TYPES or not key:
                raise ConfigError(f"bad selector column {name!r}",
                                  expected="sel.<bool|int|float|str>.<key>")
            col = col.cast(SEL_ARROW[kind])
            if kind == "float":
                vals = col.to_numpy(zero_copy_only=False)
                if not np.all(np.isfinite(vals[~np.isnan(vals)])) or \
                        int(np.isnan(vals).sum()) != col.null_count:
                    raise ConfigError("non-finite selector value", field=name)
        elif name == "latency_s":
            col = col.cast(pa.float64())
            vals = col.to_numpy(zero_copy_only=False) if col.null_count == 0 else None
            if vals is None or not np.all(np.isfinite(vals)) or (len(vals) and vals.min() <= 0):
                raise ConfigError("latencies must be finite, positive and present",
                                  field="latency_s")
        elif name in STRING_COLUMNS:
            col = col.cast(pa.string())
            if col.null_count:
                raise ConfigError("null value in a required column", field=name)
        else:
            raise ConfigError(f"unknown database column {name!r}",
                              expected="core, provenance, metadata, latency_s or sel.* columns")
        arrays[name] = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    table = pa.table(arrays)
    for name, allowed in (("subject", _SUBJECTS), ("method", _METHODS), ("dtype", _DTYPES)):
        bad = set(pc.unique(table.column(name)).to_pylist()) - allowed
        if bad:
            raise ConfigError(f"unknown values {sorted(bad)}", field=name,
                              expected="one of " + ", ".join(sorted(allowed)))
    return table


def _table_digest(table: pa.Table) -> str:
    h = hashlib.sha256()
    h.update(FORMAT.encode() + b"\0")
    h.update(str(table.num_rows).encode() + b"\0")
    for name in table.column_names:  # already sorted by _normalise
        col = table.column(name)
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        h.update(name.encode() + b"\0" + str(col.type).encode() + b"\0")
        valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8)
        h.update(valid.tobytes())
        if pa.types.is_string(col.type):
            col = col.fill_null("")
            offsets = np.frombuffer(col.buffers()[1], dtype=np.int32)[
                col.offset:col.offset + len(col) + 1]
            h.update(np.asarray(offsets - offsets[0], dtype="<i8").tobytes())
            h.update(memoryview(col.buffers()[2])[offsets[0]:offsets[-1]])
        elif pa.types.is_boolean(col.type):
            h.update(np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False),
                                dtype=np.uint8).tobytes())
        else:
            dt = "<i8" if pa.types.is_integer(col.type) else "<f8"
            h.update(np.asarray(col.fill_null(0).to_numpy(), dtype=dt).tobytes())
    return "sha256:" + h.hexdigest()

