"""Efficiency curves for the analytic path: fit on H100 only, on H200 only and on both,
and print per class the in-sample and held-out error against the measured kernel
tables next to the uncalibrated roofline's error on the same records.

    python benchmarks/efficiency_fit.py [--data DIR] [--output part.json] [--seed 0]

Columns (MAPE / median APE of latency, per class):
  in      in-sample (fit on every record of the fitted system(s), scored on them)
  lofo    leave-one-framework-out within the fitted system, pooled over its folds
  xfer    fitted on this system only, scored on the other system (for "both": the
          leave-one-system-out folds, pooled)
  roof    RooflineCostProvider / CollectiveCostProvider (catalog efficiencies) on the
          records of the same column before it (all records of the scored system)

`--output FILE` writes a calibration revision JSON whose only part is the
`analytic_efficiency` part fitted on both systems.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from perfcast.calibrate.efficiency import (
    Observations,
    error_stats,
    fit_efficiency,
    load_aiconfigurator,
    observations,
    pooled_scores,
    roofline_latency_s,
    scores,
)
from perfcast.calibrate.revision import CalibrationRevision, dumps
from perfcast.hardware import load_system

DATA = Path("/work/shared/reference/aiconfigurator")
SYSTEMS = ("h100_sxm", "h200_sxm")


def cell(s: dict | None) -> str:
    if not s:
        return f"{'-':>13s}"
    return f"{100 * s['mape']:6.1f} {100 * s['median_ape']:5.1f}"


def roof(obs: Observations, base: np.ndarray, cls: str) -> dict | None:
    m = obs.cls == cls
    return error_stats(base[m], obs.measured_s[m]) if m.any() else None


def table(title: str, fit, obs_self: Observations, obs_other: Observations | None,
          base_self: np.ndarray, base_other: np.ndarray | None, xfer: dict) -> None:
    lofo = pooled_scores(fit.folds.get("framework", []))
    print(f"\n== {title}: fit + cross-validation {fit.wall_s:.1f} s, "
          f"{len(fit.obs)} records, skipped {sorted(fit.skipped) or 'none'}")
    print(f"{'class':24s} {'n':>7s} | {'in':>13s} | {'lofo':>13s} | {'roof':>13s} | "
          f"{'xfer':>13s} | {'roof':>13s}")
    for cls in sorted(fit.fits):
        print(f"{cls:24s} {int((obs_self.cls == cls).sum()):7d} | {cell(fit.in_sample.get(cls))}"
              f" | {cell(lofo.get(cls))} | {cell(roof(obs_self, base_self, cls))} | "
              f"{cell(xfer.get(cls))} | "
              f"{cell(roof(obs_other, base_other, cls) if obs_other is not None else None)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--output", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    systems = {s: load_system(s) for s in SYSTEMS}
    obs: dict[str, Observations] = {}
    for name, system in systems.items():
        t = time.perf_counter()
        db = load_aiconfigurator(args.data / name, system)
        t_imp = time.perf_counter() - t
        obs[name] = observations(db, system)
        print(f"{name}: {len(db)} rows imported in {t_imp:.1f} s, {len(obs[name])} "
              f"observations in {time.perf_counter() - t - t_imp:.1f} s, dropped "
              f"{obs[name].dropped}", flush=True)
    base = {n: roofline_latency_s(o, systems) for n, o in obs.items()}
    a, b = SYSTEMS
    for one, other in ((a, b), (b, a)):
        fit = fit_efficiency(obs[one], seed=args.seed)
        table(f"fit on {one} (xfer: scored on {other})", fit, obs[one], obs[other],
              base[one], base[other], scores(fit.fits, obs[other]))
    both = Observations.concat([obs[a], obs[b]])
    fit = fit_efficiency(both, seed=args.seed)
    table("fit on both (xfer: leave-one-system-out)", fit, both, both,
          np.concatenate([base[a], base[b]]), np.concatenate([base[a], base[b]]),
          pooled_scores(fit.folds["system"]))
    part = fit.part()
    print("\nheld-out residual spread (all folds) per class: log_std / within 25 %")
    for cls, s in sorted(part.cv["summary"]["residual_spread"].items()):
        print(f"  {cls:24s} {s['log_std']:.3f}  {100 * s['within']:.0f} %")
    if args.output:
        rev = CalibrationRevision(name="analytic_efficiency", code_version="benchmark",
                                  parts=(part,), note="efficiency curves fitted on the "
                                  "AIConfigurator H100 and H200 kernel tables")
        args.output.write_text(dumps(rev))
        size = len(json.dumps(rev.to_json()))
        print(f"\nwrote {args.output} ({size} bytes, revision {rev.digest})")


if __name__ == "__main__":
    main()
