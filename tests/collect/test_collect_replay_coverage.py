"""Replay coverage: every kernel type of the collection-tools guide has a torch replay or a
stated reason why not, docs/collecting.md lists exactly what kernel_types.yaml says, and
each replay computes what its kernel computes."""

import re
from pathlib import Path

import pytest

from perfcast.collect.kernel_types import kernel_type_table, replay_table, spec_for
from perfcast.collect.replay.base import ReplayCase
from perfcast.collect.tables import parse_shapes, split_list
from perfcast.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT.parent / "shared" / "spec" / "perf-data-collection-tools.md"
# The per-operator replay entry points of the TensorCast collection-tools guide
# (perf-data-collection-tools.md, 3.3 "Per-operator replay entry points").
GUIDE_KERNEL_TYPES = (
    "AddRmsNormBias", "Add", "ArgMaxV2", "AscendQuantV2", "BatchMatMulV2", "DispatchFFNCombine",
    "DynamicQuant", "FusedInferAttentionScore", "GatherV2", "GroupedMatmul",
    "GroupedMatmulSwigluQuant", "Index", "InterleaveRope", "KvRmsNormRopeCache",
    "LightningIndexer", "MaskedFill", "MatMulCommon", "MatMulV2", "MatMulV3", "MoeTokenPermute",
    "MoeTokenUnpermute", "PadV3", "QuantBatchMatmulV3", "RINGMLAPrefillBF16Kernel",
    "ReshapeAndCacheNdKernel", "RmsNorm", "ScatterNdUpdate", "Slice", "SoftmaxV2", "Sort",
    "SparseFlashAttention", "SwiGlu", "TensorMove", "TransposeBatchMatMul", "Transpose",
    "split_qkv_rmsnorm_rope_kernel",
)


def test_guide_list_is_the_guides():
    if not GUIDE.is_file():
        pytest.skip("the collection-tools guide is not next to this checkout")
    listed = re.findall(r"^(\w+)_run\.py\t(\w+)\t", GUIDE.read_text(), flags=re.M)
    assert sorted(k for _, k in listed) == sorted(GUIDE_KERNEL_TYPES)


def test_every_guide_kernel_type_has_a_replay_or_a_reason():
    table = kernel_type_table()
    missing = [k for k in GUIDE_KERNEL_TYPES if k not in table]
    assert not missing
    for name, spec in table.items():
        assert bool(spec.replay) != bool(spec.not_replayable), name


def test_a_kernel_type_without_replay_or_reason_is_refused(tmp_path):
    bad = tmp_path / "k.yaml"
    bad.write_text("kernel_types:\n  Foo: {operation: gemm, layout: matmul}\n")
    with pytest.raises(ConfigError, match="exactly one of replay and not_replayable"):
        kernel_type_table(str(bad))
    bad.write_text("kernel_types:\n  Foo: {operation: gemm, layout: matmul, replay: torch.mm, "
                   "not_replayable: why}\n")
    with pytest.raises(ConfigError, match="exactly one"):
        kernel_type_table(str(bad))


def test_collecting_doc_table_is_kernel_types_yaml():
    doc = (ROOT / "docs" / "collecting.md").read_text()
    start, end = "<!-- replay-table: start -->\n", "<!-- replay-table: end -->"
    assert start in doc and end in doc
    shown = doc.split(start, 1)[1].split(end, 1)[0]
    assert shown == replay_table(), "regenerate: perfcast.collect.kernel_types.replay_table()"


torch = pytest.importorskip("torch")


def test_every_replay_resolves():
    from perfcast.collect.replay.torch_ops import CASE_REPLAYS, resolve_callable

    for name, spec in kernel_type_table().items():
        if spec.replay and spec.replay not in CASE_REPLAYS:
            assert callable(resolve_callable(spec.replay)), name


def test_not_replayable_rows_fail_with_their_reason():
    from perfcast.collect.replay.torch_ops import NotReplayable, build_call

    case = ReplayCase("SparseFlashAttention#0", spec_for("SparseFlashAttention"),
                      parse_shapes("4,8,64"), split_list("DT_BF16"))
    with pytest.raises(NotReplayable, match="npu_sparse_flash_attention"):
        build_call(case, "cpu")


def _case(ktype, shapes, dtypes, outputs=""):
    return ReplayCase(f"{ktype}#0", spec_for(ktype), parse_shapes(shapes), split_list(dtypes),
                      output_shapes=parse_shapes(outputs))


def _run(ktype, shapes, dtypes, outputs=""):
    """(result of one call, the row's tensors as the replay received them)."""
    from perfcast.collect.replay import torch_ops

    seen = {}
    original = torch_ops.make_slot_inputs

    def spy(case, device):
        seen["slots"] = original(case, device)
        return seen["slots"]

    torch_ops.make_slot_inputs = spy
    try:
        call = torch_ops.build_call(_case(ktype, shapes, dtypes, outputs), "cpu")
    finally:
        torch_ops.make_slot_inputs = original
    return call(), [t for t in seen.get("slots", ()) if t is not None]


def test_pad_slice_transpose_follow_the_recorded_output():
    out, (x,) = _run("PadV3", "3,5", "FLOAT", "4,8")
    assert out.shape == (4, 8) and torch.equal(out[:3, :5], x) and out[3:].abs().sum() == 0
    out, (x,) = _run("Slice", "6,8", "DT_BF16", "2,8")
    assert torch.equal(out, x[:2]) and out.data_ptr() != x.data_ptr()
    out, (x,) = _run("Transpose", "2,3,5", "FLOAT", "2,5,3")
    assert torch.equal(out, x.transpose(1, 2)) and out.is_contiguous()
    from perfcast.collect.replay.torch_ops import NotReplayable, build_call

    with pytest.raises(NotReplayable, match="output shape"):
        build_call(_case("PadV3", "3,5", "FLOAT"), "cpu")
    with pytest.raises(NotReplayable, match="two dims swapped"):
        build_call(_case("Transpose", "2,3,5", "FLOAT", "2,3,6"), "cpu")


