"""ZeRO-1/2's parameter all-gather overlapped with the next step's first forward pass
(Megatron `--overlap-param-gather`): the buckets a person can count, the pipelined wait
g_1 + sum max(0, g_{i+1} - f_i), and the step between the free and the exposed bound."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfcast.core.errors import ConfigError
from perfcast.plan.training import PassCosts, schedule_training
from perfcast.training import TrainingLayout, TrainingRequest, estimate_training
from perfcast.training.estimate import param_gather_segments, pipelined_gather_wait

from .tiny_models import GPT, GPT_H, GPT_PARAMS, GPT_POSITIONS, GPT_VOCAB


def train(overlap: bool, zero: int = 1, **kw):
    return estimate_training(TrainingRequest(
        model=GPT, device="h100_sxm", layout=TrainingLayout(dp=4, zero_stage=zero, **kw),
        global_batch_size=16, micro_batch_size=2, seq_length=256,
        overlap_param_gather=overlap))


def test_pipelined_wait_by_hand():
    # gathers 3, 1, 5 s; computes 2, 2, 1 s: bucket 1 waits 3; gather 2 (1 s) hides under
    # compute 1 (2 s); gather 3 (5 s) under compute 2 (2 s) leaves 3 s: 3 + 0 + 3
    assert pipelined_gather_wait([3.0, 1.0, 5.0], [2.0, 2.0, 1.0]) == 6.0
    assert pipelined_gather_wait([], []) == 0.0
    assert pipelined_gather_wait([0.5, 0.1], [1.0, 1.0]) == 0.5  # only the first exposed


def test_buckets_in_forward_order_by_hand():
    r = train(True)
    segs = param_gather_segments(r.costs[0].forward, last_chunk_holds_head=False)
    layer = 12 * GPT_H**2 + 4 * GPT_H  # qkv, o, MLP 4h; two LayerNorms
    # embedding (token + position tables), layer 0, layer 1, final LayerNorm (tied head)
    assert [p for p, _ in segs] == [GPT_VOCAB * GPT_H + GPT_POSITIONS * GPT_H, layer, layer,
                                    2 * GPT_H]
    assert sum(p for p, _ in segs) == GPT_PARAMS
    # the segments' compute adds up to the forward's tasks
    assert sum(f for _, f in segs) == pytest.approx(
        sum(ct.total_latency_s for ct in r.costs[0].forward.tasks), rel=1e-12)


def _dur(sched, label):
    i = sched.labels.index(label)
    return sched.schedule.end_s[i] - sched.schedule.start_s[i]


def test_step_between_free_and_exposed_and_equal_to_the_derivation():
    from perfcast.evidence.factory import build_resolver
    from perfcast.evidence.costing import cost_graph
    from perfcast.training.chunks import collective_task

    off, on = train(False), train(True)
    gather = _dur(off.schedule, "dp.param_all_gather")
    assert gather > 0
    assert "dp.param_all_gather" not in on.schedule.labels
    free = off.step_time_s - gather          # the all-gather costing nothing
    assert free < on.step_time_s < off.step_time_s
    # each bucket's all-gather (params x 2 bytes over the 4 DP ranks) and compute
    segs = param_gather_segments(on.costs[0].forward, last_chunk_holds_head=False)
    resolver = build_resolver(on.system)
    fwd = on.chunks[0].forward

    def g(params):
        t = collective_task("x", "x", "all_gather", params * 2, 4, "nvlink")
        return cost_graph(replace(fwd, tasks=(t,)), on.system.name, resolver
                          ).tasks[0].latency_s

    (p0, f0), (p1, f1), (p2, f2), (p3, _) = segs
    wait = g(p0) + max(0, g(p1) - f0) + max(0, g(p2) - f1) + max(0, g(p3) - f2)
    # pp = 1: the passes run back to back; only microbatch 0's forward waits
    assert on.step_time_s == pytest.approx(free + wait, rel=1e-9)
    assert 0 < wait < gather
    assert sum(on.breakdown_s.values()) == pytest.approx(on.step_time_s, rel=1e-9)
    assert on.breakdown_s["dp_comm_exposed"] == pytest.approx(
        off.breakdown_s["dp_comm_exposed"] - gather + wait, rel=1e-9)


def test_wait_lengthens_only_the_first_forward_pass():
    costs = PassCosts(forward_s=[1.0], backward_s=[2.0], optimizer_s=[0.5],
                      first_forward_extra_s=[0.25])
    s = schedule_training(1, 4, 1, costs, full=True)
    assert s.makespan_s == pytest.approx(4 * 3.0 + 0.25 + 0.5)
    assert _dur(s, "F0.c0") == 1.25
    assert _dur(s, "F1.c0") == 1.0


def test_needs_zero_1_or_2():
    for zero in (0, 3):
        with pytest.raises(ConfigError) as exc:
            train(True, zero=zero)
        assert exc.value.field == "--overlap-param-gather"
    # ZeRO-2 is accepted
    assert train(True, zero=2).step_time_s < train(False, zero=2).step_time_s


def test_pipeline_fill_hides_the_later_ranks_first_bucket():
    r = estimate_training(TrainingRequest(
        model=GPT, device="h100_sxm", layout=TrainingLayout(pp=2, dp=2, zero_stage=1),
        global_batch_size=16, micro_batch_size=2, seq_length=256, overlap_param_gather=True))
    s = r.schedule

    def end(label):
        return s.schedule.end_s[s.labels.index(label)]

    # rank 0 waits for its first bucket (embedding) from the step's start
    assert s.param_gather_wait_s[0] == pytest.approx(end("dp.param_all_gather.c0"))
    # rank 1's first bucket is all-gathered while rank 0 computes its first forward: it
    # waits only for what is left when the activation arrives
    assert s.param_gather_wait_s[1] == pytest.approx(
        max(0.0, end("dp.param_all_gather.c1") - end("p2p.F0.c1")))
    assert sum(r.breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    assert r.breakdown_s["pp_bubble"] >= 0
