"""Accuracy of perfcast's serving predictions on measured deployments, in sample and
held out.

    python benchmarks/silicon_accuracy.py [--systems h100_sxm h200_sxm]
        [--evidence-root DIR] [--model-configs DIR] [--cv model backend system]
        [--json FILE] [--seed N]

For the agg rows of each system's silicon file (../shared/reference/silicon/<system>.csv)
it prints coverage, TTFT and TPOT MAPE and median APE per system x model x backend and
overall:

- `none`: physics only (no fitted overheads);
- `in-sample`: the serving overheads fitted on all rows, scored on the same rows;
- `held-out <g>`: leave-one-<g>-out cross-validation (each row predicted by a fit that
  never saw its group; `system` = fit on the other GPU: H100 -> H200 transfer);
- `default`: the revision shipped with perfcast (what `--calibration default` uses).

Every figure is a full simulation of the row (held-out rows are simulated with their
fold's parameters). The wall time of the fit is printed too.

Then the disagg rows of each system, apart (prefill and decode pools, KV transfer):
coverage (of all disagg rows and of those that record worker counts), TTFT and TPOT
MAPE and median APE, physics only (`none`) and with the shipped revision (`default`).
No number is fitted on disagg rows: the shipped revision's overheads were fitted on agg
rows only, so every disagg figure is held out.

Last, the disaggregated handoff (`perfcast.calibrate.disagg_handoff`) fitted after the
new revision's overheads on the disagg rows with worker counts: TTFT and TPOT MAPE per
system without it, in sample and held out per CV scheme (the shipped revision has no
handoff: docs/calibration.md).

    python benchmarks/silicon_accuracy.py --quick FILE.csv   # one file, default revision
    python benchmarks/silicon_accuracy.py --disagg-only      # only the disagg section
    python benchmarks/silicon_accuracy.py --handoff-only     # only the handoff fit, after
                                                             # the shipped revision
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REF = Path(__file__).resolve().parents[1] / ".." / "shared" / "reference"
KEYS = ("system", "model_path", "backend")


def unclean(reason: str) -> bool:
    """Rows outside the benchmark's clean set: layouts larger than one node of the
    system (scale-up domain) and runtime images known to be mislabeled."""
    return "exceeds one" in reason or "only for MTP" in reason


def group_scores(rows, pred_t, pred_p, meas_t, meas_p, usable, reasons=None
                 ) -> dict[tuple, dict]:
    """Scores per (system, model, backend) and overall ('*', '*', '*'); `clean_coverage`
    leaves out the rows `unclean` names."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        key = tuple((r.get(k) or "").strip() for k in KEYS)
        groups.setdefault(key, []).append(i)
        groups.setdefault((key[0], "*", "*"), []).append(i)
    groups[("*", "*", "*")] = list(range(len(rows)))
    out = {}
    for key, idx in groups.items():
        idx = np.array(idx)
        ok = usable[idx] & np.isfinite(pred_t[idx]) & np.isfinite(pred_p[idx])
        sel = idx[ok]
        at = np.abs(pred_t[sel] / meas_t[sel] - 1)
        ap = np.abs(pred_p[sel] / meas_p[sel] - 1)
        clean = np.array([not unclean(reasons[i]) for i in idx]) if reasons else \
            np.ones(len(idx), bool)
        out[key] = {"rows": int(len(idx)), "predicted": int(ok.sum()),
                    "coverage": float(ok.mean()) if len(idx) else 0.0,
                    "clean_rows": int(clean.sum()),
                    "clean_coverage": float(ok[clean].mean()) if clean.any() else 0.0,
                    "ttft_mape": float(at.mean()) if at.size else None,
                    "ttft_median_ape": float(np.median(at)) if at.size else None,
                    "tpot_mape": float(ap.mean()) if ap.size else None,
                    "tpot_median_ape": float(np.median(ap)) if ap.size else None}
    return out


def _pct(v) -> str:
    return "   -  " if v is None else f"{100 * v:5.1f}%"


