"""One cost path: `estimate --evidence LAYOUT --implementation auto` asks the evidence as
`serve` does, so every task of a step gets the answer `serve`'s step model gets for it;
and `serve --stack auto` builds the graph `estimate --stack auto` builds (TensorCast's
calls on an Ascend NPU, with TensorCast's single MLA call), so on every device the two
price the same tasks.

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
from tests.serving.test_serve_stack import small_deepseek

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator_fp8_block"
MODEL, VERSION = "Qwen/Qwen3-32B-FP8", "0.24.0"


def _serve_step_model(monkeypatch, **options):
    """The step cost model `perfcast serve` builds for the deployment (captured), and
    the serve record."""
    built = []
    real = deploy.StepModelCache.get

    def get(self, *args, **kw):
        built.append(real(self, *args, **kw))
        return built[-1]

    monkeypatch.setattr(deploy.StepModelCache, "get", get)
    args = dict(model=MODEL, backend="vllm", backend_version=VERSION, tp_size=2,
                evidence_root=str(ROOT))
    args.update(options)
    metrics, _ = run_serve(ServeArgs(isl=256, osl=4, concurrency=2, num_requests=2, **args))
    assert len(built) == 1
    _serve_step_model.metrics = metrics
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


# -- the operator stack: serve builds the graph estimate builds ------------------------------
ASCEND = "atlas_800_a2_376t_64g"


def _prefill_tasks(step, tokens: int) -> tuple[list, object]:
    """The tasks serve's step model costs for a prefill of one `tokens`-token request
    (its context-free and attention terms, captured as it costs them), and their part."""
    seen: list = []
    real = step._part_of

    def part_of(tasks):
        seen.extend(tasks)
        return real(tasks)

    step._part_of = part_of
    part = step.body_exact(tokens) + step.attn_prefill_exact(tokens, 0)
    assert seen, "the step model had the terms already: pick another token count"
    return [t for t in seen if t.kind is not TaskKind.VIEW], part


@pytest.mark.parametrize("layout", ["dense", "mla"])
def test_ascend_serve_prices_estimates_graph_task_by_task(monkeypatch, tmp_path, layout):
    model, tp = ("Qwen/Qwen3-8B", 2) if layout == "dense" else (small_deepseek(tmp_path), 1)
    step = _serve_step_model(monkeypatch, model=model, device=ASCEND, tp_size=tp,
                             backend_version="", evidence_root=None)
    assert step.stack.name == "tensorcast"
    assert _serve_step_model.metrics["inputs"]["stack"] == {
        "requested": "auto", "resolved": "tensorcast", "mla_call": "tensorcast"}
    tokens = 1000    # not a shape the short serve run costed
    theirs, part = _prefill_tasks(step, tokens)
    run = run_estimate(EstimateArgs(model=model, device=ASCEND, tp_size=tp, num_queries=1,
                                    query_length=tokens))
    result = run.results["analytic"]
    assert result.graph.conventions["stack"] == "tensorcast"
    mine = [ct for ct in result.costed.tasks if ct.task.kind is not TaskKind.VIEW]
    assert sorted(t.lineage for t in theirs) == sorted(ct.task.lineage for ct in mine)
    by_lineage = {t.lineage: t for t in theirs}
    if layout == "mla":   # TensorCast's one MLA call, as estimate's --mla-call auto
        assert any(t.operator.startswith("tensor_cast.multihead_latent") for t in theirs)
    kernel_s = kernels = 0.0
    for ct in mine:
        task = by_lineage[ct.task.lineage]
        assert task == ct.task, ct.task.lineage
        est = ct.resolution.estimate
        answer = step.resolver.resolve(query_for_task(task, step.system.name,
                                                      step.context)).estimate
        assert (est.provider, est.method) == (answer.provider, answer.method), task.lineage
        # a stand-alone step prices the device's launch in the kernel; serve's step model
        # adds the backend's launch gap per kernel instead
        launch = est.components.get("launch_s", 0.0)
        assert answer.components.get("launch_s", 0.0) == 0.0
        assert est.latency_s == pytest.approx(answer.latency_s + launch, rel=1e-12), task.lineage
        if answer.latency_s:
            kernel_s += answer.latency_s * task.count
            kernels += task.count
    assert part.kernel_s == pytest.approx(kernel_s, rel=1e-12)
    assert part.kernels == kernels


def test_ascend_stack_default_is_the_graph_serve_built_before(monkeypatch):
    """`--stack default` on an Ascend NPU: the step model's tasks are those of the
    builder's defaults (what serve built on every device before `--stack`), and its
    numbers differ from `auto`'s (TensorCast's calls)."""
    from perfcast.workload import Batch
    from perfcast.workload.build import build_task_graph

    step = _serve_step_model(monkeypatch, model="Qwen/Qwen3-8B", device=ASCEND,
                             backend_version="", evidence_root=None, stack="default")
    default_doc = _serve_step_model.metrics
    assert default_doc["inputs"]["stack"]["resolved"] == "default"
    theirs, _ = _prefill_tasks(step, 1000)
    built = build_task_graph(step.model, step.plan, Batch.prefill(1, 1000), step.precision)
    assert sorted(theirs, key=lambda t: t.lineage) == sorted(
        (t for t in built.tasks if t.kind is not TaskKind.VIEW), key=lambda t: t.lineage)
    _serve_step_model(monkeypatch, model="Qwen/Qwen3-8B", device=ASCEND,
                      backend_version="", evidence_root=None)
    assert _serve_step_model.metrics["ttft_ms"]["mean"] != default_doc["ttft_ms"]["mean"]


def test_nvidia_auto_is_the_default_stack(monkeypatch):
    """On an NVIDIA GPU `auto` is the default stack with perfcast's split MLA tasks: the
    graphs serve built before `--stack`."""
    step = _serve_step_model(monkeypatch)
    assert step.stack.name == "default"
    assert step.graph_options["mla_call"] == "split"
    assert _serve_step_model.metrics["inputs"]["stack"] == {
        "requested": "auto", "resolved": "default", "mla_call": "split"}
