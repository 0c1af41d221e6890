"""Training work a person can count: 6 x params x tokens FLOPs, Adam's 16 bytes per
parameter, ZeRO sharding, Korthikanti et al. 2022's activation bytes, backward collectives."""

from __future__ import annotations

import pytest

from perfcast.core.errors import ConfigError
from perfcast.training import TrainingLayout, TrainingRequest, estimate_training

from .tiny_models import (
    GPT,
    GPT_H,
    GPT_HEADS,
    GPT_PARAMS,
    LL_HEAD_PARAMS,
    LL_LAYER_GEMM_PARAMS,
    LL_LAYERS,
    LLAMA,
    MIXTRAL,
)


def train(model, layout=TrainingLayout(), *, gbs=8, mbs=2, seq=256, **kw):
    return estimate_training(TrainingRequest(model=model, device="h100_sxm", layout=layout,
                                             global_batch_size=gbs, micro_batch_size=mbs,
                                             seq_length=seq, **kw))


def gemm_flops(result, *, model: bool) -> float:
    """FLOPs of every weighted GEMM (forward, dgrad, wgrad, recompute) of the step."""
    total = 0.0
    per_microbatch_graphs = result.request.global_batch_size / result.request.micro_batch_size
    for c in result.chunks:
        weighted = {t.lineage for t in c.forward.tasks if "weight_params" in t.attributes}
        for g in (c.forward, c.backward):
            for t in g.tasks:
                if t.operation != "gemm":
                    continue
                src = t.attributes.get("backward_of") or t.attributes.get("recompute_of") \
                    or t.lineage
                if src not in weighted or (model and "recompute_of" in t.attributes):
                    continue
                total += t.work.flops * t.count * t.devices / int(t.attributes.get("replicas", 1))
    return total * per_microbatch_graphs / result.request.layout.dp


def test_dense_gemm_flops_are_6_x_params_x_tokens():
    r = train(LLAMA)
    tokens = 8 * 256
    params = LL_LAYERS * LL_LAYER_GEMM_PARAMS + LL_HEAD_PARAMS
    assert gemm_flops(r, model=True) == pytest.approx(6 * params * tokens, rel=1e-12)
    # the same under TP 2 (work split, not duplicated) and with 2 pipeline stages
    r2 = train(LLAMA, TrainingLayout(tp=2, pp=2))
    assert gemm_flops(r2, model=True) == pytest.approx(6 * params * tokens, rel=1e-12)


def test_full_recompute_runs_8_x_layer_params_x_tokens():
    r = train(LLAMA, TrainingLayout(recompute="full"))
    tokens = 8 * 256
    # every layer's forward runs twice; embedding, LM head and loss are not recomputed
    expected = 8 * LL_LAYERS * LL_LAYER_GEMM_PARAMS * tokens + 6 * LL_HEAD_PARAMS * tokens
    assert gemm_flops(r, model=False) == pytest.approx(expected, rel=1e-12)
    assert gemm_flops(r, model=True) == pytest.approx(
        6 * (LL_LAYERS * LL_LAYER_GEMM_PARAMS + LL_HEAD_PARAMS) * tokens, rel=1e-12)
    assert r.hfu > r.mfu and r.breakdown_s["recompute"] > 0


def test_adam_mixed_precision_is_16_bytes_per_parameter():
    r = train(GPT)
    mem = r.memory_bytes
    # 16-bit weights (2), 16-bit gradients (2), fp32 master + two fp32 moments (12)
    assert mem["weights"] == 2 * GPT_PARAMS
    assert mem["gradients"] == 2 * GPT_PARAMS
    assert mem["optimizer"] == 12 * GPT_PARAMS
    assert mem["total"] == pytest.approx(16 * GPT_PARAMS + mem["activations"] + mem["buffers"])


