"""Errors a user can act on. Each names what was wrong and where."""

from __future__ import annotations


class PerfcastError(Exception):
    """Base of every error perfcast raises on purpose."""


class ConfigError(PerfcastError, ValueError):
    """A bad input file or value: names the file, the field and what was expected."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None,
                 expected: str | None = None) -> None:
        parts = []
        if source:
            parts.append(str(source))
        if field:
            parts.append(f"field '{field}'")
        prefix = ": ".join(parts)
        text = f"{prefix}: {message}" if prefix else message
        if expected:
            text += f" (expected {expected})"
        super().__init__(text)
        self.source = source
        self.field = field
        self.expected = expected


class UnsupportedModelError(ConfigError):
    """A model config uses a feature perfcast does not model; never silently flattened."""


class InvalidEvidenceError(PerfcastError):
    """Evidence exists but is invalid for the query; no fallback may hide it."""


class AmbiguousEvidenceError(InvalidEvidenceError):
    """Two equally specific, different evidence groups answer one query."""


class UnresolvedCostError(PerfcastError):
    """No provider in the resolver's policy could answer a query. Carries the attempts."""

    def __init__(self, message: str, attempts: tuple = ()) -> None:
        detail = "; ".join(f"{a.provider}: {a.outcome} ({a.reason})" for a in attempts)
        super().__init__(f"{message}: {detail}" if detail else message)
        self.attempts = attempts


def parse_choice(enum_cls, value, *, what: str, field: str):
    """`enum_cls(value)`, or a ConfigError naming the flag and the allowed values."""
    try:
        return enum_cls(value)
    except ValueError:
        raise ConfigError(f"unknown {what} {value!r}", field=field,
                          expected=" | ".join(m.value for m in enum_cls)) from None
