"""`perfcast search --pp-sizes`: pipeline-parallel layouts are searched and simulated as
`serve --pp-size` pipelines them."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.serving.deploy import Pool, ServeConfig, run_serving
from perfcast.serving.search import SearchSpace, layouts, search
from perfcast.workload import ParallelPlan

SPACE = SearchSpace(model="Qwen/Qwen3-0.6B", gpus=2, isl=256, osl=32, concurrencies=(8,),
                    tp_sizes=(1,), pp_sizes=(1, 2), modes=("agg",), prompts_per_concurrency=3)


def test_pp_sizes_add_pipeline_layouts_that_fill_the_budget():
    assert {lay.label(): lay.gpus for lay in layouts(SPACE)} == {"agg 2xtp1": 2,
                                                                  "agg 1xtp1pp2": 2}


def test_a_pipeline_layout_reports_the_serve_pipeline_metrics():
    cands = {c.layout: c for c in search(SPACE, executor="inline")}
    assert not any(c.error for c in cands.values())
    pp2, pp1 = cands["agg 1xtp1pp2"], cands["agg 2xtp1"]
    assert pp2.metrics["tpot_ms"]["mean"] != pp1.metrics["tpot_ms"]["mean"]
    # the same deployment through serve's path (PP virtual engines of one replica)
    ref = run_serving(ServeConfig(model="Qwen/Qwen3-0.6B", isl=256, osl=32, range_ratio=0.8,
                                  concurrency=8, num_requests=24,
                                  pool=Pool(ParallelPlan(pp=2), 1)))
    assert len(ref.engines) == 2
    assert pp2.metrics == ref.metrics.to_json()

def test_cli_takes_pp_sizes_and_echoes_them():
    res = CliRunner().invoke(app, ["search", "Qwen/Qwen3-0.6B", "--gpus", "2", "--isl", "256",
                                   "--osl", "32", "--concurrency", "8", "--tp-sizes", "1",
                                   "--pp-sizes", "1,2", "--modes", "agg", "--format", "json",
                                   "--executor", "inline", "--calibration", "none"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["inputs"]["pp_sizes"] == [1, 2]
    assert {row["layout"] for row in doc["configurations"]} == {"agg 2xtp1", "agg 1xtp1pp2"}


def test_speculative_and_prefix_cache_reach_every_candidate_as_in_serve():
    from perfcast.serving.speculative import SpeculativeConfig

    spec = SpeculativeConfig("ngram", 2, (1.5,))
    space = SearchSpace(**{**SPACE.__dict__, "pp_sizes": (1,), "speculative": spec,
                           "prefix_cache_hit_rate": 0.5})
    (cand,) = search(space, executor="inline")
    ref = run_serving(ServeConfig(model="Qwen/Qwen3-0.6B", isl=256, osl=32, range_ratio=0.8,
                                  concurrency=8, num_requests=24, speculative=spec,
                                  prefix_cache_hit_rate=0.5, pool=Pool(ParallelPlan(), 2)))
    assert cand.metrics == ref.metrics.to_json()
    assert cand.metrics["prefix_cache_hit_rate"] > 0.4
    plain = search(SearchSpace(**{**SPACE.__dict__, "pp_sizes": (1,)}), executor="inline")[0]
    assert cand.metrics["tpot_ms"]["mean"] < plain.metrics["tpot_ms"]["mean"]


def test_cli_search_speculative_flags_are_checked_and_echoed():
    base = ["search", "Qwen/Qwen3-0.6B", "--gpus", "2", "--isl", "256", "--osl", "32",
            "--concurrency", "8", "--tp-sizes", "1", "--modes", "agg", "--format", "json",
            "--executor", "inline", "--calibration", "none"]
    res = CliRunner().invoke(app, [*base, "--speculative", "ngram", "--num-speculative-tokens",
                                   "2", "--acceptance", "1.5", "--prefix-cache-hit-rate", "0.5"])
    assert res.exit_code == 0, res.output
    inputs = json.loads(res.stdout)["inputs"]
    assert inputs["speculative"]["tokens_per_step"] == 2.5
    assert inputs["prefix_cache_hit_rate"] == 0.5
    bad = CliRunner().invoke(app, [*base, "--acceptance", "1.5"])
    assert bad.exit_code == 2 and "--speculative" in bad.output
    bad = CliRunner().invoke(app, [*base, "--prefix-cache-hit-rate", "1.5"])
    assert bad.exit_code == 2 and "--prefix-cache-hit-rate" in bad.output
