import json
import shutil

import pytest

from perfcast.collect.kernel_types import spec_for
from perfcast.collect.replay import CudaBackend, NpuBackend, ReplayCase, ReplaySettings
from perfcast.collect.replay.npu import case_to_json, outcomes_from_profile
from perfcast.collect.replay.npu_worker import case_from_json


def _case(ktype, shapes, dtypes="DT_BF16;DT_BF16", formats="ND;ND", idx=0):
    from perfcast.collect.tables import parse_shapes, split_list

    return ReplayCase(f"{ktype}#{idx}", spec_for(ktype), parse_shapes(shapes),
                      split_list(dtypes), split_list(formats))


def test_cuda_timing_plan_warms_flushes_and_brackets_each_call():
    plan = CudaBackend(flush_l2=True).plan(ReplaySettings(repeat_count=2, warmup=1),
                                           l2_bytes=50 * 2**20)
    assert plan.flush_bytes == 100 * 2**20              # twice the L2
    assert plan.steps() == ["call", "synchronize",
                            f"flush {100 * 2**20} bytes", "record start", "call", "record end",
                            f"flush {100 * 2**20} bytes", "record start", "call", "record end",
                            "synchronize", "read elapsed_time"]
    assert CudaBackend().plan(ReplaySettings()).flush_bytes == 0


def test_cuda_backend_reports_why_it_cannot_run_here():
    torch = pytest.importorskip("torch")
    reason = CudaBackend().unavailable_reason()
    assert (reason == "") == torch.cuda.is_available()


def test_npu_command_runs_worker_under_msprof(tmp_path):
    cmd = NpuBackend(python="/usr/bin/python3").command(
        tmp_path / "cases.json", tmp_path / "out", ReplaySettings(repeat_count=3, warmup=1))
    assert cmd[0] == "msprof"
    assert cmd[1] == f"--output={tmp_path / 'out'}"
    assert cmd[2] == "--aic-metrics=PipeUtilization"
    assert cmd[3] == (f"--application=/usr/bin/python3 -m perfcast.collect.replay.npu_worker "
                      f"{tmp_path / 'cases.json'} --repeat-count 3 --warmup 1")


def test_npu_backend_without_msprof_says_so():
    if shutil.which("msprof"):
        pytest.skip("msprof present")
    assert "msprof not found" in NpuBackend().unavailable_reason()


def test_npu_results_parse_from_recorded_op_summary(fixtures):
    cases = [_case("MatMulV2", "128,5120;5120,1280"),
             _case("RmsNorm", "128,5120;5120", idx=1),
             _case("MatMulV2", "64,5120;5120,1280", idx=2)]
    out = outcomes_from_profile(cases, fixtures / "msprof_replay",
                                ReplaySettings(repeat_count=2, warmup=1))
    # MatMulV2 samples 90 (warm-up), 22, 20, 21 -> last two: 20, 21
    assert out[0].stats.mean_us == pytest.approx(20.5) and out[0].stats.count == 2
    # RmsNorm 9, 6.5, 5.5 -> 6.5, 5.5; the Cast kernel in between is ignored
    assert out[1].stats.mean_us == pytest.approx(6.0)
    assert not out[2].ok and "no op_summary row" in out[2].error


def test_worker_case_round_trips_through_json():
    case = _case("aten::embedding", "1000,64;8", "FLOAT;INT64", "ND;ND")
    back = case_from_json(json.loads(json.dumps(case_to_json(case))))
    assert back == case
