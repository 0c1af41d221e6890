"""Leave-one-out residuals of the interpolation provider: how far each measured point
of a partition is from what the same method predicts from the others, binned by
distance to the nearest neighbours. They size the uncertainty and confidence of
interpolated answers (docs/evidence.md, "Uncertainty of interpolated answers")."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from perfcast.evidence.interpolation import Axis, InterpPartition

_FWD1 = {"log": math.log, "sqrt": math.sqrt, "linear": float}  # one float

LOO_MIN_SAMPLES = 5          # fewer leave-one-out errors than this: uncertainty unknown
LOO_BIN_SAMPLES = 20         # at least this many errors in a distance bin
LOO_MAX_BINS = 6
LOO_BIN_RATIO = 1.25         # median distances of neighbouring bins differ this much
ONE_SIGMA_QUANTILE = 0.6827  # share of a normal distribution within +-1 sigma
LOO_METHOD = ("leave-one-out: each measured point of the partition predicted from the "
              "others by this interpolation along each axis; rel_std = 68.27th percentile "
              "of |ln(predicted/measured)| among held-out points at a comparable distance, "
              "per off-grid axis, added in quadrature; confidence = exp(-rel_std)")


def confidence_from_rel_std(rel_std: float | None) -> float:
    """The one map from a measured 1-sigma relative error to a 0..1 confidence:
    `exp(-rel_std)` (1.0 exact, ~0.9 at 10 %, 0.5 at 69 %). An unknown error gives 0.0:
    nothing measured to trust the answer by."""
    return 0.0 if rel_std is None else math.exp(-rel_std)


@dataclass(frozen=True)
class ResidualTable:
    """Leave-one-out errors |ln(predicted / measured)| of one method on one group of
    points, binned by the held-out point's normalised distance to the points that
    predicted it. Bin i holds distances up to `edges[i]` (the last is open) and its
    1-sigma is `sigma[i]`, the ONE_SIGMA_QUANTILE of its errors. Bins hold at least
    LOO_BIN_SAMPLES errors; neighbouring bins are pooled when their median distances
    are within LOO_BIN_RATIO, or when the 1-sigma falls with distance (error does not
    shrink farther from the evidence). `count` errors in all; no `sigma` below LOO_MIN_SAMPLES."""

    count: int
    edges: tuple[float, ...] = ()
    sigma: tuple[float, ...] = ()

    @classmethod
    def from_samples(cls, distance, log_error) -> ResidualTable:
        d = np.asarray(distance, dtype=np.float64)
        e = np.abs(np.asarray(log_error, dtype=np.float64))
        ok = np.isfinite(d) & np.isfinite(e)
        d, e = d[ok], e[ok]
        n = len(e)
        if n < LOO_MIN_SAMPLES:
            return cls(n)
        order = np.argsort(d, kind="stable")
        d, e = d[order], e[order]
        bins = max(1, min(LOO_MAX_BINS, n // LOO_BIN_SAMPLES))
        bounds = [0]  # cut only where the distance changes, LOO_BIN_SAMPLES a bin
        for v in np.unique(d[(np.arange(1, bins) * n) // bins - 1]).tolist():
            c = int(np.searchsorted(d, v, side="right"))
            if c - bounds[-1] >= LOO_BIN_SAMPLES and n - c >= LOO_BIN_SAMPLES:
                bounds.append(c)
        bounds.append(n)
        i = 0
        while i < len(bounds) - 2:  # pool bins of about the same (median) distance
            if LOO_BIN_RATIO * d[(bounds[i] + bounds[i + 1]) // 2] \
                    > d[(bounds[i + 1] + bounds[i + 2]) // 2]:
                del bounds[i + 1]
            else:
                i += 1

        def q(a: int, b: int) -> float:
            return float(np.quantile(e[a:b], ONE_SIGMA_QUANTILE))

        sigma = [q(a, b) for a, b in zip(bounds, bounds[1:])]
        i = 0
        while i < len(sigma) - 1:  # pool adjacent violators: non-decreasing with distance
            if sigma[i] > sigma[i + 1]:
                del bounds[i + 1]
                sigma[i:i + 2] = [q(bounds[i], bounds[i + 1])]
                i = max(i - 1, 0)
            else:
                i += 1
        edges = [float(d[b - 1]) for b in bounds[1:-1]] + [math.inf]
        return cls(n, tuple(edges), tuple(sigma))

    @property
    def known(self) -> bool:
        return bool(self.sigma)

    def sigma_at(self, distance: float) -> float:
        """1-sigma at `distance`: the bin holding it (nearer than every sample: the
        first bin; farther: the last)."""
        return self.sigma[min(bisect_left(self.edges, distance), len(self.sigma) - 1)]


@dataclass(frozen=True)
class LooErrors:
    """Leave-one-out errors along one axis of a partition (arrays of equal length)."""

    axis: str
    point: np.ndarray          # held-out point (index into the partition's point arrays)
    log_error: np.ndarray      # ln(predicted latency / measured latency)
    distance: np.ndarray       # normalised like the estimate's distance_<axis>
    extrapolated: np.ndarray   # bool: predicted from two points on one side


def _mixed(codes: list[np.ndarray], n: int) -> np.ndarray:
    """One int64 code per row for a tuple of non-negative integer codes, order-preserving
    (compacted to ranks before the mixed radix could overflow)."""
    out = np.zeros(n, dtype=np.int64)
    for k in codes:
        radix = int(k.max()) + 1
        if int(out.max()) * radix > 2 ** 40:
            out = np.unique(out, return_inverse=True)[1].reshape(-1).astype(np.int64)
        out = out * radix + k
    return out


def _neighbours(t: np.ndarray, keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(previous, next) point along `t` among points equal on every key (-1: none).
    `t` and keys are integer codes (exact comparison; see `PartitionResiduals`)."""
    n = len(t)
    prev = np.full(n, -1)
    nxt = np.full(n, -1)
    if not n:
        return prev, nxt
    group = _mixed(keys, n)
    order = np.argsort(_mixed([group, t], n), kind="stable")
    g = group[order]
    same = g[1:] == g[:-1]
    prev[order[1:][same]] = order[:-1][same]
    nxt[order[:-1][same]] = order[1:][same]
    return prev, nxt


