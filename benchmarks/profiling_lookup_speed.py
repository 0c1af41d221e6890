"""Speed of the profiling cost path: one Qwen3-8B decode step (TP2) costed by the
analytic resolver, by the profiling resolver on the fixture database, and on a copy of
it whose MatMulV2.csv is padded with N extra rows (real databases hold thousands).
`first` includes parsing the CSVs; later runs reuse the parse (cached by content digest).

    .venv/bin/python benchmarks/profiling_lookup_speed.py [N]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.evidence.factory import build_resolver
from perfcast.evidence.profiling.empirical import EmpiricalPerformanceModel
from perfcast.evidence.profiling.interpolating_data_source import InterpolatingDataSource
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.hardware import load_system
from perfcast.workload import Batch, ParallelPlan

DB = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "msmodeling" / "a3_qwen3_8b"


def run(label, system, request, database=None, interpolate=False, repeat=5):
    best, first = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        if database is None:
            resolver = build_resolver(system)
        else:
            src = ProfilingDataSource(database, system, request.plan)
            if interpolate:
                src = InterpolatingDataSource(src)
            pm = EmpiricalPerformanceModel(system, src, fallback_model=build_resolver(system))
            resolver = build_resolver(system, [pm])
        result = estimate_step(request, resolver)
        elapsed = time.perf_counter() - t0
        first = elapsed if first is None else first
        best = min(best, elapsed)
    print(f"{label:<42} first {first * 1e3:8.2f} ms  best {best * 1e3:7.2f} ms  "
          f"step {result.latency_s * 1e3:.3f} ms")


def main() -> None:
    extra = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    system = load_system("atlas_800_a3_752t_128g_die")
    request = EstimateRequest(model="Qwen/Qwen3-8B", device=system, plan=ParallelPlan(tp=2),
                              batch=Batch.decode(8, 3072))
    run("analytic", system, request)
    run("profiling (fixture db)", system, request, DB)
    run("profiling --interpolate (fixture db)", system, request, DB, interpolate=True)
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "db"
        shutil.copytree(DB, big)
        with open(big / "MatMulV2.csv", "a") as f:
            for i in range(extra):  # shapes no query asks for: every row is scanned
                f.write(f'"{1000 + i},7000;3000,7000",DT_BF16;DT_BF16,ND;ND,"{1000 + i},3000",'
                        f"DT_BF16,ND,{50 + i * 0.01:.2f}\n")
        run(f"profiling (+{extra} MatMulV2 rows)", system, request, big)
        run(f"profiling --interpolate (+{extra} rows)", system, request, big, interpolate=True)


if __name__ == "__main__":
    main()
