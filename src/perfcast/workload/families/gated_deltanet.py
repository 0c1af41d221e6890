"""Gated DeltaNet linear-attention layers (Qwen3-Next, Qwen3.5).

One layer: `in_proj_qkvz` (q, k: Hk x dk each; v, z: Hv x dv each) and `in_proj_ba`
(beta and the decay input, Hv each), a short causal depthwise conv1d (kernel K) with
SiLU over the q/k/v channels, the gated delta rule, a gated RMSNorm (norm(o) * silu(z))
and `out_proj`. TP splits Hk and Hv heads (both must divide by tp); the rule runs per
value head (Hv is a multiple of Hk; q/k heads are shared like GQA).

Per request the layer keeps a fixed recurrent state, independent of the context length:
the delta-rule state S (Hv x dk x dv, dtype `mamba_ssm_dtype`, default the activation
dtype) and the conv state ((K - 1) x conv channels, activation dtype).

Exact work (per device; Hk, Hv are the local heads; C = `GDN_CHUNK`):

* delta rule, decode (recurrent update, one token): S <- exp(g) S (dk dv),
  kv = S^T k (2 dk dv), delta = beta (v - kv) (2 dv), S <- S + k delta^T (2 dk dv),
  o = S^T q (2 dk dv): `Hv (7 dk dv + 2 dv)` FLOPs per token. Bytes: S read and written
  once per request, q/k/v/g/beta read, o written.
* delta rule, prefill (chunked scan, WY form as in FLA's `chunk_gated_delta_rule`), per
  head and chunk of c tokens: K K^T (2 c^2 dk), the triangular inverse (c^3 / 3),
  W = T(beta K) (2 c^2 dk), U = T(beta V) (2 c^2 dv), U - W S (2 c dk dv),
  Q K^T (2 c^2 dk), its product with the new values (2 c^2 dv), Q S (2 c dk dv),
  the state update K^T V' (2 c dk dv) and its decay (dk dv):
  `f(c) = 6 c^2 dk + 4 c^2 dv + c^3/3 + 6 c dk dv + dk dv`, summed over the chunks of
  each request (full chunks of C plus the remainder; no padding counted). Bytes:
  q/k/v/g/beta read, o written, the initial state read when the request has context,
  the chunk-boundary states written and read once, the final state written.
* both forms add the per-token gating terms: L2 norms of q and k (3 FLOPs per element:
  6 Hk dk) and the decay/beta gates (10 Hv).
* conv1d: `(2K + 4)` FLOPs per channel and token (K multiply-adds + SiLU); reads the
  input, the weight and (with context) the conv state, writes the output and the state.
"""

from __future__ import annotations

from perfcast.core.dtypes import dtype_bytes, parse_dtype
from perfcast.core.errors import ConfigError
from perfcast.workload.families.attention import segment_suffix
from perfcast.workload.families.common import (check_divisible, positive_int_field,
                                               tp_all_reduce)
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.model_spec import ModelSpec
from perfcast.workload.tensors import Engine, TensorSpec

GDN_CHUNK = 64  # chunk length of the chunked scan (FLA chunk_gated_delta_rule)
GDN_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
              "linear_value_head_dim", "linear_conv_kernel_dim")

# operation -> TensorCast-style operator (no TensorCast mapping exists yet; named after
# the vLLM/SGLang/FLA kernels that AIConfigurator's gdn_perf tables time)
GDN_OPERATORS = {
    "gdn_prefill": "tensor_cast.chunk_gated_delta_rule.default",
    "gdn_decode": "tensor_cast.fused_recurrent_gated_delta_rule.default",
    "gdn_conv1d_prefill": "tensor_cast.causal_conv1d.default",
    "gdn_conv1d_decode": "tensor_cast.causal_conv1d_update.default",
}

