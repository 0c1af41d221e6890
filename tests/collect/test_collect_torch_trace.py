import gzip
import json

import pytest

from perfcast.collect.parse import parse_profiling
from perfcast.collect.tables import read_table
from perfcast.core.errors import ConfigError


def _op(name, ext, ts, dur, dims, types, strides=None):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"External id": ext, "Input Dims": dims, "Input type": types,
                     "Input Strides": strides or [[] for _ in dims]}}


def _gpu_trace():
    return {"traceEvents": [
        _op("aten::linear", 9, 0, 50, [[8, 64], [128, 64], []], ["c10::BFloat16"] * 2 + [""]),
        _op("aten::mm", 10, 5, 40, [[8, 64], [64, 128], [], []],
            ["c10::BFloat16", "c10::BFloat16", "Scalar", "ScalarList"], [[64, 1], [1, 64], [], []]),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 6, "dur": 3,
         "args": {"correlation": 100, "External id": 10}},
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm_bf16", "ts": 20, "dur": 12.5,
         "args": {"correlation": 100}},
        {"ph": "X", "cat": "kernel", "name": "splitk_reduce", "ts": 33, "dur": 2.5,
         "args": {"correlation": 101, "External id": 10}},
        _op("aten::mm", 11, 60, 40, [[8, 64], [64, 128]], ["c10::BFloat16"] * 2,
            [[64, 1], [1, 64]]),
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm_bf16", "ts": 70, "dur": 17.5,
         "args": {"External id": 11}},
        {"ph": "X", "cat": "kernel", "name": "splitk_reduce", "ts": 88, "dur": 2.5,
         "args": {"External id": 11}},
        _op("aten::mm", 12, 90, 40, [[8, 64], [64, 128]], ["c10::BFloat16"] * 2,
            [[64, 1], [1, 64]]),
        {"ph": "X", "cat": "kernel", "name": "sm90_gemm_bf16_v2", "ts": 95, "dur": 9.0,
         "args": {"External id": 12}},
    ]}


def test_device_trace_sums_linked_kernels_per_op(tmp_path):
    trace = tmp_path / "rank0.pt.trace.json.gz"
    with gzip.open(trace, "wt") as fh:
        json.dump(_gpu_trace(), fh)
    result = parse_profiling(trace, tmp_path / "db")
    assert result.kernel_types == ("aten::mm",)           # linear launched nothing itself
    rows = read_table(tmp_path / "db" / "aten__mm.csv").rows
    assert len(rows) == 2  # a call served by a different kernel set is its own group
    row = next(r for r in rows if r["Count"] == "2")
    assert row["Input Shapes"] == "8,64;64,128"           # scalars dropped
    assert row["Input Data Types"] == "DT_BF16;DT_BF16"
    assert row["Input Strides"] == "64,1;1,64"
    assert row["Accelerator Core"] == "GPU"
    assert row["Kernel Names"] == "sm90_gemm_bf16;splitk_reduce"
    # calls: 12.5 + 2.5 (via correlation and External id) and 17.5 + 2.5 -> mean 17.5
    assert float(row["Average Duration(us)"]) == pytest.approx(17.5)


def test_cpu_trace_uses_op_wall_time(tmp_path):
    trace = tmp_path / "cpu.json"
    trace.write_text(json.dumps({"traceEvents": [
        _op("aten::addmm", 1, 0, 30, [[128], [8, 64], [64, 128], [], []],
            ["float", "float", "float", "Scalar", "Scalar"]),
        _op("aten::addmm", 2, 50, 50, [[128], [8, 64], [64, 128], [], []],
            ["float", "float", "float", "Scalar", "Scalar"])]}))
    parse_profiling(trace, tmp_path / "db")
    row = read_table(tmp_path / "db" / "aten__addmm.csv").rows[0]
    assert (row["Input Shapes"], row["Accelerator Core"]) == ("128;8,64;64,128", "CPU")
    assert float(row["Average Duration(us)"]) == 40.0


def test_bad_event_is_named(tmp_path):
    trace = tmp_path / "bad.json"
    ev = _op("aten::mm", 1, 0, -3, [[2, 2], [2, 2]], ["float", "float"])
    trace.write_text(json.dumps({"traceEvents": [ev]}))
    with pytest.raises(ConfigError, match=r"bad.json, event 0.*'dur'"):
        parse_profiling(trace, tmp_path / "db")
    assert not (tmp_path / "db").exists()


def test_real_torch_profiler_trace(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.SiLU(),
                                torch.nn.Linear(48, 32, bias=False))
    x = torch.randn(4, 32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            model(x)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    parse_profiling(tmp_path, tmp_path / "db")
    linear = {r["Input Shapes"]: r for r in read_table(tmp_path / "db" / "aten__linear.csv").rows}
    assert set(linear) == {"4,32;48,32;48", "4,48;32,48"}    # x, weight (n, k), bias
    assert all(r["Count"] == "2" for r in linear.values())
    assert read_table(tmp_path / "db" / "aten__silu.csv").rows[0]["Input Shapes"] == "4,48"
