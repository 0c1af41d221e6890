"""Speed of `estimate_training` and of the `perfcast train` CLI call.

Case of issue 20: GPT-3 175B on 1,024 A100s, TP8 PP16 DP8, interleaved (V = 2), sequence
parallel, selective recompute, batch 1536 x 2048, micro-batch 1 (192 microbatches).
Prints the in-process time (median / best of --repeats after a warm-up), the scheduled
pipeline instances, and the wall time of the CLI call in a fresh interpreter (which
includes Python start-up and importing every command module).

    .venv/bin/python benchmarks/training_speed.py [--repeats 5]
"""

from __future__ import annotations

import argparse
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
    estimate_training(REQUEST)  # warm-up: model, system and catalog loads
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        r = estimate_training(REQUEST)
        times.append(time.perf_counter() - t)
    full = time.perf_counter()
    rf = estimate_training(REQUEST, full_schedule=True)
    full = time.perf_counter() - full
    print(f"estimate_training (compressed pipeline, {len(r.schedule.labels)} instances): "
          f"median {statistics.median(times) * 1e3:.0f} ms, best {min(times) * 1e3:.0f} ms")
    print(f"estimate_training (full pipeline, {len(rf.schedule.labels)} instances): "
          f"{full * 1e3:.0f} ms; step {rf.step_time_s:.4f} s vs compressed "
          f"{r.step_time_s:.4f} s")
    exe = Path(sys.executable).with_name("perfcast")
    for flag in ([], ["--calibration", "none"]):
        t = time.perf_counter()
        subprocess.run([str(exe), *CLI, *flag], check=True, stdout=subprocess.DEVNULL)
        cli = time.perf_counter() - t
        t = time.perf_counter()
        subprocess.run([str(exe), "devices"], check=True, stdout=subprocess.DEVNULL)
        base = time.perf_counter() - t
        print(f"CLI `perfcast {' '.join(CLI[:2])} ... {' '.join(flag)}`: {cli:.2f} s wall "
              f"(`perfcast devices` in the same interpreter set-up: {base:.2f} s)")


if __name__ == "__main__":
    main()
