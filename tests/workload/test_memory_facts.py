"""Per-device memory: weights after sharding/quantisation, KV cache, max batch."""

import pytest

from perfcast.workload import Batch, ParallelPlan, Precision, build_task_graph, load_model_spec
from perfcast.workload.graph import MemoryFacts

GIB = 2**30


def graph(model_id, plan=ParallelPlan(), batch=Batch.decode(8, 1024), **kw):
    return build_task_graph(load_model_spec(model_id), plan, batch, **kw)


def test_dense_weights_are_two_bytes_per_parameter():
    g = graph("meta-llama/Llama-3.1-8B")
    assert g.memory.weights == pytest.approx(2 * g.param_count(), rel=1e-9)


def test_deepseek_tp8_weights_hand_check():
    # fp8 block-quantised: ~1 byte/param (+ 4/16384 scales), bf16 router/norms/head,
    # q_a/kv_a projections and routers replicated on every TP rank
    g = graph("deepseek-ai/DeepSeek-V3", ParallelPlan(tp=8))
    per_device = g.memory.weights
    assert 671e9 / 8 < per_device < 671e9 / 8 * 1.03
    # EP8 with attention DP: the TP-split weights (MLA up-projections and o_proj, dense
    # MLPs, shared experts, embedding and head) are whole on every device; q_a/kv_a and
    # routers were replicated already. fp8 weights: 1 byte + 4 bytes per 128x128 block;
    # the absorbed W_UK/W_UV (kv_b) and the embedding/head are bf16.
    g_dp = graph("deepseek-ai/DeepSeek-V3", ParallelPlan(dp=8, ep=8))
    fp8 = 1 + 4 / (128 * 128)
    split = (61 * (1536 * 128 * 192 + 128 * 128 * 7168) * fp8 + 61 * 512 * 128 * 256 * 2
             + 3 * 3 * 7168 * 18432 * fp8 + 58 * 3 * 7168 * 2048 * fp8 + 2 * 129280 * 7168 * 2)
    assert g_dp.memory.weights - per_device == pytest.approx(split * 7 / 8, rel=1e-3)


def test_kv_cache_split_by_tp_heads_and_dp_requests():
    one = graph("meta-llama/Llama-3.1-70B").memory.kv_cache
    # 80 layers x 8 kv heads x 128 x (K+V) x 2 bytes per token, 8 requests x 1025 tokens
    assert one == 8 * 1025 * 80 * 8 * 128 * 2 * 2
    assert graph("meta-llama/Llama-3.1-70B", ParallelPlan(tp=8)).memory.kv_cache == one / 8
    dp = graph("Qwen/Qwen3-235B-A22B", ParallelPlan(dp=4, ep=4)).memory
    assert dp.kv_cache == graph("Qwen/Qwen3-235B-A22B").memory.kv_cache / 4
    assert dp.dp_ranks == 4


def test_sliding_window_layers_cache_at_most_the_window():
    g = graph("openai/gpt-oss-120b", batch=Batch.decode(2, 4000))
    per_tok_layer = 8 * 64 * 2 * 2  # 8 kv heads x 64 x (K+V) x bf16
    assert dict(g.memory.kv_bytes_per_token) == {0: 18 * per_tok_layer,
                                                128: 18 * per_tok_layer}
    assert g.memory.kv_cache == 2 * (4001 + 128) * 18 * per_tok_layer


def test_paged_blocks_round_up_each_request():
    g = graph("meta-llama/Llama-3.1-8B", batch=Batch.decode(3, 100), block_size=64)
    per_token = 32 * 8 * 128 * 2 * 2
    assert g.memory.kv_cache == 3 * 128 * per_token  # 101 tokens -> 2 pages of 64


def test_max_batch_for_hand_check():
    mem = MemoryFacts(weights=40e9, kv_cache=0.0, activations=1e9, reserve=4e9,
                      kv_bytes_per_token=((0, 100e3), (128, 50e3)), dp_ranks=2)
    per_token_act = MemoryFacts(weights=40e9, kv_cache=0.0, activations=1e9, reserve=5e9,
                                kv_bytes_per_token=((0, 100e3), (128, 50e3)),
                                activations_per_token=16e6)
    assert per_token_act.max_batch_for(4096, 80e9) == int(35e9 // (416e6 + 16e6))
    # a 4096-token request: 4096 x 100 kB + 128 x 50 kB = 416 MB per device
    assert mem.kv_bytes_per_request(4096) == 4096 * 100e3 + 128 * 50e3
    assert mem.max_batch_for(4096, 80e9) == int(35e9 // 416e6) * 2
    assert mem.max_batch_for(4096, 44e9) == 0
    assert mem.total == 45e9


def test_max_batch_for_from_a_real_graph_fits():
    g = graph("meta-llama/Llama-3.1-70B", ParallelPlan(tp=8), reserve_bytes=8 * GIB)
    cap = 141e9
    n = g.memory.max_batch_for(8192, cap)
    fits = graph("meta-llama/Llama-3.1-70B", ParallelPlan(tp=8), Batch.decode(n, 8191),
                 reserve_bytes=8 * GIB)
    too_many = graph("meta-llama/Llama-3.1-70B", ParallelPlan(tp=8),
                     Batch.decode(n + 8, 8191), reserve_bytes=8 * GIB)
    assert fits.memory.total <= cap < too_many.memory.total


def test_quantised_kv_halves_the_cache():
    bf16 = graph("meta-llama/Llama-3.1-8B").memory.kv_cache
    fp8 = graph("meta-llama/Llama-3.1-8B", precision=Precision(kv_cache="fp8")).memory.kv_cache
    assert fp8 == bf16 / 2


def test_recurrent_state_adds_fixed_bytes_per_request():
    from perfcast.workload import GraphBuilder, TensorSpec
    from perfcast.workload.build import memory_facts

    b = GraphBuilder(load_model_spec("meta-llama/Llama-3.1-8B"), ParallelPlan(),
                     Batch.decode(4, 100), Precision())
    x = TensorSpec((4, 16), "bf16")
    b.elementwise("ssm.scan", "tensor_cast.scan.default", "scan", inputs=(x,), outputs=(x,),
                  flops=1, layers=(0, 9), extra={"state_bytes_per_request": 1000.0,
                                                 "requests": 4})
    mem = memory_facts(b.tasks, b.plan)
    assert mem.kv_cache == 4 * 1000.0 * 10
    assert mem.state_bytes_per_request == 10 * 1000.0
    assert mem.kv_bytes_per_request(50) == 10 * 1000.0
