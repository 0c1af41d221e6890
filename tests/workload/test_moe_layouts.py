"""MoE work under TP, EP, attention DP and PP: conservation, top-k scaling, dispatch."""

from dataclasses import replace

import pytest

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import freeze
from perfcast.workload import Batch, BatchSegment, ParallelPlan, build_task_graph, load_model_spec

LAYOUTS = [
    ParallelPlan(tp=8), ParallelPlan(tp=8, ep=8), ParallelPlan(dp=8, ep=8),
    ParallelPlan(tp=2, dp=4, ep=8), ParallelPlan(tp=2, dp=4, ep=4),
    ParallelPlan(tp=4, pp=2), ParallelPlan(dp=4, ep=4, moe_dispatch="all_gather"),
    ParallelPlan(tp=2, dp=2, ep=2, moe_tp=2), ParallelPlan(dp=2, pp=2, ep=2),
    ParallelPlan(tp=4, sp=True), ParallelPlan(tp=2, dp=2, ep=4, sp=True),
    ParallelPlan(tp=2, dp=2, ep=2, moe_tp=2, sp=True),
]
BATCHES = [
    Batch.decode(64, 2048),
    Batch.prefill(8, 512),
    Batch.mixed((BatchSegment(8, 256, 512), BatchSegment(16, 1, 1000))),
]
MODELS = ["deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-235B-A22B", "openai/gpt-oss-120b",
          "mistralai/Mixtral-8x7B-v0.1", "MiniMaxAI/MiniMax-M2.5"]


def graph(model_id, plan=ParallelPlan(), batch=BATCHES[0], **kw):
    return build_task_graph(load_model_spec(model_id), plan, batch, **kw)


def task(g, lineage):
    return next(t for t in g.tasks if t.lineage == lineage)


@pytest.mark.parametrize("model_id", MODELS)
@pytest.mark.parametrize("batch", BATCHES, ids=["decode", "prefill", "mixed"])
def test_flops_are_conserved_across_layouts(model_id, batch):
    m = load_model_spec(model_id)
    single = build_task_graph(m, ParallelPlan(), batch)
    assert single.total_flops() == single.unique_flops()
    for plan in LAYOUTS:
        if m.num_kv_heads < plan.tp or m.model_type == "gpt_oss" and plan.tp > 8:
            continue
        g = build_task_graph(m, plan, batch)
        assert g.unique_flops() == pytest.approx(single.total_flops(), rel=1e-9), plan
        assert g.total_flops() >= g.unique_flops()


def test_attention_dp_without_tp_replicates_nothing():
    g = graph("deepseek-ai/DeepSeek-V3", ParallelPlan(dp=8, ep=8))
    single = graph("deepseek-ai/DeepSeek-V3")
    assert g.total_flops() == pytest.approx(single.total_flops(), rel=1e-9)
    # every DP rank holds 64 / 8 requests
    assert task(g, "L3-60.mla.core").work.axes["batch"] == 8
    assert task(g, "L3-60.mla.core").devices == 8


def test_expert_flops_scale_with_topk_not_with_expert_count():
    m = load_model_spec("Qwen/Qwen3-235B-A22B")
    tokens, h, inter = 64, 4096, 1536

    def expert_flops(**changes):
        spec = replace(m, raw=freeze({**m.raw, **changes}))
        t = task(build_task_graph(spec, ParallelPlan(), Batch.decode(tokens, 100)),
                 "L0-93.moe.experts")
        return t.work.flops

    base = expert_flops()
    # hand count: per routed row 2*h*2*inter (gate/up) + 2*inter*h (down) + 5*inter (SwiGLU)
    assert base == tokens * 8 * (2 * h * 2 * inter + 2 * inter * h + 5 * inter)
    assert expert_flops(num_experts=256) == base
    assert expert_flops(num_experts_per_tok=16) == 2 * base


