"""Hand-checkable schedules: chains, overlap, dependency-blocked overlap, link sharing."""

import pytest

from perfcast.plan import PlanOptions, Problem, schedule_plan, simulate
from .handgraphs import MS, SYSTEM, graph, task


def plan(*tasks, overlap="comm", **kw):
    return schedule_plan([graph(*tasks)], SYSTEM, PlanOptions(overlap=overlap, **kw))


def by_lineage(tl):
    return {t.lineage: t for t in tl.tasks}


def test_chain_equals_sum():
    tl = plan(task("a", 1 * MS), task("b", 2 * MS, ["a"]), task("c", 3 * MS, ["b"]))
    assert tl.makespan_s == pytest.approx(6 * MS)
    assert tl.sum_of_tasks_s == pytest.approx(6 * MS)
    assert tl.critical_path_ids() == ["a", "b", "c"]
    t = by_lineage(tl)
    assert (t["b"].start_s, t["c"].start_s) == pytest.approx((1 * MS, 3 * MS))


def test_independent_tasks_on_different_streams_overlap_to_the_max():
    tl = plan(task("gemm", 3 * MS), task("ar", 2 * MS, comm=True))
    assert tl.makespan_s == pytest.approx(3 * MS)
    assert tl.sum_of_tasks_s == pytest.approx(5 * MS)
    t = by_lineage(tl)
    assert t["gemm"].stream == "compute" and t["ar"].stream == "comm.nvlink"
    assert t["ar"].start_s == 0.0
    assert tl.exposed_comm_s == 0.0


def test_same_tasks_without_overlap_serialise():
    tl = plan(task("gemm", 3 * MS), task("ar", 2 * MS, comm=True), overlap="none")
    assert tl.makespan_s == pytest.approx(5 * MS)
    assert {t.stream for t in tl.tasks} == {"compute"}


def test_comm_that_the_next_gemm_consumes_cannot_overlap():
    dependent = plan(task("g1", 2 * MS), task("ar", 1 * MS, ["g1"], comm=True),
                     task("g2", 2 * MS, ["ar"]))
    assert dependent.makespan_s == pytest.approx(5 * MS)
    assert dependent.exposed_comm_s == pytest.approx(1 * MS)
    assert dependent.critical_path_ids() == ["g1", "ar", "g2"]
    # the same all-reduce with a GEMM that does not consume it: hidden under g2
    independent = plan(task("g1", 2 * MS), task("ar", 1 * MS, ["g1"], comm=True),
                       task("g2", 2 * MS, ["g1"]))
    assert independent.makespan_s == pytest.approx(4 * MS)
    assert independent.exposed_comm_s == 0.0


def test_two_transfers_sharing_a_link_take_twice_as_long():
    tl = plan(task("x", 1 * MS, comm=True, stream="s1", bandwidth_s=1 * MS),
              task("y", 1 * MS, comm=True, stream="s2", bandwidth_s=1 * MS))
    t = by_lineage(tl)
    assert t["x"].end_s == pytest.approx(2 * MS) and t["y"].end_s == pytest.approx(2 * MS)
    assert t["x"].uncontended_s == pytest.approx(1 * MS)
    # different tiers (8 -> nvlink, 16 -> infiniband) are different links: no sharing
    apart = plan(task("x", 1 * MS, comm=True, participants=8),
                 task("y", 1 * MS, comm=True, participants=16))
    assert apart.makespan_s == pytest.approx(1 * MS)
    assert {t.stream for t in apart.tasks} == {"comm.nvlink", "comm.infiniband"}


def test_only_the_bandwidth_part_is_shared():
    # 0.5 ms latency + 0.5 ms bandwidth each: 0.5 + 2 * 0.5 = 1.5 ms together
    tl = plan(task("x", 1 * MS, comm=True, stream="s1", bandwidth_s=0.5 * MS),
              task("y", 1 * MS, comm=True, stream="s2", bandwidth_s=0.5 * MS))
    assert tl.makespan_s == pytest.approx(1.5 * MS)


