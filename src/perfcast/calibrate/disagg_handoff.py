"""Disaggregated serving's prefill -> decode handoff, fitted on measured disagg rows.

A disaggregated request reaches its decode worker later than its KV bytes need: the
front-end dispatches it a second time (with the transfer's parameters), the transfer is
set up and its end noticed by the decode worker. No engine documents that time, so it
is fitted per backend (`serving.<backend>.disagg_handoff_us`, the simulator's
`Overheads.disagg_handoff_s`) on the disagg rows that record their worker counts, after
the serving overheads (`perfcast.calibrate.serving`) were fitted on agg rows:

1. Base. Every row is simulated once with the overheads fitted before and no handoff.
2. Fit. The handoff delays the decode worker's admission, so each request's TTFT grows
   by it and its TPOT does not: the model is TTFT = base + handoff. Robust least squares
   (scipy `least_squares`, soft-L1 loss) on the relative TTFT errors, per backend, tied
   to a pooled value by a weak penalty (a backend without rows gets the pool), within
   [0, 2 s]; 1-sigma from the Jacobian.
3. Cross-validate. Leave one group out; the held-out rows are simulated exactly with the
   fold's handoff. A fold with too few held-out or training rows is listed as refused
   with its reason, and its rows have no held-out prediction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from perfcast.calibrate.revision import CalibrationPart, FittedParameter, make_part
from perfcast.calibrate.serving import (BACKENDS, _round, _std, measured_value, row_groups,
                                       scores)
from perfcast.core.errors import ConfigError

PROCEDURE = "disagg_handoff_robust_ls"
PROCEDURE_VERSION = 1
PART_NAME = "serving_disagg_handoff"
FIELD = "disagg_handoff"
LOWER_US, UPPER_US, SCALE_US = 0.0, 2_000_000.0, 100_000.0
DESCRIPTION = ("disaggregated serving: from a prefill worker's end of a request to the "
               "decode worker taking it in, beyond moving the KV bytes (the front-end's "
               "second dispatch, the transfer's setup and completion notice)")
WORKER_FIELDS = ("prefill_num_workers", "decode_num_workers", "decode_batch_size")


def parameter_name(backend: str) -> str:
    return f"serving.{backend}.{FIELD}_us"


def with_worker_counts(rows: Sequence[dict]) -> list[dict]:
    """The disagg rows that record their worker counts (the others are not modelled)."""
    return [r for r in rows if (r.get("mode") or "").strip() == "disagg"
            and all((r.get(k) or "").strip() for k in WORKER_FIELDS)]


@dataclass(frozen=True)
class HandoffOptions:
    loss: str = "soft_l1"
    f_scale: float = 0.2
    pool_weight: float = 0.05
    min_train_rows: int = 10
    min_held_out_rows: int = 3

    def as_dict(self) -> dict:
        return {"loss": self.loss, "f_scale": self.f_scale, "pool_weight": self.pool_weight,
                "min_train_rows": self.min_train_rows,
                "min_held_out_rows": self.min_held_out_rows}


# rows, handoff per backend (us) -> TTFT (ms), TPOT (ms), reasons (each row simulated)
Simulator = Callable[[list[dict], dict[str, float]], tuple[np.ndarray, np.ndarray, list[str]]]


@dataclass
class DisaggRows:
    """Rows with their TTFT and TPOT simulated without a handoff."""

    rows: list[dict]
    base_ttft: np.ndarray        # ms; NaN where the row is not modelled
    base_tpot: np.ndarray
    measured_ttft: np.ndarray
    measured_tpot: np.ndarray
    reasons: list[str]

    @property
    def usable(self) -> np.ndarray:
        return (np.isfinite(self.base_ttft) & np.isfinite(self.base_tpot)
                & np.isfinite(self.measured_ttft) & np.isfinite(self.measured_tpot))

    @property
    def backends(self) -> list[str]:
        return [(r.get("backend") or "").strip() for r in self.rows]

    def groups(self, key: str) -> list[str]:
        return row_groups(self.rows, key)


def base_rows(rows: Sequence[dict], simulate: Simulator) -> DisaggRows:
    rows = [dict(r) for r in rows]
    t, p, why = simulate(rows, {})
    return DisaggRows(rows, t, p, np.array([measured_value(r, "silicon_ttft_ms") for r in rows]),
                      np.array([measured_value(r, "silicon_tpot_ms") for r in rows]), why)


@dataclass
class HandoffFit:
    theta: dict[str, float]              # parameter name -> us, every backend
    pool: float                          # us
    std: dict[str, float | None]
    rows: int
    backends_fitted: list[str] = field(default_factory=list)

    def per_backend(self) -> dict[str, float]:
        return {n.split(".")[1]: v for n, v in self.theta.items()}


def fit(data: DisaggRows, train: np.ndarray,
        options: HandoffOptions = HandoffOptions()) -> HandoffFit:
    """Robust least squares of TTFT = base + handoff on the training rows."""
    from scipy.optimize import least_squares

    mask = train & data.usable
    n = int(mask.sum())
    if n < options.min_train_rows:
        raise ConfigError(f"only {n} modelled disagg training rows; a handoff fit needs at "
                          f"least {options.min_train_rows}", field="min_train_rows")
    backends = np.array(data.backends, dtype=object)[mask]
    index = {b: i for i, b in enumerate(BACKENDS)}
    col = np.array([index.get(b, -1) for b in backends])
    if (col < 0).any():
        raise ConfigError(f"unknown backend {backends[col < 0][0]!r}", field="backend",
                          expected=" | ".join(BACKENDS))
    base, meas = data.base_ttft[mask], data.measured_ttft[mask]
    k = len(BACKENDS)
    w = math.sqrt(options.pool_weight * n / k)

    def residuals(x: np.ndarray) -> np.ndarray:
        pool, theta = x[0], x[1:]
        pred = base + 1e-3 * theta[col]
        # the tie is weak: a gap across the whole physical range costs w
        return np.concatenate([pred / meas - 1.0, w * (theta - pool) / UPPER_US])

    x0 = np.full(k + 1, SCALE_US)     # inside the bounds (a start on one may stay there)
    res = least_squares(residuals, x0, bounds=(np.full(k + 1, LOWER_US),
                                               np.full(k + 1, UPPER_US)),
                        loss=options.loss, f_scale=options.f_scale,
                        x_scale=np.full(k + 1, SCALE_US))
    std = _std(res, n)
    names = [parameter_name(b) for b in BACKENDS]
    return HandoffFit(theta={nm: float(res.x[1 + j]) for j, nm in enumerate(names)},
                      pool=float(res.x[0]),
                      std={nm: std[1 + j] for j, nm in enumerate(names)}, rows=n,
                      backends_fitted=sorted(set(backends)))


def cross_validate(data: DisaggRows, group_by: str, simulate: Simulator,
                   options: HandoffOptions = HandoffOptions()) -> dict:
    """Leave-one-group-out folds; held-out rows simulated with the fold's handoff."""
    groups = np.array(data.groups(group_by), dtype=object)
    usable = data.usable
    n = len(data.rows)
    held_t, held_p = np.full(n, np.nan), np.full(n, np.nan)
    folds, refused = [], []
    for g in sorted(set(groups[usable])):
        held = usable & (groups == g)
        train = usable & ~held
        if held.sum() < options.min_held_out_rows or train.sum() < options.min_train_rows:
            refused.append({"group": g, "rows": int(held.sum()), "train_rows": int(train.sum()),
                            "reason": f"a fold needs at least {options.min_held_out_rows} "
                            f"held-out and {options.min_train_rows} training rows"})
            continue
        result = fit(data, train, options)
        idx = list(np.flatnonzero(held))
        t, p, _ = simulate([data.rows[i] for i in idx], result.per_backend())
        held_t[idx], held_p[idx] = t, p
        lin = data.base_ttft + 1e-3 * np.array(
            [result.theta.get(parameter_name(b), 0.0) for b in data.backends])
        folds.append({"group": g, "rows": int(held.sum()), "train_rows": result.rows,
                      "in_sample": {**scores(lin[train], data.base_tpot[train],
                                             data.measured_ttft[train],
                                             data.measured_tpot[train]), "method": "additive"},
                      "held_out": {"group": g, "method": "simulated",
                                   **scores(held_t[held], held_p[held],
                                            data.measured_ttft[held], data.measured_tpot[held])},
                      "parameters": {k: round(v, 3) for k, v in result.theta.items()}})
    covered = usable & np.isfinite(held_t)
    pooled = scores(held_t[covered], held_p[covered], data.measured_ttft[covered],
                    data.measured_tpot[covered])
    return {"group_by": group_by, "folds": folds, "refused": refused,
            "summary": {"held_out": pooled, "folds": len(folds), "refused": len(refused)},
            "predictions": {"ttft": held_t, "tpot": held_p}}


