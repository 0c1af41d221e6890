"""Load every H100 AIConfigurator GEMM table and answer 100k queries.

Half the queries are measured points (database hits), half are random off-grid shapes
inside the measured range (interpolation), across runtimes, versions, kernels and dtypes.
Each query goes through the resolver (database -> interpolation -> roofline).

    python benchmarks/evidence_query_speed.py [--data DIR] [--queries 100000]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import Counter
from pathlib import Path

import numpy as np

from perfcast.core.frozen import FrozenDict
from perfcast.evidence.factory import build_resolver
from perfcast.evidence.chain import batch_gc, evidence_providers
from perfcast.evidence.contracts import CostQuery, CostQueryContext, CostSubject
from perfcast.evidence.importers.aiconfigurator import import_system
from perfcast.hardware import load_system

DATA = Path("/work/shared/reference/aiconfigurator/h100_sxm/gemm")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--off-grid", type=float, default=0.5,
                    help="fraction of queries moved off the measured grid (interpolated)")
    ap.add_argument("--profile", action="store_true", help="cProfile the resolve phase")
    ap.add_argument("--default-gc", action="store_true",
                    help="resolve without perfcast.evidence.chain.batch_gc")
    args = ap.parse_args(argv)
    system = load_system("h100_sxm")

    c0 = time.process_time()
    t0 = time.perf_counter()
    db = import_system(args.data, hardware="h100_sxm")
    t1 = time.perf_counter()
    resolver = build_resolver(system, evidence=evidence_providers([db], system, "interpolate"))
    t2 = time.perf_counter()

    rng = np.random.default_rng(args.seed)
    tab = db.table
    pick = rng.choice(len(db), size=args.queries, replace=False)
    cols = {c: tab.column(c).take(pick).to_pylist()
            for c in ("dtype", "sel.int.m", "sel.int.n", "sel.int.k", "sel.str.runtime",
                      "sel.str.runtime_revision", "sel.str.implementation")}
    # like `perfcast evidence query --queries`: build and resolve inside batch_gc
    gc_scope = contextlib.nullcontext() if args.default_gc else batch_gc()
    gc_scope.__enter__()
    off_grid = rng.random(args.queries) < args.off_grid
    jitter = np.exp(rng.uniform(-0.3, 0.3, size=args.queries))
    contexts: dict[tuple, CostQueryContext] = {}
    queries = []
    for i in range(args.queries):
        m = cols["sel.int.m"][i]
        if off_grid[i]:
            m = max(1, min(32768, int(m * jitter[i])))
        n, k = cols["sel.int.n"][i], cols["sel.int.k"][i]
        key = (cols["sel.str.runtime"][i], cols["sel.str.runtime_revision"][i],
               cols["sel.str.implementation"][i])
        ctx = contexts.get(key) or contexts.setdefault(key, CostQueryContext(*key))
        queries.append(CostQuery(
            subject=CostSubject.OPERATOR, operation="gemm", hardware="h100_sxm",
            dtype=cols["dtype"][i], flops=2.0 * m * n * k,
            bytes_read=float(m * k + k * n), bytes_written=float(2 * m * n),
            dims=FrozenDict({"m": m, "n": n, "k": k}), context=ctx))
    t3 = time.perf_counter()
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
    methods = Counter(resolver.resolve(q).estimate.method.value for q in queries)
    t4 = time.perf_counter()
    gc_scope.__exit__(None, None, None)
    if args.profile:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)

    print(f"rows loaded                 {len(db):>10,d}  ({len(db.sources)} sources)")
    print(f"import (parquet -> db)      {t1 - t0:10.2f} s")
    print(f"index + interpolation build {t2 - t1:10.2f} s")
    print(f"build {args.queries:,d} queries       {t3 - t2:10.2f} s")
    print(f"resolve {args.queries:,d} queries     {t4 - t3:10.2f} s  "
          f"({(t4 - t3) / args.queries * 1e6:.1f} us/query)")
    print(f"total                       {t4 - t0:10.2f} s wall, "
          f"{time.process_time() - c0:.2f} s CPU (the machine is shared)")
    print("methods:", dict(methods))


if __name__ == "__main__":
    main()
