import json

import pytest

from perfcast.collect.grid import M_GRID, generate_grid, gemm_nk, sqrt_space, strides_like
from perfcast.collect.tables import parse_shapes, read_table
from perfcast.workload import load_model_spec

TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 256,
        "torch_dtype": "float32", "hidden_act": "silu"}

HEADER = ("OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,"
          "Output Data Types,Output Formats,Average Duration(us),Median Duration(us),"
          "Std Duration(us),Count,Input Strides\n")


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY))
    return path


@pytest.fixture
def database(tmp_path):
    db = tmp_path / "db"
    db.mkdir()
    (db / "aten__linear.csv").write_text(
        HEADER + ',CPU,"8,64;128,64",FLOAT;FLOAT,ND;ND,,,,5.0,5.0,0,3,"64,1;64,1"\n')
    (db / "aten__mm.csv").write_text(
        HEADER + ',CPU,"8,64;64,128",FLOAT;FLOAT,ND;ND,,,,5.0,5.0,0,3,"64,1;1,64"\n')
    (db / "hcom_allReduce_.csv").write_text(
        "message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps\n"
        "1024,2,bf16,2,30,0.034\n1024,8,bf16,1,50,0.02\n")
    return db


def test_gemm_nk_from_model_projections(tiny_config):
    spec = load_model_spec(tiny_config)
    # qkv (4+2*2)*16=128 x 64, o_proj 64 x 64, gate_up 256 x 64, down 64 x 128, lm_head 256 x 64
    assert gemm_nk([spec], (1,)) == {(128, 64), (64, 64), (256, 64), (64, 128)}
    # tp=2 adds qkv (2+2*1)*16=64 x 64, o_proj 64 x 32, gate_up/lm_head 128 x 64
    assert gemm_nk([spec], (2,)) == {(64, 64), (64, 32), (128, 64)}


def test_grid_appends_every_candidate_without_cap(database, tiny_config):
    result = generate_grid(database, [str(tiny_config)], rows=0, tp_sizes=(1,),
                           ops=["aten__linear"])
    # 4 (n, k) pairs x the m grid, minus the row already present (m=8, n=128, k=64)
    assert result.appended == {"aten__linear": 4 * len(M_GRID) - 1}
    rows = read_table(database / "aten__linear.csv").rows
    new = rows[1:]
    assert all(r["Average Duration(us)"] == "" for r in new)
    assert all(r["Input Data Types"] == "FLOAT;FLOAT" for r in new)
    shapes = {r["Input Shapes"] for r in new}
    assert "32768,64;256,64" in shapes and "1,128;64,128" in shapes


def test_grid_keeps_template_memory_order(database, tiny_config):
    generate_grid(database, [str(tiny_config)], rows=0, tp_sizes=(1,), ops=["aten__mm"])
    row = next(r for r in read_table(database / "aten__mm.csv").rows
               if r["Input Shapes"] == "16,64;64,256")
    assert row["Input Strides"] == "64,1;1,64"          # weight stays column-major
    assert strides_like([(64, 1), (1, 64)], [(8, 64), (64, 128)], [(2, 3), (3, 5)]) == \
        ((3, 1), (1, 3))


def test_grid_is_deterministic_for_a_seed_and_capped(tmp_path, database, tiny_config):
    import shutil

    other = tmp_path / "db2"
    shutil.copytree(database, other)
    a = generate_grid(database, [str(tiny_config)], rows=10, seed=7, tp_sizes=(1, 2))
    b = generate_grid(other, [str(tiny_config)], rows=10, seed=7, tp_sizes=(1, 2))
    assert a.appended["aten__linear"] == 10 and a.appended == b.appended
    assert (database / "aten__linear.csv").read_text() == (other / "aten__linear.csv").read_text()


def test_memory_budget_drops_big_rows(database, tiny_config):
    # 1 KiB budget: m*k + n*k + ... floats; only tiny m survive for n=k=64 (4*(64m+4096+64m) > 1024)
    result = generate_grid(database, [str(tiny_config)], rows=0, tp_sizes=(1,),
                           max_memory_gb=64 * 1024 / 2**30, ops=["aten__linear"])
    for r in read_table(database / "aten__linear.csv").rows[1:]:
        x, w = parse_shapes(r["Input Shapes"])
        out = x[0] * w[0]
        assert 4 * (x[0] * x[1] + w[0] * w[1] + out) <= 64 * 1024
    assert 0 < result.appended["aten__linear"] < 4 * len(M_GRID)


def test_comm_grid_powers_of_two_per_existing_group(database):
    result = generate_grid(database, [], rows=0, ops=["hcom_allReduce_"], max_memory_gb=0)
    rows = read_table(database / "hcom_allReduce_.csv").rows
    # 2^10..2^30 for each of the two (num_devices, dtype, tier) groups, minus the 2 existing
    assert result.appended == {"hcom_allReduce_": 2 * 21 - 2}
    assert {r["topology_tier"] for r in rows if r["num_devices"] == "8"} == {"1"}
    assert all(r["Duration(us)"] == "" for r in rows[2:])


def test_sqrt_space_is_denser_at_the_low_end():
    pts = sqrt_space(16, 1024, 5)
    assert pts[0] == 16 and pts[-1] == 1024
    gaps = [b - a for a, b in zip(pts, pts[1:])]
    assert gaps == sorted(gaps)
