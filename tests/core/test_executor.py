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
