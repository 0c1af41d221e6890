"""Parameter counts reconstructed from the task graph vs. the publishers' figures.

Publishers differ on whether the input-embedding table is "activated" (a token reads one
row of it): Qwen counts it, OpenAI's gpt-oss card does not, DeepSeek gives a figure
rounded to the billion. Each test states the convention of its source.
"""

import pytest

from perfcast.workload import Batch, ParallelPlan, build_task_graph, load_model_spec

DECODE = Batch.decode(8, 1024)


def counts(model_id, plan=ParallelPlan()):
    g = build_task_graph(load_model_spec(model_id), plan, DECODE)
    return (g.param_count(), g.param_count(active=True),
            g.param_count(active=True, embedding=False))


def test_llama_3_1_70b_total():
    total, active, _ = counts("meta-llama/Llama-3.1-70B")
    assert total == pytest.approx(70.6e9, rel=0.01)
    assert active == total  # dense: every weight is active


def test_qwen3_235b_a22b_total_and_active_with_embedding():
    # model card: 235B total, 22B activated, 234B non-embedding
    total, active, _ = counts("Qwen/Qwen3-235B-A22B")
    assert total == pytest.approx(235e9, rel=0.01)
    assert active == pytest.approx(22e9, rel=0.01)
    emb = 151936 * 4096
    assert total - emb == pytest.approx(234e9, rel=0.01)


def test_deepseek_v3_total_and_active():
    # 671B total (main model, MTP excluded), "37B activated" rounded to the billion
    total, with_emb, without_emb = counts("deepseek-ai/DeepSeek-V3")
    assert total == pytest.approx(671e9, rel=0.01)
    assert round(without_emb / 1e9) == 37
    assert without_emb == pytest.approx(37e9, rel=0.011)
    # hand count of the activated weights: 61 MLA layers, 3 dense MLPs, 58 MoE layers
    # with 8 routed + 1 shared expert, routers, LM head
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    norms_layer = 2 * 7168 + 1536 + 512
    expected = (61 * (mla + norms_layer) + 3 * 3 * 7168 * 18432
                + 58 * (9 * 3 * 7168 * 2048 + 7168 * 256) + 7168 + 129280 * 7168)
    assert without_emb == pytest.approx(expected, rel=1e-9)
    assert with_emb - without_emb == 129280 * 7168


def test_gpt_oss_120b_total_and_active_without_embedding():
    # OpenAI model card: 116.83B total, 5.13B active (unembedding counted, embedding not)
    total, _, active = counts("openai/gpt-oss-120b")
    assert total == pytest.approx(116.83e9, rel=0.01)
    assert active == pytest.approx(5.13e9, rel=0.01)


@pytest.mark.parametrize("model_id,total_b,active_b", [
    ("mistralai/Mixtral-8x7B-v0.1", 46.7, 12.9),     # Mistral: 46.7B total, 12.9B active
    ("Qwen/Qwen3-235B-A22B-FP8", 235.0, 22.0),       # quantisation does not change counts
    ("openai/gpt-oss-20b", 20.9, 3.6),               # OpenAI: 20.91B / 3.61B
])
def test_other_moe_models(model_id, total_b, active_b):
    total, with_emb, without_emb = counts(model_id)
    assert total == pytest.approx(total_b * 1e9, rel=0.01)
    active = without_emb if model_id.startswith("openai") else with_emb
    assert active == pytest.approx(active_b * 1e9, rel=0.015)


def test_qwen3_30b_a3b_total():
    # Qwen: 30.5B total; its "3.3B activated" lies between our two conventions
    total, with_emb, without_emb = counts("Qwen/Qwen3-30B-A3B")
    assert total == pytest.approx(30.5e9, rel=0.01)
    assert without_emb < 3.3e9 < with_emb * 1.01


@pytest.mark.parametrize("plan", [
    ParallelPlan(tp=8), ParallelPlan(dp=8, ep=8), ParallelPlan(tp=2, dp=4, ep=8),
    ParallelPlan(tp=4, pp=2, ep=4), ParallelPlan(tp=2, dp=2, ep=2, moe_tp=2),
])
def test_param_count_does_not_depend_on_layout(plan):
    base = counts("deepseek-ai/DeepSeek-V3")
    assert counts("deepseek-ai/DeepSeek-V3", plan) == pytest.approx(base, rel=1e-12)
