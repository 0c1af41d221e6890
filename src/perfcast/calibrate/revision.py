"""Calibration revisions: every fitted number, with what it was fitted on and its
held-out error.

A `CalibrationRevision` is immutable and content-addressed. It holds one or more
`CalibrationPart`s, each produced by one fitting procedure (serving overheads,
analytic efficiency curves, ...): named `FittedParameter`s with value, fitted 1-sigma
uncertainty and the bounds that kept them physical, the procedure (name, version,
options), what it was fitted on (observation-set and evidence-snapshot digests) and
its cross-validation scores. A new fit is a new revision; nothing is ever rewritten.

JSON layout (`to_json` / `from_json`, also the file the store keeps):

    {"format": "perfcast.calibration/1", "name": ..., "code_version": ...,
     "parts": [{"name": ..., "procedure": {...}, "parameters": [{...}, ...],
                "fitted_on": {...}, "cv": {...}}, ...]}
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from perfcast.core.canonical import Record
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict, freeze

FORMAT = "perfcast.calibration/1"
DIGEST_DOMAIN = "perfcast.calibration_revision"


@dataclass(frozen=True)
class FittedParameter(Record):
    """One fitted number. `std` is its fitted 1-sigma uncertainty (None when the
    procedure could not estimate one, e.g. a parameter at a bound)."""

    name: str                 # namespaced: "serving.trtllm.step_overhead_us", ...
    value: float
    unit: str
    lower: float              # bounds used in the fit (physical range)
    upper: float
    std: float | None = None
    description: str = ""

    def __post_init__(self) -> None:
        for key in ("value", "lower", "upper"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ConfigError(f"{key} {v!r} is not a finite number", field=self.name)
        if not self.lower <= self.value <= self.upper:
            raise ConfigError(f"value {self.value} outside its bounds "
                              f"[{self.lower}, {self.upper}]", field=self.name)
        if self.std is not None and (not math.isfinite(self.std) or self.std < 0):
            raise ConfigError(f"std {self.std!r} is not a non-negative finite number",
                              field=self.name)


@dataclass(frozen=True)
class CalibrationPart(Record):
    """The output of one fitting procedure."""

    name: str                                   # "serving_overheads", "analytic_efficiency"
    procedure: FrozenDict[str, Any]             # {"name", "version", "options": {...}}
    parameters: tuple[FittedParameter, ...]
    fitted_on: FrozenDict[str, Any]             # {"observation_sets": [...], "evidence": [...], ...}
    cv: FrozenDict[str, Any]                    # {"group_by", "folds": [...], "summary": {...}}

    def parameter(self, name: str) -> FittedParameter:
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(name)

    def values(self) -> dict[str, float]:
        return {p.name: p.value for p in self.parameters}


@dataclass(frozen=True)
class CalibrationRevision(Record):
    name: str
    code_version: str
    parts: tuple[CalibrationPart, ...]
    note: str = ""

    DIGEST_DOMAIN = DIGEST_DOMAIN

    def __post_init__(self) -> None:
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate calibration parts {names}", field="parts")
        params = [q.name for p in self.parts for q in p.parameters]
        if len(set(params)) != len(params):
            raise ConfigError("a parameter name occurs in two parts", field="parameters")

    @property
    def short(self) -> str:
        return self.digest.split(":", 1)[1][:12]

    def part(self, name: str) -> CalibrationPart | None:
        for p in self.parts:
            if p.name == name:
                return p
        return None

    def values(self, prefix: str = "") -> dict[str, float]:
        return {q.name: q.value for p in self.parts for q in p.parameters
                if q.name.startswith(prefix)}

    def parameter(self, name: str) -> FittedParameter | None:
        for p in self.parts:
            for q in p.parameters:
                if q.name == name:
                    return q
        return None

    def fitted_on(self) -> dict[str, list[str]]:
        """Union over parts of the digests each part was fitted on, per kind."""
        out: dict[str, list[str]] = {}
        for p in self.parts:
            for key, val in p.fitted_on.items():
                if isinstance(val, (list, tuple)):
                    out.setdefault(key, [])
                    out[key].extend(v for v in val if v not in out[key])
        return out

    def merged(self, other: CalibrationRevision, *, name: str | None = None) -> CalibrationRevision:
        """A new revision with the parts of both (a part name may occur once)."""
        return CalibrationRevision(name=name or f"{self.name}+{other.name}",
                                   code_version=self.code_version,
                                   parts=self.parts + other.parts, note=self.note)

    # -- JSON ------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": FORMAT, "revision": self.digest, "name": self.name,
                "code_version": self.code_version, "note": self.note,
                "parts": [_part_json(p) for p in self.parts]}

    @classmethod
    def from_json(cls, doc: Mapping, *, source: str = "<json>") -> CalibrationRevision:
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise ConfigError("is not a calibration revision", source=source, field="format",
                              expected=FORMAT)
        try:
            rev = cls(name=str(doc["name"]), code_version=str(doc["code_version"]),
                      note=str(doc.get("note", "")),
                      parts=tuple(_part_from_json(p) for p in doc["parts"]))
        except KeyError as exc:
            raise ConfigError("is missing", source=source, field=str(exc.args[0])) from None
        stated = doc.get("revision")
        if stated and stated != rev.digest:
            raise ConfigError(f"content does not match its digest {stated} (got {rev.digest}): "
                              "the file was changed after it was written", source=source,
                              field="revision")
        return rev


def _part_json(p: CalibrationPart) -> dict:
    return {"name": p.name, "procedure": plain(p.procedure),
            "parameters": [{"name": q.name, "value": q.value, "std": q.std, "unit": q.unit,
                            "lower": q.lower, "upper": q.upper, "description": q.description}
                           for q in p.parameters],
            "fitted_on": plain(p.fitted_on), "cv": plain(p.cv)}


def _part_from_json(d: Mapping) -> CalibrationPart:
    return make_part(d["name"], procedure=d["procedure"], fitted_on=d["fitted_on"], cv=d["cv"],
                     parameters=[FittedParameter(
                         name=str(q["name"]), value=float(q["value"]), unit=str(q["unit"]),
                         lower=float(q["lower"]), upper=float(q["upper"]),
                         std=None if q.get("std") is None else float(q["std"]),
                         description=str(q.get("description", ""))) for q in d["parameters"]])


def make_part(name: str, *, procedure: Mapping, parameters: Iterable[FittedParameter],
              fitted_on: Mapping, cv: Mapping) -> CalibrationPart:
    """A part from plain dicts/lists (frozen here, so callers need not)."""
    return CalibrationPart(name=name, procedure=freeze(dict(procedure)),
                           parameters=tuple(parameters), fitted_on=freeze(dict(fitted_on)),
                           cv=freeze(dict(cv)))


def plain(value: Any) -> Any:
    """FrozenDicts and tuples as plain dicts and lists (for JSON)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def dumps(rev: CalibrationRevision) -> str:
    return json.dumps(rev.to_json(), indent=1, sort_keys=True)
