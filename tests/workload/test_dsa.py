"""DeepSeek Sparse Attention: lightning indexer + sparse MLA (DeepSeek-V3.2, GLM-5)."""

import pytest

from perfcast.workload import Batch, ParallelPlan, Precision, build_task_graph
from perfcast.workload import load_model_spec
from perfcast.workload.graph import attended_pairs

V32 = "deepseek-ai/DeepSeek-V3.2"
GLM5 = "zai-org/GLM-5"
BF16 = Precision.uniform("bf16")
TOPK, HI, DI = 2048, 64, 128  # DeepSeek-V3.2 index_topk, index_n_heads, index_head_dim


def graph(model=V32, plan=ParallelPlan(), batch=Batch.decode(4, 4096), **kw):
    kw.setdefault("precision", BF16)
    return build_task_graph(load_model_spec(model), plan, batch, **kw)


def task(g, lineage):
    return next(t for t in g.tasks if t.lineage == lineage)


def test_param_counts_match_published_totals():
    # DeepSeek-V3.2(-Exp) report / model card: 671B main model (685B with the 14B MTP
    # module); GLM-5 announcement (Z.ai): 744B total, 40B active
    assert graph().param_count() == pytest.approx(671e9, rel=0.01)
    assert graph(mtp_layers=1).param_count() == pytest.approx(685e9, rel=0.01)
    glm = graph(GLM5)
    assert glm.param_count() == pytest.approx(744e9, rel=0.01)
    assert glm.param_count(active=True, embedding=False) == pytest.approx(40e9, rel=0.03)
    # the indexer adds wq_b (q_lora -> Hi x Di), wk (h -> Di), weights_proj (h -> Hi) and
    # the k LayerNorm (2 Di) to each of the 61 layers
    v3 = build_task_graph(load_model_spec("deepseek-ai/DeepSeek-V3"), ParallelPlan(),
                          Batch.decode(1, 10), precision=BF16)
    per_layer = 1536 * HI * DI + 7168 * DI + 7168 * HI + 2 * DI
    assert graph().param_count() - v3.param_count() == 61 * per_layer


@pytest.mark.parametrize("context", [4096, 16384, 65536])
def test_sparse_attention_flat_beyond_topk_indexer_linear(context):
    ref = graph(batch=Batch.decode(4, 4096))
    g = graph(batch=Batch.decode(4, context))
    core, core_ref = task(g, "L3-60.mla.core"), task(ref, "L3-60.mla.core")
    assert core.operation == "mla_sparse_attention"
    assert core.operator == "tensor_cast.mla_sparse_attention.default"
    assert (core.work.flops, core.work.bytes_read) == (core_ref.work.flops,
                                                       core_ref.work.bytes_read)
    # each decode query attends to exactly index_topk latent rows: 2 x 128 x (576 + 512)
    assert core.work.flops == 2 * 128 * (576 + 512) * 4 * TOPK
    idx, idx_ref = task(g, "L3-60.dsa.indexer"), task(ref, "L3-60.dsa.indexer")
    assert idx.work.flops == 4 * (context + 1) * (HI * (2 * DI + 3) + 1)
    assert idx.work.flops / idx_ref.work.flops == pytest.approx((context + 1) / 4097)


def test_below_topk_sparse_equals_dense_absorbed_mla():
    # with fewer cached tokens than index_topk every token is selected: same work as V3
    v3 = build_task_graph(load_model_spec("deepseek-ai/DeepSeek-V3"), ParallelPlan(),
                          Batch.decode(4, 1000), precision=BF16)
    g = graph(batch=Batch.decode(4, 1000))
    assert task(g, "L3-60.mla.core").work.flops == task(v3, "L3-60.mla.core").work.flops


def test_prefill_pairs_capped_at_topk():
    g = graph(batch=Batch.prefill(1, 8192))
    core = task(g, "L3-60.mla.core")
    pairs = attended_pairs(8192, 0, TOPK)
    assert pairs == TOPK * (TOPK + 1) / 2 + (8192 - TOPK) * TOPK
    assert core.work.flops == 2 * 128 * (576 + 512) * pairs
    assert core.work.axes["mla_form"] == "absorbed" and core.work.axes["index_topk"] == TOPK
    assert "L3-60.mla.kv_b_proj" not in {t.lineage for t in g.tasks}
    idx = task(g, "L3-60.dsa.indexer")
    assert idx.work.flops == 8192 * 8193 / 2 * (HI * (2 * DI + 3) + 1)


@pytest.mark.parametrize("kv,nbytes", [("bf16", 2), ("fp8", 1)])
def test_cache_holds_latent_and_indexer_keys(kv, nbytes):
    g = graph(precision=Precision(kv_cache=kv))
    # MLA latent (512 + 64) in the cache dtype + the indexer key: fp8 x 128 + fp32 scale
    per_token = 61 * ((512 + 64) * nbytes + DI + 4)
    assert g.memory.kv_bytes_per_token == ((0, per_token),)
    assert g.memory.kv_cache == 4 * 4097 * per_token


def test_indexer_replicated_over_tp_and_work_conserved():
    base = graph(batch=Batch.prefill(2, 1024))
    for plan in (ParallelPlan(tp=8), ParallelPlan(tp=2, dp=4, ep=8)):
        g = graph(plan=plan, batch=Batch.prefill(2 * plan.dp, 1024))
        assert g.unique_flops() == pytest.approx(base.unique_flops() * plan.dp, rel=1e-9)
        assert task(g, "L3-60.dsa.indexer").attributes["replicas"] == plan.tp
        assert task(g, "L3-60.mla.core").work.axes["heads"] == 128 // plan.tp


def test_glm52_shared_indexer_layers_have_no_indexer():
    m = load_model_spec("zai-org/GLM-5.2")
    g = build_task_graph(m, ParallelPlan(), Batch.decode(2, 8192), precision=BF16)
    full = sum(1 for t in m.raw["indexer_types"] if t == "full")
    assert sum(t.count for t in g.tasks if t.group == "dsa.indexer") == full
    assert sum(t.count for t in g.tasks if t.group == "mla.core") == 78
    assert g.memory.kv_bytes_per_token == ((0, 78 * 576 * 2 + full * (DI + 4)),)