def _scores(g: dict) -> str:
    """' | TTFT mape/median TPOT mape/median' of one group."""
    return (f" | {_pct(g['ttft_mape'])}/{_pct(g['ttft_median_ape'])[1:]}"
            f" {_pct(g['tpot_mape'])}/{_pct(g['tpot_median_ape'])[1:]}")


def print_table(title: str, columns: dict[str, dict[tuple, dict]]) -> None:
    print(f"== {title}")
    names = list(columns)
    head = f"{'system':9s} {'model':34s} {'backend':7s} {'rows':>4s} {'cov':>6s} {'clean':>6s}"
    for n in names:
        head += f" | {n[:22]:^22s}"
    print(head)
    sub = " " * 71 + "".join(" | TTFT mape/med TPOT mape/med"[:25] for _ in names)
    print(sub)
    keys = sorted(next(iter(columns.values())), key=lambda k: (k[0] == "*", k[0], k[1] == "*",
                                                                k[1], k[2]))
    for key in keys:
        first = columns[names[0]][key]
        line = (f"{key[0][:9]:9s} {key[1][:34]:34s} {key[2][:7]:7s} {first['rows']:4d} "
                f"{100 * first['coverage']:5.1f}% {100 * first['clean_coverage']:5.1f}%")
        line += "".join(_scores(columns[n][key]) for n in names)
        print(line)