def _loo_along(coords: np.ndarray, y: np.ndarray, j: int, axis: Axis, pairs,
               log_target: bool, span: float, extrapolated: bool) -> LooErrors:
    """Every point predicted without itself along axis j, the rest of its coordinates
    equal (what the method does for a query off-grid on that axis only). `pairs` is
    (prev, next, class prev, class next) along the axis (-1: none). Interpolation:
    between its two neighbours (within its alignment class first, as the method does);
    extrapolation: as if the range ended next to the point, from the two nearest on one
    side (what the method does past an end), on both sides of every point."""
    t = coords[:, j]
    prev, nxt, cp, cn = pairs
    if not extrapolated:
        lo, hi = prev, nxt
        if cp is not None:
            own = (cp >= 0) & (cn >= 0)
            lo, hi = np.where(own, cp, lo), np.where(own, cn, hi)
        inner = (lo >= 0) & (hi >= 0)
        i, a, b = np.nonzero(inner)[0], lo[inner], hi[inner]
        gap = np.minimum(t[i] - t[a], t[b] - t[i])
    else:
        nxt2 = np.where(nxt >= 0, nxt[np.maximum(nxt, 0)], -1)
        prev2 = np.where(prev >= 0, prev[np.maximum(prev, 0)], -1)
        first, last = nxt2 >= 0, prev2 >= 0
        i = np.concatenate([np.nonzero(first)[0], np.nonzero(last)[0]])
        a = np.concatenate([nxt[first], prev2[last]])
        b = np.concatenate([nxt2[first], prev[last]])
        gap = np.minimum(np.abs(t[i] - t[a]), np.abs(t[i] - t[b]))
    w = (t[i] - t[a]) / (t[b] - t[a])
    y_hat = (1.0 - w) * y[a] + w * y[b]
    if axis.transform == "log":
        dist = gap / math.log(2.0)
    elif j == 0:  # the line axis: fraction of the bracketing cell (as `_distance`)
        dist = gap / (t[b] - t[a])
    else:
        dist = gap / span if span > 0 else np.zeros_like(gap)
    if log_target:
        err = y_hat - y[i]
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            err = np.log(y_hat / y[i])  # a non-positive prediction is a miss: dropped
    ok = np.isfinite(err)
    return LooErrors(axis.name, i[ok], err[ok], dist[ok], np.full(int(ok.sum()), extrapolated))