def test_expert_weight_reads_follow_active_experts():
    # one decode token activates 8 of 128 experts: only their weights are read
    g = graph("Qwen/Qwen3-235B-A22B", batch=Batch.decode(1, 100))
    t = task(g, "L0-93.moe.experts")
    per_expert_bytes = 3 * 4096 * 1536 * 2
    assert t.attributes["active_local_experts"] == pytest.approx(8.0)
    assert t.work.bytes_read == pytest.approx(8 * per_expert_bytes, rel=0.01)
    big = task(graph("Qwen/Qwen3-235B-A22B", batch=Batch.decode(4096, 100)), "L0-93.moe.experts")
    assert big.attributes["active_local_experts"] == pytest.approx(128.0, rel=1e-6)


def test_ep_dispatch_message_bytes_and_axes():
    # DeepSeek-V3 fp8 experts: DP8 x EP8, 256 requests -> 32 tokens per device, top-8,
    # dispatched in fp8 (1 byte), combined in bf16 (2 bytes)
    g = graph("deepseek-ai/DeepSeek-V3", ParallelPlan(dp=8, ep=8), Batch.decode(256, 4096))
    disp = task(g, "L3-60.moe.dispatch")
    comb = task(g, "L3-60.moe.combine")
    assert disp.operator == "tensor_cast.all_to_all.default"
    assert disp.work.message_bytes == 32 * 8 * 7168 * 1
    assert comb.work.message_bytes == 32 * 8 * 7168 * 2
    assert disp.work.participants == 8
    ex = task(g, "L3-60.moe.experts")
    axes = ex.work.axes
    assert (axes["tokens"], axes["hidden_size"], axes["inter_size"], axes["topk"],
            axes["num_experts"], axes["moe_ep"], axes["moe_tp"], axes["local_experts"],
            axes["distribution"]) == (256, 7168, 2048, 8, 256, 8, 1, 32, "balanced")
    assert ex.attributes["routed_rows"] == 256 * 8 / 8
    assert ex.operation == "moe"
    assert ex.operator == "tensor_cast.grouped_matmul_fp8.default"


def test_tp_moe_uses_all_reduce_and_no_dispatch():
    g = graph("Qwen/Qwen3-235B-A22B", ParallelPlan(tp=4))
    groups = {t.group for t in g.tasks}
    assert "moe.all_reduce" in groups and "moe.dispatch" not in groups
    ex = task(g, "L0-93.moe.experts")
    assert ex.work.axes["moe_tp"] == 4 and ex.work.axes["m"] == 64 * 8


def test_expert_imbalance_loads_the_busiest_rank():
    even = task(graph("deepseek-ai/DeepSeek-V3", ParallelPlan(dp=8, ep=8)), "L3-60.moe.experts")
    skew = task(graph("deepseek-ai/DeepSeek-V3", ParallelPlan(dp=8, ep=8, expert_imbalance=1.5)),
                "L3-60.moe.experts")
    assert skew.attributes["routed_rows"] == 1.5 * even.attributes["routed_rows"]
    assert skew.work.axes["distribution"] == "imbalance_1.5"


def test_dense_first_layers_and_lineage():
    g = graph("deepseek-ai/DeepSeek-V3")
    lineages = {t.lineage for t in g.tasks}
    assert {"L0-2.mlp.gate_up_proj", "L3-60.moe.experts", "L3-60.moe.router",
            "L0-2.mla.kv_a_proj", "L3-60.moe.shared_experts.down_proj"} <= lineages
    assert task(g, "L0-2.mlp.gate_up_proj").work.axes["n"] == 2 * 18432


def test_gpt_oss_alternates_sliding_and_full_attention():
    g = graph("openai/gpt-oss-120b", batch=Batch.decode(4, 1000))
    sliding, full = task(g, "L0-34:2.attn.core"), task(g, "L1-35:2.attn.core")
    assert sliding.count == full.count == 18
    assert sliding.work.axes["window"] == 128 and "window" not in full.work.axes
    assert sliding.attributes["attention_sinks"] and sliding.work.axes["sinks"]
    # decode over 1000 cached tokens: the sliding layer attends to 128 keys
    assert sliding.work.flops * 1001 == pytest.approx(full.work.flops * 128)


