"""`perfcast search`: layouts fill the budget, SLOs filter, the frontier is non-dominated."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.serving.search import SearchSpace, layouts, search, top

SPACE = SearchSpace(model="Qwen/Qwen3-0.6B", gpus=2, isl=256, osl=32, concurrencies=(2, 16),
                    tp_sizes=(1, 2), prompts_per_concurrency=3)


def test_layouts_use_the_whole_budget():
    labels = {lay.label(): lay.gpus for lay in layouts(SPACE)}
    assert labels == {"agg 2xtp1": 2, "agg 1xtp2": 2, "disagg P 1xtp1 + D 1xtp1": 2}


def test_frontier_is_non_dominated_and_slo_filters():
    cands = search(SPACE, executor="inline")
    assert len(cands) == 6 and not any(c.error for c in cands)
    front = [c for c in cands if c.pareto]
    assert front
    for f in front:
        for o in cands:
            assert not (o.metrics["tokens_per_s_per_gpu"] > f.metrics["tokens_per_s_per_gpu"]
                        and o.metrics["tokens_per_s_per_user"] > f.metrics["tokens_per_s_per_user"])
    tight = min(c.metrics["tpot_ms"]["mean"] for c in cands) * 1.0001
    strict = search(SearchSpace(**{**SPACE.__dict__, "max_tpot_ms": tight}), executor="inline")
    assert sum(c.meets_slo for c in strict) == 1
    assert top(strict, 5)[0].meets_slo


def test_local_processes_agree_with_inline():
    space = SearchSpace(**{**SPACE.__dict__, "modes": ("agg",)})
    a = {(c.layout, c.concurrency): c.metrics["tpot_ms"]["mean"] for c in search(space, executor="inline")}
    b = {(c.layout, c.concurrency): c.metrics["tpot_ms"]["mean"]
         for c in search(space, executor="local", workers=2)}
    assert a == b


def test_ray_executor_when_installed():
    pytest.importorskip("ray")
    space = SearchSpace(**{**SPACE.__dict__, "modes": ("agg",), "concurrencies": (2,)})
    assert all(not c.error for c in search(space, executor="ray"))


def test_cli_json_and_html_plot(tmp_path):
    plot = tmp_path / "front.html"
    res = CliRunner().invoke(app, ["search", "Qwen/Qwen3-0.6B", "--gpus", "2", "--isl", "256",
                                   "--osl", "32", "--concurrency", "2,16", "--tp-sizes", "1,2",
                                   "--executor", "inline", "--format", "json", "--plot", str(plot)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["evaluated"] == 6 and out["pareto"]
    assert "<svg" in plot.read_text()
