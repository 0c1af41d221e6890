"""`gradient_accumulation_fusion=False`: autograd adds each microbatch's 16-bit weight
gradient into `.grad` in place after the first (Megatron-LM of 2021: torch DDP under
`no_sync`, local DDP without contiguous buffers), 2 + 2 bytes read and 2 written per
parameter; with the fusion (Megatron-LM's default since 2022-02) the wgrad GEMMs accumulate
and nothing is added. Checked by hand on A100's roofline: the step of m microbatches on one
device grows by m - 1 adds."""

from __future__ import annotations

import pytest

from perfcast.hardware import load_system
from perfcast.training import TrainingLayout, TrainingRequest, estimate_training

from .tiny_models import GPT, GPT_PARAMS

A100 = load_system("a100_sxm")


def step(gb: int, fused: bool):
    return estimate_training(TrainingRequest(
        model=GPT, device=A100, layout=TrainingLayout(), global_batch_size=gb,
        micro_batch_size=1, seq_length=128, dtype="fp16", gradient_accumulation_fusion=fused))


def test_m_minus_one_in_place_adds_on_one_device():
    on, off = step(4, True), step(4, False)
    assert on.microbatches == 4
    bw = A100.device.memory.bw_bytes_per_s * A100.efficiency.memory
    add = 6 * GPT_PARAMS / bw + A100.device.launch_overhead_s
    assert off.step_time_s - on.step_time_s == pytest.approx(3 * add, rel=1e-9)
    assert off.breakdown_s["backward"] - on.breakdown_s["backward"] == pytest.approx(
        3 * add, rel=1e-9)
    assert sum(off.breakdown_s.values()) == pytest.approx(off.step_time_s, rel=1e-12)


def test_one_microbatch_adds_nothing():
    assert step(1, False).step_time_s == step(1, True).step_time_s
