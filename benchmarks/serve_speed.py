"""Speed of `perfcast serve`: a 70B model at concurrency 64.

    python benchmarks/serve_speed.py [--evidence-root DIR] [--cli-runs N]

First the whole CLI call as a user makes it (issue 17 target: under 0.5 s), timed as a
subprocess, best of N: `perfcast serve meta-llama/Llama-3.1-70B --device h100_sxm
--tp-size 8 --concurrency 64 --format json`, wall and CPU (user + sys) seconds; bytecode
is cached (as an installed package has it) under a temporary PYTHONPYCACHEPREFIX, with
one unmeasured warm-up call; `serve --help` likewise (the start-up alone). Then the
serving path in-process (model load, step-cost graphs, simulation) for a cold start
(fresh caches) per backend and lengths: graphs built, iterations simulated and seconds.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perfcast.serving.deploy import Pool, ServeConfig, StepModelCache, run_serving
from perfcast.workload import ParallelPlan


CLI = ["serve", "meta-llama/Llama-3.1-70B", "--device", "h100_sxm", "--tp-size", "8",
       "--concurrency", "64", "--format", "json"]


def _best(cmd: list[str], env: dict, runs: int) -> tuple[float, float]:
    """Best wall and best CPU (user + sys) seconds of `runs` calls of `cmd`."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, check=True, env=env, capture_output=True)
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return min(walls), min(cpus)


def time_cli(runs: int) -> None:
    """Best of `runs` calls of the CLI in a fresh interpreter each (wall, CPU seconds),
    and of `serve --help` (the start-up alone: interpreter, typer, the serve module)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as pyc:
        env["PYTHONPYCACHEPREFIX"] = pyc
        cmd = [sys.executable, "-m", "perfcast.cli.main", *CLI]
        subprocess.run(cmd, check=True, env=env, capture_output=True)   # warm-up: bytecode
        wall, cpu = _best(cmd, env, runs)
        help_wall, help_cpu = _best(cmd[:3] + ["serve", "--help"], env, runs)
    print(f"perfcast {' '.join(CLI)}\n  best of {runs}: wall {wall:.3f} s, CPU {cpu:.3f} s "
          f"(target < 0.5 s); `serve --help` wall {help_wall:.3f} s, CPU {help_cpu:.3f} s; "
          f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--evidence-root", default=None)
    ap.add_argument("--model", default="meta-llama/Llama-3.1-70B")
    ap.add_argument("--cli-runs", type=int, default=5, help="0: skip the CLI timing")
    args = ap.parse_args()
    if args.cli_runs:
        time_cli(args.cli_runs)
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
