"""GroupedMatmul (MoE experts) and FusedInferAttentionScore: axes, grid rows, CPU replay
and import."""

import json
import shutil
from pathlib import Path

import pytest

from perfcast.collect.grid import M_GRID, generate_grid, grouped_gemm_points
from perfcast.collect.kernel_types import axes_of, spec_for
from perfcast.collect.replay.base import ReplayCase
from perfcast.collect.tables import parse_shapes, read_table, split_list
from perfcast.workload import load_model_spec

TINY_MOE = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
            "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
            "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
            "vocab_size": 256, "torch_dtype": "float32"}
HEADER = ("OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,"
          "Output Data Types,Output Formats,Average Duration(us),Median Duration(us),"
          "Std Duration(us),Count")
GMM_ND = 'dynamic,AI_CORE,"24,64;8,64,64;;;;;;8",FLOAT;FLOAT;;;;;;INT64,ND;ND;;;;;;ND,"24,64",FLOAT,ND,9,9,0,4'
GMM_NZ = ('dynamic,AI_CORE,"24,64;8,4,4,16,16;;;;;;8",DT_BF16;DT_BF16;;;;;;INT64,'
          'ND;FRACTAL_NZ;;;;;;ND,"24,64",DT_BF16,ND,7,7,0,4')
# paged FIA: q (4 tokens, 4 heads, 16), cache 64 blocks x 16 x (2 kv heads * 16), table (4, 32)
FIA_PAGED = ('dynamic,MIX_AIC,"4,4,16;64,16,32;64,16,32;;2048,2048;4;4;;;;;;;;4,32",'
             'FLOAT;FLOAT;FLOAT;DT_UNDEFINED;INT8;INT64;INT64;DT_UNDEFINED;DT_UNDEFINED;'
             'DT_UNDEFINED;DT_UNDEFINED;DT_UNDEFINED;DT_UNDEFINED;DT_UNDEFINED;INT32,'
             'ND;ND;ND;NULL;ND;ND;ND;NULL;NULL;NULL;NULL;NULL;NULL;NULL;ND,"4,4,16;",'
             'FLOAT;FLOAT,ND;ND,,,,,100')


@pytest.fixture
def moe_config(tmp_path):
    path = tmp_path / "moe" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY_MOE))
    return path


def _case(ktype, shapes, dtypes, formats="", runtime=()):
    return ReplayCase(f"{ktype}#0", spec_for(ktype), parse_shapes(shapes), split_list(dtypes),
                      split_list(formats), (), tuple(runtime))


# -- GroupedMatmul ---------------------------------------------------------------------
def test_grouped_matmul_axes_read_nd_and_fractal_nz_weights():
    spec = spec_for("GroupedMatmul")
    assert axes_of(spec, parse_shapes("24,2048;16,2048,1536;;;;;;16")) == \
        {"m": 24, "k": 2048, "n": 1536, "experts": 16}
    # bf16 NZ weight (E, n/16, k/16, 16, 16) restores to (E, n, k)
    assert axes_of(spec, parse_shapes("24,2048;16,96,128,16,16;;;;;;16"),
                   split_list("ND;FRACTAL_NZ;;;;;;ND")) == \
        {"m": 24, "k": 2048, "n": 1536, "experts": 16}


def test_grouped_gemm_points_cover_ep_and_tp_shards(moe_config):
    spec = load_model_spec(moe_config)
    # ep 1/2/4: 8/4/2 experts of width 32; tp 2: 8 experts of width 16
    # gate_up (n=2I, k=H=64), down (n=64, k=I)
    assert grouped_gemm_points([spec], tp_sizes=(1, 2), ep_sizes=(1, 2, 4)) == {
        (8, 64, 64), (8, 64, 32), (4, 64, 64), (4, 64, 32), (2, 64, 64), (2, 64, 32),
        (8, 32, 64), (8, 64, 16)}
    from dataclasses import replace

    from perfcast.core.frozen import FrozenDict

    assert grouped_gemm_points([replace(spec, raw=FrozenDict())]) == set()  # dense: none


