"""Every query path of ProfilingDataSource: hits, shape rules and miss reasons."""

import pytest
from profiling_helpers import DB, op

from perfcast.evidence.profiling.data_source import (
    DataSourcePerformanceModel,
    LookupMiss,
    QueryResult,
    QuerySource,
)
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.workload import ParallelPlan

BF = "bf16"


def hit(result) -> QueryResult:
    assert isinstance(result, QueryResult), result
    return result


def missed(result) -> LookupMiss:
    assert isinstance(result, LookupMiss), result
    return result


# -- interface -------------------------------------------------------------------------
def test_data_source_is_abstract_and_read_only(ds):
    with pytest.raises(TypeError):
        DataSourcePerformanceModel()
    with pytest.raises(NotImplementedError, match="read-only"):
        ds.store(op("aten.mm.default"), QueryResult(1.0, 1.0, QuerySource.MEASURED))
    assert {s.name for s in QuerySource} == {"MEASURED", "INTERPOLATED", "EXTRAPOLATED",
                                             "PARTIAL"}


# -- compute ---------------------------------------------------------------------------
def test_matmul_weight_transpose_hit(ds):
    r = hit(ds.lookup(op("aten.mm.default", [((8, 4096), BF), ((4096, 3072), BF)])))
    assert r.latency_us == 26.1 and r.source is QuerySource.MEASURED
    assert r.kernel_type == "MatMulV2"
    assert r.shape_match_info.shape_match_rule == "transpose"
    assert r.shape_match_info.kernel_shapes == ((8, 4096), (3072, 4096))


def test_torch_ops_prefix_is_normalised(ds):
    r = hit(ds.lookup(op("torch.ops.aten.mm.default", [((8, 4096), BF), ((4096, 3072), BF)])))
    assert r.latency_us == 26.1


def test_alternate_kernel_used_when_primary_has_no_row(ds):
    r = hit(ds.lookup(op("aten.mm.default", [((1024, 4096), BF), ((4096, 6144), BF)])))
    assert (r.kernel_type, r.latency_us) == ("MatMulV3", 205.0)


def test_fractal_nz_weight_is_restored(ds):
    # CSV weight (192, 256, 16, 16) FRACTAL_NZ == (3072, 4096) == transposed (4096, 3072)
    r = hit(ds.lookup(op("aten.mm.default", [((16, 4096), BF), ((4096, 3072), BF)])))
    assert r.latency_us == 27.9


def test_block_padding_tolerance(ds):
    # perfcast m=128 is the CSV's m=120 padded to a 16-row tile
    r = hit(ds.lookup(op("aten.mm.default", [((128, 4096), BF), ((4096, 3072), BF)])))
    assert r.latency_us == 41.3 and r.shape_match_info.shape_match_rule == "transpose+padding"
    r = hit(ds.lookup(op("aten.mm.default", [((128, 4096), BF), ((3072, 4096), BF)])))
    assert r.shape_match_info.shape_match_rule == "padding"
    # 130 is not a tile multiple of 120
    assert missed(ds.lookup(op("aten.mm.default", [((130, 4096), BF), ((3072, 4096), BF)])))


def test_batch_dim_stripping(ds):
    r = hit(ds.lookup(op("aten.mm.default", [((1, 8, 4096), BF), ((4096, 3072), BF)])))
    assert r.latency_us == 26.1 and r.shape_match_info.shape_match_rule == "transpose"
    r = hit(ds.lookup(op("tensor_cast.swiglu.default", [((1, 8, 12288), BF)])))
    assert (r.latency_us, r.shape_match_info.shape_match_rule) == (6.1, "batch_strip")


def test_dtype_must_match_except_relaxed_kernels(ds):
    # MatMulV2 accepts fp32 for bf16 (relaxed); SwiGlu does not
    assert hit(ds.lookup(op("aten.mm.default", [((8, 4096), "fp32"), ((4096, 3072), BF)])))
    assert missed(ds.lookup(op("tensor_cast.swiglu.default", [((8, 12288), "fp32")]))
                  ).reason == "shape_mismatch"
    # fp16 is looked up on the bf16 rows (Ascend runs fp16 on the same kernels here)
    assert hit(ds.lookup(op("tensor_cast.swiglu.default", [((8, 12288), "fp16")]))).latency_us == 6.1