def test_layout_errors_name_the_constraint():
    with pytest.raises(ConfigError, match="moe_tp_size"):
        graph("deepseek-ai/DeepSeek-V3", ParallelPlan(tp=8, ep=4, moe_tp=4))
    with pytest.raises(ConfigError, match="ep_size=3 does not divide"):
        graph("deepseek-ai/DeepSeek-V3", ParallelPlan(tp=8, ep=3))
    with pytest.raises(ConfigError, match="ep_size=16 exceeds the 8 routed experts"):
        graph("mistralai/Mixtral-8x7B-v0.1", ParallelPlan(dp=16, ep=16))
    with pytest.raises(ConfigError, match="num_attention_heads=64 is not divisible by tp_size=3"):
        graph("Qwen/Qwen3-235B-A22B", ParallelPlan(tp=3))
    with pytest.raises(ConfigError, match="all_to_all dispatch needs moe_tp_size=1"):
        graph("deepseek-ai/DeepSeek-V3", ParallelPlan(tp=2, dp=2, ep=2, moe_tp=2,
                                                       moe_dispatch="all_to_all"))
    with pytest.raises(ConfigError, match="expert_imbalance"):
        ParallelPlan(expert_imbalance=0.5)


def test_pipeline_stages_send_and_split_moe_layers():
    g = graph("deepseek-ai/DeepSeek-V3", ParallelPlan(dp=4, ep=4, pp=2))
    send = task(g, "pp.send_recv.stage1")
    assert send.work.message_bytes == 16 * 7168 * 2  # 64 requests / 4 DP ranks, bf16
    assert {t.stage for t in g.tasks if t.group == "moe.experts"} == {0, 1}
    assert task(g, "L3-30.moe.experts").count + task(g, "L31-60.moe.experts").count == 58


def test_sequence_parallel_norms_and_collectives():
    # Llama-3.1-8B, TP4 with SP, prefill of 2 x 512 tokens: norms see 1/4 of the tokens;
    # each all-reduce becomes a reduce-scatter, and an all-gather precedes each block
    g = graph("meta-llama/Llama-3.1-8B", ParallelPlan(tp=4, sp=True), Batch.prefill(2, 512))
    groups = {t.group for t in g.tasks}
    assert {"attn.reduce_scatter", "mlp.reduce_scatter", "attn.sp_all_gather",
            "mlp.sp_all_gather", "embed.reduce_scatter"} <= groups
    assert not {"attn.all_reduce", "mlp.all_reduce"} & groups
    norm = task(g, "L0-31.attn.input_norm")
    assert norm.work.axes["tokens"] == 1024 // 4 and "replicas" not in norm.attributes
    rs = task(g, "L0-31.attn.reduce_scatter")
    ag = task(g, "L0-31.mlp.sp_all_gather")
    assert rs.work.message_bytes == ag.work.message_bytes == 1024 * 4096 * 2
    plain = graph("meta-llama/Llama-3.1-8B", ParallelPlan(tp=4), Batch.prefill(2, 512))
    assert task(plain, "L0-31.attn.input_norm").attributes["replicas"] == 4


def test_uneven_dp_split_keeps_the_true_moe_token_count():
    # one long prefill on 8 attention-DP ranks: the busiest rank holds the request,
    # the experts still see 4096 tokens in total, not 8 x 4096
    g = graph("Qwen/Qwen3-235B-A22B", ParallelPlan(dp=8, ep=8), Batch.prefill(1, 4096))
    ex = task(g, "L0-93.moe.experts")
    assert ex.work.axes["tokens"] == 4096
    assert ex.attributes["routed_rows"] == 4096 * 8 / 8
    assert task(g, "L0-93.attn.core").work.axes["batch"] == 1
