"""Speed paths of `validate silicon` that must not change a row: the row checks' graph
sums memoised by content, and the relaxed cyclic-GC thresholds of a run."""

from __future__ import annotations

import gc

import pytest

from perfcast.hardware import load_system
from perfcast.serving import silicon, silicon_bounds
from perfcast.serving.step_cost import stack_options
from perfcast.workload import Batch, ParallelPlan, TaskKind, load_model_spec
from perfcast.workload.build import build_task_graph

MODEL = load_model_spec("Qwen/Qwen3-8B")
H100, H200 = load_system("h100_sxm"), load_system("h200_sxm")


def _fresh_bytes(plan, batch):
    graph = build_task_graph(MODEL, plan, batch, None)
    return sum(t.work.bytes_total * t.count for t in graph.tasks if t.kind is TaskKind.COMPUTE)


def test_graph_sums_hit_equals_a_fresh_sum_and_the_key_tells_inputs_apart(monkeypatch):
    monkeypatch.setattr(silicon_bounds, "_GRAPH_SUMS", {})
    tp1, tp2 = ParallelPlan(tp=1), ParallelPlan(tp=2)
    a = silicon_bounds._graph_sum("bytes", MODEL, tp1, Batch.decode(8, 1024), None, H100)
    assert a == _fresh_bytes(tp1, Batch.decode(8, 1024))
    assert silicon_bounds._graph_sum("bytes", MODEL, tp1, Batch.decode(8, 1024), None, H100) == a
    # another batch, context, plan or phase is another graph
    assert silicon_bounds._graph_sum("bytes", MODEL, tp1, Batch.decode(9, 1024), None, H100) \
        == _fresh_bytes(tp1, Batch.decode(9, 1024)) != a
    assert silicon_bounds._graph_sum("bytes", MODEL, tp1, Batch.decode(8, 2048), None, H100) \
        == _fresh_bytes(tp1, Batch.decode(8, 2048)) != a
    assert silicon_bounds._graph_sum("bytes", MODEL, tp2, Batch.decode(8, 1024), None, H100) \
        == _fresh_bytes(tp2, Batch.decode(8, 1024)) != a
    assert silicon_bounds._graph_sum("bytes", MODEL, tp1, Batch.prefill(8, 1, 1024), None, H100) \
        == _fresh_bytes(tp1, Batch.prefill(8, 1, 1024))
    # the peak-rate sum is kept per system (its digest is in the key) and apart from
    # the byte sums
    p1 = silicon_bounds._graph_sum("peak_s", MODEL, tp1, Batch.prefill(1, 4096), None, H100)
    p2 = silicon_bounds._graph_sum("peak_s", MODEL, tp1, Batch.prefill(1, 4096), None, H200)
    keys = {k[0] for k in silicon_bounds._GRAPH_SUMS}
    assert keys == {"bytes", "peak_s"} and p1 > 0 and p2 > 0
    assert len({k for k in silicon_bounds._GRAPH_SUMS if k[0] == "peak_s"}) == 2
    # another operator stack is another graph (key by the stack's name, as built_halves)
    from perfcast.workload.stacks import resolve_stack

    tc = resolve_stack("tensorcast", "")
    b = silicon_bounds._graph_sum("bytes", MODEL, tp1, Batch.decode(8, 1024), None, H100, tc)
    graph = build_task_graph(MODEL, tp1, Batch.decode(8, 1024), None,
                             **stack_options(tc))
    assert b == sum(t.work.bytes_total * t.count for t in graph.tasks
                    if t.kind is TaskKind.COMPUTE)
    assert any(k[-1] == tc.name for k in silicon_bounds._GRAPH_SUMS)


def test_graph_sums_are_bounded(monkeypatch):
    monkeypatch.setattr(silicon_bounds, "_GRAPH_SUMS", {})
    monkeypatch.setattr(silicon_bounds, "GRAPH_SUMS_MAX", 3)
    for n in range(1, 8):
        silicon_bounds._graph_sum("bytes", MODEL, ParallelPlan(), Batch.decode(n, 64), None, H100)
        assert len(silicon_bounds._GRAPH_SUMS) <= 3


def test_long_run_gc_restores_the_thresholds_also_on_error():
    before = gc.get_threshold()
    with silicon.long_run_gc():
        assert gc.get_threshold() == silicon.LONG_RUN_GC_THRESHOLDS
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), silicon.long_run_gc((5000, 7, 3)):
        assert gc.get_threshold() == (5000, 7, 3)
        raise RuntimeError("boom")
    assert gc.get_threshold() == before


@pytest.mark.parametrize("kw", [dict(concurrency=8, isl=512, osl=64),
                                dict(mode="disagg", concurrency=4, isl=256, osl=32,
                                     decode_pool=None)])
def test_a_run_without_itl_statistics_gives_every_other_metric_unchanged(kw):
    from perfcast.serving.deploy import Pool, ServeConfig, run_serving

    if kw.get("mode") == "disagg":
        kw = {**kw, "decode_pool": Pool(ParallelPlan())}
    cfg = ServeConfig(model=MODEL, **kw)
    full = run_serving(cfg).metrics.to_json()
    lean = run_serving(cfg, itl_summary=False).metrics.to_json()
    assert full["itl_ms"]["mean"] > 0 and lean["itl_ms"] == {}
    full.pop("itl_ms"), lean.pop("itl_ms")
    assert lean == full