def band_section(rev) -> None:
    """The revision's prediction error bands (held-out ratio quantiles) and the share of
    held-out measurements inside the p10-p90 band (each group's band from the others)."""
    from perfcast.calibrate.prediction_error import METRICS, PART_NAME, POINTS, parameter_name

    part = rev.part(PART_NAME)
    if part is None:
        print("== no prediction error bands in the revision")
        return
    cov, levels = part.cv["coverage"], part.procedure["levels"]
    print(f"== prediction error bands: percentiles of measured / predicted over the leave "
          f"one {part.procedure['scheme']} out predictions (TTFT "
          f"{'/'.join(f'{v:g}' for v in levels['ttft'])}, TPOT "
          f"{'/'.join(f'{v:g}' for v in levels['tpot'])}); the band, each group's from the "
          f"other groups, holds TTFT {100 * cov['ttft']:.1f}% / TPOT "
          f"{100 * cov['tpot']:.1f}% of {cov['rows']} held-out rows")
    values = part.values()
    for name in sorted({n.split(".")[1] for n in values}):
        cells = []
        for m in METRICS:
            qs = [values.get(parameter_name(name, m, q)) for q in POINTS]
            if None not in qs:
                cells.append(f"{m.upper()} " + " / ".join(f"{v:.2f}" for v in qs))
        print(f"  {name:8s} " + "   ".join(cells))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--systems", nargs="+", default=["h100_sxm", "h200_sxm"])
    ap.add_argument("--evidence-root", default=str(REF / "aiconfigurator"),
                    help="measured kernel tables ('' for analytic only)")
    ap.add_argument("--model-configs", default=str(REF / "model_configs"))
    ap.add_argument("--cv", nargs="*", default=["model", "backend", "system"])
    ap.add_argument("--json", default=None, help="write every figure here")
    ap.add_argument("--revision-out", default=None, help="write the joint revision JSON here")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--analytic", default="default", help="revision JSON whose analytic "
                    "efficiency curves the simulator uses (fitted first on kernel tables); "
                    "'default': the shipped revision's, as its own fit used; 'none': "
                    "physics-only analytic models")
    ap.add_argument("--quick", default=None, help="only validate this CSV with the shipped "
                    "default revision (no fit)")
    ap.add_argument("--disagg-only", action="store_true", help="only the disagg section")
    ap.add_argument("--handoff-only", action="store_true", help="only the disagg handoff fit "
                    "(after the shipped revision's overheads)")
    args = ap.parse_args(argv)
    if args.analytic == "none":
        args.analytic = None
    elif args.analytic == "default":
        from perfcast.calibrate.store import default_revision_path
        args.analytic = str(default_revision_path())
    print(f"analytic efficiency curves: {args.analytic or 'none (physics only)'}",
          file=sys.stderr)
    evidence_root = Path(args.evidence_root) if args.evidence_root else None
    configs = Path(args.model_configs)
    if args.quick:
        return quick(Path(args.quick), evidence_root, configs)
    if args.disagg_only:
        disagg = disagg_section(args.systems, evidence_root, configs)
        if args.json:
            Path(args.json).write_text(json.dumps({"systems": args.systems, "disagg": disagg},
                                                  indent=1), encoding="utf-8")
        return 0

    if args.handoff_only:
        from perfcast.calibrate.store import default_revision
        from perfcast.observe.silicon import import_silicon
        sets = [import_silicon(REF / "silicon" / f"{s}.csv") for s in args.systems]
        cv = [g for g in args.cv if g != "system" or len(args.systems) > 1]
        handoff = handoff_section(sets, default_revision(), cv, evidence_root, configs)
        if args.json:
            Path(args.json).write_text(json.dumps({"systems": args.systems,
                                                   "handoff": handoff}, indent=1),
                                       encoding="utf-8")
        return 0

    from perfcast.calibrate.fit_serving import fit_serving_revision
    from perfcast.calibrate.revision import dumps
    from perfcast.calibrate.serving import simulate_rows
    from perfcast.calibrate.store import default_revision
    from perfcast.observe.silicon import import_silicon

    sets = [import_silicon(REF / "silicon" / f"{s}.csv") for s in args.systems]
    cv = [g for g in args.cv if g != "system" or len(args.systems) > 1]
    from perfcast.calibrate.store import read_revision
    analytic = read_revision(Path(args.analytic)) if args.analytic else None
    t0 = time.perf_counter()
    rev, details = fit_serving_revision(sets, evidence_root=evidence_root,
                                        model_configs=configs, cv=cv,
                                        workers=args.workers or None,
                                        progress=lambda m: print(m, file=sys.stderr),
                                        analytic=analytic)
    fit_s = time.perf_counter() - t0
    data = details["data"]
    usable = details["usable"] & np.isfinite(data.measured_tpot)
    mt, mp = data.measured_ttft, data.measured_tpot
    idx_all = list(range(len(data.rows)))
    from perfcast.serving.backends import load_backend
    zero = {}                            # physics only: the backend files' values
    for n in data.names:
        _, backend, field = n.split(".", 2)
        zero[n] = 1e6 * getattr(load_backend(backend).overheads, field[:-3] + "_s")

    def sim(theta, analytic_file=None):
        return simulate_rows(data, [(idx_all, theta)], configs_dir=configs,
                             evidence_root=evidence_root, workers=args.workers or None,
                             analytic_revision=analytic_file)

    columns: dict[str, dict] = {}
    t, p, _ = sim(zero)             # physics only: no fitted number at all
    columns["none"] = group_scores(data.rows, t, p, mt, mp, usable, data.reasons)
    t, p, _ = sim(details["fit"].theta, Path(args.analytic) if args.analytic else None)
    columns["in-sample"] = group_scores(data.rows, t, p, mt, mp, usable, data.reasons)
    for scheme in details["schemes"]:
        preds = scheme["predictions"]
        columns[f"held-out {scheme['group_by']}"] = group_scores(
            data.rows, preds["ttft"], preds["tpot"], mt, mp, usable, data.reasons)
    try:
        shipped = default_revision()
        part = shipped.part("serving_overheads")
        theta = {n: part.parameter(n).value for n in data.names}
        from perfcast.calibrate.store import DEFAULT_FILE
        import perfcast.calibrate as _pkg
        shipped_file = Path(_pkg.__file__).parent / DEFAULT_FILE
        t, p, _ = sim(theta, shipped_file if shipped.part("analytic_efficiency") else None)
        columns[f"default {shipped.short}"] = group_scores(data.rows, t, p, mt, mp, usable,
                                                           data.reasons)
    except Exception as exc:  # a checkout without a shipped revision
        print(f"(no shipped default revision: {exc})", file=sys.stderr)
    total_s = time.perf_counter() - t0
    print_table("agg rows: TTFT and TPOT MAPE / median APE (cov: all rows; clean: without "
                "layouts larger than a node and mislabeled images)", columns)
    print(f"== revision {rev.digest} fitted on {int(usable.sum())} rows of "
          f"{', '.join(args.systems)}")
    for prm in rev.parts[0].parameters:
        std = "-" if prm.std is None else f"{prm.std:.3g}"
        print(f"  {prm.name:46s} {prm.value:12.4g} +- {std} {prm.unit}")
    band_section(rev)
    print(f"== fit with {len(cv)} CV schemes: {fit_s:.0f} s; everything: {total_s:.0f} s")
    if args.revision_out:
        Path(args.revision_out).write_text(dumps(rev), encoding="utf-8")
    disagg = disagg_section(args.systems, evidence_root, configs)
    handoff = handoff_section(sets, rev, cv, evidence_root, configs)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "revision": rev.digest, "fit_seconds": fit_s, "systems": args.systems,
            "columns": {c: {"|".join(k): v for k, v in g.items()} for c, g in columns.items()},
            "disagg": disagg, "handoff": handoff}, indent=1), encoding="utf-8")
    return 0


