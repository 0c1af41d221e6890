"""Stack profiles: the same step's work under perfcast's default graph and TensorCast's."""

import pytest

from perfcast.core.errors import ConfigError
from perfcast.workload import Batch, ParallelPlan, build_task_graph, load_model_spec
from perfcast.workload.quant import precision_for_model
from perfcast.workload.stacks import load_stack, resolve_stack, stack_names


def graph(stack, model="Qwen/Qwen3-8B", batch=None, plan=None, precision=None):
    return build_task_graph(load_model_spec(model), plan or ParallelPlan(),
                            batch or Batch.decode(8, 1024), precision, stack=stack)


def signature(g, group):
    t = next(t for t in g.tasks if t.group == group)
    return t.operator, [list(x.shape) for x in t.inputs], t.count


def test_profiles_and_auto_choice():
    assert set(stack_names()) >= {"default", "tensorcast"}
    assert resolve_stack("auto", "huawei").name == "tensorcast"
    assert resolve_stack("auto", "nvidia").name == "default"
    assert resolve_stack("tensorcast", "nvidia").name == "tensorcast"
    with pytest.raises(ConfigError, match="unknown stack"):
        load_stack("vllm-cuda-9")


def test_tensorcast_calls_of_a_qwen3_decode_layer():
    # as TensorCast's --dump-input-shapes lists them for Qwen3-8B, 8 requests x 1 token over
    # 1,024 cached (tests/fixtures/tensorcast/qwen3_8b_decode_tp1.json)
    g = graph("tensorcast")
    assert signature(g, "embed.lookup") == ("aten.embedding.default",
                                            [[151936, 4096], [1, 8]], 1)
    # the index is a list argument: the dump table shows the table only
    assert signature(g, "rope.cos_gather") == ("aten.index.Tensor", [[40960, 128], [8]], 1)
    assert next(t for t in g.tasks if t.group == "rope.cos_gather").attributes["list_inputs"] == 1
    assert signature(g, "attn.input_norm") == ("tensor_cast.rms_norm.default",
                                               [[1, 8, 4096], [4096]], 36)
    assert signature(g, "attn.q_norm") == ("tensor_cast.rms_norm.default",
                                           [[1, 8, 32, 128], [128]], 36)
    assert signature(g, "attn.k_norm")[1] == [[1, 8, 8, 128], [128]]
    assert signature(g, "attn.rope") == ("tensor_cast.apply_rope.default",
                                         [[1, 8, 8, 128], [1, 32, 8, 128], [1, 8, 128],
                                          [1, 8, 128]], 36)
    # 8 x (1,024 + 1 + 1 spare slot) tokens in blocks of 128: 65 blocks; 9 per request
    assert signature(g, "attn.kv_cache_write")[1] == [[8, 1024], [8, 1024],
                                                      [2, 65, 128, 8, 128], [8]]
    assert signature(g, "attn.core")[1] == [[8, 4096], [65, 128, 8, 128], [65, 128, 8, 128],
                                            [8, 9], [9], [8], [8]]
    assert signature(g, "mlp.post_attn_norm") == ("tensor_cast.add_rms_norm2.default",
                                                  [[1, 8, 4096], [1, 8, 4096], [4096]], 36)
    assert signature(g, "mlp.act")[1] == [[1, 8, 12288], [1, 8, 12288]]
    assert signature(g, "mlp.residual_add") == ("aten.add.Tensor",
                                                [[1, 8, 4096], [1, 8, 4096]], 36)
    assert signature(g, "final.norm")[0] == "tensor_cast.rms_norm.default"


