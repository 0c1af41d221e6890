import json

import pytest

from perfcast.core.errors import ConfigError, UnsupportedModelError
from perfcast.workload import Batch, ParallelPlan, build_task_graph, load_model_spec
from perfcast.workload.graph import attended_pairs

LLAMA8 = "meta-llama/Llama-3.1-8B"


def graph(model=LLAMA8, tp=1, pp=1, batch=None, logits="last"):
    return build_task_graph(load_model_spec(model), ParallelPlan(tp=tp, pp=pp),
                            batch or Batch.prefill(1, 2048), logits=logits)


def test_gemm_flops_are_2mnk():
    g = graph(batch=Batch.prefill(2, 1000))
    t = next(t for t in g.tasks if t.group == "attn.o_proj")
    assert (t.work.axes["m"], t.work.axes["n"], t.work.axes["k"]) == (2000, 4096, 4096)
    assert t.work.flops == 2 * 2000 * 4096 * 4096
    assert t.count == 32 and t.lineage == "L0-31.attn.o_proj"
    # bytes: A (m x k) + W (k x n) + out (m x n), bf16
    assert t.work.bytes_read == (2000 * 4096 + 4096 * 4096) * 2
    assert t.work.bytes_written == 2000 * 4096 * 2


def test_llama8b_param_count_matches_published():
    # 8,030,261,248 parameters (HF model card: 8.03B)
    assert graph().param_count() == pytest.approx(8_030_261_248, rel=1e-6)


def test_llama8b_prefill_flops_are_2_params_T_plus_attention():
    T = 2048
    g = graph(batch=Batch.prefill(1, T), logits="all")
    m = g.model
    non_embedding = g.param_count() - m.vocab_size * m.hidden_size  # lookup has no FLOPs
    attention = 2 * m.num_heads * 2 * m.head_dim * (T * (T + 1) / 2) * m.num_layers
    assert g.total_flops() == pytest.approx(2 * non_embedding * T + attention, rel=0.005)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_conserves_gemm_and_attention_flops(tp):
    base = graph(tp=1, batch=Batch.prefill(4, 512))
    sharded = graph(tp=tp, batch=Batch.prefill(4, 512))

    def flops(g, op):
        return sum(t.work.flops * t.count * t.devices for t in g.tasks if t.operation == op)

    for op in ("gemm", "attention"):
        assert flops(sharded, op) == pytest.approx(flops(base, op), rel=1e-12)
    per_rank = sum(t.work.flops * t.count for t in sharded.tasks if t.operation == "gemm")
    assert per_rank * tp == pytest.approx(flops(base, "gemm"), rel=1e-12)


def test_tp_adds_two_all_reduces_per_layer_of_hidden_bytes():
    g = graph(tp=8, batch=Batch.prefill(1, 1000))
    ars = [t for t in g.tasks if t.operation == "all_reduce" and t.layers]
    assert {t.group for t in ars} == {"attn.all_reduce", "mlp.all_reduce"}
    for t in ars:
        assert t.work.message_bytes == 1000 * 4096 * 2 and t.work.participants == 8
        assert t.count == 32
    assert graph(tp=1).tasks and not [t for t in graph(tp=1).tasks if t.operation == "all_reduce"]


def test_decode_attention_reads_whole_kv_cache():
    g = graph(batch=Batch.decode(16, 4096))
    attn = next(t for t in g.tasks if t.operation == "attention")
    m = g.model
    kv_bytes = 16 * 4097 * m.num_kv_heads * 2 * m.head_dim * 2
    assert attn.work.bytes_read == pytest.approx(kv_bytes + 16 * m.num_heads * m.head_dim * 2)
    assert attn.work.flops == 2 * m.num_heads * 2 * m.head_dim * 16 * 4097
    assert attn.work.axes["phase"] == "decode"


def test_attended_pairs_causal_and_window():
    assert attended_pairs(4, 0) == 1 + 2 + 3 + 4
    assert attended_pairs(1, 99) == 100
    assert attended_pairs(4, 0, window=2) == 1 + 2 + 2 + 2
    assert attended_pairs(3, 10, window=4) == 12


def test_memory_breakdown_kv_cache():
    g = graph(tp=2, batch=Batch.decode(8, 1000))
    m = g.model
    per_token = 2 * (m.num_kv_heads // 2) * m.head_dim * 2 * m.num_layers
    assert g.memory.kv_cache == 8 * 1001 * per_token
    assert g.memory.weights == pytest.approx(g.param_count() * 2 / 2, rel=0.01)


def test_mixed_step_has_prefill_and_decode_attention():
    from perfcast.workload import BatchSegment

    g = graph(batch=Batch.mixed((BatchSegment(1, 512, 0), BatchSegment(8, 1, 2000))))
    groups = [t.group for t in g.tasks if t.operation == "attention"]
    assert groups == ["attn.core.prefill0", "attn.core.decode1"]
    assert next(t for t in g.tasks if t.group == "attn.o_proj").work.axes["m"] == 520


def test_pipeline_stages_split_layers_and_add_send_recv():
    g = graph(pp=2)
    stages = {t.stage for t in g.tasks}
    assert stages == {0, 1}
    assert any(t.operation == "send_recv" for t in g.tasks)
    assert g.param_count() == pytest.approx(8_030_261_248, rel=1e-6)


def test_qwen3_has_qk_norm_and_tied_embeddings_counted_once():
    g = build_task_graph(load_model_spec("Qwen/Qwen3-0.6B"), ParallelPlan(), Batch.prefill(1, 16))
    assert any(t.group == "attn.qk_norm" for t in g.tasks)
    # Qwen3-0.6B: 596M parameters with tied embeddings (HF model card: 0.6B; 0.44B non-embedding)
    non_embedding = g.param_count() - g.model.vocab_size * g.model.hidden_size
    assert non_embedding == pytest.approx(0.44e9, rel=0.01)


def test_bad_configs_give_clear_errors(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": "big"}))
    with pytest.raises(ConfigError) as err:
        load_model_spec(p)
    assert "hidden_size" in str(err.value) and str(p) in str(err.value)
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model_spec(tmp_path)
    cfg = json.loads((load_model_spec(LLAMA8).source and open(load_model_spec(LLAMA8).source).read()))
    cfg["model_type"] = "mamba_like"
    p.write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="model_type 'mamba_like'"):
        build_task_graph(load_model_spec(p), ParallelPlan(), Batch.prefill(1, 8))


def test_indivisible_tp_names_constraint():
    with pytest.raises(ConfigError, match="not divisible by tp_size=3"):
        graph(tp=3)


def test_graph_digest_is_stable_and_has_no_durations():
    a, b = graph(), graph()
    assert a.digest == b.digest
    assert graph(tp=2).digest != a.digest
    for t in a.tasks:
        names = {f for f in t.__dataclass_fields__} | set(t.attributes)
        assert not any("latency" in n or "duration" in n for n in names)
