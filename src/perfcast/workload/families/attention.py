"""Grouped-query attention block (Llama, Qwen, Mixtral, gpt-oss, MiniMax-M2).

Heads split over TP; KV heads split too, or replicated when TP exceeds their count.
Under attention data parallelism every DP rank runs this block on its own requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.core.dtypes import dtype_bytes
from perfcast.workload.families.common import check_divisible, tp_all_reduce
from perfcast.workload.families.traits import ArchTraits
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.tensors import TensorSpec


def segment_suffix(b: GraphBuilder, i: int) -> str:
    segments = b.local_batch.segments
    if len(segments) == 1:
        return ""
    return f".{'decode' if segments[i].is_decode else 'prefill'}{i}"


@dataclass(frozen=True)
class AttentionShape:
    """Heads and dims of one kind of attention layer (defaults: the model's)."""

    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    sinks: bool = False


def gqa_attention(b: GraphBuilder, layers: tuple[int, ...], deps: tuple[str, ...], stage: int,
                  *, window: int | None, traits: ArchTraits, chunk: int | None = None,
                  shape: AttentionShape | None = None, rope: bool = True) -> str:
    """QKV projection, optional q/k norm, RoPE (unless `rope=False`: learned positions), cache write, attention per batch segment,
    output projection and the TP all-reduce. Returns the last lineage. `shape` overrides
    the model's head counts and dims for layers of one kind (MiMo-V2-Flash)."""
    m = b.model
    tp = b.plan.tp
    sh = shape or AttentionShape(m.num_heads, m.num_kv_heads, m.head_dim, m.head_dim,
                                 traits.attention_sinks)
    heads = check_divisible(sh.heads, tp, "num_attention_heads", "tp_size")
    if sh.kv_heads >= tp:
        kv_heads = check_divisible(sh.kv_heads, tp, "num_key_value_heads", "tp_size")
    else:
        kv_heads = 1  # KV heads are replicated when tp exceeds their count
    d, dv = sh.head_dim, sh.v_head_dim
    tokens = b.local_batch.tokens
    act = b.precision.activation
    gate = traits.output_gate  # the output gate's weight is fused into q_proj
    qkv_n = heads * (2 if gate else 1) * d + kv_heads * (d + dv)
    unique_qkv = (sh.heads * (2 if gate else 1) * d + sh.kv_heads * (d + dv)) * m.hidden_size
    bias = m.attention_bias or traits.qkv_bias
    extra = {"kv_heads_replicated": sh.kv_heads < tp, "weight_params": unique_qkv / tp}
    if bias:
        extra["bias_params"] = qkv_n
    qkv = b.gemm("attn.qkv_proj", tokens, qkv_n, m.hidden_size, layers=layers, deps=deps,
                 weight_shards=tp, stage=stage, extra=extra)
    last = qkv
    if traits.qk_norm != "none":
        # per_head: one weight of head_dim for q and one for k; per_layer: full widths
        q = TensorSpec((tokens * (heads + kv_heads), d), act)
        per_head = traits.qk_norm == "per_head"
        w = 2 * d if per_head else (heads + kv_heads) * d
        last = b.elementwise("attn.qk_norm", "tensor_cast.rms_norm.default", "norm",
                             inputs=(q,), outputs=(q,), flops=4 * q.numel, layers=layers,
                             deps=(qkv,), weight_params=w, weight_shards=1 if per_head else tp,
                             stage=stage, extra_bytes_read=w * dtype_bytes(act))
    if rope:
        qk = TensorSpec((tokens, heads + kv_heads, d), act)
        last = b.elementwise("attn.rope", "tensor_cast.apply_rope.default", "rope",
                             inputs=(qk,), outputs=(qk,), flops=3 * qk.numel, layers=layers,
                             deps=(last,), stage=stage, extra_bytes_read=tokens * d * 4)
    kv_dt = b.precision.kv_cache
    kv_shape = (tokens, 2 * kv_heads, d) if dv == d else (tokens, kv_heads * (d + dv))
    cache = b.elementwise("attn.kv_cache_write", "tensor_cast.reshape_and_cache.default",
                          "kv_cache_write",
                          inputs=(TensorSpec(kv_shape, act),),
                          outputs=(TensorSpec(kv_shape, kv_dt),), flops=0,
                          layers=layers, deps=(last,), stage=stage)
    attn_deps: tuple[str, ...] = (cache,)
    sinks = {}
    if sh.sinks:
        sinks = {"attention_sinks": True, "weight_params": heads, "weight_shards": tp,
                 "weight_bytes": heads * 4.0}
    for i, seg in enumerate(b.local_batch.segments):
        attn_deps = (b.attention(
            "attn.core" + segment_suffix(b, i), q_heads=heads, kv_heads=kv_heads, qk_head_dim=d,
            v_head_dim=dv, num_requests=seg.num_requests, q_tokens=seg.q_tokens,
            context_tokens=seg.context_tokens, window=window, chunk=chunk, layers=layers,
            deps=attn_deps,
            stage=stage, extra=dict(sinks) if i == 0 else
            {k: v for k, v in sinks.items() if not k.startswith("weight")},
            axes={"sinks": True} if sinks else None),)
    if gate:  # o = attn * sigmoid(gate): ~4 FLOPs for the sigmoid, 1 for the product
        o_in = TensorSpec((tokens, heads * dv), act)
        attn_deps = (b.elementwise("attn.output_gate", "tensor_cast.sigmoid_mul.default",
                                   "activation", inputs=(o_in, o_in), outputs=(o_in,),
                                   flops=5 * o_in.numel, layers=layers, deps=attn_deps,
                                   stage=stage),)
    o_extra = {"bias_params": m.hidden_size} if m.attention_bias else None
    o = b.gemm("attn.o_proj", tokens, m.hidden_size, heads * dv, layers=layers,
               deps=attn_deps, weight_shards=tp, stage=stage, extra=o_extra)
    return tp_all_reduce(b, "attn.all_reduce", tokens, m.hidden_size, tp, layers=layers,
                         deps=(o,), stage=stage) or o
