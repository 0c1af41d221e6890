"""One cost path: `estimate --evidence LAYOUT --implementation auto` asks the evidence as
`serve` does, so every task of a step gets the answer `serve`'s step model gets for it.

The evidence is a slice of the public AIConfigurator H100 vLLM 0.24.0 GEMM table
(tests/fixtures/aiconfigurator_fp8_block/make_fixture.py): Qwen3-32B-FP8's block-scaled
FP8 GEMMs at TP 2, and the small-work rows the harness overhead is fitted on."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfcast.cli.estimate import EstimateArgs, run_estimate
from perfcast.cli.serve import ServeArgs, run_serve
from perfcast.evidence.queries import query_for_task
from perfcast.serving import deploy
from perfcast.workload import TaskKind

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator_fp8_block"
MODEL, VERSION = "Qwen/Qwen3-32B-FP8", "0.24.0"


def _serve_step_model(monkeypatch):
    """The step cost model `perfcast serve` builds for the deployment (captured)."""
    built = []
    real = deploy.StepModelCache.get

    def get(self, *args, **kw):
        built.append(real(self, *args, **kw))
        return built[-1]

    monkeypatch.setattr(deploy.StepModelCache, "get", get)
    run_serve(ServeArgs(model=MODEL, backend="vllm", backend_version=VERSION, tp_size=2,
                        isl=256, osl=4, concurrency=2, num_requests=2,
                        evidence_root=str(ROOT)))
    assert len(built) == 1
    return built[0]


@pytest.mark.parametrize("batch", [dict(num_queries=8, query_length=1, context_length=1000,
                                        decode=True),
                                   dict(num_queries=1, query_length=384)])
def test_estimate_auto_equals_serve_task_by_task(monkeypatch, batch):
    step = _serve_step_model(monkeypatch)
    run = run_estimate(EstimateArgs(model=MODEL, tp_size=2, evidence=[str(ROOT / "h100_sxm")],
                                    runtime="vllm", runtime_version=VERSION,
                                    implementation=["auto"], **batch))
    result = run.results["analytic"]
    assert result.request.context == step.context
    measured = cut = 0
    for ct in result.costed.tasks:
        if ct.task.kind is TaskKind.VIEW:
            continue
        mine = ct.resolution.estimate
        theirs = step.resolver.resolve(query_for_task(ct.task, step.system.name,
                                                      step.context)).estimate
        assert (mine.provider, mine.method, mine.raw_record_ids, mine.source_revision) == \
            (theirs.provider, theirs.method, theirs.raw_record_ids, theirs.source_revision), \
            ct.task.lineage
        if mine.provider == "roofline":
            # a stand-alone step prices the device's launch in the kernel; serve's step
            # model adds the backend's launch gap per kernel instead
            assert theirs.components["launch_s"] == 0.0
            assert mine.latency_s == pytest.approx(
                theirs.latency_s + mine.components["launch_s"], rel=1e-12)
        else:
            assert mine.latency_s == theirs.latency_s, ct.task.lineage
            assert dict(mine.components) == dict(theirs.components)
        measured += mine.provider in ("database", "interpolation")
        cut += mine.components.get("harness_fixed_cost_s", 0.0) < 0.0
    assert measured >= 4             # the four linear layers come from the table
    if batch.get("decode"):
        # decode GEMMs run inside the engine's CUDA graphs: the fitted per-call
        # overhead of the collector's timing comes off, in estimate as in serve
        assert cut >= 4


def test_a_saved_database_of_the_same_tables_answers_the_same(tmp_path):
    """Outside an AIConfigurator layout (a saved database), `--implementation auto` takes
    each operation at the nearest collected version and fits the harness overhead on that
    version's GEMM rows: with one collected version, the layout's answers exactly."""
    from perfcast.evidence.store import open_evidence

    saved = tmp_path / "db"
    open_evidence(str(ROOT / "h100_sxm")).save(saved)
    args = dict(model=MODEL, tp_size=2, runtime="vllm", runtime_version=VERSION,
                implementation=["auto"], num_queries=8, query_length=1, context_length=1000,
                decode=True)
    layout = run_estimate(EstimateArgs(evidence=[str(ROOT / "h100_sxm")], **args))
    database = run_estimate(EstimateArgs(evidence=[str(saved)], **args))
    assert "layout" not in database.sources["analytic"]["evidence"][0]
    pairs = zip(layout.results["analytic"].costed.tasks,
                database.results["analytic"].costed.tasks)
    cut = 0
    for a, b in pairs:
        ea, eb = a.resolution.estimate, b.resolution.estimate
        assert (ea.provider, ea.latency_s) == (eb.provider, eb.latency_s), a.task.lineage
        cut += eb.components.get("harness_fixed_cost_s", 0.0) < 0.0
    assert cut >= 4
