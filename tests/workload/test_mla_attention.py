"""Multi-head latent attention: compressed cache, naive vs absorbed forms."""

from dataclasses import replace

import pytest

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import freeze
from perfcast.workload import Batch, BatchSegment, ParallelPlan, Precision, build_task_graph
from perfcast.workload import load_model_spec

V3 = "deepseek-ai/DeepSeek-V3"
BF16 = Precision.uniform("bf16")


def graph(plan=ParallelPlan(), batch=Batch.decode(16, 1024), model=V3, **kw):
    return build_task_graph(load_model_spec(model), plan, batch, **kw)


def task(g, lineage):
    return next(t for t in g.tasks if t.lineage == lineage)


@pytest.mark.parametrize("plan", [ParallelPlan(), ParallelPlan(tp=8), ParallelPlan(tp=2, dp=4, ep=8)])
@pytest.mark.parametrize("kv_dtype,nbytes", [("bf16", 2), ("fp8", 1)])
def test_kv_cache_bytes_per_token(plan, kv_dtype, nbytes):
    prec = Precision(kv_cache=kv_dtype)
    g = graph(plan, precision=prec)
    per_token = (512 + 64) * nbytes * 61  # latent + rope key, once per layer
    assert g.memory.kv_bytes_per_token == ((0, per_token),)
    # the latent is not split over TP ranks; DP ranks each hold their share of requests
    requests = 16 // plan.dp
    assert g.memory.kv_cache == requests * 1025 * per_token


def test_decode_uses_absorbed_form():
    g = graph(precision=BF16)
    core = task(g, "L3-60.mla.core")
    assert core.work.axes["mla_form"] == "absorbed"
    assert core.operator == "tensor_cast.multihead_latent_attention.default"
    assert core.operation == "mla_attention"
    assert core.work.axes["kv_heads"] == 1
    # FLOPs: 2 * heads * (qk + v) per (query, key) pair, in latent space
    assert core.work.flops == 2 * 128 * (576 + 512) * 16 * 1025
    # the latent cache is read once (K and V share it): 16 requests x 1025 tokens x 576
    q_bytes = 16 * 128 * 576 * 2
    assert core.work.bytes_read == q_bytes + 16 * 1025 * 576 * 2
    qab = task(g, "L3-60.mla.q_absorb")
    assert (qab.work.axes["batch"], qab.work.axes["m"], qab.work.axes["k"],
            qab.work.axes["n"]) == (128, 16, 128, 512)
    assert "L3-60.mla.kv_b_proj" not in {t.lineage for t in g.tasks}


def test_prefill_uses_naive_form_decompressing_the_context():
    g = graph(batch=Batch.prefill(2, 512, context_length=1024), precision=BF16)
    kvb = task(g, "L3-60.mla.kv_b_proj")
    assert (kvb.work.axes["m"], kvb.work.axes["n"], kvb.work.axes["k"]) == (
        2 * (1024 + 512), 128 * (128 + 128), 512)
    core = task(g, "L3-60.mla.core")
    assert core.work.axes["mla_form"] == "naive"
    assert core.work.axes["kv_heads"] == 128
    assert {t.lineage for t in g.tasks}.isdisjoint({"L3-60.mla.q_absorb", "L3-60.mla.out_absorb"})


def test_forced_forms_and_unknown_form():
    assert task(graph(mla_form="naive"), "L3-60.mla.core").work.axes["mla_form"] == "naive"
    g = graph(batch=Batch.prefill(1, 64), mla_form="absorbed")
    assert task(g, "L3-60.mla.core").work.axes["mla_form"] == "absorbed"
    with pytest.raises(ConfigError, match="mla_form"):
        graph(mla_form="fused")


def test_kv_b_weights_counted_once_in_either_form_and_in_mixed_steps():
    mixed = Batch.mixed((BatchSegment(2, 256, 0), BatchSegment(8, 1, 512)))
    counts = {graph(batch=b).param_count() for b in (Batch.decode(4, 100), Batch.prefill(1, 64),
                                                     mixed)}
    assert len(counts) == 1
    g = graph(batch=mixed)
    assert {"L3-60.mla.kv_b_proj.prefill0", "L3-60.mla.q_absorb.decode1",
            "L3-60.mla.core.decode1"} <= {t.lineage for t in g.tasks}


def test_tp_replicates_down_projections_but_splits_heads():
    g = graph(ParallelPlan(tp=8))
    qa, qb = task(g, "L3-60.mla.q_a_proj"), task(g, "L3-60.mla.q_b_proj")
    assert qa.work.axes["n"] == 1536 and qa.attributes["replicas"] == 8
    assert qb.work.axes["n"] == 16 * 192  # 128 heads / 8
    core = task(g, "L3-60.mla.core")
    # per-device heads plus the TP degree, as AIConfigurator's MLA tables key them
    assert (core.work.axes["heads"], core.work.axes["tp_size"]) == (16, 8)


def test_missing_mla_field_is_named():
    m = load_model_spec(V3)
    raw = dict(m.raw)
    del raw["kv_lora_rank"]
    broken = replace(m, raw=freeze(raw))
    with pytest.raises(ConfigError, match="kv_lora_rank"):
        build_task_graph(broken, ParallelPlan(), Batch.decode(1, 10))


