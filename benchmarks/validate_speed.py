"""Speed of `perfcast validate silicon` (issue 17 target: under 30 ms per row, i.e. the
917 H100 rows in under 30 s).

    python benchmarks/validate_speed.py [FILE] [--evidence-root DIR] [--rows N] [--repeat N]
                                        [--workers N] [--profile OUT.pstats]

Runs the CLI's own path (`cli.validate.run_validate`: evidence loader, default calibration,
every row simulated) on the first N rows (default: all) with --workers local processes
(default 0, one per CPU, as the CLI; 1: in this process) and prints the wall and CPU
seconds (of every process) in all and per row, best of --repeat runs (each with fresh
caches: one process per run). CPU seconds are the steadier figure on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "reference"


def one_run(args) -> dict:
    from perfcast.cli.validate import ValidateArgs, run_validate, silicon_rows

    # cProfile does not follow worker processes: a profile runs in this process
    a = ValidateArgs(file=args.file, evidence_root=args.evidence_root or None,
                     workers=1 if args.profile else args.workers)
    rows = silicon_rows(a)[: args.rows or None]
    w, c, cc = time.perf_counter(), time.process_time(), _children_cpu_s()
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        doc, results = prof.runcall(run_validate, a, rows)
        prof.dump_stats(args.profile)
    else:
        doc, results = run_validate(a, rows)
    return {"rows": len(rows), "predicted": sum(r.predicted for r in results),
            "wall_s": time.perf_counter() - w,
            "cpu_s": time.process_time() - c + _children_cpu_s() - cc}


def _children_cpu_s() -> float:
    """User and system CPU seconds of the finished worker processes."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", nargs="?", default=str(SHARED / "silicon" / "h100_sxm.csv"))
    ap.add_argument("--evidence-root", default=str(SHARED / "aiconfigurator"))
    ap.add_argument("--rows", type=int, default=0, help="first N rows (0: all)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0,
                    help="local processes (0: one per CPU, as the CLI; 1: this process)")
    ap.add_argument("--profile", default="")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child or args.profile:
        print(json.dumps(one_run(args)))
        return
    runs = []
    for _ in range(args.repeat):   # a fresh process per run: cold caches, as the CLI
        out = subprocess.run([sys.executable, __file__, args.file, "--evidence-root",
                              args.evidence_root, "--rows", str(args.rows), "--workers",
                              str(args.workers), "--child"],
                             check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["wall_s"])
    n = best["rows"]
    print(f"{n} rows ({best['predicted']} predicted), {args.workers or os.cpu_count()} "
          f"worker process(es) on {os.cpu_count()} CPUs, best of {len(runs)}: "
          f"wall {best['wall_s']:.1f} s ({1000 * best['wall_s'] / n:.1f} ms/row), "
          f"CPU {min(r['cpu_s'] for r in runs):.1f} s "
          f"({1000 * min(r['cpu_s'] for r in runs) / n:.1f} ms/row); "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
