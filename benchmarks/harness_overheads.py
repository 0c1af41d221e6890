"""Per-call harness overheads and the plausibility screen on every GEMM table of an
AIConfigurator-layout folder (default: the public H100 and H200 tables).

    python benchmarks/harness_overheads.py [--data DIR] [--json]

Per table: the floor (smallest per-kernel intercept), then per (dtype, kernel) the fitted
intercept, its standard error, the excess a CUDA-graph deployment does not run, and the
plausibility screen's counts (rows faster than the roofline, rows slower than
SLOW_FACTOR x roofline + launch).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from perfcast.evidence.harness_overhead import fit_call_overheads
from perfcast.evidence.importers.aiconfigurator import import_system
from perfcast.evidence.plausibility import SLOW_FACTOR, screen_table
from perfcast.hardware import load_system

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "reference" / "aiconfigurator"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = []
    for folder in sorted(args.data.glob("*/gemm/*/*")):
        if not any(folder.glob("*.parquet")):
            continue
        system_name, _, backend, version = folder.parts[-4:]
        system = load_system(system_name)
        db = import_system(folder, hardware=system.name)
        fit = fit_call_overheads(db.table, system,
                                 source_revision=f"gemm/{backend}/{version}")
        screen = {(r.dtype, r.implementation): r for r in screen_table(db.table, system)}
        rows = []
        for e in fit.entries:
            s = screen.get((e.dtype, e.implementation))
            rows.append({"dtype": e.dtype, "kernel": e.implementation,
                         "intercept_us": e.intercept_s * 1e6,
                         "intercept_std_us": e.intercept_std_s * 1e6,
                         "excess_us": e.excess_s * 1e6, "excess_std_us": e.excess_std_s * 1e6,
                         "fit_rows": e.rows, "rows": s.rows if s else 0,
                         "below_roofline": s.below_bound if s else 0,
                         "slower_than_factor": s.too_slow if s else 0})
        out.append({"system": system_name, "backend": backend, "version": version,
                    "floor_us": fit.floor_s * 1e6, "floor": fit.floor_implementation,
                    "kernels": rows, "notes": list(fit.notes)})
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"slow screen factor {SLOW_FACTOR:g}x roofline + launch")
    for t in out:
        print(f"{t['system']} {t['backend']} {t['version']}: floor {t['floor_us']:.2f} us "
              f"({t['floor']})")
        for r in t["kernels"]:
            print(f"  {r['dtype']:<10} {r['kernel']:<36} intercept {r['intercept_us']:7.1f} "
                  f"+- {r['intercept_std_us']:.1f} us  excess {r['excess_us']:7.1f} "
                  f"+- {r['excess_std_us']:.1f} us  ({r['fit_rows']} fit rows; screen: "
                  f"{r['below_roofline']} fast, {r['slower_than_factor']} slow of {r['rows']})")
        for n in t["notes"]:
            print(f"  note: {n}")


if __name__ == "__main__":
    main()