@pytest.mark.parametrize("dp", [1, 2, 4, 8])
def test_zero3_shards_weights_gradients_and_optimizer_over_dp(dp):
    r = train(GPT, TrainingLayout(dp=dp, zero_stage=3), gbs=8 * dp, mbs=1)
    mem = r.memory_bytes
    assert mem["weights"] + mem["gradients"] + mem["optimizer"] == pytest.approx(
        16 * GPT_PARAMS / dp, rel=1e-12)


def test_zero1_and_zero2_shard_what_they_name():
    z1 = train(GPT, TrainingLayout(dp=4, zero_stage=1), gbs=8)
    z2 = train(GPT, TrainingLayout(dp=4, zero_stage=2), gbs=8)
    assert (z1.memory_bytes["optimizer"], z1.memory_bytes["gradients"]) == (
        12 * GPT_PARAMS / 4, 2 * GPT_PARAMS)
    assert (z2.memory_bytes["gradients"], z2.memory_bytes["weights"]) == (
        2 * GPT_PARAMS / 4, 2 * GPT_PARAMS)


def korthikanti(s, b, h, a, t=1, *, sp=False, selective=False):
    """Per-layer activation bytes, Korthikanti et al. 2022 (section 4, Table 2)."""
    attn = 0 if selective else 5 * a * s / (h * t)
    if sp:
        return s * b * h * (34 / t + attn)
    return s * b * h * (10 + 24 / t + attn)


@pytest.mark.parametrize("tp,sp,recompute", [(1, False, "none"), (2, False, "none"),
                                             (4, False, "none"), (2, True, "none"),
                                             (4, True, "none"), (2, True, "selective"),
                                             (2, False, "selective")])
def test_activation_bytes_per_layer_match_korthikanti(tp, sp, recompute):
    s, b = 256, 2
    r = train(GPT, TrainingLayout(tp=tp, sequence_parallel=sp, recompute=recompute),
              gbs=2, mbs=b, seq=s, attention_kernel="unfused")
    per_layer = dict(r.chunks[0].layer_saved_bytes)["L0-1"]
    assert per_layer == pytest.approx(korthikanti(s, b, GPT_H, GPT_HEADS, tp, sp=sp,
                                                  selective=recompute == "selective"))


def test_full_recompute_keeps_each_layer_input_only():
    s, b = 256, 2
    for tp, sp in ((1, False), (2, True)):
        r = train(GPT, TrainingLayout(tp=tp, sequence_parallel=sp, recompute="full"),
                  gbs=2, mbs=b, seq=s)
        assert dict(r.chunks[0].layer_saved_bytes)["L0-1"] == 2 * s * b * GPT_H / tp


def test_flash_attention_keeps_softmax_statistics_not_scores():
    s, b = 256, 2
    r = train(GPT, TrainingLayout(), gbs=2, mbs=b, seq=s, attention_kernel="flash")
    lse = GPT_HEADS * s * b * 4  # fp32 per head and query
    assert dict(r.chunks[0].layer_saved_bytes)["L0-1"] == s * b * GPT_H * 34 + lse


def test_sequence_parallel_backward_mirrors_collectives():
    r = train(LLAMA, TrainingLayout(tp=2, sequence_parallel=True))
    bwd = {t.group: t.operation for t in r.chunks[0].backward.tasks
           if t.kind.value == "communication"}
    fwd = {t.group: t.operation for t in r.chunks[0].forward.tasks
           if t.kind.value == "communication"}
    assert fwd["attn.sp_all_gather"] == "all_gather" and fwd["attn.reduce_scatter"] == "reduce_scatter"
    assert bwd["bwd.attn.sp_all_gather"] == "reduce_scatter"
    assert bwd["bwd.attn.reduce_scatter"] == "all_gather"
    # the input is re-gathered for the weight gradient (Megatron keeps the slice)
    assert bwd["bwd.attn.qkv_proj.input_all_gather"] == "all_gather"
    assert "all_reduce" not in bwd.values()


