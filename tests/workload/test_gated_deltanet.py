"""Hybrid gated DeltaNet + gated full attention (Qwen3.5 / Qwen3-Next)."""

from dataclasses import replace

import pytest

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import freeze
from perfcast.workload import Batch, BatchSegment, ParallelPlan, Precision, build_task_graph
from perfcast.workload import load_model_spec
from perfcast.workload.families.gated_deltanet import chunk_flops, prefill_rule_flops

Q397 = "Qwen/Qwen3.5-397B-A17B"
Q27 = "Qwen/Qwen3.5-27B"
BF16 = Precision.uniform("bf16")
# Qwen3.5-397B-A17B: 16 key heads, 64 value heads, dk = dv = 128, conv kernel 4,
# 45 linear layers + 15 full-attention layers (every 4th), hidden 4096
HK, HV, DK, DV, K, H = 16, 64, 128, 128, 4, 4096
CONV = 2 * HK * DK + HV * DV


def graph(model=Q397, plan=ParallelPlan(), batch=Batch.decode(8, 4096), **kw):
    kw.setdefault("precision", BF16)
    return build_task_graph(load_model_spec(model), plan, batch, **kw)


def task(g, lineage):
    return next(t for t in g.tasks if t.lineage == lineage)


def by_group(g, group):
    return [t for t in g.tasks if t.group == group]


def test_param_count_matches_published_total():
    # Qwen3.5-397B-A17B model card: 397B total parameters, 17B activated (the card's
    # total includes the vision encoder, which perfcast does not build: < 0.5B)
    g = graph()
    assert g.param_count() == pytest.approx(397e9, rel=0.01)
    assert g.param_count(active=True) == pytest.approx(17e9, rel=0.03)
    # one linear layer by hand: qkvz, ba, conv, A_log + dt_bias, gated-norm weight, out
    per_gdn = (H * (2 * HK * DK + 2 * HV * DV) + H * 2 * HV + CONV * K + 2 * HV + DV
               + HV * DV * H)
    got = sum(t.attributes.get("weight_params", 0) for t in g.tasks
              if t.lineage.startswith("L0-56:4.gdn."))
    assert got == per_gdn


def test_layer_layout_from_layer_types():
    g = graph()
    assert "L3-59:4.attn.core" in {t.lineage for t in g.tasks}
    linear_layers = sum(t.count for t in by_group(g, "gdn.core"))
    full_layers = sum(t.count for t in by_group(g, "attn.core"))
    assert (linear_layers, full_layers) == (45, 15)


def test_decode_work_and_state_independent_of_context():
    short, long = graph(batch=Batch.decode(8, 1024)), graph(batch=Batch.decode(8, 131072))
    for group in ("gdn.conv1d", "gdn.core", "gdn.in_proj_qkvz", "gdn.out_proj"):
        for a, b in zip(by_group(short, group), by_group(long, group)):
            assert (a.work.flops, a.work.bytes_read, a.work.bytes_written) == (
                b.work.flops, b.work.bytes_read, b.work.bytes_written)
    # the full-attention layers do grow with the context
    assert by_group(long, "attn.core")[0].work.flops > 100 * by_group(short, "attn.core")[0].work.flops
    # recurrent state per request: fp32 S (mamba_ssm_dtype) + bf16 conv state, 45 layers
    state = 45 * (HV * DK * DV * 4 + (K - 1) * CONV * 2)
    assert short.memory.state_bytes_per_request == long.memory.state_bytes_per_request == state
    # the KV cache of the 15 full layers: 2 KV heads x 256 x (K + V) x bf16
    per_token = 15 * 2 * 256 * 2 * 2
    assert short.memory.kv_bytes_per_token == ((0, per_token),)
    assert long.memory.kv_cache == 8 * (state + 131073 * per_token)
    assert long.memory.kv_bytes_per_request(1000) - long.memory.kv_bytes_per_request(10) \
        == 990 * per_token