def test_same_work_up_to_the_ops_the_stack_adds():
    d, t = graph("default"), graph("tensorcast")
    tokens, h, layers = 8, 4096, 36
    # the residual add moves out of the norms into aten.add: same FLOPs per layer; the
    # final norm has no residual add under tensorcast (-T*h); q/k norms are the same
    assert t.total_flops() - d.total_flops() == pytest.approx(-tokens * h)
    # bytes: per layer the separate add re-reads and re-writes the stream once more
    # (3 T*h passes instead of the fused norm's 2 extra), one more [128] q/k-norm weight;
    # the RoPE table gathers read their rows and indices
    extra = t.total_bytes() - d.total_bytes()
    assert 0 < extra < 0.001 * d.total_bytes()
    assert d.memory == t.memory  # the paged cache and the tables are not activations


def test_tp_shapes_replicated_embedding_and_logits():
    g = graph("tensorcast", "Qwen/Qwen3-32B", Batch.prefill(1, 512), ParallelPlan(tp=4))
    groups = {t.group for t in g.tasks}
    assert "embed.all_reduce" not in groups  # TensorCast does not shard the embedding
    assert signature(g, "embed.lookup")[1] == [[151936, 5120], [1, 512]]
    assert signature(g, "attn.all_reduce")[1] == [[512, 5120]]
    # the branch output after the TP all-reduce is flat [T, h]
    assert signature(g, "mlp.post_attn_norm")[1] == [[1, 512, 5120], [512, 5120], [5120]]
    assert signature(g, "final.logits_gather")[1] == [[1, 512, 5120], [1]]  # x, index list
    assert signature(g, "final.lm_head")[1] == [[1, 5120], [5120, 37984]]
    assert signature(g, "final.logits_all_gather")[1] == [[1, 1, 37984]]
    d = graph("default", "Qwen/Qwen3-32B", Batch.prefill(1, 512), ParallelPlan(tp=4))
    assert "embed.all_reduce" in {t.group for t in d.tasks}
    assert g.memory.weights > d.memory.weights  # the whole table on every rank


def test_w8a8_quantises_activations_in_separate_ops():
    prec = precision_for_model(load_model_spec("Qwen/Qwen3-8B"), linear_action="W8A8_DYNAMIC")
    g = graph("tensorcast", precision=prec)
    ops = [t.operator for t in g.tasks]
    assert "tensor_cast.rms_norm_dynamic_quant_symmetric.default" in ops
    assert "tensor_cast.add_rms_norm_dynamic_quant2_symmetric.default" in ops
    assert ops.count("tensor_cast.dynamic_quantize_symmetric.default") == 2  # o and down
    assert signature(g, "attn.qkv_proj")[:2] == ("tensor_cast.static_quant_linear.default",
                                                 [[8, 4096], [4096, 6144], [], []])
    assert signature(g, "mlp.down_proj_quant")[1] == [[1, 8, 12288]]
    d = graph("default", precision=prec)
    assert "tensor_cast.dynamic_quantize_symmetric.default" not in [t.operator for t in d.tasks]


def test_tensorcast_expert_parallel_moe_layer():
    # Qwen3-30B-A3B at TP4 / EP4, 8 decode tokens (tests/fixtures/tensorcast/
    # qwen3_30b_a3b_decode_ep.json): each TP rank routes its 2 tokens; TensorCast's split
    # puts 2 x 8 = 16 rows on experts 0..15 of every source, so rank 0 computes 4 x 16 rows
    g = graph("tensorcast", "Qwen/Qwen3-30B-A3B", plan=ParallelPlan(tp=4, ep=4))
    assert signature(g, "moe.router")[1] == [[2, 2048], [2048, 128]]
    assert signature(g, "moe.gating.topk") == ("aten.topk.default", [[2, 128]], 48)
    assert signature(g, "moe.permute")[1] == [[2, 2048], [2, 8]]
    dispatch = next(t for t in g.tasks if t.group == "moe.dispatch")
    assert dispatch.outputs[0].shape == (64, 2048)
    up = next(t for t in g.tasks if t.group == "moe.experts.gate_up")
    assert up.operator == "tensor_cast.grouped_matmul_swiglu.default"
    assert up.work.axes["groups"] == 16 and up.work.axes["m"] == 64
    # 64 rows x (2048 x 1536 + 768 x 2048) multiply-adds x 2, as TensorCast counts
    down = next(t for t in g.tasks if t.group == "moe.experts.down")
    assert up.work.flops + down.work.flops == pytest.approx(
        2 * 64 * (2048 * 1536 + 768 * 2048) + 5 * 64 * 768)
    assert signature(g, "moe.tp_all_gather")[1] == [[2, 2048]]
    # the MoE output is viewed back to [1, T, h] for the residual add
    assert signature(g, "mlp.residual_add")[1] == [[1, 8, 2048], [1, 8, 2048]]
    # parameters are those of the default graph: every expert once
    d = graph("default", "Qwen/Qwen3-30B-A3B", plan=ParallelPlan(tp=4, ep=4))
    assert g.param_count(embedding=False) == pytest.approx(d.param_count(embedding=False))


