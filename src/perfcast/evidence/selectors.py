"""Selector matching shared by the database and interpolation providers.

A query's *facts* are its dims plus the stated context (runtime, runtime_revision,
implementation for its operation, ...); an empty context field is unknown and is not
a fact. A record matches when every key of its selector is a fact of the query with
the same type and value (exact subset match, type-strict).

Rows are grouped into *partitions* of one core identity (subject, operation, hardware,
dtype) and one selector schema (the set of (key, type) pairs). Each row's selector
values are encoded as int64 words (strings by a per-column dictionary code, floats by
their bits) and hashed to one uint64; a partition keeps its hashes sorted, so a lookup
is a binary search plus an exact check of the words (hash collisions cannot match).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from perfcast.evidence.contracts import CostQuery, DimValue
from perfcast.evidence.columns import (
    CORE_COLUMNS,
    PROVENANCE_COLUMNS,
    dictionary_codes,
    parse_selector_column,
)
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.records import CONTEXT_KEYS

_MASK = (1 << 64) - 1
_KIND = {bool: "bool", int: "int", float: "float", str: "str"}  # exact types only
_FNV_OFFSET = 1469598103934665603
_FNV_PRIME = 1099511628211


_CONTEXT_FACTS: dict[tuple[str, str, str], dict[str, DimValue]] = {}  # by context digest


def _context_facts(ctx, operation: str, dtype: str = "") -> dict[str, DimValue]:
    key = (ctx.digest, operation, dtype)
    hit = _CONTEXT_FACTS.get(key)
    if hit is not None:
        return hit
    facts: dict[str, DimValue] = {}
    for name in CONTEXT_KEYS:
        value = ctx.implementation_for(operation, dtype) if name == "implementation" \
            else getattr(ctx, name)
        if value:
            facts[name] = value
    if len(_CONTEXT_FACTS) > 4096:
        _CONTEXT_FACTS.clear()
    _CONTEXT_FACTS[key] = facts
    return facts


def query_facts(query: CostQuery) -> dict[str, DimValue]:
    """The query's dims plus its stated context (computed once per query object; callers
    must not mutate the result)."""
    cached = query.__dict__.get("_selector_facts")
    if cached is not None:
        return cached
    facts: dict[str, DimValue] = dict(query.dims)
    facts.update(_context_facts(query.context, query.operation, query.dtype))
    object.__setattr__(query, "_selector_facts", facts)
    return facts


def _hash_rows(words: np.ndarray) -> np.ndarray:
    h = np.full(words.shape[0], _FNV_OFFSET, dtype=np.uint64)
    prime = np.uint64(_FNV_PRIME)
    for j in range(words.shape[1]):
        h = (h ^ words[:, j].view(np.uint64)) * prime
    return h


def _hash_one(words: list[int]) -> int:
    h = _FNV_OFFSET
    for w in words:
        h = ((h ^ (w & _MASK)) * _FNV_PRIME) & _MASK
    return h


def _float_word(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", value + 0.0))[0]


@dataclass
class Partition:
    """Rows of one core identity and one selector schema."""

    core: tuple[str, str, str, str]
    keys: tuple[tuple[str, str], ...]      # ((key, type), ...) sorted by key
    rows: np.ndarray                       # row indices, sorted by hash
    hashes: np.ndarray                     # uint64, sorted
    words: np.ndarray                      # int64 (len(rows), len(keys)), aligned with rows
    codes: tuple[dict | None, ...]         # per key: str -> code for string columns

    @property
    def specificity(self) -> int:
        return len(self.keys)

    def encode(self, facts: Mapping[str, DimValue]) -> list[int] | str:
        """The query's words for this schema, or why the schema does not apply."""
        words = []
        for (key, kind), codes in zip(self.keys, self.codes):
            if key not in facts:
                return f"needs {key}"
            value = facts[key]
            if _KIND.get(type(value)) != kind:
                return f"needs {key} as {kind}, query has {type(value).__name__}"
            if kind == "str":
                code = codes.get(value)
                if code is None:
                    return f"no record with {key}={value!r}"
                words.append(code)
            elif kind == "float":
                words.append(_float_word(value))
            else:
                words.append(int(value))
        return words

    def lookup(self, words: list[int]) -> list[int]:
        """Rows whose selector words equal `words`: one dict probe on the hash (built on
        the first lookup from the sorted hashes), then an exact check of the words."""
        starts = self.__dict__.get("_starts")
        if starts is None:
            uniq, first = np.unique(self.hashes, return_index=True)
            starts = self.__dict__["_starts"] = dict(zip(uniq.tolist(), first.tolist()))
        i = starts.get(_hash_one(words))
        if i is None:
            return []
        hashes, h, n = self.hashes, self.hashes[i], len(self.hashes)
        out = []
        while i < n and hashes[i] == h:
            if self.words[i].tolist() == words:
                out.append(int(self.rows[i]))
            i += 1
        return out