def test_kimi_k2_uses_mla_with_384_experts():
    g = graph(ParallelPlan(dp=8, ep=8), model="moonshotai/Kimi-K2-Instruct")
    assert task(g, "L1-60.moe.experts").work.axes["local_experts"] == 48
    assert task(g, "L0.mlp.down_proj").count == 1  # first_k_dense_replace = 1
    assert g.param_count() == pytest.approx(1.03e12, rel=0.01)  # "1T total" (1.03T)
    assert g.param_count(active=True, embedding=False) == pytest.approx(32e9, rel=0.02)


def test_mtp_module_is_counted_when_requested():
    base = graph()
    mtp = graph(mtp_layers=1)
    lineages = {t.lineage for t in mtp.tasks}
    assert {"mtp0.eh_proj", "L61.mla.core", "L61.moe.experts", "mtp0.lm_head"} <= lineages
    # DeepSeek: 671B main model + ~11.7B of MTP layer and eh_proj (head/embedding shared)
    extra = mtp.param_count() - base.param_count()
    assert extra == pytest.approx(11.5e9 + 2 * 7168 * 7168, rel=0.02)
    with pytest.raises(ConfigError, match="num_nextn_predict_layers"):
        graph(mtp_layers=2)


# -- TensorCast's call layout (mla_call="tensorcast") ------------------------------------
TC_STEPS = [(ParallelPlan(tp=16, ep=16), Batch.decode(8, 1024)),
            (ParallelPlan(tp=8), Batch.decode(4, 2048)),
            (ParallelPlan(tp=8), Batch.prefill(2, 512, context_length=1024)),
            (ParallelPlan(tp=4), Batch.mixed((BatchSegment(2, 256, 0), BatchSegment(8, 1, 512))))]


@pytest.mark.parametrize("model", [V3, "deepseek-ai/DeepSeek-V3.2"])
@pytest.mark.parametrize("plan,batch", TC_STEPS)
def test_tensorcast_layout_is_the_same_work(model, plan, batch):
    split = graph(plan, batch, model=model)
    tc = graph(plan, batch, model=model, mla_call="tensorcast")
    assert tc.total_flops() == split.total_flops()
    assert tc.total_bytes() == split.total_bytes()
    assert tc.unique_flops() == pytest.approx(split.unique_flops(), rel=1e-12)
    assert tc.param_count() == pytest.approx(split.param_count(), rel=1e-12)
    assert tc.memory == split.memory
    assert len(tc.tasks) < len(split.tasks)


def test_tensorcast_layout_calls_what_tensorcast_records():
    # DeepSeek-V3 TP16/EP16 decode of 8 requests over 1,024 cached tokens: the three MLA
    # calls with the input shapes TensorCast's `--dump-input-shapes` records for it
    g = graph(ParallelPlan(tp=16, ep=16), Batch.decode(8, 1024), mla_call="tensorcast")
    mlapo, cache, core = (task(g, "L3-60.mla." + n) for n in ("mlapo", "kv_cache_write", "core"))
    assert mlapo.operator == "tensor_cast.mlapo.default"
    assert [t.shape for t in mlapo.inputs] == [
        (8, 7168), (1, 8, 64), (1, 8, 64), (1536, 7168), (1536,), (1536, 1536), (576, 7168),
        (512,)]
    assert [t.shape for t in mlapo.outputs] == [(8, 8, 192), (8, 512), (8, 64), (8, 1536)]
    assert cache.operator == "tensor_cast.concat_and_cache_mla.default"
    assert [(t.shape, t.dtype) for t in cache.inputs][2:] == [((65, 128, 576), "bf16"),
                                                              ((8,), "int64")]
    assert core.operator == "tensor_cast.multihead_latent_attention.default"
    assert [t.shape for t in core.inputs] == [
        (8, 8, 192), (65, 128, 576), (8, 9), (9,), (8,), (8,), (8, 128, 512), (8, 512, 128),
        (512, 2048)]
    assert [t.shape for t in core.outputs] == [(8, 8, 128)]
    assert core.work.axes["projections_in_call"] == 1
    assert core.attributes["fused_parts"] == "mla.q_absorb,mla.core,mla.out_absorb"
    assert {"L3-60.mla.q_absorb", "L3-60.mla.q_a_proj"}.isdisjoint(t.lineage for t in g.tasks)
    # the split layout marks its core as attention only
    assert task(graph(ParallelPlan(tp=16, ep=16), Batch.decode(8, 1024)),
                "L3-60.mla.core").work.axes["projections_in_call"] == 0


def test_tensorcast_layout_without_q_lora_and_unknown_layout():
    m = load_model_spec(V3)
    raw = dict(m.raw)
    raw["q_lora_rank"] = None
    no_lora = replace(m, raw=freeze(raw))
    g = build_task_graph(no_lora, ParallelPlan(tp=8), Batch.decode(4, 100), mla_call="tensorcast")
    mlapo = task(g, "L3-60.mla.mlapo")
    # hidden, cos, sin, q_proj (H*192, h), kv_a_proj, kv norm weight
    assert [t.shape for t in mlapo.inputs] == [(4, 7168), (1, 4, 64), (1, 4, 64),
                                               (16 * 192, 7168), (576, 7168), (512,)]
    assert len(mlapo.outputs) == 3
    with pytest.raises(ConfigError, match="mla_call"):
        graph(mla_call="fused")
