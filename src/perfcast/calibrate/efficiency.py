"""Size-dependent efficiency curves for the analytic path, fitted on kernel observations.

The plain roofline prices a task at peak rates times one catalog efficiency per engine.
Measured kernels are far from that at small sizes (launch, tail and wave effects) and
near the ridge point (compute and memory do not overlap perfectly). Here each operation
class gets a curve fitted on measured kernel tables (docs/notes/efficiency-curves.md):

    t_c    = F / (P e_c)                 compute time at the class's compute efficiency
    t_m    = B / (W e_m)                 memory time at its bandwidth efficiency
    t_core = (t_c^q + t_m^q)^(1/q)       imperfect overlap near the ridge (q -> inf: max)
    t      = t0 + t_core (1 + (t_half / t_ideal)^h)

with F the FLOPs, B the bytes moved, P the device's peak matrix rate for the class's
compute dtype, W its peak HBM bandwidth and t_ideal = max(F/P, B/W) (no catalog
efficiency). The achieved fraction of the ideal, eff = t_ideal / t, is smooth in log size
and in arithmetic intensity relative to the ridge point P/W, and bounded in (0, 1] by
construction (e_c, e_m <= 1, q >= 1, t0 >= 0). Collectives use the link's bare
bandwidth instead: t_ideal = ring bytes factor x M / B_link, t_core = t_ideal / e_bw.

Classes: `gemm.<dtype>`, `attention.prefill.<dtype>`, `attention.decode.<dtype>`,
`moe.<dtype>` (dtype = the table's quantisation mode, fp16 pooled with bf16) and
`<collective>.p<participants>`. Fits are robust least squares on log latency
(`soft_l1`), with a 1-sigma std per parameter from the Jacobian at the solution.
Cross-validation: leave-one-system-out (when several systems are given) and, within a
system, leave-one-framework-out (trtllm / vllm / sglang / nccl tables).

Entry points: `observations(db_or_records, system)` -> `Observations`;
`fit_class(obs, cls)` / `fit_curves(obs)`; `fit_fold(obs, group_by, held_out)` /
`cross_validate(obs, group_by)`; `fit_efficiency([(db, system), ...] | obs)` ->
`EfficiencyFit`, whose `part()` is the `analytic_efficiency` `CalibrationPart`. The
curve itself and the class names live in `perfcast.evidence.calibrated`, shared with
`CalibratedAnalyticProvider`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from perfcast.calibrate.revision import CalibrationPart, FittedParameter, make_part, plain
from perfcast.core.dtypes import DType, dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.evidence.calibrated import (
    COMPUTE,
    MARGIN_DECADES,
    PART_NAME,
    RING_FACTOR,
    collective_class,
    curve_latency_s,
    is_collective,
    link_bandwidth,
    matrix_rate,
    operator_class,
    params_of,
)
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.records import PerformanceRecord
from perfcast.hardware.model import System

PROCEDURE = "perfcast.calibrate.efficiency"
VERSION = "1"
MIN_RECORDS = 40            # fewest (deduplicated) records a class or fold is fitted on
MIN_HELD_OUT = 10           # fewest held-out records a fold is scored on
MAX_FIT_PER_GROUP = 2000    # records per (class, system, framework) entering one fit
F_SCALE = 0.1               # soft_l1 knee: log residuals beyond ~10 % count linearly
WITHIN = 0.25               # reported: share of held-out records predicted within 25 %
TABLES = ("gemm_perf", "context_attention_perf", "generation_attention_perf", "moe_perf",
          "nccl_perf", "custom_allreduce_perf")

# (weight, activation) storage dtypes of a gemm/moe table row keyed by quantisation mode
OPERANDS = {"bf16": ("bf16", "bf16"), "fp16": ("fp16", "fp16"), "fp8": ("fp8", "fp8"),
            "fp8_block": ("fp8_block", "fp8"), "int8": ("int8", "int8"),
            "int4": ("int4", "bf16"), "mxfp4": ("mxfp4", "bf16"), "nvfp4": ("nvfp4", "bf16")}
# MoE implementations whose experts are not gated (one up projection, no gate)
NON_GATED_MOE = frozenset({"moe_torch_flow_nongated"})


class InsufficientDataError(ConfigError):
    """A class or fold has fewer records than a fit needs."""


# -- observations -------------------------------------------------------------------
@dataclass(frozen=True)
class Observations:
    """Deduplicated kernel observations with their work facts, one row each (numpy)."""

    cls: np.ndarray          # class name per row
    system: np.ndarray       # system name
    framework: np.ndarray    # trtllm | vllm | sglang | nccl ...
    flops: np.ndarray
    nbytes: np.ndarray       # bytes read + written (operators); message bytes (collectives)
    peak: np.ndarray         # ops/s of the class's compute dtype (0 for collectives)
    bw: np.ndarray           # HBM bytes/s (operators); link bytes/s (collectives)
    ideal_s: np.ndarray
    measured_s: np.ndarray
    digests: tuple[str, ...] = ()
    systems: tuple[str, ...] = ()
    dropped: Mapping[str, int] = field(default_factory=dict)
    # per row, a GEMM's weight shape "n x k" ('' for other operations): `shape` folds
    shape: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.shape is None:
            object.__setattr__(self, "shape", np.full(len(self.cls), ""))
        for key in ("cls", "system", "framework", "shape"):  # fixed-width strings: fast compares
            arr = getattr(self, key)
            if arr.dtype.kind != "U":
                object.__setattr__(self, key, np.asarray(arr, dtype=str))

    def __len__(self) -> int:
        return len(self.cls)

    def take(self, mask: np.ndarray) -> Observations:
        cols = {k: getattr(self, k)[mask] for k in _ARRAYS}
        return Observations(**cols, digests=self.digests, systems=self.systems,
                            dropped=self.dropped, shape=self.shape[mask])

    @staticmethod
    def concat(parts: Sequence[Observations]) -> Observations:
        cols = {k: np.concatenate([getattr(p, k) for p in parts]) for k in _ARRAYS}
        dropped: dict[str, int] = {}
        for p in parts:
            for k, v in p.dropped.items():
                dropped[k] = dropped.get(k, 0) + v
        return Observations(**cols, digests=tuple(d for p in parts for d in p.digests),
                            systems=tuple(s for p in parts for s in p.systems),
                            dropped=dropped,
                            shape=np.concatenate([p.shape for p in parts]))


_ARRAYS = ("cls", "system", "framework", "flops", "nbytes", "peak", "bw", "ideal_s",
           "measured_s")
# selector keys that name a software version: a shape measured under several versions of
# one framework and implementation is one observation (median latency)
_VERSION_KEYS = ("sel.str.runtime_revision", "sel.str.nccl_version")


class _Columns:
    """Numpy views of a record table's columns (strings as dictionary codes)."""

    def __init__(self, t: pa.Table) -> None:
        self.t = t
        self._cache: dict[str, object] = {}

    def num(self, name: str) -> np.ndarray:
        if name not in self._cache:
            if name not in self.t.column_names:
                self._cache[name] = np.full(self.t.num_rows, np.nan)
            else:
                self._cache[name] = np.asarray(
                    self.t.column(name).to_numpy(zero_copy_only=False), dtype=float)
        return self._cache[name]

    def codes(self, name: str) -> tuple[np.ndarray, list]:
        """(int64 codes, values); code -1 and value '' for null or absent."""
        key = "#" + name
        if key not in self._cache:
            if name not in self.t.column_names:
                self._cache[key] = (np.full(self.t.num_rows, -1, dtype=np.int64), [])
            else:
                enc = self.t.column(name).combine_chunks().dictionary_encode()
                codes = np.asarray(pc.fill_null(enc.indices, -1).to_numpy(
                    zero_copy_only=False), dtype=np.int64)
                self._cache[key] = (codes, enc.dictionary.to_pylist())
        return self._cache[key]

    def text(self, name: str) -> np.ndarray:
        """Per-row strings ('' for null) as an object array."""
        codes, values = self.codes(name)
        lut = np.array([*values, ""], dtype=object)
        return lut[codes]