@dataclass
class SelectorIndex:
    """Every partition of a database, by core identity, most specific first."""

    by_core: dict[tuple[str, str, str, str], list[Partition]]
    group_of_row: np.ndarray               # provenance group id per row
    groups: list[tuple[str, ...]]          # group id -> provenance tuple
    latency_s: np.ndarray

    def candidates(self, query: CostQuery) -> list[Partition] | None:
        return self.by_core.get((query.subject.value, query.operation, query.hardware,
                                 query.dtype))


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list]:
    return dictionary_codes(column)


def _combine(codes, n: int) -> tuple[np.ndarray, list[int]]:
    """Row -> id of its combination of codes (ids dense), and one row index per id.

    Codes are combined in mixed radix; the key is compacted with np.unique only when the
    next radix would overflow int64 (rarely), so this is one sort for most inputs."""
    key = np.zeros(n, dtype=np.int64)
    span = 1
    for c in codes:
        c = np.asarray(c, dtype=np.int64)
        radix = (int(c.max()) + 2) if n else 1
        if span * radix >= 2 ** 62:
            _, key = np.unique(key, return_inverse=True)
            key = key.reshape(-1).astype(np.int64)
            span = int(key.max()) + 1 if n else 1
        key = key * radix + (c + 1)
        span *= radix
    if not n:
        return key, []
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), first.tolist()


@dataclass
class RowCodes:
    """Integer codes of every row of a database, computed once and cached on it."""

    n: int
    core_codes: tuple[np.ndarray, ...]
    core_dicts: tuple[list, ...]
    group_of_row: np.ndarray
    groups: list[tuple[str, ...]]
    sel_cols: tuple[str, ...]
    words: np.ndarray                      # int64 (n, len(sel_cols))
    valid: np.ndarray                      # bool (n, len(sel_cols))
    code_maps: list[dict | None]           # str column: value -> code
    code_values: list[list | None]         # str column: code -> value
    latency_s: np.ndarray

    def core_of(self, row: int) -> tuple[str, str, str, str]:
        return tuple(self.core_dicts[j][self.core_codes[j][row]]
                     for j in range(len(CORE_COLUMNS)))

    def value(self, row: int, j: int) -> DimValue:
        kind = parse_selector_column(self.sel_cols[j])[1]
        w = int(self.words[row, j])
        if kind == "str":
            return self.code_values[j][w]
        if kind == "float":
            return struct.unpack("<d", struct.pack("<q", w))[0]
        return bool(w) if kind == "bool" else w


