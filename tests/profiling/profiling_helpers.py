"""Shared helpers of the profiling tests."""
from pathlib import Path

from perfcast.core.frozen import FrozenDict
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.hardware import load_system
from perfcast.workload import ParallelPlan
from perfcast.workload.tensors import TensorSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "msmodeling"
DB = FIXTURES / "a3_qwen3_8b"
FIA_DB = FIXTURES / "fia_fixture"
REAL_MAPPING = FIXTURES / "op_mapping.vllm0.18.0_torch2.9.0_cann8.5.yaml"  # verbatim copy


def op(operator, inputs=(), outputs=(), **dims):
    def spec(x):
        if isinstance(x, TensorSpec):
            return x
        shape, dtype, *fmt = x
        return TensorSpec(tuple(shape), dtype, *fmt)
    return OpInvokeInfo(operator, tuple(spec(i) for i in inputs),
                        tuple(spec(o) for o in outputs), FrozenDict(dims))




def v3_decode_step(system, database):
    """DeepSeek-V3 TP8 decode, 4 requests over 2,048 tokens, TensorCast's MLA calls,
    costed by the profiling model on `database` (analytic fallback)."""
    from perfcast.evidence.factory import analytic_providers, build_resolver
    from perfcast.evidence.profiling.empirical import EmpiricalPerformanceModel
    from perfcast.evidence.resolver import CostResolver
    from perfcast.plan.step import EstimateRequest, estimate_step
    from perfcast.workload import Batch

    plan = ParallelPlan(tp=8)
    pm = EmpiricalPerformanceModel(system, ProfilingDataSource(database, system, plan),
                                   fallback_model=build_resolver(system))
    request = EstimateRequest(model="deepseek-ai/DeepSeek-V3", device=system, plan=plan,
                              batch=Batch.decode(4, 2048), mla_call="tensorcast")
    return estimate_step(request, CostResolver([pm, *analytic_providers(system)]))


def measured_per_layer(step, operator, durations, latency_s, layers=61):
    """Assert every call of `operator` is a full MEASURED profiling hit with these
    sub-kernel durations and latency; return their estimates."""
    import json

    import pytest

    calls = [ct for ct in step.costed.tasks if ct.task.operator == operator]
    assert sum(ct.task.count for ct in calls) == layers
    out = []
    for ct in calls:
        est = ct.resolution.estimate
        assert est.provider == "profiling" and est.statistics["source"] == "MEASURED"
        assert json.loads(est.statistics["sub_kernel_durations"]) == durations
        assert est.latency_s == pytest.approx(latency_s)
        out.append(est)
    return out
