"""The training pipeline on the plan layer's scheduler: bubble fractions of 1F1B and the
interleaved schedule, compressed scheduling, DP overlap, and forward = inference."""

from __future__ import annotations

import random

import pytest

from perfcast.core.errors import ConfigError
from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.evidence.factory import build_resolver
from perfcast.hardware import load_system
from perfcast.plan.training import PassCosts, schedule_training, training_order
from perfcast.training import TrainingLayout, TrainingRequest, estimate_training
from perfcast.workload import Batch, ParallelPlan

from .tiny_models import GPT, LLAMA


@pytest.mark.parametrize("p,m,v", [(4, 8, 1), (4, 8, 2), (4, 16, 2), (8, 16, 4), (2, 4, 3),
                                   (16, 32, 2)])
def test_bubble_fraction_of_uniform_chunks_with_free_communication(p, m, v):
    # each rank's model part takes tf = 1, tb = 2 per microbatch, split over v chunks
    tf, tb = 1.0 / v, 2.0 / v
    sched = schedule_training(p, m, v, PassCosts([tf] * (p * v), [tb] * (p * v)), full=True)
    ideal = m * 3.0
    assert (sched.makespan_s - ideal) / ideal == pytest.approx((p - 1) / (m * v), rel=1e-9)
    assert sched.bubble_s(0) == pytest.approx(sched.makespan_s - ideal, rel=1e-9)


def test_1f1b_keeps_at_most_p_minus_rank_microbatches_live():
    p, m = 4, 8
    for d, ops in enumerate(training_order(p, m, 1)):
        live = peak = 0
        for op in ops:
            live += 1 if op.kind == "F" else -1
            peak = max(peak, live)
        assert peak == p - d


def test_interleaved_order_visits_every_chunk_pass_once():
    p, m, v = 4, 8, 2
    orders = training_order(p, m, v)
    for d, ops in enumerate(orders):
        assert sorted((o.kind, o.microbatch, o.chunk) for o in ops) == sorted(
            (k, mb, c * p + d) for k in "FB" for mb in range(m) for c in range(v))


def test_compressed_schedule_equals_the_full_one():
    rng = random.Random(7)
    for p, m, v in ((4, 64, 1), (4, 64, 2), (8, 96, 3), (16, 96, 2)):
        f = [rng.uniform(0.5, 1.5) / v for _ in range(p * v)]
        b = [2 * x * rng.uniform(0.9, 1.1) for x in f]
        costs = PassCosts(f, b, p2p_s=0.05, dp_tail_s=[0.3] * (p * v),
                          optimizer_s=[0.1] * p, param_gather_s=[0.2] * p)
        full = schedule_training(p, m, v, costs, full=True)
        short = schedule_training(p, m, v, costs)
        assert short.scheduled_microbatches == 4 * p
        assert short.makespan_s == pytest.approx(full.makespan_s, rel=1e-9)
        assert short.last_pass_end_s == pytest.approx(full.last_pass_end_s, rel=1e-9)


def test_gradient_reduction_overlaps_the_backward_pass():
    layout = TrainingLayout(dp=8)
    kw = dict(model=LLAMA, device="h100_sxm", layout=layout, global_batch_size=8,
              micro_batch_size=1, seq_length=256)
    on = estimate_training(TrainingRequest(**kw))
    off = estimate_training(TrainingRequest(**kw, overlap_grad_reduce=False))
    dp = [ct for ct in on.costs[0].backward_dp.tasks if ct.task.group.startswith("dp.")]
    layer_bucket = next(ct.latency_s for ct in dp if ct.task.layers is not None)
    outside = next(ct.latency_s for ct in dp if ct.task.layers is None)
    # overlapped: only the last layer's bucket and the embedding/head bucket stay exposed;
    # not overlapped: every bucket, after the backward pass
    assert on.breakdown_s["dp_comm_exposed"] <= layer_bucket + outside + 1e-12
    assert off.breakdown_s["dp_comm_exposed"] >= sum(ct.total_latency_s for ct in dp) - 1e-12
    assert on.step_time_s < off.step_time_s
    for r in (on, off):
        assert sum(r.breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)


