"""The loss as Megatron-LM's vocab_parallel_cross_entropy runs it without
`--cross-entropy-loss-fusion` (its default; the only path before 2024): the 16-bit logits
are cast to fp32 and passed over by max, subtract, exp, sum and divide (the softmax kept for
backward), whose backward multiplies by the loss gradient in place and casts back
(megatron/mpu/cross_entropy.py and gpt_model.py at de7dc40f88). Per 16-bit logit, counted
from that code: forward reads 2 + 4 + 4 + 4 + 4 + 4 = 22 bytes and writes 4 + 4 + 4 + 4 = 16
(the cast, sub_, exp out=, div_); backward reads 4 + 4 = 8 and writes 4 + 2 = 6. With the
fusion the forward reads the logits once."""

from __future__ import annotations

import pytest

from perfcast.hardware import load_system
from perfcast.training import TrainingLayout, TrainingRequest, estimate_training

from .tiny_models import GPT, GPT_VOCAB

A100 = load_system("a100_sxm")
SEQ = 128


def run(fused: bool, tp: int = 1):
    return estimate_training(TrainingRequest(
        model=GPT, device=A100, layout=TrainingLayout(tp=tp), global_batch_size=1,
        micro_batch_size=1, seq_length=SEQ, dtype="fp16", cross_entropy_loss_fusion=fused))


def loss_tasks(res):
    last = res.costs[-1]
    fwd = next(c for c in last.forward.tasks if c.task.group == "loss.cross_entropy")
    bwd = next(c for c in last.backward.tasks if c.task.group == "bwd.loss.cross_entropy")
    return fwd, bwd


@pytest.mark.parametrize("tp", [1, 2])
def test_unfused_passes_by_hand(tp):
    fwd, bwd = loss_tasks(run(False, tp))
    n = SEQ * GPT_VOCAB // tp             # the rank's logits
    assert fwd.task.work.bytes_read == 22 * n
    assert fwd.task.work.bytes_written == 16 * n + 4 * SEQ     # + the fp32 loss per token
    assert bwd.task.work.bytes_read == 8 * n + 4 * SEQ         # + the loss gradient
    assert bwd.task.work.bytes_written == 6 * n


def test_fused_reads_the_logits_once():
    fwd, bwd = loss_tasks(run(True))
    n = SEQ * GPT_VOCAB
    assert fwd.task.work.bytes_read == 2 * n
    assert fwd.task.work.bytes_written == 4 * SEQ
    # the generic backward: reads what the forward read and wrote, writes its input
    assert bwd.task.work.bytes_read == 2 * n + 4 * SEQ
    assert bwd.task.work.bytes_written == 2 * n


def test_step_grows_by_the_extra_passes_on_the_roofline():
    on, off = run(True), run(False)
    bw = A100.device.memory.bw_bytes_per_s * A100.efficiency.memory
    n = SEQ * GPT_VOCAB
    # both ways memory-bound on A100 (5 FLOPs per logit on the vector engine take less)
    extra = ((22 + 16) * n - 2 * n + (8 + 6) * n - 4 * n) / bw
    assert off.step_time_s - on.step_time_s == pytest.approx(extra, rel=1e-9)
    assert off.model_flops == on.model_flops
