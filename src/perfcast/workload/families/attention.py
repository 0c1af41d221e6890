"""Grouped-query attention block (Llama, Qwen, Mixtral, gpt-oss, MiniMax-M2).

Heads split over TP; KV heads split too, or replicated when TP exceeds their count.
Under attention data parallelism every DP rank runs this block on its own requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.core.dtypes import dtype_bytes
from perfcast.workload.families.common import (
    check_divisible,
    dynamic_quantize,
    rope_tables,
    separate_activation_quant,
    tp_all_reduce,
)
from perfcast.workload.families.traits import ArchTraits
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.tensors import TensorSpec


def segment_suffix(b: GraphBuilder, i: int) -> str:
    segments = b.local_batch.segments
    if len(segments) == 1:
        return ""
    return f".{'decode' if segments[i].is_decode else 'prefill'}{i}"


def rotary_dim(model, head_dim: int) -> int:
    """Channels of each head that RoPE rotates (`partial_rotary_factor`, default all)."""
    factor = model.raw.get("partial_rotary_factor")
    if factor is None:
        factor = (model.raw.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0)
    return int(head_dim * float(factor))


@dataclass(frozen=True)
class PagedCache:
    """The paged KV cache as TensorCast's input generator sizes it: `blocks` blocks of
    `block_size` tokens holding every request's context, new tokens, MTP slots and one
    spare slot; `cache` is the [2, blocks, block_size, kv_heads, d] tensor
    `reshape_and_cache` writes (K and V stacked)."""

    blocks: int
    block_size: int
    cache: TensorSpec
    k_cache: TensorSpec
    v_cache: TensorSpec

    def attention_call(self, seg, heads: int, d: int, dv: int, act: str):
        """(inputs, outputs) of `tensor_cast.attention` for one batch segment: q [T, h*d],
        the K and V caches, the block table [requests, blocks per request],
        query_start_loc [requests + 1], seq_lens and query_lens [requests]."""
        requests, tokens = seg.num_requests, seg.num_requests * seg.q_tokens
        seq = seg.context_tokens + seg.q_tokens
        idx = "int64"
        return ((TensorSpec((tokens, heads * d), act), self.k_cache, self.v_cache,
                 TensorSpec((requests, -(-seq // self.block_size)), idx),
                 TensorSpec((requests + 1,), idx), TensorSpec((requests,), idx),
                 TensorSpec((requests,), idx)),
                (TensorSpec((tokens, heads * dv), act),))


def paged_cache(b: GraphBuilder, kv_heads: int, d: int, dv: int, kv_dt: str) -> PagedCache:
    bs = b.stack.kv_block_size
    extra = int(b.options.get("mtp_layers", 0)) + 1
    slots = sum((s.context_tokens + s.q_tokens + extra) * s.num_requests
                for s in b.local_batch.segments)
    blocks = -(-slots // bs)
    return PagedCache(blocks=blocks, block_size=bs,
                      cache=TensorSpec((2, blocks, bs, kv_heads, d), kv_dt),
                      k_cache=TensorSpec((blocks, bs, kv_heads, d), kv_dt),
                      v_cache=TensorSpec((blocks, bs, kv_heads, dv), kv_dt))


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
    tc = b.stack.tensorcast_tensors
    if traits.qk_norm != "none":
        # per_head: one weight of head_dim for q and one for k; per_layer: full widths
        per_head = traits.qk_norm == "per_head"
        if b.stack.qk_norm == "separate":
            for name, n in (("q", heads), ("k", kv_heads)):
                x = TensorSpec((tokens, n * d), act)
                w = d if per_head else n * d
                view = TensorSpec((1, tokens, n, d) if per_head else (1, tokens, n * d), act)
                gamma = TensorSpec((w,), act)
                last = b.elementwise(
                    f"attn.{name}_norm", "tensor_cast.rms_norm.default", "norm",
                    inputs=(x, gamma), outputs=(x,), flops=4 * x.numel, layers=layers,
                    deps=(last,), weight_params=w, weight_shards=1 if per_head else tp,
                    stage=stage, signature=((view, gamma), (view,)) if tc else None)
        else:
            q = TensorSpec((tokens * (heads + kv_heads), d), act)
            w = 2 * d if per_head else (heads + kv_heads) * d
            last = b.elementwise("attn.qk_norm", "tensor_cast.rms_norm.default", "norm",
                                 inputs=(q,), outputs=(q,), flops=4 * q.numel, layers=layers,
                                 deps=(qkv,), weight_params=w,
                                 weight_shards=1 if per_head else tp, stage=stage,
                                 extra_bytes_read=w * dtype_bytes(act))
    if rope:
        rd = rotary_dim(m, d)
        tables = rope_tables(b, stage, rd)
        qk = TensorSpec((tokens, heads + kv_heads, d), act)
        signature = None
        if tc:
            cos = TensorSpec((1, tokens, rd), act)
            signature = ((TensorSpec((1, kv_heads, tokens, d), act),
                          TensorSpec((1, heads, tokens, d), act), cos, cos),
                         (TensorSpec((1, tokens, kv_heads, d), act),
                          TensorSpec((1, tokens, heads, d), act)))
        last = b.elementwise("attn.rope", "tensor_cast.apply_rope.default", "rope",
                             inputs=(qk,), outputs=(qk,), flops=3 * qk.numel, layers=layers,
                             deps=(last, *tables), stage=stage,
                             extra_bytes_read=tokens * d * 4, signature=signature)
    kv_dt = b.precision.kv_cache
    kv_shape = (tokens, 2 * kv_heads, d) if dv == d else (tokens, kv_heads * (d + dv))
    paged = paged_cache(b, kv_heads, d, dv, kv_dt) if tc else None
    cache = b.elementwise("attn.kv_cache_write", "tensor_cast.reshape_and_cache.default",
                          "kv_cache_write",
                          inputs=(TensorSpec(kv_shape, act),),
                          outputs=(TensorSpec(kv_shape, kv_dt),), flops=0,
                          layers=layers, deps=(last,), stage=stage,
                          signature=((TensorSpec((tokens, kv_heads * d), act),
                                      TensorSpec((tokens, kv_heads * dv), act),
                                      paged.cache, TensorSpec((tokens,), "int64")), ())
                          if paged else None)
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
            axes={"sinks": True} if sinks else None,
            signature=paged.attention_call(seg, heads, d, dv, act) if paged else None),)
    if gate:  # o = attn * sigmoid(gate): ~4 FLOPs for the sigmoid, 1 for the product
        o_in = TensorSpec((tokens, heads * dv), act)
        attn_deps = (b.elementwise("attn.output_gate", "tensor_cast.sigmoid_mul.default",
                                   "activation", inputs=(o_in, o_in), outputs=(o_in,),
                                   flops=5 * o_in.numel, layers=layers, deps=attn_deps,
                                   stage=stage),)
    if separate_activation_quant(b, "attn.o_proj"):
        attn_deps = (dynamic_quantize(b, "attn.o_proj_quant", tokens, heads * dv,
                                      layers=layers, deps=attn_deps, stage=stage),)
    o_extra = {"bias_params": m.hidden_size} if m.attention_bias else None
    o = b.gemm("attn.o_proj", tokens, m.hidden_size, heads * dv, layers=layers,
               deps=attn_deps, weight_shards=tp, stage=stage, extra=o_extra)
    return tp_all_reduce(b, "attn.all_reduce", tokens, m.hidden_size, tp, layers=layers,
                         deps=(o,), stage=stage) or o
