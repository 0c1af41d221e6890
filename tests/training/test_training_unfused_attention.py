"""Unfused attention (Megatron-LM's CoreAttention before FlashAttention) costed as its own
tasks: FLOPs and bytes a person can count for the tiny GPT, the full s x s square (no
causal skipping) in the batched GEMMs, model FLOPs unchanged, selective recompute
re-running exactly the core."""

from __future__ import annotations

import pytest

from perfcast.training import TrainingLayout, TrainingRequest, estimate_training

from .tiny_models import GPT, GPT_H, GPT_HEADS, GPT_LAYERS

S, B = 256, 2
D = GPT_H // GPT_HEADS  # 16


def train(layout=TrainingLayout(), **kw):
    return estimate_training(TrainingRequest(model=GPT, device="a100_sxm", layout=layout,
                                             global_batch_size=B, micro_batch_size=B,
                                             seq_length=S, dtype="fp16", **kw))


def test_forward_tasks_flops_and_bytes_by_hand():
    r = train(attention_kernel="unfused", layout=TrainingLayout(tp=2))
    fwd = [t for t in r.chunks[0].forward.tasks if "unfused_core" in t.attributes
           and t.layers == (0, 1)]
    parts = {t.group.rsplit(".", 1)[-1]: t for t in fwd}
    assert list(parts) == ["scores", "softmax", "dropout", "context"]
    heads = GPT_HEADS // 2                      # per TP rank
    E = B * heads * S * S                       # every score of the square: 262,144
    P = B * heads * S * (S + 1) // 2            # the causal part: 131,584
    assert E == 262_144 and P == 131_584
    sc, sm, dr, cx = (parts[k].work for k in ("scores", "softmax", "dropout", "context"))
    # QK^T and PV over the full square: 2 E d FLOPs each (not the causal E / 2)
    assert sc.flops == 2 * E * D == 8_388_608
    assert cx.flops == 2 * E * D
    # fp16 scores: QK^T writes 2E bytes; reads Q and K (B heads S D each, 2 bytes)
    assert sc.bytes_written == 2 * E
    assert sc.bytes_read == 2 * (2 * B * heads * S * D)
    # causal softmax kernel reads the lower triangle, writes every row
    assert (sm.bytes_read, sm.bytes_written) == (2 * P, 2 * E)
    # dropout reads the probs, writes 16-bit output + bool mask
    assert (dr.bytes_read, dr.bytes_written) == (2 * E, 3 * E)
    # PV reads the probs and V, writes the context
    assert cx.bytes_read == 2 * E + 2 * B * heads * S * D
    assert cx.bytes_written == 2 * B * heads * S * D
    # model FLOPs: the causal core's, split between the two bmm; softmax/dropout none
    flash = train(attention_kernel="flash", layout=TrainingLayout(tp=2))
    attn = next(t for t in flash.chunks[0].forward.tasks if t.operation == "attention"
                and t.layers == (0, 1))
    assert attn.work.flops == 4 * D * P
    assert sc.flops == pytest.approx(attn.work.flops / 2 * E / P)  # square / causal
    split = [float(parts[k].attributes["model_flops"]) for k in parts]
    assert split == [attn.work.flops / 2, 0.0, 0.0, attn.work.flops / 2]


def test_backward_tasks_by_hand():
    r = train(attention_kernel="unfused")
    E, P = B * GPT_HEADS * S * S, B * GPT_HEADS * S * (S + 1) // 2
    bwd = {t.group.split("attn.core.", 1)[-1]: t.work for t in r.chunks[0].backward.tasks
           if "attn.core." in t.group and t.layers == (0, 1)}
    # two bmm per forward bmm, each 2 E d FLOPs
    for g in ("scores.dgrad", "scores.dgrad_b", "context.dgrad", "context.dgrad_b"):
        assert bwd[g].flops == 2 * E * D, g
    assert bwd["context.dgrad"].bytes_written == 2 * E        # dP = dC V^T
    assert bwd["scores.dgrad"].bytes_read == 2 * E + 2 * B * GPT_HEADS * S * D  # dS, K
    # softmax backward reads gradient + output of the causal part, writes the square
    assert (bwd["softmax"].bytes_read, bwd["softmax"].bytes_written) == (4 * P, 2 * E)
    # dropout backward reads gradient + mask, writes the gradient
    assert (bwd["dropout"].bytes_read, bwd["dropout"].bytes_written) == (3 * E, 2 * E)


def test_model_flops_unchanged_hardware_flops_add_the_square():
    flash, unfused = train(attention_kernel="flash"), train(attention_kernel="unfused")
    assert unfused.model_flops == pytest.approx(flash.model_flops, rel=1e-12)
    E, P = B * GPT_HEADS * S * S, B * GPT_HEADS * S * (S + 1) // 2
    # per layer: flash runs 4dP forward + 2.5 x in its backward; unfused 4dE + 8dE in the
    # bmm plus the vector kernels (5P + 3E forward, 5P + 2E backward)
    flash_core = 4 * D * P * 3.5
    unfused_core = 12 * D * E + 5 * P + 3 * E + 5 * P + 2 * E
    assert unfused.hardware_flops - flash.hardware_flops == pytest.approx(
        GPT_LAYERS * (unfused_core - flash_core), rel=1e-9)
    assert unfused.step_time_s > flash.step_time_s


def test_selective_recompute_reruns_exactly_the_core():
    r = train(attention_kernel="unfused", layout=TrainingLayout(recompute="selective"))
    rec = [t for t in r.chunks[0].backward.tasks if "recompute_of" in t.attributes]
    fwd = {t.lineage: t for t in r.chunks[0].forward.tasks}
    assert {t.group.rsplit(".", 1)[-1] for t in rec} == {"scores", "softmax", "dropout",
                                                          "context"}
    assert all("unfused_core" in fwd[t.attributes["recompute_of"]].attributes for t in rec)
    for t in rec:
        assert t.work == fwd[t.attributes["recompute_of"]].work
    none = train(attention_kernel="unfused")
    extra = sum(t.work.flops * t.count for t in rec)
    assert r.hardware_flops - none.hardware_flops == pytest.approx(extra, rel=1e-12)
    assert r.model_flops == pytest.approx(none.model_flops, rel=1e-12)
    assert r.breakdown_s["recompute"] > 0
