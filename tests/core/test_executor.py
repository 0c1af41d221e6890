"""`map_tasks`: results in task order for every executor, a callback per finished task,
clear errors for an unknown executor or a missing Ray; Ray runs a real local cluster."""

from __future__ import annotations

import sys

import pytest

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.core.executor import map_tasks

DTYPES = ["bf16", "fp8", "fp32", "int4", "fp16", "int8"]
BYTES = [2, 1, 4, 0.5, 2, 1]


@pytest.mark.parametrize("executor", ["inline", "local"])
def test_results_come_back_in_task_order(executor):
    seen = []
    assert map_tasks(dtype_bytes, DTYPES, executor, 2, seen.append) == BYTES
    assert sorted(seen) == list(range(len(DTYPES)))


def test_unknown_executor_and_negative_workers_are_refused():
    with pytest.raises(ConfigError, match="--executor"):
        map_tasks(abs, [1], "threads")
    with pytest.raises(ConfigError, match="--workers"):
        map_tasks(abs, [1, 2], "local", -1)


def test_ray_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)   # import ray -> ImportError
    with pytest.raises(ConfigError, match="pip install ray"):
        map_tasks(abs, [1, 2], "ray")


def test_ray_runs_the_tasks_on_a_local_cluster():
    ray = pytest.importorskip("ray")
    seen = []
    try:   # a function Ray workers import from the installed package
        assert map_tasks(dtype_bytes, DTYPES, "ray", None, seen.append) == BYTES
        assert sorted(seen) == list(range(6)) and ray.is_initialized()
    finally:
        ray.shutdown()


# -- affinity: tasks of one key in one process ---------------------------------------------

def pid_after(seconds: float) -> int:
    import os
    import time

    time.sleep(seconds)
    return os.getpid()


def fail_on(x):
    if x == 3:
        raise ConfigError("bad task", field="--x", expected="not 3")
    return x


def exit_on(x):
    import os

    if x == 2:
        os._exit(3)
    return x


class Unpicklable(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


def raise_unpicklable(x):
    raise Unpicklable(x, x)


def test_affinity_keeps_results_in_task_order_and_calls_back_once_per_task():
    seen = []
    out = map_tasks(dtype_bytes, DTYPES, "local", 2, seen.append,
                    affinity=["a", "b", "a", "b", "c", "a"])
    assert out == BYTES and sorted(seen) == list(range(len(DTYPES)))


def test_affinity_runs_each_key_in_one_process_when_the_keys_balance():
    # two keys of equal weight, two processes: each process has one key's tasks and
    # needs 0.9 s for them, so neither runs out of work while the other still has some
    pids = map_tasks(pid_after, [0.3] * 6, "local", 2,
                     affinity=["x", "y", "x", "y", "x", "y"])
    assert len({pids[0], pids[2], pids[4]}) == 1 and len({pids[1], pids[3], pids[5]}) == 1
    assert pids[0] != pids[1]


def test_affinity_split_keeps_keys_whole_heaviest_first():
    from perfcast.core.executor import affinity_split

    queues = affinity_split(["a", "b", "a", "c", "c", "c"], [1, 5, 2, 1, 1, 1], 2)
    # b (5) to process 0; a (3) then c (3) to process 1, whose load stays the smaller;
    # within it the task of weight 2 first, then the others in task order
    assert queues == [[1], [2, 0, 3, 4, 5]]
    assert sorted(i for q in queues for i in q) == list(range(6))


def test_a_process_out_of_work_takes_the_tail_of_the_heaviest_queue():
    from perfcast.core.executor import _take

    order = [0, 1, 2, 3, 4, 5]
    bounds = [0, 1, 1, 3, 3, 6]           # queues [0], [1, 2], [3, 4, 5]
    prefix = [0, 1, 2, 3, 4, 5, 6]        # weight 1 each
    assert _take(0, order, bounds, prefix) == 0           # its own head
    assert _take(0, order, bounds, prefix) == 5           # the tail of the heaviest
    assert bounds == [1, 1, 1, 3, 3, 5]
    assert _take(1, order, bounds, prefix) == 1           # own queues are untouched
    assert [_take(0, order, bounds, prefix) for _ in range(4)] == [4, 2, 3, None]


def test_affinity_raises_a_tasks_error_in_the_caller():
    with pytest.raises(ConfigError, match="--x.*bad task"):
        map_tasks(fail_on, [1, 2, 3, 4], "local", 2, affinity=[1, 2, 1, 2])


def test_affinity_reports_an_exception_that_does_not_pickle_by_its_traceback():
    # both tasks raise; whichever error reaches the caller first is raised
    with pytest.raises(RuntimeError, match=r"Unpicklable: ([12])/\1"):
        map_tasks(raise_unpicklable, [1, 2], "local", 2, affinity=[1, 2])


def test_affinity_reports_a_worker_process_that_dies():
    with pytest.raises(RuntimeError, match="exited with code 3"):
        map_tasks(exit_on, [1, 2, 3, 4], "local", 2, affinity=[1, 2, 1, 2])
