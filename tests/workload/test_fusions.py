"""Fusion passes of a stack (perfcast.workload.fusions): the fused calls TensorCast emits
with --compilation-config enable_matmul_allreduce enable_dispatch_ffn_combine
(tests/fixtures/tensorcast/qwen3_32b_decode_tp4_mc2.json, qwen3_30b_a3b_decode_ep_fused.json),
doing the work of their parts."""

from dataclasses import replace

import pytest

from perfcast.core.errors import ConfigError
from perfcast.workload import Batch, ParallelPlan, build_task_graph, load_model_spec
from perfcast.workload.build import memory_facts
from perfcast.workload.fusions import PATTERNS, apply_fusions, check_fusions
from perfcast.workload.graph import Precision
from perfcast.workload.stacks import load_stack
from perfcast.workload.tensors import TaskKind

STACK = "vllm-ascend-0.18"
BF16 = Precision.uniform("bf16")


def graphs(model, plan):
    spec = load_model_spec(model)
    return [build_task_graph(spec, plan, Batch.decode(8, 1024), BF16, stack=s)
            for s in ("tensorcast", STACK)]


def by_group(g, group):
    return next(t for t in g.tasks if t.group == group)


def test_the_stack_is_tensorcast_plus_its_declared_fusions():
    tc, va = load_stack("tensorcast"), load_stack(STACK)
    assert va.fusions == ("matmul_all_reduce", "dispatch_ffn_combine")
    assert replace(va, name=tc.name, description=tc.description, source=tc.source,
                   fusions=()) == tc
    assert load_stack("default").fusions == () and tc.fusions == ()
    with pytest.raises(ConfigError, match="unknown fusion"):
        check_fusions(["matmul_all_reduce", "split_qkv_rmsnorm_rope"], "x.fusions")


