"""What the Evidence page draws, computed from a snapshot's rows and the one cost path:

- `catalog(store)`: one row per snapshot (source, revision, importer, records, licence);
- `heatmap(db)`: rows per operation family x shape region (log2 bucket of the family's
  interpolation line axis, `evidence.interpolation.SPECS`);
- `series(db, operation, dtype)`: the curves a snapshot holds for a kernel family (one per
  combination of the selectors other than the line axis), largest first;
- `curve(...)`: one curve: measured points, and at sizes inside and outside the measured
  range the answers of three resolvers built like `estimate`'s (roofline only; the
  snapshot's database + interpolation before the roofline; the calibration revision's
  analytic efficiency curves before the roofline), each with latency, achieved TFLOPS
  and GB/s from the same work facts the query carries (`query_spec.work_facts`).
"""

from __future__ import annotations

import math
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc

from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.interpolation import SPECS

CONTEXT_SELECTORS = {"runtime": "runtime", "runtime_revision": "runtime_version",
                     "implementation": "implementation"}
# the licence of the data an importer reads, as its upstream publishes it (the snapshot
# manifest does not record one): ../shared/reference/README.md
UPSTREAM_LICENCES = {"aiconfigurator": "Apache-2.0 (NVIDIA AIConfigurator)",
                     "vidur": "MIT (microsoft/vidur)"}
CURVE_FAMILIES = ("gemm", "attention")


def catalog(manifests: list[dict]) -> list[dict]:
    """One row per snapshot manifest: digest, name, records, importer(s), source
    revisions, tables, skipped tables and the upstream licence."""
    out = []
    for m in manifests:
        sources = [s for s in m.get("sources", []) if "skipped" not in s]
        importer = (m.get("name") or "").split(":", 1)[0]
        revisions = sorted({s.get("revision") or s.get("version") or "" for s in sources} - {""})
        out.append({"digest": m["digest"], "name": m.get("name", ""), "rows": m["rows"],
                    "importer": importer, "source_revisions": revisions,
                    "tables": len(sources),
                    "skipped": sum(1 for s in m.get("sources", []) if "skipped" in s),
                    "licence": (UPSTREAM_LICENCES.get(importer)
                                or "not recorded in the manifest")})
    return out


def line_axis(operation: str) -> str | None:
    spec = SPECS.get(operation)
    return spec.axes[0].name if spec else None


def read(db: PerformanceDatabase, columns: list[str] | None = None, expr=None) -> pa.Table:
    """The rows matching `expr` (a pyarrow.compute expression), only `columns`: a
    snapshot not yet read reads just those from its file (row-group statistics skip the
    rest), so a page over a 3-million-row snapshot never loads it whole."""
    names = [*db.selector_columns, "operation", "hardware", "dtype", "latency_s", "record_id"]
    cols = [c for c in (columns or names) if c in names]
    if db.is_lazy:
        import pyarrow.dataset as ds

        return ds.dataset(db._lazy.path, format="parquet").to_table(columns=cols, filter=expr)
    table = db.table if expr is None else db.table.filter(expr)
    return table.select(cols)


def heatmap(db: PerformanceDatabase) -> dict:
    """{"families": [label...], "regions": [2**i ...], "counts": [[rows]]}: rows per
    (operation, dtype) family and log2 bucket of its line axis."""
    axes = sorted({f"sel.int.{spec.axes[0].name}" for spec in SPECS.values()})
    table = read(db, ["operation", "dtype", "latency_s", *axes])
    fams: dict[tuple[str, str], Counter] = {}
    for (op,), part in _groups(table, ["operation"]):
        axis = line_axis(op)
        col = f"sel.int.{axis}" if axis else None
        if col is None or col not in part.column_names:
            continue
        grouped = part.group_by(["dtype", col]).aggregate([("latency_s", "count")])
        for row in grouped.to_pylist():
            value = row[col]
            if value is None or value <= 0:
                continue
            key = (f"{op} {row['dtype']} ({axis})", op)
            fams.setdefault(key, Counter())[int(math.log2(value))] += row["latency_s_count"]
    if not fams:
        return {"families": [], "regions": [], "counts": []}
    lo = min(min(c) for c in fams.values())
    hi = max(max(c) for c in fams.values())
    regions = list(range(lo, hi + 1))
    keys = sorted(fams)
    return {"families": [k[0] for k in keys], "regions": [2 ** r for r in regions],
            "counts": [[fams[k].get(r, 0) for r in regions] for k in keys]}


