"""`PerformanceDatabaseProvider`: exact-subset selector matching on a prebuilt index.

* A record matches when its selector is a subset of the query's facts (dims + stated
  context), type-strict. An unknown (empty) runtime or implementation never matches a
  record that requires one.
* The most specific matching selector schema wins (most keys).
* Samples of one provenance group aggregate to the median (population deviation, range
  and count are reported). Two different groups at the winning specificity are an
  `AmbiguousEvidenceError`, never "pick the fastest".
* Query dims a record does not control are listed as assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfcast.core.errors import AmbiguousEvidenceError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import (
    CostEstimate,
    CostQuery,
    EstimateMethod,
    MatchKind,
    Miss,
    Uncertainty,
)
from perfcast.evidence.database import (
    PerformanceDatabase,
    parse_selector_column,
    selector_column,
    view_key,
)
from perfcast.evidence.selectors import (
    _KIND,
    Partition,
    SelectorIndex,
    build_index,
    query_facts,
)


_EMPTY: FrozenDict = FrozenDict()  # immutable: shared by every estimate


@dataclass
class _View:
    """The rows one kind of query can match and their index (built on first use)."""

    index: SelectorIndex
    record_ids: object                     # chunked record_id column of the view's rows
    parts: dict[tuple, Partition]          # selector keys -> partition
    # schemas tried, in order: (selector keys, whether to check them against the
    # catalog first); a slice's own partitions miss schemas and values it lacks
    schemas: list[tuple[tuple, bool]]


class PerformanceDatabaseProvider:
    """Indexes are built lazily, per core identity; for a verified snapshot that has not
    been read (`database.is_lazy`), per core identity and stated runtime, revision and
    kernel, from only those rows. Outcomes and miss reasons are those of one index over
    the whole database: the schemas tried and the string values known come from the
    database's `Catalog`."""

    def __init__(self, database: PerformanceDatabase, *, name: str = "database") -> None:
        self.database = database
        self.name = name
        self.revision = database.digest
        self._views: dict[tuple, _View] = {}
        self._index: SelectorIndex | None = None

    @property
    def index(self) -> SelectorIndex:
        """The index of the whole database (reads every row; for inspection)."""
        if self._index is None:
            self._index = build_index(self.database)
        return self._index

    def _view(self, query: CostQuery, facts: dict) -> _View:
        core = (query.subject.value, query.operation, query.hardware, query.dtype)
        db = self.database
        key, context = view_key(db, core, facts)
        view = self._views.get(key)
        if view is None:
            sub = db.select(core, context) if context is not None else db
            index = build_index(sub, core)
            parts = {p.keys: p for p in index.by_core.get(core, ())}
            if context is None:
                schemas = [(p.keys, False) for p in index.by_core.get(core, ())]
            else:
                schemas = [(tuple(sorted(parse_selector_column(c) for c in cols)), True)
                           for cols in db.catalog.schemas.get(core, ())]
            view = self._views[key] = _View(index, sub.record_ids(), parts,
                                            schemas)
        return view

    def supports(self, query: CostQuery) -> bool | Miss:
        core = (query.subject.value, query.operation, query.hardware, query.dtype)
        known = core in self.database.catalog.schemas if self.database.is_lazy else \
            bool(self._view(query, query_facts(query)).schemas)
        if not known:
            return Miss(f"no records for {query.operation} {query.dtype} on {query.hardware}")
        return True

    def match(self, query: CostQuery, facts: dict
              ) -> tuple[_View, list[tuple[Partition, list[int]]], list[str]]:
        """The view, the partitions (and rows) that match at the highest specificity, and
        why the others did not."""
        view = self._view(query, facts)
        best = -1
        matches: list[tuple[Partition, list[int]]] = []
        reasons: list[str] = []
        for keys, check in view.schemas:
            if len(keys) < best:
                break
            why = _unknown(keys, facts, self.database.catalog.str_values) if check else None
            part = view.parts.get(keys)
            words = part.encode(facts) if part is not None else None
            if not check and isinstance(words, str):
                why = words
            if why:
                reasons.append(why)
                continue
            rows = part.lookup(words) if isinstance(words, list) else []
            if rows:
                matches.append((part, rows))
                best = part.specificity
            else:
                reasons.append("no record at " + ", ".join(
                    f"{k}={facts[k]!r}" for k, _ in keys))
        return view, matches, reasons

    def estimate(self, query: CostQuery) -> CostEstimate | Miss:
        facts = query_facts(query)
        view, matches, reasons = self.match(query, facts)
        if not matches:
            uniq = list(dict.fromkeys(reasons))
            more = f" (+{len(uniq) - 3} more)" if len(uniq) > 3 else ""
            return Miss("; ".join(uniq[:3]) + more or "no matching record")
        rows = matches[0][1] if len(matches) == 1 else [r for _, rs in matches for r in rs]
        group_of_row = view.index.group_of_row
        group_ids = {int(group_of_row[rows[0]])} if len(rows) == 1 else \
            {int(group_of_row[r]) for r in rows}
        if len(group_ids) > 1:
            groups = [view.index.groups[g] for g in sorted(group_ids)]
            desc = "; ".join(f"{g[0]}@{g[1]} ({g[5]}, file {g[4][:19]})" for g in groups)
            raise AmbiguousEvidenceError(
                f"{query.operation} on {query.hardware}: {len(groups)} equally specific "
                f"evidence groups answer this query: {desc}. State the runtime, revision or "
                "implementation that tells them apart, or load only one of them")
        group = view.index.groups[group_ids.pop()]
        lat = view.index.latency_s
        n = len(rows)
        if n == 1:
            samples = [float(lat[rows[0]])]
            median, spread = samples[0], 0.0
        else:
            samples = sorted(float(lat[r]) for r in rows)
            median = samples[n // 2] if n % 2 else 0.5 * (samples[n // 2 - 1] + samples[n // 2])
            mean = sum(samples) / n
            spread = math.sqrt(sum((x - mean) ** 2 for x in samples) / n)
        selector = {k: facts[k] for k, _ in matches[0][0].keys}
        uncontrolled = sorted(k for k in query.dims if k not in selector)
        assumptions = tuple(f"evidence does not control {k}={query.dims[k]!r}"
                            for k in uncontrolled)
        record_ids = _ids(view.record_ids, rows)
        return CostEstimate(
            latency_s=median, method=EstimateMethod(group[5]),
            match_kind=MatchKind.SUBSET if uncontrolled else MatchKind.EXACT,
            provider=self.name, provider_revision=self.revision, source_revision=group[1],
            raw_record_ids=record_ids, validity=FrozenDict(selector),
            uncertainty=Uncertainty(kind="samples", rel_std=spread / median,
                                    low_s=samples[0], high_s=samples[-1], sample_count=n),
            assumptions=assumptions, bottleneck="measured", confidence=1.0,
            components=_EMPTY, statistics=_EMPTY)


def _unknown(keys: tuple[tuple[str, str], ...], facts: dict,
             str_values: dict) -> str | None:
    """Why a schema cannot apply to the facts (missing key, other type, a string value
    no record holds), as `Partition.encode` words it; None if it can."""
    for key, kind in keys:
        if key not in facts:
            return f"needs {key}"
        value = facts[key]
        if _KIND.get(type(value)) != kind:
            return f"needs {key} as {kind}, query has {type(value).__name__}"
        if kind == "str" and value not in str_values.get(selector_column(key, kind), ()):
            return f"no record with {key}={value!r}"
    return None


def _ids(record_ids, rows: list[int]) -> tuple[str, ...]:
    """Record ids of rows, by element (pyarrow's `take` costs an import lookup per call)."""
    return tuple(record_ids[r].as_py() for r in rows)
