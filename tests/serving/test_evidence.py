"""Measured evidence in serving runs: nearest collected version, kernel implementation
in the query context, measured kernels ahead of the roofline."""

from __future__ import annotations

from pathlib import Path

from perfcast.evidence.queries import query_for_task
from perfcast.hardware import load_system
from perfcast.serving.deploy import Pool, ServeConfig, run_serving
from perfcast.evidence.deployment import collected_versions
from perfcast.serving.evidence import evidence_loader
from perfcast.evidence.factory import build_resolver
from perfcast.workload import Batch, ParallelPlan, load_model_spec
from perfcast.workload.build import build_task_graph

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator"


def test_versions_with_gemm_tables_and_nearest_choice():
    assert collected_versions(ROOT, "h100_sxm", "vllm") == ["0.19.0", "0.22.0", "0.24.0"]
    ev = evidence_loader(ROOT)("h100_sxm", "vllm", "0.20.1")
    assert ev.version == "0.19.0" and "0.19.0" in ev.note
    assert ev.context.runtime == "vllm" and ev.context.runtime_revision == "0.19.0"
    assert ev.context.implementation_for("gemm")  # the tables' kernel source
    assert evidence_loader(ROOT)("h100_sxm", "sglang", "0.5.9").providers == ()


def test_measured_kernels_answer_before_the_roofline():
    ev = evidence_loader(ROOT)("h100_sxm", "vllm", "0.19.0")
    system = load_system("h100_sxm")
    resolver = build_resolver(system, ev.providers, launch_in_kernel_times=False)
    graph = build_task_graph(load_model_spec("meta-llama/Llama-3.1-8B"), ParallelPlan(),
                             Batch.decode(8, 1000))
    providers = {t.group: resolver.resolve(query_for_task(t, system.name, ev.context))
                 .estimate.provider for t in graph.tasks}
    assert providers["attn.o_proj"] in ("database", "interpolation")   # m=8, n=k=4096
    assert providers["attn.core"] in ("database", "interpolation")     # 32/8 heads, d=128
    assert providers["mlp.down_proj"] == "roofline"                    # k=14336 not measured


def test_serving_run_with_evidence_differs_from_analytic():
    cfg = ServeConfig(model="meta-llama/Llama-3.1-8B", backend="vllm", pool=Pool(ParallelPlan()),
                      isl=512, osl=32, concurrency=4, num_requests=8)
    ev = evidence_loader(ROOT)("h100_sxm", "vllm", "0.19.0")
    measured = run_serving(cfg, evidence=ev.providers, evidence_context=ev.context).metrics
    analytic = run_serving(cfg).metrics
    assert measured.completed_requests == analytic.completed_requests == 8
    assert measured.tpot_ms["mean"] != analytic.tpot_ms["mean"]


def test_vllm_all_reduce_uses_the_runtime_custom_kernel_table():
    """vLLM's all-reduce table holds a CUDA-graph and an eager kernel, each with its own
    `backend` value; the query states the value of the kernel the runtime runs, so the
    custom all-reduce answers instead of the NCCL library table."""
    ev = evidence_loader(ROOT)("h100_sxm", "vllm", "0.19.0")
    assert ev.context.operation_dimensions["all_reduce"]["backend"] == "vllm_graph"
    system = load_system("h100_sxm")
    resolver = build_resolver(system, ev.providers, launch_in_kernel_times=False)
    graph = build_task_graph(load_model_spec("meta-llama/Llama-3.1-8B"), ParallelPlan(tp=2),
                             Batch.decode(8, 1000))
    reduce = next(t for t in graph.tasks if t.operation == "all_reduce")
    est = resolver.resolve(query_for_task(reduce, system.name, ev.context)).estimate
    assert est.validity["implementation"] == "vLLM_custom_graph"
    assert est.source_revision == "comm/vllm/0.19.0"
