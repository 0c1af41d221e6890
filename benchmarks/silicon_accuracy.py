"""Accuracy of `perfcast validate silicon` on a silicon-sample CSV.

    python benchmarks/silicon_accuracy.py [CSV] [--evidence-root DIR] [--model-configs DIR]

Prints coverage, TTFT/TPOT MAPE and median APE per system x model x backend and
overall, for all rows and for the agg rows, plus the wall time of the run.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

from perfcast.serving.silicon import read_rows, summarize, validate_rows

REF = Path(__file__).resolve().parents[1] / ".." / "shared" / "reference"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="?", default=str(REF / "silicon" / "h100_sxm.csv"))
    ap.add_argument("--evidence-root", default=None)
    ap.add_argument("--model-configs", default=str(REF / "model_configs"))
    ap.add_argument("--mode", default=None, help="only rows of this mode (agg | disagg)")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--statistic", default="mean", help="mean | p50 of the simulated requests")
    ap.add_argument("--seed", type=int, default=0, help="simulated clients' seed (spread check)")
    args = ap.parse_args(argv)
    rows = read_rows(Path(args.csv))
    if args.mode:
        rows = [r for r in rows if r.get("mode") == args.mode]
    if args.limit:
        rows = rows[: args.limit]
    evidence_for = None
    if args.evidence_root:
        from perfcast.serving.evidence import evidence_loader

        evidence_for = evidence_loader(Path(args.evidence_root))
    t0 = time.perf_counter()
    results = validate_rows(rows, configs_dir=Path(args.model_configs), evidence_for=evidence_for,
                            statistic=args.statistic, seed=args.seed)
    wall = time.perf_counter() - t0
    for label, subset in (("all rows", results), ("agg rows", [r for r in results if r.mode == "agg"])):
        print(f"== {label}")
        for g in summarize(subset):
            fmt = lambda v: "-" if v is None else f"{100 * v:6.1f}%"
            print(f"{g['model'][:34]:34s} {g['backend']:7s} rows {g['rows']:4d} "
                  f"cov {100 * g['coverage']:5.1f}%  TTFT MAPE {fmt(g['ttft_mape'])} "
                  f"med {fmt(g['ttft_median_ape'])}  TPOT MAPE {fmt(g['tpot_mape'])} "
                  f"med {fmt(g['tpot_median_ape'])}")
    reasons = collections.Counter(r.reason.split(" (")[0][:90] for r in results if r.reason)
    print("== reasons")
    for reason, n in reasons.most_common(12):
        print(f"{n:4d}  {reason}")
    print(f"== {len(rows)} rows in {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