# AIConfigurator `gdn_perf` rows -> perfcast tasks (data for an importer): kernel_source ->
# operation, phase -> phase, column -> axis (values per TP rank on both sides)
AIC_GDN_KERNELS = {
    "causal_conv1d_fn": "gdn_conv1d",
    "causal_conv1d_update": "gdn_conv1d",
    "chunk_gated_delta_rule": "gdn_prefill",
    "fused_recurrent_gated_delta_rule": "gdn_decode",
    "fused_recurrent_gated_delta_rule_packed_decode": "gdn_decode",
}
AIC_GDN_PHASES = {"context": "prefill", "generation": "decode"}
AIC_GDN_AXES = {"batch_size": "batch", "seq_len": "seq_len", "num_tokens": "num_tokens",
                "d_model": "d_model", "d_conv": "d_conv", "num_k_heads": "num_k_heads",
                "head_k_dim": "head_k_dim", "num_v_heads": "num_v_heads",
                "head_v_dim": "head_v_dim"}


def gdn_dims(model: ModelSpec) -> dict[str, int]:
    dims = {key: positive_int_field(model, key, "gated DeltaNet layers") for key in GDN_FIELDS}
    if dims["linear_num_value_heads"] % dims["linear_num_key_heads"]:
        raise ConfigError("is not a multiple of linear_num_key_heads", source=model.source,
                          field="linear_num_value_heads", expected="a multiple")
    return dims


def state_dtype(model: ModelSpec, activation: str) -> str:
    text = model.raw.get("mamba_ssm_dtype")
    if not text:
        return activation
    return parse_dtype(text, source=model.source, field="mamba_ssm_dtype").value


def chunk_flops(c: int, dk: int, dv: int) -> float:
    """FLOPs of one head over one chunk of `c` tokens of the chunked gated delta rule."""
    return 6.0 * c * c * dk + 4.0 * c * c * dv + c ** 3 / 3.0 + 6.0 * c * dk * dv + dk * dv


def prefill_rule_flops(q_tokens: int, dk: int, dv: int, chunk: int = GDN_CHUNK) -> float:
    """Per head, one request of `q_tokens` new tokens: full chunks plus the remainder."""
    full, rest = divmod(q_tokens, chunk)
    return full * chunk_flops(chunk, dk, dv) + (chunk_flops(rest, dk, dv) if rest else 0.0)


def decode_rule_flops(dk: int, dv: int) -> float:
    """Per head and token of the recurrent update."""
    return 7.0 * dk * dv + 2.0 * dv


def gating_flops(hk: int, dk: int, hv: int) -> float:
    """Per token: L2 norms of q and k, the decay and beta gates."""
    return 6.0 * hk * dk + 10.0 * hv


def conv1d_flops(tokens: int, channels: int, kernel: int) -> float:
    return tokens * channels * (2.0 * kernel + 4.0)


