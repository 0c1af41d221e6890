"""InterpolatingDataSource: bracketed only, source INTERPOLATED, never extrapolates."""

import math

import pytest
from profiling_helpers import op
from test_profiling_data_source import attn, comm, hit, missed, mla

from perfcast.evidence.profiling.data_source import QuerySource
from perfcast.evidence.profiling.interpolating_data_source import InterpolatingDataSource

BF = "bf16"


@pytest.fixture
def ids(ds):
    return InterpolatingDataSource(ds)


def test_exact_hits_pass_through(ids):
    r = hit(ids.lookup(op("aten.mm.default", [((8, 2048), BF), ((2048, 4096), BF)])))
    assert r.source is QuerySource.MEASURED and r.latency_us == 19.8


def test_compute_bracketed_on_first_dim(ids, ds):
    q = op("aten.mm.default", [((40, 2048), BF), ((2048, 4096), BF)])
    assert missed(ds.lookup(q)).reason == "shape_mismatch"  # plain source: no such row
    r = hit(ids.lookup(q))
    # m=8 -> 19.8 us, m=64 -> 24.4 us: 19.8 + 4.6 * 32/56
    assert r.source is QuerySource.INTERPOLATED
    assert r.latency_us == pytest.approx(19.8 + 4.6 * 32 / 56)
    assert r.details["bracket"] == [8.0, 64.0]
    # two rows on the line: no leave-one-out error, so the uncertainty is unknown
    assert r.details["rel_std"] is None and r.confidence == 0.0


def test_compute_out_of_bracket_does_not_extrapolate(ids):
    m = missed(ids.lookup(op("aten.mm.default", [((100, 2048), BF), ((2048, 4096), BF)])))
    assert m.reason == "shape_mismatch"


def test_attention_interpolates_on_avg_seq_len_with_sqrt_transform(ids, ds):
    q = attn(8, 16, 128, 3072, kv_heads=4)
    assert missed(ds.lookup(q))
    r = hit(ids.lookup(q))
    # mapping interpolation_policy: FusedInferAttentionScore axis_transform sqrt_seq
    frac = (math.sqrt(3072) - math.sqrt(2048)) / (math.sqrt(4096) - math.sqrt(2048))
    assert r.latency_us == pytest.approx(31.0 + 21.0 * frac)
    assert r.source is QuerySource.INTERPOLATED and r.details["transform"] == "sqrt_seq"
    # the kv-heads-8 row (35 us at 2048) must not be a bracket point: no upper point
    assert missed(ids.lookup(attn(8, 16, 128, 3072, kv_heads=8)))
    assert missed(ids.lookup(attn(8, 16, 128, 5000, kv_heads=4)))  # above 4096


def test_elementwise_interpolates_on_output_dim0(ids):
    add = op("aten.add.Tensor", [((40, 4096), BF), ((40, 4096), BF)], [((40, 4096), BF)])
    r = hit(ids.lookup(add))
    assert r.latency_us == pytest.approx(3.0 + 1.4 * 32 / 56)


def test_decomposer_composite_interpolates_missing_sub_kernels(ids, ds):
    q = mla(1, 96, 96)
    # exact: MatMulV2 (96,512) has no row and FIA has rows at 64 and 128 only -> full miss
    assert missed(ds.lookup(q)).reason.startswith("sub_kernel_miss")
    r = hit(ids.lookup(q))
    mm = 9.0 + 4.0 * 32 / 64                          # m=64 -> 9.0, m=128 -> 13.0
    frac = (math.sqrt(96) - 8) / (math.sqrt(128) - 8)  # sqrt_seq between 64 and 128
    assert r.source is QuerySource.INTERPOLATED
    assert r.latency_us == pytest.approx(mm + 20.0 + 10.0 * frac)


def test_static_composite_stays_exact(ids, ds):
    mc2 = op("tensor_cast.matmul_all_reduce.default", [((40, 2048), BF), ((2048, 4096), BF)],
             [((40, 4096), BF)], participants=2)
    assert ids.lookup(mc2) == ds.lookup(mc2)
    assert missed(ids.lookup(mc2)).reason == "shape_mismatch"


def test_communication_is_not_reinterpolated(ids, ds):
    q = comm("tensor_cast.all_reduce.default", 4 * 2**20, 2)
    assert ids.lookup(q) == ds.lookup(q)
