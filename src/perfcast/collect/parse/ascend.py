"""Ascend profiler output: `kernel_details*.csv` (torch_npu profiler) and msprof
`op_summary_*.csv`, recognised by their header, not their file name.

kernel_details: `Name, Type, OP State, Accelerator Core, Start Time(us), Duration(us),
Wait Time(us), Block Dim, ..., Input Shapes, Input Data Types, Input Formats, Output
Shapes, Output Data Types, Output Formats` + counters (`aicore_time(us)`, `aic_mac_ratio`, ...).
op_summary: `Op Name, OP Type, OP State, Task Type, Task Start Time(us), Task Duration(us),
...` with the same shape and counter columns.

Counters are every numeric column that is not a bookkeeping column; each is averaged
into `Average <name>`. A malformed row (missing type, bad duration, bad shape, bad
counter) fails the whole parse with file, row and column named.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from perfcast.collect.parse.samples import KernelSample
from perfcast.collect.tables import (
    CORE,
    INPUT_SHAPES,
    OUTPUT_SHAPES,
    SHAPE_COLUMNS,
    STATE,
    parse_float,
    parse_shapes,
    strip_quotes,
)
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict


@dataclass(frozen=True)
class AscendLayout:
    """Which header columns mean what in one Ascend CSV flavour."""

    name: str
    type_column: str
    duration_column: str
    name_column: str
    core_column: str


KERNEL_DETAILS = AscendLayout("kernel_details", "Type", "Duration(us)", "Name", CORE)
OP_SUMMARY = AscendLayout("op_summary", "OP Type", "Task Duration(us)", "Op Name", "Task Type")
LAYOUTS = (KERNEL_DETAILS, OP_SUMMARY)

# Columns that describe a call rather than measure it: never averaged as counters.
BOOKKEEPING = frozenset({
    "Step Id", "Device_id", "Model ID", "Task ID", "Stream ID", "Infer ID", "Name", "Type",
    "Op Name", "OP Type", "OP State", "Accelerator Core", "Task Type", "Start Time(us)",
    "Task Start Time(us)", "Duration(us)", "Task Duration(us)", "Wait Time(us)",
    "Task Wait Time(us)", "Block Dim", "Block Num", "Mix Block Dim", "Mix Block Num",
    "HF32 Eligible", "Context ID", *SHAPE_COLUMNS,
})


def detect_layout(header: list[str]) -> AscendLayout | None:
    cols = set(header)
    for layout in LAYOUTS:
        if {layout.type_column, layout.duration_column} <= cols:
            return layout
    return None


def read_header(path: Path) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            return [h.strip() for h in next(csv.reader(fh), [])]
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


def parse_ascend_csv(path: Path, layout: AscendLayout | None = None) -> Iterator[KernelSample]:
    """Samples of one kernel_details / op_summary file."""
    path = Path(path)
    src = str(path)
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        layout = layout or detect_layout(header)
        if layout is None:
            raise ConfigError("is neither a kernel_details nor an op_summary CSV", source=src,
                              expected="columns 'Type, Duration(us)' or "
                                       "'OP Type, Task Duration(us)'")
        missing = [c for c in (INPUT_SHAPES,) if c not in header]
        if missing:
            raise ConfigError(f"{layout.name} CSV lacks column(s) {', '.join(missing)}",
                              source=src, expected="shape columns (profile with record_shapes)")
        counters = [c for c in header if c not in BOOKKEEPING and c]
        keys: dict[tuple, FrozenDict] = {}  # identical key cells share one validated key
        for lineno, values in enumerate(reader, start=2):
            if not values or not any(v.strip() for v in values):
                continue
            if len(values) > len(header):
                raise ConfigError(f"has {len(values)} cells, the header {len(header)}",
                                  source=f"{src}, row {lineno}", expected="one cell per column")
            row = dict(zip(header, values))
            yield _sample(row, layout, counters, src, lineno, keys)


def _key(row: dict[str, str], layout: AscendLayout, src: str, lineno: int,
         cache: dict[tuple, FrozenDict]) -> FrozenDict:
    cells = (row.get(STATE), row.get(layout.core_column)) + tuple(row.get(c) for c in SHAPE_COLUMNS)
    key = cache.get(cells)
    if key is not None:
        return key
    built = {STATE: (row.get(STATE) or "").strip(),
             CORE: (row.get(layout.core_column) or "").strip()}
    for col in SHAPE_COLUMNS:
        text = strip_quotes(row.get(col) or "")
        text = "" if text.upper() in ("N/A", "NA") else text
        if col in (INPUT_SHAPES, OUTPUT_SHAPES):
            parse_shapes(text, source=src, row=lineno, column=col)  # validate
        built[col] = text
    key = cache[cells] = FrozenDict(built)
    return key


def _sample(row: dict[str, str], layout: AscendLayout, counters: list[str], src: str,
            lineno: int, key_cache: dict[tuple, FrozenDict]) -> KernelSample:
    ktype = (row.get(layout.type_column) or "").strip()
    if not ktype:
        raise ConfigError("is empty", source=f"{src}, row {lineno}", field=layout.type_column,
                          expected="a kernel type")
    duration = parse_float(row.get(layout.duration_column), source=src, row=lineno,
                           column=layout.duration_column)
    key = _key(row, layout, src, lineno, key_cache)
    values = {}
    for c in counters:
        v = parse_float(row.get(c), source=src, row=lineno, column=c, allow_empty=True)
        if v is not None:
            values[c] = v
    return KernelSample(kernel_type=ktype, key=key, duration_us=float(duration),
                        counters=FrozenDict(values), source=src, row=lineno)
