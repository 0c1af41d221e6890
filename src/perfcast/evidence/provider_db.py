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

import statistics

import numpy as np

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
        self._record_ids = database.table.column("record_id")

    def supports(self, query: CostQuery) -> bool | Miss:
        if self.index.candidates(query) is None:
            return Miss(f"no records for {query.operation} {query.dtype} on {query.hardware}")
        return True

    def match(self, query: CostQuery) -> tuple[list[tuple[Partition, np.ndarray]], list[str]]:
        """The partitions (and rows) that match at the highest specificity, and why the
        others did not."""
        parts = self.index.candidates(query) or []
        facts = query_facts(query)
        best = -1
        matches: list[tuple[Partition, np.ndarray]] = []
        reasons: list[str] = []
        for part in parts:
            if part.specificity < best:
                break
            words = part.encode(facts)
            if isinstance(words, str):
                reasons.append(words)
                continue
            rows = part.lookup(words)
            if len(rows):
                matches.append((part, rows))
                best = part.specificity
            else:
                reasons.append("no record at " + ", ".join(
                    f"{k}={facts[k]!r}" for k, _ in part.keys))
        return matches, reasons

    def estimate(self, query: CostQuery) -> CostEstimate | Miss:
        matches, reasons = self.match(query)
        if not matches:
            uniq = list(dict.fromkeys(reasons))
            more = f" (+{len(uniq) - 3} more)" if len(uniq) > 3 else ""
            return Miss("; ".join(uniq[:3]) + more or "no matching record")
        rows = np.concatenate([r for _, r in matches]) if len(matches) > 1 else matches[0][1]
        group_ids = self.index.group_of_row[rows]
        first = int(group_ids[0])
        if np.any(group_ids != first):
            groups = [self.index.groups[int(g)] for g in np.unique(group_ids)]
            desc = "; ".join(f"{g[0]}@{g[1]} ({g[5]}, file {g[4][:19]})" for g in groups)
            raise AmbiguousEvidenceError(
                f"{query.operation} on {query.hardware}: {len(groups)} equally specific "
                f"evidence groups answer this query: {desc}. State the runtime, revision or "
                "implementation that tells them apart, or load only one of them")
        group = self.index.groups[first]
        samples = sorted(self.index.latency_s[rows].tolist())
        median = statistics.median(samples)
        spread = statistics.pstdev(samples) if len(samples) > 1 else 0.0
        facts = query_facts(query)
        selector = {k: facts[k] for part, _ in matches[:1] for k, _ in part.keys}
        uncontrolled = sorted(k for k in query.dims if k not in selector)
        assumptions = tuple(f"evidence does not control {k}={query.dims[k]!r}"
                            for k in uncontrolled)
        record_ids = tuple(self._record_ids.take(rows).to_pylist())
        return CostEstimate(
            latency_s=median, method=EstimateMethod(group[5]),
            match_kind=MatchKind.SUBSET if uncontrolled else MatchKind.EXACT,
            provider=self.name, provider_revision=self.revision, source_revision=group[1],
            raw_record_ids=record_ids, validity=FrozenDict(selector),
            uncertainty=Uncertainty(kind="samples", rel_std=spread / median,
                                    low_s=samples[0], high_s=samples[-1],
                                    sample_count=len(samples)),
            assumptions=assumptions, bottleneck="measured", confidence=1.0)
