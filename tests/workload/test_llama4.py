"""Llama-4: interleaved MoE/dense layers, chunked local attention, global NoPE layers."""

import pytest

from perfcast.workload import Batch, ParallelPlan, Precision, build_task_graph
from perfcast.workload import load_model_spec
from perfcast.workload.graph import chunked_pairs

SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
MAVERICK = "meta-llama/Llama-4-Maverick-17B-128E-Instruct"
BF16 = Precision.uniform("bf16")
C = 8192  # attention_chunk_size


def graph(model, batch=Batch.decode(4, 20000), plan=ParallelPlan()):
    return build_task_graph(load_model_spec(model), plan, batch, precision=BF16)


def test_param_counts_match_published_totals():
    # Llama 4 model card: Maverick 400B total / 17B active, Scout 109B total / 17B active
    # (the card's totals include the vision encoder, which perfcast does not build)
    assert graph(MAVERICK).param_count() == pytest.approx(400e9, rel=0.01)
    assert graph(SCOUT).param_count() == pytest.approx(109e9, rel=0.02)
    for model in (SCOUT, MAVERICK):
        assert graph(model).param_count(active=True) == pytest.approx(17e9, rel=0.02)


def test_chunked_pairs_by_hand():
    assert chunked_pairs(1, 20000, C) == 20000 % C + 1
    assert chunked_pairs(C, 0, C) == C * (C + 1) / 2
    assert chunked_pairs(3 * C, 0, C) == 3 * C * (C + 1) / 2
    assert chunked_pairs(10, 5, 8) == sum(((p - 1) % 8) + 1 for p in range(6, 16))


def test_layout_and_chunked_attention_work():
    g = graph(MAVERICK)
    lineages = {t.lineage for t in g.tasks}
    # dense layers 0, 2, ...; MoE layers 1, 3, ...; every 4th layer global NoPE
    assert {"L0-46:2.mlp.gate_up_proj", "L1-45:4.moe.experts", "L3-47:4.moe.experts",
            "L3-47:4.attn.core"} <= lineages
    local = next(t for t in g.tasks if t.lineage == "L1-45:4.attn.core")
    glob = next(t for t in g.tasks if t.lineage == "L3-47:4.attn.core")
    assert local.work.flops == 2 * 40 * 256 * 4 * (20000 % C + 1)
    assert glob.work.flops == 2 * 40 * 256 * 4 * 20001
    assert local.work.axes["attention_chunk"] == C and "attention_chunk" not in glob.work.axes
    # the cache of a chunked layer holds at most one chunk per request
    per_token = 8 * 128 * 2 * 2
    assert g.memory.kv_bytes_per_token == ((0, 12 * per_token), (C, 36 * per_token))
    assert g.memory.kv_bytes_per_request(100000) == 12 * per_token * 100000 + 36 * per_token * C


def test_chunked_decode_work_periodic_in_context():
    a = next(t for t in graph(SCOUT, Batch.decode(2, 1000)).tasks
             if t.lineage == "L0-2.attn.core")
    b = next(t for t in graph(SCOUT, Batch.decode(2, 1000 + 3 * C)).tasks
             if t.lineage == "L0-2.attn.core")
    assert (a.work.flops, a.work.bytes_read) == (b.work.flops, b.work.bytes_read)
