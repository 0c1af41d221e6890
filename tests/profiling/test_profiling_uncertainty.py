"""The profiling path's non-exact answers carry uncertainty measured on the CSV rows."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from profiling_helpers import DB, op
from test_profiling_data_source import comm, hit, mla

from perfcast.evidence.profiling.data_source import QuerySource
from perfcast.evidence.profiling.empirical import result_uncertainty
from perfcast.evidence.profiling.interpolating_data_source import InterpolatingDataSource
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.evidence.profiling.residuals import line_loo, line_loo_errors
from perfcast.workload import ParallelPlan

BF = "bf16"
HEADER = ("Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,"
          "Output Formats,Average Duration(us)\n")


def database(tmp_path, matmul_rows=None, allreduce_rows=None):
    """A copy of the fixture database with MatMulV2.csv / hcom_allReduce_.csv replaced:
    matmul rows are (m, latency_us) of an (m, 2048) x (4096, 2048) bf16 GEMM,
    all-reduce rows (message_bytes, latency_us) on 2 devices, tier 2."""
    root = tmp_path / "db"
    shutil.copytree(DB, root)
    if matmul_rows is not None:
        lines = [f'"{m},2048;4096,2048",DT_BF16;DT_BF16,ND;ND,"{m},4096",DT_BF16,ND,{lat!r}\n'
                 for m, lat in matmul_rows]
        (root / "MatMulV2.csv").write_text(HEADER + "".join(lines))
    if allreduce_rows is not None:
        text = "message_bytes,num_devices,topology_tier,Duration(us)\n" + "".join(
            f"{mb},2,2,{lat!r}\n" for mb, lat in allreduce_rows)
        (root / "hccl" / "hcom_allReduce_.csv").write_text(text)
    return root


def mm(m):
    return op("aten.mm.default", [((m, 2048), BF), ((2048, 4096), BF)])


def source(root, a3, interpolate=True):
    ds = ProfilingDataSource(root, a3, ParallelPlan(tp=2, ep=16))
    return InterpolatingDataSource(ds) if interpolate else ds


def test_interpolated_rel_std_matches_known_noise(tmp_path, a3):
    # latency linear in m (what the compute path interpolates) x lognormal(sigma) noise;
    # a mid-cell answer from two noisy neighbours errs by ~sigma * sqrt(1.5)
    sigma = 0.04
    rng = np.random.default_rng(3)
    ms = np.arange(8, 8 * 301, 8)
    rows = [(int(m), float((10.0 + 0.05 * m) * math.exp(rng.normal(0, sigma)))) for m in ms]
    ids = source(database(tmp_path, matmul_rows=rows), a3)
    r = hit(ids.lookup(mm(1204)))  # between 1200 and 1208
    assert r.source is QuerySource.INTERPOLATED
    assert r.details["loo_samples"] == len(ms) - 2
    assert r.details["rel_std"] == pytest.approx(sigma * math.sqrt(1.5), rel=0.2)
    assert r.confidence == pytest.approx(math.exp(-r.details["rel_std"]))
    assert "leave-one-out" in r.details["uncertainty_method"]
    u = result_uncertainty(r)
    assert (u.kind, u.rel_std, u.sample_count) == ("loo", r.details["rel_std"], len(ms) - 2)
    # calibration: fresh noisy measurements at mid-cells land inside +-1 sigma ~68 %
    inside = []
    for m in ms[:-1:2]:
        q = int(m) + 4
        got = hit(ids.lookup(mm(q)))
        fresh = (10.0 + 0.05 * q) * math.exp(rng.normal(0, sigma))
        inside.append(abs(math.log(got.latency_us / fresh)) <= got.details["rel_std"])
    assert np.mean(inside) == pytest.approx(0.6827, abs=0.1)


def test_denser_rows_give_smaller_uncertainty(tmp_path, a3):
    def curve(m):
        return 2.0 * math.sqrt(m)  # curved: linear interpolation errs, less when dense
    answers = {}
    for step in (64, 16):
        ms = range(64, 4097, step)
        root = database(tmp_path / str(step), matmul_rows=[(m, curve(m)) for m in ms])
        r = hit(source(root, a3).lookup(mm(1000)))
        assert r.source is QuerySource.INTERPOLATED
        answers[step] = r
    assert answers[16].details["rel_std"] < 0.5 * answers[64].details["rel_std"]
    assert answers[16].confidence > answers[64].confidence


def test_leave_one_out_never_uses_the_row_it_predicts():
    xs = list(range(8, 8 * 31, 8))
    ys = [10.0 + 0.05 * x for x in xs]
    k = 14
    ys[k] *= 3.0  # an outlier
    x, _dist, err = line_loo_errors(xs, ys)
    at = dict(zip(x.tolist(), err.tolist()))
    # its own prediction is the clean line through its neighbours: a third of it
    assert at[xs[k]] == pytest.approx(-math.log(3.0), abs=1e-12)
    assert abs(at[xs[k - 1]]) > 0.1 and abs(at[xs[k + 1]]) > 0.1  # they lean on it
    assert all(abs(e) < 1e-12 for xv, e in at.items() if xv not in xs[k - 1:k + 2])
    assert line_loo(xs, ys).sigma == (0.0,)  # a robust quantile ignores three bad rows


def test_too_few_rows_report_unknown_with_a_reason(ds):
    # the fixture has MatMulV2 rows at m=8 and m=64 only: nothing to hold out
    r = hit(InterpolatingDataSource(ds).lookup(mm(40)))
    assert r.source is QuerySource.INTERPOLATED
    assert r.details["rel_std"] is None and r.confidence == 0.0
    assert "needs 5" in r.details["uncertainty_reason"]
    u = result_uncertainty(r)
    assert u.kind == "unknown" and u.rel_std is None
    # a composite with an unsized sub-kernel is unknown too, and says which
    c = hit(InterpolatingDataSource(ds).lookup(mla(1, 96, 96)))
    assert c.details["rel_std"] is None and c.confidence == 0.0
    assert c.details["uncertainty_reason"].startswith("sub-kernel:")


def test_exact_rows_are_measured(ds):
    r = hit(ds.lookup(mm(8)))
    assert r.source is QuerySource.MEASURED and r.confidence == 1.0
    assert r.details["rel_std"] == 0.0 and r.details["uncertainty_kind"] == "samples"
    mc2 = op("tensor_cast.matmul_all_reduce.default", [((8, 2048), BF), ((2048, 4096), BF)],
             [((8, 4096), BF)], participants=2)
    c = hit(ds.lookup(mc2))  # exact compute + exact comm rows
    assert c.confidence == 1.0 and c.details["uncertainty_kind"] == "composite"


def test_alpha_beta_uncertainty_is_held_out_from_the_fit(tmp_path, a3):
    sigma = 0.03
    rng = np.random.default_rng(5)
    sizes = [2**16 * i for i in range(1, 121)]
    rows = [(mb, float((10.0 + mb / 2**17) * math.exp(rng.normal(0, sigma)))) for mb in sizes]
    ds = source(database(tmp_path, allreduce_rows=rows), a3, interpolate=False)
    r = hit(ds.lookup(comm("tensor_cast.all_reduce.default", 2**16 * 60 + 2**15, 2)))
    assert r.source is QuerySource.INTERPOLATED
    assert r.details["loo_samples"] == len(sizes) - 2
    # the fit of 119 rows is nearly exact: the held-out error is the row's own noise,
    # a little less where clamping to the neighbours cuts it
    assert 0.7 * sigma < r.details["rel_std"] < 1.2 * sigma
    assert r.confidence == pytest.approx(math.exp(-r.details["rel_std"]))
    exact = hit(ds.lookup(comm("tensor_cast.all_reduce.default", 2**16 * 60, 2)))
    assert exact.source is QuerySource.MEASURED and exact.confidence == 1.0


def test_exact_row_keeps_its_repeat_spread(tmp_path, a3):
    root = database(tmp_path, matmul_rows=[(8, 20.0)])
    (root / "MatMulV2.csv").write_text(
        HEADER.rstrip("\n") + ",Std Duration(us)\n"
        '"8,2048;4096,2048",DT_BF16;DT_BF16,ND;ND,"8,4096",DT_BF16,ND,20.0,1.5\n')
    r = hit(source(root, a3, interpolate=False).lookup(mm(8)))
    assert r.source is QuerySource.MEASURED
    assert r.details["rel_std"] == pytest.approx(0.075)  # 1.5 us of 20 us
    assert r.confidence == pytest.approx(math.exp(-0.075))
    assert result_uncertainty(r).kind == "samples"


def test_attention_gap_is_sized_by_the_measured_slope(fia_ds):
    from test_profiling_data_source import attn
    exact = hit(fia_ds.lookup(attn(128, 4, 128, 4096)))
    assert exact.details["rel_std"] == 0.0 and exact.confidence == 1.0
    r = hit(fia_ds.lookup(attn(128, 4, 128, 4100)))  # the 4096 row (58.2 us), gap 4
    # nearest other row of the shape: 8192 at 120.5 us (the avg_seq_len -1 row is skipped)
    slope = math.log(120.5 / 58.2) / (8192 - 4096)
    assert r.details["uncertainty_kind"] == "slope"
    assert r.details["rel_std"] == pytest.approx(4 * slope)
    assert r.confidence == pytest.approx(math.exp(-4 * slope))


def test_dtype_scaling_is_checked_on_shapes_measured_in_two_dtypes(tmp_path, ds, a3):
    def add(shape, dt):
        return op("aten.add.Tensor", [(shape, dt), (shape, dt)], [(shape, dt)])
    # the fixture's Add.csv holds no shape in two dtypes: nothing checks the rule
    r = hit(ds.lookup(add((1024, 4096), "fp32")))
    assert r.details["dtype_scale"] == 2.0 and r.details["rel_std"] is None
    assert "two dtypes" in r.details["uncertainty_reason"] and r.confidence == 0.0
    # six shapes in bf16 and fp32, fp32 taking 1.8x (the rule says 2x): |ln(2/1.8)|
    root = tmp_path / "db"
    shutil.copytree(DB, root)
    rows = []
    for m in (64, 128, 256, 512, 2048, 4096):
        for dt, lat in (("DT_BF16", m / 64), ("DT_FLOAT", 1.8 * m / 64)):
            rows.append(f'"{m},4096;{m},4096",{dt};{dt},ND;ND,"{m},4096",{dt},ND,{lat!r}\n')
    rows.append('"1024,4096;1024,4096",DT_BF16;DT_BF16,ND;ND,"1024,4096",DT_BF16,ND,16.0\n')
    (root / "Add.csv").write_text(HEADER + "".join(rows))
    r = hit(source(root, a3, interpolate=False).lookup(add((1024, 4096), "fp32")))
    assert r.latency_us == 32.0 and r.details["loo_samples"] == 6
    assert r.details["rel_std"] == pytest.approx(math.log(2.0 / 1.8))