def test_tensorcast_moe_without_ep_loops_over_the_experts_that_get_rows():
    # DeepSeek-V3 at TP8, EP1, 4 decode tokens (tests/fixtures/tensorcast/
    # deepseek_v3_decode_tp8.json): 4 x 8 routed rows land on experts 0..31, one row each,
    # padded to 8 rows (a multiple of TP) for a TP-sharded MLP and an all-reduce
    g = graph("tensorcast", "deepseek-ai/DeepSeek-V3", Batch.decode(4, 2048),
              ParallelPlan(tp=8))
    up = next(t for t in g.tasks if t.group == "moe.experts.rows1.gate_up_proj")
    assert [list(x.shape) for x in up.inputs] == [[8, 7168], [7168, 512]]
    assert up.count == 58 * 32
    assert signature(g, "moe.experts.rows1.pad")[1] == [[1, 7168]]
    assert signature(g, "moe.router")[1] == [[4, 7168], [7168, 256]]  # fp32, all tokens
    assert signature(g, "moe.shared_experts.gate_up_proj")[1] == [[4, 7168], [7168, 4096]]
    d = graph("default", "deepseek-ai/DeepSeek-V3", Batch.decode(4, 2048), ParallelPlan(tp=8))
    # every expert's shard stays resident, whatever receives rows this step
    routed = lambda gr: sum(float(t.attributes.get("weight_params", 0))  # noqa: E731
                            * int(t.attributes.get("layer_count", t.count))
                            * float(t.attributes.get("weight_shards", 1))
                            for t in gr.tasks if t.group.startswith("moe.experts"))
    assert routed(g) == pytest.approx(routed(d))


@pytest.mark.parametrize("model", ["openai/gpt-oss-20b", "Qwen/Qwen3.5-35B-A3B",
                                   "deepseek-ai/DeepSeek-V3", "meta-llama/Llama-4-Scout-17B-16E-Instruct"])
@pytest.mark.parametrize("ep", [1, 4])
def test_tensorcast_moe_keeps_the_parameters(model, ep):
    # expert biases (gpt-oss), the shared-expert gate (Qwen3.5): the same weights either way
    plan = ParallelPlan(tp=4, ep=ep)
    t, d = graph("tensorcast", model, plan=plan), graph("default", model, plan=plan)
    assert t.param_count() == pytest.approx(d.param_count(), rel=1e-12)
    assert t.param_count(active=True) == pytest.approx(d.param_count(active=True), rel=1e-9)


def test_tensorcast_moe_regroup_copy_only_when_some_local_expert_gets_no_rows():
    # decode: 16 routed rows per source over 128 experts leave 16 of rank 0's 32 experts
    # empty (a tensor_cast.cat regroups); prefill of 512: every expert gets rows, no copy
    ops = lambda batch: [t.operator for t in graph(  # noqa: E731
        "tensorcast", "Qwen/Qwen3-30B-A3B", batch, ParallelPlan(tp=4, ep=4)).tasks]
    assert "tensor_cast.cat.default" in ops(Batch.decode(8, 1024))
    assert "tensor_cast.cat.default" not in ops(Batch.prefill(1, 512))