_MIX = np.random.default_rng(20261201).integers(1, 2**63 - 1, size=256, dtype=np.int64) | 1


def _hash_rows(columns: Sequence[np.ndarray]) -> np.ndarray:
    """A 64-bit hash per row of integer columns (wrapping multiply-add with fixed odd
    multipliers; a collision among a few million rows has odds of about 1e-7)."""
    h = np.zeros(len(columns[0]), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i, c in enumerate(columns):
            v = c.astype(np.uint64)
            h = (h ^ (v * np.uint64(_MIX[i % len(_MIX)]))) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(29)
    return h


def _dedup(cols: _Columns) -> tuple[np.ndarray, np.ndarray, int]:
    """(row indices, median latency per kept row, rows merged): the rows of a source
    file once (a table reused under another version is one measurement), then one row
    per measured key (every selector but the version ones) with the median latency."""
    t = cols.t
    # one source file imported under several versions (reuse.yaml): keep its first
    dig, _ = cols.codes("source_digest")
    rev, _ = cols.codes("source_revision")
    pair = dig * (int(rev.max()) + 2) + rev
    uniq, at = np.unique(pair, return_index=True)
    owner = {}
    for p_, i in sorted(zip(uniq.tolist(), at.tolist()), key=lambda x: x[1]):
        owner.setdefault(int(dig[i]), p_)
    first = np.flatnonzero(np.isin(pair, np.array(sorted(owner.values()))))
    keys = []
    for c in t.column_names:
        if c in ("operation", "dtype", "hardware") or (c.startswith("sel.str.")
                                                        and c not in _VERSION_KEYS):
            keys.append(cols.codes(c)[0][first])
        elif c.startswith("sel.") and c not in _VERSION_KEYS:
            keys.append(np.nan_to_num(cols.num(c)[first], nan=-1.0).view(np.int64))
    lat = cols.num("latency_s")[first]
    _, keep, inv = np.unique(_hash_rows(keys), return_index=True, return_inverse=True)
    inv = inv.ravel()
    order = np.lexsort((lat, inv))
    counts = np.bincount(inv)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sl = lat[order]
    med = 0.5 * (sl[starts + (counts - 1) // 2] + sl[starts + counts // 2])
    return first[keep], med, int(t.num_rows - len(keep))


def _pairs(q, c, w):
    """Causal (query, key) pairs per request, window `w` (nan: none); the workload's
    `attended_pairs`, vectorised."""
    plain = q * c + q * (q + 1) / 2.0
    win = np.where(np.isnan(w), np.inf, w)
    full_start = np.maximum(c + 1, win)
    n_full = np.clip(c + q - full_start + 1, 0, None)
    n_part = q - n_full
    partial = np.where(n_part > 0, (2 * c + 1 + n_part) * n_part / 2.0, 0.0)
    windowed = np.where(np.isfinite(win), n_full * np.where(np.isfinite(win), win, 0) + partial,
                        plain)
    return np.where(np.isfinite(win) & (c + q > win), windowed, plain)


def _scale_bytes(w_dtype: str, elems):
    d = DType(w_dtype)
    per = {DType.FP8_BLOCK: 4 / (128 * 128), DType.NVFP4: 1 / 16, DType.MXFP4: 1 / 32,
           DType.INT4: 2 / 128}.get(d, 0.0)
    return elems * per


def _work(op: str, dtype: str, cols: _Columns, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, bytes) of rows `idx` (one operation and dtype) by the workload layer's
    formulas (perfcast.workload.graph: gemm, attention, moe_experts)."""
    def num(a):
        return cols.num(f"sel.int.{a}")[idx]

    if op == "gemm":
        m, n, k = num("m"), num("n"), num("k")
        w_dt, a_dt = OPERANDS[dtype]
        flops = 2.0 * m * n * k
        nbytes = (m * k * dtype_bytes(a_dt) + k * n * dtype_bytes(w_dt)
                  + _scale_bytes(w_dt, k * n) + m * n * 2.0)
        return flops, nbytes
    if op == "attention":
        b, q, kv = num("batch"), num("q_tokens"), num("kv_len")
        h, kvh, hd, vhd, w = num("heads"), num("kv_heads"), num("head_dim"), \
            num("v_head_dim"), num("window")
        vhd = np.where(np.isnan(vhd), hd, vhd)
        codes, values = cols.codes("sel.str.kv_dtype")
        lut = np.array([dtype_bytes(v) for v in values] + [dtype_bytes(dtype)])
        kvb = lut[codes[idx]]
        ab = dtype_bytes(dtype)
        flops = 2.0 * h * (hd + vhd) * _pairs(q, kv - q, w) * b
        read_len = np.where(np.isnan(w), kv, np.minimum(kv, np.where(q > 1, w + q - 1, w)))
        nbytes = b * (q * h * hd * ab + read_len * kvh * (hd + vhd) * kvb + q * h * vhd * ab)
        return flops, nbytes
    if op == "moe":
        tok, hid, inter, topk, ne, tp, ep = (num(a) for a in (
            "tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp", "moe_ep"))
        codes, values = cols.codes("sel.str.implementation")
        lut = np.array([v not in NON_GATED_MOE for v in values] + [True])
        gated = lut[codes[idx]]
        w_dt, a_dt = OPERANDS[dtype]
        inter_l = inter / tp
        up_n = np.where(gated, 2.0, 1.0) * inter_l
        pairs = tok * topk / ep
        # balanced table routing spreads tokens evenly: min(E, T k) experts active
        active = np.minimum(ne, tok * topk) / ep
        active_w = active * (hid * up_n + inter_l * hid)
        flops = 2.0 * pairs * hid * up_n + 2.0 * pairs * inter_l * hid \
            + np.where(gated, 5.0, 1.0) * pairs * inter_l
        nbytes = (pairs * hid * dtype_bytes(a_dt) + active_w * dtype_bytes(w_dt)
                  + _scale_bytes(w_dt, active_w) + pairs * (up_n + inter_l) * 2.0
                  + pairs * (up_n + inter_l + hid) * 2.0)
        return flops, nbytes
    raise ValueError(op)


def observations(source: PerformanceDatabase | Iterable[PerformanceRecord],
                 system: System) -> Observations:
    """Kernel observations of `system` from an imported database (or records): the
    operations and dtypes this module fits, deduplicated, with work facts and ideal
    times. MoE rows other than `balanced` routing are left out (their work depends on a
    routing the table does not state), and so are rows faster than their ideal time
    (the collector's data stayed in cache: no deployment runs them); `dropped` counts
    both and the merged duplicates."""
    db = source if isinstance(source, PerformanceDatabase) else \
        PerformanceDatabase.from_records(list(source))
    t = db.table
    hw = t.column("hardware").combine_chunks().dictionary_encode().dictionary.to_pylist()
    if hw != [system.name]:
        if system.name not in hw:
            raise ConfigError(f"no records of {system.name} (found {sorted(hw)})",
                              source=db.name or "database", field="hardware")
        t = t.filter(pc.field("hardware") == system.name)
    cols = _Columns(t)
    rows, lat, dups = _dedup(cols)
    dropped = {"duplicates": dups, "faster_than_ideal": 0, "moe_not_balanced": 0}
    op_c, op_v = cols.codes("operation")
    dt_c, dt_v = cols.codes("dtype")
    rt = cols.text("sel.str.runtime")[rows]
    lib = cols.text("sel.str.nccl_version")[rows]
    fw = np.where(rt != "", rt, np.where(lib != "", "nccl", "?"))
    bw_hbm = float(system.device.memory.bw_bytes_per_s)
    combo = op_c[rows] * (len(dt_v) + 1) + dt_c[rows]
    parts = []
    for code in np.unique(combo):
        sel = np.flatnonzero(combo == code)
        idx = rows[sel]
        op, dt = op_v[op_c[idx[0]]], dt_v[dt_c[idx[0]]]
        n = len(idx)
        if op in RING_FACTOR:
            p = cols.num("sel.int.participants")[idx]
            msg = cols.num("sel.int.message_bytes")[idx]
            ok = (p >= 2) & (msg > 0)
            ps = np.unique(p[ok])
            link = np.full(n, np.nan)
            cls = np.full(n, "", dtype=object)
            for v in ps:
                link[p == v] = link_bandwidth(system, int(v))
                cls[p == v] = collective_class(op, int(v))
            fac = np.where(ok, RING_FACTOR[op](np.maximum(p, 2)), np.nan)
            flops, nbytes, peak, bw = np.zeros(n), msg, np.zeros(n), link
            ideal = fac * msg / link
        elif op in ("gemm", "attention", "moe") and dt in COMPUTE:
            flops, nbytes = _work(op, dt, cols, idx)
            peak = np.full(n, matrix_rate(system, dt))
            bw = np.full(n, bw_hbm)
            ideal = np.maximum(flops / peak, nbytes / bw)
            ok = np.isfinite(ideal) & (ideal > 0)
            if op == "moe":
                routed = cols.text("sel.str.distribution")[idx] == "balanced"
                dropped["moe_not_balanced"] += int((~routed).sum())
                ok &= routed
            ph_c, ph_v = cols.codes("sel.str.phase")
            lut = np.array([operator_class(op, dt, v) for v in ph_v]
                           + [operator_class(op, dt)], dtype=object)
            cls = lut[ph_c[idx]]
        else:
            continue
        fast = ok & (lat[sel] < ideal)
        dropped["faster_than_ideal"] += int(fast.sum())
        ok &= ~fast
        shape = np.full(n, "", dtype=object)
        if op == "gemm":
            n_, k_ = (np.nan_to_num(cols.num(f"sel.int.{a}")[idx], nan=-1).astype(np.int64)
                      .astype(str) for a in ("n", "k"))
            shape = np.char.add(np.char.add(n_, "x"), k_)
        parts.append(Observations(
            cls=cls[ok], system=np.full(int(ok.sum()), system.name, dtype=object),
            framework=fw[sel][ok], flops=flops[ok], nbytes=nbytes[ok], peak=peak[ok],
            bw=bw[ok], ideal_s=ideal[ok], measured_s=lat[sel][ok], shape=shape[ok]))
    if not parts:
        raise ConfigError(f"no gemm, attention, moe or collective records of {system.name}",
                          source=db.name or "database")
    obs = Observations.concat(parts)
    return Observations(**{k: getattr(obs, k) for k in _ARRAYS}, digests=(db.digest,),
                        systems=(system.name,), dropped=dropped, shape=obs.shape)


# -- fitting ------------------------------------------------------------------------
@dataclass(frozen=True)
class ClassFit:
    cls: str
    values: tuple[float, ...]
    stds: tuple[float | None, ...]
    records: int                     # records the fit used (after the per-group cap)
    log10_flops: tuple[float, float]
    log10_bytes: tuple[float, float]

    def predict(self, obs: Observations) -> np.ndarray:
        return curve_latency_s(self.cls, self.values, obs.flops, obs.nbytes, obs.peak,
                               obs.bw, obs.ideal_s)


def _capped(obs: Observations, seed: int) -> Observations:
    """At most MAX_FIT_PER_GROUP rows per (system, framework), chosen at random with a
    fixed seed: no table dominates a class by its row count."""
    rng = np.random.default_rng(seed)
    keep = np.zeros(len(obs), dtype=bool)
    groups = np.char.add(np.char.add(obs.system, "|"), obs.framework)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        if len(idx) > MAX_FIT_PER_GROUP:
            idx = rng.choice(idx, MAX_FIT_PER_GROUP, replace=False)
        keep[idx] = True
    return obs.take(keep)


def fit_class(obs: Observations, cls: str, *, seed: int = 0) -> ClassFit:
    """Fit the curve of one class on `obs` (rows of other classes are ignored)."""
    from scipy.optimize import least_squares

    sub = obs.take(obs.cls == cls)
    if len(sub) < MIN_RECORDS:
        raise InsufficientDataError(
            f"class {cls} has {len(sub)} records; a fit needs at least {MIN_RECORDS}",
            field=cls, expected=f">= {MIN_RECORDS} deduplicated records")
    log10_flops, log10_bytes = _range(sub.flops), _range(sub.nbytes)
    sub = _capped(sub, seed)
    spec = params_of(cls)
    lo = np.array([p.lower for p in spec])
    hi = np.array([p.upper for p in spec])
    x0 = np.array([p.start for p in spec])
    log_meas = np.log(sub.measured_s)
    x0[-1] = min(x0[-1], 0.5e6 * float(np.min(sub.measured_s)))

    def resid(theta):
        return np.log(curve_latency_s(cls, theta, sub.flops, sub.nbytes, sub.peak, sub.bw,
                                      sub.ideal_s)) - log_meas

    res = least_squares(resid, x0, jac=lambda th: log_jacobian(cls, th, sub), bounds=(lo, hi),
                        loss="soft_l1", f_scale=F_SCALE, x_scale="jac", tr_solver="lsmr",
                        max_nfev=200)
    stds = _stds(res, lo, hi)
    return ClassFit(cls=cls, values=tuple(float(v) for v in res.x), stds=stds,
                    records=len(sub), log10_flops=log10_flops, log10_bytes=log10_bytes)


def log_jacobian(cls: str, theta: Sequence[float], obs: Observations) -> np.ndarray:
    """d log t / d theta of `curve_latency_s` (n x p), analytic."""
    ideal = np.maximum(obs.ideal_s, 1e-15)
    lg_half, h, t0_us = theta[-3], theta[-2], theta[-1]
    x = 10.0 ** lg_half / ideal
    xh = x ** h
    size = 1.0 + xh
    cols = []
    if is_collective(cls):
        core = ideal / theta[0]
        cols.append(-core / theta[0] * size)
    else:
        e_c, e_m, q = theta[0], theta[1], theta[2]
        tc = obs.flops / (obs.peak * e_c)
        tm = obs.nbytes / (obs.bw * e_m)
        top = np.maximum(np.maximum(tc, tm), 1e-15)
        u, v = tc / top, tm / top
        uq, vq = u ** q, v ** q
        norm = uq + vq
        core = top * norm ** (1.0 / q)
        share = norm ** (1.0 / q - 1.0)
        cols.append(-share * uq / u.clip(1e-300) * tc / e_c * size)   # d/d e_compute
        cols.append(-share * vq / v.clip(1e-300) * tm / e_m * size)   # d/d e_memory
        with np.errstate(divide="ignore", invalid="ignore"):
            ulog = np.where(u > 0, uq * np.log(u.clip(1e-300)), 0.0)
            vlog = np.where(v > 0, vq * np.log(v.clip(1e-300)), 0.0)
        cols.append(core * (-np.log(norm) / q ** 2 + (ulog + vlog) / (q * norm)) * size)
    cols.append(core * h * xh * math.log(10.0))                        # d/d log10_t_half
    cols.append(core * xh * np.log(x))                                 # d/d size_h
    cols.append(np.full(len(ideal), 1e-6))                             # d/d t0_us
    t = 1e-6 * t0_us + core * size
    return np.stack(cols, axis=1) / t[:, None]


def _range(x: np.ndarray) -> tuple[float, float]:
    x = x[x > 0]
    if not len(x):
        return (0.0, 0.0)
    return (float(np.log10(x.min())), float(np.log10(x.max())))


def _stds(res, lo, hi) -> tuple[float | None, ...]:
    """1-sigma from (J^T J)^-1 s^2 at the solution; None for a parameter at a bound or
    one the data do not determine."""
    n, p = res.jac.shape
    at_bound = (res.x <= lo + 1e-9 * (1 + abs(lo))) | (res.x >= hi - 1e-9 * (1 + abs(hi)))
    free = ~at_bound
    out: list[float | None] = [None] * p
    if n <= p or not free.any():
        return tuple(out)
    j = res.jac[:, free]
    s2 = 2.0 * res.cost / (n - int(free.sum()))
    try:
        cov = np.linalg.inv(j.T @ j) * s2
    except np.linalg.LinAlgError:
        return tuple(out)
    diag = np.diag(cov)
    for i, v in zip(np.flatnonzero(free), diag):
        if np.isfinite(v) and v >= 0:
            out[i] = float(math.sqrt(v))
    return tuple(out)


def fit_curves(obs: Observations, classes: Iterable[str] | None = None, *, seed: int = 0,
               skipped: dict[str, str] | None = None) -> dict[str, ClassFit]:
    """One curve per class. Named `classes` must each have enough records (else
    InsufficientDataError); with `classes=None` every class present is fitted and the
    ones with too few records are reported in `skipped` instead."""
    named = classes is not None
    todo = sorted(set(classes) if named else set(obs.cls.tolist()))
    fits = {}
    for cls in todo:
        try:
            fits[cls] = fit_class(obs, cls, seed=seed)
        except InsufficientDataError as exc:
            if named or skipped is None:
                raise
            skipped[cls] = str(exc)
    return fits


def scores(fits: Mapping[str, ClassFit], obs: Observations) -> dict[str, dict]:
    """Per class: records, MAPE and median APE of latency, median log ratio."""
    out = {}
    for cls, fit in fits.items():
        sub = obs.take(obs.cls == cls)
        if not len(sub):
            continue
        out[cls] = error_stats(fit.predict(sub), sub.measured_s)
    return out


def error_stats(pred: np.ndarray, meas: np.ndarray) -> dict:
    ape = np.abs(pred - meas) / meas
    lr = np.log(pred / meas)
    return {"records": int(len(meas)), "mape": float(ape.mean()),
            "median_ape": float(np.median(ape)), "p90_ape": float(np.percentile(ape, 90)),
            "median_log_ratio": float(np.median(lr))}


# -- cross-validation ---------------------------------------------------------------
GROUP_BY = ("system", "framework", "shape")


def groups_of(obs: Observations, group_by: str) -> np.ndarray:
    """Fold label per row: the system, system/framework, or system/weight shape (GEMMs
    of one table that differ only in tokens are one group: a shape is held out whole)."""
    if group_by == "system":
        return obs.system
    if group_by in ("framework", "shape"):
        return np.char.add(np.char.add(obs.system, "/"), getattr(obs, group_by))
    raise ValueError(f"group_by {group_by!r}: expected one of {', '.join(GROUP_BY)}")


def fit_fold(obs: Observations, group_by: str, held_out: str, *, seed: int = 0,
             classes: Iterable[str] | None = None) -> dict:
    """Fit on every record outside group `held_out` and score on it. Held-out rows never
    reach the fit. A class whose training or held-out side is too small raises
    InsufficientDataError when named in `classes`, else is listed under `refused`.
    `framework` and `shape` folds stay within the held-out group's system."""
    groups = groups_of(obs, group_by)
    test = groups == held_out
    if not test.any():
        raise ConfigError(f"no records in group {held_out!r}", field=group_by)
    train = ~test
    if group_by in ("framework", "shape"):
        train &= obs.system == obs.system[test][0]
    tr, te = obs.take(train), obs.take(test)
    wanted = sorted(set(classes) if classes is not None else set(te.cls.tolist()))
    fits, refused = {}, {}
    for cls in wanted:
        n_te = int((te.cls == cls).sum())
        try:
            if n_te < MIN_HELD_OUT:
                raise InsufficientDataError(
                    f"fold {held_out}: class {cls} has {n_te} held-out records; scoring "
                    f"needs at least {MIN_HELD_OUT}", field=cls)
            fits[cls] = fit_class(tr, cls, seed=seed)
        except InsufficientDataError as exc:
            if classes is not None:
                raise InsufficientDataError(f"fold {held_out}: {exc}", field=cls) from None
            refused[cls] = str(exc)
    return {"held_out_group": held_out, "records": int(test.sum()),
            "train_records": int(train.sum()), "fits": fits, "refused": refused,
            "in_sample": scores(fits, tr), "held_out": scores(fits, te),
            "residuals": {cls: np.log(f.predict(te.take(te.cls == cls))
                                      / te.measured_s[te.cls == cls])
                          for cls, f in fits.items()}}


def cross_validate(obs: Observations, group_by: str, *, seed: int = 0) -> list[dict]:
    """Every leave-one-group-out fold of `obs` (group_by system | framework | shape)."""
    return [fit_fold(obs, group_by, g, seed=seed)
            for g in sorted(set(groups_of(obs, group_by).tolist()))]


# -- the whole fit and its calibration part -------------------------------------------
@dataclass
class EfficiencyFit:
    fits: dict[str, ClassFit]
    in_sample: dict[str, dict]
    folds: dict[str, list[dict]]          # group_by -> folds
    spread: dict[str, dict]               # class -> held-out residual spread
    skipped: dict[str, str]
    obs: Observations
    wall_s: float
    seed: int = 0

    def part(self) -> CalibrationPart:
        params = []
        for cls, fit in sorted(self.fits.items()):
            for p, v, s in zip(params_of(cls), fit.values, fit.stds):
                params.append(FittedParameter(
                    name=f"efficiency.{cls}.{p.name}", value=float(min(max(v, p.lower),
                                                                       p.upper)),
                    unit=p.unit, lower=p.lower, upper=p.upper, std=s,
                    description=p.description))
        domain = {cls: {"log10_flops": list(f.log10_flops), "log10_bytes": list(f.log10_bytes),
                        "records": f.records} for cls, f in sorted(self.fits.items())}
        fitted_on = {"evidence": sorted(set(self.obs.digests)),
                     "systems": sorted(set(self.obs.systems)),
                     "records": int(len(self.obs)), "dropped": dict(self.obs.dropped),
                     "domain": domain, "skipped": dict(sorted(self.skipped.items()))}
        primary = "system" if "system" in self.folds else \
            "framework" if "framework" in self.folds else next(iter(self.folds))
        cv = {"group_by": primary, "folds": [_fold_json(f) for f in self.folds[primary]],
              "summary": {"held_out": pooled_scores(self.folds[primary]),
                          "in_sample": self.in_sample,
                          "residual_spread": self.spread, "fit_wall_s": round(self.wall_s, 2)}}
        if primary == "system" and "framework" in self.folds:
            cv["secondary"] = {"group_by": "framework",
                               "folds": [_fold_json(f) for f in self.folds["framework"]],
                               "summary": {"held_out": pooled_scores(self.folds["framework"])}}
        procedure = {"name": PROCEDURE, "version": VERSION, "options": {
            "loss": "soft_l1", "f_scale": F_SCALE, "min_records": MIN_RECORDS,
            "min_held_out": MIN_HELD_OUT, "max_fit_per_group": MAX_FIT_PER_GROUP,
            "margin_decades": MARGIN_DECADES, "seed": self.seed,
            "curve": "t = t0 + (tc^q + tm^q)^(1/q) (1 + (t_half/t_ideal)^h)"}}
        return make_part(PART_NAME, procedure=procedure, parameters=params,
                         fitted_on=fitted_on, cv=_finite(cv))


def _fold_json(f: dict) -> dict:
    return {"held_out": f["held_out_group"], "records": f["records"],
            "train_records": f["train_records"],
            "in_sample": {c: _short(s) for c, s in f["in_sample"].items()},
            "held_out_scores": {c: _short(s) for c, s in f["held_out"].items()},
            "refused": f["refused"]}


def _short(s: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in s.items()}


def _residuals(folds: Iterable[dict]) -> dict[str, np.ndarray]:
    """Per class, the held-out log residuals log(pred / measured) of every fold."""
    res: dict[str, list[np.ndarray]] = {}
    for f in folds:
        for cls, r in f["residuals"].items():
            res.setdefault(cls, []).append(r)
    return {cls: np.concatenate(rs) for cls, rs in sorted(res.items())}


def pooled_scores(folds: Iterable[dict]) -> dict[str, dict]:
    """Per class: the error over every held-out record of every fold."""
    out = {}
    for cls, r in _residuals(folds).items():
        ape = np.abs(np.expm1(r))
        out[cls] = {"records": int(len(r)), "mape": round(float(ape.mean()), 4),
                    "median_ape": round(float(np.median(ape)), 4)}
    return out


def residual_spread(folds: Iterable[dict]) -> dict[str, dict]:
    """Per class, from the held-out log residuals log(pred / measured) of `folds`:
    rel_std (1.4826 x MAD of the log ratio, a robust sigma), the 10th/90th percentile
    of measured / predicted and the share within `WITHIN`."""
    return {cls: _spread(r) for cls, r in _residuals(folds).items()}


def _spread(r: np.ndarray) -> dict:
    med = float(np.median(r))
    return {"records": int(len(r)),
            "log_std": round(float(1.4826 * np.median(np.abs(r - med))), 4),
            "median_log_ratio": round(med, 4),
            "ratio_p10": round(float(np.exp(-np.percentile(r, 90))), 4),
            "ratio_p90": round(float(np.exp(-np.percentile(r, 10))), 4),
            "within": round(float(np.mean(np.abs(np.expm1(r)) <= WITHIN)), 4)}


def transfer_part(part: CalibrationPart, obs: Observations, *,
                  classes: Iterable[str] | None = None) -> CalibrationPart:
    """`part` with its curves declared for the system of `obs` (one system the part was
    not fitted on), nothing refitted: each class with at least `MIN_HELD_OUT` of that
    system's records is scored on all of them (a leave-one-system-out fold whose
    training side is the part's own systems), and the score is what
    `CalibratedAnalyticProvider` reports there: `fitted_on.transfers.<system>` =
    {from, evidence, classes, held_out, residual_spread}."""
    systems = sorted(set(obs.system.tolist()))
    if len(systems) != 1:
        raise ConfigError(f"a transfer is checked on one system, got {systems}",
                          field="system")
    target = systems[0]
    fitted = tuple(part.fitted_on.get("systems", ()))
    if target in fitted:
        raise ConfigError(f"part {part.name} was fitted on {target}: nothing to transfer",
                          field="system")
    values = part.values()
    wanted = sorted(set(classes) if classes is not None else set(obs.cls.tolist()))
    spread, held_out = {}, {}
    for cls in wanted:
        names = [f"efficiency.{cls}.{p.name}" for p in params_of(cls)]
        sub = obs.take(obs.cls == cls)
        if not all(n in values for n in names) or len(sub) < MIN_HELD_OUT:
            if classes is not None:
                raise InsufficientDataError(
                    f"class {cls}: {len(sub)} {target} records (need {MIN_HELD_OUT}) or no "
                    f"curve in part {part.name}", field=cls)
            continue
        pred = curve_latency_s(cls, [values[n] for n in names], sub.flops, sub.nbytes,
                               sub.peak, sub.bw, sub.ideal_s)
        spread[cls] = _spread(np.log(pred / sub.measured_s))
        held_out[cls] = _short(error_stats(pred, sub.measured_s))
    if not spread:
        raise InsufficientDataError(f"no class of part {part.name} has {MIN_HELD_OUT} "
                                    f"records of {target}", field="classes")
    fitted_on = plain(part.fitted_on)
    transfers = dict(fitted_on.get("transfers", {}))
    transfers[target] = {"from": list(fitted), "evidence": sorted(set(obs.digests)),
                         "classes": sorted(spread), "held_out": held_out,
                         "residual_spread": spread}
    fitted_on["transfers"] = transfers
    return make_part(part.name, procedure=plain(part.procedure), parameters=part.parameters,
                     fitted_on=fitted_on, cv=plain(part.cv))


def _finite(x):
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def fit_efficiency(sources: Sequence[tuple[PerformanceDatabase | Iterable[PerformanceRecord],
                                           System]] | Observations,
                   *, seed: int = 0, cross_validation: bool = True,
                   group_by: Sequence[str] | None = None) -> EfficiencyFit:
    """Fit every class on all given (database, system) pairs, with cross-validation:
    leave-one-system-out when there are two or more systems, and leave-one-framework-
    out within each system; `group_by` names the fold schemes instead (e.g. `("shape",)`
    for one system's table of one framework). The held-out residual spread per class
    (pooled over every fold) is the uncertainty `CalibratedAnalyticProvider` reports."""
    start = time.perf_counter()
    obs = sources if isinstance(sources, Observations) else \
        Observations.concat([observations(db, sys) for db, sys in sources])
    skipped: dict[str, str] = {}
    fits = fit_curves(obs, seed=seed, skipped=skipped)
    folds: dict[str, list[dict]] = {}
    if cross_validation:
        schemes = list(group_by) if group_by is not None else \
            (["system"] if len(set(obs.system.tolist())) > 1 else []) + ["framework"]
        for scheme in schemes:
            folds[scheme] = cross_validate(obs, scheme, seed=seed)
    every = [f for fs in folds.values() for f in fs]
    spread = residual_spread(every)
    return EfficiencyFit(fits=fits, in_sample=scores(fits, obs), folds=folds, spread=spread,
                         skipped=skipped, obs=obs, wall_s=time.perf_counter() - start,
                         seed=seed)


def load_aiconfigurator(root, system: System) -> PerformanceDatabase:
    """The tables this module fits (`TABLES`) of one AIConfigurator system folder."""
    from perfcast.evidence.importers.aiconfigurator import import_system

    return import_system(root, hardware=system.name, tables=TABLES)


def roofline_latency_s(obs: Observations, systems: Mapping[str, System]) -> np.ndarray:
    """What the uncalibrated analytic path answers for each observation: the roofline
    provider (catalog efficiencies, launch overhead) for operators and the alpha-beta
    collective model (`algorithm="auto"`) for collectives, vectorised."""
    from perfcast.evidence.collectives import collective_time

    out = np.empty(len(obs))
    for name in sorted(set(obs.system.tolist())):
        system = systems[name]
        on = obs.system == name
        coll = np.array([is_collective(c) for c in obs.cls], dtype=bool) & on
        op = on & ~coll
        eff = system.efficiency
        out[op] = np.maximum(obs.flops[op] / (obs.peak[op] * eff.matrix),
                             obs.nbytes[op] / (obs.bw[op] * eff.memory)) \
            + system.device.launch_overhead_s
        for i in np.flatnonzero(coll):
            kind, p = obs.cls[i].split(".")
            tier = system.tier_for_group(int(p[1:]))
            out[i] = collective_time(kind, float(obs.nbytes[i]), int(p[1:]), tier, "auto")[0]
    return out
