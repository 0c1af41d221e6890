"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): MLA whose core attends only to the
`index_topk` cached positions a lightning indexer selects for each query token.

Indexer of one layer (weights replicated on every TP rank, as vLLM and SGLang hold them;
each rank scores its own tokens' queries identically, `replicas = tp`):

* `dsa.indexer.wq_b` (q_lora_rank -> Hi x di, from the MLA query latent),
  `dsa.indexer.wk` (hidden -> di), `dsa.indexer.weights_proj` (hidden -> Hi),
  `dsa.indexer.k_norm` (LayerNorm over di, weight + bias), RoPE on the rope part of q and
  k, and the write of k to the indexer cache;
* `dsa.indexer` (operation `dsa_indexer`, TensorCast `tensor_cast.dsa_indexer.default`):
  score I(t, s) = sum_h w[t,h] relu(q[t,h] . k[s]) over every causal (query, key) pair,
  then top-k. FLOPs = pairs x (Hi (2 di + 3) + 1) (dot products, relu, weight, sum, one
  compare per score for the top-k). Bytes: q (fp8) and weights (fp32) read, the indexer
  cache read once per request, the fp32 logits written and read back by the top-k, the
  int32 indices written. Grows linearly with the context.

Sparse MLA core (`mla.core`, operation `mla_sparse_attention`, TensorCast
`tensor_cast.mla_sparse_attention[_quant].default`): the absorbed latent form (MQA over the
compressed cache, qk = kv_lora + rope, v = kv_lora, as FlashMLA's sparse kernels run it
for prefill and decode). A query at position p attends to min(p, index_topk) keys, so
pairs = `attended_pairs(q, context, index_topk)` and FLOPs = 2 heads (qk + v) pairs.
Bytes: q read, the selected latent rows gathered per query (pairs x (kv_lora + rope),
L2 reuse ignored), the int32 indices read, o written. Flat in the context beyond
index_topk.

Cache per token and layer: the MLA latent plus the indexer key (`INDEXER_CACHE`).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.core.dtypes import DType, dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.workload.families.attention import segment_suffix
from perfcast.workload.families.common import positive_int_field
from perfcast.workload.graph import GraphBuilder, attended_pairs
from perfcast.workload.model_spec import ModelSpec
from perfcast.workload.tensors import Engine, TensorSpec

DSA_FIELDS = ("index_topk", "index_n_heads", "index_head_dim")

# The indexer keeps its keys in fp8 with one fp32 scale per token (DeepGEMM fp8 MQA
# logits, as vLLM and SGLang store them), whatever the MLA cache dtype.
INDEXER_CACHE = {"dtype": "fp8", "scale_bytes_per_token": 4}

SPARSE_OPERATORS = {
    "tensor_cast.multihead_latent_attention.default": "tensor_cast.mla_sparse_attention.default",
    "tensor_cast.multihead_latent_attention_quant.default":
        "tensor_cast.mla_sparse_attention_quant.default",
}


def dsa_dims(model: ModelSpec) -> dict[str, int]:
    dims = {key: positive_int_field(model, key, "DeepSeek Sparse Attention") for key in DSA_FIELDS}
    if not model.raw.get("q_lora_rank"):
        raise ConfigError("is missing", source=model.source, field="q_lora_rank",
                          expected="a query latent for the DSA indexer's wq_b")
    return dims


def indexer_cache_bytes_per_token(index_head_dim: int) -> float:
    return (index_head_dim * dtype_bytes(INDEXER_CACHE["dtype"])
            + INDEXER_CACHE["scale_bytes_per_token"])


def indexer_flops(pairs: float, index_heads: int, index_head_dim: int) -> float:
    return pairs * (index_heads * (2.0 * index_head_dim + 3.0) + 1.0)


@dataclass
class SparseMla:
    """The hooks `mla.mla_attention(..., sparse=...)` calls for one layer run."""

    b: GraphBuilder
    topk: int
    index_heads: int
    index_head_dim: int
    rope_dim: int
    # layers whose indexer is `shared` reuse the top-k of the last full indexer layer
    # (GLM-5.2 `indexer_types`): no indexer weights, cache or scoring of their own
    shared: bool = False

    @staticmethod
    def for_model(b: GraphBuilder) -> SparseMla:
        d = dsa_dims(b.model)
        rope = int(b.model.raw.get("qk_rope_head_dim") or 0)
        return SparseMla(b, d["index_topk"], d["index_n_heads"], d["index_head_dim"],
                         min(rope, d["index_head_dim"]))

    def indexer(self, b: GraphBuilder, layers, stage: int, *, q_latent: str | None,
                hidden_deps: tuple[str, ...], deps: tuple[str, ...]) -> str:
        if self.shared:
            return deps[0]
        m, tp = b.model, b.plan.tp
        hi, di = self.index_heads, self.index_head_dim
        q_lora = int(m.raw["q_lora_rank"])
        h = m.hidden_size
        tokens = b.local_batch.tokens
        act = b.precision.activation
        wq = b.gemm("dsa.indexer.wq_b", tokens, hi * di, q_lora, layers=layers,
                    deps=(q_latent,) if q_latent else hidden_deps, stage=stage,
                    weight_shards=1, replicas=tp)
        wk = b.gemm("dsa.indexer.wk", tokens, di, h, layers=layers, deps=hidden_deps,
                    stage=stage, weight_shards=1, replicas=tp)
        wp = b.gemm("dsa.indexer.weights_proj", tokens, hi, h, layers=layers,
                    deps=hidden_deps, stage=stage, weight_shards=1, replicas=tp)
        k = TensorSpec((tokens, di), act)
        kn = b.elementwise("dsa.indexer.k_norm", "aten.layer_norm.default", "norm",
                           inputs=(k,), outputs=(k,), flops=5 * k.numel, layers=layers,
                           deps=(wk,), weight_params=2 * di, stage=stage,
                           extra_bytes_read=2 * di * dtype_bytes(act), replicas=tp)
        qk_pe = TensorSpec((tokens, hi + 1, self.rope_dim), act)
        rope = b.elementwise("dsa.indexer.rope", "tensor_cast.apply_rope.default", "rope",
                             inputs=(qk_pe,), outputs=(qk_pe,), flops=3 * qk_pe.numel,
                             layers=layers, deps=(wq, kn), stage=stage,
                             extra_bytes_read=tokens * self.rope_dim * 4, replicas=tp)
        c_dt = INDEXER_CACHE["dtype"]
        write = b.elementwise("dsa.indexer.k_cache_write", "tensor_cast.reshape_and_cache.default",
                              "kv_cache_write", inputs=(k,),
                              outputs=(TensorSpec((tokens, di), c_dt),), flops=0, layers=layers,
                              deps=(rope,), stage=stage, replicas=tp,
                              extra_bytes_read=0.0)
        per_token = indexer_cache_bytes_per_token(di)
        last: tuple[str, ...] = (write, wp) + tuple(deps)
        for i, seg in enumerate(b.local_batch.segments):
            r, q, c = seg.num_requests, seg.q_tokens, seg.context_tokens
            n = seg.tokens
            pairs = attended_pairs(q, c) * r
            kv_len = c + q
            selected = min(self.topk, kv_len)
            q_in = TensorSpec((n, hi, di), c_dt)
            w_in = TensorSpec((n, hi), "fp32")
            out = TensorSpec((n, selected), "int32")
            read = (q_in.nbytes + w_in.nbytes + r * kv_len * per_token + pairs * 4)
            written = pairs * 4 + out.nbytes
            axes = {"batch": r, "q_tokens": q, "kv_len": kv_len, "index_topk": self.topk,
                    "heads": hi, "index_head_dim": di,
                    "phase": "decode" if seg.is_decode else "prefill", "tp_size": tp}
            last = (b.compute(
                "dsa.indexer" + segment_suffix(b, i), "tensor_cast.dsa_indexer.default",
                "dsa_indexer", flops=indexer_flops(pairs, hi, di), bytes_read=read,
                bytes_written=written, inputs=(q_in, w_in), outputs=(out,), axes=axes,
                compute_dtype=c_dt, layers=layers, deps=last, stage=stage, replicas=tp,
                extra={"kv_cache_bytes_per_token": per_token, "cache_window": 0,
                       "cache_name": "indexer", "cache_dtype": c_dt}),)
        return last[0]

    def core(self, group: str, *, q_heads: int, kv_heads: int, qk_head_dim: int,
             v_head_dim: int, num_requests: int, q_tokens: int, context_tokens: int,
             layers=None, deps=(), stage: int = 0,
             operator: str = "tensor_cast.multihead_latent_attention.default",
             operation: str = "mla_attention", axes: dict | None = None,
             extra: dict | None = None, cache_bytes_per_token: float | None = None) -> str:
        b = self.b
        kv_dt = b.precision.kv_cache
        a_dt = b.precision.attention
        if DType(a_dt) in (DType.INT8, DType.FP8):
            operator = "tensor_cast.multihead_latent_attention_quant.default"
        r, q, c = num_requests, q_tokens, context_tokens
        n = r * q
        pairs = attended_pairs(q, c, self.topk) * r
        kv_len = c + q
        flops = 2.0 * q_heads * (qk_head_dim + v_head_dim) * pairs
        gathered = pairs * kv_heads * qk_head_dim * dtype_bytes(kv_dt)  # V is a slice of K
        indices = pairs * 4
        q_in = TensorSpec((n, q_heads, qk_head_dim), DType(a_dt).value)
        out = TensorSpec((n, q_heads, v_head_dim), DType(a_dt).value)
        all_axes = {"batch": r, "q_tokens": q, "kv_len": kv_len, "index_topk": self.topk,
                    "heads": q_heads, "kv_heads": kv_heads, "head_dim": qk_head_dim,
                    "v_head_dim": v_head_dim, "kv_dtype": DType(kv_dt).value,
                    "phase": "decode" if (q == 1 and c > 0) else "prefill", **(axes or {})}
        attrs = dict(extra or {})
        attrs.update(kv_cache_bytes_per_token=float(cache_bytes_per_token or 0.0),
                     cache_window=0, sparse_pairs=float(pairs))
        return b.compute(group, SPARSE_OPERATORS.get(operator, operator),
                         "mla_sparse_attention", flops=flops,
                         bytes_read=q_in.nbytes + gathered + indices,
                         bytes_written=out.nbytes, inputs=(q_in,), outputs=(out,),
                         axes=all_axes, engine=Engine.MATRIX,
                         compute_dtype="fp8" if DType(a_dt) in (DType.FP8, DType.FP8_BLOCK)
                         else DType(a_dt).value, layers=layers, deps=deps, stage=stage,
                         extra=attrs)


INDEXER_TYPES = {"full": False, "shared": True}  # `indexer_types` entry -> shared


def dsa_kinds(model: ModelSpec):
    """Layer kinds with mixer `dsa` (own indexer) or `dsa_shared` (`indexer_types`)."""
    from dataclasses import replace

    from perfcast.workload.families.traits import layer_kinds

    kinds = layer_kinds(model, moe=True)
    types = model.raw.get("indexer_types") or ["full"] * model.num_layers
    if len(types) < model.num_layers or any(t not in INDEXER_TYPES for t in types):
        raise ConfigError(f"has value {list(types)!r}", source=model.source,
                          field="indexer_types",
                          expected=f"one of {', '.join(INDEXER_TYPES)} per layer")
    return [replace(k, mixer="dsa_shared" if INDEXER_TYPES[types[i]] else "dsa")
            for i, k in enumerate(kinds)]


def build(b: GraphBuilder, layers: tuple[int, int], entry_deps: tuple[str, ...] = (),
          stage: int = 0) -> str:
    """DSA (sparse MLA + indexer) attention + MoE FFN with dense-first layers."""
    from dataclasses import replace

    from perfcast.workload.families.mla import mla_attention
    from perfcast.workload.families.moe import build_with_attention

    full = SparseMla.for_model(b)
    shared = replace(full, shared=True)

    def attention(b, run, deps, stage, kind):
        return mla_attention(b, run, deps, stage,
                             sparse=shared if kind.mixer == "dsa_shared" else full)

    return build_with_attention(b, layers, entry_deps, stage, attention,
                                kinds=dsa_kinds(b.model))
