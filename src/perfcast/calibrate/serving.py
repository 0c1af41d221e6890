"""Serving overheads fitted on measured deployments, with cross-validation.

The host-side times the simulator adds to GPU work (front-end, first chunk, serialised
front-end service, per-iteration and per-request host time, eager kernel issue) are not
in any datasheet. This procedure fits them per backend on end-to-end observations
(silicon rows):

1. Linearise. Every row is simulated once at the start values `theta0` (data-free,
   `ParameterSpec.start`) and once per parameter of its backend at `theta0 + step`
   (forward differences), giving per row TTFT and TPOT and their slopes.
2. Fit. Robust least squares (scipy `least_squares`, soft-L1 loss) on the log errors
   log(pred / measured) of TTFT and TPOT, with pred taken from the linearised model,
   within bounds that keep every time physical (>= 0). Parameters are per backend and
   tied to a pooled value by a weak quadratic penalty, so a backend absent from the
   training rows gets the pool (leave-one-backend-out then measures transfer).
   1-sigma uncertainties come from the Jacobian at the solution.
3. Cross-validate. For each fold (one group of rows by model, backend, system or
   campaign held out) the fit above runs on the other rows only; the held-out rows are
   then simulated exactly (not linearised) with the fold's parameters. In-sample fold
   scores use the linearised model and say so.

The simulator is the one `perfcast validate silicon` runs (`serving.silicon`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from perfcast.calibrate.revision import CalibrationPart, FittedParameter, make_part
from perfcast.core.errors import ConfigError

if TYPE_CHECKING:   # (imported when a fit starts its pools: multiprocessing is slow to load)
    from concurrent.futures import ProcessPoolExecutor

PROCEDURE = "serving_overheads_linearised_robust_ls"
PROCEDURE_VERSION = 1
PART_NAME = "serving_overheads"
BACKENDS = ("sglang", "trtllm", "vllm")
GROUP_KEYS = ("model", "backend", "system", "campaign")


@dataclass(frozen=True)
class ParameterSpec:
    """One fitted overhead (a field of `serving.backends.Overheads`, in us)."""

    field: str            # Overheads field without the `_s` suffix
    start: float          # linearisation point (data-free), us
    step: float           # forward-difference step, us
    lower: float
    upper: float
    description: str
    # slopes known in closed form, no simulation needed (see `_first_chunk_slopes`)
    analytic: bool = False


PARAMETERS: tuple[ParameterSpec, ...] = (
    ParameterSpec("frontend_overhead", 20000.0, 10000.0, 0.0, 300000.0,
                  "time in the OpenAI-compatible server before the engine sees a request "
                  "(HTTP, tokenisation)"),
    ParameterSpec("first_chunk_overhead", 20000.0, 10000.0, 0.0, 300000.0,
                  "time from the engine's first token to the client's first streamed chunk",
                  analytic=True),
    ParameterSpec("frontend_request_service", 0.0, 5000.0, 0.0, 50000.0,
                  "front-end work done one request at a time (a single event loop)"),
    ParameterSpec("step_overhead", 1000.0, 1000.0, 0.0, 20000.0,
                  "host time per engine iteration"),
    ParameterSpec("per_request_overhead", 20.0, 20.0, 0.0, 500.0,
                  "host time per running request per iteration"),
    ParameterSpec("kernel_launch_eager", 4.0, 4.0, 1.0, 60.0,
                  "host time to issue one kernel in an iteration run without a CUDA graph"),
)


def parameter_name(backend: str, spec_field: str) -> str:
    return f"serving.{backend}.{spec_field}_us"


def serving_overheads(part: CalibrationPart | None) -> dict[str, dict[str, float]]:
    """{backend: {Overheads field (seconds): value}} for `validate_rows(overheads=...)`
    and `BackendDefaults.with_overheads`; {} without a part."""
    out: dict[str, dict[str, float]] = {}
    if part is None:
        return out
    for p in part.parameters:
        _, backend, name = p.name.split(".", 2)
        if backend == "pool":
            continue
        out.setdefault(backend, {})[name[: -len("_us")] + "_s"] = p.value * 1e-6
    return out


def theta_overheads(theta: dict[str, float]) -> dict[str, dict[str, float]]:
    """Parameter values by name (us) -> the `overheads` mapping of `validate_rows`."""
    out: dict[str, dict[str, float]] = {}
    for name, value in theta.items():
        _, backend, fld = name.split(".", 2)
        if backend != "pool":
            out.setdefault(backend, {})[fld[: -len("_us")] + "_s"] = value * 1e-6
    return out


def campaign_of(row: dict) -> str:
    """The measurement campaign a row belongs to, for grouping folds only: the first
    `;`-separated part of its provenance text (the dump or file it came from)."""
    return (row.get("silicon_data_source") or "").split(";", 1)[0].strip() or "(none)"


def row_groups(rows: Sequence[dict], key: str) -> list[str]:
    """Each row's fold group by `key` (one of `GROUP_KEYS`)."""
    if key not in GROUP_KEYS:
        raise ConfigError(f"unknown fold grouping {key!r}", field="--cv",
                          expected=" | ".join(GROUP_KEYS))
    if key == "campaign":
        return [campaign_of(r) for r in rows]
    col = {"model": "model_path"}.get(key, key)
    return [(r.get(col) or "").strip() for r in rows]


