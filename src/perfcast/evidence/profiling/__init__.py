"""TensorCast-compatible profiling evidence: `op_mapping.yaml` + per-kernel CSVs read
by `ProfilingDataSource`, optionally wrapped by `InterpolatingDataSource`, answered
through the resolver by `EmpiricalPerformanceModel`, summarised by `MetricsCollector`."""

from perfcast.evidence.profiling.data_source import (
    DataSourcePerformanceModel,
    LookupMiss,
    QueryResult,
    QuerySource,
    ShapeMatchInfo,
    SubKernelShapeInfo,
)
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping, OpMapping, load_op_mapping
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource

__all__ = [
    "DataSourcePerformanceModel", "LookupMiss", "OpInvokeInfo", "OpMapping",
    "OperatorMapping", "ProfilingDataSource", "QueryResult", "QuerySource", "ShapeMatchInfo",
    "SubKernelShapeInfo", "load_op_mapping",
]
