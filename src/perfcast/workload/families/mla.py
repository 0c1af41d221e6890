"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2).

Per token the cache holds the compressed latent `kv_lora_rank` plus the shared RoPE key
`qk_rope_head_dim`, once per layer (not per head, and replicated on every TP rank).

Two forms, chosen per batch segment by a documented rule (`MLA_FORMS`):

* naive (prefill): `kv_b_proj` decompresses the latent of every attended token into
  per-head K_nope and V, then ordinary attention with qk_dim = nope + rope, v_dim = v;
* absorbed (decode): W_UK is folded into the query (`mla.q_absorb`, a bmm over heads),
  attention runs in latent space as MQA over the cache (qk_dim = kv_lora + rope,
  v_dim = kv_lora, one shared K/V head), and W_UV maps the result back
  (`mla.out_absorb`).

`auto` uses absorbed for decode segments (one or a few new tokens over a cached context)
and naive otherwise, as vLLM and SGLang do.
"""

from __future__ import annotations

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.workload.families.attention import segment_suffix
from perfcast.workload.families.common import (check_divisible, positive_int_field, rms_norm,
                                               tp_all_reduce)
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.model_spec import ModelSpec
from perfcast.workload.tensors import TensorSpec

MLA_FORMS = ("auto", "naive", "absorbed")
MLA_FIELDS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def mla_dims(model: ModelSpec) -> dict[str, int]:
    dims = {key: positive_int_field(model, key, "multi-head latent attention") for key in MLA_FIELDS}
    q_lora = model.raw.get("q_lora_rank")
    dims["q_lora_rank"] = int(q_lora) if q_lora else 0
    return dims


def mla_form_for(b: GraphBuilder, is_decode: bool) -> str:
    form = b.options.get("mla_form", "auto")
    if form not in MLA_FORMS:
        raise ConfigError(f"has value {form!r}", field="mla_form", expected=" | ".join(MLA_FORMS))
    if form == "auto":
        return "absorbed" if is_decode else "naive"
    return form


def mla_attention(b: GraphBuilder, layers: tuple[int, ...], deps: tuple[str, ...],
                  stage: int, *, sparse=None) -> str:
    """`sparse`: DeepSeek Sparse Attention hooks (`dsa.SparseMla`): its `indexer` runs
    after the cache write, its `core` replaces dense attention, and every segment uses
    the absorbed form (sparse MLA kernels work in latent space)."""
    m = b.model
    tp = b.plan.tp
    dims = mla_dims(m)
    lora, nope, rope, v = (dims["kv_lora_rank"], dims["qk_nope_head_dim"],
                           dims["qk_rope_head_dim"], dims["v_head_dim"])
    q_lora = dims["q_lora_rank"]
    heads = check_divisible(m.num_heads, tp, "num_attention_heads", "tp_size")
    h = m.hidden_size
    tokens = b.local_batch.tokens
    act = b.precision.activation
    kv_dt = b.precision.kv_cache
    # down-projections are replicated on every TP rank (each computes them for its tokens)
    if q_lora:
        qa = b.gemm("mla.q_a_proj", tokens, q_lora, h, layers=layers, deps=deps, stage=stage,
                    weight_shards=1, replicas=tp)
        qn = rms_norm(b, "mla.q_a_norm", tokens, q_lora, layers=layers, deps=(qa,),
                      residual=False, stage=stage, replicas=tp)
        q = b.gemm("mla.q_b_proj", tokens, heads * (nope + rope), q_lora, layers=layers,
                   deps=(qn,), stage=stage, weight_shards=tp)
    else:
        q = b.gemm("mla.q_proj", tokens, heads * (nope + rope), h, layers=layers, deps=deps,
                   stage=stage, weight_shards=tp)
    kva = b.gemm("mla.kv_a_proj", tokens, lora + rope, h, layers=layers, deps=deps,
                 stage=stage, weight_shards=1, replicas=tp)
    kvn = rms_norm(b, "mla.kv_a_norm", tokens, lora, layers=layers, deps=(kva,),
                   residual=False, stage=stage, replicas=tp)
    q_pe = TensorSpec((tokens, heads, rope), act)
    qr = b.elementwise("mla.q_rope", "tensor_cast.apply_rope.default", "rope", inputs=(q_pe,),
                       outputs=(q_pe,), flops=3 * q_pe.numel, layers=layers, deps=(q,),
                       stage=stage, extra_bytes_read=tokens * rope * 4)
    k_pe = TensorSpec((tokens, rope), act)
    rp = b.elementwise("mla.k_rope", "tensor_cast.apply_rope_single.default", "rope",
                       inputs=(k_pe,), outputs=(k_pe,), flops=3 * k_pe.numel, layers=layers,
                       deps=(qr, kvn), stage=stage, extra_bytes_read=tokens * rope * 4,
                       replicas=tp)
    cache = b.elementwise("mla.kv_cache_write", "tensor_cast.reshape_and_cache.default",
                          "kv_cache_write", inputs=(TensorSpec((tokens, lora + rope), act),),
                          outputs=(TensorSpec((tokens, lora + rope), kv_dt),), flops=0,
                          layers=layers, deps=(rp,), stage=stage, replicas=tp)
    forms = [mla_form_for(b, seg.is_decode) if sparse is None else "absorbed"
             for seg in b.local_batch.segments]
    weights_in_naive = "naive" in forms
    cache_per_token = (lora + rope) * dtype_bytes(kv_dt)
    mla_axes = {"kv_lora_rank": lora, "qk_rope_head_dim": rope, "qk_nope_head_dim": nope,
                "head_dim": nope + rope, "v_head_dim": v, "tp_size": tp}
    last: tuple[str, ...] = (cache,)
    attend = b.attention
    if sparse is not None:
        last = (sparse.indexer(b, layers, stage, q_latent=qn if q_lora else None,
                               hidden_deps=deps, deps=last),)
        attend = sparse.core
    done_naive = done_absorbed = False
    for i, (seg, form) in enumerate(zip(b.local_batch.segments, forms)):
        sfx = segment_suffix(b, i)
        s_tokens = seg.tokens
        common = dict(q_heads=heads, num_requests=seg.num_requests, q_tokens=seg.q_tokens,
                      context_tokens=seg.context_tokens, layers=layers, stage=stage,
                      operator="tensor_cast.multihead_latent_attention.default",
                      operation="mla_attention", cache_bytes_per_token=cache_per_token)
        if form == "naive":
            kv_tokens = seg.num_requests * (seg.context_tokens + seg.q_tokens)
            extra = None if not done_naive else {"weight_params": 0, "weight_bytes": 0.0}
            kvb = b.gemm("mla.kv_b_proj" + sfx, kv_tokens, heads * (nope + v), lora,
                         layers=layers, deps=last, stage=stage, weight_shards=tp, extra=extra)
            done_naive = True
            core = b.attention("mla.core" + sfx, kv_heads=heads, qk_head_dim=nope + rope,
                               v_head_dim=v, deps=(kvb,),
                               axes={**mla_axes, "mla_form": "naive"}, **common)
            last = (core,)
        else:
            shared = weights_in_naive or done_absorbed
            extra = {"weight_params": 0, "weight_bytes": 0.0} if shared else None
            qab = b.gemm("mla.q_absorb" + sfx, s_tokens, lora, nope, batch=heads,
                         layers=layers, deps=last, stage=stage, weight_shards=tp,
                         weight_dtype=act, act_dtype=act, extra=extra)
            core = attend("mla.core" + sfx, kv_heads=1, qk_head_dim=lora + rope,
                               v_head_dim=lora, deps=(qab,),
                               axes={**mla_axes, "mla_form": "absorbed"},
                               extra={"shared_kv": True}, **common)
            oab = b.gemm("mla.out_absorb" + sfx, s_tokens, v, lora, batch=heads,
                         layers=layers, deps=(core,), stage=stage, weight_shards=tp,
                         weight_dtype=act, act_dtype=act, extra=extra)
            done_absorbed = True
            last = (oab,)
    o = b.gemm("mla.o_proj", tokens, h, heads * v, layers=layers, deps=last, stage=stage,
               weight_shards=tp)
    return tp_all_reduce(b, "mla.all_reduce", tokens, h, tp, layers=layers, deps=(o,),
                         stage=stage) or o