def fit_part(data: DisaggRows, *, fitted_on: dict, cv: Sequence[dict], simulate: Simulator,
             options: HandoffOptions = HandoffOptions()) -> tuple[CalibrationPart, HandoffFit,
                                                                 tuple[np.ndarray, np.ndarray]]:
    """The fit on every usable row as a calibration part (its rows simulated exactly with
    the fitted handoff for the in-sample scores), the fit, and those predictions."""
    usable = data.usable
    result = fit(data, usable, options)
    t, p, _ = simulate(data.rows, result.per_backend())
    params = [FittedParameter(name=nm, value=round(v, 6), unit="us", lower=LOWER_US,
                              upper=UPPER_US, std=result.std[nm], description=DESCRIPTION)
              for nm, v in result.theta.items()]
    params.append(FittedParameter(name=f"serving.pool.{FIELD}_us", value=round(result.pool, 6),
                                  unit="us", lower=LOWER_US, upper=UPPER_US,
                                  description="pooled value, used by a backend without "
                                  "fitted rows: " + DESCRIPTION))
    in_sample = scores(t[usable], p[usable], data.measured_ttft[usable],
                       data.measured_tpot[usable])
    without = scores(data.base_ttft[usable], data.base_tpot[usable],
                     data.measured_ttft[usable], data.measured_tpot[usable])
    cv_doc = [{k: v for k, v in c.items() if k != "predictions"} for c in cv]
    summary = {c["group_by"]: c["summary"] for c in cv_doc} | {
        "in_sample": in_sample, "without_handoff": without}
    part = make_part(PART_NAME, procedure={"name": PROCEDURE, "version": PROCEDURE_VERSION,
                                           "options": options.as_dict()},
                     parameters=params, fitted_on={**fitted_on, "rows": result.rows},
                     cv=_round({"schemes": cv_doc, "summary": summary}))
    return part, result, (t, p)