def gated_deltanet(b: GraphBuilder, layers: tuple[int, ...], deps: tuple[str, ...],
                   stage: int) -> str:
    """Projections, conv1d, gated delta rule per batch segment, gated norm, out_proj and
    the TP all-reduce. Returns the last lineage."""
    m = b.model
    tp = b.plan.tp
    d = gdn_dims(m)
    hk = check_divisible(d["linear_num_key_heads"], tp, "linear_num_key_heads", "tp_size")
    hv = check_divisible(d["linear_num_value_heads"], tp, "linear_num_value_heads", "tp_size")
    dk, dv, kernel = d["linear_key_head_dim"], d["linear_value_head_dim"], d["linear_conv_kernel_dim"]
    h = m.hidden_size
    tokens = b.local_batch.tokens
    act = b.precision.activation
    ab = dtype_bytes(act)
    s_dt = state_dtype(m, act)
    sb = dtype_bytes(s_dt)
    conv_ch = 2 * hk * dk + hv * dv  # q, k, v channels through the conv (local)
    qkvz = b.gemm("gdn.in_proj_qkvz", tokens, 2 * hk * dk + 2 * hv * dv, h, layers=layers,
                  deps=deps, weight_shards=tp, stage=stage)
    ba = b.gemm("gdn.in_proj_ba", tokens, 2 * hv, h, layers=layers, deps=deps,
                weight_shards=tp, stage=stage)
    conv_state = (kernel - 1) * conv_ch * ab
    rule_state = hv * dk * dv * sb
    common_axes = {"d_model": h, "d_conv": kernel, "num_k_heads": hk, "head_k_dim": dk,
                   "num_v_heads": hv, "head_v_dim": dv, "heads": hv, "tp_size": tp}
    last: tuple[str, ...] = (qkvz, ba)
    for i, seg in enumerate(b.local_batch.segments):
        sfx = segment_suffix(b, i)
        r, q, n = seg.num_requests, seg.q_tokens, seg.tokens
        phase = "decode" if seg.is_decode else "prefill"
        has_state = seg.context_tokens > 0
        axes = {**common_axes, "batch": r, "q_tokens": q, "seq_len": q, "num_tokens": n,
                "phase": phase}
        x = TensorSpec((n, conv_ch), act)
        first = i == 0  # the conv weight is counted once per layer run
        conv_w = {"weight_params": conv_ch * kernel, "weight_shards": tp,
                  "weight_bytes": conv_ch * kernel * ab} if first else {}
        conv = b.compute(
            "gdn.conv1d" + sfx, GDN_OPERATORS[f"gdn_conv1d_{phase}"], "gdn_conv1d",
            flops=conv1d_flops(n, conv_ch, kernel),
            bytes_read=x.nbytes + conv_ch * kernel * ab + (r * conv_state if has_state else 0),
            bytes_written=x.nbytes + r * conv_state, inputs=(x,), outputs=(x,),
            axes=axes, engine=Engine.VECTOR, layers=layers, deps=last, stage=stage,
            extra=conv_w)
        if phase == "decode":
            flops = n * (hv * decode_rule_flops(dk, dv) + gating_flops(hk, dk, hv))
            state_read = state_written = r * rule_state
            rule_axes = axes
        else:
            chunks = -(-q // GDN_CHUNK)
            flops = r * hv * prefill_rule_flops(q, dk, dv) + n * gating_flops(hk, dk, hv)
            # chunk-boundary states written and read back once; the initial state read
            # when the request has context; the final state written
            state_read = r * rule_state * (chunks + (1 if has_state else 0))
            state_written = r * rule_state * (chunks + 1)
            rule_axes = {**axes, "chunk_size": GDN_CHUNK}
        qkv_in = TensorSpec((n, 2 * hk * dk + hv * dv), act)
        gates = TensorSpec((n, 2 * hv), "fp32")
        out = TensorSpec((n, hv * dv), act)
        extra = {"state_bytes_per_request": float(rule_state + conv_state), "requests": r,
                 "state_dtype": s_dt}
        if first:  # A_log and dt_bias, fp32, one per value head
            extra.update(weight_params=2 * hv, weight_shards=tp, weight_bytes=2 * hv * 4.0)
        core = b.compute(
            "gdn.core" + sfx, GDN_OPERATORS[f"gdn_{phase}"], f"gdn_{phase}", flops=flops,
            bytes_read=qkv_in.nbytes + gates.nbytes + state_read,
            bytes_written=out.nbytes + state_written, inputs=(qkv_in, gates),
            outputs=(out,), axes=rule_axes,
            engine=Engine.VECTOR if phase == "decode" else Engine.MATRIX,
            layers=layers, deps=(conv,), stage=stage, extra=extra)
        last = (core,)
    o = TensorSpec((tokens, hv * dv), act)
    norm = b.elementwise("gdn.gated_norm", "tensor_cast.rms_norm_gated.default", "norm",
                         inputs=(o, o), outputs=(o,), flops=9 * o.numel, layers=layers,
                         deps=last, weight_params=dv, weight_shards=1, stage=stage,
                         extra_bytes_read=dv * ab)
    out = b.gemm("gdn.out_proj", tokens, h, hv * dv, layers=layers, deps=(norm,),
                 weight_shards=tp, stage=stage)
    return tp_all_reduce(b, "gdn.all_reduce", tokens, h, tp, layers=layers, deps=(out,),
                         stage=stage) or out
