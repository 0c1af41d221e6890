"""Column helpers shared by importers: file digests, constant columns, dtype mapping,
latency validation that names the file, row and column."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfcast.core.dtypes import DType, parse_dtype
from perfcast.core.errors import ConfigError


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def const(value: str, n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                          pa.array([value], pa.string())).cast(pa.string())


def row_ids(prefix: str, n: int) -> pa.Array:
    idx = pc.cast(pa.array(np.arange(n, dtype=np.int64)), pa.string())
    return pc.binary_join_element_wise(const(prefix, n), idx, "")


def require_columns(table: pa.Table, columns, source: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ConfigError(f"missing column(s) {', '.join(missing)}", source=source,
                          field=missing[0],
                          expected="columns " + ", ".join(columns)
                          + f"; found {', '.join(table.column_names)}")


def canonical_dtypes(column: pa.ChunkedArray | pa.Array, *, source: str, field: str,
                     aliases: Mapping[str, DType] | None = None) -> pa.Array:
    """Map each spelling in `column` to its canonical dtype name (ConfigError if unknown)."""
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if col.null_count:
        raise ConfigError("empty dtype value", source=source, field=field)
    enc = col.cast(pa.string()).dictionary_encode()
    mapped = []
    for spelling in enc.dictionary.to_pylist():
        key = spelling.strip().lower()
        dt = (aliases or {}).get(key) or parse_dtype(spelling, source=source, field=field)
        mapped.append(dt.value)
    return pa.DictionaryArray.from_arrays(enc.indices, pa.array(mapped, pa.string())) \
        .cast(pa.string())


def latency_seconds(column: pa.ChunkedArray | pa.Array, scale: float, *, source: str,
                    field: str) -> pa.Array:
    """Latency column times `scale`; every value finite and > 0, or a ConfigError naming
    the first bad row."""
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
        raise ConfigError(f"latency column has type {col.type}", source=source, field=field,
                          expected="numbers")
    values = np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=float)
    bad = ~np.isfinite(values) | (values <= 0)
    if bad.any():
        row = int(np.argmax(bad))
        raise ConfigError(f"row {row}: latency {values[row]!r} is not a positive finite number",
                          source=source, field=field)
    return pa.array(values * scale, pa.float64())
