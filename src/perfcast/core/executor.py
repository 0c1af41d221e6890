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
              on_done: Callable[[int], None] | None = None, *,
              affinity: Sequence | None = None, weights: Sequence[float] | None = None) -> list:
    """`[fn(t) for t in tasks]` inline, in `workers` local processes (0 or None: one per
    CPU) or as Ray tasks; `on_done(i)` is called as task i finishes. `fn` and the tasks
    must pickle for the process and Ray executors.

    `affinity` (local executor): a hashable key per task; tasks of one key run in one
    process as far as the balance allows, so what a process keeps warm for a key (e.g.
    one deployment's evidence) is built once (`run_with_affinity`). `weights`: the
    relative cost of each task (default 1), for the initial split only."""
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
        if affinity is not None:
            return run_with_affinity(fn, tasks, affinity, weights, n, done)
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


def affinity_split(affinity: Sequence, weights: Sequence[float], n: int) -> list[list[int]]:
    """Task indices per process: the keys, heaviest first, each to the process with the
    least weight so far (every task of a key to one process); within a process its
    tasks heaviest first (ties in task order), so the ones left for others to take
    from its tail are light."""
    by_key: dict = {}
    for i, key in enumerate(affinity):
        by_key.setdefault(key, []).append(i)
    load = [0.0] * n
    queues: list[list[int]] = [[] for _ in range(n)]
    for idx in sorted(by_key.values(), key=lambda ix: -sum(weights[i] for i in ix)):
        p = min(range(n), key=load.__getitem__)
        queues[p].extend(idx)
        load[p] += sum(weights[i] for i in idx)
    return [sorted(q, key=lambda i: (-weights[i], i)) for q in queues]


def run_with_affinity(fn: Callable, tasks: Sequence, affinity: Sequence,
                      weights: Sequence[float] | None, n: int,
                      done: Callable[[int], None]) -> list:
    """`[fn(t) for t in tasks]` in `n` processes that start from `affinity_split`'s
    queues: each takes the head of its own queue and, once that is empty, the tail of
    the queue with the most weight left. Results in task order; the first task that
    raises stops every process and its error is raised here."""
    import multiprocessing as mp
    import pickle
    import queue as queue_mod

    if len(affinity) != len(tasks) or (weights is not None and len(weights) != len(tasks)):
        raise ValueError("affinity and weights need one entry per task")
    w = [1.0] * len(tasks) if weights is None else [float(x) for x in weights]
    queues = affinity_split(affinity, w, n)
    order = [i for q in queues for i in q]
    # order[bounds[2p]:bounds[2p + 1]]: what is left of process p's queue
    bounds, start = [], 0
    for q in queues:
        bounds += [start, start + len(q)]
        start += len(q)
    prefix = [0.0]
    for i in order:
        prefix.append(prefix[-1] + w[i])
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork" if "fork" in methods else None)
    shared = (ctx.RawArray("i", order), ctx.RawArray("i", bounds), ctx.RawArray("d", prefix),
              ctx.Lock(), ctx.Queue())
    procs = [ctx.Process(target=_affinity_worker, args=(p, fn, tasks) + shared, daemon=True)
             for p in range(n)]
    for proc in procs:
        proc.start()
    out = shared[-1]
    results: list = [None] * len(tasks)
    try:
        for _ in range(len(tasks)):
            while True:
                try:
                    i, ok, payload = out.get(timeout=1.0)
                    break
                except queue_mod.Empty:
                    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise RuntimeError(f"a worker process exited with code {dead[0]}") \
                            from None
            if not ok:
                raise pickle.loads(payload)
            results[i] = pickle.loads(payload)
            done(i)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join()
    return results


def _affinity_worker(me: int, fn: Callable, tasks: Sequence, order, bounds, prefix, lock,
                     out) -> None:
    import pickle
    import traceback

    while True:
        with lock:
            i = _take(me, order, bounds, prefix)
        if i is None:
            return
        try:
            out.put((i, True, pickle.dumps(fn(tasks[i]))))
        except BaseException as exc:   # noqa: BLE001 - sent to the parent, which raises it
            try:
                payload = pickle.dumps(exc)
                pickle.loads(payload)
            except Exception:   # an exception that does not pickle: its text
                payload = pickle.dumps(RuntimeError(traceback.format_exc()))
            out.put((i, False, payload))
            return


def _take(me: int, order, bounds, prefix) -> int | None:
    """The next task of process `me` (caller holds the lock): the head of its own queue,
    else the tail of the queue with the most weight left; None when all are taken."""
    if bounds[2 * me] < bounds[2 * me + 1]:
        bounds[2 * me] += 1
        return order[bounds[2 * me] - 1]
    best, left = None, 0.0
    for p in range(len(bounds) // 2):
        lo, hi = bounds[2 * p], bounds[2 * p + 1]
        if hi > lo and (best is None or prefix[hi] - prefix[lo] > left):
            best, left = p, prefix[hi] - prefix[lo]
    if best is None:
        return None
    bounds[2 * best + 1] -= 1
    return order[bounds[2 * best + 1]]

