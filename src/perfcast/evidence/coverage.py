"""What a database covers: rows per operation, dtype and runtime selectors, with the
range of every integer axis and, given the systems, the plausibility screen's counts
(`evidence.plausibility`)."""

from __future__ import annotations

from perfcast.evidence.database import PerformanceDatabase, parse_selector_column

GROUP_SELECTORS = ("runtime", "runtime_revision", "implementation", "nccl_version")


def coverage(db: PerformanceDatabase, system_for=None) -> list[dict]:
    """`system_for(hardware)` -> System (or None): adds `screen` per group: rows screened,
    rows faster than the roofline, rows slower than the screen's factor."""
    import pyarrow as pa

    table = db.table
    if system_for is not None:
        from perfcast.evidence.plausibility import screen_rows

        flags = screen_rows(table, system_for)
        for name in ("screened", "below", "slow"):
            table = table.append_column(f"_screen_{name}", pa.array(flags[name].astype("int64")))
    keys = ["operation", "hardware", "dtype"]
    keys += [c for c in (f"sel.str.{k}" for k in GROUP_SELECTORS) if c in table.column_names]
    ints = [c for c in db.selector_columns if parse_selector_column(c)[1] == "int"]
    aggs = [("latency_s", "count"), ("latency_s", "min"), ("latency_s", "max")]
    aggs += [(c, op) for c in ints for op in ("min", "max")]
    if system_for is not None:
        aggs += [(f"_screen_{n}", "sum") for n in ("screened", "below", "slow")]
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
        if system_for is not None:
            entry["screen"] = {"screened": row["_screen_screened_sum"],
                               "below_roofline": row["_screen_below_sum"],
                               "slower_than_factor": row["_screen_slow_sum"]}
        out.append(entry)
    out.sort(key=lambda e: tuple(str(e.get(k, "")) for k in
                                 ("operation", "dtype", *GROUP_SELECTORS)))
    return out
