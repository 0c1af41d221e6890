"""`InterpolatingProvider`: a named provider for points the database does not hold.

Records of one core identity, provenance group and fixed selector (every selector key
that is not an interpolation axis) form a partition. Inside it, the first axis of the
operation's `InterpolationSpec` is the *line* axis: each combination of the other axes
is a line of measurements along it. A query is answered by

1. bracketing each other axis between two measured values (or one, if equal),
2. interpolating along the line axis on each of those (up to 2^(d-1)) lines,
3. combining the lines multilinearly,

all in transformed space (`log`, `sqrt` or `linear` per axis). The target is either
latency or, where a roofline is known (gemm, attention) and a System is given, the
achieved fraction of the bare roofline ("efficiency"): interpolate it, then divide the
query's roofline time by it. Collectives interpolate latency linearly in message bytes
per participant count: the two bracketing points fix a local alpha-beta line.

Outside the measured range the answer is `extrapolated` (only with
`policy="extrapolate"`, within `max_extrapolation`). Every estimate reports its validity
domain (the bracketing cell), the distance to the nearest measurement per axis, and the
record ids used.

Uncertainty is measured, not assumed: the first time a partition answers, every one of
its points is predicted from the others with the same method along each axis
(leave-one-out, `partition_residuals`), and an answer's `rel_std` is the 1-sigma of
those errors at a comparable distance (`ResidualTable`); `confidence = exp(-rel_std)`.
Too few points for leave-one-out give `Uncertainty(kind="unknown")` and the reason.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import product

import numpy as np

from perfcast.core.canonical import content_digest
from perfcast.core.errors import AmbiguousEvidenceError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import (
    CostEstimate,
    CostQuery,
    DimValue,
    EstimateMethod,
    MatchKind,
    Miss,
    Uncertainty,
)
from perfcast.evidence.interpolation_residuals import (  # noqa: F401  (re-exported)
    _RESIDUALS, LOO_METHOD, LOO_MIN_SAMPLES, LooErrors, PartitionResiduals, ResidualTable,
    confidence_from_rel_std, leave_one_out, partition_residuals)
from perfcast.evidence.database import PerformanceDatabase, parse_selector_column, view_key
from perfcast.evidence.records import selector_type_name
from perfcast.evidence.provider_db import _ids
from perfcast.evidence.selectors import (
    RowCodes,
    _combine,
    core_rows,
    query_facts,
    row_codes,
)
from perfcast.evidence.work_model import ROOFLINES, TIED
from perfcast.hardware.model import System

POLICIES = ("interpolate", "extrapolate")
_TIED_WORD = -(2 ** 62)
_FWD = {"log": np.log, "sqrt": np.sqrt, "linear": lambda x: x}
_FWD1 = {"log": math.log, "sqrt": math.sqrt, "linear": float}  # one float


@dataclass(frozen=True)
class Axis:
    name: str
    transform: str = "log"           # log | sqrt | linear
    align: int = 0                   # line axis only: multiples of `align` form their own
                                     # class (kernel tiling: m=512 and m=513 differ a lot)


@dataclass(frozen=True)
class InterpolationSpec:
    axes: tuple[Axis, ...]           # axes[0] is the line axis
    target: str = "efficiency"       # efficiency | latency
    target_transform: str = "log"    # log | linear
    ties: tuple[tuple[str, str], ...] = ()  # (follower, leader): equal in the records


_COLLECTIVE = InterpolationSpec((Axis("message_bytes", "linear"),), target="latency",
                                target_transform="linear")
SPECS: dict[str, InterpolationSpec] = {
    "gemm": InterpolationSpec((Axis("m", align=16), Axis("n"), Axis("k"))),
    # attention: log-latency beat efficiency space and sqrt(kv_len) in leave-one-out
    # (benchmarks/kernel_accuracy.py), so it interpolates latency.
    "attention": InterpolationSpec((Axis("kv_len"), Axis("batch"), Axis("heads")),
                                   target="latency", ties=(("q_tokens", "kv_len"),)),
    "mla_attention": InterpolationSpec((Axis("kv_len"), Axis("batch")), target="latency",
                                       ties=(("q_tokens", "kv_len"),)),
    "moe": InterpolationSpec((Axis("tokens"),), target="latency"),
    "all_reduce": _COLLECTIVE, "all_gather": _COLLECTIVE, "reduce_scatter": _COLLECTIVE,
    "all_to_all": _COLLECTIVE,
}


@dataclass
class Line:
    x: np.ndarray                    # transformed line-axis coordinates, sorted, unique
    y: np.ndarray                    # transformed target (median per x)
    row_idx: np.ndarray              # record rows grouped by point
    offsets: np.ndarray              # point i: row_idx[offsets[i]:offsets[i + 1]]
    raw: np.ndarray                  # untransformed line-axis value per point
    classes: dict[bool, np.ndarray] | None = None  # aligned? -> point indices

    def rows_of(self, i: int) -> np.ndarray:
        return self.row_idx[self.offsets[i]:self.offsets[i + 1]]

    def lists(self) -> tuple[list[float], list[float], list[float]]:
        """(x, y, raw) as Python lists, cached (the query path indexes them)."""
        cached = self.__dict__.get("_lists")
        if cached is None:
            cached = self.__dict__["_lists"] = (self.x.tolist(), self.y.tolist(),
                                                self.raw.astype(float).tolist())
        return cached

    def row_list(self, i: int) -> list[int]:
        return self.row_idx[self.offsets[i]:self.offsets[i + 1]].tolist()

    def points(self, aligned: bool | None, dropped: int | None
               ) -> tuple[list[float], list[int] | None]:
        """(x values, their point indices or None for all) of one alignment class (or all
        points when `aligned` is None), without the point `dropped`. Cached when nothing
        is dropped (the query path)."""
        if dropped is None:
            cache = self.__dict__.get("_point_cache")
            if cache is None:
                cache = self.__dict__["_point_cache"] = {}
            hit = cache.get(aligned)
            if hit is None:
                hit = cache[aligned] = self._points(aligned, None)
            return hit
        return self._points(aligned, dropped)

    def _points(self, aligned, dropped):
        idx = list(range(len(self.x))) if aligned is None else self.classes[aligned].tolist()
        if dropped is not None:
            idx = [i for i in idx if i != dropped]
        elif aligned is None:
            return self.x.tolist(), None
        return self.x[idx].tolist(), idx

    def point_of(self, row: int) -> int | None:
        hit = np.nonzero(self.row_idx == row)[0]
        if not len(hit):
            return None
        return int(np.searchsorted(self.offsets, hit[0], side="right") - 1)


@dataclass
class InterpPartition:
    core: tuple[str, str, str, str]
    group: int
    fixed: dict[str, object]         # key -> value, or TIED
    kinds: dict[str, str]
    spec: InterpolationSpec
    use_efficiency: bool
    other_values: list[np.ndarray]   # raw sorted unique values of axes[1:]
    other_t: list[list[float]]       # the same, transformed
    other_list: list[list[float]] = field(default_factory=list)  # raw, as Python floats
    # line key (values of axes[1:]) -> (first, end) point index; Line objects are made on
    # first use from the partition-wide point arrays below
    line_slices: dict[tuple, tuple[int, int]] = field(default_factory=dict)
    arrays: tuple = ()               # (point_x, point_y, point_raw, point_starts, rows, aligned)
    _made: dict[tuple, Line] = field(default_factory=dict)
    residuals: PartitionResiduals | None = None  # leave-one-out tables (made on use)

    @property
    def specificity(self) -> int:
        return len(self.fixed)

    def line(self, key: tuple) -> Line | None:
        made = self._made.get(key)
        if made is None:
            bounds = self.line_slices.get(key)
            if bounds is None:
                return None
            a, b = bounds
            px, py, praw, starts, rows, aligned = self.arrays
            r0, r1 = int(starts[a]), int(starts[b])
            made = Line(px[a:b], py[a:b], rows[r0:r1], starts[a:b + 1] - r0, praw[a:b])
            if aligned is not None:
                al = aligned[a:b]
                made.classes = {True: np.nonzero(al)[0], False: np.nonzero(~al)[0]}
            self._made[key] = made
        return made

    @property
    def lines(self) -> dict[tuple, Line]:
        """Every line (materialises them all: for inspection and benchmarks)."""
        return {key: self.line(key) for key in self.line_slices}

    def matches(self, facts: dict[str, DimValue]) -> bool:
        ties = dict(self.spec.ties)
        for key, want in self.fixed.items():
            have = facts.get(key)
            if have is None:
                return False
            if want is TIED:
                if have != facts.get(ties[key]) or selector_type_name(have) == "bool":
                    return False
            elif have != want or selector_type_name(have) != self.kinds[key]:
                return False
        return True


def _axis_columns(rc: RowCodes, name: str) -> list[int]:
    return [j for j, c in enumerate(rc.sel_cols)
            if parse_selector_column(c)[0] == name and parse_selector_column(c)[1]
            in ("int", "float")]


def _coords(rc: RowCodes, rows: np.ndarray, name: str) -> np.ndarray:
    out = np.full(len(rows), np.nan)
    for j in _axis_columns(rc, name):
        kind = parse_selector_column(rc.sel_cols[j])[1]
        w = rc.words[rows, j]
        vals = w.astype(np.float64) if kind == "int" else w.view(np.float64)
        ok = rc.valid[rows, j]
        out[ok] = vals[ok]
    return out


def build_partitions(db: PerformanceDatabase, system: System | None,
                     specs: dict[str, InterpolationSpec] | None = None,
                     core: tuple[str, str, str, str] | None = None
                     ) -> dict[tuple[str, str, str, str], list[InterpPartition]]:
    """Every partition, or only those of one core identity (the same partitions)."""
    specs = SPECS if specs is None else specs
    rc = row_codes(db)
    if not rc.n:
        return {}
    op_dict = rc.core_dicts[1]
    in_core = core_rows(rc, core) if core is not None else None
    out: dict[tuple[str, str, str, str], list[InterpPartition]] = {}
    for op_code, op in enumerate(op_dict):
        spec = specs.get(op)
        if spec is None or (core is not None and op != core[1]):
            continue
        rows = np.nonzero(rc.core_codes[1] == op_code)[0] if in_core is None else in_core
        axis_names = [a.name for a in spec.axes]
        coords = {a: _coords(rc, rows, a) for a in axis_names}
        ok = np.all([np.isfinite(coords[a]) & (coords[a] > 0) for a in axis_names], axis=0)
        rows = rows[ok]
        coords = {a: c[ok] for a, c in coords.items()}
        if not len(rows):
            continue
        axis_cols = {j for a in axis_names for j in _axis_columns(rc, a)}
        fixed_cols = [j for j in range(len(rc.sel_cols))
                      if j not in axis_cols and rc.valid[rows, j].any()]
        leader_of = dict(spec.ties)
        keys = [*(c[rows] for c in rc.core_codes), rc.group_of_row[rows]]
        fixed_words = {}
        for j in fixed_cols:
            w = rc.words[rows, j].copy()
            name, kind = parse_selector_column(rc.sel_cols[j])
            if name in leader_of and kind in ("int", "float"):
                vals = w.astype(np.float64) if kind == "int" else w.view(np.float64)
                w[vals == coords[leader_of[name]]] = _TIED_WORD
            valid = rc.valid[rows, j]
            fixed_words[j] = w
            keys += [valid.astype(np.int64), np.where(valid, w, 0)]
        part_of_row, firsts = _combine(keys, len(rows))
        order = np.argsort(part_of_row, kind="stable")
        bounds = np.searchsorted(part_of_row[order], np.arange(len(firsts) + 1))
        for p in range(len(firsts)):
            sel = order[bounds[p]:bounds[p + 1]]
            first = sel[0]
            r0 = rows[first]
            fixed: dict[str, object] = {}
            kinds: dict[str, str] = {}
            for j in fixed_cols:
                if not rc.valid[r0, j]:
                    continue
                name, kind = parse_selector_column(rc.sel_cols[j])
                kinds[name] = kind
                fixed[name] = TIED if fixed_words[j][first] == _TIED_WORD else rc.value(r0, j)
            core = rc.core_of(r0)
            part_coords = {a: coords[a][sel] for a in axis_names}
            part = _make_partition(core, int(rc.group_of_row[r0]), fixed, kinds, spec,
                                   rows[sel], part_coords, rc.latency_s[rows[sel]], system)
            out.setdefault(core, []).append(part)
    for parts in out.values():
        parts.sort(key=lambda p: -p.specificity)
    return out


def _make_partition(core, group, fixed, kinds, spec, rows, coords, latency, system):
    op = core[1]
    use_eff = spec.target == "efficiency" and system is not None and op in ROOFLINES
    target = ROOFLINES[op](coords, fixed, core[3], system) / latency if use_eff else latency
    y_all = np.log(target) if spec.target_transform == "log" else target
    line_axis = spec.axes[0]
    x_all = _FWD[line_axis.transform](coords[line_axis.name])
    others = spec.axes[1:]
    other_values = [np.unique(coords[a.name]) for a in others]
    part = InterpPartition(core=core, group=group, fixed=fixed, kinds=kinds, spec=spec,
                           use_efficiency=use_eff, other_values=other_values,
                           other_t=[_FWD[a.transform](v).tolist()
                                    for a, v in zip(others, other_values)],
                           other_list=[v.astype(float).tolist() for v in other_values])
    if others:  # line id per row: combined codes of the other axes (1-D sorts only)
        codes = [np.searchsorted(v, coords[a.name]) for a, v in zip(others, other_values)]
        inv, firsts = _combine(codes, len(rows))
        uniq = np.stack([coords[a.name][firsts] for a in others], axis=1)
    else:
        uniq, inv = np.zeros((1, 0)), np.zeros(len(rows), dtype=np.int64)
    # sort by (line, x); a point is a run of equal (line, x); a line a run of points
    order = np.lexsort((x_all, inv))
    xs, ys, inv_s, rows_s = x_all[order], y_all[order], inv[order], rows[order]
    n = len(xs)
    new = np.ones(n, dtype=bool)
    new[1:] = (inv_s[1:] != inv_s[:-1]) | (xs[1:] != xs[:-1])
    starts = np.nonzero(new)[0]
    ends = np.append(starts[1:], n)
    point_y = ys[starts].copy()  # one value per point
    for p in np.nonzero(ends - starts > 1)[0]:  # repeated samples: median
        point_y[p] = np.median(ys[starts[p]:ends[p]])
    point_x, point_line = xs[starts], inv_s[starts]
    point_raw = coords[line_axis.name][order][starts]
    line_bounds = np.searchsorted(point_line, np.arange(len(uniq) + 1)).tolist()
    aligned = (np.round(point_raw) % line_axis.align) == 0 if line_axis.align else None
    part.arrays = (point_x, point_y, point_raw, np.append(starts, n), rows_s, aligned)
    keys = map(tuple, uniq.astype(float).tolist())
    part.line_slices = {key: (line_bounds[li], line_bounds[li + 1])
                        for li, key in enumerate(keys)}
    return part


def _bracket(xs: list[float], t: float, extrapolate: bool
             ) -> tuple[int, int, float, float, bool] | None:
    """(lo, hi, weight of hi, distance to nearest point, extrapolated) or None."""
    n = len(xs)
    if n == 0:
        return None
    i = bisect_left(xs, t)
    if i < n and xs[i] == t:
        return i, i, 0.0, 0.0, False
    if 0 < i < n:
        lo, hi = i - 1, i
        w = (t - xs[lo]) / (xs[hi] - xs[lo])
        return lo, hi, w, min(t - xs[lo], xs[hi] - t), False
    if not extrapolate or n < 2:
        return None
    lo, hi = (0, 1) if i == 0 else (n - 2, n - 1)
    w = (t - xs[lo]) / (xs[hi] - xs[lo])
    return lo, hi, w, abs(t - xs[0 if i == 0 else n - 1]), True


# -- measured uncertainty: leave-one-out residuals -------------------------------------
class InterpolatingProvider:
    """Interpolates (and, by policy, extrapolates) a database's measurements."""

    def __init__(self, database: PerformanceDatabase, system: System | None = None, *,
                 policy: str = "interpolate", max_extrapolation: float = 2.0,
                 name: str = "interpolation",
                 specs: dict[str, InterpolationSpec] | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown interpolation policy {policy!r}; expected {POLICIES}")
        self.database = database
        self.system = system
        self.policy = policy
        self.max_extrapolation = max_extrapolation  # log2 units on log axes, else spans
        self.name = name
        self.specs = dict(SPECS if specs is None else specs)
        self.revision = content_digest("perfcast.InterpolatingProvider", {
            "database": database.digest, "system": system.digest if system else "",
            "policy": policy, "max_extrapolation": max_extrapolation,
            "specs": {op: repr(s) for op, s in self.specs.items()}})[:23]
        self._views: dict[tuple, _InterpView] = {}
        self._partitions: dict | None = None

    @property
    def partitions(self) -> dict[tuple[str, str, str, str], list[InterpPartition]]:
        """Every partition of the whole database (reads every row; row indices are the
        database's: for inspection and leave-one-out)."""
        if self._partitions is None:
            self._partitions = build_partitions(self.database, self.system, self.specs)
        return self._partitions

    def _view(self, core: tuple, facts: dict) -> _InterpView:
        """Partitions of one core identity, built on first use; for an unread snapshot
        (`database.is_lazy`) from the rows of the query's runtime, revision and kernel
        only (partitions are split by those selectors, so the same ones match)."""
        db = self.database
        key, context = view_key(db, core, facts)
        view = self._views.get(key)
        if view is None:
            sub = db.select(core, context) if context is not None else db
            parts = build_partitions(sub, self.system, self.specs, core).get(core, [])
            if context is None:
                need = {k for p in parts for k in p.fixed}
            else:
                axes = [a.name for a in self.specs[core[1]].axes]
                need = db.catalog.fixed_keys(core, axes) or set()
            rc = row_codes(sub) if sub.table.num_rows else None
            view = self._views[key] = _InterpView(
                parts=parts, fixed_keys=tuple(sorted({k for p in parts for k in p.fixed})),
                need=need, record_ids=sub.record_ids(),
                groups=rc.groups if rc is not None else [],
                latency_s=rc.latency_s if rc is not None else np.zeros(0))
        return view

    def supports(self, query: CostQuery) -> bool | Miss:
        if query.operation not in self.specs:
            return Miss(f"no interpolation rule for {query.operation}")
        core = (query.subject.value, query.operation, query.hardware, query.dtype)
        if self.database.is_lazy:
            known = self.database.catalog.fixed_keys(
                core, [a.name for a in self.specs[query.operation].axes]) is not None
        else:
            known = bool(self._view(core, query_facts(query)).parts)
        if not known:
            return Miss(f"no records for {query.operation} {query.dtype} on {query.hardware}")
        return True

    def select(self, query: CostQuery) -> InterpPartition | Miss:
        return self._select_in_view(query)[1]

    def _select_in_view(self, query: CostQuery) -> tuple[_InterpView, InterpPartition | Miss]:
        facts = query_facts(query)
        core = (query.subject.value, query.operation, query.hardware, query.dtype)
        spec = self.specs[query.operation]
        view = self._view(core, facts)
        for a in spec.axes:
            v = facts.get(a.name)
            if v is None or selector_type_name(v) not in ("int", "float") or v <= 0:
                return view, Miss(f"query lacks a positive numeric {a.name}")
        ties = tuple((type(facts.get(f)), facts.get(f) == facts.get(lead))
                     for f, lead in spec.ties)  # only whether follower equals leader
        key = (tuple((k, type(facts.get(k)), facts.get(k)) for k in view.fixed_keys), ties)
        found = view.selected.get(key)
        if found is None:
            try:
                found = self._select(facts, core, view)
            except AmbiguousEvidenceError as exc:
                found = exc
            if len(view.selected) > 100_000:
                view.selected.clear()
            view.selected[key] = found
        if isinstance(found, Exception):
            raise found
        return view, found

    def _select(self, facts: dict, core: tuple, view: _InterpView
                ) -> InterpPartition | Miss:
        parts = view.parts
        matched = [p for p in parts if p.matches(facts)]
        if not matched:
            need = sorted(k for k in view.need if k not in facts)
            return Miss("no partition matches the query's fixed selectors"
                        + (f" (records need {', '.join(need)})" if need else ""))
        top = [p for p in matched if p.specificity == matched[0].specificity]
        if len({p.group for p in top}) > 1:
            groups = sorted({view.groups[p.group][1] for p in top})
            raise AmbiguousEvidenceError(
                f"{core[1]} on {core[2]}: interpolation could use "
                f"{len(groups)} equally specific evidence groups ({'; '.join(groups)}); "
                "state the runtime, revision or implementation that tells them apart")
        return top[0]

    def predict(self, part: InterpPartition, facts: dict, exclude_row: int | None = None,
                policy: str | None = None):
        """(latency_s, distances, extrapolated axes (a frozenset, empty when
        interpolated), record rows, cell) or a Miss."""
        spec = part.spec
        extrap = (policy or self.policy) == "extrapolate"
        brackets = []
        distances: dict[str, float] = {}
        cell: dict[str, float] = {}
        extra_axes: set[str] = set()
        for axis, values, tv in zip(spec.axes[1:], part.other_list, part.other_t):
            t = _FWD1[axis.transform](facts[axis.name])
            b = _bracket(tv, t, extrap)
            if b is None:
                return Miss(f"{axis.name}={facts[axis.name]} outside measured "
                            f"{values[0]:g}..{values[-1]:g}")
            lo, hi, w, d, ex = b
            if ex:
                extra_axes.add(axis.name)
            distances[axis.name] = self._distance(axis, d, tv)
            cell[axis.name + "_lo"], cell[axis.name + "_hi"] = values[lo], values[hi]
            brackets.append([(values[lo], 1.0 - w)] + ([(values[hi], w)] if hi != lo else []))
        line_axis = spec.axes[0]
        q0 = facts[line_axis.name]
        t0 = _FWD1[line_axis.transform](q0)
        q_aligned = bool(line_axis.align) and float(q0) % line_axis.align == 0
        y = 0.0
        used: list[int] = []
        d0 = 0.0
        lo_x, hi_x = math.inf, -math.inf
        lo_raw = hi_raw = 0.0
        for combo in product(*brackets) if brackets else [()]:
            key = tuple(v for v, _ in combo)
            weight = math.prod(w for _, w in combo)
            line = part.line(key)
            if line is None:
                return Miss("no measurements on the line " + ", ".join(
                    f"{a.name}={v:g}" for a, v in zip(spec.axes[1:], key)))
            dropped = line.point_of(exclude_row) if exclude_row is not None else None
            b = None
            if line.classes is not None:  # same alignment class first (never extrapolated)
                xs, pts = line.points(q_aligned, dropped)
                b = _bracket(xs, t0, False)
            if b is None:
                xs, pts = line.points(None, dropped)
                b = _bracket(xs, t0, extrap)
            if b is None:
                return Miss(f"{line_axis.name}={q0} is not bracketed by measurements on "
                            "the line " + ", ".join(f"{a.name}={v:g}"
                                                    for a, v in zip(spec.axes[1:], key)))
            lo, hi, w, d, ex = b
            if pts is not None:
                lo, hi = pts[lo], pts[hi]
            if ex:
                extra_axes.add(line_axis.name)
            d0 = max(d0, d)
            xl, yl, rl = line.lists()
            y += weight * ((1.0 - w) * yl[lo] + w * yl[hi])
            used += line.row_list(lo)
            if hi != lo:
                used += line.row_list(hi)
            if xl[lo] < lo_x:
                lo_x, lo_raw = xl[lo], rl[lo]
            if xl[hi] > hi_x:
                hi_x, hi_raw = xl[hi], rl[hi]
        distances[line_axis.name] = self._distance(line_axis, d0, [lo_x, hi_x])
        cell[line_axis.name + "_lo"] = lo_raw
        cell[line_axis.name + "_hi"] = hi_raw
        any_extra = bool(extra_axes)
        if any_extra and max(distances.values()) > self.max_extrapolation:
            return Miss(f"extrapolation distance {max(distances.values()):.2f} exceeds "
                        f"{self.max_extrapolation}")
        value = math.exp(y) if spec.target_transform == "log" else y
        if part.use_efficiency:  # the partition's fixed selectors served its records too
            axes = {a.name: float(facts[a.name]) for a in spec.axes}
            roof = float(ROOFLINES[part.core[1]](axes, part.fixed, part.core[3], self.system))
            latency = roof / value
        else:
            latency = value
        if not math.isfinite(latency) or latency <= 0:
            return Miss(f"{'extrapolation' if any_extra else 'interpolation'} gives a "
                        f"non-positive latency ({latency:g})")
        return latency, distances, frozenset(extra_axes), sorted(set(used)), cell

    @staticmethod
    def _distance(axis: Axis, d: float, tv) -> float:
        if axis.transform == "log":
            return d / math.log(2.0)          # octaves
        span = float(tv[-1] - tv[0]) if len(tv) > 1 else 0.0
        return d / span if span > 0 else 0.0

    def _static(self, part: InterpPartition) -> dict:
        cached = part.__dict__.get("_static")
        if cached is None:
            cached = part.__dict__["_static"] = _static_texts(part)
        return cached

    def estimate(self, query: CostQuery) -> CostEstimate | Miss:
        view, part = self._select_in_view(query)
        if isinstance(part, Miss):
            return part
        facts = query_facts(query)
        result = self.predict(part, facts)
        if isinstance(result, Miss):
            return result
        latency, distances, extrapolated, rows, cell = result
        if extrapolated:
            method, kind = EstimateMethod.EXTRAPOLATED, MatchKind.EXTRAPOLATED
        else:
            method, kind = EstimateMethod.INTERPOLATED, MatchKind.INTERPOLATED
        uncertainty, stats = self._uncertainty(part, view, latency, distances,
                                               extrapolated, rows)
        static = self._static(part)
        validity = dict(static["validity"])
        validity.update(cell)
        controlled = static["controlled"]
        assumptions = [f"evidence does not control {k}={query.dims[k]!r}"
                       for k in sorted(query.dims) if k not in controlled]
        assumptions.append(static[method])
        components = {"distance_" + k: v for k, v in distances.items()}
        return CostEstimate(
            latency_s=latency, method=method, match_kind=kind, provider=self.name,
            provider_revision=self.revision, source_revision=view.groups[part.group][1],
            raw_record_ids=_ids(view.record_ids, rows),
            validity=FrozenDict(validity), uncertainty=uncertainty,
            components=FrozenDict(components), assumptions=tuple(assumptions),
            bottleneck="measured", confidence=confidence_from_rel_std(uncertainty.rel_std),
            statistics=stats)

    def residuals(self, part: InterpPartition, view: _InterpView | None = None
                  ) -> PartitionResiduals:
        """The partition's leave-one-out residual tables, computed the first time it
        answers and kept by the digests of the evidence behind it (a second provider
        over the same database does not pay again)."""
        if part.residuals is None:
            group = view.groups[part.group] if view is not None else part.group
            key = (self.database.digest, self.system.digest if self.system else "",
                   repr(part.spec), part.core, group,
                   tuple(sorted((k, repr(v)) for k, v in part.fixed.items())))
            found = _RESIDUALS.get(key)
            if found is None:
                found = partition_residuals(part)
                if len(_RESIDUALS) >= 4096:
                    _RESIDUALS.clear()
                _RESIDUALS[key] = found
            part.residuals = found
        return part.residuals

    def _uncertainty(self, part, view, latency, distances, extrapolated, rows
                     ) -> tuple[Uncertainty, FrozenDict]:
        if not any(distances.values()):  # the query is a measured point: its repeats
            samples = np.sort(view.latency_s[rows])
            median = float(np.median(samples))
            rel = float(samples.std() / median) if len(samples) > 1 else 0.0
            return (Uncertainty(kind="samples", rel_std=rel, low_s=float(samples[0]),
                                high_s=float(samples[-1]), sample_count=len(samples)),
                    _REPEATS_STATS)
        tables = self.residuals(part, view)
        key = []
        for axis, d in distances.items():
            if d > 0:
                table = tables.table(axis, axis in extrapolated)
                key.append((axis, axis in extrapolated,
                            min(bisect_left(table.edges, d), len(table.sigma) - 1)
                            if table.sigma else -1))
        cache = part.__dict__.setdefault("_unc_cache", {})
        found = cache.get(tuple(key))
        if found is None:
            found = cache[tuple(key)] = self._combine(part, tables, key)
        rel, count, stats = found
        if rel is None:
            return Uncertainty(kind="unknown", rel_std=None, sample_count=count), stats
        return (Uncertainty(kind="loo", rel_std=rel, low_s=latency * math.exp(-rel),
                            high_s=latency * math.exp(rel), sample_count=count), stats)

    @staticmethod
    def _combine(part, tables, key) -> tuple[float | None, int, FrozenDict]:
        """(rel_std or None, leave-one-out sample count, statistics) of the off-grid
        axes in `key` [(axis, extrapolated, distance bin)]: 1-sigmas add in quadrature."""
        var, count = 0.0, 0
        stats: dict = {"uncertainty_method": LOO_METHOD}
        for axis, extra, b in key:
            table = tables.table(axis, extra)
            if b < 0:
                what = "extrapolation" if extra else "interpolation"
                stats["uncertainty_reason"] = (
                    f"{table.count} leave-one-out {what} errors along {axis} in this "
                    f"partition ({len(part.arrays[0])} points); needs {LOO_MIN_SAMPLES}")
                stats["loo_samples"] = table.count
                return None, table.count, FrozenDict(stats)
            sigma = table.sigma[b]
            stats["loo_sigma_" + axis] = sigma
            var += sigma * sigma
            count += table.count
        stats["loo_samples"] = count
        return math.sqrt(var), count, FrozenDict(stats)


_REPEATS_STATS = FrozenDict({"uncertainty_method": "repeat spread of the measured point"})


@dataclass
class _InterpView:
    parts: list[InterpPartition]           # most specific first
    fixed_keys: tuple[str, ...]            # fixed selectors that tell them apart
    need: set[str]                         # fixed keys of the core's partitions
    record_ids: object                     # record_id column of the view's rows
    groups: list[tuple[str, ...]]          # provenance group id -> tuple
    latency_s: np.ndarray                  # latency of the view's rows
    selected: dict = field(default_factory=dict)  # select() cache


def _static_texts(part: InterpPartition) -> dict:
    spec = part.spec
    ties = dict(spec.ties)
    target = "achieved fraction of roofline" if part.use_efficiency else "latency"
    axes_txt = ", ".join(f"{a.transform} {a.name}" for a in spec.axes)
    out: dict = {
        "validity": {k: (f"={ties[k]}" if v is TIED else v) for k, v in part.fixed.items()},
        "controlled": set(part.fixed) | {a.name for a in spec.axes},
    }
    for method in (EstimateMethod.INTERPOLATED, EstimateMethod.EXTRAPOLATED):
        out[method] = f"{method.value} {target} ({spec.target_transform}) over {axes_txt}"
    return out