def test_staggered_transfers_share_while_they_overlap():
    # x alone 0..0.5 (half done), then shares with y at half rate until 1.5 (x done);
    # y did 0.5 by then and finishes alone at 2.0
    tl = plan(task("x", 1 * MS, comm=True, stream="s1", bandwidth_s=1 * MS),
              task("pre", 0.5 * MS),
              task("y", 1 * MS, ["pre"], comm=True, stream="s2", bandwidth_s=1 * MS))
    t = by_lineage(tl)
    assert t["x"].end_s == pytest.approx(1.5 * MS)
    assert (t["y"].start_s, t["y"].end_s) == pytest.approx((0.5 * MS, 2.0 * MS))


def test_a_stream_runs_one_task_at_a_time_in_priority_order():
    p = Problem()
    a = p.add(1.0, 0, priority=1)
    b = p.add(1.0, 0, priority=0)
    s = simulate(p)
    assert (s.start_s[b], s.start_s[a]) == (0.0, 1.0)
    assert s.gate[a] == b  # released by the stream, not by a dependency


def test_dependency_cycle_is_reported():
    p = Problem()
    p.add(1.0, 0, priority=0, preds=[1])
    p.add(1.0, 0, priority=1, preds=[0])
    with pytest.raises(ValueError, match="never became ready"):
        simulate(p)


def test_full_expansion_names_each_layer_and_keeps_the_chain():
    tasks = (task("embed", 1 * MS),
             task("L0-9.mlp.up", 2 * MS, ["embed"], layers=(0, 9)),
             task("L0-9.mlp.ar", 1 * MS, ["L0-9.mlp.up"], layers=(0, 9), comm=True),
             task("head", 1 * MS, ["L0-9.mlp.ar"]))
    compressed = plan(*tasks)
    full = plan(*tasks, full_timeline=True)
    assert full.makespan_s == pytest.approx(32 * MS)  # 1 + 10 * (2 + 1) + 1
    assert compressed.makespan_s == pytest.approx(32 * MS)
    assert [t.lineage for t in full.tasks] == (
        ["embed"] + [f"L{n}.mlp.{g}" for n in range(10) for g in ("up", "ar")] + ["head"])
    t = by_lineage(full)
    assert t["L1.mlp.up"].start_s == pytest.approx(t["L0.mlp.ar"].end_s)
    assert t["L1.mlp.up"].calls == 1
    # compressed: four representative layers, extrapolated to ten
    assert [x.lineage for x in compressed.tasks] == (
        ["embed"] + [f"L{n}.mlp.{g}" for n in range(4) for g in ("up", "ar")] + ["head"])
    assert compressed.extrapolated_layers == 10
    assert compressed.sum_of_tasks_s == full.sum_of_tasks_s == pytest.approx(32 * MS)


def test_short_blocks_are_always_expanded():
    tasks = (task("L0-3.g", 2 * MS, layers=(0, 3)),)
    assert len(plan(*tasks).tasks) == 4
    assert plan(*tasks).makespan_s == pytest.approx(8 * MS)


def test_two_microbatch_halves_interleave_compute_and_comm():
    unit = graph(task("g1", 2 * MS), task("ar1", 1 * MS, ["g1"], comm=True),
                 task("g2", 2 * MS, ["ar1"]), task("ar2", 1 * MS, ["g2"], comm=True))
    tl = schedule_plan([unit, unit], SYSTEM, PlanOptions(overlap="two-microbatch"))
    # A.g1 0-2 | A.ar1 2-3 under B.g1 2-4 | A.g2 4-6 over B.ar1 4-5 | B.g2 6-8 over A.ar2
    # 6-7 | B.ar2 8-9
    assert tl.makespan_s == pytest.approx(9 * MS)
    assert tl.sum_of_tasks_s == pytest.approx(12 * MS)
    starts = {(t.unit, t.lineage): t.start_s for t in tl.tasks}
    assert starts[(1, "g1")] == pytest.approx(2 * MS)
    assert starts[(0, "g2")] == pytest.approx(4 * MS)
    assert starts[(1, "ar2")] == pytest.approx(8 * MS)
    assert tl.critical_path_ids()[-1] == "ar2@mb1"


