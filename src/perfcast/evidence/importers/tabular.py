"""`TabularImportSpec` + `SimulatorPerformanceImporter`: any table with a declared mapping.

Formats: CSV (header row), JSON (a list of objects, or {"rows": [...]}), JSONL and
Parquet. Nothing is guessed: the latency column and its unit, the operation, hardware
and dtype (constant or column), and every selector column with its type are declared.
Invalid, empty, non-finite or mistyped input fails the whole import with the file, row
and column named, and so do a CSV row with more or fewer cells than the header, a
duplicate record id and an operation perfcast does not know. Columns the spec does not
map are listed in the manifest (`unused_columns`) and reported by the CLI. CSV cells are
text: an `int` cell must be an integer literal ("1.0"
is rejected), a `bool` cell `true` or `false`. JSON and Parquet keep their own types:
an `int` selector rejects 1.0 and true, a `float` one accepts integers.
"""

from __future__ import annotations

import csv
import enum
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from perfcast.core.canonical import Record
from perfcast.core.dtypes import parse_dtype
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostSubject, DimValue, EstimateMethod
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.importers.common import check_operations, file_digest
from perfcast.evidence.records import SELECTOR_TYPES, EvidenceProvenance, PerformanceRecord

IMPORTER = "tabular"
IMPORTER_REVISION = "1"
_INT = re.compile(r"^[+-]?\d+$")


class LatencyUnit(str, enum.Enum):
    SECONDS = "s"
    MILLISECONDS = "ms"
    MICROSECONDS = "us"
    NANOSECONDS = "ns"

    @property
    def scale(self) -> float:
        return {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[self.value]


@dataclass(frozen=True)
class TabularImportSpec(Record):
    name: str
    subject: CostSubject
    source: str
    source_revision: str
    method: EstimateMethod
    latency_column: str
    latency_unit: LatencyUnit
    operation: str = ""
    operation_column: str = ""
    hardware: str = ""
    hardware_column: str = ""
    datatype: str = ""
    datatype_column: str = ""
    selector_columns: FrozenDict[str, str] = field(default_factory=FrozenDict)
    selector_types: FrozenDict[str, str] = field(default_factory=FrozenDict)
    constant_selectors: FrozenDict[str, DimValue] = field(default_factory=FrozenDict)
    record_id_column: str = ""

    def __post_init__(self) -> None:
        for const, column in (("operation", "operation_column"), ("hardware", "hardware_column"),
                              ("datatype", "datatype_column")):
            if bool(getattr(self, const)) == bool(getattr(self, column)):
                raise ConfigError(f"declare exactly one of {const} and {column}",
                                  source=f"import spec {self.name!r}", field=const)
        missing = sorted(set(self.selector_columns) - set(self.selector_types))
        if missing:
            raise ConfigError(f"selectors without a declared type: {missing}",
                              source=f"import spec {self.name!r}", field="selector_types",
                              expected="int | float | str | bool per selector")
        if self.operation:
            check_operations([self.operation], source=f"import spec {self.name!r}",
                             field="operation", rows=["operation"])
        for key, kind in self.selector_types.items():
            if kind not in SELECTOR_TYPES:
                raise ConfigError(f"unknown type {kind!r} for selector {key!r}",
                                  source=f"import spec {self.name!r}", field="selector_types",
                                  expected="int | float | str | bool")


def load_spec(path: str | Path) -> TabularImportSpec:
    """A TabularImportSpec from a YAML or JSON file (field names as in the dataclass)."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read import spec: {exc}", source=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping", source=str(path))
    known = {f.name for f in fields(TabularImportSpec)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown field(s) {unknown}", source=str(path),
                          expected=", ".join(sorted(known)))
    try:
        data["subject"] = CostSubject(data.get("subject"))
        data["method"] = EstimateMethod(data.get("method"))
        data["latency_unit"] = LatencyUnit(data.get("latency_unit"))
    except ValueError as exc:
        raise ConfigError(str(exc), source=str(path)) from None
    for key in ("selector_columns", "selector_types", "constant_selectors"):
        data[key] = FrozenDict(data.get(key) or {})
    try:
        return TabularImportSpec(**data)
    except TypeError as exc:
        raise ConfigError(str(exc), source=str(path)) from None


def _rows(path: Path) -> Iterator[tuple[str, Mapping, bool]]:
    """(row label, row, cells are text) for every data row."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            for i, row in enumerate(reader):
                label = f"row {i} (line {reader.line_num})"
                width = len(reader.fieldnames or ())
                if None in row or any(v is None for v in row.values()):
                    cells = width + len(row.get(None) or ()) - sum(
                        v is None for k, v in row.items() if k is not None)
                    raise ConfigError(f"{label}: {cells} cells, the header has {width}",
                                      source=str(path),
                                      expected="one cell per header column")
                yield label, row, True
    elif suffix == ".jsonl":
        for i, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                try:
                    yield f"row {i} (line {i + 1})", json.loads(line), False
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"line {i + 1}: invalid JSON: {exc}", source=str(path)) \
                        from None
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON: {exc}", source=str(path)) from None
        rows = data.get("rows") if isinstance(data, dict) else data
        if not isinstance(rows, list):
            raise ConfigError("expected a list of objects (or {\"rows\": [...]})",
                              source=str(path))
        for i, row in enumerate(rows):
            yield f"row {i}", row, False
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"row {i}", row, False
    else:
        raise ConfigError(f"unsupported file type {suffix!r}", source=str(path),
                          expected=".csv, .json, .jsonl or .parquet")