# -- simulation in worker processes -----------------------------------------------------

@dataclass(frozen=True)
class SimulationSetup:
    configs_dir: str | None
    evidence_root: str | None
    statistic: str = "mean"
    # a revision JSON whose calibrated analytic providers the simulator asks after the
    # measured evidence (None: physics-only analytic models)
    analytic_revision: str | None = None


_WORKER_STATE: dict = {}


def _worker_tools(setup: SimulationSetup):
    """Per process: one evidence loader, one cost cache, one set of calibrated providers
    per system (the same objects on every call, so cached costs stay valid)."""
    key = (setup.configs_dir, setup.evidence_root, setup.analytic_revision)
    if _WORKER_STATE.get("key") != key:
        from perfcast.serving.deploy import StepModelCache
        evidence_for = None
        if setup.evidence_root:
            from perfcast.serving.evidence import evidence_loader
            evidence_for = evidence_loader(Path(setup.evidence_root))
        analytic_for = None
        if setup.analytic_revision:
            from perfcast.calibrate.store import read_revision
            from perfcast.evidence.calibrated import providers_by_system
            analytic_for = providers_by_system(read_revision(Path(setup.analytic_revision)))
        _WORKER_STATE.update(key=key, cache=StepModelCache(), evidence_for=evidence_for,
                             analytic_for=analytic_for)
    return _WORKER_STATE["cache"], _WORKER_STATE["evidence_for"], _WORKER_STATE["analytic_for"]


def _simulate(setup: SimulationSetup, rows: list[dict], overheads: dict) -> list[tuple]:
    from perfcast.serving.silicon import validate_rows
    cache, evidence_for, analytic_for = _worker_tools(setup)
    res = validate_rows(rows, configs_dir=Path(setup.configs_dir) if setup.configs_dir else None,
                        evidence_for=evidence_for, overheads=overheads, cache=cache,
                        statistic=setup.statistic, analytic_for=analytic_for)
    return [(r.pred_ttft_ms, r.pred_tpot_ms, r.reason) for r in res]


def _perturbed_pass(setup: SimulationSetup, rows: list[dict], theta0: dict[str, float],
                    field_name: str | None, steps: dict[str, float]) -> list[tuple]:
    """One simulation of every row, with parameter field `field_name` of every backend
    moved by its step (None: the start values). A row depends only on its own
    backend's parameters, so one pass gives every row its slope for that field."""
    theta = dict(theta0)
    if field_name is not None:
        for name in theta0:
            if name.split(".")[2] == f"{field_name}_us":
                theta[name] = theta0[name] + steps[name]
    return _simulate(setup, rows, theta_overheads(theta))


def _simulation_weight(row: dict) -> float:
    """Rough cost of simulating a row: engine iterations grow with the output length,
    and each iteration's bookkeeping with the requests in flight."""
    try:
        osl = float(row.get("osl") or 1)
        conc = float(row.get("batch_size") or 1) * float(row.get("attention_dp_size") or 1)
    except ValueError:
        return 1.0
    return max(osl, 1.0) * (1.0 + conc / 64.0)