def _groups(table: pa.Table, keys: list[str]):
    for values in table.select(keys).group_by(keys).aggregate([]).to_pylist():
        mask = None
        for k in keys:
            m = pc.equal(table[k], values[k])
            mask = m if mask is None else pc.and_(mask, m)
        yield tuple(values[k] for k in keys), table.filter(mask)


def _family_rows(db: PerformanceDatabase, operation: str, dtype: str, hardware: str | None):
    expr = (pc.field("operation") == operation) & (pc.field("dtype") == dtype)
    if hardware:
        expr = expr & (pc.field("hardware") == hardware)
    part = _mark_ties(read(db, None, expr), operation)
    cols = [c for c in part.column_names if c.startswith("sel.")
            and part[c].null_count < part.num_rows]
    return part, cols


def _mark_ties(part: pa.Table, operation: str) -> pa.Table:
    """A tied follower (`q_tokens` of a prefill attention row equals its `kv_len`) moves
    with the line axis: its column becomes text, "=kv_len" where tied, else the value
    (a decode row's q_tokens = 1 stays a fixed selector of its curve)."""
    spec = SPECS.get(operation)
    for follower, leader in spec.ties if spec else ():
        f, lead = f"sel.int.{follower}", f"sel.int.{leader}"
        if f not in part.column_names or lead not in part.column_names:
            continue
        tied = pc.fill_null(pc.equal(part[f], part[lead]), False)
        text = pc.if_else(tied, pa.scalar(f"={leader}"), pc.cast(part[f], pa.string()))
        part = part.set_column(part.column_names.index(f), f, text)
    return part


def _dims(key: dict, axis: str, x: int) -> dict:
    """The query dims of a curve's point at `x`: its fixed selectors, the axis, and the
    tied followers at the axis' value."""
    out = {}
    for k, v in key.items():
        if k in CONTEXT_SELECTORS or k == "hardware":
            continue
        if isinstance(v, str) and v == f"={axis}":
            out[k] = x
        elif isinstance(v, str) and k in {f for spec in SPECS.values() for f, _ in spec.ties}:
            out[k] = int(v)
        else:
            out[k] = v
    out[axis] = x
    return out


def _fixed_columns(operation: str, cols: list[str]) -> list[str]:
    spec = SPECS[operation]
    return [c for c in cols if c != f"sel.int.{spec.axes[0].name}"]


def series(db: PerformanceDatabase, operation: str, dtype: str,
           hardware: str | None = None) -> list[dict]:
    """The curves of a family: {"key": {selector: value}, "label", "points"}, most
    points first."""
    if operation not in SPECS:
        return []
    part, cols = _family_rows(db, operation, dtype, hardware)
    fixed = _fixed_columns(operation, cols)
    if not part.num_rows:
        return []
    grouped = part.group_by(fixed + ["hardware"]).aggregate([("latency_s", "count")]).to_pylist()
    out = []
    for row in grouped:
        key = {"hardware": row["hardware"]}
        key.update({c.split(".", 2)[2]: row[c] for c in fixed if row[c] is not None})
        out.append({"key": key, "label": series_label(key), "points": row["latency_s_count"]})
    out.sort(key=lambda s: (-s["points"], s["label"]))
    return out


def series_label(key: dict) -> str:
    order = ["hardware", "runtime", "runtime_revision", "implementation"]
    rest = sorted(k for k in key if k not in order)
    return " ".join(f"{key[k]}" if k in order else f"{k}={key[k]}"
                    for k in order + rest if k in key)


def _grid(lo: float, hi: float, n: int = 33) -> list[int]:
    """Integer sizes, geometric from lo/4 to hi*4 (the curve leaves the measured range on
    both sides, where the validity domain ends)."""
    a, b = math.log(max(1.0, lo / 4)), math.log(hi * 4)
    return sorted({max(1, round(math.exp(a + (b - a) * i / (n - 1)))) for i in range(n)})