def test_decode_recurrent_update_by_hand():
    g = graph(batch=Batch.decode(8, 4096))
    core = task(g, "L0-56:4.gdn.core")
    assert core.operation == "gdn_decode"
    assert core.work.flops == 8 * (HV * (7 * DK * DV + 2 * DV) + 6 * HK * DK + 10 * HV)
    state = HV * DK * DV * 4
    qkv = 8 * CONV * 2
    assert core.work.bytes_read == qkv + 8 * 2 * HV * 4 + 8 * state
    assert core.work.bytes_written == 8 * HV * DV * 2 + 8 * state
    conv = task(g, "L0-56:4.gdn.conv1d")
    assert conv.work.flops == 8 * CONV * (2 * K + 4)
    assert conv.operator == "tensor_cast.causal_conv1d_update.default"
    ax = core.work.axes
    assert (ax["num_k_heads"], ax["num_v_heads"], ax["head_k_dim"], ax["d_conv"],
            ax["d_model"], ax["batch"], ax["phase"]) == (HK, HV, DK, K, H, 8, "decode")


def test_prefill_chunked_scan_by_hand():
    # f(c) for one head and chunk of c tokens; a 100-token request = one chunk of 64 + 36
    f = lambda c: 6 * c * c * DK + 4 * c * c * DV + c ** 3 / 3 + 6 * c * DK * DV + DK * DV
    assert chunk_flops(64, DK, DV) == f(64)
    assert prefill_rule_flops(100, DK, DV) == f(64) + f(36)
    g = graph(batch=Batch.prefill(2, 100))
    core = task(g, "L0-56:4.gdn.core")
    assert core.operation == "gdn_prefill"
    assert core.operator == "tensor_cast.chunk_gated_delta_rule.default"
    assert core.work.flops == 2 * HV * (f(64) + f(36)) + 200 * (6 * HK * DK + 10 * HV)
    # linear in the prompt length once it spans whole chunks
    a = task(graph(batch=Batch.prefill(1, 8192)), "L0-56:4.gdn.core").work.flops
    b = task(graph(batch=Batch.prefill(1, 16384)), "L0-56:4.gdn.core").work.flops
    assert b == pytest.approx(2 * a, rel=1e-12)


def _gdn_flops(g):
    return sum(t.work.flops * t.count * t.devices / t.attributes.get("replicas", 1)
               for t in g.tasks if t.group.startswith("gdn."))


def test_tp_splits_heads_and_conserves_work():
    base = graph(batch=Batch.prefill(2, 512))
    for plan in (ParallelPlan(tp=2), ParallelPlan(tp=8, ep=8), ParallelPlan(tp=2, dp=4, ep=8)):
        g = graph(plan=plan, batch=Batch.prefill(2 * plan.dp, 512))
        assert _gdn_flops(g) == pytest.approx(_gdn_flops(base) * plan.dp, rel=1e-9)
        if plan.tp <= 2:  # beyond 2 TP ranks the 2 KV heads are replicated (redundant work)
            assert g.unique_flops() == pytest.approx(base.unique_flops() * plan.dp, rel=1e-9)
        core = task(g, "L0-56:4.gdn.core")
        assert core.work.axes["num_v_heads"] == HV // plan.tp
        assert g.param_count() == pytest.approx(base.param_count(), rel=1e-12)
    with pytest.raises(ConfigError, match="linear_num_key_heads"):
        graph(plan=ParallelPlan(tp=32))


