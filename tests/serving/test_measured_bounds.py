"""The memory-bandwidth floor of measured answers and the memory-bound screen of
measured silicon rows (per-call harness overheads: tests/serving/test_kernel_evidence.py)."""

from __future__ import annotations

import pytest

from perfcast.evidence.contracts import (CostEstimate, CostQuery, CostSubject, EstimateMethod,
                                         MatchKind)
from perfcast.evidence.measured_view import MeasuredView
from perfcast.serving.silicon import ModelResolver, load_rules, row_config
from perfcast.serving.silicon_bounds import below_memory_bound
from perfcast.workload.tensors import TensorSpec


class _Fixed:
    """Answers every query with `latency` by `method` (a stand-in for a kernel table)."""

    name = "table"

    def __init__(self, latency: float, method=EstimateMethod.MEASURED) -> None:
        self.latency, self.method = latency, method
        self.revision = f"{latency}-{method.value}"   # a table's revision names its content

    def supports(self, query):
        return True

    def estimate(self, query):
        return CostEstimate(latency_s=self.latency, method=self.method,
                            match_kind=MatchKind.EXACT, provider=self.name,
                            provider_revision=self.revision)


def _query(operation: str, weight: str) -> CostQuery:
    return CostQuery(subject=CostSubject.OPERATOR, operation=operation, hardware="h100_sxm",
                     dtype="fp8", inputs=(TensorSpec((8, 4096), "bf16"),
                                          TensorSpec((4096, 4096), weight)))


def _bytes_query(operation: str, nbytes: float) -> CostQuery:
    return CostQuery(subject=CostSubject.OPERATOR, operation=operation, hardware="h100_sxm",
                     dtype="bf16", bytes_read=nbytes, bytes_written=0.0)


def test_measured_answers_faster_than_memory_allows_are_raised_to_the_bound():
    # 671 MB of KV cache (batch 128 x 1281 tokens x 8 KV heads x 128 x 2 x bf16) at
    # 3.35 TB/s take at least 200 us; a 144 us table answer is a cache artifact
    view = MeasuredView(_Fixed(144e-6), peak_memory_bw=3.35e12)
    est = view.estimate(_bytes_query("attention", 671e6))
    assert est.latency_s == pytest.approx(671e6 / 3.35e12)
    assert est.components["below_memory_bound_s"] == pytest.approx(671e6 / 3.35e12 - 144e-6)
    assert any("raised to the bound" in a for a in est.assumptions)
    # an answer above the bound, an operation whose bytes are only expected (moe), and a
    # view without the device bandwidth are untouched
    assert view.estimate(_bytes_query("attention", 100e6)).latency_s == pytest.approx(144e-6)
    assert view.estimate(_bytes_query("moe", 671e6)).latency_s == pytest.approx(144e-6)
    assert MeasuredView(_Fixed(144e-6)).estimate(
        _bytes_query("attention", 671e6)).latency_s == pytest.approx(144e-6)


def _row(ttft: str, tpot: str) -> dict:
    return {"id": "x", "backend": "vllm", "backend_version": "0.18.0",
            "model_path": "Qwen/Qwen3-32B", "system": "h100_sxm", "precision": "bf16",
            "mode": "agg", "isl": "1024", "osl": "1024", "gemm_quant_mode": "",
            "moe_quant_mode": "", "batch_size": "64", "tp_size": "1", "pp_size": "1",
            "attention_dp_size": "1", "moe_tp_size": "1", "moe_ep_size": "1",
            "silicon_data_source": "", "silicon_ttft_ms": ttft, "silicon_tpot_ms": tpot}


def test_rows_faster_than_hbm_allows_are_named():
    rules = load_rules()
    cfg, _ = row_config(_row("200", "5"), ModelResolver(None, rules), rules)
    # Qwen3-32B in bf16 on one H100: 65 GB of weights per decode step, >= 19 ms at
    # 3.35 TB/s, so a 5 ms TPOT with ~64 requests in decode is impossible
    reason = below_memory_bound(cfg, 200.0, 5.0)
    assert reason and "below" in reason and "GB per device" in reason
    assert "routing" not in reason   # a dense model's bytes do not depend on a router
    assert below_memory_bound(cfg, 200.0, 40.0) is None


