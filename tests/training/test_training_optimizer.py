"""The optimizer step as Megatron-LM's mixed-precision optimizer runs it
(Float16OptimizerWithFloat16Params.step, megatron/optimizer/optimizer.py at de7dc40f88):
copy 16-bit gradients to fp32 (2 + 4 bytes per parameter), unscale and inf check under
fp16 (4 + 4), the gradient norm for clipping (4), Adam (16 read, 12 written, 14 FLOPs), copy
the fp32 master to the 16-bit weight (4 + 2): 52 bytes per parameter under fp16, 44 under
bf16, over the parameters the device updates."""

from __future__ import annotations

import pytest

from perfcast.training import TrainingLayout, TrainingRequest, estimate_training
from perfcast.training.estimate import optimizer_tasks

from .tiny_models import GPT, GPT_PARAMS


@pytest.mark.parametrize("dtype, per_param, passes", [
    ("fp16", 52, ["copy_grads", "unscale", "grad_norm", "adam", "copy_params"]),
    ("bf16", 44, ["copy_grads", "grad_norm", "adam", "copy_params"])])
def test_passes_and_bytes_per_parameter(dtype, per_param, passes):
    tasks = optimizer_tasks(1000.0, 1, dtype)
    assert [t.group for t in tasks] == [f"optimizer.{p}" for p in passes]
    assert sum(t.work.bytes_read + t.work.bytes_written for t in tasks) == per_param * 1000
    assert sum(t.work.flops for t in tasks) == (15 + 2 if dtype == "fp16" else 14 + 2) * 1000
    assert all(t.deps == (prev.lineage,) for prev, t in zip(tasks, tasks[1:]))


@pytest.mark.parametrize("zero", [0, 1])
def test_step_optimizer_time_is_the_passes_over_the_local_parameters(zero):
    res = estimate_training(TrainingRequest(
        model=GPT, device="a100_sxm", layout=TrainingLayout(dp=4, zero_stage=zero),
        global_batch_size=4, micro_batch_size=1, seq_length=128, dtype="fp16"))
    groups = [ct.task.group for g in res.optimizer_costed for ct in g.tasks
              if ct.task.group.startswith("optimizer.")]
    assert groups == ["optimizer.copy_grads", "optimizer.unscale", "optimizer.grad_norm",
                      "optimizer.adam", "optimizer.copy_params"]
    local = GPT_PARAMS / (4 if zero else 1)
    moved = sum(ct.task.work.bytes_read + ct.task.work.bytes_written
                for g in res.optimizer_costed for ct in g.tasks
                if ct.task.group.startswith("optimizer."))
    assert moved == pytest.approx(52 * local, rel=1e-9)
    opt = sum(ct.total_latency_s for g in res.optimizer_costed for ct in g.tasks
              if ct.task.group.startswith("optimizer."))
    assert res.breakdown_s["optimizer"] == pytest.approx(opt, rel=1e-12)