def test_grid_writes_grouped_matmul_rows_in_the_template_layouts(tmp_path, moe_config):
    db = tmp_path / "db"
    db.mkdir()
    (db / "GroupedMatmul.csv").write_text(f"{HEADER}\n{GMM_ND}\n{GMM_NZ}\n")
    result = generate_grid(db, [str(moe_config)], rows=0, tp_sizes=(1, 2), ep_sizes=(1, 2, 4))
    # 8 (experts, n, k) points x the m grid x 2 templates, minus the 2 rows already there
    assert result.appended == {"GroupedMatmul": 2 * 8 * len(M_GRID) - 2}
    shapes = {r["Input Shapes"] for r in read_table(db / "GroupedMatmul.csv").rows}
    # 2 local experts, k=32 (down: width 32), n=64: group list follows the experts
    assert "16,32;2,32,64;;;;;;2" in shapes
    # the same in NZ tiles (E, n/16, k/16, 16, 16)
    assert "16,32;2,4,2,16,16;;;;;;2" in shapes
    new = read_table(db / "GroupedMatmul.csv").rows[2:]
    assert all(r["Average Duration(us)"] == "" for r in new)


def test_grouped_matmul_cpu_replay_splits_rows_evenly_over_experts():
    torch = pytest.importorskip("torch")
    from perfcast.collect.replay.torch_ops import _even_groups, build_call, make_slot_inputs

    assert _even_groups(10, 4) == [3, 3, 2, 2]
    case = _case("GroupedMatmul", "10,8;4,8,6;;4", "FLOAT;FLOAT;;INT64", "ND;ND;;ND")
    call = build_call(case, "cpu")
    x, w = [t for t in make_slot_inputs(case, "cpu") if t is not None][:2]
    out = call()
    ref = torch.cat([x[0:3] @ w[0], x[3:6] @ w[1], x[6:8] @ w[2], x[8:10] @ w[3]])
    assert out.shape == (10, 6) and torch.allclose(out, ref, atol=1e-5)


# -- FusedInferAttentionScore ------------------------------------------------------------
def test_fia_axes_of_recorded_rows(fixtures):
    table = read_table(fixtures / "fia_db" / "FusedInferAttentionScore.csv")
    spec = spec_for("FusedInferAttentionScore")

    def axes(i):
        r = table.rows[i]
        return axes_of(spec, parse_shapes(r["Input Shapes"]), split_list(r["Input Formats"]), r)

    # decode: 128 requests, one token each, paged cache (12307 blocks, 128, 1 kv head x 128)
    assert axes(0) == {"q_tokens_total": 128, "heads": 4, "head_dim": 128, "kv_heads": 1,
                       "batch": 128, "q_tokens": 1, "phase": "decode", "kv_len": 4096}
    # prefill in TND without a block table: 24624 tokens over 7 requests (not divisible)
    assert axes(4) == {"q_tokens_total": 24624, "heads": 4, "head_dim": 128, "kv_heads": 1,
                       "kv_len": 3518}
    assert axes(6) is None          # BNSD (B, N, 1, D): not the TND layout
    assert axes(9) is None          # avg_seq_len -1: no usable length


def test_grid_writes_fia_rows_with_avg_seq_len(tmp_path, fixtures):
    db = tmp_path / "db"
    shutil.copytree(fixtures / "fia_db", db)
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY_MOE, "num_attention_heads": 32, "num_key_value_heads": 4,
                               "head_dim": 128, "hidden_size": 4096}))
    generate_grid(db, [str(cfg)], rows=0, tp_sizes=(8,), max_memory_gb=0)
    rows = read_table(db / "FusedInferAttentionScore.csv").rows[10:]
    by_key = {(r["Input Shapes"], r["avg_seq_len"]) for r in rows}
    # decode, batch 2, kv 16: the template's pool (12307 x 128 x 1*128) and table width 512
    assert ("2,4,128;12307,128,128;12307,128,128;;2048,2048;2;2;;;;;;;;2,512;;;;;;;;;;;;;;;;",
            "16") in by_key
    # prefill batch 256 x 32768: the pool grows to 256 * 256 blocks, the table to 256 wide
    # (from the paged template) ...
    assert ("8388608,4,128;65536,128,128;65536,128,128;;2048,2048;256;256;;;;;;;;256,512;;;;;"
            ";;;;;;;;;;;", "32768") in by_key
    # ... and in TND without a table: K (B*kv, kv heads, D)
    assert ("64,4,128;64,1,128;64,1,128;;2048,2048;4;4;;;;;;;;;;;;;;;;;;;;;;;;", "16") in by_key
    assert all(r["Output Shapes"].endswith(";") for r in rows)   # (T, N, D) and an empty lse