def _chunks(rows: Sequence[dict], n: int) -> list[list[int]]:
    """Row indices split into n chunks of about equal simulation cost, whole (system,
    model) groups kept together so each worker's costed graphs are reused."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r.get("system", ""), r.get("model_path", "")), []).append(i)
    weight = {key: sum(_simulation_weight(rows[i]) for i in idx) for key, idx in groups.items()}
    chunks: list[list[int]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for key in sorted(groups, key=weight.__getitem__, reverse=True):
        k = loads.index(min(loads))
        chunks[k].extend(groups[key])
        loads[k] += weight[key]
    return [c for c in chunks if c]


_POOLS: list[ProcessPoolExecutor] = []


def _pools(n: int) -> list[ProcessPoolExecutor]:
    """n single-process pools kept for the life of this process, so that the passes of
    one fit (linearisation, then every CV scheme) find their costed graphs warm."""
    if len(_POOLS) < n:
        from concurrent.futures import ProcessPoolExecutor

        if not _POOLS:
            import atexit
            atexit.register(_shutdown_pools)
        _POOLS.extend(ProcessPoolExecutor(max_workers=1) for _ in range(n - len(_POOLS)))
    return _POOLS[:n]


def _shutdown_pools() -> None:
    for pool in _POOLS:
        pool.shutdown(cancel_futures=True)
    _POOLS.clear()


def _affine_map(fn, tasks_by_chunk: list[list[tuple]], progress: Callable[[str], None] | None,
                what: str) -> list[list]:
    """Run each chunk's tasks in a process of its own (the same process for the same
    chunk on every call, so its costed graphs stay warm), reporting progress as tasks
    finish."""
    total = sum(len(t) for t in tasks_by_chunk)
    if len(tasks_by_chunk) <= 1:
        out = []
        for k, t in enumerate(tasks_by_chunk[0] if tasks_by_chunk else []):
            out.append(fn(*t))
            if progress:
                progress(f"{what}: {k + 1}/{total} passes")
        return [out]
    from concurrent.futures import as_completed
    pools = _pools(len(tasks_by_chunk))
    futures = {pools[c].submit(fn, *t): (c, k) for c, tasks in enumerate(tasks_by_chunk)
               for k, t in enumerate(tasks)}
    results: list[list] = [[None] * len(t) for t in tasks_by_chunk]
    try:
        for done, fut in enumerate(as_completed(futures), 1):
            c, k = futures[fut]
            results[c][k] = fut.result()
            if progress:
                progress(f"{what}: {done}/{total} passes")
    except BaseException:
        _shutdown_pools()
        raise
    return results


# -- data -------------------------------------------------------------------------------

@dataclass
class LinearisedRows:
    """Rows with their base predictions and slopes at `theta0`."""

    rows: list[dict]
    theta0: dict[str, float]
    names: list[str]                      # parameter order of the slope matrices
    measured_ttft: np.ndarray
    measured_tpot: np.ndarray
    base_ttft: np.ndarray                 # NaN where the row is not modelled
    base_tpot: np.ndarray
    d_ttft: np.ndarray                    # rows x parameters (0 for other backends)
    d_tpot: np.ndarray
    reasons: list[str]
    seconds: float = 0.0

    @property
    def modelled(self) -> np.ndarray:
        return np.isfinite(self.base_ttft) & np.isfinite(self.base_tpot)

    def groups(self, key: str) -> list[str]:
        return row_groups(self.rows, key)

    def predict(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        delta = theta - np.array([self.theta0[n] for n in self.names])
        t = self.base_ttft + self.d_ttft @ delta
        p = self.base_tpot + self.d_tpot @ delta
        # the linear model may not cross zero: a time stays above 5% of its base value
        return np.maximum(t, 0.05 * self.base_ttft), np.maximum(p, 0.05 * self.base_tpot)


def start_theta(backends: Sequence[str]) -> tuple[dict[str, float], dict[str, float]]:
    theta0, steps = {}, {}
    for b in backends:
        for spec in PARAMETERS:
            theta0[parameter_name(b, spec.field)] = spec.start
            steps[parameter_name(b, spec.field)] = spec.step
    return theta0, steps


def linearise(rows: Sequence[dict], *, configs_dir: Path | None, evidence_root: Path | None,
              workers: int | None = None, statistic: str = "mean",
              progress: Callable[[str], None] | None = None,
              analytic_revision: Path | None = None) -> LinearisedRows:
    """Simulate every row at the start values and once per parameter of its backend."""
    t0 = time.perf_counter()
    rows = [dict(r) for r in rows]
    backends = sorted({r.get("backend", "").strip() for r in rows} & set(BACKENDS))
    theta0, steps = start_theta(backends)
    setup = SimulationSetup(str(configs_dir) if configs_dir else None,
                            str(evidence_root) if evidence_root else None, statistic,
                            str(analytic_revision) if analytic_revision else None)
    workers = workers or min(2, os.cpu_count() or 1)
    chunks = _chunks(rows, workers)
    fields = [None] + [spec.field for spec in PARAMETERS if not spec.analytic]
    if progress:
        progress(f"linearising {len(rows)} rows: {len(fields)} simulations each, "
                 f"{len(chunks)} workers")
    per_chunk = _affine_map(_perturbed_pass, [[(setup, [rows[i] for i in c], theta0, f, steps)
                                               for f in fields] for c in chunks],
                            progress, "linearise")
    names = list(theta0)
    n, k = len(rows), len(names)
    base_t, base_p = np.full(n, np.nan), np.full(n, np.nan)
    d_t, d_p = np.zeros((n, k)), np.zeros((n, k))
    reasons = [""] * n
    col = {name: j for j, name in enumerate(names)}
    for c, passes in zip(chunks, per_chunk):
        base = passes[0]
        for pos, i in enumerate(c):
            t, p, why = base[pos]
            reasons[i] = why
            if not why:
                base_t[i], base_p[i] = t, p
        for f, moved in zip(fields[1:], passes[1:]):
            for pos, i in enumerate(c):
                if reasons[i]:
                    continue
                t, p, why = moved[pos]
                name = parameter_name(rows[i]["backend"].strip(), f)
                if name not in col:
                    continue
                if why:
                    reasons[i] = f"with {name} moved: {why}"
                    base_t[i] = base_p[i] = np.nan
                    continue
                d_t[i, col[name]] = (t - base_t[i]) / steps[name]
                d_p[i, col[name]] = (p - base_p[i]) / steps[name]
    from perfcast.serving.silicon import load_rules
    ratio = float(load_rules()["harness"].get("range_ratio", 1.0))
    for spec in PARAMETERS:
        if spec.analytic:
            for i, r in enumerate(rows):
                name = parameter_name(r.get("backend", "").strip(), spec.field)
                if name in col and not reasons[i]:
                    d_t[i, col[name]], d_p[i, col[name]] = _first_chunk_slopes(r, ratio)
    meas_t = np.array([measured_value(r, "silicon_ttft_ms") for r in rows])
    meas_p = np.array([measured_value(r, "silicon_tpot_ms") for r in rows])
    return LinearisedRows(rows, theta0, names, meas_t, meas_p, base_t, base_p, d_t, d_p,
                          reasons, time.perf_counter() - t0)


def _first_chunk_slopes(row: dict, ratio: float) -> tuple[float, float]:
    """ms of mean TTFT and TPOT per us of first-chunk time. The simulator adds it to
    each request's TTFT and nothing else (`serving.simulator.simulate`), so the mean TTFT
    grows by it and each request's TPOT = (e2e - TTFT) / (output - 1) shrinks by
    it / (output - 1), averaged over the harness's output lengths (`ratio`: the
    harness's length range ratio)."""
    osl = int(float(row["osl"]))
    lo = osl if ratio >= 1.0 else max(1, int(osl * ratio))
    outs = np.arange(lo, osl + 1)
    outs = outs[outs > 1]
    return 1e-3, (-1e-3 * float(np.mean(1.0 / (outs - 1))) if outs.size else 0.0)


