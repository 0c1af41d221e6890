"""MiMo-V2-Flash: sliding/global GQA with per-kind shapes and sinks, routed experts."""

import pytest

from perfcast.workload import Batch, ParallelPlan, Precision, build_task_graph
from perfcast.workload import load_model_spec

FLASH = "XiaomiMiMo/MiMo-V2-Flash"
BF16 = Precision.uniform("bf16")


def graph(batch=Batch.decode(4, 20000), plan=ParallelPlan()):
    return build_task_graph(load_model_spec(FLASH), plan, batch, precision=BF16)


def core(g, lineage):
    return next(t for t in g.tasks if t.lineage == lineage)


def test_param_count_matches_published_total():
    # MiMo-V2-Flash model card: 309B total parameters, 15B active
    g = graph()
    assert g.param_count() == pytest.approx(309e9, rel=0.01)
    assert g.param_count(active=True, embedding=False) == pytest.approx(15e9, rel=0.02)


def test_per_kind_shapes_and_cache():
    g = graph()
    glob, swa = core(g, "L0.attn.core"), core(g, "L1-4.attn.core")
    assert (glob.work.axes["kv_heads"], swa.work.axes["kv_heads"]) == (4, 8)
    assert glob.work.axes["v_head_dim"] == swa.work.axes["v_head_dim"] == 128
    assert swa.attributes.get("attention_sinks") and not glob.attributes.get("attention_sinks")
    # decode FLOPs: 2 x 64 heads x (192 + 128) per attended key (window 128 on SWA)
    assert glob.work.flops == 2 * 64 * 320 * 4 * 20001
    assert swa.work.flops == 2 * 64 * 320 * 4 * 128
    # 9 global layers x 4 KV heads and 39 sliding layers x 8, each (192 + 128) x bf16
    assert g.memory.kv_bytes_per_token == ((0, 9 * 4 * 320 * 2), (128, 39 * 8 * 320 * 2))
    qkv = core(g, "L0.attn.qkv_proj")
    assert qkv.work.axes["n"] == 64 * 192 + 4 * (192 + 128)
    assert core(g, "L0.attn.o_proj").work.axes["k"] == 64 * 128


def test_work_conserved_over_tp():
    base = graph(Batch.prefill(2, 512))
    g = graph(Batch.prefill(2, 512), ParallelPlan(tp=4, ep=4))
    assert g.unique_flops() == pytest.approx(base.unique_flops(), rel=1e-9)