def handoff_section(sets, rev, cv: list[str], evidence_root: Path | None, configs: Path
                    ) -> dict | None:
    """The disaggregated handoff (`perfcast.calibrate.disagg_handoff`) fitted after the
    overheads of `rev` on the disagg rows with worker counts: its values, and TTFT/TPOT
    scores per system without it, in sample and held out per CV scheme."""
    from perfcast.calibrate.fit_serving import fit_handoff_after
    from perfcast.calibrate.serving import scores

    t0 = time.perf_counter()
    out = fit_handoff_after(sets, rev, {"observation_sets": [o.digest for o in sets]},
                            cv=cv, evidence_root=evidence_root, model_configs=configs,
                            progress=lambda m: print(m, file=sys.stderr))
    if out is None:
        print("== disagg handoff: too few modelled disagg rows with worker counts")
        return None
    data, res = out["data"], out["fit"]
    usable = data.usable
    systems = np.array([(r.get("system") or "").strip() for r in data.rows], dtype=object)
    columns = {"without": (data.base_ttft, data.base_tpot),
               "in-sample": out["predictions"]}
    for scheme in out["schemes"]:
        preds = scheme["predictions"]
        columns[f"held-out {scheme['group_by']}"] = (preds["ttft"], preds["tpot"])
    table: dict[str, dict] = {}
    print("== disagg handoff fitted after the overheads (rows with worker counts): TTFT / "
          "TPOT MAPE per system")
    names = sorted(set(systems[usable])) + ["*"]
    print(f"{'column':22s}" + "".join(f" | {n:^24s}" for n in names))
    for label, (t, p) in columns.items():
        row = {}
        for n in names:
            m = usable & np.isfinite(t) & ((systems == n) if n != "*" else True)
            row[n] = scores(t[m], p[m], data.measured_ttft[m], data.measured_tpot[m])
        table[label] = row
        print(f"{label:22s}" + "".join(
            f" | {row[n]['rows']:3d} rows {_pct(row[n]['ttft_mape']):>6s} / "
            f"{_pct(row[n]['tpot_mape']):>6s}" for n in names))
    for scheme in out["schemes"]:
        for f in scheme["refused"]:
            print(f"  {scheme['group_by']} fold {f['group']} refused: {f['reason']} "
                  f"({f['rows']} held out, {f['train_rows']} training)")
    fitted = {n: (round(v), None if res.std[n] is None else round(res.std[n]))
              for n, v in res.theta.items()}
    print(f"  handoff (us, +- 1 sigma): {fitted}; backends with rows: {res.backends_fitted}")
    print(f"== disagg handoff section: {time.perf_counter() - t0:.0f} s")
    return {"parameters": fitted, "scores": table,
            "refused": {s["group_by"]: s["refused"] for s in out["schemes"]}}