@pytest.mark.parametrize("layers", [2, 4, 8, 33])
def test_compressed_mode_extrapolates_the_per_layer_interleaving(layers):
    last = layers - 1
    block = graph(task(f"L0-{last}.g", 2 * MS, layers=(0, last)),
                  task(f"L0-{last}.ar", 1 * MS, [f"L0-{last}.g"], layers=(0, last), comm=True))
    opts = dict(overlap="two-microbatch")
    full = schedule_plan([block, block], SYSTEM, PlanOptions(full_timeline=True, **opts))
    compressed = schedule_plan([block, block], SYSTEM, PlanOptions(**opts))
    # per layer the halves ping-pong as in the test above: 4 ms per layer + the last
    # all-reduce (1 layer: 5 ms, 2 layers: 9 ms)
    assert full.makespan_s == pytest.approx((4 * layers + 1) * MS)
    assert compressed.makespan_s == pytest.approx((4 * layers + 1) * MS)
    assert len(full.tasks) == 4 * layers
    assert len(compressed.tasks) == 4 * (layers if layers <= 6 else 4)


def test_uneven_stages_keep_their_extra_layer_in_compressed_mode():
    unit = graph(task("L0-9.g", 1 * MS, layers=(0, 9)),
                 task("L10-20.g", 1 * MS, ["L0-9.g"], layers=(10, 20), stage=1),
                 task("head", 3 * MS, ["L10-20.g"], stage=1), pp=2)
    # stage times 10 and 11 + 3 = 14 ms: 10 + 4 * 14
    for full in (True, False):
        tl = schedule_plan([unit] * 4, SYSTEM, PlanOptions(num_microbatches=4,
                                                           full_timeline=full))
        assert tl.makespan_s == pytest.approx(66 * MS)
        assert tl.idle_s[1] == pytest.approx(66 * MS - 4 * 14 * MS)


def test_moe_dispatch_overlaps_the_shared_expert_only():
    # router 0-1 | dispatch 1-3 (comm) under shared expert 1-4 | experts wait for both
    # the dispatch and the compute stream: 4-6 | combine 6-8 | add 8-9
    tl = plan(task("router", 1 * MS),
              task("dispatch", 2 * MS, ["router"], comm=True, operation="all_to_all"),
              task("shared", 3 * MS, ["router"]),
              task("experts", 2 * MS, ["dispatch"]),
              task("combine", 2 * MS, ["experts"], comm=True, operation="all_to_all"),
              task("add", 1 * MS, ["combine", "shared"]))
    assert tl.makespan_s == pytest.approx(9 * MS)
    assert tl.sum_of_tasks_s == pytest.approx(11 * MS)
    assert tl.critical_path_ids() == ["router", "shared", "experts", "combine", "add"]
    assert tl.exposed_comm_s == pytest.approx(2 * MS)


@pytest.mark.parametrize("full", [True, False])
def test_alternating_blocks_chain_layer_by_layer(full):
    # gpt-oss style: sliding-window layers 0,2,..,16 and full layers 1,3,..,17, each
    # block built once; layer 1 depends on layer 0 (the deps say so), layer 2 on layer 1
    a, b = dict(layers=(0, 16), stride=2), dict(layers=(1, 17), stride=2)
    tasks = (task("embed", 1 * MS),
             task("L0-16:2.attn", 1 * MS, ["embed"], **a),
             task("L0-16:2.ar", 1 * MS, ["L0-16:2.attn"], comm=True, **a),
             task("L1-17:2.attn", 2 * MS, ["L0-16:2.ar"], **b),
             task("L1-17:2.ar", 1 * MS, ["L1-17:2.attn"], comm=True, **b),
             task("head", 1 * MS, ["L1-17:2.ar"]))
    tl = plan(*tasks, full_timeline=full)
    assert tl.makespan_s == pytest.approx((1 + 9 * 2 + 9 * 3 + 1) * MS)
    order = [t.lineage for t in sorted(tl.tasks, key=lambda t: t.start_s)]
    layers = [name.split(".")[0] for name in order[1:-1]]
    assert layers == sorted(layers, key=lambda x: int(x[1:]))  # L0, L0, L1, L1, L2, ...
    assert order[1:5] == ["L0.attn", "L0.ar", "L1.attn", "L1.ar"]
