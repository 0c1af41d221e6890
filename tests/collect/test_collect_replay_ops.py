"""Torch replays of Ascend vector kernels: each computes what the kernel computes."""

import json

import pytest

from perfcast.collect.grid import generate_grid
from perfcast.collect.kernel_types import spec_for
from perfcast.collect.replay.base import ReplayCase
from perfcast.collect.tables import parse_shapes, read_table, split_list

torch = pytest.importorskip("torch")


def _run(ktype, shapes, dtypes):
    from perfcast.collect.replay.torch_ops import build_call, make_inputs

    case = ReplayCase(f"{ktype}#0", spec_for(ktype), parse_shapes(shapes), split_list(dtypes))
    return build_call(case, "cpu")(), make_inputs(case, "cpu")


def test_add_rms_norm_is_rms_norm_of_the_sum():
    (y, s), (x1, x2, g) = _run("AddRmsNormBias", "4,8;4,8;8", "FLOAT;FLOAT;FLOAT")
    ref = (x1 + x2) / torch.sqrt(((x1 + x2) ** 2).mean(-1, keepdim=True) + 1.1920929e-07) * g
    assert torch.allclose(s, x1 + x2) and torch.allclose(y, ref, atol=1e-5)


def test_dynamic_quant_is_per_token_int8_within_half_a_step():
    (q, scale), (x,) = _run("DynamicQuant", "4,16", "DT_BF16")
    assert q.dtype == torch.int8 and scale.shape == (4, 1)
    assert (q.abs().amax(-1) == 127).all()                      # each token's max maps to 127
    assert ((x.float() - q.float() * scale).abs() <= scale / 2 + 1e-6).all()


def test_ascend_quant_applies_scale_and_offset():
    q, (x, scale, offset) = _run("AscendQuantV2", "4,16;16;16", "FLOAT;FLOAT;FLOAT")
    assert torch.equal(q, torch.round(x * scale + offset).clamp(-128, 127).to(torch.int8))


def test_transpose_batch_matmul_multiplies_per_batch():
    out, (x, w) = _run("TransposeBatchMatMul", "3,2,4;2,4,5", "FLOAT;FLOAT")
    assert out.shape == (3, 2, 5)
    assert torch.allclose(out[1, 0], x[1, 0] @ w[0], atol=1e-5)
    assert torch.allclose(out[2, 1], x[2, 1] @ w[1], atol=1e-5)


def test_vector_kernels():
    out, (x,) = _run("SoftmaxV2", "4,16", "FLOAT")
    assert torch.allclose(out.sum(-1), torch.ones(4))
    out, (x,) = _run("ArgMaxV2", "4,16", "FLOAT")
    assert torch.equal(out, x.max(-1).indices)
    out, (x,) = _run("Sort", "4,16", "FLOAT")
    assert (out.values[:, 1:] >= out.values[:, :-1]).all()
    out, (weight, idx) = _run("GatherV2", "100,8;6", "DT_BF16;INT64")
    assert out.shape == (6, 8) and torch.equal(out[0], weight[0])   # zero indices


def test_grid_writes_norm_weight_as_a_vector(tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    (db / "RmsNorm.csv").write_text(
        "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,"
        "Average Duration(us)\ndynamic,AI_VECTOR_CORE,\"128,5120;5120\",DT_BF16;DT_BF16,ND;ND,9\n")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "intermediate_size": 128,
                               "num_hidden_layers": 2, "vocab_size": 256}))
    generate_grid(db, [str(cfg)], rows=0)
    shapes = {r["Input Shapes"] for r in read_table(db / "RmsNorm.csv").rows[1:]}
    assert "16,64;64" in shapes and all(s.endswith(";64") for s in shapes)


def test_cpu_backend_pins_threads_only_while_measuring():
    from perfcast.collect.replay import CpuBackend, ReplaySettings

    before = torch.get_num_threads()
    seen = []
    backend = CpuBackend(num_threads=1)
    case = ReplayCase("aten::mm#0", spec_for("aten::mm"), parse_shapes("4,8;8,2"),
                      split_list("FLOAT;FLOAT"))
    original = backend._measure
    backend._measure = lambda cases, s: (seen.append(torch.get_num_threads()),
                                         original(cases, s))[1]
    [out] = backend.measure([case], ReplaySettings(repeat_count=2, warmup=0))
    assert out.ok and seen == [1] and torch.get_num_threads() == before