def test_full_attention_layers_match_the_plain_attention_builder():
    hybrid = graph(Q27, batch=Batch.mixed((BatchSegment(4, 1, 2048), BatchSegment(1, 300, 0))))
    m = load_model_spec(Q27)
    raw = {k: v for k, v in m.raw.items() if k not in ("layer_types", "full_attention_interval")}
    plain_model = replace(m, model_type="qwen3", raw=freeze(raw))
    plain = build_task_graph(plain_model, ParallelPlan(),
                             Batch.mixed((BatchSegment(4, 1, 2048), BatchSegment(1, 300, 0))),
                             precision=BF16)
    full = sorted({t.lineage.split(".")[0] for t in by_group(hybrid, "attn.core.decode0")})
    assert full == ["L3-63:4"]
    for group in ("attn.core.decode0", "attn.core.prefill1", "attn.kv_cache_write",
                  "attn.rope", "attn.qk_norm", "attn.o_proj"):
        h, p = by_group(hybrid, group)[0], by_group(plain, group)[0]
        assert (h.operator, h.work.flops, h.work.bytes_read, h.work.bytes_written,
                dict(h.work.axes)) == (p.operator, p.work.flops, p.work.bytes_read,
                                       p.work.bytes_written, dict(p.work.axes))
        assert h.attributes.get("kv_cache_bytes_per_token") == \
            p.attributes.get("kv_cache_bytes_per_token")
    # the output gate is fused into q_proj: exactly heads x head_dim more columns
    hq, pq = by_group(hybrid, "attn.qkv_proj")[0], by_group(plain, "attn.qkv_proj")[0]
    assert hq.work.axes["n"] - pq.work.axes["n"] == m.num_heads * m.head_dim
    assert by_group(hybrid, "attn.output_gate") and not by_group(plain, "attn.output_gate")


def test_quantised_checkpoint_keeps_linear_attention_in_bf16():
    # the NVFP4 checkpoint excludes linear_attn*, self_attn* and the shared experts
    g = build_task_graph(load_model_spec("nvidia/Qwen3.5-397B-A17B-NVFP4"), ParallelPlan(),
                         Batch.decode(1, 100))
    assert task(g, "L0-56:4.gdn.in_proj_qkvz").attributes["weight_dtype"] == "bf16"
    assert task(g, "L0-56:4.moe.experts").attributes["weight_dtype"] == "nvfp4"


def test_missing_linear_attention_field_is_named():
    m = load_model_spec(Q27)
    raw = {k: v for k, v in m.raw.items() if k != "linear_num_value_heads"}
    with pytest.raises(ConfigError, match="linear_num_value_heads"):
        build_task_graph(replace(m, raw=freeze(raw)), ParallelPlan(), Batch.decode(1, 10))


def test_pattern_built_as_four_strided_runs_and_scheduled():
    from perfcast.plan.step import EstimateRequest, estimate_step
    from perfcast.evidence.factory import build_resolver
    from perfcast.hardware import load_system

    g = graph()
    runs = {t.lineage.split(".")[0]: t.attributes.get("layer_step") for t in g.tasks
            if t.layers}
    assert runs == {"L0-56:4": 4, "L1-57:4": 4, "L2-58:4": 4, "L3-59:4": 4}
    assert len(g.tasks) < 100  # 3 linear + 1 full run, not 15 + 1
    system = load_system("h200_sxm")
    for plan in (ParallelPlan(), ParallelPlan(pp=2)):
        r = estimate_step(EstimateRequest(model=load_model_spec(Q397), device=system,
                                          plan=plan, batch=Batch.decode(16, 8192)),
                          build_resolver(system))
        assert 0 < r.latency_s < float("inf")


def test_aiconfigurator_gdn_rows_hit_our_task_keys():
    """Every row of a real gdn_perf slice (SGLang 0.5.14, Qwen3.5-397B at TP4) maps onto the
    operation, phase and axes of a task perfcast builds for the same step."""
    import csv
    from pathlib import Path

    from perfcast.workload.families.gated_deltanet import (
        AIC_GDN_AXES,
        AIC_GDN_KERNELS,
        AIC_GDN_PHASES,
    )

    path = (Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator"
            / "gdn_perf_sglang0.5.14_qwen35_397b_tp4_slice.csv")
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    assert len(rows) == 12
    for row in rows:
        phase = AIC_GDN_PHASES[row["phase"]]
        bs, seq = int(row["batch_size"]), int(row["seq_len"])
        batch = Batch.decode(bs, 4096) if phase == "decode" else Batch.prefill(bs, seq)
        g = graph(plan=ParallelPlan(tp=4), batch=batch)
        op = AIC_GDN_KERNELS[row["kernel_source"]]
        task_ = next(t for t in g.tasks if t.operation == op and t.layers == (0, 56))
        assert task_.work.axes["phase"] == phase
        for column, axis in AIC_GDN_AXES.items():
            assert task_.work.axes[axis] == int(row[column]), (row["kernel_source"], column)
