"""Dense decoder family: Llama, Mistral, Qwen2/Qwen3 (GQA, SwiGLU, RoPE).

One layer's tasks are built once and repeated over all layers (`count`), so the cost of
building and resolving is independent of depth.
"""

from __future__ import annotations

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import UnsupportedModelError
from perfcast.workload.families.common import check_divisible, rms_norm, tp_all_reduce
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.tensors import TensorSpec

SUPPORTED_ACTS = {"silu", "swiglu"}


def kv_bytes_per_token_layer(b: GraphBuilder) -> float:
    """KV-cache bytes one token occupies in one layer on one device."""
    m = b.model
    kv_local = max(1, m.num_kv_heads // b.plan.tp)
    return 2 * kv_local * m.head_dim * dtype_bytes(b.precision.kv_cache)


def build(b: GraphBuilder, layers: tuple[int, int], entry_deps: tuple[str, ...] = (),
          stage: int = 0) -> str:
    """Emit one dense decoder layer repeated over `layers`; return the last lineage."""
    m = b.model
    if m.hidden_act not in SUPPORTED_ACTS:
        raise UnsupportedModelError(f"activation {m.hidden_act!r} is not modelled",
                                    source=m.source, field="hidden_act",
                                    expected=" or ".join(sorted(SUPPORTED_ACTS)))
    tp = b.plan.tp
    heads = check_divisible(m.num_heads, tp, "num_attention_heads", "tp_size")
    if m.num_kv_heads >= tp:
        kv_heads = check_divisible(m.num_kv_heads, tp, "num_key_value_heads", "tp_size")
    else:
        kv_heads = 1  # KV heads are replicated when tp exceeds their count
    inter = check_divisible(m.intermediate_size, tp, "intermediate_size", "tp_size")
    d = m.head_dim
    tokens = b.batch.tokens
    act = b.precision.activation

    norm1 = rms_norm(b, "attn.input_norm", tokens, m.hidden_size, layers=layers, deps=entry_deps,
                     stage=stage)
    qkv_n = (heads + 2 * kv_heads) * d
    unique_qkv = (m.num_heads + 2 * m.num_kv_heads) * d * m.hidden_size
    qkv = b.gemm("attn.qkv_proj", tokens, qkv_n, m.hidden_size, layers=layers, deps=(norm1,),
                 weight_shards=tp, stage=stage,
                 extra={"kv_heads_replicated": m.num_kv_heads < tp,
                        "weight_params": unique_qkv / tp})
    last = qkv
    if m.model_type == "qwen3":  # per-head RMSNorm on q and k
        q = TensorSpec((tokens * (heads + kv_heads), d), act)
        last = b.elementwise("attn.qk_norm", "tensor_cast.rms_norm.default", "norm",
                             inputs=(q,), outputs=(q,), flops=4 * q.numel, layers=layers,
                             deps=(qkv,), weight_params=2 * d, weight_shards=1, stage=stage,
                             extra_bytes_read=2 * d * dtype_bytes(act))
    qk = TensorSpec((tokens, heads + kv_heads, d), act)
    rope = b.elementwise("attn.rope", "tensor_cast.apply_rope.default", "rope", inputs=(qk,),
                         outputs=(qk,), flops=3 * qk.numel, layers=layers, deps=(last,),
                         stage=stage, extra_bytes_read=tokens * d * 4)
    kv_dt = b.precision.kv_cache
    cache = b.elementwise("attn.kv_cache_write", "tensor_cast.reshape_and_cache.default",
                          "kv_cache_write",
                          inputs=(TensorSpec((tokens, 2 * kv_heads, d), act),),
                          outputs=(TensorSpec((tokens, 2 * kv_heads, d), kv_dt),), flops=0,
                          layers=layers, deps=(rope,), stage=stage)
    attn_deps = (cache,)
    lins = []
    segments = b.batch.segments
    for i, seg in enumerate(segments):
        suffix = "" if len(segments) == 1 else f".{'decode' if seg.is_decode else 'prefill'}{i}"
        lins.append(b.attention(
            "attn.core" + suffix, q_heads=heads, kv_heads=kv_heads, qk_head_dim=d, v_head_dim=d,
            num_requests=seg.num_requests, q_tokens=seg.q_tokens,
            context_tokens=seg.context_tokens, window=m.sliding_window, layers=layers,
            deps=attn_deps, stage=stage))
        attn_deps = (lins[-1],)
    o = b.gemm("attn.o_proj", tokens, m.hidden_size, heads * d, layers=layers,
               deps=(lins[-1],), weight_shards=tp, stage=stage)
    ar1 = tp_all_reduce(b, "attn.all_reduce", tokens, m.hidden_size, tp, layers=layers,
                        deps=(o,), stage=stage) or o
    norm2 = rms_norm(b, "mlp.post_attn_norm", tokens, m.hidden_size, layers=layers, deps=(ar1,),
                     stage=stage)
    up = b.gemm("mlp.gate_up_proj", tokens, 2 * inter, m.hidden_size, layers=layers,
                deps=(norm2,), weight_shards=tp, stage=stage)
    gated = TensorSpec((tokens, 2 * inter), act)
    swi = b.elementwise("mlp.act", "tensor_cast.swiglu.default", "activation", inputs=(gated,),
                        outputs=(TensorSpec((tokens, inter), act),), flops=5 * tokens * inter,
                        layers=layers, deps=(up,), stage=stage)
    down = b.gemm("mlp.down_proj", tokens, m.hidden_size, inter, layers=layers, deps=(swi,),
                  weight_shards=tp, stage=stage)
    ar2 = tp_all_reduce(b, "mlp.all_reduce", tokens, m.hidden_size, tp, layers=layers,
                        deps=(down,), stage=stage)
    return ar2 or down
