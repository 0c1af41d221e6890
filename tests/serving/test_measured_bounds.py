"""Fixed cost per call of measured GEMM tables, the harness facts that say which part of
it a deployment does not run, the memory-bandwidth floor of measured answers, and the
memory-bound screen of measured silicon rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from perfcast.evidence.contracts import (CostEstimate, CostQuery, CostSubject, EstimateMethod,
                                         MatchKind)
from perfcast.evidence.measured_view import MeasuredView, gemm_fixed_costs
from perfcast.serving.evidence import harness_gemm_excess
from perfcast.serving.silicon import ModelResolver, below_memory_bound, load_rules, row_config
from perfcast.workload.tensors import TensorSpec


def _gemm_table(fixed: dict[str, float], bw: float) -> pa.Table:
    """Rows whose latency is exactly fixed[dtype] + weight bytes / bw."""
    width = {"bf16": 2, "fp8": 1, "fp8_block": 1}
    rows = {"operation": [], "dtype": [], "sel.int.m": [], "sel.int.n": [], "sel.int.k": [],
            "latency_s": []}
    for dtype, a in fixed.items():
        for m in (1, 4, 8, 16, 64):
            for n in (4096, 8192, 16384, 28672):
                for k in (4096, 8192):
                    rows["operation"].append("gemm")
                    rows["dtype"].append(dtype)
                    rows["sel.int.m"].append(m)
                    rows["sel.int.n"].append(n)
                    rows["sel.int.k"].append(k)
                    # m = 64 rows are off the fit (m <= 16): give them a different intercept
                    extra = 50e-6 if m == 64 else 0.0
                    rows["latency_s"].append(a + extra + n * k * width[dtype] / bw)
    rows["operation"].append("attention")
    rows["dtype"].append("bf16")
    for key in ("sel.int.m", "sel.int.n", "sel.int.k"):
        rows[key].append(None)
    rows["latency_s"].append(1.0)
    return pa.table(rows)


def test_fixed_cost_is_the_intercept_of_the_small_m_rows():
    fixed = gemm_fixed_costs(_gemm_table({"bf16": 4e-6, "fp8": 15e-6, "fp8_block": 30e-6},
                                         2.8e12))
    assert fixed == pytest.approx({"bf16": 4e-6, "fp8": 15e-6, "fp8_block": 30e-6}, abs=1e-9)


def test_harness_facts_name_the_excess_a_deployment_does_not_run():
    fixed = {"bf16": 4e-6, "fp8": 16e-6, "fp8_block": 30e-6}
    trt = harness_gemm_excess("trtllm", fixed)
    assert set(trt) == {"fp8"}      # dynamic scaling: one of two extra kernels
    assert trt["fp8"][0] == pytest.approx(6e-6) and "input_scale" in trt["fp8"][1]
    vllm = harness_gemm_excess("vllm", fixed)
    assert set(vllm) == {"fp8_block"}   # eager timing vs the graph-timed per-tensor path
    assert vllm["fp8_block"][0] == pytest.approx(14e-6)
    assert harness_gemm_excess("sglang", fixed) == {}
    assert harness_gemm_excess("vllm", {"bf16": 4e-6, "fp8": 9e-6, "fp8_block": 8e-6}) == {}


class _Fixed:
    name, revision = "table", "r1"

    def __init__(self, latency: float) -> None:
        self.latency = latency

    def supports(self, query):
        return True

    def estimate(self, query):
        return CostEstimate(latency_s=self.latency, method=EstimateMethod.MEASURED,
                            match_kind=MatchKind.EXACT, provider=self.name,
                            provider_revision=self.revision)


def _query(operation: str, weight: str) -> CostQuery:
    return CostQuery(subject=CostSubject.OPERATOR, operation=operation, hardware="h100_sxm",
                     dtype="fp8", inputs=(TensorSpec((8, 4096), "bf16"),
                                          TensorSpec((4096, 4096), weight)))


def test_measured_view_takes_the_excess_off_gemm_answers_only():
    view = MeasuredView(_Fixed(30e-6), {"fp8": (6e-6, "why")})
    est = view.estimate(_query("gemm", "fp8"))
    assert est.latency_s == pytest.approx(24e-6)
    assert est.components["harness_fixed_cost_s"] == pytest.approx(-6e-6)
    assert any("6.0 us" in a and "why" in a for a in est.assumptions)
    # another weight format, or another operation, is untouched
    assert MeasuredView(_Fixed(30e-6), {"fp8": (6e-6, "why")}).estimate(
        _query("gemm", "fp8_block")).latency_s == pytest.approx(30e-6)
    assert view.estimate(_query("moe", "fp8")).latency_s == pytest.approx(30e-6)
    # never more than half of the measured call
    small = MeasuredView(_Fixed(8e-6), {"fp8": (6e-6, "why")}).estimate(_query("gemm", "fp8"))
    assert small.latency_s == pytest.approx(4e-6)


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
    assert below_memory_bound(cfg, 200.0, 40.0) is None


def test_validate_rows_reports_the_contradiction_instead_of_a_prediction():
    from perfcast.serving.silicon import validate_rows
    (res,) = validate_rows([_row("200", "5")])
    assert not res.predicted and "contradicts" in res.reason