def row_codes(db: PerformanceDatabase) -> RowCodes:
    cached = getattr(db, "_row_codes", None)
    if cached is not None:
        return cached
    table = db.table
    n = table.num_rows
    # core identity and provenance group per row (mixed-radix codes, compacted)
    core_codes, core_dicts = zip(*(_codes(table.column(c)) for c in CORE_COLUMNS))
    prov_codes, prov_dicts = zip(*(_codes(table.column(c)) for c in PROVENANCE_COLUMNS))
    group_of_row, group_first = _combine(prov_codes, n)
    groups = [tuple(prov_dicts[j][prov_codes[j][r]] for j in range(len(PROVENANCE_COLUMNS)))
              for r in group_first]
    sel_cols = db.selector_columns
    # column-major: each selector column is written (and sliced) whole
    words_all = np.zeros((n, len(sel_cols)), dtype=np.int64, order="F")
    valid_all = np.zeros((n, len(sel_cols)), dtype=bool, order="F")
    code_maps: list[dict | None] = []
    code_values: list[list | None] = []
    for j, name in enumerate(sel_cols):
        _, kind = parse_selector_column(name)
        col = table.column(name)
        valid_all[:, j] = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        values = None
        if kind == "str":
            codes, values = _codes(col)
            words_all[:, j] = codes
        elif kind == "float":
            words_all[:, j] = (col.fill_null(0.0).to_numpy() + 0.0).view(np.int64)
        elif kind == "bool":
            words_all[:, j] = np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False),
                                         dtype=np.int64)
        else:
            words_all[:, j] = col.fill_null(0).to_numpy()
        code_values.append(values)
        code_maps.append({v: i for i, v in enumerate(values)} if values is not None else None)
    latency = np.asarray(table.column("latency_s").to_numpy(), dtype=np.float64)
    codes = RowCodes(n=n, core_codes=core_codes, core_dicts=core_dicts,
                     group_of_row=np.asarray(group_of_row), groups=groups, sel_cols=sel_cols,
                     words=words_all, valid=valid_all, code_maps=code_maps,
                     code_values=code_values, latency_s=latency)
    db._row_codes = codes
    return codes


def core_rows(rc: RowCodes, core: tuple[str, str, str, str] | None) -> np.ndarray:
    """Row indices of one core identity (all rows for None), in database order."""
    if core is None:
        return np.arange(rc.n)
    mask = np.ones(rc.n, dtype=bool)
    for codes, values, want in zip(rc.core_codes, rc.core_dicts, core):
        try:
            mask &= codes == values.index(want)
        except ValueError:
            return np.zeros(0, dtype=np.int64)
    return np.nonzero(mask)[0]


def build_index(db: PerformanceDatabase,
                core: tuple[str, str, str, str] | None = None) -> SelectorIndex:
    """The exact-match index of every row, or only of one core identity's rows (the
    partitions are the same as in the whole index)."""
    rc = row_codes(db)
    sel_cols, valid_all = rc.sel_cols, rc.valid
    words_all, code_maps = rc.words, rc.code_maps
    sub = core_rows(rc, core)
    n = len(sub)
    by_core: dict[tuple[str, str, str, str], list[Partition]] = {}
    if n:
        if sel_cols:
            packed = np.ascontiguousarray(np.packbits(valid_all[sub], axis=1))
            schema = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
            _, schema_code = np.unique(schema, return_inverse=True)
        else:
            schema_code = np.zeros(n, dtype=np.int64)
        inverse, firsts = _combine([*(c[sub] for c in rc.core_codes),
                                    schema_code.reshape(-1)], n)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(firsts) + 1))
        for p in range(len(firsts)):
            rows = sub[order[bounds[p]:bounds[p + 1]]]
            first = rows[0]
            core_p = rc.core_of(first)
            cols = [j for j in range(len(sel_cols)) if valid_all[first, j]]
            cols.sort(key=lambda j: parse_selector_column(sel_cols[j]))
            keys = tuple(parse_selector_column(sel_cols[j]) for j in cols)
            words = words_all[np.ix_(rows, cols)] if cols else np.zeros((len(rows), 0), np.int64)
            hashes = _hash_rows(words)
            srt = np.argsort(hashes, kind="stable")
            part = Partition(core=core_p, keys=keys, rows=rows[srt], hashes=hashes[srt],
                             words=words[srt], codes=tuple(code_maps[j] for j in cols))
            by_core.setdefault(core_p, []).append(part)
        for parts in by_core.values():
            parts.sort(key=lambda p: -p.specificity)
    return SelectorIndex(by_core=by_core, group_of_row=rc.group_of_row, groups=rc.groups,
                         latency_s=rc.latency_s)