def test_matmul_all_reduce_on_a_dense_tp4_decode():
    unfused, fused = graphs("Qwen/Qwen3-32B", ParallelPlan(tp=4))
    h, layers = 5120, 64
    for group, k in (("attn.o_proj", 64 * 128 // 4), ("mlp.down_proj", 25600 // 4)):
        mm = by_group(unfused, group)
        ar = next(t for t in unfused.tasks if mm.lineage in t.deps)
        assert ar.operator == "tensor_cast.all_reduce.default"
        t = by_group(fused, group)
        assert t.operator == "tensor_cast.matmul_all_reduce.default"
        assert [list(x.shape) for x in t.inputs] == [[8, k], [k, h]]  # the mm's (TensorCast)
        assert t.outputs == ar.outputs and t.count == layers
        assert t.work.flops == mm.work.flops == 2.0 * 8 * k * h
        # a compute -> collective edge keeps its buffer: the matmul's bytes, unchanged
        assert (t.work.bytes_read, t.work.bytes_written) == (mm.work.bytes_read,
                                                             mm.work.bytes_written)
        assert t.work.message_bytes == ar.work.message_bytes == 8 * h * 2
        assert t.work.axes["participants"] == 4 and t.attributes["weight_params"] == k * h
    assert not any(t.operator == "tensor_cast.all_reduce.default" for t in fused.tasks)
    assert len(fused.tasks) == len(unfused.tasks) - 2


def test_dispatch_ffn_combine_on_an_expert_parallel_decode():
    unfused, fused = graphs("Qwen/Qwen3-30B-A3B", ParallelPlan(tp=4, ep=4))
    h, inter, k, local = 2048, 768, 8, 32
    t_slice, rows = 2, 64  # 8 tokens / tp 4; TensorCast's split: the hot rank gets 4 x 16
    parts = [t for t in unfused.tasks if t.layers == (0, 47) and t.group in (
        "moe.permute", "moe.dispatch", "moe.group_by_expert", "moe.experts.gate_up",
        "moe.experts.down", "moe.group_by_source", "moe.combine", "moe.unpermute")]
    assert len(parts) == 8
    t = by_group(fused, "moe.experts")
    assert t.operator == "tensor_cast.dispatch_ffn_combine.default"
    # x, indices, then (list arguments, as TensorCast's dump shows) the weights of the 16
    # experts that receive rows: gate/up, then down
    assert [list(x.shape) for x in t.inputs] == (
        [[t_slice, h], [t_slice, k]] + [[h, 2 * inter]] * 16 + [[inter, h]] * 16)
    assert t.attributes["list_inputs"] == 2
    assert [list(x.shape) for x in t.outputs] == [[t_slice, k, h]]
    gemm = 2.0 * rows * h * 2 * inter + 5.0 * rows * inter + 2.0 * rows * inter * h
    assert t.work.flops == sum(p.work.flops for p in parts) == gemm
    # intermediates between compute parts stay on chip: the routed rows into the gate/up
    # GEMM, its SwiGLU output into the down GEMM, the down output into the regroup copy
    got, mid = rows * h * 2, rows * inter * 2
    removed = 2 * (got + mid + got)
    assert t.work.bytes_total == sum(p.work.bytes_total for p in parts) - removed
    assert t.work.message_bytes == t_slice * k * h * 2 + rows * h * 2
    assert t.attributes["weight_params"] == local * (h * 2 * inter + inter * h)
    weight = by_group(fused, "moe.weight")
    assert t.lineage in weight.deps and not {p.lineage for p in parts} & set(weight.deps)
    assert t.deps == by_group(unfused, "moe.permute").deps
    assert not any(x.operator.startswith("tensor_cast.grouped_matmul") for x in fused.tasks)


def test_a_quantised_linear_fuses_into_its_own_variant():
    spec = load_model_spec("Qwen/Qwen3-8B")
    w8a8 = Precision(weight="int8", activation="bf16", kv_cache="bf16", attention="bf16",
                     linear_activation="int8")
    g = build_task_graph(spec, ParallelPlan(tp=4), Batch.decode(8, 1024), w8a8, stack=STACK)
    t = by_group(g, "attn.o_proj")
    assert t.operator == "tensor_cast.static_quant_linear_all_reduce.default"
    # the quantised linear's arguments, as TensorCast passes them (x, w, scale, offset)
    assert [(list(x.shape), x.dtype) for x in t.inputs] == [
        ([8, 1024], "int8"), ([1024, 4096], "int8"), ([], "fp32"), ([], "fp32")]


@pytest.mark.parametrize("model, plan", [("Qwen/Qwen3-32B", ParallelPlan(tp=4)),
                                         ("Qwen/Qwen3-30B-A3B", ParallelPlan(tp=4, ep=4))])
def test_weights_memory_and_step_flops_are_the_unfused_graphs(model, plan):
    unfused, fused = graphs(model, plan)
    assert fused.param_count() == unfused.param_count()
    assert fused.param_count(active=True) == unfused.param_count(active=True)
    assert fused.memory == unfused.memory
    again = memory_facts(list(fused.tasks), fused.plan)  # read off the fused tasks too
    assert (again.weights, again.kv_cache) == (fused.memory.weights, fused.memory.kv_cache)
    assert fused.total_flops() == pytest.approx(unfused.total_flops(), rel=1e-12)
    assert fused.total_bytes() <= unfused.total_bytes()


def test_patterns_that_do_not_match_leave_the_tasks_as_they_are():
    dense, _ = graphs("Qwen/Qwen3-32B", ParallelPlan(tp=4))
    assert apply_fusions(dense.tasks, ["dispatch_ffn_combine"]) == list(dense.tasks)
    assert apply_fusions(dense.tasks, []) == list(dense.tasks)
    single = build_task_graph(load_model_spec("Qwen/Qwen3-8B"), ParallelPlan(),
                              Batch.decode(8, 1024), BF16, stack=STACK)
    plain = build_task_graph(load_model_spec("Qwen/Qwen3-8B"), ParallelPlan(),
                             Batch.decode(8, 1024), BF16, stack="tensorcast")
    assert single.tasks == plain.tasks  # TP1: no all-reduce to fuse


def test_an_intermediate_read_outside_the_run_is_not_fused():
    dense, _ = graphs("Qwen/Qwen3-32B", ParallelPlan(tp=4))
    tasks = list(dense.tasks)
    o_proj = next(i for i, t in enumerate(tasks) if t.group == "attn.o_proj")
    ar = tasks[o_proj + 1]
    after = next(i for i, t in enumerate(tasks) if ar.lineage in t.deps)
    tasks[after] = replace(tasks[after], deps=tasks[after].deps + (tasks[o_proj].lineage,))
    out = apply_fusions(tasks, ["matmul_all_reduce"])
    assert out[o_proj] == tasks[o_proj] and out[o_proj + 1].kind is TaskKind.COMMUNICATION
    assert sum(t.attributes.get("fusion") == "matmul_all_reduce" for t in out) == 1  # down


def test_every_pattern_names_a_fused_operator_for_each_key_variant():
    for p in PATTERNS.values():
        assert set(p.fused) == set(p.parts[p.key_part])
        assert p.source.startswith("tensor_cast/compilation/")


def test_the_roofline_prices_a_fused_kernels_collectives():
    # MC2 overlaps its all-reduce with the matmul, DispatchFFNCombine runs its two
    # all-to-alls after the compute (TensorCast's estimators of the fused operators)
    from perfcast.evidence.collectives import collective_time
    from perfcast.evidence.factory import build_resolver
    from perfcast.evidence.queries import query_for_task
    from perfcast.hardware import load_system

    system = load_system("atlas_800_a3_752t_128g_die")
    roof = next(p for p in build_resolver(system).providers if p.name == "roofline")
    for model, plan, group in (("Qwen/Qwen3-32B", ParallelPlan(tp=4), "attn.o_proj"),
                               ("Qwen/Qwen3-30B-A3B", ParallelPlan(tp=4, ep=4), "moe.experts")):
        g = build_task_graph(load_model_spec(model), plan, Batch.decode(8, 1024),
                             stack="vllm-ascend-0.18")
        fused = next(t for t in g.tasks if t.group == group)
        q = query_for_task(fused, system.name)
        est = roof.estimate(q)
        c = est.components
        tier = system.tier_for_group(fused.work.participants)
        comm = sum(collective_time(op, float(m), fused.work.participants, tier, "auto")[0]
                   for op, m in (x.split(":") for x in fused.work.axes["comm_collectives"].split("+")))
        assert c["comm_s"] == pytest.approx(comm) and comm > 0
        core = max(c["compute_s"], c["memory_s"])
        expect = max(core, comm) if fused.work.axes["comm_combine"] == "overlap" else core + comm
        assert est.latency_s == pytest.approx(expect + c["launch_s"])


def test_dispatch_ffn_combine_matches_without_the_regroup_copy():
    # a prefill where every local expert receives rows has no tensor_cast.cat between the
    # all-to-all and the grouped GEMM (tests/fixtures/tensorcast/qwen3_30b_a3b_prefill_ep.json)
    plan = ParallelPlan(tp=4, ep=4)
    spec = load_model_spec("Qwen/Qwen3-30B-A3B")
    plain = build_task_graph(spec, plan, Batch.prefill(1, 512), BF16, stack="tensorcast")
    assert "tensor_cast.cat.default" not in {t.operator for t in plain.tasks}
    fused = build_task_graph(spec, plan, Batch.prefill(1, 512), BF16, stack=STACK)
    ops = {t.operator for t in fused.tasks}
    assert "tensor_cast.dispatch_ffn_combine.default" in ops
    assert "tensor_cast.all_to_all.default" not in ops
    assert fused.total_flops() == pytest.approx(plain.total_flops())