def curve(db: PerformanceDatabase, snapshot: str, operation: str, dtype: str, key: dict,
          resolvers: dict, points: int = 33) -> dict:
    """Measured points of the curve `key` and the answers of `resolvers`
    ({name: CostResolver}) along its line axis. Sizes in the axis' unit, latency in s,
    throughput in TFLOP/s and GB/s."""
    from perfcast.evidence.query_spec import build_query, work_facts

    spec = SPECS[operation]
    axis = spec.axes[0].name
    ties = [f for f, _ in spec.ties if key.get(f) == f"={axis}"]
    part, cols = _family_rows(db, operation, dtype, key.get("hardware"))
    mask = None
    for name, value in key.items():
        if name == "hardware":
            continue
        col = next((c for c in cols if c.split(".", 2)[2] == name), None)
        if col is None:
            raise KeyError(name)
        m = pc.equal(part[col], value)
        mask = m if mask is None else pc.and_(mask, m)
    rows = part.filter(mask) if mask is not None else part
    xs = rows[f"sel.int.{axis}"].to_pylist()
    lat = rows["latency_s"].to_pylist()
    ids = rows["record_id"].to_pylist()
    context = {CONTEXT_SELECTORS[k]: v for k, v in key.items() if k in CONTEXT_SELECTORS}

    def rates(x: int, latency: float) -> tuple[float | None, float | None]:
        w = work_facts(operation, dtype, _dims(key, axis, x))
        if not w or not latency:
            return None, None
        return (w["flops"] / latency / 1e12,
                (w["bytes_read"] + w["bytes_written"]) / latency / 1e9)

    measured = []
    for x, y, rid in sorted(zip(xs, lat, ids)):
        tf, gbs = rates(x, y)
        measured.append({"x": x, "latency_s": y, "tflops": tf, "gb_per_s": gbs,
                         "record_id": rid})
    domain = [min(xs), max(xs)] if xs else None
    predicted = {}
    grid = _grid(domain[0], domain[1], points) if domain else []
    for name, resolver in resolvers.items():
        pts = []
        for x in grid:
            q = build_query({"operation": operation, "dtype": dtype, **context,
                             "hardware": key.get("hardware"),
                             "dims": _dims(key, axis, x)},
                            source="workbench curve")
            res = resolver.resolve(q)
            est = res.estimate
            tf, gbs = rates(x, est.latency_s)
            pts.append({"x": x, "latency_s": est.latency_s, "tflops": tf, "gb_per_s": gbs,
                        "method": est.method.value, "provider": est.provider})
        predicted[name] = pts
    return {"snapshot": snapshot, "operation": operation, "dtype": dtype, "key": key,
            "axis": axis, "tied": ties, "domain": domain, "measured": measured,
            "predicted": predicted}


def neighbours(db: PerformanceDatabase, spec: dict, hardware: str, n: int = 8) -> list[dict]:
    """The `n` rows of the query's family (operation, dtype, hardware, and the string
    selectors and context the query names) nearest to its integer dims (sum of
    |log(row / query)| over the dims both have); each with record id and latency."""
    from perfcast.core.dtypes import parse_dtype

    dtype = parse_dtype(spec.get("dtype", "bf16"), field="dtype").value
    t = read(db, None, (pc.field("operation") == spec.get("operation", ""))
             & (pc.field("dtype") == dtype) & (pc.field("hardware") == hardware))
    mask = pc.equal(t["hardware"], hardware)
    dims = dict(spec.get("dims") or {})
    strings = {k: v for k, v in dims.items() if isinstance(v, str)}
    for field_name, sel in (("runtime", "runtime"), ("runtime_version", "runtime_revision"),
                            ("implementation", "implementation")):
        if spec.get(field_name):
            strings[sel] = spec[field_name]
    for k, v in strings.items():
        col = f"sel.str.{k}"
        if col in t.column_names:
            mask = pc.and_(mask, pc.equal(t[col], v))
    part = t.filter(mask)
    ints = {k: v for k, v in dims.items() if isinstance(v, (int, float))
            and not isinstance(v, bool) and f"sel.int.{k}" in part.column_names and v > 0}
    if not part.num_rows:
        return []
    cols = {k: part[f"sel.int.{k}"].to_pylist() for k in ints}
    lat, ids = part["latency_s"].to_pylist(), part["record_id"].to_pylist()
    scored = []
    for i in range(part.num_rows):
        d = 0.0
        for k, q in ints.items():
            v = cols[k][i]
            d += abs(math.log(v / q)) if v else 50.0
        scored.append((d, i))
    scored.sort()
    out = []
    for d, i in scored[:n]:
        out.append({"record_id": ids[i], "latency_s": lat[i], "distance": d,
                    "dims": {k: cols[k][i] for k in ints}})
    return out
