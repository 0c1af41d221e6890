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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfcast.core.canonical import canonical_json
from perfcast.core.dtypes import DType
from perfcast.core.errors import ConfigError, InvalidEvidenceError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostSubject, EstimateMethod
from perfcast.evidence.catalog import Catalog, build_catalog
from perfcast.evidence.columns import (
    CORE_COLUMNS,
    SEL_ARROW,
    SEL_PREFIX,
    STRING_COLUMNS,
    dictionary_codes,
    parse_selector_column,
    selector_column,
)
from perfcast.evidence.records import (
    CONTEXT_KEYS,
    SELECTOR_TYPES,
    EvidenceProvenance,
    PerformanceRecord,
    selector_type_name,
)

FORMAT = "perfcast.evidence.db/1"
ROW_GROUP = 16_384
MANIFEST = "manifest.json"
PARQUET_FILE = "records.parquet"
JSON_FILE = "records.json"

_SUBJECTS = {s.value for s in CostSubject}
_METHODS = {m.value for m in EstimateMethod}
_DTYPES = {d.value for d in DType} | {""}


@dataclass(frozen=True)
class LazyFile:
    """A verified snapshot file whose rows are read on demand."""

    path: Path
    digest: str
    rows: int
    columns: tuple[str, ...]
    catalog: Catalog


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return "sha256:" + h.hexdigest()


class PerformanceDatabase:
    """Immutable records + a digest. Build with `from_records`, `from_columns` or `load`."""

    def __init__(self, table: pa.Table | None, *, name: str = "",
                 sources: Sequence[Mapping] = (), _validated: bool = False,
                 _lazy: LazyFile | None = None) -> None:
        if table is None and _lazy is None:
            raise ValueError("a database needs a table")
        self._table = None if table is None else \
            _conform(table) if _validated else _normalise(table)
        self._lazy = _lazy
        self.name = name
        self.sources = tuple(dict(s) for s in sources)  # manifest only, not in the digest
        self._digest: str | None = _lazy.digest if _lazy else None
        self._row_codes = None  # integer codes cached by perfcast.evidence.selectors
        self._catalog: Catalog | None = _lazy.catalog if _lazy else None
        self._slices: dict[tuple, PerformanceDatabase] = {}

    @property
    def table(self) -> pa.Table:
        """Every row (a verified snapshot reads its file on first access)."""
        if self._table is None:
            import pyarrow.parquet as pq

            self._table = _conform(pq.read_table(self._lazy.path, memory_map=True))
        return self._table

    def record_ids(self) -> pa.Array:
        """The record_id column as one array (cached): indexing a chunked column
        searches its chunks, and `take` on one copies the whole column first."""
        ids = self.__dict__.get("_record_id_array")
        if ids is None:
            ids = self.__dict__["_record_id_array"] = \
                self.table.column("record_id").combine_chunks()
        return ids

    @property
    def is_lazy(self) -> bool:
        """True while the rows have not been read (a verified snapshot)."""
        return self._table is None

    @property
    def catalog(self) -> Catalog:
        """Selector schemas per core identity and string selector values (no rows)."""
        if self._catalog is None:
            self._catalog = build_catalog(self.table)
        return self._catalog

    def select(self, core: tuple[str, str, str, str],
               context: Mapping[str, object]) -> PerformanceDatabase:
        """The rows of one core identity whose context selectors (`CONTEXT_KEYS`) are
        absent or equal (type-strict) to `context`: every row a query with these facts
        can match, in database order. A snapshot reads only them (row-group statistics
        skip the rest of the file). Cached: the exact and interpolating providers share
        a slice."""
        key = (tuple(core), tuple((k, type(v), v) for k, v in sorted(context.items())))
        hit = self._slices.get(key)
        if hit is None:
            hit = self._slices[key] = self._select(core, context)
        return hit

    def _select(self, core: tuple[str, str, str, str],
                context: Mapping[str, object]) -> PerformanceDatabase:
        expr = None
        for col, want in zip(CORE_COLUMNS, core):
            term = pc.field(col) == want
            expr = term if expr is None else expr & term
        for col in self.selector_columns:
            key, kind = parse_selector_column(col)
            if key not in CONTEXT_KEYS:
                continue
            have = context.get(key)
            term = pc.field(col).is_null()
            if have is not None and selector_type_name(have) == kind:
                term = term | (pc.field(col) == have)
            expr = expr & term
        if self._table is None:
            import pyarrow.dataset as ds

            table = ds.dataset(self._lazy.path, format="parquet").to_table(filter=expr)
        else:
            table = self._table.filter(expr)
        return PerformanceDatabase(table.combine_chunks(), name=self.name, _validated=True)

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
                   sources=[s for d in databases for s in d.sources], _validated=True)

    # reading ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._lazy.rows if self._table is None else self._table.num_rows

    @property
    def selector_columns(self) -> tuple[str, ...]:
        names = self._lazy.columns if self._table is None else self._table.column_names
        return tuple(c for c in names if c.startswith(SEL_PREFIX))

    def records(self) -> Iterator[PerformanceRecord]:
        for row in self.table.to_pylist():
            yield _row_record(row)

    def record_at(self, index: int) -> PerformanceRecord:
        return _row_record(self.table.slice(index, 1).to_pylist()[0])

    def manifest(self) -> dict:
        columns = self._lazy.columns if self._table is None else self._table.column_names
        return {"format": FORMAT, "digest": self.digest, "name": self.name,
                "rows": len(self), "columns": sorted(columns),
                "sources": list(self.sources)}

    # persistence -----------------------------------------------------------------
    def save(self, folder: str | Path, *, fmt: str = "parquet") -> Path:
        """Write `records.parquet` (or `records.json`) and `manifest.json` into `folder`."""
        import pyarrow.parquet as pq

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        manifest = self.manifest()
        if fmt == "parquet":
            # small row groups: their statistics let `select` skip most of the file
            pq.write_table(self.table, folder / PARQUET_FILE, row_group_size=ROW_GROUP)
            manifest["file"] = PARQUET_FILE
            manifest["file_sha256"] = file_sha256(folder / PARQUET_FILE)
            manifest["catalog"] = self.catalog.to_json()
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
        if manifest.get("file_sha256") and manifest.get("catalog") is not None \
                and data.suffix == ".parquet":
            # written by this version: the file's bytes are checked against the manifest
            # (cheap); the content digest recorded next to them is then trusted
            actual = file_sha256(data)
            if actual != manifest["file_sha256"]:
                raise InvalidEvidenceError(
                    f"{data}: file sha256 {actual} does not match the manifest's "
                    f"{manifest['file_sha256']} (file changed or corrupt)")
            lazy = LazyFile(path=data, digest=manifest["digest"], rows=int(manifest["rows"]),
                            columns=tuple(manifest["columns"]),
                            catalog=Catalog.from_json(manifest["catalog"]))
            return cls(None, name=manifest.get("name", ""),
                       sources=manifest.get("sources", ()), _lazy=lazy)
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