def test_moe_rows_name_the_routing_their_bound_assumes():
    rules = load_rules()
    row = dict(_row("200", "1"), model_path="Qwen/Qwen3-30B-A3B", tp_size="1")
    cfg, _ = row_config(row, ModelResolver(None, rules), rules)
    # the experts a decode step of ~64 requests reads are those uniform top-8 routing
    # over 128 experts reaches: a 1 ms TPOT is below that bound, which says so
    reason = below_memory_bound(cfg, 200.0, 1.0)
    assert reason and "uniform top-k routing" in reason


def test_validate_rows_reports_the_contradiction_instead_of_a_prediction():
    from perfcast.serving.silicon import validate_rows
    (res,) = validate_rows([_row("200", "5")])
    assert not res.predicted and "contradicts" in res.reason


def test_rows_needing_more_prefill_math_than_the_device_has_are_named():
    from perfcast.serving.silicon_bounds import above_compute_bound
    rules = load_rules()
    row = {**_row("100", "40"), "isl": "8000", "osl": "100", "batch_size": "64"}
    cfg, _ = row_config(row, ModelResolver(None, rules), rules)
    # Qwen3-32B (~32.8e9 params) on one H100: a prompt of >= 0.8 x 8000 tokens needs
    # >= 2 x 32.8e9 x 6400 = 4.2e14 FLOPs, 0.42 s at 989 TFLOP/s. 64 clients with an e2e
    # of 0.1 + 99 x 0.04 = 4.06 s complete 15.8 requests/s: 6.6 s of math per second
    reason = above_compute_bound(cfg, 100.0, 40.0)
    assert reason and "contradicts" in reason and "requests/s" in reason
    # the same clients with an e2e of 0.1 + 99 x 4 = 396 s: 0.16 requests/s, 7% busy
    assert above_compute_bound(cfg, 100.0, 4000.0) is None


def _needed(reason: str) -> float:
    return float(reason.split(" need ")[1].split(" s per second")[0])


def test_rows_needing_more_prefill_time_than_the_measured_kernels_are_named():
    from perfcast.serving.silicon_bounds import above_compute_bound, above_measured_prefill
    from perfcast.serving.step_cost import stack_options
    from perfcast.workload import Batch, TaskKind
    from perfcast.workload.build import build_task_graph
    rules = load_rules()
    row = {**_row("100", "50"), "isl": "1024", "osl": "128"}
    cfg, _ = row_config(row, ModelResolver(None, rules), rules)
    assert cfg.backend.scheduler.token_budget == 8192   # vLLM max-num-batched-tokens
    # 64 clients, e2e 0.1 + 127 x 0.05 = 6.45 s: 9.92 requests/s of >= 819-token prompts,
    # about half a device-second of math per second at peak: the peak bound holds
    assert above_compute_bound(cfg, 100.0, 50.0) is None
    # a table that prices every context-free call of an 8192-token step at 2 ms: the
    # step's ~650 calls x 2 ms, per token, x 819 tokens x 9.92 prompts per second, about
    # 1.3 s per second (attention at peak rate adds a little)
    graph = build_task_graph(cfg.model, cfg.pool.plan, Batch.prefill(1, 8192), cfg.precision,
                             **stack_options(None))
    calls = sum(t.count for t in graph.tasks
                if t.kind is not TaskKind.VIEW and "kv_len" not in t.work.axes)
    floor = calls * 2e-3 * 819 / 8192 * (64 / 6.45)
    reason = above_measured_prefill(cfg, 100.0, 50.0, (_Fixed(2e-3),), None)
    assert reason and "measured kernels" in reason and "contradicts" in reason
    assert floor < _needed(reason) < floor * 1.1
    # the same table at 1 us per call leaves the row standing
    assert above_measured_prefill(cfg, 100.0, 50.0, (_Fixed(1e-6),), None) is None
    # answers that are not measurements (a model's) bound nothing; nor does no evidence
    modelled = _Fixed(2e-3, EstimateMethod.ANALYTICAL)
    assert above_measured_prefill(cfg, 100.0, 50.0, (modelled,), None) is None
    assert above_measured_prefill(cfg, 100.0, 50.0, (), None) is None
    # a longer life per request (TPOT 5 s): 0.1 requests/s, far inside the tables' rate
    assert above_measured_prefill(cfg, 100.0, 5000.0, (_Fixed(2e-3),), None) is None