def measured_value(row: dict, key: str) -> float:
    """A row's measured time (ms) in `key`; NaN when missing, unreadable or not > 0."""
    try:
        v = float(row.get(key) or "nan")
    except ValueError:
        return math.nan
    return v if v > 0 else math.nan


# -- fit --------------------------------------------------------------------------------

@dataclass(frozen=True)
class FitOptions:
    loss: str = "soft_l1"
    f_scale: float = 0.2            # error scale where the loss turns robust
    residual: str = "relative"      # relative: pred/measured - 1 (the APE the scores use); log
    pool_weight: float = 0.05       # weight of the per-backend -> pool tie
    min_train_rows: int = 30
    min_held_out_rows: int = 3

    def as_dict(self) -> dict:
        return {"loss": self.loss, "f_scale": self.f_scale, "residual": self.residual,
                "pool_weight": self.pool_weight,
                "min_train_rows": self.min_train_rows,
                "min_held_out_rows": self.min_held_out_rows}


@dataclass
class FitResult:
    theta: dict[str, float]                  # per-backend parameters, us
    pool: dict[str, float]                   # pooled value per parameter field, us
    std: dict[str, float | None]
    rows: int
    cost: float
    backends_fitted: list[str] = field(default_factory=list)


def fit(data: LinearisedRows, train: np.ndarray, options: FitOptions = FitOptions()) -> FitResult:
    """Robust least squares on the training rows' log errors (linearised model)."""
    from scipy.optimize import least_squares

    mask = train & data.modelled & np.isfinite(data.measured_ttft) & np.isfinite(data.measured_tpot)
    n_train = int(mask.sum())
    if n_train < options.min_train_rows:
        raise ConfigError(f"only {n_train} modelled training rows; a fit needs at least "
                          f"{options.min_train_rows}", field="min_train_rows")
    names = data.names
    specs = {s.field: s for s in PARAMETERS}
    fields = [s.field for s in PARAMETERS]
    field_of = [n.split(".")[2][: -len("_us")] for n in names]
    scale = np.array([max(specs[f].step, 1.0) for f in field_of])
    k, m = len(names), len(fields)
    pool_index = np.array([fields.index(f) for f in field_of])
    lower = np.concatenate([[specs[f].lower for f in fields], [specs[f].lower for f in field_of]])
    upper = np.concatenate([[specs[f].upper for f in fields], [specs[f].upper for f in field_of]])
    theta0 = np.array([data.theta0[n] for n in names])
    x0 = np.concatenate([[specs[f].start for f in fields], theta0])
    sub = _Subset(data, mask)
    w = math.sqrt(options.pool_weight * n_train / max(k, 1))

    if options.residual not in ("log", "relative"):
        raise ConfigError(f"unknown residual {options.residual!r}", field="residual",
                          expected="log | relative")
    error = (lambda pred, meas: np.log(pred / meas)) if options.residual == "log" else \
        (lambda pred, meas: pred / meas - 1.0)

    def residuals(x: np.ndarray) -> np.ndarray:
        pool, theta = x[:m], x[m:]
        t, p = sub.predict(theta)
        return np.concatenate([error(t, sub.meas_t), error(p, sub.meas_p),
                               w * (theta - pool[pool_index]) / scale])

    x_scale = np.concatenate([[max(specs[f].step, 1.0) for f in fields], scale])
    res = least_squares(residuals, np.clip(x0, lower, upper), bounds=(lower, upper),
                        loss=options.loss, f_scale=options.f_scale, x_scale=x_scale)
    std = _std(res, n_train * 2)
    theta = {n: float(res.x[m + j]) for j, n in enumerate(names)}
    stds = {n: std[m + j] for j, n in enumerate(names)}
    fitted = sorted({n.split(".")[1] for n in names if np.any(sub.d_t[:, names.index(n)])
                     or np.any(sub.d_p[:, names.index(n)])})
    return FitResult(theta=theta, pool={f: float(res.x[i]) for i, f in enumerate(fields)},
                     std=stds, rows=n_train, cost=float(res.cost), backends_fitted=fitted)


