"""Caches of the serving speed paths (docs/notes/serving-speed.md): each returns what a
fresh computation returns, bit for bit, misses when its content key changes, and is
bounded."""

from __future__ import annotations

from dataclasses import replace

import perfcast.serving.step_cost as step_cost
from perfcast.evidence.contracts import CostQueryContext
from perfcast.evidence.factory import build_resolver
from perfcast.hardware import load_system
from perfcast.serving.backends import CudaGraphConfig, load_backend
from perfcast.serving.deploy import StepModelCache
from perfcast.serving.step_cost import StepCostModel, StepShape, built_halves
from perfcast.workload import Batch, ParallelPlan, load_model_spec
from perfcast.workload.build import build_task_graph
from perfcast.workload.quant import precision_for_model

SYSTEM = load_system("h100_sxm")
MODEL = load_model_spec("Qwen/Qwen3-8B")

SHAPES = [StepShape(1, 700.0), StepShape(37, 1234.5), StepShape(0, 0.0, ((512, 0),)),
          StepShape(12, 3000.25, ((300, 1024), (97, 0))), StepShape(64, 17.0, ((1, 5),))]


def fresh(plan=ParallelPlan(tp=2), **kw) -> StepCostModel:
    return StepCostModel(MODEL, plan, SYSTEM, build_resolver(SYSTEM, launch_in_kernel_times=False),
                         **kw)


def steps(m: StepCostModel) -> list:
    return [m.step_s(s) for s in SHAPES] + [m.decode_run_s(r, c, k).tolist()
                                           for r, c, k in ((8, 100.5, 40), (3, 5000.0, 3))]


def test_built_graph_cache_hit_equals_a_fresh_build_and_a_changed_input_misses():
    step_cost._BUILT.clear()
    plan = ParallelPlan(tp=2)
    batch = Batch.decode(24, 900)
    segments = ((24, 1, 900),)
    (free, ctx), memory = built_halves(MODEL, plan, None, batch, segments)
    graph = build_task_graph(MODEL, plan, batch, None)
    assert ctx == [t for t in graph.tasks if "kv_len" in t.work.axes] and ctx
    assert free == [t for t in graph.tasks if "kv_len" not in t.work.axes] and free
    assert memory == graph.memory
    assert built_halves(MODEL, plan, None, batch, segments)[0][1] is ctx   # a hit
    fp8 = precision_for_model(MODEL, linear_action="FP8")
    for other in [(MODEL, ParallelPlan(tp=4), None, batch, segments),
                  (MODEL, plan, fp8, batch, segments),
                  (MODEL, plan, None, Batch.decode(24, 901), ((24, 1, 901),)),
                  (load_model_spec("Qwen/Qwen3-32B"), plan, None, batch, segments)]:
        (_, ctx2), _ = built_halves(*other)
        assert ctx2 is not ctx
        model, plan2, precision, batch2, _ = other
        assert ctx2 == [t for t in build_task_graph(model, plan2, batch2, precision).tasks
                        if "kv_len" in t.work.axes]
    assert len(step_cost._BUILT) == 5


def test_built_graph_cache_is_bounded(monkeypatch):
    step_cost._BUILT.clear()
    monkeypatch.setattr(step_cost, "BUILT_GRAPHS_MAX", 3)
    plan = ParallelPlan(tp=1)
    for n in range(1, 7):
        built_halves(MODEL, plan, None, Batch.decode(n, 64), ((n, 1, 64),))
    assert len(step_cost._BUILT) == 3
    assert [k[-1] for k in step_cost._BUILT] == [((n, 1, 64),) for n in (4, 5, 6)]


def test_step_models_sharing_terms_equal_fresh_ones():
    """StepModelCache hands models that differ only in CUDA-graph settings one terms
    cache (and one graph cache); every step costs what an unshared model costs."""
    backend = load_backend("vllm", system=SYSTEM, tp=2)
    cache = StepModelCache()
    plan = ParallelPlan(tp=2)
    sizes = [CudaGraphConfig(max_batch=0), CudaGraphConfig(max_batch=16),
             backend.cuda_graph]
    models = []
    for cg in sizes:
        b = replace(backend, cuda_graph=cg)
        m = cache.get(MODEL, plan, SYSTEM, b, None, (), CostQueryContext(), True)
        models.append((m, steps(m)))
        assert steps(fresh(plan, overheads=b.overheads, cuda_graph=cg)) == models[-1][1]
    assert models[0][0] is not models[1][0] and models[0][0]._terms is models[1][0]._terms
    exact = cache.get(MODEL, plan, SYSTEM, backend, None, (), CostQueryContext(), False)
    assert exact._terms is not models[0][0]._terms   # interpolate is part of the key
    assert steps(exact) == steps(fresh(plan, overheads=backend.overheads,
                                       cuda_graph=backend.cuda_graph, interpolate=False))


def test_memoised_terms_and_node_arrays_equal_a_fresh_model():
    """Asked twice (memo hits: interpolated prefill terms, decode-run node arrays) or in
    another order, a model answers what a fresh one answers."""
    a = fresh()
    first = steps(a)
    assert steps(a) == first
    b = fresh()
    assert list(reversed(steps_reversed(b))) == first
    assert a._run_nodes and len(a._run_nodes) <= step_cost.RUN_NODES_MAX


def steps_reversed(m: StepCostModel) -> list:
    runs = [m.decode_run_s(r, c, k).tolist() for r, c, k in ((3, 5000.0, 3), (8, 100.5, 40))]
    return runs + [m.step_s(s) for s in reversed(SHAPES)]


def test_node_arrays_are_bounded(monkeypatch):
    monkeypatch.setattr(step_cost, "RUN_NODES_MAX", 2)
    m = fresh()
    expected = fresh()
    for r in (1, 2, 3, 4):
        assert m.decode_run_s(r, 50.0, 30).tolist() == expected.decode_run_s(r, 50.0, 30).tolist()
        assert len(m._run_nodes) <= 2


def test_a_graph_kept_for_its_context_half_is_built_again_when_its_free_half_is_asked():
    step_cost._BUILT.clear()
    plan = ParallelPlan(tp=2)
    batch, segments = Batch.decode(24, 900), ((24, 1, 900),)
    graph = build_task_graph(MODEL, plan, batch, None)
    (free, ctx), memory = built_halves(MODEL, plan, None, batch, segments, keep_free=False)
    assert free is None and memory == graph.memory
    assert ctx == [t for t in graph.tasks if "kv_len" in t.work.axes] and ctx
    assert built_halves(MODEL, plan, None, batch, segments, keep_free=False)[0][1] is ctx
    (free, ctx2), _ = built_halves(MODEL, plan, None, batch, segments)
    assert free == [t for t in graph.tasks if "kv_len" not in t.work.axes] and free
    assert ctx2 == ctx
    assert built_halves(MODEL, plan, None, batch, segments, keep_free=False)[0][0] is free
    assert len(step_cost._BUILT) == 1


def test_step_terms_are_those_of_whole_graphs_kept(monkeypatch):
    """Step models whose context builds keep only their context half give the terms of
    one that keeps every graph whole."""
    original = step_cost.built_halves
    step_cost._BUILT.clear()
    lean = steps(fresh())
    assert any(free is None for (free, _), _ in step_cost._BUILT.values())
    step_cost._BUILT.clear()
    monkeypatch.setattr(step_cost, "built_halves",
                        lambda *a, keep_free=True, **kw: original(*a, keep_free=True, **kw))
    assert steps(fresh()) == lean
    assert all(free is not None for (free, _), _ in step_cost._BUILT.values())
