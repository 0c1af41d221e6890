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
`policy="extrapolate"`, within `max_extrapolation`), with lower confidence. Every
estimate reports its validity domain (the bracketing cell), the distance to the
nearest measurement per axis, and the record ids used.
"""

from __future__ import annotations

import math
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
from perfcast.evidence.database import PerformanceDatabase, parse_selector_column
from perfcast.evidence.records import selector_type_name
from perfcast.evidence.selectors import RowCodes, _combine, query_facts, row_codes
from perfcast.evidence.work_model import ROOFLINES, TIED
from perfcast.hardware.model import System

POLICIES = ("interpolate", "extrapolate")
_TIED_WORD = -(2 ** 62)
_FWD = {"log": np.log, "sqrt": np.sqrt, "linear": lambda x: x}


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
    rows: list[np.ndarray]           # record rows per x
    aligned: np.ndarray | None = None  # per x: raw value is a multiple of the axis' align


@dataclass
class InterpPartition:
    core: tuple[str, str, str, str]
    group: int
    fixed: dict[str, object]         # key -> value, or TIED
    kinds: dict[str, str]
    spec: InterpolationSpec
    use_efficiency: bool
    other_values: list[np.ndarray]   # raw sorted unique values of axes[1:]
    lines: dict[tuple, Line] = field(default_factory=dict)

    @property
    def specificity(self) -> int:
        return len(self.fixed)

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
                     specs: dict[str, InterpolationSpec] | None = None
                     ) -> dict[tuple[str, str, str, str], list[InterpPartition]]:
    specs = SPECS if specs is None else specs
    rc = row_codes(db)
    if not rc.n:
        return {}
    op_dict = rc.core_dicts[1]
    out: dict[tuple[str, str, str, str], list[InterpPartition]] = {}
    for op_code, op in enumerate(op_dict):
        spec = specs.get(op)
        if spec is None:
            continue
        rows = np.nonzero(rc.core_codes[1] == op_code)[0]
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
    if use_eff:
        roof = ROOFLINES[op](coords, fixed, core[3], system)
        target = roof / latency
    else:
        target = latency
    y_all = np.log(target) if spec.target_transform == "log" else target
    line_axis = spec.axes[0]
    x_all = _FWD[line_axis.transform](coords[line_axis.name])
    others = [a.name for a in spec.axes[1:]]
    other_values = [np.unique(coords[a]) for a in others]
    if others:
        stacked = np.stack([coords[a] for a in others], axis=1)
        uniq, inv = np.unique(stacked, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
    else:
        uniq, inv = np.zeros((1, 0)), np.zeros(len(rows), dtype=np.int64)
    part = InterpPartition(core=core, group=group, fixed=fixed, kinds=kinds, spec=spec,
                           use_efficiency=use_eff, other_values=other_values)
    order = np.lexsort((x_all, inv))
    bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
    for li in range(len(uniq)):
        idx = order[bounds[li]:bounds[li + 1]]
        xs, ys, rs = x_all[idx], y_all[idx], rows[idx]
        ux, starts = np.unique(xs, return_index=True)
        if len(ux) == len(xs):
            line = Line(xs, ys, [np.array([r]) for r in rs])
        else:
            ends = list(starts[1:]) + [len(xs)]
            line = Line(ux, np.array([np.median(ys[a:b]) for a, b in zip(starts, ends)]),
                        [rs[a:b] for a, b in zip(starts, ends)])
        if line_axis.align:
            raw_x = np.round(np.exp(line.x) if line_axis.transform == "log" else
                             line.x ** 2 if line_axis.transform == "sqrt" else line.x)
            line.aligned = (raw_x % line_axis.align) == 0
        part.lines[tuple(float(v) for v in uniq[li])] = line
    return part


def _bracket(xs: np.ndarray, t: float, extrapolate: bool
             ) -> tuple[int, int, float, float, bool] | None:
    """(lo, hi, weight of hi, distance to nearest point, extrapolated) or None."""
    n = len(xs)
    if n == 0:
        return None
    i = int(np.searchsorted(xs, t))
    if i < n and xs[i] == t:
        return i, i, 0.0, 0.0, False
    if 0 < i < n:
        lo, hi = i - 1, i
        w = (t - xs[lo]) / (xs[hi] - xs[lo])
        return lo, hi, float(w), float(min(t - xs[lo], xs[hi] - t)), False
    if not extrapolate or n < 2:
        return None
    lo, hi = (0, 1) if i == 0 else (n - 2, n - 1)
    w = (t - xs[lo]) / (xs[hi] - xs[lo])
    return lo, hi, float(w), float(abs(t - xs[0 if i == 0 else n - 1])), True


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
        self.partitions = build_partitions(database, system, self.specs)
        self._record_ids = database.table.column("record_id")
        self._groups = row_codes(database).groups

    def supports(self, query: CostQuery) -> bool | Miss:
        if query.operation not in self.specs:
            return Miss(f"no interpolation rule for {query.operation}")
        if (query.subject.value, query.operation, query.hardware, query.dtype) \
                not in self.partitions:
            return Miss(f"no records for {query.operation} {query.dtype} on {query.hardware}")
        return True

    def select(self, query: CostQuery) -> InterpPartition | Miss:
        facts = query_facts(query)
        parts = self.partitions.get(
            (query.subject.value, query.operation, query.hardware, query.dtype), [])
        spec = self.specs[query.operation]
        for a in spec.axes:
            v = facts.get(a.name)
            if v is None or selector_type_name(v) not in ("int", "float") or v <= 0:
                return Miss(f"query lacks a positive numeric {a.name}")
        matched = [p for p in parts if p.matches(facts)]
        if not matched:
            need = sorted({k for p in parts for k in p.fixed if k not in facts})
            return Miss("no partition matches the query's fixed selectors"
                        + (f" (records need {', '.join(need)})" if need else ""))
        top = [p for p in matched if p.specificity == matched[0].specificity]
        if len({p.group for p in top}) > 1:
            groups = sorted({self._groups[p.group][1] for p in top})
            raise AmbiguousEvidenceError(
                f"{query.operation} on {query.hardware}: interpolation could use "
                f"{len(groups)} equally specific evidence groups ({'; '.join(groups)}); "
                "state the runtime, revision or implementation that tells them apart")
        return top[0]

    def predict(self, part: InterpPartition, facts: dict, exclude_row: int | None = None,
                policy: str | None = None):
        """(latency_s, distances, extrapolated, record rows, cell) or a Miss."""
        spec = part.spec
        extrap = (policy or self.policy) == "extrapolate"
        brackets = []
        distances: dict[str, float] = {}
        cell: dict[str, float] = {}
        any_extra = False
        for axis, values in zip(spec.axes[1:], part.other_values):
            t = float(_FWD[axis.transform](float(facts[axis.name])))
            tv = _FWD[axis.transform](values)
            b = _bracket(tv, t, extrap)
            if b is None:
                return Miss(f"{axis.name}={facts[axis.name]} outside measured "
                            f"{values[0]:g}..{values[-1]:g}")
            lo, hi, w, d, ex = b
            any_extra |= ex
            distances[axis.name] = self._distance(axis, d, tv)
            cell[f"{axis.name}_lo"], cell[f"{axis.name}_hi"] = float(values[lo]), float(values[hi])
            brackets.append([(values[lo], 1.0 - w)] + ([(values[hi], w)] if hi != lo else []))
        line_axis = spec.axes[0]
        t0 = float(_FWD[line_axis.transform](float(facts[line_axis.name])))
        y = 0.0
        used: list[np.ndarray] = []
        d0 = 0.0
        lo_x, hi_x = math.inf, -math.inf
        for combo in product(*brackets) if brackets else [()]:
            key = tuple(float(v) for v, _ in combo)
            weight = math.prod(w for _, w in combo)
            line = part.lines.get(key)
            if line is None:
                return Miss(f"no measurements on the line {dict(zip((a.name for a in spec.axes[1:]), key))}")
            xs, ys, rows = line.x, line.y, line.rows
            keep = None
            if exclude_row is not None:
                keep = [i for i, r in enumerate(rows) if exclude_row not in r]
                if len(keep) == len(rows):
                    keep = None
            b = None
            if line.aligned is not None:  # same alignment class first
                q_aligned = float(facts[line_axis.name]) % line_axis.align == 0
                same = [i for i in (keep if keep is not None else range(len(xs)))
                        if line.aligned[i] == q_aligned]
                b = _bracket(xs[same], t0, False)
                if b is not None:
                    xs, ys, rows = xs[same], ys[same], [rows[i] for i in same]
            if b is None:
                if keep is not None:
                    xs, ys, rows = xs[keep], ys[keep], [rows[i] for i in keep]
                b = _bracket(xs, t0, extrap)
            if b is None:
                return Miss(f"{line_axis.name}={facts[line_axis.name]} is not bracketed by "
                            f"measurements on the line {key}")
            lo, hi, w, d, ex = b
            any_extra |= ex
            d0 = max(d0, d)
            y += weight * ((1.0 - w) * ys[lo] + w * ys[hi])
            used += [rows[lo], rows[hi]] if hi != lo else [rows[lo]]
            lo_x, hi_x = min(lo_x, xs[lo]), max(hi_x, xs[hi])
        distances[line_axis.name] = self._distance(line_axis, d0, np.array([lo_x, hi_x]))
        cell[f"{line_axis.name}_lo"] = _inverse(line_axis.transform, lo_x)
        cell[f"{line_axis.name}_hi"] = _inverse(line_axis.transform, hi_x)
        if any_extra and max(distances.values()) > self.max_extrapolation:
            return Miss(f"extrapolation distance {max(distances.values()):.2f} exceeds "
                        f"{self.max_extrapolation}")
        value = math.exp(y) if spec.target_transform == "log" else y
        if part.use_efficiency:
            axes = {a.name: float(facts[a.name]) for a in spec.axes}
            fixed = {k: (facts[k] if v is not TIED else TIED) for k, v in part.fixed.items()}
            for k in ("q_tokens", "kv_heads", "head_dim", "v_head_dim", "kv_dtype"):
                if k not in fixed and k in facts:
                    fixed[k] = facts[k]
            roof = float(ROOFLINES[part.core[1]](axes, fixed, part.core[3], self.system))
            latency = roof / value
        else:
            latency = value
        if not math.isfinite(latency) or latency <= 0:
            return Miss(f"{'extrapolation' if any_extra else 'interpolation'} gives a "
                        f"non-positive latency ({latency:g})")
        return latency, distances, any_extra, np.unique(np.concatenate(used)), cell

    @staticmethod
    def _distance(axis: Axis, d: float, tv: np.ndarray) -> float:
        if axis.transform == "log":
            return d / math.log(2.0)          # octaves
        span = float(tv[-1] - tv[0]) if len(tv) > 1 else 0.0
        return d / span if span > 0 else 0.0

    def estimate(self, query: CostQuery) -> CostEstimate | Miss:
        part = self.select(query)
        if isinstance(part, Miss):
            return part
        facts = query_facts(query)
        result = self.predict(part, facts)
        if isinstance(result, Miss):
            return result
        latency, distances, extrapolated, rows, cell = result
        total = sum(distances.values())
        if extrapolated:
            method, kind = EstimateMethod.EXTRAPOLATED, MatchKind.EXTRAPOLATED
            confidence, rel_std = max(0.05, 0.5 * math.exp(-total)), 0.15 + 0.25 * total
        else:
            method, kind = EstimateMethod.INTERPOLATED, MatchKind.INTERPOLATED
            confidence, rel_std = min(0.9, max(0.3, 0.9 * math.exp(-0.5 * total))), \
                0.05 + 0.1 * total
        spec = part.spec
        validity = {k: (f"={dict(spec.ties)[k]}" if v is TIED else v)
                    for k, v in part.fixed.items()}
        validity.update(cell)
        controlled = set(part.fixed) | {a.name for a in spec.axes}
        assumptions = [f"evidence does not control {k}={query.dims[k]!r}"
                       for k in sorted(query.dims) if k not in controlled]
        target = "achieved fraction of roofline" if part.use_efficiency else "latency"
        axes_txt = ", ".join(f"{a.transform} {a.name}" for a in spec.axes)
        assumptions.append(f"{method.value} {target} ({spec.target_transform}) over {axes_txt}")
        components = {f"distance_{k}": v for k, v in distances.items()}
        return CostEstimate(
            latency_s=latency, method=method, match_kind=kind, provider=self.name,
            provider_revision=self.revision, source_revision=self._groups[part.group][1],
            raw_record_ids=tuple(self._record_ids.take(rows).to_pylist()),
            validity=FrozenDict(validity),
            uncertainty=Uncertainty(kind="interpolation", rel_std=rel_std,
                                    sample_count=len(rows)),
            components=FrozenDict(components), assumptions=tuple(assumptions),
            bottleneck="measured", confidence=confidence)


def _inverse(transform: str, t: float) -> float:
    if transform == "log":
        return float(f"{math.exp(t):.10g}")
    if transform == "sqrt":
        return float(t * t)
    return float(t)
