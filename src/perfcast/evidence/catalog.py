"""`Catalog`: what a database holds, without its rows.

Per core identity (subject, operation, hardware, dtype): the selector schemas (sets of
`sel.<type>.<key>` columns a row fills), in the order the exact-match index tries them
(most keys first; equal counts in the order of their validity bits over the sorted
selector columns). Per string selector column: every value it holds.

The providers use it to answer a query from a slice of the rows (one core identity and
the query's runtime, revision and kernel) with the same outcome, and the same miss
reasons, as from the whole database. `PerformanceDatabase.save` writes it into the
manifest, so a verified snapshot needs no pass over its rows to know it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfcast.evidence.columns import CORE_COLUMNS, SEL_PREFIX, dictionary_codes

Core = tuple[str, str, str, str]


@dataclass(frozen=True)
class Catalog:
    schemas: Mapping[Core, tuple[tuple[str, ...], ...]]   # core -> schemas, index order
    str_values: Mapping[str, frozenset[str]]               # sel.str.<key> -> values

    def fixed_keys(self, core: Core, axes: list[str]) -> set[str] | None:
        """The non-axis selector keys of the interpolation partitions a core identity's
        schemas form (schemas that hold every axis as a number); None if none does."""
        out: set[str] | None = None
        for cols in self.schemas.get(core, ()):
            keys = [_key_kind(c) for c in cols]
            if set(axes) <= {k for k, kind in keys if kind in ("int", "float")}:
                out = (out or set()) | {k for k, _ in keys if k not in axes}
        return out

    def to_json(self) -> dict:
        return {"schemas": [[*core, [list(s) for s in schemas]]
                            for core, schemas in sorted(self.schemas.items())],
                "str_values": {c: sorted(v) for c, v in sorted(self.str_values.items())}}

    @classmethod
    def from_json(cls, data: Mapping) -> Catalog:
        schemas = {tuple(item[:4]): tuple(tuple(s) for s in item[4])
                   for item in data.get("schemas", ())}
        return cls(schemas=schemas, str_values={c: frozenset(v) for c, v
                                                in data.get("str_values", {}).items()})


def _key_kind(column: str) -> tuple[str, str]:
    """'sel.int.m' -> ('m', 'int')."""
    _, kind, key = column.split(".", 2)
    return key, kind


def build_catalog(table: pa.Table) -> Catalog:
    n = table.num_rows
    sel = [c for c in table.column_names if c.startswith(SEL_PREFIX)]
    str_values = {c: frozenset(pc.unique(table.column(c)).drop_null().to_pylist())
                  for c in sel if c.startswith(SEL_PREFIX + "str.")}
    if not n:
        return Catalog(schemas={}, str_values=str_values)
    core_key = np.zeros(n, dtype=np.int64)
    dicts = []
    for col in CORE_COLUMNS:
        codes, values = dictionary_codes(table.column(col))
        core_key = core_key * (len(values) + 1) + codes
        dicts.append((len(values) + 1, values))
    if sel:
        valid = np.zeros((n, len(sel)), dtype=bool)
        for j, col in enumerate(sel):
            valid[:, j] = np.asarray(table.column(col).is_valid().to_numpy(
                zero_copy_only=False), dtype=bool)
        packed = np.ascontiguousarray(np.packbits(valid, axis=1))
        schema_void = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
        uniq_schema, schema_code = np.unique(schema_void, return_inverse=True)
        schema_code = schema_code.reshape(-1)
        bits = np.unpackbits(np.frombuffer(uniq_schema.tobytes(), dtype=np.uint8)
                             .reshape(len(uniq_schema), -1), axis=1)[:, :len(sel)]
    else:
        schema_code = np.zeros(n, dtype=np.int64)
        bits = np.zeros((1, 0), dtype=np.uint8)
    pairs = np.unique(core_key * len(bits) + schema_code)
    schemas: dict[Core, list[tuple[str, ...]]] = {}
    for pair in pairs.tolist():
        key, s = divmod(pair, len(bits))
        core = []
        for radix, values in reversed(dicts):
            key, c = divmod(key, radix)
            core.append(values[c])
        cols = tuple(sel[j] for j in np.nonzero(bits[s])[0])
        schemas.setdefault(tuple(reversed(core)), []).append(cols)
    return Catalog(schemas={core: tuple(sorted(s, key=lambda cols: -len(cols)))
                            for core, s in schemas.items()}, str_values=str_values)