class PartitionResiduals:
    """Leave-one-out residual tables of one partition, per axis and kind (interpolation
    or extrapolation), each computed the first time an answer needs it."""

    def __init__(self, part: InterpPartition) -> None:
        self.part = part
        self._coords: tuple[np.ndarray, np.ndarray] | None = None
        self._pairs: dict[int, tuple] = {}
        self._errors: dict[tuple[str, bool], LooErrors] = {}
        self._tables: dict[tuple[str, bool], ResidualTable] = {}

    def _grid(self) -> tuple[np.ndarray, np.ndarray]:
        """(transformed coordinates, integer code per value) of every point, per axis."""
        if self._coords is None:
            part = self.part
            axes = part.spec.axes
            px = part.arrays[0]
            coords = np.empty((len(px), len(axes)))
            coords[:, 0] = px
            for key, (a, b) in part.line_slices.items():
                for j, (axis, v) in enumerate(zip(axes[1:], key), 1):
                    coords[a:b, j] = _FWD1[axis.transform](v)
            codes = np.stack([np.unique(coords[:, j], return_inverse=True)[1].reshape(-1)
                              for j in range(len(axes))], axis=1).astype(np.int64)
            self._coords = coords, codes
        return self._coords

    def _neighbour_pairs(self, j: int) -> tuple:
        found = self._pairs.get(j)
        if found is None:
            codes = self._grid()[1]
            keys = [codes[:, c] for c in range(codes.shape[1]) if c != j]
            prev, nxt = _neighbours(codes[:, j], keys)
            aligned = self.part.arrays[5] if j == 0 else None
            cp = cn = None
            if aligned is not None:  # the line axis's alignment classes
                cp, cn = _neighbours(codes[:, j], [*keys, aligned.astype(np.int64)])
            found = self._pairs[j] = (prev, nxt, cp, cn)
        return found

    def errors(self, axis: str, extrapolated: bool) -> LooErrors:
        key = (axis, extrapolated)
        found = self._errors.get(key)
        if found is None:
            part = self.part
            spec = part.spec
            j = [a.name for a in spec.axes].index(axis)
            coords = self._grid()[0]
            span = float(coords[:, j].max() - coords[:, j].min()) if len(coords) else 0.0
            e = _loo_along(coords, part.arrays[1], j, spec.axes[j], self._neighbour_pairs(j),
                           spec.target_transform == "log", span, extrapolated)
            if part.use_efficiency:  # latency error = -(efficiency error)
                e = LooErrors(e.axis, e.point, -e.log_error, e.distance, e.extrapolated)
            found = self._errors[key] = e
        return found

    def table(self, axis: str, extrapolated: bool) -> ResidualTable:
        key = (axis, extrapolated)
        found = self._tables.get(key)
        if found is None:
            e = self.errors(axis, extrapolated)
            found = self._tables[key] = ResidualTable.from_samples(e.distance, e.log_error)
        return found


def leave_one_out(part: InterpPartition) -> list[LooErrors]:
    """Leave-one-out errors of the partition's interpolation along each of its axes
    (interpolated, then extrapolated samples). Efficiency targets share the held-out
    point's roofline, so the error of the interpolated efficiency is (minus) the error
    of the latency."""
    res = partition_residuals(part)
    out = []
    for a in part.spec.axes:
        e0, e1 = res.errors(a.name, False), res.errors(a.name, True)
        out.append(LooErrors(a.name, *(np.concatenate([getattr(e0, f), getattr(e1, f)])
                                       for f in ("point", "log_error", "distance",
                                                 "extrapolated"))))
    return out


def partition_residuals(part: InterpPartition) -> PartitionResiduals:
    """The partition's (lazily computed, cached) leave-one-out residual tables."""
    if part.residuals is None:
        part.residuals = PartitionResiduals(part)
    return part.residuals


_RESIDUALS: dict[tuple, PartitionResiduals] = {}  # digest key -> residuals (bounded)