def test_tc_input_count_truncates_both_sides(ds):
    # embedding: CSV (weight, indices, axis), tc_input_count 2 -> (weight, indices)
    r = hit(ds.lookup(op("aten.embedding.default",
                         [((151936, 4096), BF), ((1024,), "int64"), ((7,), "int64")])))
    assert r.latency_us == 21.0
    m = missed(ds.lookup(op("aten.embedding.default", [((1024,), "int64")])))
    assert m.reason == "input_count_mismatch" and "1 tensor inputs vs 2" in m.detail


def test_kernel_specific_normalisers(ds):
    # SwiGlu given gate and up separately -> one concatenated CSV input
    r = hit(ds.lookup(op("tensor_cast.swiglu.default", [((1024, 12288), BF), ((1024, 12288), BF)])))
    assert r.latency_us == 66.0
    # RoPE: TensorCast's (k, q, cos, sin) in (B,H,S,D) -> the CSV's (q, k, cos) in
    # (B,S,H,D), batch dim stripped; the second slot recorded as FLOAT (relaxed)
    r = hit(ds.lookup(op("tensor_cast.apply_rope.default",
                         [((1, 8, 512, 128), BF), ((1, 32, 512, 128), BF), ((1, 512, 128), BF),
                          ((1, 512, 128), BF)])))
    assert (r.latency_us, r.shape_match_info.kernel_shapes[:2]) == (
        10.0, ((512, 32, 128), (512, 8, 128)))
    # the kernel's slots are not TensorCast's: q and k as passed do not match
    assert missed(ds.lookup(op("tensor_cast.apply_rope.default",
                               [((1, 32, 512, 128), BF), ((1, 8, 512, 128), BF),
                                ((1, 512, 128), BF), ((1, 512, 128), BF)])))
    # reshape_and_cache: (key, value, kv_cache(2,...), slots) -> 5 CSV inputs
    r = hit(ds.lookup(op("tensor_cast.reshape_and_cache.default",
                         [((512, 1024), BF), ((512, 1024), BF),
                          ((2, 5, 128, 8, 128), BF), ((512,), "int64")])))
    assert r.latency_us == 10.0 and len(r.shape_match_info.kernel_shapes) == 5


def test_reshape_and_cache_normaliser_shapes(ds):
    r = ds.lookup(op("tensor_cast.reshape_and_cache.default",
                     [((1024, 1024), BF), ((1024, 1024), BF), ((2, 5, 128, 8, 128), BF),
                      ((1024,), "int64")]))
    # key (1024,1024) -> (1024,1,1024) is not a CSV row's (512,1,1024): a shape miss,
    # not an input-count miss, because the normaliser reconciles 4 vs 5 inputs
    assert missed(r).reason == "shape_mismatch"


def test_compute_miss_reasons(ds, tmp_path):
    assert missed(ds.lookup(op("aten.nonexistent.default", [((8,), BF)]))).reason == "unmapped"
    m = missed(ds.lookup(op("aten.mm.default", [((8, 4096), BF), ((4096, 1234), BF)])))
    assert m.reason == "shape_mismatch" and m.shape_match_info.simulation_shapes == (
        (8, 4096), (4096, 1234))
    assert missed(ds.lookup(op("aten.bmm.default", [((4, 8, 8), BF), ((4, 8, 8), BF)]))
                  ).reason == "shape_mismatch"
    # a mapped kernel whose CSV is absent
    (tmp_path / "op_mapping.yaml").write_text(
        "operator_mappings:\n  aten.mm.default:\n    kernel_type: MatMulV2\n")
    bare = ProfilingDataSource(tmp_path)
    assert missed(bare.lookup(op("aten.mm.default", [((8, 8), BF), ((8, 8), BF)]))
                  ).reason == "csv_not_found"


def test_miss_is_a_value_not_state(ds):
    a = ds.lookup(op("aten.nonexistent.default"))
    b = ds.lookup(op("aten.mm.default", [((8, 4096), BF), ((4096, 3072), BF)]))
    assert isinstance(a, LookupMiss) and isinstance(b, QueryResult)
    assert not hasattr(ds, "last_miss_reason")


