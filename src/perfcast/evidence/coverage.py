"""What a database covers: rows per operation, dtype and runtime selectors, with the
range of every integer axis."""

from __future__ import annotations

from perfcast.evidence.database import PerformanceDatabase, parse_selector_column

GROUP_SELECTORS = ("runtime", "runtime_revision", "implementation", "nccl_version")


def coverage(db: PerformanceDatabase) -> list[dict]:
    table = db.table
    keys = ["operation", "hardware", "dtype"]
    keys += [c for c in (f"sel.str.{k}" for k in GROUP_SELECTORS) if c in table.column_names]
    ints = [c for c in db.selector_columns if parse_selector_column(c)[1] == "int"]
    aggs = [("latency_s", "count"), ("latency_s", "min"), ("latency_s", "max")]
    aggs += [(c, op) for c in ints for op in ("min", "max")]
    grouped = table.group_by(keys).aggregate(aggs).to_pylist()
    out = []
    for row in grouped:
        entry = {k.removeprefix("sel.str."): row[k] for k in keys if row[k] is not None}
        entry["rows"] = row["latency_s_count"]
        entry["latency_s"] = [row["latency_s_min"], row["latency_s_max"]]
        axes = {}
        for c in ints:
            lo, hi = row[f"{c}_min"], row[f"{c}_max"]
            if lo is not None:
                axes[parse_selector_column(c)[0]] = [lo, hi]
        entry["axes"] = axes
        out.append(entry)
    out.sort(key=lambda e: tuple(str(e.get(k, "")) for k in
                                 ("operation", "dtype", *GROUP_SELECTORS)))
    return out
