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
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.selectors import Partition, build_index, query_facts


class PerformanceDatabaseProvider:
    def __init__(self, database: PerformanceDatabase, *, name: str = "database") -> None:
        self.database = database
        self.name = name
        self.revision = database.digest
        self.index = build_index(database)
        self._record_ids = database.table.column("record_id")  # chunked: no copy

    def supports(self, query: CostQuery) -> bool | Miss:
        if self.index.candidates(query) is None:
            return Miss(f"no records for {query.operation} {query.dtype} on {query.hardware}")
        return True

    def match(self, query: CostQuery, facts: dict
              ) -> tuple[list[tuple[Partition, list[int]]], list[str]]:
        """The partitions (and rows) that match at the highest specificity, and why the
        others did not."""
        parts = self.index.candidates(query) or []
        best = -1
        matches: list[tuple[Partition, list[int]]] = []
        reasons: list[str] = []
        for part in parts:
            if part.specificity < best:
                break
            words = part.encode(facts)
            if isinstance(words, str):
                reasons.append(words)
                continue
            rows = part.lookup(words)
            if rows:
                matches.append((part, rows))
                best = part.specificity
            else:
                reasons.append("no record at " + ", ".join(
                    f"{k}={facts[k]!r}" for k, _ in part.keys))
        return matches, reasons

    def estimate(self, query: CostQuery) -> CostEstimate | Miss:
        facts = query_facts(query)
        matches, reasons = self.match(query, facts)
        if not matches:
            uniq = list(dict.fromkeys(reasons))
            more = f" (+{len(uniq) - 3} more)" if len(uniq) > 3 else ""
            return Miss("; ".join(uniq[:3]) + more or "no matching record")
        rows = matches[0][1] if len(matches) == 1 else [r for _, rs in matches for r in rs]
        group_of_row = self.index.group_of_row
        group_ids = {int(group_of_row[rows[0]])} if len(rows) == 1 else \
            {int(group_of_row[r]) for r in rows}
        if len(group_ids) > 1:
            groups = [self.index.groups[g] for g in sorted(group_ids)]
            desc = "; ".join(f"{g[0]}@{g[1]} ({g[5]}, file {g[4][:19]})" for g in groups)
            raise AmbiguousEvidenceError(
                f"{query.operation} on {query.hardware}: {len(groups)} equally specific "
                f"evidence groups answer this query: {desc}. State the runtime, revision or "
                "implementation that tells them apart, or load only one of them")
        group = self.index.groups[group_ids.pop()]
        lat = self.index.latency_s
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
        record_ids = tuple(self._record_ids[r].as_py() for r in rows)
        return CostEstimate(
            latency_s=median, method=EstimateMethod(group[5]),
            match_kind=MatchKind.SUBSET if uncontrolled else MatchKind.EXACT,
            provider=self.name, provider_revision=self.revision, source_revision=group[1],
            raw_record_ids=record_ids, validity=FrozenDict(selector),
            uncertainty=Uncertainty(kind="samples", rel_std=spread / median,
                                    low_s=samples[0], high_s=samples[-1], sample_count=n),
            assumptions=assumptions, bottleneck="measured", confidence=1.0)