def test_index_gathers_the_output_rows():
    out, (src, *_) = _run("Index", "10,4;1;1;3", "FLOAT;INT64;INT64;INT64", "3,4")
    assert torch.equal(out, src[:3])


def test_masked_fill_zeroes_where_the_mask_is_set():
    from perfcast.collect.replay.torch_ops import NAMED_REPLAYS

    x = torch.ones(2, 3)
    mask = torch.tensor([[1, 0, 0], [0, 0, 1]], dtype=torch.int8)
    assert torch.equal(NAMED_REPLAYS["masked_fill"](x, mask),
                       torch.tensor([[0.0, 1, 1], [1, 1, 0]]))
    out, (y, m) = _run("MaskedFill", "4,4;4,4", "DT_BF16;BOOL", "4,4")
    assert out.shape == (4, 4)


def test_scatter_and_reshape_and_cache_write_distinct_rows():
    out, (data, idx, upd) = _run("ScatterNdUpdate", "16,8;5,1;5,8", "FLOAT;INT32;FLOAT")
    written = [r for r in range(16) if any(torch.equal(data[r], upd[j]) for j in range(5))]
    assert len(written) == 5
    # key/value (N, KVH, D) into caches (blocks, block_size, KVH, D)
    out, (key, value, kc, vc, slots) = _run(
        "ReshapeAndCacheNdKernel", "6,2,4;6,2,4;3,4,2,4;3,4,2,4;6",
        "FLOAT;FLOAT;FLOAT;FLOAT;INT32")
    flat_k, flat_v = kc.reshape(12, 8), vc.reshape(12, 8)
    for j in range(6):
        hits = [s for s in range(12) if torch.equal(flat_k[s], key[j].reshape(-1))]
        assert len(hits) == 1 and torch.equal(flat_v[hits[0]], value[j].reshape(-1))


def test_moe_permute_then_unpermute():
    (perm, order), (tokens, ids) = _run("MoeTokenPermute", "4,8;4,2", "DT_BF16;INT32")
    assert perm.shape == (8, 8)
    for i in range(8):
        assert torch.equal(perm[i], tokens[order[i] // 2])
    out, (permuted, sorted_idx, probs) = _run("MoeTokenUnpermute", "8,6;8;4,2",
                                              "FLOAT;INT32;FLOAT")
    from perfcast.collect.replay.torch_ops import _generator

    inv = torch.randperm(8, generator=_generator())
    ref = (permuted[inv].view(4, 2, 6) * probs.unsqueeze(-1)).sum(1)
    assert torch.allclose(out, ref, atol=1e-5)
    from perfcast.collect.replay.torch_ops import NotReplayable, build_call

    with pytest.raises(NotReplayable, match="top-k"):
        build_call(_case("MoeTokenUnpermute", "8,6;8", "FLOAT;INT32"), "cpu")


def test_interleave_rope_rotates_each_pair():
    from perfcast.collect.replay.torch_ops import NAMED_REPLAYS

    d = 8
    x = torch.randn(1, 2, 3, d)
    theta = torch.randn(1, 1, 3, d // 2)
    cos, sin = torch.cos(theta).repeat(1, 1, 1, 2), torch.sin(theta).repeat(1, 1, 1, 2)
    y = NAMED_REPLAYS["interleave_rope"](x, cos, sin)
    even, odd = x[..., 0::2], x[..., 1::2]   # pair i = (x[2i], x[2i+1]), angle theta_i
    c, s = torch.cos(theta), torch.sin(theta)
    assert torch.allclose(y[..., : d // 2], even * c - odd * s, atol=1e-6)
    assert torch.allclose(y[..., d // 2:], odd * c + even * s, atol=1e-6)
    out, _ = _run("InterleaveRope", "1,2,3,8;1,1,3,8;1,1,3,8", "DT_BF16;DT_BF16;DT_BF16")
    assert out.shape == (1, 2, 3, 8)


def test_quant_matmul_is_int8_gemm_dequantised():
    from perfcast.collect.replay.torch_ops import build_call

    case = _case("QuantBatchMatmulV3", "32,64;48,64;48", "INT8;INT8;FLOAT")
    call = build_call(case, "cpu")
    # integer inputs are zeros; check the dequantised GEMM on given tensors instead
    from perfcast.collect.replay.torch_ops import CASE_REPLAYS

    x = torch.randint(-8, 8, (32, 64), dtype=torch.int8)
    w = torch.randint(-8, 8, (48, 64), dtype=torch.int8)      # stored (N, K)
    scale = torch.rand(48)
    y = CASE_REPLAYS["quant_matmul"](case, [x, w, scale])()
    ref = (x.int() @ w.int().t()).float() * scale
    assert y.dtype == torch.bfloat16 and torch.allclose(y.float(), ref, rtol=1e-2)
    assert call().shape == (32, 48)


def test_npu_worker_receives_output_shapes_and_reasons():
    """The NPU worker rebuilds each case from JSON: output-shape replays and the reason of
    a kernel without a replay survive the trip."""
    import json

    from perfcast.collect.replay.npu import case_to_json
    from perfcast.collect.replay.npu_worker import case_from_json

    for case in (_case("PadV3", "3,5", "DT_BF16", "4,8"),
                 _case("GroupedMatmulSwigluQuant", "16,64;4,64,128", "INT8;INT8")):
        back = case_from_json(json.loads(json.dumps(case_to_json(case))))
        assert back.output_shapes == case.output_shapes
        assert back.spec == case.spec
