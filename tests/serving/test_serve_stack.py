"""`serve/search/validate silicon --stack`: every graph the serving path builds (steps,
the memory probe, MTP and EAGLE drafts, pipeline stages, disaggregated pools, the
silicon rows' bound checks) is built under the one stack `--stack` resolves to."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app
from perfcast.cli.serve import ServeArgs, run_serve
from perfcast.serving import silicon, silicon_bounds, speculative, step_cost
from perfcast.workload import build as workload_build
from perfcast.workload import graph as workload_graph

ASCEND = "atlas_800_a2_376t_64g"


@pytest.fixture
def stacks_built(monkeypatch):
    """The stack name of every graph (and EAGLE GEMM builder) the serving modules build."""
    seen: list[str] = []
    real_build = workload_build.build_task_graph

    def build(*args, **kw):
        graph = real_build(*args, **kw)
        seen.append(graph.conventions["stack"])
        return graph

    real_builder = workload_graph.GraphBuilder

    class Builder(real_builder):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            seen.append(self.stack.name)

    for module in (step_cost, speculative, silicon_bounds):
        monkeypatch.setattr(module, "build_task_graph", build)
    monkeypatch.setattr(speculative, "GraphBuilder", Builder)
    step_cost._BUILT.clear()   # graphs built by earlier tests are not built again
    yield seen
    step_cost._BUILT.clear()


def small_deepseek(tmp_path) -> str:
    """DeepSeek-V3's config with three layers (one dense, two MoE): MLA, MoE and an MTP
    module at a size one 64 GB NPU holds."""
    from perfcast.workload import load_model_spec

    raw = dict(load_model_spec("deepseek-ai/DeepSeek-V3").raw)
    raw.update(num_hidden_layers=3, first_k_dense_replace=1)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw, default=dict), encoding="utf-8")
    return str(path)


SHORT = dict(isl=128, osl=4, concurrency=2, num_requests=2, calibration="none")


@pytest.mark.parametrize("stack, want", [("auto", "tensorcast"), ("default", "default")])
@pytest.mark.parametrize("case", ["mtp", "eagle", "pp2", "disagg"])
def test_every_serving_graph_on_ascend_is_built_under_the_stack(tmp_path, stacks_built,
                                                                stack, want, case):
    if case == "mtp":
        args = dict(model=small_deepseek(tmp_path), speculative="mtp",
                    num_speculative_tokens=1, acceptance="0.7")
    elif case == "eagle":
        args = dict(model="Qwen/Qwen3-8B", speculative="eagle3", num_speculative_tokens=2,
                    acceptance="0.8,0.5")
    elif case == "pp2":
        args = dict(model="Qwen/Qwen3-8B", pp_size=2)
    else:
        args = dict(model="Qwen/Qwen3-8B", mode="disagg", tp_size=1, decode_tp_size=2)
    metrics, _ = run_serve(ServeArgs(device=ASCEND, stack=stack, **SHORT, **args))
    assert metrics["inputs"]["stack"]["requested"] == stack
    assert metrics["inputs"]["stack"]["resolved"] == want
    assert stacks_built and set(stacks_built) == {want}


def test_an_unknown_stack_is_refused_before_any_simulation():
    from perfcast.core.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown stack 'tensorkast'"):
        run_serve(ServeArgs(model="Qwen/Qwen3-0.6B", stack="tensorkast", **SHORT))
    with pytest.raises(ConfigError, match="unknown stack"):
        silicon.validate_rows([], stack="tensorkast")


def test_search_threads_the_stack_to_every_layout(monkeypatch):
    from perfcast.cli.search import SearchArgs, run_search
    from perfcast.serving import search as serving_search

    asked = []
    real = serving_search.run_serving

    def run_serving(cfg, **kw):
        asked.append(cfg.stack)
        return real(cfg, **kw)

    monkeypatch.setattr(serving_search, "run_serving", run_serving)
    doc, cands = run_search(SearchArgs(model="Qwen/Qwen3-0.6B", device=ASCEND, gpus=2,
                                       isl=128, osl=4, concurrency="2", tp_sizes="1,2",
                                       stack="default", executor="inline",
                                       calibration="none"))
    assert cands and set(asked) == {"default"} and len(asked) == len(cands)
    assert doc["inputs"]["stack"] == {"requested": "default", "resolved": "default",
                                      "mla_call": "split"}
    from perfcast.workbench.figures import serve_args_for

    # a clicked point of the workbench's search reruns serve under the search's stack
    assert serve_args_for(doc, doc["configurations"][0])["stack"] == "default"


def test_the_cli_options_exist_and_the_table_names_a_non_default_stack():
    from perfcast.cli.serving_options import StackOption
    from perfcast.workload.stacks import stack_names

    help_text = StackOption.__metadata__[0].help
    assert all(f" {name} " in help_text for name in stack_names())
    runner = CliRunner()
    for command in (["serve"], ["search"], ["validate", "silicon"]):
        r = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
        assert r.exit_code == 0 and "--stack" in r.output, command
    r = runner.invoke(app, ["serve", "Qwen/Qwen3-0.6B", "--device", ASCEND, "--isl", "128",
                            "--osl", "4", "--concurrency", "2", "--num-requests", "2",
                            "--calibration", "none"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "stack      tensorcast (--stack auto), MLA call tensorcast" in r.output