def test_validate_rows_refuses_a_row_its_own_evidence_contradicts():
    from perfcast.evidence.deployment import DeploymentEvidence
    from perfcast.evidence.contracts import CostQueryContext
    from perfcast.serving.silicon import validate_rows

    def evidence_for(latency):
        return lambda system, backend, version: DeploymentEvidence(
            (_Fixed(latency),), CostQueryContext(runtime=backend), version)

    row = {**_row("100", "50"), "isl": "1024", "osl": "128"}
    (res,) = validate_rows([row], evidence_for=evidence_for(2e-3))
    assert not res.predicted and "measured kernels" in res.reason
    (res,) = validate_rows([row], evidence_for=evidence_for(1e-6))
    assert "measured kernels" not in (res.reason or "")
    # Little's law holds for means: a row read as medians is not screened
    (res,) = validate_rows([row], evidence_for=evidence_for(2e-3), statistic="p50")
    assert "contradicts" not in (res.reason or "")
    (res,) = validate_rows([_row("200", "5")], statistic="p50")
    assert "contradicts" not in (res.reason or "")


def test_a_declared_prefix_cache_lifts_the_measured_prefill_bound():
    from dataclasses import replace

    from perfcast.serving.silicon_bounds import above_measured_prefill
    rules = load_rules()
    cfg, _ = row_config({**_row("100", "50"), "isl": "1024", "osl": "128"},
                        ModelResolver(None, rules), rules)
    assert above_measured_prefill(cfg, 100.0, 50.0, (_Fixed(2e-3),), None)
    cached = replace(cfg, prefix_cache_hit_rate=0.5)
    assert above_measured_prefill(cached, 100.0, 50.0, (_Fixed(2e-3),), None) is None


def test_moe_rows_bound_by_the_larger_of_compute_and_collectives():
    # engines may overlap the expert all-to-all with the other micro-batch's compute
    # (dual / two-batch overlap), so for a routed-expert model the bound is the larger
    # of the two; a dense model's chain of kernels adds them
    from perfcast.serving.silicon_bounds import above_measured_prefill
    from perfcast.serving.step_cost import stack_options
    from perfcast.workload import Batch, TaskKind
    from perfcast.workload.build import build_task_graph
    rules = load_rules()
    row = {**_row("100", "50"), "model_path": "Qwen/Qwen3-30B-A3B", "isl": "1024",
           "osl": "128", "tp_size": "4", "moe_ep_size": "4"}
    cfg, _ = row_config(row, ModelResolver(None, rules), rules)
    graph = build_task_graph(cfg.model, cfg.pool.plan, Batch.prefill(1, 8192), cfg.precision,
                             **stack_options(None))
    free = [t for t in graph.tasks if t.kind is not TaskKind.VIEW and "kv_len" not in t.work.axes]
    comm = sum(t.count for t in free if t.kind is TaskKind.COMMUNICATION)
    compute = sum(t.count for t in free) - comm
    assert comm > 0 and compute > comm
    rate = 64 / (0.1 + 127 * 0.05)
    latency = 2e-3
    reason = above_measured_prefill(cfg, 100.0, 50.0, (_Fixed(latency),), None)
    assert reason
    larger = compute * latency * 819 / 8192 * rate
    assert larger < _needed(reason) < larger * 1.05           # attention at peak adds a little
    assert _needed(reason) < (compute + comm) * latency * 819 / 8192 * rate
