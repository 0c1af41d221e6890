"""Speed of `estimate` for Llama-3.1-70B TP8 decode (batch 64, context 4096) on H100.

Prints: in-process time per estimate after warm-up (fresh resolver each time, so no
cached answers), the same with a reused resolver, and the wall time of the whole CLI call.
Targets (issue 2): < 20 ms in-process, < 1.5 s for the CLI call.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.evidence.factory import build_resolver
from perfcast.hardware import load_system
from perfcast.workload import Batch, ParallelPlan

REQUEST = EstimateRequest(model="meta-llama/Llama-3.1-70B", device="h100_sxm",
                          plan=ParallelPlan(tp=8), batch=Batch.decode(64, 4096))
ARGS = ["estimate", "meta-llama/Llama-3.1-70B", "--device", "h100_sxm", "--tp-size", "8",
        "--num-queries", "64", "--query-length", "1", "--context-length", "4096", "--decode",
        "--format", "json"]


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    estimate_step(REQUEST)  # warm-up: loads catalog files, imports
    fresh = timed(lambda: estimate_step(REQUEST), 50)
    system = load_system("h100_sxm")
    resolver = build_resolver(system)
    reused = timed(lambda: estimate_step(REQUEST, resolver), 50)
    exe = Path(sys.executable).with_name("perfcast")
    cli = timed(lambda: subprocess.run([str(exe), *ARGS], check=True, capture_output=True), 5)
    print(f"estimate in-process, fresh resolver: median {statistics.median(fresh) * 1e3:.2f} ms "
          f"(min {min(fresh) * 1e3:.2f} ms)  target < 20 ms")
    print(f"estimate in-process, reused resolver: median {statistics.median(reused) * 1e3:.2f} ms")
    print(f"whole CLI call: median {statistics.median(cli):.3f} s (min {min(cli):.3f} s)  "
          "target < 1.5 s")


if __name__ == "__main__":
    main()
