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


