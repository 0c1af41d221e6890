"""Speed of `perfcast serve`: a 70B model at concurrency 64 (target < 2 s per run).

    python benchmarks/serve_speed.py [--evidence-root DIR]

Times the whole CLI path in-process (model load, step-cost graphs, simulation) for a
cold start (fresh caches) and prints graphs built, iterations simulated and seconds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from perfcast.serving.deploy import Pool, ServeConfig, StepModelCache, run_serving
from perfcast.workload import ParallelPlan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--evidence-root", default=None)
    ap.add_argument("--model", default="meta-llama/Llama-3.1-70B")
    args = ap.parse_args()
    providers, context = (), None
    if args.evidence_root:
        from perfcast.serving.evidence import evidence_loader

        t = time.perf_counter()
        ev = evidence_loader(Path(args.evidence_root))("h100_sxm", "vllm", "0.14.0")
        providers, context = ev.providers, ev.context
        print(f"evidence import: {time.perf_counter() - t:.2f} s (once per backend version)")
    for backend in ("vllm", "sglang", "trtllm"):
        for isl, osl in ((1024, 1024), (8192, 1024), (1024, 8192)):
            cache = StepModelCache()
            cfg = ServeConfig(model=args.model, backend=backend, pool=Pool(ParallelPlan(tp=8)),
                              isl=isl, osl=osl, range_ratio=0.8, concurrency=64)
            t = time.perf_counter()
            res = run_serving(cfg, evidence=providers if backend == "vllm" else (),
                              evidence_context=context if backend == "vllm" else None,
                              cache=cache)
            dt = time.perf_counter() - t
            e = res.engines[0]
            print(f"{backend:7s} {isl:5d}x{osl:<5d} C=64: {dt:5.2f} s  "
                  f"({e.cost.graphs_built} graphs, {e.stats.steps} iterations, "
                  f"{res.metrics.completed_requests} requests)")


if __name__ == "__main__":
    main()