def test_pipeline_bubble_and_breakdown_add_up():
    r = estimate_training(TrainingRequest(model=LLAMA, device="h100_sxm",
                                          layout=TrainingLayout(pp=2, tp=2), global_batch_size=8,
                                          micro_batch_size=1, seq_length=256))
    assert r.breakdown_s["pp_bubble"] > 0
    assert sum(r.breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
    assert r.tokens_per_s == pytest.approx(8 * 256 / r.step_time_s)


@pytest.mark.parametrize("model,tp,pp", [(LLAMA, 2, 1), (LLAMA, 2, 2), (GPT, 1, 1)])
def test_forward_pass_equals_the_inference_estimate_task_by_task(model, tp, pp):
    system = load_system("h100_sxm")
    resolver = build_resolver(system)
    mbs, seq = 2, 256
    inference = estimate_step(EstimateRequest(model=model, device=system,
                                              plan=ParallelPlan(tp=tp, pp=pp),
                                              batch=Batch.prefill(mbs, seq), logits="all"),
                              resolver)
    training = estimate_training(TrainingRequest(model=model, device=system,
                                                 layout=TrainingLayout(tp=tp, pp=pp),
                                                 global_batch_size=mbs, micro_batch_size=mbs,
                                                 seq_length=seq), resolver)
    inf = {ct.task.lineage: ct for ct in inference.costed.tasks}
    fwd = {ct.task.lineage: ct for cc in training.costs for ct in cc.forward.tasks}
    shared = inf.keys() & fwd.keys()
    # training drops the KV-cache writes and the logits all-gather (the loss is
    # vocab-parallel) and adds the loss and the dropouts its config declares
    assert {inf[k].task.operation for k in inf.keys() - shared} <= {"kv_cache_write",
                                                                    "all_gather", "send_recv"}
    assert {fwd[k].task.group.split(".")[0] for k in fwd.keys() - shared} <= {"loss"} | (
        {"embed", "attn", "mlp"} if model is GPT else set())
    assert len(shared) >= 10
    for k in shared:
        assert fwd[k].task.work == inf[k].task.work, k
        assert fwd[k].latency_s == inf[k].latency_s, k


def test_tp_comm_overlap_hides_tp_collectives_behind_their_gemms():
    kw = dict(model=LLAMA, device="h100_sxm", layout=TrainingLayout(tp=2,
                                                                     sequence_parallel=True),
              global_batch_size=4, micro_batch_size=4, seq_length=1024)
    exposed = estimate_training(TrainingRequest(**kw))
    overlapped = estimate_training(TrainingRequest(**kw, tp_comm_overlap=True))
    assert exposed.breakdown_s["tp_comm_exposed"] > 0
    assert overlapped.breakdown_s["tp_comm_exposed"] < exposed.breakdown_s["tp_comm_exposed"]
    assert overlapped.step_time_s < exposed.step_time_s
    # the work is the same; only the dependencies changed
    assert overlapped.model_flops == exposed.model_flops


@pytest.mark.parametrize("p,v", [(4, 1), (4, 2), (8, 3), (16, 2)])
def test_first_rank_holds_korthikanti_interleaved_activations(p, v):
    """Korthikanti et al. 2022, section 4.2.3: the first rank stores the activations of
    L (1 + (p - 1) / (p v)) layers under the interleaved schedule (L under 1F1B), i.e.
    p v + p - 1 chunks of L / (p v) layers each."""
    from perfcast.plan.training import peak_live_bytes

    order = training_order(p, 4 * p, v)
    peak = peak_live_bytes(order[0], [1.0] * (p * v))
    layers = 96
    expected = layers if v == 1 else layers * (1 + (p - 1) / (p * v))
    assert peak * layers / (p * v) == pytest.approx(expected)


def test_context_parallel_ranks_each_compute_1_over_cp_of_the_work():
    kw = dict(model=LLAMA, device="h100_sxm", global_batch_size=2, micro_batch_size=1,
              seq_length=1024)
    one = estimate_training(TrainingRequest(layout=TrainingLayout(), **kw))
    two = estimate_training(TrainingRequest(layout=TrainingLayout(cp=2), **kw))

    def flops(r, op):
        return sum(t.work.flops * t.count for t in r.chunks[0].forward.tasks
                   if t.operation == op)

    # load-balanced causal split: each rank attends exactly half of the (query, key) pairs
    assert 2 * flops(two, "attention") == flops(one, "attention")
    assert 2 * flops(two, "gemm") == flops(one, "gemm")
    gathers = [t for t in two.chunks[0].forward.tasks if t.group == "attn.cp_kv_all_gather"]
    assert gathers and gathers[0].work.participants == 2
    assert two.model_flops == pytest.approx(one.model_flops, rel=1e-12)


def test_gradient_buckets_split_each_layer_into_equal_collectives():
    kw = dict(model=LLAMA, device="h100_sxm", layout=TrainingLayout(dp=4), global_batch_size=4,
              micro_batch_size=1, seq_length=256)
    whole = estimate_training(TrainingRequest(**kw))
    split = estimate_training(TrainingRequest(**kw, grad_bucket_params=10_000))

    def buckets(r):
        return {ct.task.layers is None: (ct.task.count, ct.task.work.message_bytes)
                for ct in r.costs[0].backward_dp.tasks if ct.task.group.startswith("dp.")}

    (n1, m1), (n2, m2) = buckets(whole)[False], buckets(split)[False]
    # per layer 36,864 GEMM + 128 norm parameters, 2 bytes each; buckets of <= 10,000
    per_layer = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 2 * 64 * 128 + 128 * 64 + 2 * 64)
    assert (n1, m1) == (4, per_layer)
    assert n2 == 4 * -(-per_layer // 2 // 10_000) and n2 * m2 == pytest.approx(4 * per_layer)
    with pytest.raises(ConfigError, match="--ddp-bucket-size"):
        estimate_training(TrainingRequest(**kw, grad_bucket_params=-1))