class _Subset:
    def __init__(self, data: LinearisedRows, mask: np.ndarray) -> None:
        self.base_t, self.base_p = data.base_ttft[mask], data.base_tpot[mask]
        self.d_t, self.d_p = data.d_ttft[mask], data.d_tpot[mask]
        self.meas_t, self.meas_p = data.measured_ttft[mask], data.measured_tpot[mask]
        self.theta0 = np.array([data.theta0[n] for n in data.names])

    def predict(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        delta = theta - self.theta0
        t = self.base_t + self.d_t @ delta
        p = self.base_p + self.d_p @ delta
        return np.maximum(t, 0.05 * self.base_t), np.maximum(p, 0.05 * self.base_p)


def _std(res, n_obs: int) -> list[float | None]:
    """1-sigma from the Jacobian at the solution (Gauss-Newton covariance); None for a
    parameter the data does not constrain or that sits on a bound."""
    jac = res.jac
    dof = max(n_obs - jac.shape[1], 1)
    s2 = 2.0 * res.cost / dof
    jtj = jac.T @ jac
    out: list[float | None] = []
    try:
        cov = np.linalg.pinv(jtj, rcond=1e-10) * s2
    except np.linalg.LinAlgError:
        return [None] * jac.shape[1]
    for i in range(jac.shape[1]):
        informed = float(np.abs(jac[: n_obs, i]).sum()) > 0.0
        on_bound = res.active_mask[i] != 0
        v = cov[i, i]
        out.append(float(math.sqrt(v)) if informed and not on_bound and v >= 0 else None)
    return out


def scores(pred_t: np.ndarray, pred_p: np.ndarray, meas_t: np.ndarray, meas_p: np.ndarray
           ) -> dict:
    ok = np.isfinite(pred_t) & np.isfinite(pred_p) & np.isfinite(meas_t) & np.isfinite(meas_p)
    if not ok.any():
        return {"rows": 0, "ttft_mape": None, "tpot_mape": None,
                "ttft_median_ape": None, "tpot_median_ape": None}
    at = np.abs(pred_t[ok] / meas_t[ok] - 1)
    ap = np.abs(pred_p[ok] / meas_p[ok] - 1)
    return {"rows": int(ok.sum()), "ttft_mape": float(at.mean()), "tpot_mape": float(ap.mean()),
            "ttft_median_ape": float(np.median(at)), "tpot_median_ape": float(np.median(ap))}


# -- cross-validation ------------------------------------------------------------------

def simulate_rows(data: LinearisedRows, assignments: list[tuple[list[int], dict[str, float]]],
                  *, configs_dir: Path | None, evidence_root: Path | None,
                  workers: int | None = None, statistic: str = "mean",
                  progress: Callable[[str], None] | None = None,
                  analytic_revision: Path | None = None
                  ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Exact simulation of row subsets, each subset with its own parameters."""
    setup = SimulationSetup(str(configs_dir) if configs_dir else None,
                            str(evidence_root) if evidence_root else None, statistic,
                            str(analytic_revision) if analytic_revision else None)
    workers = workers or min(2, os.cpu_count() or 1)
    everyone = {i for idx, _ in assignments for i in idx}
    # the linearisation's chunks (all rows), so each row meets its warm worker again
    chunks = [[i for i in c if i in everyone] for c in _chunks(data.rows, workers)]
    tasks, where = [], []
    for c in chunks:
        members = set(c)
        tasks.append([])
        where.append([])
        for idx, theta in assignments:
            mine = [i for i in idx if i in members]
            if mine:
                tasks[-1].append((setup, [data.rows[i] for i in mine], theta_overheads(theta)))
                where[-1].append(mine)
    n = len(data.rows)
    t, p, why = np.full(n, np.nan), np.full(n, np.nan), [""] * n
    for places, results in zip(where, _affine_map(_simulate, tasks, progress, "simulate")):
        for idx, res in zip(places, results):
            for i, (tt, pp, reason) in zip(idx, res):
                why[i] = reason
                if not reason:
                    t[i], p[i] = tt, pp
    return t, p, why


Simulate = Callable[[LinearisedRows, list[tuple[list[int], dict[str, float]]]],
                    tuple[np.ndarray, np.ndarray, list[str]]]


def cross_validate(data: LinearisedRows, group_by: str, *, configs_dir: Path | None = None,
                   evidence_root: Path | None = None, options: FitOptions = FitOptions(),
                   workers: int | None = None, statistic: str = "mean",
                   progress: Callable[[str], None] | None = None,
                   simulate: Simulate | None = None,
                   analytic_revision: Path | None = None) -> dict:
    """Leave-one-group-out folds: fit on the others, simulate the held-out rows exactly
    (`simulate(data, [(row indices, parameters), ...])`; default: the serving simulator)."""
    groups = np.array(data.groups(group_by), dtype=object)
    usable = data.modelled & np.isfinite(data.measured_ttft) & np.isfinite(data.measured_tpot)
    folds, fits = [], []
    for g in sorted(set(groups[usable])):
        held = usable & (groups == g)
        if held.sum() < options.min_held_out_rows:
            raise ConfigError(f"fold {group_by}={g!r} holds out {int(held.sum())} modelled "
                              f"rows; a fold needs at least {options.min_held_out_rows}",
                              field="--cv", expected="another grouping or a larger data set")
        result = fit(data, usable & ~held, options)
        fits.append((g, held, result))
        if progress:
            progress(f"fold {group_by}={g}: fitted on {result.rows} rows")
    if simulate is None:
        def simulate(d, assignments):
            return simulate_rows(d, assignments, configs_dir=configs_dir,
                                 evidence_root=evidence_root, workers=workers,
                                 statistic=statistic, progress=progress,
                                 analytic_revision=analytic_revision)
    held_t, held_p, _ = simulate(data, [(list(np.flatnonzero(h)), r.theta) for _, h, r in fits])
    for g, held, result in fits:
        train = usable & ~held
        lt, lp = data.predict(np.array([result.theta[n] for n in data.names]))
        # the layout names both the group and its scores `held_out`; JSON keeps
        # one key, so the scores carry the group too
        folds.append({"group": g, "rows": int(held.sum()), "train_rows": result.rows,
                      "in_sample": {**scores(lt[train], lp[train], data.measured_ttft[train],
                                             data.measured_tpot[train]),
                                    "method": "linearised"},
                      "held_out": {"group": g, "method": "simulated",
                                   **scores(held_t[held], held_p[held],
                                            data.measured_ttft[held], data.measured_tpot[held])},
                      "parameters": {n: round(v, 3) for n, v in result.theta.items()}})
    pooled = scores(held_t[usable], held_p[usable], data.measured_ttft[usable],
                    data.measured_tpot[usable])
    return {"group_by": group_by, "folds": folds, "summary": {"held_out": pooled,
            "folds": len(folds)}, "predictions": {"ttft": held_t, "tpot": held_p}}


def fit_part(data: LinearisedRows, *, fitted_on: dict, cv: Sequence[dict],
             options: FitOptions = FitOptions()) -> tuple[CalibrationPart, FitResult]:
    """The fit on all usable rows as a calibration part, with the CV results given."""
    usable = data.modelled & np.isfinite(data.measured_ttft) & np.isfinite(data.measured_tpot)
    result = fit(data, usable, options)
    specs = {s.field: s for s in PARAMETERS}
    params = []
    for n in data.names:
        spec = specs[n.split(".")[2][: -len("_us")]]
        params.append(FittedParameter(name=n, value=round(result.theta[n], 6), unit="us",
                                      lower=spec.lower, upper=spec.upper, std=result.std[n],
                                      description=spec.description))
    for f, v in result.pool.items():
        spec = specs[f]
        params.append(FittedParameter(name=f"serving.pool.{f}_us", value=round(v, 6), unit="us",
                                      lower=spec.lower, upper=spec.upper,
                                      description="pooled value, used by a backend without "
                                      "fitted rows: " + spec.description))
    lt, lp = data.predict(np.array([result.theta[n] for n in data.names]))
    cv_doc = [{k: v for k, v in c.items() if k != "predictions"} for c in cv]
    part = make_part(PART_NAME, procedure={"name": PROCEDURE, "version": PROCEDURE_VERSION,
                                           "options": options.as_dict(),
                                           "start": dict(data.theta0)},
                     parameters=params, fitted_on={**fitted_on, "rows": result.rows},
                     cv=_cv_json(cv_doc, scores(lt[usable], lp[usable],
                                                data.measured_ttft[usable],
                                                data.measured_tpot[usable])))
    return part, result


def _cv_json(cv: list[dict], in_sample: dict) -> dict:
    if len(cv) == 1:
        out = dict(cv[0])
        out["summary"] = {**out["summary"], "in_sample_linearised": in_sample}
        return _round(out)
    return _round({"schemes": cv, "summary": {c["group_by"]: c["summary"] for c in cv}
                   | {"in_sample_linearised": in_sample}})


def _round(value):
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    return value
