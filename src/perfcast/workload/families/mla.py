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

Two call layouts (`mla_call` build option, `MLA_CALLS`), the same work either way:

* `split` (default): `mla.q_absorb`, `mla.core`, `mla.out_absorb` (or `mla.kv_b_proj`,
  `mla.core`) are separate tasks, each costed on its own;
* `tensorcast`: one `tensor_cast.multihead_latent_attention` call per batch segment
  holding the absorb bmms (or `kv_b_proj`) and the attention, with the inputs TensorCast
  passes (`layers/mla.py`, `ops/mla.py`): q (T, H, nope+rope), the paged latent cache
  (blocks, 128, kv_lora+rope), block table (B, ceil(seq/128)), query_start_loc (B+1),
  seq_lens (B), query_lens (B), W_UK_T (H, nope, kv_lora), W_UV (H, kv_lora, v) and
  kv_b_proj (kv_lora, H*(nope+v)); the cache write is `concat_and_cache_mla`
  (kv_c_normed, k_rot, cache, slot_mapping). A TensorCast profiling database keys its
  MLA rows on that call (`evidence.profiling.decomposers`).
"""

from __future__ import annotations

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.workload.families.attention import segment_suffix
from perfcast.workload.families.common import (check_divisible, dynamic_quantize,
                                               positive_int_field, rms_norm, rope_tables,
                                               separate_activation_quant, sequence_parallel,
                                               tp_all_reduce)
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.model_spec import ModelSpec
from perfcast.workload.tensors import TensorSpec

MLA_FORMS = ("auto", "naive", "absorbed")
MLA_CALLS = ("split", "tensorcast")
# TensorCast's paged-cache geometry: block_size=128 and a pool of
# ceil(batch * (seq_len + spec tokens + 1) / 128) blocks (core/input_generator.py
# generate_inputs); metadata tensors are int64 (torch.long)
TC_BLOCK_SIZE = 128
TC_INDEX_DTYPE = "int64"
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


def mla_call_for(b: GraphBuilder) -> str:
    call = b.options.get("mla_call", "split")
    if call not in MLA_CALLS:
        raise ConfigError(f"has value {call!r}", field="mla_call", expected=" | ".join(MLA_CALLS))
    return call


def _tc_cache(b: GraphBuilder, requests: int, seq_len: int, width: int) -> TensorSpec:
    """TensorCast's paged latent cache of one layer: (blocks, 128, width)."""
    spec = int(b.options.get("mtp_layers", 0) or 0)
    blocks = -(-requests * (seq_len + spec + 1) // TC_BLOCK_SIZE)
    return TensorSpec((blocks, TC_BLOCK_SIZE, width), b.precision.kv_cache)


def _tc_mla_inputs(b: GraphBuilder, seg, heads: int, dims: dict[str, int]) -> tuple:
    """The tensors TensorCast's `multihead_latent_attention` receives for one segment."""
    lora, nope, rope, v = (dims["kv_lora_rank"], dims["qk_nope_head_dim"],
                           dims["qk_rope_head_dim"], dims["v_head_dim"])
    act, idx = b.precision.activation, TC_INDEX_DTYPE
    r, seq_len = seg.num_requests, seg.context_tokens + seg.q_tokens
    return (TensorSpec((seg.tokens, heads, nope + rope), b.precision.attention),
            _tc_cache(b, r, seq_len, lora + rope),
            TensorSpec((r, -(-seq_len // TC_BLOCK_SIZE)), idx),
            TensorSpec((r + 1,), idx), TensorSpec((r,), idx), TensorSpec((r,), idx),
            TensorSpec((heads, nope, lora), act), TensorSpec((heads, lora, v), act),
            TensorSpec((lora, heads * (nope + v)), act))


def _tc_mlapo_inputs(b: GraphBuilder, parts: tuple[str, ...], dims: dict[str, int]) -> tuple:
    """What TensorCast's `mlapo` receives: hidden states, cos, sin (1, T, rope), then
    q_a_proj (q_lora, h), its norm weight, q_b_proj (H*(nope+rope), q_lora) (q_proj
    without q_lora), kv_a_proj (kv_lora+rope, h) and the kv norm weight, (out, in) each."""
    by = {t.lineage: t for t in b.tasks if t.lineage in parts}
    act, tokens, rope = b.precision.activation, b.local_batch.tokens, dims["qk_rope_head_dim"]

    def weight(lineage: str) -> TensorSpec:  # perfcast's (k, n) operand as (n, k)
        w = by[lineage].inputs[1]
        return TensorSpec((w.shape[1], w.shape[0]), w.dtype, w.format)

    hidden = TensorSpec((tokens, b.model.hidden_size), act)
    rot = TensorSpec((1, tokens, rope), act)
    q_lora = dims["q_lora_rank"]
    lin = [ln for ln in parts if by[ln].operation == "gemm"]
    q_side = ((weight(lin[0]), TensorSpec((q_lora,), act), weight(lin[1])) if q_lora
              else (weight(lin[0]),))
    return (hidden, rot, rot, *q_side, weight(lin[-1]),
            TensorSpec((dims["kv_lora_rank"],), act))


def mlapo_quantised(b: GraphBuilder) -> bool:
    """Whether TensorCast's MLA preprocessing is `mlapo_quant` (`layers/mla.py`: when
    q_a_proj, q_b_proj and kv_a_proj carry weight scales): the stack quantises linear
    inputs in separate ops and those weights are int8. The call then takes the hidden
    states unquantised (the norm before it does not quantise)."""
    q_group = "mla.q_a_proj" if mla_dims(b.model)["q_lora_rank"] else "mla.q_proj"
    return (mla_call_for(b) == "tensorcast"
            and all(separate_activation_quant(b, g) and b.precision.linear(g)[0] == "int8"
                    for g in (q_group, "mla.kv_a_proj")))


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
    # the cos/sin rows of the step's positions, when the stack gathers them per step
    deps = (*deps, *rope_tables(b, stage, rope))
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
    tc_call = mla_call_for(b) == "tensorcast"
    if tc_call:  # TensorCast's one pre-attention call: projections, norms and RoPE
        pre = (qa, qn, q, kva, kvn, qr, rp) if q_lora else (q, kva, kvn, qr, rp)
        inputs = _tc_mlapo_inputs(b, pre, dims)
        quant = mlapo_quantised(b)
        if quant:  # q_a_proj, q_b_proj, kv_a_proj scales (their offsets are None)
            inputs += (TensorSpec((), "fp32"),) * 3
        rp = b.fuse(pre, q, group="mla.mlapo",
                    operator=f"tensor_cast.{'mlapo_quant' if quant else 'mlapo'}.default",
                    operation="mlapo", inputs=inputs,
                    outputs=(TensorSpec((tokens, heads, nope + rope), act),
                             TensorSpec((tokens, lora), act), TensorSpec((tokens, rope), act))
                    + ((TensorSpec((tokens, q_lora), act),) if q_lora else ()),
                    axes={"num_heads": heads, "qk_nope_head_dim": nope,
                          "qk_rope_head_dim": rope, "kv_lora_rank": lora,
                          "q_lora_rank": q_lora, "tp_size": tp,
                          "sequence_parallel": int(sequence_parallel(b))})
        qn = rp
    cache = b.elementwise("mla.kv_cache_write", "tensor_cast.reshape_and_cache.default",
                          "kv_cache_write", inputs=(TensorSpec((tokens, lora + rope), act),),
                          outputs=(TensorSpec((tokens, lora + rope), kv_dt),), flops=0,
                          layers=layers, deps=(rp,), stage=stage, replicas=tp)
    if tc_call:  # same work, TensorCast's operator and inputs
        loc = b.local_batch
        seq = max(s.context_tokens + s.q_tokens for s in loc.segments)
        cache = b.fuse((cache,), cache, operator="tensor_cast.concat_and_cache_mla.default",
                       inputs=(TensorSpec((tokens, lora), act), TensorSpec((tokens, rope), act),
                               _tc_cache(b, loc.num_requests, seq, lora + rope),
                               TensorSpec((tokens,), TC_INDEX_DTYPE)))
    forms = [mla_form_for(b, seg.is_decode) if sparse is None else "absorbed"
             for seg in b.local_batch.segments]
    weights_in_naive = "naive" in forms
    cache_per_token = (lora + rope) * dtype_bytes(kv_dt)
    mla_axes = {"kv_lora_rank": lora, "qk_rope_head_dim": rope, "qk_nope_head_dim": nope,
                "head_dim": nope + rope, "v_head_dim": v, "tp_size": tp,
                "projections_in_call": int(tc_call)}
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
            parts = (kvb, core)
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
            parts = (qab, core, oab)
        if tc_call:
            inputs = _tc_mla_inputs(b, seg, heads, dims)
            if sparse is not None:  # the indexer's top-k positions, (1, T, topk) int64
                inputs += (TensorSpec((1, s_tokens, sparse.topk), TC_INDEX_DTYPE),)
            core = b.fuse(parts, core, inputs=inputs,
                          outputs=(TensorSpec((s_tokens, heads, v), act),))
            last = (core,)
        else:
            last = (parts[-1],)
    if separate_activation_quant(b, "mla.o_proj"):  # on the (T, H, v) attention output
        last = (dynamic_quantize(b, "mla.o_proj_quant", tokens, heads * v, layers=layers,
                                 deps=last, stage=stage, view=(tokens, heads, v)),)
    o = b.gemm("mla.o_proj", tokens, h, heads * v, layers=layers, deps=last, stage=stage,
               weight_shards=tp)
    return tp_all_reduce(b, "mla.all_reduce", tokens, h, tp, layers=layers, deps=(o,),
                         stage=stage) or o
