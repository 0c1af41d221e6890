"""Evidence measured on another system than the one asked about (`--allow-foreign-evidence`)."""

from __future__ import annotations

from dataclasses import replace

from perfcast.evidence.contracts import CostProvider, Miss


class ForeignEvidence:
    """A provider whose evidence was measured on another system (`measured_on`), asked for
    `used_for` (only with an explicit `--allow-foreign-evidence`): queries are asked at
    `measured_on` and every answer says so (an assumption, `validity.measured_on`)."""

    def __init__(self, inner: CostProvider, measured_on: str, used_for: str) -> None:
        self.inner = inner
        self.measured_on = measured_on
        self.used_for = used_for
        self.name = inner.name
        self.revision = f"{inner.revision}+foreign:{measured_on}"

    def _query(self, query):
        return replace(query, hardware=self.measured_on)

    def supports(self, query):
        return self.inner.supports(self._query(query))

    @property
    def digest(self) -> str:
        from perfcast.evidence.contracts import provider_digest

        return f"{provider_digest(self.inner)}+foreign:{self.measured_on}>{self.used_for}"

    def estimate(self, query):
        from perfcast.evidence.profiling.devices import mark_foreign

        answer = self.inner.estimate(self._query(query))
        if isinstance(answer, Miss):
            return answer
        return mark_foreign(answer, self.measured_on, self.used_for)

