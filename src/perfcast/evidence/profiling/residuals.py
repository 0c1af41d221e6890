"""Measured uncertainty of the profiling path's non-exact answers.

Every interpolated answer is sized by leave-one-out on the CSV rows it interpolates
between: the rows of the same kernel whose every attribute but the interpolation axis
equals the query's (the `points` of `InterpolatingDataSource`). Each interior row is
predicted from its two neighbours with the same rule (linear, or in sqrt space) and
`rel_std` is the 68.27th percentile of |ln(predicted / measured)| among rows held out at
a comparable distance (`ResidualTable`, distance = fraction of the bracketing cell).
The alpha-beta communication fit is held out the same way (refit without the row).
`confidence = confidence_from_rel_std(rel_std)`; too few rows give `rel_std=None` and an
`uncertainty_reason`. The figures travel in `QueryResult.details`:

| key                   | meaning                                                   |
|-----------------------|-----------------------------------------------------------|
| `rel_std`             | 1-sigma relative error (None: unknown)                    |
| `uncertainty_kind`    | `samples` (exact row), `loo`, `slope`, `composite`, `unknown` |
| `loo_samples`         | how many held-out rows measured it                        |
| `uncertainty_method`  | how it was measured                                       |
| `uncertainty_reason`  | why it is unknown                                         |
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from perfcast.evidence.interpolation_residuals import (
    LOO_MIN_SAMPLES,
    ResidualTable,
    confidence_from_rel_std,
)

LOO_LINE_METHOD = ("leave-one-out over the {n} CSV rows of this kernel that differ only in "
                   "{axis}: each interior row predicted from its neighbours by the same "
                   "interpolation; 68.27th percentile of |ln(predicted/measured)| at a "
                   "comparable distance")
ALPHA_BETA_METHOD = ("leave-one-out over the {n} rows of this collective (same device "
                     "count and tier): each interior row predicted by the alpha-beta fit of "
                     "the others, clamped to its neighbours; 68.27th percentile of "
                     "|ln(predicted/measured)|")
DTYPE_SCALE_METHOD = ("the byte-ratio rule checked on the {n} output shapes of this kernel "
                      "measured in two dtypes; 68.27th percentile of |ln(predicted/measured)|")

_CACHE: dict[tuple, ResidualTable] = {}  # content key -> table (bounded)


def _cached(key: tuple, make: Callable[[], ResidualTable]) -> ResidualTable:
    found = _CACHE.get(key)
    if found is None:
        if len(_CACHE) >= 4096:
            _CACHE.clear()
        found = _CACHE[key] = make()
    return found


def cell_distance(x: float, lo: float, hi: float) -> float:
    """Distance to the nearest bracketing point as a fraction of the cell (0..0.5)."""
    return min(x - lo, hi - x) / (hi - lo) if hi > lo else 0.0


def line_loo_errors(xs: Sequence[float], ys: Sequence[float],
                    transform: Callable[[float], float] = float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, distance, ln(predicted/measured)) of every interior row of one line, each
    predicted by linear interpolation (in `transform(x)`) between its two neighbours,
    never from itself. Equal x: the first row stands for the point (as `bracket`)."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    x, first = np.unique(x, return_index=True)  # sorted; first row per x
    y = y[first]
    if len(x) < 3:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    t = np.array([transform(v) for v in x]) if transform is not float else x
    w = (t[1:-1] - t[:-2]) / (t[2:] - t[:-2])
    pred = (1.0 - w) * y[:-2] + w * y[2:]
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.log(pred / y[1:-1])
    dist = np.minimum(x[1:-1] - x[:-2], x[2:] - x[1:-1]) / (x[2:] - x[:-2])
    return x[1:-1], dist, err


def line_loo(xs: Sequence[float], ys: Sequence[float],
             transform: Callable[[float], float] = float) -> ResidualTable:
    """The residual table of `line_loo_errors`."""
    _x, dist, err = line_loo_errors(xs, ys, transform)
    return ResidualTable.from_samples(dist, err)


def alpha_beta_loo(sizes: np.ndarray, lats: np.ndarray) -> ResidualTable:
    """Leave-one-out of the clamped alpha-beta fit: each interior row (by size) refit
    without itself, predicted, clamped to its two neighbours."""
    order = np.argsort(sizes, kind="stable")
    s, lat = sizes[order], lats[order]
    n = len(s)
    if n < 4:  # an interior point and a line through at least two others
        return ResidualTable(max(n - 2, 0))
    dist, err = [], []
    design = np.column_stack([np.ones_like(s), s])
    for i in range(1, n - 1):
        keep = np.arange(n) != i
        if s[i - 1] == s[i] or s[i + 1] == s[i]:
            continue
        a, b = np.linalg.lstsq(design[keep], lat[keep], rcond=None)[0]
        pred = min(max(a + b * s[i], min(lat[i - 1], lat[i + 1])), max(lat[i - 1], lat[i + 1]))
        if pred > 0 and lat[i] > 0:
            err.append(math.log(pred / lat[i]))
            dist.append(cell_distance(s[i], s[i - 1], s[i + 1]))
    return ResidualTable.from_samples(dist, err)


STD_COLUMNS = ("Std Duration(us)", "Profiling Std Duration(us)")


def measured_details(row=None) -> dict:
    """An exact CSV row: its repeat spread (`Std Duration(us)` / average) when the CSV
    has one, else 0.0 (one averaged duration, no spread recorded)."""
    if row is not None and row.latency_us > 0:
        for col in STD_COLUMNS:
            std = row.number(col)
            if std is not None and std >= 0:
                return {"rel_std": std / row.latency_us, "uncertainty_kind": "samples",
                        "loo_samples": 0,
                        "uncertainty_method": f"repeat spread of the CSV row ({col} / average)"}
    return {"rel_std": 0.0, "uncertainty_kind": "samples", "loo_samples": 0,
            "uncertainty_method": "exact CSV row (one averaged duration, no spread recorded)"}


def table_details(table: ResidualTable, distance: float, method: str) -> dict:
    """`details` entries of an answer sized by `table` at `distance`."""
    if not table.known:
        return unknown_details(f"{table.count} leave-one-out errors ({method.split(':')[0]}); "
                               f"needs {LOO_MIN_SAMPLES}", table.count)
    return {"rel_std": table.sigma_at(distance), "uncertainty_kind": "loo",
            "loo_samples": table.count, "uncertainty_method": method}


def unknown_details(reason: str, samples: int = 0) -> dict:
    return {"rel_std": None, "uncertainty_kind": "unknown", "loo_samples": samples,
            "uncertainty_reason": reason}


def confidence_of(details: dict) -> float:
    return confidence_from_rel_std(details.get("rel_std"))


def line_details(key: tuple, xs: Sequence[float], ys: Sequence[float], x: float,
                 lo: float, hi: float, axis: str, transform: str = "linear",
                 fn: Callable[[float], float] = float) -> dict:
    """LOO details for an interpolation at `x` between `lo` and `hi` on the given line
    (`key`: a content key of the line, e.g. CSV digest + row indices)."""
    table = _cached(("line", transform, *key), lambda: line_loo(xs, ys, fn))
    n = len(set(xs))
    return table_details(table, cell_distance(x, lo, hi),
                         LOO_LINE_METHOD.format(n=n, axis=axis))


def alpha_beta_details(key: tuple, sizes: np.ndarray, lats: np.ndarray, x: float,
                       lo: float, hi: float) -> dict:
    table = _cached(("alpha_beta", *key), lambda: alpha_beta_loo(sizes, lats))
    return table_details(table, cell_distance(x, lo, hi),
                         ALPHA_BETA_METHOD.format(n=len(sizes)))


def dtype_scale_details(key: tuple, pairs: Callable[[], list[float]]) -> dict:
    """Residuals of byte-ratio dtype scaling: `pairs()` gives ln(scaled/measured) for
    every shape the kernel's CSV holds in two dtypes."""
    def make() -> ResidualTable:
        errs = pairs()
        return ResidualTable.from_samples(np.zeros(len(errs)), errs)

    table = _cached(("dtype_scale", *key), make)
    if not table.known:
        return unknown_details(f"dtype byte-ratio scaling: {table.count} shapes of this kernel "
                               f"are measured in two dtypes (needs {LOO_MIN_SAMPLES})",
                               table.count)
    return table_details(table, 0.0, DTYPE_SCALE_METHOD.format(n=table.count))


def combine(parts: Sequence[tuple[float, dict]]) -> dict:
    """Uncertainty of a sum of independently sized latencies [(latency_us, details)]:
    absolute 1-sigmas add in quadrature. Unknown if any part is unknown."""
    total = sum(lat for lat, _ in parts)
    var, samples = 0.0, 0
    for lat, d in parts:
        rel = d.get("rel_std")
        if rel is None:
            return unknown_details("sub-kernel: " + str(d.get("uncertainty_reason",
                                                              "uncertainty unknown")))
        var += (lat * rel) ** 2
        samples += int(d.get("loo_samples", 0))
    return {"rel_std": math.sqrt(var) / total if total > 0 else 0.0,
            "uncertainty_kind": "composite", "loo_samples": samples,
            "uncertainty_method": "sub-kernel 1-sigmas added in quadrature (the sum of "
                                  "sub-kernels is taken as the operator's latency)"}


UNCERTAINTY_KEYS = ("rel_std", "uncertainty_kind", "loo_samples", "uncertainty_method",
                    "uncertainty_reason")
