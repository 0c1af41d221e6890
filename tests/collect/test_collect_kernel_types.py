import pytest

from perfcast.collect.kernel_types import LAYOUTS, axes_of, kernel_type_table, spec_for


def test_table_loads_and_stems_resolve():
    table = kernel_type_table()
    assert table["MatMulV2"].operation == "gemm"
    assert spec_for("aten__addmm") is table["aten::addmm"]
    assert spec_for("NoSuchKernel") is None


@pytest.mark.parametrize("ktype,slots,axes", [
    ("MatMulV2", ((128, 5120), (5120, 1280)), {"m": 128, "k": 5120, "n": 1280}),
    ("aten::addmm", ((128,), (8, 64), (64, 128)), {"m": 8, "k": 64, "n": 128}),
    ("aten::linear", ((2, 4, 64), (128, 64), (128,)), {"m": 8, "k": 64, "n": 128}),
    ("aten::bmm", ((16, 4, 128), (16, 128, 512)), {"batch": 16, "m": 4, "k": 128, "n": 512}),
    ("TransposeBatchMatMul", ((4, 16, 128), (16, 128, 512)),
     {"batch": 16, "m": 4, "k": 128, "n": 512}),
])
def test_gemm_axes(ktype, slots, axes):
    assert axes_of(spec_for(ktype), slots) == axes


def test_sdpa_axes_and_inverse():
    spec = spec_for("aten::scaled_dot_product_attention")
    axes = axes_of(spec, ((2, 8, 1, 64), (2, 2, 300, 64), (2, 2, 300, 64)))
    assert axes == {"batch": 2, "heads": 8, "q_tokens": 1, "head_dim": 64, "kv_heads": 2,
                    "kv_len": 300, "v_head_dim": 64, "phase": "decode"}
    assert LAYOUTS["sdpa"].slots(axes, (None, None, None)) == ((2, 8, 1, 64), (2, 2, 300, 64), (2, 2, 300, 64))


def test_fractal_nz_weight_is_restored_before_reading_axes():
    from perfcast.collect.kernel_types import fractal_nz_like

    spec = spec_for("MatMulV2")
    # bf16 weight k=5120, n=1280 in (n/16, k/16, 16, 16) tiles
    assert axes_of(spec, ((128, 5120), (80, 320, 16, 16)), ("ND", "FRACTAL_NZ")) == \
        {"m": 128, "k": 5120, "n": 1280}
    assert fractal_nz_like((5120, 1280), (1, 1, 16, 16)) == (80, 320, 16, 16)
    assert fractal_nz_like((5120, 1000), (1, 1, 16, 16)) is None


def test_inconsistent_shapes_have_no_axes():
    assert axes_of(spec_for("aten::mm"), ((8, 64), (32, 128))) is None
