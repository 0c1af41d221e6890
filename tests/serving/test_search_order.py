"""`search` runs the layouts with the most engines first (serving.search.run_tasks);
the candidates still come back in the layouts' order."""

from __future__ import annotations

from perfcast.serving.search import (SearchSpace, _engines, candidate_json, evaluate_layout,
                                     layouts, run_tasks)


def test_search_returns_layouts_in_order_whatever_order_they_run_in():
    """run_tasks starts the layouts with the most engines first; the candidates come
    back in the layouts' order, equal to evaluating each layout in turn."""
    space = SearchSpace(model="Qwen/Qwen3-0.6B", gpus=4, isl=128, osl=16,
                        concurrencies=(2, 6), tp_sizes=(1, 2), prompts_per_concurrency=2)
    todo = layouts(space)
    assert len({(lay.workers, lay.decode_workers) for lay in todo}) > 1
    got = [candidate_json(c) for c in run_tasks(space, todo, "inline", None)]
    expected = [candidate_json(c) for lay in todo for c in evaluate_layout(space, lay)]
    assert got == expected


def test_layouts_with_more_engines_sort_first():
    space = SearchSpace(model="Qwen/Qwen3-0.6B", gpus=4, tp_sizes=(1, 2, 4))
    todo = layouts(space)
    agg4 = next(lay for lay in todo if lay.mode == "agg" and lay.workers == 4)
    agg1 = next(lay for lay in todo if lay.mode == "agg" and lay.workers == 1)
    disagg13 = next(lay for lay in todo if lay.mode == "disagg" and lay.decode_workers == 3)
    assert _engines(agg4) > _engines(disagg13) > _engines(agg1)

