"""Run independent tasks inline, in local processes or on a Ray cluster.

The sweeps (`perfcast search`, `perfcast train-search`) evaluate many layouts that do
not depend on each other. `map_tasks` returns the results in task order whatever order
they finish in; Ray is an optional extra (`pip install ray`); without a running cluster
`ray.init()` starts a local one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from perfcast.core.errors import ConfigError

EXECUTORS = ("local", "inline", "ray")


def map_tasks(fn: Callable, tasks: Sequence, executor: str, workers: int | None = None,
              on_done: Callable[[int], None] | None = None) -> list:
    """`[fn(t) for t in tasks]` inline, in `workers` local processes (0 or None: one per
    CPU) or as Ray tasks; `on_done(i)` is called as task i finishes. `fn` and the tasks
    must pickle for the process and Ray executors."""
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}", field="--executor",
                          expected=" | ".join(EXECUTORS))
    if workers is not None and workers < 0:
        raise ConfigError(f"workers must be >= 0, got {workers}", field="--workers",
                          expected="a number of processes (0: one per CPU)")
    done = on_done or (lambda i: None)
    results: list = [None] * len(tasks)
    if executor == "inline" or len(tasks) <= 1:
        for i, t in enumerate(tasks):
            results[i] = fn(t)
            done(i)
        return results
    if executor == "local":
        from concurrent.futures import ProcessPoolExecutor, as_completed

        n = workers or max(1, min(len(tasks), os.cpu_count() or 1))
        with ProcessPoolExecutor(max_workers=n) as pool:
            futures = {pool.submit(fn, t): i for i, t in enumerate(tasks)}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                done(futures[fut])
        return results
    try:
        import ray
    except ImportError:
        raise ConfigError("Ray is not installed", field="--executor",
                          expected="`pip install ray` or --executor local") from None
    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True, include_dashboard=False)
    remote = ray.remote(fn)
    refs = [remote.remote(t) for t in tasks]
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        i = index[ready[0]]
        results[i] = ray.get(ready[0])
        done(i)
    return results
