"""`tp_comm_overlap`: TP collectives pipelined with their GEMMs (Transformer Engine
userbuffers) share the device: a GEMM beside a `pipeline` or `bulk` collective runs on
S - 16 of the S SMs (TE's `num_sm` default), one beside a `ring_exchange` all-gather (copy
engines) on all of them. Checked: the method of each pair, the stretch S / (S - 16) by
hand, and the pass time = the chain with each pair costing max(contended GEMM, comm),
between the free-communication and the fully exposed bounds."""

from __future__ import annotations

import pytest

from perfcast.core.errors import ConfigError
from perfcast.training import TrainingLayout, TrainingRequest, estimate_training
from perfcast.workload.tensors import TaskKind

from .tiny_models import LLAMA

KW = dict(model=LLAMA, device="h100_sxm",
          layout=TrainingLayout(tp=2, sequence_parallel=True),
          global_batch_size=4, micro_batch_size=4, seq_length=1024)


def methods(graph):
    return {t.group: t.attributes["tp_overlap_method"] for t in graph.tasks
            if "tp_overlap_method" in t.attributes}


def test_te_method_of_each_overlapped_gemm():
    r = estimate_training(TrainingRequest(**KW, tp_comm_overlap=True))
    c = r.chunks[0]
    # forward: all-gather + qkv / fc1 (ring_exchange), o_proj / fc2 + reduce-scatter
    # (pipeline): TE's qkv_fprop, fc1_fprop, proj_fprop, fc2_fprop
    assert methods(c.forward) == {
        "attn.qkv_proj": "ring_exchange", "attn.o_proj": "pipeline",
        "mlp.gate_up_proj": "ring_exchange", "mlp.down_proj": "pipeline",
        "final.lm_head": "ring_exchange"}
    bwd = methods(c.backward)
    # backward: all-gather of the output gradient + dgrad of o_proj / fc2 (proj_dgrad,
    # fc2_dgrad: ring_exchange); qkv / fc1 dgrad + reduce-scatter and wgrad + re-gather
    # of the input (qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad: bulk)
    assert bwd["bwd.attn.o_proj.dgrad"] == "ring_exchange"
    assert bwd["bwd.mlp.down_proj.dgrad"] == "ring_exchange"
    for g in ("bwd.attn.qkv_proj.dgrad", "bwd.attn.qkv_proj.wgrad",
              "bwd.mlp.gate_up_proj.dgrad", "bwd.mlp.gate_up_proj.wgrad"):
        assert bwd[g] == "bulk", g


def test_contended_gemm_is_stretched_by_s_over_s_minus_16():
    on = estimate_training(TrainingRequest(**KW, tp_comm_overlap=True))
    off = estimate_training(TrainingRequest(**KW))
    before = {ct.task.lineage: ct for ct in off.costs[0].forward.tasks}
    checked = 0
    for ct in on.costs[0].forward.tasks:
        method = ct.task.attributes.get("tp_overlap_method")
        if method is None:
            continue
        was = before[ct.task.lineage].resolution.estimate
        launch = was.components.get("launch_s", 0.0)
        if method == "ring_exchange":   # copy engines: no SM taken
            assert ct.latency_s == was.latency_s
        else:                           # H100 SXM5: 132 SMs, 16 to the comm kernels
            assert ct.latency_s - launch == pytest.approx((was.latency_s - launch)
                                                          * 132 / 116, rel=1e-12)
            assert "116 of 132 SMs" in ct.resolution.estimate.assumptions[-1]
            checked += 1
    assert checked == 2  # o_proj and down_proj


def test_pass_time_is_the_chain_with_each_pair_at_max_of_gemm_and_comm():
    on = estimate_training(TrainingRequest(**KW, tp_comm_overlap=True))
    off = estimate_training(TrainingRequest(**KW))
    fwd = on.costs[0].forward
    lat = {ct.task.lineage: ct.total_latency_s for ct in fwd.tasks}
    tasks = [ct.task for ct in fwd.tasks]
    # the forward is a chain; a TP collective and the GEMM it overlaps share their deps
    pairs = {}
    for c in tasks:
        if c.kind is TaskKind.COMMUNICATION and c.work.participants == 2:
            g = [t for t in tasks if "tp_overlap_method" in t.attributes and t.deps == c.deps]
            if g:
                pairs[c.lineage] = g[0].lineage
    assert len(pairs) == 5
    in_pair = set(pairs) | set(pairs.values())
    expected = sum(v for k, v in lat.items() if k not in in_pair) + sum(
        max(lat[c], lat[g]) for c, g in pairs.items())
    assert on.costs[0].forward_time.makespan_s == pytest.approx(expected, rel=1e-12)
    # bounds: TP communication free and uncontended <= overlapped <= exposed
    free = sum(ct.total_latency_s for ct in off.costs[0].forward.tasks
               if not (ct.task.kind is TaskKind.COMMUNICATION
                       and ct.task.work.participants == 2))
    exposed = off.costs[0].forward_time.makespan_s
    assert free < on.costs[0].forward_time.makespan_s < exposed
    assert on.step_time_s < off.step_time_s


def test_unknown_sm_count_is_an_error_not_zero():
    with pytest.raises(ConfigError) as exc:
        estimate_training(TrainingRequest(**{**KW, "device": "mi300x"}, tp_comm_overlap=True))
    assert exc.value.field == "--tp-comm-overlap"