# -- communication ---------------------------------------------------------------------
def comm(operator, message_bytes, participants, **kw):
    return op(operator, [((message_bytes // 2,), BF)], message_bytes=message_bytes,
              participants=participants, **kw)


def test_comm_exact_uses_topology_tier_of_the_group(ds):
    # 2 dies of one package -> tier 2 (SIO) on the A3 grid 48x8x2
    r = hit(ds.lookup(comm("tensor_cast.all_reduce.default", 65536, 2)))
    assert (r.latency_us, r.source, r.details["topology_tier"]) == (10.5, QuerySource.MEASURED, 2)
    # the same message on the 1-level CLOS tier is another row
    r = hit(ds.lookup(comm("tensor_cast.all_reduce.default", 65536, 2, tier="hccs")))
    assert (r.latency_us, r.details["topology_tier"]) == (15.0, 1)


def test_comm_alpha_beta_interpolation_in_range(ds):
    # rows lie on 10 us + 1 us per 128 KiB: 4 MiB -> 10 + 32 = 42 us
    r = hit(ds.lookup(comm("tensor_cast.all_reduce.default", 4 * 2**20, 2)))
    assert r.source is QuerySource.INTERPOLATED
    assert r.latency_us == pytest.approx(42.0)
    # three rows leave one to hold out of the fit: too few to size the error
    assert r.details["rel_std"] is None and r.confidence == 0.0
    assert "needs 5" in r.details["uncertainty_reason"]


def test_comm_out_of_range_misses(ds):
    m = missed(ds.lookup(comm("tensor_cast.all_reduce.default", 16 * 2**20, 2)))
    assert m.reason == "shape_mismatch" and "outside measured" in m.detail
    assert missed(ds.lookup(comm("tensor_cast.all_reduce.default", 65536, 4))).reason == \
        "shape_mismatch"


def test_comm_per_rank_message_convention(ds):
    # all_gather: perfcast counts the gathered buffer, HCCL the per-rank send count
    r = hit(ds.lookup(comm("tensor_cast.all_gather.default", 2430976, 2)))
    assert (r.latency_us, r.details["message_bytes"]) == (9.0, 1215488)
    # reduce_scatter CSV has no topology_tier column: not filtered by tier
    assert hit(ds.lookup(comm("tensor_cast.reduce_scatter.default", 8192, 2))).latency_us == 6.0


def test_comm_without_grid_ignores_tier(a3):
    from dataclasses import replace
    src = ProfilingDataSource(DB, replace(a3, comm_grid=None))
    # first row for (65536, 2) regardless of tier
    assert hit(src.lookup(comm("tensor_cast.all_reduce.default", 65536, 2))).latency_us == 10.5


# -- attention special (real msmodeling fixture) ----------------------------------------
def attn(t, n, d, avg, kv_heads=None, q_rank3=True, dtype=BF):
    q = ((t, n, d), dtype) if q_rank3 else ((t, n * d), dtype)
    dims = {"kv_len": avg, "head_dim": d}
    if kv_heads is not None:
        dims["kv_heads"] = kv_heads
    return op("tensor_cast.attention.default", [q, ((1, avg, 1, d), dtype)], **dims)


def test_attention_nearest_avg_seq_len_within_16(fia_ds):
    r = hit(fia_ds.lookup(attn(128, 4, 128, 4096)))
    assert r.latency_us == 58.2 and r.details["csv_avg_seq_len"] == 4096
    assert hit(fia_ds.lookup(attn(128, 4, 128, 4100))).latency_us == 58.2
    assert hit(fia_ds.lookup(attn(128, 4, 128, 8200))).latency_us == 120.5
    m = missed(fia_ds.lookup(attn(128, 4, 128, 4096 + 17)))
    assert m.reason == "shape_mismatch"


def test_attention_skips_negative_avg_seq_len_rows(fia_ds):
    # the row with avg_seq_len -1 (55.0 us) must never answer
    assert missed(fia_ds.lookup(attn(128, 4, 128, 0)))


def test_attention_q_shape_normalisation_and_padding(fia_ds):
    # 2D (T, N*D) query -> (T, N, D)
    assert hit(fia_ds.lookup(attn(336, 4, 128, 4096, q_rank3=False))).latency_us == 60.1
    # T=160 at 2048 exists; T=176 is not a tile rounding of 160 but 160 of 150 is
    assert hit(fia_ds.lookup(attn(160, 4, 128, 2048))).latency_us == 59.0
    assert missed(fia_ds.lookup(attn(176, 4, 128, 2048)))
    # dtype, head count and head dim are exact
    assert missed(fia_ds.lookup(attn(128, 8, 128, 4096)))
    assert missed(fia_ds.lookup(attn(128, 4, 128, 4096, dtype="fp32")))


def test_attention_runtime_columns_filter(ds):
    # enriched CSV: Runtime num_key_value_heads separates 4 (31 us) from 8 (35 us)
    assert hit(ds.lookup(attn(8, 16, 128, 2049, kv_heads=4))).latency_us == 31.0
    assert hit(ds.lookup(attn(8, 16, 128, 2049, kv_heads=8))).latency_us == 35.0
    assert missed(ds.lookup(attn(8, 16, 128, 2049, kv_heads=2)))


def test_attention_needs_seq_len(ds):
    m = missed(ds.lookup(op("tensor_cast.attention.default", [((8, 16, 128), BF)], head_dim=128)))
    assert m.reason == "missing_seq_lens"


# -- elementwise -----------------------------------------------------------------------
def test_elementwise_output_shape_and_dtype_scaling(ds):
    add = lambda shape, dt: op("aten.add.Tensor", [(shape, dt), (shape, dt)], [(shape, dt)])  # noqa: E731
    r = hit(ds.lookup(add((1024, 4096), BF)))
    assert r.latency_us == 14.0 and r.shape_match_info.shape_match_rule == "elementwise"
    r = hit(ds.lookup(add((1024, 4096), "fp32")))  # 4-byte output on 2-byte rows: x2
    assert r.latency_us == 28.0 and r.details["dtype_scale"] == 2.0
    r = hit(ds.lookup(add((1, 8, 4096), BF)))  # batch dim stripped
    assert r.latency_us == 3.0
    assert missed(ds.lookup(add((40, 4096), BF))).reason == "elementwise_output_shape_mismatch"


def test_elementwise_without_output_falls_back_to_compute(ds):
    r = hit(ds.lookup(op("aten.add.Tensor", [((8, 4096), BF), ((8, 4096), BF)])))
    assert r.latency_us == 3.0 and r.shape_match_info.shape_match_rule == "identity"


# -- MoE fused ---------------------------------------------------------------------------
def test_moe_fused_matches_ep_size(a3):
    # (x, expert_indices) projected to the kernel's seven inputs (project_full_shape) from
    # the task's gate-up GEMM axes: 16 local experts, hidden 7168, 2 x 2048 gate-up
    dfc = op("tensor_cast.dispatch_ffn_combine.default", [((16, 7168), BF), ((16, 8), "int64")],
             groups=16, k=7168, n=4096)
    assert hit(ProfilingDataSource(DB, a3, ParallelPlan(ep=16)).lookup(dfc)).latency_us == 950.0
    r = hit(ProfilingDataSource(DB, a3, ParallelPlan(ep=8)).lookup(dfc))
    assert (r.latency_us, r.details["ep_size"]) == (700.0, 8)
    assert missed(ProfilingDataSource(DB, a3, ParallelPlan(ep=4)).lookup(dfc)).reason == \
        "shape_mismatch"
    assert missed(ProfilingDataSource(DB, a3).lookup(dfc)).reason == "ep_size_not_configured"


# -- composite ---------------------------------------------------------------------------
def test_static_mc2_composite_adds_comm(ds):
    mc2 = op("tensor_cast.matmul_all_reduce.default", [((8, 2048), BF), ((2048, 4096), BF)],
             [((8, 4096), BF)], participants=2)
    r = hit(ds.lookup(mc2))
    # MatMulV2 19.8 + all_reduce of the (8, 4096) bf16 output = 65536 B on tier 2: 10.5
    assert r.latency_us == pytest.approx(30.3)
    assert r.details["sub_kernel_durations"] == [("MatMulV2", 19.8), ("hcom_allReduce_", 10.5)]
    assert [s.kernel_type for s in r.sub_kernel_shapes] == ["MatMulV2", "hcom_allReduce_"]


def test_static_composite_uses_first_matching_compute_candidate(ds):
    r = hit(ds.lookup(op("tensor_cast.rms_norm_dynamic_quant_symmetric.default",
                         [((128, 7168), BF)])))
    # RmsNorm.csv needs (x, gamma); DynamicQuant.csv matches (x): one candidate, not a sum
    assert (r.kernel_type, r.latency_us) == ("DynamicQuant", 7.2)


def test_static_composite_comm_miss(ds):
    mc2 = op("tensor_cast.matmul_all_reduce.default", [((8, 2048), BF), ((2048, 4096), BF)],
             [((8, 4096), BF)], participants=4)
    assert missed(ds.lookup(mc2)).reason == "comm_sub_kernel_miss"


def mla(batch, q_tokens, kv_len, **axes):
    t = batch * q_tokens
    return op("tensor_cast.multihead_latent_attention.default", [((t, 16, 192), BF)],
              batch=batch, q_tokens=q_tokens, kv_len=kv_len, heads=16, kv_lora_rank=512,
              qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, kv_dtype=BF, **axes)


def test_mla_decode_hits_the_real_fixture_token_first(fia_ds):
    # DeepSeek-V3 at TP8 (16 local heads), 4 requests at 2,049 tokens: the real fixture's
    # TransposeBatchMatMul rows (token-first) and its FIA row (4,16,1,512) at 2048
    r = hit(fia_ds.lookup(mla(4, 1, 2049)))
    assert r.source is QuerySource.MEASURED and r.latency_us == pytest.approx(55.0)
    assert r.details["sub_kernel_durations"] == [
        ("TransposeBatchMatMul", 15.0), ("FusedInferAttentionScore", 28.0),
        ("TransposeBatchMatMul", 12.0)]
    q_absorb, fia, out_absorb = r.sub_kernel_shapes
    assert q_absorb.simulation_shapes == ((4, 16, 128), (16, 128, 512)) == q_absorb.kernel_shapes
    assert out_absorb.simulation_shapes == ((4, 16, 512), (16, 512, 128))
    assert fia.kernel_shapes == ((4, 16, 1, 512),)


def test_mla_absorb_layout_follows_the_kernel(ds):
    # the mapping lists no sub_kernels: q @ W_UK_T tries BatchMatMulV2 first, which
    # torch.bmm feeds heads-first; out @ W_UV is TransposeBatchMatMul, token-first
    r = hit(ds.lookup(mla(4, 1, 2048)))
    assert r.source is QuerySource.MEASURED and r.latency_us == pytest.approx(8.0 + 28.0 + 12.0)
    assert [(s.kernel_type, s.simulation_shapes) for s in r.sub_kernel_shapes] == [
        ("BatchMatMulV2", ((16, 4, 128), (16, 128, 512))),
        ("FusedInferAttentionScore", ()),
        ("TransposeBatchMatMul", ((4, 16, 512), (16, 512, 128)))]


def test_mla_split_layout_core_is_only_the_attention(fia_ds):
    # perfcast's split graph costs the absorb bmms as tasks of their own
    r = hit(fia_ds.lookup(mla(4, 1, 2049, projections_in_call=0)))
    assert r.latency_us == 28.0 and r.kernel_type == "FusedInferAttentionScore"


def test_decomposer_partial_and_full_miss(ds):
    # prefill T=96, kv 64: MatMulV2 (96,512) has no row; FIA (96,16,128) at 64 does (20.0)
    r = hit(ds.lookup(mla(1, 96, 64)))
    assert r.source is QuerySource.PARTIAL and r.latency_us == 20.0
    assert r.details["missed_kernels"] == ["MatMulV2"]
    (spec,) = r.details["missed_specs"]  # priced by EmpiricalPerformanceModel
    assert spec.work.operation == "gemm" and spec.work.flops == 2.0 * 96 * 512 * 16 * 256
    assert r.confidence == 0.5
    m = missed(ds.lookup(mla(1, 96, 1000)))
    assert m.reason == "sub_kernel_miss:MatMulV2,FusedInferAttentionScore"
    # axes missing: the decomposer cannot derive sub-kernels
    assert missed(ds.lookup(op("tensor_cast.multihead_latent_attention.default",
                               [((4, 16, 192), BF)]))).reason == "decompose_failed"


# -- zero cost / accepted miss -------------------------------------------------------------
def test_zero_cost_and_accepted_miss(ds):
    r = hit(ds.lookup(op("aten.view.default", [((8, 4096), BF)])))
    assert (r.latency_us, r.source, r.zero_cost) == (0.0, QuerySource.MEASURED, True)
    assert r.shape_match_info.shape_match_rule == "zero_cost"
    r = hit(ds.lookup(op("aten.detach.default", [((8, 4096), BF)])))
    assert r.latency_us == 0.0 and r.kernel_type == "accepted_miss"
    assert "metadata-only" in r.details["note"]