def test_fia_cpu_replay_matches_attention_over_each_requests_blocks():
    torch = pytest.importorskip("torch")
    from perfcast.collect.replay.torch_ops import build_call, make_slot_inputs

    # 2 requests x 1 query token, 4 heads over 2 kv heads, D 8; cache 5 blocks of 4 tokens;
    # kv_len 6 -> 2 blocks per request: request 0 reads blocks 0,1, request 1 blocks 2,3
    case = _case("FusedInferAttentionScore", "2,4,8;5,4,16;5,4,16;;;2;2;;;;;;;;2,3",
                 "FLOAT;FLOAT;FLOAT;;;INT64;INT64;;;;;;;;INT32", runtime=[("avg_seq_len", "6")])
    out = build_call(case, "cpu")()
    slots = make_slot_inputs(case, "cpu")
    q, kc, vc = slots[0], slots[1], slots[2]
    for r in range(2):
        k = kc[2 * r:2 * r + 2].reshape(8, 2, 8)[:6]       # (kv, kv heads, D)
        v = vc[2 * r:2 * r + 2].reshape(8, 2, 8)[:6]
        for h in range(4):
            kvh = h // 2
            p = torch.softmax(q[r, h] @ k[:, kvh].T / 8 ** 0.5, dim=-1)
            assert torch.allclose(out[r, h, 0], p @ v[:, kvh], atol=1e-5)


def test_fia_replay_without_avg_seq_len_is_not_replayable():
    pytest.importorskip("torch")
    from perfcast.collect.replay.torch_ops import NotReplayable, build_call

    case = _case("FusedInferAttentionScore", "2,4,8;5,4,16;5,4,16;;;2;2;;;;;;;;2,3",
                 "FLOAT;FLOAT;FLOAT;;;INT64;INT64;;;;;;;;INT32")
    with pytest.raises(NotReplayable, match="avg_seq_len"):
        build_call(case, "cpu")


def test_grid_then_cpu_replay_fills_fia_and_grouped_matmul_rows(tmp_path, moe_config):
    pytest.importorskip("torch")
    from perfcast.collect.replay import CpuBackend, ReplaySettings, replay_database

    db = tmp_path / "db"
    db.mkdir()
    (db / "GroupedMatmul.csv").write_text(f"{HEADER}\n{GMM_ND}\n")
    (db / "FusedInferAttentionScore.csv").write_text(f"{HEADER},avg_seq_len\n{FIA_PAGED}\n")
    generate_grid(db, [str(moe_config)], rows=3, seed=1, tp_sizes=(1,), ep_sizes=(4,),
                  max_memory_gb=0.01)
    run = replay_database(db, CpuBackend(num_threads=1), update_mode="missing-only",
                          settings=ReplaySettings(repeat_count=2, warmup=0))
    assert len(run.results) == 7 and not run.failed, [r.outcome.error for r in run.failed]
    for name in ("GroupedMatmul", "FusedInferAttentionScore"):
        rows = read_table(db / f"{name}.csv").rows
        assert all(float(r["Average Duration(us)"]) > 0 for r in rows)
        assert sum(r.get("MicroBench Backend") == "cpu" for r in rows) == len(rows) - 1 + (
            name == "FusedInferAttentionScore")


