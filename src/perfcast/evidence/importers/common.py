"""Column helpers shared by importers: file digests, constant columns, dtype mapping,
latency validation that names the file, row and column."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
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
    """A string column of `n` copies of `value` (built directly: the same array as a
    one-entry dictionary cast to strings, in a sixth of the time)."""
    return pa.repeat(pa.scalar(value, pa.string()), n)


def row_ids(prefix: str, n: int) -> pa.Array:
    idx = pc.cast(pa.array(np.arange(n, dtype=np.int64)), pa.string())
    return pc.binary_join_element_wise(const(prefix, n), idx, "")


def first_null(arr: pa.Array | pa.ChunkedArray) -> int:
    """Index of the first null value (the caller knows there is one)."""
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return int(np.argmin(valid))


def require_columns(table: pa.Table, columns, source: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ConfigError(f"missing column(s) {', '.join(missing)}", source=source,
                          field=missing[0],
                          expected="columns " + ", ".join(columns)
                          + f"; found {', '.join(table.column_names)}")


def canonical_dtypes(column: pa.ChunkedArray | pa.Array, *, source: str, field: str,
                     aliases: Mapping[str, DType] | None = None,
                     unmodelled: Collection[str] = ()) -> pa.Array:
    """Map each spelling in `column` to its canonical dtype name (ConfigError if unknown).
    A spelling in `unmodelled` (a real upstream format perfcast has no dtype for) maps to
    "" instead, for the caller to leave those rows out and say so."""
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if col.null_count:
        raise ConfigError(f"row {first_null(col)}: empty dtype value", source=source,
                          field=field)
    enc = col.cast(pa.string()).dictionary_encode()
    mapped = []
    for spelling in enc.dictionary.to_pylist():
        key = spelling.strip().lower()
        if key in unmodelled:
            mapped.append("")
            continue
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
    bad = ~np.isfinite(values) | (values <= 0)  # a null reads as nan
    if bad.any():
        row = int(np.argmax(bad))
        raise ConfigError(f"row {row}: latency {values[row]!r} is not a positive finite number",
                          source=source, field=field)
    return pa.array(values * scale, pa.float64())


# Operations the workload layer emits (and so the ones a record can ever answer);
# `tests/evidence/test_import_checks.py` builds graphs of every family to keep it true.
OPERATOR_OPERATIONS = frozenset({
    "gemm", "attention", "mla_attention", "mla_sparse_attention", "dsa_indexer", "moe",
    "moe_gating", "moe_permute", "moe_unpermute", "embedding", "norm", "rope", "activation",
    "add", "kv_cache_write", "gdn_conv1d", "gdn_prefill", "gdn_decode"})


def known_operations() -> frozenset[str]:
    from perfcast.evidence.collectives import OPERATIONS as COLLECTIVES

    return OPERATOR_OPERATIONS | frozenset(COLLECTIVES)


def check_operations(values, *, source: str, field: str, rows=None) -> None:
    """ConfigError naming the first row whose operation perfcast does not know. `values`
    is one operation per row (or the distinct values, with `rows` giving their first
    row labels)."""
    known = known_operations()
    for i, op in enumerate(values):
        if op not in known:
            where = rows[i] if rows is not None else f"row {i}"
            raise ConfigError(f"{where}: unknown operation {op!r}", source=source, field=field,
                              expected="one of " + ", ".join(sorted(known)))


def system_id(text: str, *, field: str = "--system") -> str:
    """The catalog name for a catalog name, an alias or a device YAML file (its `name`);
    a ConfigError naming `field` and the known names otherwise."""
    from perfcast.hardware import load_system
    from perfcast.hardware.catalog_loader import resolve_device_name

    text = str(text)
    if text.endswith((".yaml", ".yml")) or Path(text).is_file():
        return load_system(text).name
    try:
        return resolve_device_name(text)
    except ConfigError as exc:
        raise ConfigError(f"unknown system {text!r}", field=field,
                          expected=exc.expected) from None


def _tokens(text: str) -> set[str]:
    import re

    return {t for t in re.split(r"[^a-z0-9]+", str(text).lower()) if t}


def _model_token(system: str) -> str:
    """The model part of a catalog name: h100_sxm -> h100, gb200 -> gb200."""
    return system.lower().split("_", 1)[0]


def device_systems(device: str) -> set[str]:
    """Catalog names whose model (h100, gb200, mi300x, ...) a free-text device name such
    as 'NVIDIA H100 80GB HBM3' mentions (empty when it names none). A model the catalog
    has as an SXM and a PCIe part is told apart by the name: 'PCIe' in it ('NVIDIA H100
    PCIe', 'NVIDIA A100 80GB PCIe', as nvidia-smi prints them) names the `_pcie` part."""
    from perfcast.hardware.catalog_loader import available_devices

    words = _tokens(device)
    named = {n for n in available_devices() if _model_token(n) in words}
    out: set[str] = set()
    for model in {_model_token(n) for n in named}:
        parts = {n for n in named if _model_token(n) == model}
        if len(parts) > 1:
            parts = {n for n in parts if n.endswith("_pcie") == ("pcie" in words)} or parts
        out |= parts
    return out


def _same_part(hardware: str, named: set[str]) -> bool:
    """Whether the parts a device name gives are `hardware`: by name where the catalog
    has the model in more than one form, by model otherwise."""
    from perfcast.hardware.catalog_loader import available_devices

    if hardware in named:
        return True
    model = _model_token(hardware)
    forms = [n for n in available_devices() if _model_token(n) == model]
    return len(forms) <= 1 and model in {_model_token(n) for n in named}


def check_device_column(values, *, hardware: str, source: str, field: str = "device") -> None:
    """A ConfigError when a row's device column names another model than `hardware`
    (rows whose device names no catalog model are not judged)."""
    col = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    enc = col.cast(pa.string()).dictionary_encode()
    indices = np.asarray(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False))
    for code, device in enumerate(enc.dictionary.to_pylist()):
        named = device_systems(device)
        if named and not _same_part(hardware, named):
            rows = np.flatnonzero(indices == code)
            raise ConfigError(
                f"row {int(rows[0])}: device {device!r} ({', '.join(sorted(named))}), not "
                f"{hardware}: {len(rows)} row(s) would be labelled with the wrong system",
                source=source, field=field,
                expected=f"--system {sorted(named)[0]}, or tables measured on {hardware}")
