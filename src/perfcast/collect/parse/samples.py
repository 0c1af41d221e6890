"""Profiler samples -> per-kernel tables: grouping, statistics, averaged counters.

Every parser (Ascend kernel_details/op_summary, PyTorch traces) yields `KernelSample`s;
`aggregate` groups them by kernel type and key columns; `merge_into_database` writes one
`{KernelType}.csv` per type (new groups replace old rows with the same key, other rows
stay) -- all files staged before any is renamed, so a failure writes nothing.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from perfcast.collect.tables import (
    AVG,
    COUNT,
    KEY_COLUMNS,
    MEDIAN,
    STD,
    KernelTable,
    SampleStats,
    csv_name,
    format_number,
    read_table,
    write_tables,
)
from perfcast.core.frozen import FrozenDict


@dataclass(frozen=True)
class KernelSample:
    """One profiled call of one kernel."""

    kernel_type: str
    key: FrozenDict[str, str]          # values of KEY_COLUMNS (+ runtime columns)
    duration_us: float
    counters: FrozenDict[str, float] = field(default_factory=FrozenDict)
    source: str = ""
    row: int = 0


def aggregate(samples: Iterable[KernelSample]) -> dict[str, KernelTable]:
    """Group samples by (kernel type, key) into tables with average/median/std/count
    and `Average <counter>` columns (mean over the samples that report the counter)."""
    groups: dict[str, dict[FrozenDict, list[KernelSample]]] = defaultdict(dict)
    extra_keys: dict[str, list[str]] = defaultdict(list)
    counters: dict[str, list[str]] = defaultdict(list)
    for s in samples:
        by_key = groups[s.kernel_type]
        members = by_key.get(s.key)  # FrozenDict keys: hashable, sorted
        if members is None:
            members = by_key[s.key] = []
            extra_keys[s.kernel_type] += [k for k in s.key if k not in KEY_COLUMNS
                                          and k not in extra_keys[s.kernel_type]]
        if s.counters.keys() - set(counters[s.kernel_type]):
            counters[s.kernel_type] += [c for c in s.counters if c not in counters[s.kernel_type]]
        members.append(s)
    tables = {}
    for ktype, by_key in groups.items():
        header = list(KEY_COLUMNS) + [AVG, MEDIAN, STD, COUNT]
        header += [f"Average {c}" for c in counters[ktype]] + extra_keys[ktype]
        rows = []
        for members in by_key.values():
            stats = SampleStats.of([m.duration_us for m in members])
            row = {k: members[0].key.get(k, "") for k in list(KEY_COLUMNS) + extra_keys[ktype]}
            row.update({AVG: format_number(stats.mean_us), MEDIAN: format_number(stats.median_us),
                        STD: format_number(stats.std_us), COUNT: str(stats.count)})
            for c in counters[ktype]:
                values = [m.counters[c] for m in members if c in m.counters]
                row[f"Average {c}"] = format_number(statistics.fmean(values)) if values else ""
            rows.append(row)
        rows.sort(key=lambda r: tuple(r.get(c, "") for c in KEY_COLUMNS))
        tables[ktype] = KernelTable(kernel_type=ktype, header=header, rows=rows)
    return tables


def merge_into_database(tables: Mapping[str, KernelTable], database_path: Path,
                        extra_files: Mapping[Path, str] | None = None) -> list[Path]:
    """Write each table to `database_path/{csv_name(type)}`, merging with an existing file:
    a new group replaces the existing row with the same key, other existing rows stay.
    `extra_files` (e.g. the collection manifest) are staged in the same atomic batch."""
    root = Path(database_path)
    out = []
    for ktype, new in tables.items():
        path = root / csv_name(ktype)
        if path.is_file():
            old = read_table(path, ktype)
            old.ensure_columns(new.header)
            fresh = {old.key_of(r): r for r in new.rows}
            kept = [r for r in old.rows if old.key_of(r) not in fresh]
            merged = KernelTable(ktype, old.header, kept + new.rows, path)
        else:
            merged = KernelTable(ktype, list(new.header), list(new.rows), path)
        out.append(merged)
    return write_tables(out, extra_files)