def _conform(table: pa.Table) -> pa.Table:
    """Already-validated parts (concat): only canonical column order and selector types."""
    arrays = {}
    for name in sorted(table.column_names):
        col = table.column(name)
        if name.startswith(SEL_PREFIX):
            col = col.cast(SEL_ARROW[parse_selector_column(name)[1]])
        arrays[name] = col
    return pa.table(arrays)


def _one_array(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column as one array: its only chunk as it is (combining one chunk copies every
    value), else the chunks combined."""
    if not isinstance(col, pa.ChunkedArray):
        return col
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


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
        arrays[name] = _one_array(col)
    table = pa.table(arrays)
    for name, allowed in (("subject", _SUBJECTS), ("method", _METHODS), ("dtype", _DTYPES)):
        bad = set(pc.unique(table.column(name)).to_pylist()) - allowed
        if bad:
            raise ConfigError(f"unknown values {sorted(bad)}", field=name,
                              expected="one of " + ", ".join(sorted(allowed)))
    return table


# String columns hashed as raw text; every other string column is hashed as its
# dictionary (first-appearance order) and codes. The rule is fixed per column name, so
# the digest depends on content only.
_UNIQUE_STRING_COLUMNS = frozenset({"record_id"})


def _string_bytes(col: pa.ChunkedArray, h) -> None:
    """Lengths of every value, then all the text: independent of chunking."""
    chunks = [c.fill_null("") for c in col.chunks]
    spans = []
    for c in chunks:
        offsets = np.frombuffer(c.buffers()[1], dtype=np.int32)[c.offset:c.offset + len(c) + 1]
        h.update(np.diff(offsets).astype("<i8").tobytes())
        spans.append((c, int(offsets[0]), int(offsets[-1])))
    for c, start, end in spans:
        h.update(memoryview(c.buffers()[2])[start:end] if end > start else b"")


def _table_digest(table: pa.Table) -> str:
    h = hashlib.sha256()
    h.update(FORMAT.encode() + b"\0")
    h.update(str(table.num_rows).encode() + b"\0")
    for name in table.column_names:  # already sorted by _normalise
        col = table.column(name)
        h.update(name.encode() + b"\0" + str(col.type).encode() + b"\0")
        valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8)
        h.update(valid.tobytes())
        if pa.types.is_string(col.type) and name in _UNIQUE_STRING_COLUMNS:
            _string_bytes(col, h)
        elif pa.types.is_string(col.type):  # few distinct values: sorted dictionary + codes
            codes, values = dictionary_codes(col)
            order = sorted(range(len(values)), key=values.__getitem__)
            rank = np.empty(len(values) + 1, dtype=np.int64)
            rank[np.asarray(order, dtype=np.int64)] = np.arange(len(values))
            rank[-1] = 0  # nulls (code -1); validity is hashed above
            h.update(canonical_json(sorted(values)))
            width = "<u1" if len(values) < 256 else "<u2" if len(values) < 65536 else "<u4"
            h.update(rank[codes].astype(width).tobytes())
        elif pa.types.is_boolean(col.type):
            h.update(np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False),
                                dtype=np.uint8).tobytes())
        else:
            dt = "<i8" if pa.types.is_integer(col.type) else "<f8"
            h.update(np.asarray(col.fill_null(0).to_numpy(), dtype=dt).tobytes())
    return "sha256:" + h.hexdigest()


def view_key(db: PerformanceDatabase, core: tuple, facts: dict) -> tuple[tuple, dict | None]:
    """Cache key and context filter of a provider's per-core view.

    A lazily loaded snapshot is read per (core identity, query context selectors), with
    the selector types in the key (type-strict); a loaded database per core identity."""
    if db.is_lazy:
        context = {k: facts[k] for k in CONTEXT_KEYS if k in facts}
        return (core, tuple((k, type(v), v) for k, v in context.items())), context
    return (core,), None