def disagg_section(systems: list[str], evidence_root: Path | None, configs: Path) -> dict:
    """Scores of every system's disagg rows, physics only and with the shipped revision
    (fitted on agg rows only), per system x model x backend and per system; printed and
    returned as {column: {"system|model|backend": scores}}."""
    from perfcast.cli.validate import ValidateArgs, run_validate, silicon_rows

    columns: dict[str, dict] = {}
    reasons: dict[str, int] = {}
    t0 = time.perf_counter()
    for name in ("none", "default"):
        column: dict[str, dict] = {}
        for system in systems:
            # the same path as `perfcast validate silicon FILE --mode disagg`
            a = ValidateArgs(file=str(REF / "silicon" / f"{system}.csv"),
                             evidence_root=str(evidence_root) if evidence_root else None,
                             model_configs=str(configs), mode="disagg", calibration=name)
            doc, res = run_validate(a, silicon_rows(a))
            for g in doc["summary_by_mode"].get("disagg", []):
                key = (system if g["system"] == "*" else g["system"], g["model"], g["backend"])
                column["|".join(key)] = g
            if name == "default":
                for r in res:
                    if r.reason:
                        reasons[r.reason] = reasons.get(r.reason, 0) + 1
        digest = doc["calibration"].split(":")[-1]
        label = "none" if doc["calibration"] == "none" else f"default {digest[:8]}"
        columns[label] = column
    print("== disagg rows: coverage of all rows / of rows with worker counts; TTFT and TPOT "
          "MAPE / median APE (nothing fitted on disagg rows: held out)")
    names = list(columns)
    print(f"{'system':9s} {'model':34s} {'backend':7s} {'rows':>4s} {'cov':>6s} {'counts':>6s} "
          f"{'cov':>6s}" + "".join(f" | {n[:22]:^25s}" for n in names))
    for key in sorted(columns[names[0]], key=lambda k: (k.split("|")[1] == "*", k)):
        first = columns[names[0]][key]
        sysname, model, backend = key.split("|")
        line = (f"{sysname[:9]:9s} {model[:34]:34s} {backend[:7]:7s} {first['rows']:4d} "
                f"{100 * first['coverage']:5.1f}% {first['rows_with_worker_counts']:6d} "
                f"{_pct(first['coverage_with_worker_counts'])}")
        line += "".join(_scores(columns[n][key]) for n in names)
        print(line)
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  {n:4d} not predicted: {reason[:160]}")
    print(f"== disagg section: {time.perf_counter() - t0:.0f} s")
    return columns


def quick(csv: Path, evidence_root: Path | None, configs: Path) -> int:
    from perfcast.calibrate.serving import serving_overheads
    from perfcast.calibrate.store import default_revision
    from perfcast.serving.silicon import read_rows, summarize, validate_rows

    rows = [r for r in read_rows(csv) if r.get("mode") == "agg"]
    evidence_for = None
    if evidence_root:
        from perfcast.serving.evidence import evidence_loader
        evidence_for = evidence_loader(evidence_root)
    from perfcast.cli.calibration_option import analytic_for
    rev = default_revision()
    t0 = time.perf_counter()
    # the path of `perfcast validate silicon --calibration default`: the revision's
    # serving overheads and its analytic efficiency curves
    res = validate_rows(rows, configs_dir=configs, evidence_for=evidence_for,
                        overheads=serving_overheads(rev.part("serving_overheads")),
                        analytic_for=analytic_for(rev))
    for g in summarize(res):
        print(f"{g['model'][:34]:34s} {g['backend']:7s} rows {g['rows']:4d} cov "
              f"{100 * g['coverage']:5.1f}%  TTFT {_pct(g['ttft_mape'])} med "
              f"{_pct(g['ttft_median_ape'])}  TPOT {_pct(g['tpot_mape'])} med "
              f"{_pct(g['tpot_median_ape'])}")
    print(f"== {len(rows)} rows in {time.perf_counter() - t0:.1f} s (revision {rev.short})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
