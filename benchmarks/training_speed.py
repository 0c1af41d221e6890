"""Speed of `estimate_training` and of the `perfcast train` CLI call.

Case of issue 20: GPT-3 175B on 1,024 A100s, TP8 PP16 DP8, interleaved (V = 2), sequence
parallel, selective recompute, batch 1536 x 2048, micro-batch 1 (192 microbatches).
Prints the in-process time (wall and CPU, median / best of --repeats after a warm-up),
the scheduled pipeline instances, and the wall and CPU time of the CLI call in a fresh
interpreter (which includes Python start-up and importing every command module), next to
`perfcast devices` (start-up alone) and the machine's load average: on a shared machine
CPU time is the steadier figure.

    .venv/bin/python benchmarks/training_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from perfcast.training import TrainingLayout, TrainingRequest, estimate_training

LAYOUT = dict(tp=8, pp=16, dp=8, virtual_pipeline=2, sequence_parallel=True,
              recompute="selective")
REQUEST = TrainingRequest(model="openai/gpt-3-175b", device="a100_sxm",
                          layout=TrainingLayout(**LAYOUT), global_batch_size=1536,
                          micro_batch_size=1, seq_length=2048)
CLI = ["train", "openai/gpt-3-175b", "--device", "a100_sxm", "--num-devices", "1024",
       "--tp-size", "8", "--pp-size", "16", "--dp-size", "8", "--virtual-pipeline-size", "2",
       "--sequence-parallel", "--recompute", "selective", "--global-batch-size", "1536",
       "--micro-batch-size", "1", "--seq-length", "2048", "--format", "json"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    estimate_training(REQUEST)  # warm-up: model, system and catalog loads
    times, cpu = [], []
    for _ in range(args.repeats):
        t, c = time.perf_counter(), time.process_time()
        r = estimate_training(REQUEST)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    full = time.perf_counter()
    rf = estimate_training(REQUEST, full_schedule=True)
    full = time.perf_counter() - full
    print(f"estimate_training (compressed pipeline, {len(r.schedule.labels)} instances): "
          f"wall median {statistics.median(times) * 1e3:.0f} ms, best {min(times) * 1e3:.0f} ms; "
          f"CPU median {statistics.median(cpu) * 1e3:.0f} ms")
    print(f"estimate_training (full pipeline, {len(rf.schedule.labels)} instances): "
          f"{full * 1e3:.0f} ms; step {rf.step_time_s:.4f} s vs compressed "
          f"{r.step_time_s:.4f} s")
    exe = Path(sys.executable).with_name("perfcast")
    def timed(cmd: list[str]) -> tuple[float, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

    for flag in ([], ["--calibration", "none"]):
        wall, cpu_s = timed([str(exe), *CLI, *flag])
        base_wall, base_cpu = timed([str(exe), "devices"])
        print(f"CLI `perfcast {' '.join(CLI[:2])} ... {' '.join(flag)}`: {wall:.2f} s wall, "
              f"{cpu_s:.2f} s CPU (`perfcast devices`, start-up alone: {base_wall:.2f} s wall, "
              f"{base_cpu:.2f} s CPU)")


if __name__ == "__main__":
    main()
