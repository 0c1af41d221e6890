"""Speed of the training layout search (issue 20: >= 500 layouts in under 60 s).

    python benchmarks/training_search_speed.py [--model ID] [--num-devices 64]
        [--executor local|inline] [--workers N] [--json FILE]

Default: Llama-3.1-70B on 64 H100s, global batch 512 x 4096 tokens, TP 1-8, PP 1-16,
V 1-2, micro-batch 1-2 (`--micro-batch-sizes 1,2,4`: 918 layouts), SP on/off, recompute
none/selective/full, ZeRO 0/1: every layout that divides (612), each a full
`estimate_training` call unless its weights, gradients and optimizer state alone exceed the
device memory. Prints the number of layouts, the wall
time, layouts per second, and whether the 60 s target is met on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 60.0
MIN_LAYOUTS = 500


def _cpu_s() -> float:
    """User + system CPU seconds of this process and its finished children."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="meta-llama/Llama-3.1-70B")
    ap.add_argument("--device", default="h100_sxm")
    ap.add_argument("--num-devices", default="64")
    ap.add_argument("--global-batch-size", type=int, default=512)
    ap.add_argument("--seq-length", type=int, default=4096)
    ap.add_argument("--micro-batch-sizes", default="1,2")
    ap.add_argument("--executor", default="local", choices=("local", "inline"))
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from perfcast.cli.train_search import parse_sizes
    from perfcast.training.search import (TrainSearchSpace, failure_counts, layout_choices,
                                          ranked, search)
    from perfcast.workload import load_model_spec

    spec = load_model_spec(args.model)
    space = TrainSearchSpace(model=spec, device=args.device,
                             num_devices=parse_sizes(args.num_devices, "--num-devices"),
                             global_batch_size=args.global_batch_size,
                             seq_length=args.seq_length, tp_sizes=(1, 2, 4, 8),
                             pp_sizes=(1, 2, 4, 8, 16), virtual_pipeline_sizes=(1, 2),
                             micro_batch_sizes=parse_sizes(args.micro_batch_sizes,
                                                           "--micro-batch-sizes"))
    t_enum = time.perf_counter()
    n = len(layout_choices(space, spec).choices)
    t_enum = time.perf_counter() - t_enum
    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    result = search(space, executor=args.executor, workers=args.workers or None)
    wall = time.perf_counter() - t0
    cpu = _cpu_s() - cpu0
    load = os.getloadavg()[0]
    cands = result.candidates
    best = ranked(cands)
    ok = n >= MIN_LAYOUTS and wall < TARGET_S
    print(f"model {spec.name} on {args.num_devices} x {args.device}, global batch "
          f"{args.global_batch_size} x {args.seq_length}")
    print(f"{n} layouts (enumerated in {t_enum:.2f} s; {result.skipped} size combinations "
          f"do not divide), searched in {wall:.1f} s with executor {args.executor} on "
          f"{os.cpu_count()} CPUs: {n / wall:.1f} layouts/s")
    print(f"CPU time {cpu:.1f} s ({1e3 * cpu / n:.0f} ms per layout, this process and its "
          f"workers); load average {load:.1f} at the end (other work on the machine "
          "stretches the wall time)")
    bounded = sum(1 for c in cands if "static_lower_bound" in c.memory_bytes)
    print(f"{len(best)} fit memory; failures {failure_counts(cands)} ({bounded} of them "
          "from the weights + gradients + optimizer bound, not costed)")
    if best:
        print(f"fastest: {best[0].label} {best[0].step_time_s:.3f} s/step, MFU "
              f"{100 * (best[0].mfu or 0):.1f}%")
    print(f"target: >= {MIN_LAYOUTS} layouts in < {TARGET_S:.0f} s -> {'met' if ok else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({
            "model": spec.name, "device": args.device, "num_devices": args.num_devices,
            "layouts": n, "wall_s": wall, "cpu_s": cpu, "load_average": load,
            "executor": args.executor,
            "cpus": os.cpu_count(), "fit": len(best), "target_met": ok}, indent=2),
            encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
