"""How much prefill time per second each silicon row's measured throughput needs by its
system's own kernel tables (`silicon_bounds.measured_prefill_demand`, the quantity
`validate silicon` refuses a row on above 1), and, for one model, its rows scored with
the mean and with the median of the simulated requests.

    python benchmarks/measured_prefill_demand.py [CSV ...] [--evidence-root DIR]
        [--model-configs DIR] [--top N] [--statistics-for MODEL_ID]

Prints the N agg rows of largest demand, the largest demand per system x model x
backend, and the largest demand of any group without a row above 1. Rows refused
before this screen (layout, memory, HBM and peak-compute bounds) are left out.
`--statistics-for` scores that model's rows (exact id) with `statistic` mean and p50,
over the rows both predict, with the shipped revision (about 1 s per row).
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

REF = Path(__file__).resolve().parents[1] / ".." / "shared" / "reference"


def demands(paths, evidence_root: Path, configs: Path) -> list[tuple]:
    from perfcast.serving.evidence import evidence_loader
    from perfcast.serving.silicon import (ModelResolver, RowError, load_rules, read_rows,
                                          row_config)
    from perfcast.serving.silicon_bounds import (above_compute_bound, below_memory_bound,
                                                 measured_prefill_demand)

    rules = load_rules()
    models = ModelResolver(configs, rules)
    evidence_for = evidence_loader(evidence_root)
    out = []
    for path in paths:
        for row in read_rows(Path(path)):
            if row.get("mode") != "agg":
                continue
            try:
                cfg, _ = row_config(row, models, rules)
            except RowError:
                continue
            ttft, tpot = float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])
            if below_memory_bound(cfg, ttft, tpot) or above_compute_bound(cfg, ttft, tpot):
                continue
            ev = evidence_for(row["system"], row["backend"], row.get("backend_version", ""))
            d = measured_prefill_demand(cfg, ttft, tpot, ev.providers, ev.context)
            if d is not None:
                out.append((d[0], row["system"], row["model_path"], row["backend"],
                            row.get("backend_version", ""), cfg.pool.plan.tp, cfg.isl,
                            cfg.osl, cfg.concurrency))
    return sorted(out, reverse=True)


def statistics(paths, model: str, evidence_root: Path, configs: Path) -> None:
    from perfcast.calibrate.store import load_calibration
    from perfcast.cli.calibration_option import all_overheads, analytic_for
    from perfcast.serving.evidence import evidence_loader
    from perfcast.serving.silicon import read_rows, validate_rows

    rows = [r for p in paths for r in read_rows(Path(p))
            if r.get("mode") == "agg" and r["model_path"].strip() == model]
    revision = load_calibration("default")
    kw = dict(configs_dir=configs, evidence_for=evidence_loader(evidence_root),
              overheads=all_overheads(revision), analytic_for=analytic_for(revision))
    by = {s: {r.row_id: r for r in validate_rows(rows, statistic=s, **kw)}
          for s in ("mean", "p50")}
    both = [k for k, r in by["mean"].items() if r.predicted and by["p50"][k].predicted]
    print(f"== {model}: {len(both)} rows predicted with both statistics "
          f"(of {len(rows)}); MAPE TTFT / TPOT")
    for s in ("mean", "p50"):
        rs = [by[s][k] for k in both]
        ttft = 100 * sum(abs(r.pred_ttft_ms / r.measured_ttft_ms - 1) for r in rs) / len(rs)
        tpot = 100 * sum(abs(r.pred_tpot_ms / r.measured_tpot_ms - 1) for r in rs) / len(rs)
        print(f"  {s:4s}  {ttft:6.1f}%  {tpot:6.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="*", default=[str(REF / "silicon" / "h100_sxm.csv"),
                                                str(REF / "silicon" / "h200_sxm.csv")])
    ap.add_argument("--evidence-root", type=Path, default=REF / "aiconfigurator")
    ap.add_argument("--model-configs", type=Path, default=REF / "model_configs")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--statistics-for", default="", help="exact model id")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = demands(args.csv, args.evidence_root, args.model_configs)
    print(f"== {len(rows)} agg rows with measured kernels, largest demand first "
          f"(device-seconds of prefill per second; > 1: refused)")
    for d, *key in rows[:args.top]:
        print(f"  {d:5.2f}  " + "  ".join(str(k) for k in key))
    groups: dict[tuple, list[float]] = collections.defaultdict(list)
    for d, system, model, backend, *_ in rows:
        groups[(system, model, backend)].append(d)
    print("== per system x model x backend: rows, above 1, largest demand")
    for key, ds in sorted(groups.items(), key=lambda kv: -max(kv[1])):
        print(f"  {' '.join(key):70s} {len(ds):4d} {sum(d > 1 for d in ds):3d} {max(ds):5.2f}")
    clean = [max(ds) for ds in groups.values() if max(ds) <= 1.0]
    if clean:
        print(f"== largest demand of a group without a refused row: {max(clean):.2f}")
    print(f"== {time.perf_counter() - t0:.1f} s")
    if args.statistics_for:
        statistics(args.csv, args.statistics_for, args.evidence_root, args.model_configs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
