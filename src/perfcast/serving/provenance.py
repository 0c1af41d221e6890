"""Where the numbers of a serving simulation came from, and what it was asked.

`tallied(providers)` wraps the measured and calibrated providers handed to
`run_serving` so that each answer is counted by provider, revision, method and source
revision. The resolver asks each distinct cost query once (it caches answers), so the
counts are distinct queries; the first wrapped provider sees every query, so what the
wrapped providers did not answer is the number the analytic models (roofline and
alpha-beta collectives, appended by the step cost model) answered.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Sequence

from perfcast.evidence.contracts import CostEstimate

ANALYTIC = "roofline and alpha-beta collective models"


class Tally:
    """Answers per (provider, provider_revision, method, source_revision) and the
    number of distinct queries asked."""

    def __init__(self) -> None:
        self.answers: Counter = Counter()
        self.queries = 0
        self.token = uuid.uuid4().hex   # tells tallies apart in cache keys

    def rows(self) -> list[dict]:
        return [{"provider": p, "provider_revision": r, "method": m, "source_revision": s,
                 "queries": n} for (p, r, m, s), n in sorted(self.answers.items())]


class TallyingProvider:
    """A provider that counts the answers of the provider it wraps."""

    def __init__(self, inner, tally: Tally, first: bool) -> None:
        self.inner = inner
        self.name = inner.name
        self.revision = inner.revision
        self._tally = tally
        self._first = first

    @property
    def digest(self) -> str:
        """The wrapped provider's digest and this tally's: costs cached for one tally's
        run are not reused by another, which would count nothing."""
        from perfcast.evidence.contracts import provider_digest

        return f"{provider_digest(self.inner)}+tally:{self._tally.token}"

    def supports(self, query):
        if self._first:
            self._tally.queries += 1
        return self.inner.supports(query)

    def estimate(self, query):
        answer = self.inner.estimate(query)
        if isinstance(answer, CostEstimate):
            self._tally.answers[(answer.provider, answer.provider_revision,
                                 answer.method.value, answer.source_revision)] += 1
        return answer


def tallied(providers: Sequence) -> tuple[tuple, Tally]:
    tally = Tally()
    return tuple(TallyingProvider(p, tally, i == 0) for i, p in enumerate(providers)), tally


def provenance_json(rows: Iterable[dict], queries: int | None, *, calibration: str,
                    evidence: dict | None) -> dict:
    """`provenance` of serve/search JSON. `rows`: Tally.rows() (summed over runs);
    `queries`: distinct cost queries (None when no provider was wrapped: then the
    analytic models answered every one)."""
    merged: Counter = Counter()
    for row in rows:
        merged[(row["provider"], row["provider_revision"], row["method"],
                row["source_revision"])] += row["queries"]
    answered = sum(merged.values())
    return {
        "calibration": calibration,
        "evidence": evidence,
        "answers": [{"provider": p, "provider_revision": r, "method": m,
                     "source_revision": s, "queries": n}
                    for (p, r, m, s), n in sorted(merged.items())],
        "analytic": {"provider": ANALYTIC,
                     "queries": None if queries is None else queries - answered},
        "cost_queries": queries,
    }


def provenance_lines(prov: dict) -> list[str]:
    """Provenance as short lines for the table output."""
    total = prov["cost_queries"]
    lines = [f"calibration revision {prov['calibration'][:19]}"]
    ev = prov.get("evidence")
    if ev:
        lines.append(f"measured evidence: {ev['root']} ({ev['backend']} {ev['version']})"
                     if ev.get("version") else f"measured evidence: {ev['root']} (no tables "
                     f"for this system and backend)")
    for a in prov["answers"]:
        src = (f" (source {a['source_revision'][:19]})"
               if a["source_revision"] and a["source_revision"] != a["provider_revision"] else "")
        lines.append(f"{a['queries']:>6} cost queries {a['method']}: {a['provider']} "
                     f"{a['provider_revision'][:19]}{src}")
    analytic = prov["analytic"]["queries"]
    lines.append(f"{'all' if analytic is None else analytic:>6} cost queries analytic: {ANALYTIC}")
    if total is not None:
        lines.append(f"{total:>6} distinct cost queries in all")
    return lines