def validate_simulator(*, revision, configs_dir: Path | None, evidence_root: Path | None,
                       statistic: str = "mean") -> Simulator:
    """Rows simulated as `perfcast validate silicon` does with `revision` (its serving
    overheads and analytic curves), the handoff given per backend."""
    from perfcast.calibrate.serving import PART_NAME as OVERHEADS
    from perfcast.calibrate.serving import serving_overheads
    from perfcast.evidence.calibrated import providers_by_system
    from perfcast.serving.deploy import StepModelCache
    from perfcast.serving.evidence import evidence_loader
    from perfcast.serving.silicon import validate_rows

    base = serving_overheads(revision.part(OVERHEADS)) if revision is not None else {}
    evidence_for = evidence_loader(evidence_root) if evidence_root else None
    analytic = providers_by_system(revision)
    cache = StepModelCache()

    def simulate(rows: list[dict], handoff_us: dict[str, float]):
        overheads = {b: dict(v) for b, v in base.items()}
        for b, us in handoff_us.items():
            overheads.setdefault(b, {})[f"{FIELD}_s"] = us * 1e-6
        out = validate_rows(rows, configs_dir=configs_dir, evidence_for=evidence_for,
                            overheads=overheads, statistic=statistic, cache=cache,
                            analytic_for=analytic)
        t = np.array([r.pred_ttft_ms if r.predicted else np.nan for r in out], dtype=float)
        p = np.array([r.pred_tpot_ms if r.predicted else np.nan for r in out], dtype=float)
        return t, p, [r.reason for r in out]

    return simulate
