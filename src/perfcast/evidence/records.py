"""One measured latency sample: `PerformanceRecord` with its `EvidenceProvenance`.

A record's `selector` is the typed set of facts it was measured under (`m`, `n`, `k`,
`runtime`, `implementation`, ...). Selector values are type-strict: 1, 1.0 and True
are three different values (they never match each other). The core identity
(subject, operation, hardware, dtype) is kept apart from the selector so that the
provider can index on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from perfcast.core.canonical import Record
from perfcast.core.dtypes import parse_dtype
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostSubject, DimValue, EstimateMethod

# Selector value type names as they appear in column names (`sel.int.m`).
SELECTOR_TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str}

# Query facts that come from the query context rather than its dims.
CONTEXT_KEYS = ("runtime", "runtime_revision", "implementation", "hardware_revision",
                "topology_revision", "power_mode")


def selector_type_name(value: object) -> str:
    """'bool' | 'int' | 'float' | 'str' for a selector value (bool checked before int)."""
    if type(value) is bool:
        return "bool"
    if type(value) is int:
        return "int"
    if type(value) is float:
        return "float"
    if type(value) is str:
        return "str"
    raise ConfigError(f"selector value {value!r} has type {type(value).__name__}",
                      expected="bool, int, float or str")


@dataclass(frozen=True)
class EvidenceProvenance(Record):
    """Where one sample came from. Everything but `raw_record_id` forms the group:
    repeated samples of one group are aggregated; two groups never mix."""

    source: str                      # e.g. "aiconfigurator", "vidur", a simulator name
    source_revision: str             # revision of the data (commit, version, path)
    importer: str                    # importer name
    importer_revision: str           # importer revision (bumped when its mapping changes)
    source_digest: str               # sha256 of the source file's bytes
    method: EstimateMethod           # measured | simulated | ...
    raw_record_id: str               # row id inside the source

    def group(self) -> tuple[str, str, str, str, str, str]:
        return (self.source, self.source_revision, self.importer, self.importer_revision,
                self.source_digest, self.method.value)


@dataclass(frozen=True)
class PerformanceRecord(Record):
    subject: CostSubject
    operation: str
    hardware: str
    dtype: str                       # canonical dtype name
    selector: FrozenDict[str, DimValue]
    latency_s: float
    provenance: EvidenceProvenance
    metadata: FrozenDict[str, str] = field(default_factory=FrozenDict)

    def __post_init__(self) -> None:
        where = f"record {self.provenance.raw_record_id!r}"
        if type(self.latency_s) is not float or not math.isfinite(self.latency_s) \
                or self.latency_s <= 0:
            raise ConfigError(f"latency {self.latency_s!r} is not a positive finite float",
                              source=where, field="latency_s")
        if self.dtype and parse_dtype(self.dtype, source=where, field="dtype").value != self.dtype:
            raise ConfigError(f"dtype {self.dtype!r} is not canonical", source=where,
                              field="dtype", expected=parse_dtype(self.dtype).value)
        for key, value in self.selector.items():
            kind = selector_type_name(value)
            if kind == "float" and not math.isfinite(value):
                raise ConfigError(f"non-finite selector value {value!r}", source=where,
                                  field=f"selector.{key}")

    @property
    def record_id(self) -> str:
        return self.provenance.raw_record_id