def test_fia_rows_import_with_kv_len_from_avg_seq_len(fixtures):
    from perfcast.collect.evidence import collected_records

    recs = collected_records(fixtures / "fia_db", hardware="atlas_800_a3_752t_128g_die",
                             operations=("attention",))
    decode = sorted((r.selector["batch"], r.selector["kv_len"], round(r.latency_s * 1e6, 1))
                    for r in recs if r.selector.get("phase") == "decode")
    # rows 1-4 and 9 (4096, 8192); the -1 row and the BNSD rows are left out
    assert decode == [(128, 4096, 58.2), (128, 8192, 120.5), (160, 2048, 59.0),
                      (336, 4096, 60.1), (496, 4096, 64.2)]


def test_without_target_models_the_grid_is_the_full_one(tmp_path):
    from perfcast.workload.model_spec import builtin_models

    db = tmp_path / "db"
    db.mkdir()
    (db / "GroupedMatmul.csv").write_text(f"{HEADER}\n{GMM_ND}\n")
    result = generate_grid(db, [], rows=0, tp_sizes=(1,), ep_sizes=(8,), max_memory_gb=0)
    moe = [load_model_spec(m) for m in builtin_models()]
    points = grouped_gemm_points(moe, (1,), (8,))
    assert len(points) > 10                      # several built-in MoE models
    assert result.appended == {"GroupedMatmul": len(points) * len(M_GRID)}


def test_replayed_fia_grid_rows_answer_the_attention_lookup(tmp_path):
    pytest.importorskip("torch")
    from perfcast.collect.replay import CpuBackend, ReplaySettings, replay_database
    from perfcast.core.frozen import FrozenDict
    from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
    from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
    from perfcast.hardware import load_system
    from perfcast.workload.tensors import TensorSpec

    db = tmp_path / "db"
    db.mkdir()
    bf16 = FIA_PAGED.replace("FLOAT;FLOAT;FLOAT;", "DT_BF16;DT_BF16;DT_BF16;").replace(
        "FLOAT;FLOAT,ND;ND", "DT_BF16;FLOAT,ND;ND").replace(",,,,,100", ",9,9,0,3,100")
    (db / "FusedInferAttentionScore.csv").write_text(f"{HEADER},avg_seq_len\n{bf16}\n")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**TINY_MOE, "model_type": "llama"}))
    # the per-kernel-type grid (no mapping yet: with one, the grid writes the queried rows)
    generate_grid(db, [str(cfg)], rows=4, seed=5, tp_sizes=(1,), max_memory_gb=0.006)
    (db / "op_mapping.yaml").write_text(
        'operator_mappings:\n  "tensor_cast.attention.default":\n'
        '    kernel_type: FusedInferAttentionScore\n    query_mode: attention_special\n')
    run = replay_database(db, CpuBackend(num_threads=1), update_mode="missing-only",
                          settings=ReplaySettings(repeat_count=2, warmup=0), device="local_cpu")
    assert len(run.replayed) == 4 and not run.failed
    cpu = ProfilingDataSource(db, load_system(Path(__file__).parent / "fixtures" / "local_cpu.yaml"))
    npu = ProfilingDataSource(db, load_system("atlas_800_a3_752t_128g_die"))
    for row in read_table(db / "FusedInferAttentionScore.csv").rows[1:]:
        q = parse_shapes(row["Input Shapes"])[0]
        kv = int(row["avg_seq_len"])
        call = OpInvokeInfo("tensor_cast.attention.default",
                            (TensorSpec(q, "bf16"), TensorSpec((1, kv, 1, 16), "bf16")),
                            (), FrozenDict(kv_len=kv, head_dim=16))
        assert cpu.lookup(call).latency_us == pytest.approx(float(row["Average Duration(us)"]))
        # CPU timings never answer for the Ascend device
        assert npu.lookup(call).reason == "shape_mismatch"


def test_fia_row_without_kv_slots_is_no_template(tmp_path, moe_config):
    db = tmp_path / "db"
    db.mkdir()
    (db / "FusedInferAttentionScore.csv").write_text(
        f'{HEADER},avg_seq_len\ndynamic,MIX_AIC,"4,4,16",FLOAT,ND,"4,4,16",FLOAT,ND,5,5,0,1,64\n')
    assert generate_grid(db, [str(moe_config)], rows=0, tp_sizes=(1,)).appended == {}
