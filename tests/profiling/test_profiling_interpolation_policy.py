"""`interpolation_policy` of op_mapping.yaml: every TensorCast field is honoured (the
answer changes with it) or refused with a ConfigError naming the field."""

import math
import shutil

import pytest
import yaml
from profiling_helpers import DB, REAL_MAPPING, op

from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.data_source import LookupMiss, QuerySource
from perfcast.evidence.profiling.interpolating_data_source import (
    InterpolatingDataSource,
    KernelPolicy,
    interpolation_policy,
)
from perfcast.evidence.profiling.op_mapping import load_op_mapping
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.evidence.profiling.validate import validate_database
from perfcast.workload import ParallelPlan

BF = "bf16"
MM40 = op("aten.mm.default", [((40, 2048), BF), ((2048, 4096), BF)])  # between m=8 and m=64


def database(tmp_path, policy=None, *, edit=None):
    """A copy of the a3_qwen3_8b database with `policy` as its interpolation_policy."""
    d = tmp_path / "db"
    shutil.copytree(DB, d)
    data = yaml.safe_load((d / "op_mapping.yaml").read_text())
    if policy is not None:
        data["interpolation_policy"] = policy
    if edit is not None:
        edit(data)
    (d / "op_mapping.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return d


def interp(d, a3):
    return InterpolatingDataSource(ProfilingDataSource(d, a3, ParallelPlan(tp=2, ep=16)))


def test_the_real_cann85_policy_is_understood_field_by_field():
    policy = interpolation_policy(load_op_mapping(REAL_MAPPING))
    assert policy["MatMulV2"] == KernelPolicy(max_interpolation_dim=1)
    assert policy["FusedInferAttentionScore"].axis_transform == "sqrt_seq"
    assert policy["SparseFlashAttention"].axis_transform == "linear"
    for kernel in ("ConcatD", "GatherV2", "Index"):
        assert policy[kernel].generic_axis == "output_numel"
    assert all(p.enabled for p in policy.values())


def test_max_interpolation_dim_zero_turns_a_kernel_off(tmp_path, a3):
    on = interp(database(tmp_path / "a", {"kernel_overrides": {"MatMulV2": {
        "max_interpolation_dim": 1}}}), a3).lookup(MM40)
    assert on.source is QuerySource.INTERPOLATED
    assert on.latency_us == pytest.approx(19.8 + 4.6 * 32 / 56)
    off = interp(database(tmp_path / "b", {"kernel_overrides": {"MatMulV2": {
        "max_interpolation_dim": 0}}}), a3).lookup(MM40)
    assert isinstance(off, LookupMiss) and off.reason == "shape_mismatch"


def test_axis_transform_applies_to_the_compute_axis(tmp_path, a3):
    r = interp(database(tmp_path, {"kernel_overrides": {"MatMulV2": {
        "axis_transform": "sqrt_seq"}}}), a3).lookup(MM40)
    frac = (math.sqrt(40) - math.sqrt(8)) / (math.sqrt(64) - math.sqrt(8))
    assert r.latency_us == pytest.approx(19.8 + 4.6 * frac)
    assert r.details["transform"] == "sqrt_seq"


def test_axis_transform_applies_to_the_elementwise_axis(tmp_path, a3):
    add = op("aten.add.Tensor", [((40, 4096), BF), ((40, 4096), BF)], [((40, 4096), BF)])
    linear = interp(database(tmp_path / "a", {}), a3).lookup(add)
    assert linear.latency_us == pytest.approx(3.0 + 1.4 * 32 / 56)
    # TensorCast's older spelling `shape_transform: sqrt` means the same
    r = interp(database(tmp_path / "b", {"kernel_overrides": {"Add": {
        "shape_transform": "sqrt"}}}), a3).lookup(add)
    frac = (math.sqrt(40) - math.sqrt(8)) / (math.sqrt(64) - math.sqrt(8))
    assert r.latency_us == pytest.approx(3.0 + 1.4 * frac)


def test_generic_compute_output_numel_brackets_on_the_output(tmp_path, a3):
    # GatherV2.csv holds the embedding of 8, 512 and 1024 tokens
    emb = op("aten.embedding.default", [((151936, 4096), BF), ((700,), "int64")],
             [((700, 4096), BF)])
    # axis_0 varies the table's first dim (the vocabulary): no bracket for 700 tokens
    plain = database(tmp_path / "a", {})
    assert isinstance(interp(plain, a3).lookup(emb), LookupMiss)
    d = database(tmp_path / "b", {"kernel_overrides": {"GatherV2": {
        "generic_compute": {"axis": "output_numel"}}}})
    r = interp(d, a3).lookup(emb)
    assert r.source is QuerySource.INTERPOLATED
    assert r.details["interpolation_axis"] == "output_numel"
    assert r.details["bracket"] == [512 * 4096, 1024 * 4096]
    assert r.latency_us == pytest.approx(10.0 + 11.0 * (700 - 512) / (1024 - 512))
    # the output's trailing dims stay exact: another hidden size has no rows
    other = op("aten.embedding.default", [((151936, 5120), BF), ((100,), "int64")],
               [((100, 5120), BF)])
    assert isinstance(interp(d, a3).lookup(other), LookupMiss)


def test_allow_extrapolation_false_is_accepted(tmp_path, a3):
    d = database(tmp_path, {"allow_extrapolation": False, "kernel_overrides": {
        "MatMulV2": {"allow_extrapolation": False}}})
    assert interp(d, a3).lookup(MM40).source is QuerySource.INTERPOLATED


@pytest.mark.parametrize("policy, field", [
    ({"axes": ["M"]}, "interpolation_policy.axes"),
    ({"allow_extrapolation": True}, "interpolation_policy.allow_extrapolation"),
    ({"kernel_overrides": {"MatMulV2": {"quant_mode": "int8"}}},
     "interpolation_policy.kernel_overrides.MatMulV2.quant_mode"),
    ({"kernel_overrides": {"MatMulV2": {"max_interpolation_dim": -1}}},
     "interpolation_policy.kernel_overrides.MatMulV2.max_interpolation_dim"),
    ({"kernel_overrides": {"MatMulV2": {"max_interpolation_dim": True}}},
     "interpolation_policy.kernel_overrides.MatMulV2.max_interpolation_dim"),
    ({"kernel_overrides": {"MatMulV2": {"axis_transform": "log"}}},
     "interpolation_policy.kernel_overrides.MatMulV2.axis_transform"),
    ({"kernel_overrides": {"GatherV2": {"generic_compute": {"axis": "M"}}}},
     "interpolation_policy.kernel_overrides.GatherV2.generic_compute.axis"),
    ({"kernel_overrides": {"GatherV2": {"generic_compute": {"axis": "output_numel",
                                                            "exact": ["K"]}}}},
     "interpolation_policy.kernel_overrides.GatherV2.generic_compute"),
    ({"kernel_overrides": {"MatMulV2": {"allow_extrapolation": True}}},
     "interpolation_policy.kernel_overrides.MatMulV2.allow_extrapolation"),
    ({"kernel_overrides": ["MatMulV2"]}, "interpolation_policy.kernel_overrides"),
])
def test_fields_perfcast_would_not_honour_are_refused(tmp_path, a3, policy, field):
    d = database(tmp_path, policy)
    with pytest.raises(ConfigError) as exc:
        interp(d, a3)
    assert exc.value.field == field and "op_mapping.yaml" in str(exc.value)
    # plain exact lookups do not read the policy; `profiling validate` says it
    ProfilingDataSource(d, a3)
    report = validate_database(d)
    assert any(i.where == "interpolation_policy" and field in i.message
               for i in report.warnings)


def test_an_operator_level_policy_is_refused(tmp_path, a3):
    def edit(data):
        data["operator_mappings"]["aten.mm.default"]["interpolation_policy"] = {
            "max_interpolation_dim": 1}
    with pytest.raises(ConfigError) as exc:
        interp(database(tmp_path, edit=edit), a3)
    assert exc.value.field == "operator_mappings.aten.mm.default.interpolation_policy"


def test_estimate_interpolate_refuses_such_a_database(tmp_path):
    from typer.testing import CliRunner

    from perfcast.cli.main import app

    d = database(tmp_path, {"kernel_overrides": {"MatMulV2": {"quant_mode": "int8"}}})
    r = CliRunner().invoke(app, ["estimate", "Qwen/Qwen3-8B", "--device",
                                 "atlas_800_a3_752t_128g_die", "--calibration", "none",
                                 "--performance-model", "profiling", "--profiling-database",
                                 str(d), "--interpolate"], env={"COLUMNS": "250"})
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "interpolation_policy.kernel_overrides.MatMulV2.quant_mode" in r.output
