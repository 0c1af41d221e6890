"""Plausibility screen on measured evidence: rows (and answers) no deployment can run.

Two physical bounds, both from the device profile's peaks (no efficiency):

* **below the bound**: a latency shorter than the work's roofline time (FLOPs at the
  matrix peak, bytes at peak memory bandwidth) cannot be the deployment's kernel (the
  collector's data stayed in cache, or the row is mislabelled);
* **implausibly slow**: a latency more than `SLOW_FACTOR` times the roofline time
  plus one kernel launch (the device's `launch_overhead_us`) is mostly not the
  kernel's work (collector overhead, a wrong unit, a throttled run). The factor is a
  declared screening threshold, not a fitted number: an efficient kernel at small
  work runs at about one launch floor, and even a poorly tiled one within a few times
  its roofline.

`screen_table(table, system)` counts both per (operation, dtype, implementation) for
`evidence import` and `evidence coverage`; `screen_latency` judges one answer for the
estimate's assumptions. Operations without a work model here (see
`work_model.ROOFLINES`) and sliding-window attention rows (the work model counts full
causal pairs) are not screened and are counted as such.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from perfcast.evidence.database import parse_selector_column
from perfcast.evidence.work_model import ROOFLINES

SLOW_FACTOR = 10.0


@dataclass(frozen=True)
class ScreenResult:
    operation: str
    dtype: str
    implementation: str
    rows: int
    screened: int           # rows with a work model
    below_bound: int
    too_slow: int
    worst_slow_ratio: float  # largest latency / (roofline + launch) among the rows


def _int_axes(table) -> dict[str, np.ndarray]:
    axes = {}
    for c in table.column_names:
        if c.startswith("sel."):
            name, kind = parse_selector_column(c)
            if kind == "int":
                axes[name] = table.column(c).to_numpy(zero_copy_only=False).astype(float)
    return axes


def _str_column(table, name: str) -> list:
    col = f"sel.str.{name}"
    return table.column(col).to_pylist() if col in table.column_names else [""] * table.num_rows


def screen_rows(table, system_for) -> dict[str, np.ndarray]:
    """Per row of a measured table: `screened` (a work model applies), `below` (faster
    than the roofline), `slow` (slower than SLOW_FACTOR x roofline + launch) and `ratio`
    (latency / (roofline + launch)). `system_for(hardware)` gives the row's System, or
    None for rows of an unknown system (not screened)."""
    import pyarrow.compute as pc

    n = table.num_rows
    out = {k: np.zeros(n, dtype=bool) for k in ("screened", "below", "slow")}
    out["ratio"] = np.zeros(n)
    ops = np.asarray(table.column("operation").to_pylist(), dtype=object)
    dtypes = np.asarray(table.column("dtype").to_pylist(), dtype=object)
    hardware = np.asarray(table.column("hardware").to_pylist() if "hardware" in
                          table.column_names else [""] * n, dtype=object)
    lat = table.column("latency_s").to_numpy(zero_copy_only=False).astype(float)
    for hw, op, dtype in sorted(set(zip(hardware.tolist(), ops.tolist(), dtypes.tolist()))):
        system = system_for(hw) if op in ROOFLINES else None
        if system is None:
            continue
        idx = np.flatnonzero((hardware == hw) & (ops == op) & (dtypes == dtype))
        roof = _roofline(op, dtype, table.take(pc.cast(pa.array(idx), pa.int64())), system)
        if roof is None:
            continue
        ok = np.isfinite(roof) & (roof > 0)
        roof = np.where(ok, roof, 0.0)
        ratio = np.where(ok, lat[idx] / (roof + system.device.launch_overhead_s), 0.0)
        out["screened"][idx] = ok
        out["below"][idx] = ok & (lat[idx] < roof * (1 - 1e-9))
        out["slow"][idx] = ok & (ratio > SLOW_FACTOR)
        out["ratio"][idx] = ratio
    return out


def screen_table(table, system) -> list[ScreenResult]:
    """Both bounds per (operation, dtype, implementation) of a measured table."""
    flags = screen_rows(table, lambda hw: system)
    ops = table.column("operation").to_pylist()
    dtypes = table.column("dtype").to_pylist()
    impls = [i or "" for i in _str_column(table, "implementation")]
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(ops, dtypes, impls)):
        groups.setdefault(key, []).append(i)
    out = []
    for (op, dtype, impl), rows in sorted(groups.items()):
        idx = np.asarray(rows)
        out.append(ScreenResult(op, dtype, impl, len(rows), int(flags["screened"][idx].sum()),
                                int(flags["below"][idx].sum()), int(flags["slow"][idx].sum()),
                                float(flags["ratio"][idx].max())))
    return out


def _roofline(op: str, dtype: str, part, system):
    fn = ROOFLINES.get(op)
    if fn is None or part.num_rows == 0:
        return None
    axes = _int_axes(part)
    try:
        roof = np.asarray(fn(axes, {}, dtype, system), dtype=float)
    except (KeyError, LookupError, ValueError):
        return None
    if "window" in axes:   # the work model counts full causal pairs: no sliding windows
        roof = np.where(axes["window"] > 0, np.nan, roof)
    return roof


def screen_latency(latency_s: float, roofline_s: float, launch_s: float) -> str:
    """'' when plausible, else why not (for an estimate's assumptions)."""
    if roofline_s <= 0:
        return ""
    ratio = latency_s / (roofline_s + launch_s)
    if ratio > SLOW_FACTOR:
        return (f"implausibly slow evidence: {latency_s * 1e6:.1f} us is {ratio:.0f}x its "
                f"roofline time plus one launch ({(roofline_s + launch_s) * 1e6:.1f} us; "
                f"screen threshold {SLOW_FACTOR:g}x)")
    return ""


def summary_line(results: list[ScreenResult]) -> str:
    """One line for an import report: counts of flagged rows per table group."""
    flagged = [r for r in results if r.below_bound or r.too_slow]
    if not flagged:
        screened = sum(r.screened for r in results)
        return f"plausibility screen: {screened} rows screened, none flagged"
    parts = [f"{r.operation}/{r.dtype}/{r.implementation or '-'}: "
             f"{r.too_slow} slower than {SLOW_FACTOR:g}x roofline+launch, "
             f"{r.below_bound} faster than the roofline" for r in flagged]
    return "plausibility screen flagged " + "; ".join(parts)