def test_tp_backward_all_reduces_once_per_block_and_the_lm_head_input():
    r = train(LLAMA, TrainingLayout(tp=2))
    bwd = [t.group for t in r.chunks[0].backward.tasks if t.operation == "all_reduce"]
    # the embedding's and the vocab-parallel loss's gradients are local
    assert sorted(bwd) == sorted(["bwd.attn.all_reduce", "bwd.mlp.all_reduce",
                                  "bwd.final.lm_head.input_all_reduce"])


def test_moe_expert_parallel_all_to_all_in_both_directions():
    r = train(MIXTRAL, TrainingLayout(dp=4, ep=4), gbs=8, mbs=1)
    fwd = [t.group for t in r.chunks[0].forward.tasks if t.operation == "all_to_all"]
    bwd = [t.group for t in r.chunks[0].backward.tasks if t.operation == "all_to_all"]
    assert fwd == ["moe.dispatch", "moe.combine"]
    assert bwd == ["bwd.moe.combine", "bwd.moe.dispatch"]
    # each device holds 8 / 4 = 2 experts; their gradients reduce over dp x tp / ep = 1 rank
    experts = [t for t in r.chunks[0].forward.tasks if t.operation == "moe"][0]
    assert experts.inputs[1].shape[0] == 2
    assert not [t for t in r.chunks[0].backward_dp.tasks if "expert_grad" in t.group]


@pytest.mark.parametrize("layout,kw,flag", [
    (TrainingLayout(pp=3), {}, "--pp-size"),                       # 2 layers
    (TrainingLayout(pp=2, virtual_pipeline=2), {}, "--virtual-pipeline-size"),
    (TrainingLayout(dp=3), {"gbs": 8, "mbs": 1}, "--global-batch-size"),
    (TrainingLayout(tp=3), {}, "--tp-size"),                       # 4 heads
    (TrainingLayout(cp=3), {}, "--cp-size"),
    (TrainingLayout(ep=2), {}, "--ep-size"),                       # dense model
])
def test_layouts_that_do_not_divide_name_the_flag(layout, kw, flag):
    with pytest.raises(ConfigError, match=flag):
        train(GPT, layout, **kw)


def test_does_not_fit_names_the_largest_contributors():
    from perfcast.workload import load_model_spec

    r = estimate_training(TrainingRequest(model=load_model_spec("megatron/gpt-39b"),
                                          device="h100_sxm", layout=TrainingLayout(tp=8),
                                          global_batch_size=1, micro_batch_size=1,
                                          seq_length=2048))
    assert not r.fits
    text = r.memory.does_not_fit()
    assert "does not fit" in text and "optimizer" in text
    assert r.to_json(include_ops=False)["memory_error"] == text


@pytest.mark.parametrize("model_id,layout", [
    ("openai/gpt-oss-120b", TrainingLayout(tp=2, pp=4, dp=4, ep=8)),     # sliding + sinks, MoE
    ("Qwen/Qwen3.5-27B", TrainingLayout(tp=4, pp=4)),                    # gated DeltaNet hybrid
    ("Qwen/Qwen3-30B-A3B", TrainingLayout(tp=2, pp=2, dp=4, ep=4, sequence_parallel=True)),
])
def test_every_family_trains_with_model_flops_3_x_forward(model_id, layout):
    from perfcast.workload import load_model_spec

    r = train(load_model_spec(model_id), layout, gbs=layout.dp * layout.pp, mbs=1, seq=512)
    forward = sum(t.work.flops * t.count * t.devices / int(t.attributes.get("replicas", 1))
                  for c in r.chunks for t in c.forward.tasks)
    scale = r.request.global_batch_size / (r.request.micro_batch_size * (layout.ep // layout.tp
                                                                          if layout.ep > 1 else 1))
    assert r.model_flops == pytest.approx(3 * forward * scale, rel=1e-12)
    assert sum(r.breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