def _typed(value, kind: str, text: bool):
    """Convert one cell to the declared type, or raise ValueError saying why."""
    if value is None or (text and value == ""):
        raise ValueError("empty value")
    if text:
        if kind == "int":
            if not _INT.match(value.strip()):
                raise ValueError(f"{value!r} is not an integer")
            return int(value)
        if kind == "float":
            out = float(value)
        elif kind == "bool":
            if value.strip().lower() not in ("true", "false"):
                raise ValueError(f"{value!r} is not true/false")
            return value.strip().lower() == "true"
        else:
            return value
    else:
        if kind == "int":
            if type(value) is not int:
                raise ValueError(f"{value!r} is not an integer")
            return value
        if kind == "float":
            if type(value) not in (int, float):
                raise ValueError(f"{value!r} is not a number")
            out = float(value)
        elif kind == "bool":
            if type(value) is not bool:
                raise ValueError(f"{value!r} is not a boolean")
            return value
        else:
            if type(value) is not str:
                raise ValueError(f"{value!r} is not a string")
            return value
    if not math.isfinite(out):
        raise ValueError(f"{value!r} is not finite")
    return out


class SimulatorPerformanceImporter:
    name = IMPORTER
    revision = IMPORTER_REVISION

    @staticmethod
    def from_file(path: str | Path, spec: TabularImportSpec, *,
                  system: Callable[[str], str] | None = None) -> PerformanceDatabase:
        """`system` (optional) maps each hardware value to its catalog name, raising a
        ConfigError for an unknown one (the CLI passes `common.system_id`)."""
        path = Path(path)
        if not path.exists():
            raise ConfigError("file not found", source=str(path))
        digest = file_digest(path)
        records = []
        used = spec_columns(spec)
        unused: set[str] = set()
        ids: dict[str, str] = {}
        systems: dict[str, str] = {}
        for label, row, text in _rows(path):
            if not isinstance(row, Mapping):
                raise ConfigError(f"{label}: expected an object", source=str(path))
            unused.update(str(k) for k in row if k not in used)

            def cell(column: str, kind: str):
                if column not in row:
                    raise ConfigError(f"{label}: missing column", source=str(path),
                                      field=column, expected="one of the columns found: "
                                      + ", ".join(map(str, row.keys())))
                try:
                    return _typed(row[column], kind, text)
                except ValueError as exc:
                    raise ConfigError(f"{label}: {exc}", source=str(path), field=column,
                                      expected=kind) from None

            latency = cell(spec.latency_column, "float") * spec.latency_unit.scale
            if latency <= 0:
                raise ConfigError(f"{label}: latency must be > 0", source=str(path),
                                  field=spec.latency_column)
            selector = dict(spec.constant_selectors)
            for key, column in spec.selector_columns.items():
                selector[key] = cell(column, spec.selector_types[key])
            dtype_text = spec.datatype or cell(spec.datatype_column, "str")
            dtype = parse_dtype(dtype_text, source=f"{path} {label}",
                                field=spec.datatype_column or "datatype").value
            rid = f"{path.name}#{label.split()[1]}"
            if spec.record_id_column:
                raw = row.get(spec.record_id_column)
                if type(raw) not in (str, int) or raw == "":
                    raise ConfigError(f"{label}: record id {raw!r}", source=str(path),
                                      field=spec.record_id_column, expected="a string or integer")
                rid = str(raw)
                if rid in ids:
                    raise ConfigError(f"{label}: record id {rid!r} is also {ids[rid]}",
                                      source=str(path), field=spec.record_id_column,
                                      expected="a unique id per row")
                ids[rid] = label
            operation = spec.operation or cell(spec.operation_column, "str")
            check_operations([operation], source=str(path), field=spec.operation_column
                             or "operation", rows=[label])
            hardware = spec.hardware or cell(spec.hardware_column, "str")
            if system is not None:
                if hardware not in systems:
                    try:
                        systems[hardware] = system(hardware)
                    except ConfigError as exc:
                        raise ConfigError(f"{label}: unknown system {hardware!r}",
                                          source=str(path),
                                          field=spec.hardware_column or "hardware",
                                          expected=exc.expected) from None
                hardware = systems[hardware]
            prov = EvidenceProvenance(source=spec.source, source_revision=spec.source_revision,
                                      importer=IMPORTER, importer_revision=IMPORTER_REVISION,
                                      source_digest=digest, method=spec.method,
                                      raw_record_id=rid)
            records.append(PerformanceRecord(
                subject=spec.subject, operation=operation, hardware=hardware, dtype=dtype, selector=FrozenDict(selector), latency_s=latency,
                provenance=prov))
        if not records:
            raise ConfigError("no data rows", source=str(path))
        return PerformanceDatabase.from_records(
            records, name=spec.name,
            sources=[{"path": path.name, "digest": digest, "rows": len(records),
                      "spec": spec.digest, **({"unused_columns": sorted(unused)}
                                              if unused else {})}])


def spec_columns(spec: TabularImportSpec) -> set[str]:
    """The file columns a spec reads."""
    return {c for c in (spec.latency_column, spec.operation_column, spec.hardware_column,
                        spec.datatype_column, spec.record_id_column, *spec.selector_columns.values())
            if c}
