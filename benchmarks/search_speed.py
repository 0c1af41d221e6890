"""Speed of `perfcast search` (issue 17 target: at least 1,000 configurations of a 70B
model on 8 GPUs in under 60 s on a 2-core machine), and the same search through Ray.

    python benchmarks/search_speed.py [--concurrency LIST] [--workers N] [--ray]

Searches Llama-3.1-70B (BF16) on 8 H100s: every agg and disagg layout of TP 2/4/8 (9; TP 1
cannot hold the weights) times 112 concurrencies (1..112) = 1,008 configurations, in local
processes (`--executor local`), and prints configurations, layouts, how many could not be
served, wall and CPU seconds (this process and its workers).
`--ray` runs the same space through Ray (a local cluster) and checks every candidate's
JSON equals the local one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

from perfcast.serving.search import SearchSpace, candidate_json, layouts, search


def cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(space: SearchSpace, executor: str, workers: int | None):
    w, c = time.perf_counter(), cpu_s()
    cands = search(space, executor=executor, workers=workers)
    return cands, time.perf_counter() - w, cpu_s() - c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="meta-llama/Llama-3.1-70B")
    ap.add_argument("--concurrency", default=",".join(str(c) for c in range(1, 113)))
    ap.add_argument("--tp-sizes", default="2,4,8")
    ap.add_argument("--workers", type=int, default=0, help="local processes (0: one per CPU)")
    ap.add_argument("--ray", action="store_true", help="also through Ray; compare results")
    args = ap.parse_args()
    space = SearchSpace(model=args.model, gpus=8,
                        concurrencies=tuple(int(c) for c in args.concurrency.split(",")),
                        tp_sizes=tuple(int(t) for t in args.tp_sizes.split(",")))
    n_layouts = len(layouts(space))
    cands, wall, cpu = timed(space, "local", args.workers or None)
    errors = sum(bool(c.error) for c in cands)
    print(f"{len(cands)} configurations ({n_layouts} layouts x {len(space.concurrencies)} "
          f"concurrencies; {errors} not servable), local processes: wall {wall:.1f} s, "
          f"CPU {cpu:.1f} s (target < 60 s wall); load average {os.getloadavg()[0]:.1f}")
    if errors:
        print("  first error:", next(c.error for c in cands if c.error))
    if args.ray:
        ray_cands, wall, cpu = timed(space, "ray", None)
        same = ([json.dumps(candidate_json(c), sort_keys=True) for c in cands]
                == [json.dumps(candidate_json(c), sort_keys=True) for c in ray_cands])
        print(f"ray: wall {wall:.1f} s (cluster start included); identical results: {same}")


if __name__ == "__main__":
    main()
