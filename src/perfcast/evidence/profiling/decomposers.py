"""Registered composite decomposers: one perfcast operator -> the NPU kernels it runs as,
derived from the operator's work axes at lookup time.

`COMPOSITE_DECOMPOSERS` is a constant table; `ProfilingDataSource` accepts extra or
replacement entries through its constructor (no registry is mutated at import time).
The registry, not the YAML `decomposer: true` hint, controls runtime dispatch.

Every sub-kernel carries the work it stands for (`SubKernelWork`), so a PARTIAL
composite can price the sub-kernels that have no row with the analytic model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.data_source import LookupMiss
from perfcast.evidence.profiling.kernel_csv import query_dtype
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping
from perfcast.evidence.profiling.query_paths.attention import AttentionParams
from perfcast.evidence.profiling.query_paths.common import Candidate, core_envelope
from perfcast.evidence.profiling.residuals import line_details, measured_details

Shape = tuple[int, ...]


@dataclass(frozen=True)
class SubKernelWork:
    """What one sub-kernel computes (for its analytic price when it has no row)."""

    operation: str                       # gemm | mla_attention | norm
    flops: float
    bytes_read: float
    bytes_written: float
    dims: tuple[tuple[str, int | str], ...] = ()
    engine: str = "matrix"


@dataclass(frozen=True)
class SubKernelSpec:
    kernel_type: str
    input_shapes: tuple[Shape, ...] = ()
    dtype: str = "bf16"                     # canonical dtype of every input
    attention: AttentionParams | None = None  # set for attention sub-kernels
    tc_input_count: int | None = None
    alternate_kernel_types: tuple[str, ...] = ()  # same inputs, other kernels
    # the same sub-kernel as other kernels with their own input layout, tried in order
    alternatives: tuple[SubKernelSpec, ...] = ()
    work: SubKernelWork | None = None
    input_dtypes: tuple[str, ...] = ()  # per input, where they differ (else `dtype` for all)
    # an opaque kernel looked up by its semantic key (`runtime`) rather than by input
    # shapes: `query(ctx, spec) -> Candidate | LookupMiss` (e.g. `query_mla_preprocess`)
    query: Callable[[Any, SubKernelSpec], Candidate | LookupMiss] | None = None
    runtime: tuple[tuple[str, int | str | bool], ...] = ()

    @property
    def kernel_types(self) -> tuple[str, ...]:
        return (self.kernel_type, *self.alternate_kernel_types)

    @property
    def inputs(self) -> list[tuple[Shape, str]]:
        """(shape, canonical dtype) of every input, as the compute path matches them."""
        return list(zip(self.input_shapes,
                        self.input_dtypes or (self.dtype,) * len(self.input_shapes)))

    @property
    def candidates(self) -> tuple[SubKernelSpec, ...]:
        return (self, *self.alternatives)


Decomposer = Callable[[OpInvokeInfo, OperatorMapping], "list[SubKernelSpec] | None"]

MLA_AXES = ("q_tokens", "kv_len", "heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim")

# Batched-matmul kernels and the operand layout each records, inputs (x, w):
# TransposeBatchMatMul is torch_npu.npu_transpose_batchmatmul with perm_x1=[1,0,2]: x
# token-first (T, H, K) against w (H, K, N) (the real fixture's "4,16,128;16,128,512");
# BatchMatMulV2 / BatchMatMulNd / QuantBatchMatmulV3 are torch.bmm after
# x.transpose(0, 1): heads-first (H, T, K) x (H, K, N) (vllm-ascend mla_v1.py
# `_q_proj_and_k_up_proj` / `_v_up_proj`).
TOKEN_FIRST_BMM = frozenset({"TransposeBatchMatMul"})
# kernels that may run each absorb bmm, in default order (the first with a row wins)
Q_ABSORB_KERNELS = (("BatchMatMulV2", "BatchMatMulNd"), ("TransposeBatchMatMul",))
OUT_ABSORB_KERNELS = (("TransposeBatchMatMul",), ("BatchMatMulV2", "BatchMatMulNd"))


def _bmm_work(t: int, h: int, k: int, n: int, elem: float) -> SubKernelWork:
    return SubKernelWork("gemm", 2.0 * h * t * k * n, (h * t * k + h * k * n) * elem,
                         h * t * n * elem, (("m", t), ("n", n), ("k", k), ("batch", h)))


def _bmm(groups: tuple[tuple[str, ...], ...], listed: tuple[str, ...], t: int, h: int,
         k: int, n: int, dt: str, elem: float, tc_input_count: int | None = None
         ) -> SubKernelSpec:
    """One absorb bmm: a spec per kernel group with that group's layout. Groups the
    mapping lists among its `sub_kernels` are tried first (its own declaration)."""
    order = sorted(groups, key=lambda g: not any(k_ in listed for k_ in g))
    work = _bmm_work(t, h, k, n, elem)
    specs = [SubKernelSpec(g[0], ((t, h, k) if g[0] in TOKEN_FIRST_BMM else (h, t, k),
                                  (h, k, n)), dt, tc_input_count=tc_input_count,
                           alternate_kernel_types=g[1:], work=work) for g in order]
    return replace(specs[0], alternatives=tuple(specs[1:]))


def _mla(op: OpInvokeInfo, mapping: OperatorMapping, q_absorb: tuple[tuple[str, ...], ...]
         ) -> list[SubKernelSpec] | None:
    """Multi-head latent attention on vLLM-Ascend (TensorCast's
    `multihead_latent_attention`, whose call holds the absorb bmms / kv_b_proj):

    decode  (one new token per request): q_nope @ W_UK_T as a batched matmul
            (TransposeBatchMatMul token-first (T,H,nope)x(H,nope,lora), or BatchMatMulV2 /
            BatchMatMulNd heads-first (H,T,nope)x(H,nope,lora)) + FIA over the latent
            cache (Q (B,H,1,lora), one KV head, no mask) + out @ W_UV
            (TransposeBatchMatMul (T,H,lora)x(H,lora,v), else BatchMatMulV2 heads-first);
    prefill: MatMulV2(kv_c @ kv_b_proj) (T,lora)x(lora,H*(nope+v)) + FIA on the
            decompressed K/V (Q (T,H,nope), H KV heads, causal).

    With `projections_in_call` 0 (perfcast's split layout: the bmms / kv_b_proj are
    tasks of their own) only the FIA sub-kernel is the operator's.
    Axes: q_tokens (per request), batch (requests), kv_len, heads (local), kv_lora_rank,
    qk_nope_head_dim, v_head_dim; qk_rope_head_dim and kv_dtype size the analytic work."""
    if not op.inputs or any(op.dim(a) is None for a in MLA_AXES):
        return None
    dt = query_dtype(op.inputs[0].dtype)
    a_b = dtype_bytes(op.inputs[0].dtype)
    kv_b = dtype_bytes(str(op.dim("kv_dtype", op.inputs[0].dtype)))
    q_tokens, kv_len, h = int(op.dim("q_tokens")), int(op.dim("kv_len")), int(op.dim("heads"))
    lora, nope, v = (int(op.dim("kv_lora_rank")), int(op.dim("qk_nope_head_dim")),
                     int(op.dim("v_head_dim")))
    rope = int(op.dim("qk_rope_head_dim", 0) or 0)
    batch = int(op.dim("batch", 1) or 1)
    inside = bool(int(op.dim("projections_in_call", 1)))
    listed = tuple(mapping.sub_kernels)
    t = batch * q_tokens
    if q_tokens == 1 and kv_len > 1:
        fia = SubKernelSpec("FusedInferAttentionScore", dtype=dt, attention=AttentionParams(
            q_shape_3d=(batch, h, lora), avg_seq_len=kv_len, dtype=dt, sparse_mode=0,
            num_kv_heads=1), work=SubKernelWork(
                "mla_attention", 2.0 * h * (2 * lora + rope) * batch * kv_len,
                batch * h * (lora + rope) * a_b + batch * kv_len * (lora + rope) * kv_b,
                batch * h * lora * a_b,
                (("batch", batch), ("q_tokens", 1), ("kv_len", kv_len), ("heads", h),
                 ("kv_heads", 1), ("head_dim", lora + rope), ("v_head_dim", lora),
                 ("phase", "decode"))))
        if not inside:
            return [fia]
        quant = q_absorb[0][0] == "QuantBatchMatmulV3"
        return [_bmm(q_absorb, listed, t, h, nope, lora, dt, a_b, 2 if quant else None),
                fia, _bmm(OUT_ABSORB_KERNELS, listed, t, h, lora, v, dt, a_b)]
    context = kv_len - q_tokens
    pairs = batch * (q_tokens * context + q_tokens * (q_tokens + 1) / 2)
    fia = SubKernelSpec("FusedInferAttentionScore", dtype=dt, attention=AttentionParams(
        q_shape_3d=(t, h, nope), avg_seq_len=kv_len, dtype=dt, sparse_mode=3,
        num_kv_heads=h), work=SubKernelWork(
            "mla_attention", 2.0 * h * (nope + rope + v) * pairs,
            (t * h * (nope + rope) + batch * kv_len * h * (nope + rope + v)) * a_b,
            t * h * v * a_b,
            (("batch", batch), ("q_tokens", q_tokens), ("kv_len", kv_len), ("heads", h),
             ("kv_heads", h), ("head_dim", nope + rope), ("v_head_dim", v),
             ("phase", "prefill"))))
    if not inside:
        return [fia]
    n = h * (nope + v)
    return [SubKernelSpec("MatMulV2", ((t, lora), (lora, n)), dt, tc_input_count=2,
                          work=SubKernelWork("gemm", 2.0 * t * lora * n,
                                             (t * lora + lora * n) * a_b, t * n * a_b,
                                             (("m", t), ("n", n), ("k", lora)))),
            fia]


def decompose_mla(op: OpInvokeInfo, mapping: OperatorMapping) -> list[SubKernelSpec] | None:
    return _mla(op, mapping, Q_ABSORB_KERNELS)


def decompose_mla_quant(op: OpInvokeInfo, mapping: OperatorMapping) -> list[SubKernelSpec] | None:
    return _mla(op, mapping, (("QuantBatchMatmulV3",),))


def _gemm(t: int, n: int, k: int, weight: Shape, dt: str, elem: float) -> SubKernelSpec:
    """A MatMulV2 of (t, k) activations by a weight stored (n, k), TensorCast's shapes."""
    return SubKernelSpec("MatMulV2", ((t, k), weight), dt, tc_input_count=2,
                         work=SubKernelWork("gemm", 2.0 * t * n * k, (t * k + n * k) * elem,
                                            t * n * elem, (("m", t), ("n", n), ("k", k))))


def _norm_work(flops: float, read: float, written: float) -> SubKernelWork:
    return SubKernelWork("norm", flops, read, written, engine="vector")


def _mapping_options(mapping: OperatorMapping, name: str) -> dict:
    """`decomposer_options.<name>` of a mapping entry ({} when absent)."""
    opts = mapping.extra.get("decomposer_options") or {}
    node = opts.get(name) if isinstance(opts, dict) else None
    if not isinstance(opts, dict) or not isinstance(node, dict | None):
        raise ConfigError(f"has value {opts!r}",
                          field=f"operator_mappings.{mapping.name}.decomposer_options",
                          expected=f"a mapping whose {name} is a mapping")
    return node or {}


def _quant_work(t: int, width: int, elem: float) -> SubKernelWork:
    """AscendQuantV2: per-tensor int8 quantisation (scale, offset, round)."""
    return _norm_work(3.0 * t * width, (t * width + 2 * width) * elem, float(t * width))


def _qbmm(t: int, n: int, k: int, weight: Shape) -> SubKernelSpec:
    """A QuantBatchMatmulV3 of int8 (t, k) activations by an int8 weight (n, k)."""
    return SubKernelSpec("QuantBatchMatmulV3", ((t, k), weight), "int8", tc_input_count=2,
                         input_dtypes=("int8", "int8"),
                         work=SubKernelWork("gemm", 2.0 * t * n * k, float(t * k + n * k),
                                            2.0 * t * n, (("m", t), ("n", n), ("k", k))))


def _ascend_quant(t: int, width: int, dt: str, elem: float) -> SubKernelSpec:
    return SubKernelSpec("AscendQuantV2", ((t, width), (width,), (width,)), dt,
                         tc_input_count=3, alternate_kernel_types=("AscendQuantV2Aicore",),
                         work=_quant_work(t, width, elem))


def _int_dim(op: OpInvokeInfo, name: str) -> int | None:
    v = op.dim(name)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 \
        and v == int(v) else None


def decompose_mlapo(op: OpInvokeInfo, mapping: OperatorMapping) -> list[SubKernelSpec] | None:
    """TensorCast's `mlapo` (hidden, cos, sin, q_a_proj, q_a norm, q_b_proj, kv_a_proj, kv
    norm) as vLLM-Ascend runs it, after TensorCast's `_decompose_mlapo_common` (BF16,
    `_decompose_mlapo`; profiling_data_source.py, msModeling 84fec853):

    1. MatMulV2 hidden (T, h) x fused_qkv_a_proj (q_lora + kv_lora + rope, h);
    2. RmsNorm (T, q_lora) with its (q_lora,) weight;
    3. MatMulV2 (T, q_lora) x q_b_proj as passed (H * (nope + rope), q_lora);
    4. KvRmsNormRopeCache (kv norm + RoPE + the cache write). With the mapping's
       `decomposer_options.kv_cache_query.mode: pool_dim0_agnostic` its row is matched on
       kv (T,1,1,kv_lora+rope), gamma (kv_lora,), cos, sin (T,1,1,rope), slots (T,) int64
       and the two cache pools (P, block_size, 1, rope) and (P, block_size, 1, kv_lora),
       whose capacity P is not matched (an allocation choice; here the fewest blocks
       holding the call's tokens); without a mode, on kv (T,1,1,kv_lora+rope) alone.

    A call without q_lora (no q_a_proj) is not decomposed, as in TensorCast."""
    return _mlapo(op, mapping, quant=False)


def decompose_mlapo_quant(op: OpInvokeInfo, mapping: OperatorMapping
                          ) -> list[SubKernelSpec] | None:
    """TensorCast's `mlapo_quant` (W8A8; `_decompose_mlapo_quant`, the same
    `_decompose_mlapo_common`). Two regimes, chosen by the mapping's
    `decomposer_options.visible_kernel_regime`:

    * `requires_sequence_parallel` and the call not sequence-parallel (the CANN 8.5
      mapping's decode case): one opaque `opaque_kernel.kernel_type`
      (`mla_preprocess_0_mix_aic`) queried by its semantic key
      (`query_mode: mlapo_preprocess`, `query_mla_preprocess`): tokens, hidden size,
      local heads, q_lora, kv_lora, nope and rope dims from the call, block size, cache
      and quant modes, inner output, weight quantisation and format from the mapping.
      Not decomposed unless the three projection weights are int8 and the call carries
      its integer arguments;
    * otherwise the visible kernels: AscendQuantV2 (T, h) + QuantBatchMatmulV3
      (T, h) x (q_lora + kv_lora + rope, h) int8 + RmsNorm (T, q_lora) + AscendQuantV2
      (T, q_lora) + QuantBatchMatmulV3 (T, q_lora) x (H * (nope + rope), q_lora) int8 +
      KvRmsNormRopeCache as for `mlapo`; under sequence parallelism with
      `projection_token_partition: tp` at T / tp tokens (T must divide; so for `mlapo`
      too), and with `reconstruct_q_heads_by_tp` at H x tp heads."""
    return _mlapo(op, mapping, quant=True)


def _mlapo(op: OpInvokeInfo, mapping: OperatorMapping, quant: bool
           ) -> list[SubKernelSpec] | None:
    ins = op.tensor_inputs()
    if len(ins) != 8:
        return None
    hidden, _cos, _sin, q_a, q_a_norm, q_b, kv_a, kv_norm = ins
    if len(hidden.shape) != 2 or any(len(w.shape) != 2 for w in (q_a, q_b, kv_a)) or \
            len(q_a_norm.shape) != 1 or len(kv_norm.shape) != 1:
        return None
    dt, elem = query_dtype(hidden.dtype), dtype_bytes(hidden.dtype)
    t, h = hidden.shape
    q_lora, kv_proj, kv_lora = q_a.shape[0], kv_a.shape[0], kv_norm.shape[0]
    rope = kv_proj - kv_lora
    opts = mapping.extra.get("decomposer_options") or {}
    regime = _mapping_options(mapping, "visible_kernel_regime")
    sp = bool(op.dim("sequence_parallel", 0))
    tp = _int_dim(op, "tp_size") or 1
    heads = _int_dim(op, "num_heads")
    if quant and regime.get("requires_sequence_parallel") and not sp:
        return _mla_preprocess(op, mapping, ins, dt)
    rows = t
    if sp and opts.get("projection_token_partition") == "tp":
        if tp <= 1 or t % tp:
            return None
        rows = t // tp
    q_b_shape = tuple(q_b.shape)
    nope = _int_dim(op, "qk_nope_head_dim")
    if quant and heads and nope:  # TensorCast rebuilds q_b_proj from its int arguments
        if sp and opts.get("reconstruct_q_heads_by_tp"):
            if tp <= 1:
                return None
            heads *= tp
        q_b_shape = (heads * (nope + rope), q_lora)
    norm = SubKernelSpec("RmsNorm", ((rows, q_lora), tuple(q_a_norm.shape)), dt,
                         tc_input_count=2,
                         work=_norm_work(4.0 * rows * q_lora, (rows * q_lora + q_lora) * elem,
                                         rows * q_lora * elem))
    if quant:
        specs = [_ascend_quant(rows, h, dt, elem),
                 _qbmm(rows, q_lora + kv_proj, h, (q_lora + kv_proj, h)), norm,
                 _ascend_quant(rows, q_lora, dt, elem),
                 _qbmm(rows, q_b_shape[0], q_lora, q_b_shape)]
    else:
        specs = [_gemm(rows, q_lora + kv_proj, h, (q_lora + kv_proj, h), dt, elem), norm,
                 _gemm(rows, q_b_shape[0], q_lora, q_b_shape, dt, elem)]
    cache = _mapping_options(mapping, "kv_cache_query")
    mode = cache.get("mode")
    kv = (rows, 1, 1, kv_proj)
    work = _norm_work(4.0 * rows * kv_lora + 3.0 * rows * rope,
                      (rows * kv_proj + kv_lora + 2 * rows * rope) * elem + 8 * rows,
                      rows * kv_proj * elem)
    if mode is None:
        return [*specs, SubKernelSpec("KvRmsNormRopeCache", (kv,), dt, tc_input_count=1,
                                      work=work)]
    if mode != "pool_dim0_agnostic":
        raise ConfigError(f"has value {mode!r}", field=f"operator_mappings.{mapping.name}"
                          ".decomposer_options.kv_cache_query.mode",
                          expected="pool_dim0_agnostic (or no mode)")
    block = cache.get("block_size")
    if rope <= 0 or isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        return None
    pool = -(-rows // block)
    rot = (rows, 1, 1, rope)
    return [*specs, SubKernelSpec(
        "KvRmsNormRopeCache",
        (kv, (kv_lora,), rot, rot, (rows,), (pool, block, 1, rope), (pool, block, 1, kv_lora)),
        dt, tc_input_count=7, input_dtypes=(dt, dt, dt, dt, "int64", dt, dt), work=work)]


# vLLM-Ascend 0.18 / CANN 8.5 `mla_preprocess_0_mix_aic` contract (TensorCast's
# `_MLA_PREPROCESS_*`, profiling_data_source.py): at most 1,024 decode tokens, both
# quantised weights in 32-element FRACTAL_NZ blocks, 22 inputs and 5 outputs
MLA_PREPROCESS_MAX_TOKENS = 1024
MLA_PREPROCESS_NZ_BLOCK = 32
MLA_PREPROCESS_IO = (22, 5)
MLA_PREPROCESS_INTS = ("num_tokens", "hidden_size", "local_num_heads", "q_lora_rank",
                       "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "block_size")
MLA_PREPROCESS_STRS = ("cache_mode", "quant_mode", "weight_format")
MLA_PREPROCESS_BOOLS = ("enable_inner_out", "weight_quantized")
# opaque_kernel fields and TensorCast's defaults for them
MLA_PREPROCESS_OPTIONS = {"block_size": 128, "cache_mode": "krope_ctkv",
                          "quant_mode": "per_tensor_quant_asymm", "enable_inner_out": True,
                          "weight_quantized": True, "weight_format": "FRACTAL_NZ"}
COMPLETENESS = "Runtime metadata_completeness"


def _mla_preprocess(op: OpInvokeInfo, mapping: OperatorMapping, ins, dt: str
                    ) -> list[SubKernelSpec] | None:
    """The opaque-kernel spec of `decompose_mlapo_quant` (None without int8 projection
    weights or the call's integer arguments)."""
    opaque = _mapping_options(mapping, "opaque_kernel")
    if not opaque or any(w.dtype != "int8" for w in (ins[3], ins[5], ins[6])):
        return None
    dims = {k: _int_dim(op, k) for k in ("num_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                         "kv_lora_rank", "q_lora_rank")}
    if any(v is None for v in dims.values()):
        return None
    key: dict[str, int | str | bool] = {
        "num_tokens": int(ins[0].shape[0]), "hidden_size": int(ins[0].shape[1]),
        "local_num_heads": dims["num_heads"], "q_lora_rank": dims["q_lora_rank"],
        "kv_lora_rank": dims["kv_lora_rank"], "qk_nope_head_dim": dims["qk_nope_head_dim"],
        "qk_rope_head_dim": dims["qk_rope_head_dim"]}
    for name, default in MLA_PREPROCESS_OPTIONS.items():
        value = opaque.get(name, default)
        want = type(default)
        if isinstance(value, bool) != (want is bool) or not isinstance(value, want):
            raise ConfigError(f"has value {value!r}", field=f"operator_mappings.{mapping.name}"
                              f".decomposer_options.opaque_kernel.{name}",
                              expected=f"a {want.__name__}")
        key[name] = value
    mode = opaque.get("query_mode", "mlapo_preprocess")
    if mode != "mlapo_preprocess":
        raise ConfigError(f"has value {mode!r}", field=f"operator_mappings.{mapping.name}"
                          ".decomposer_options.opaque_kernel.query_mode",
                          expected="mlapo_preprocess")
    return [SubKernelSpec(str(opaque.get("kernel_type", "mla_preprocess_0_mix_aic")), dtype=dt,
                          query=query_mla_preprocess, runtime=tuple(key.items()))]


def mla_preprocess_layout(num_tokens: int, hidden_size: int, local_num_heads: int,
                          q_lora_rank: int, kv_lora_rank: int, qk_nope_head_dim: int,
                          qk_rope_head_dim: int, block_size: int
                          ) -> tuple[list[Shape], list[Shape]] | None:
    """Input and output shapes of one `mla_preprocess_0_mix_aic` call (TensorCast's
    `_build_mla_preprocess_expected_shapes`): hidden (T, h), fused_qkv_a_proj weight NZ
    (1, h/32, q_lora + kv_lora + rope, 32) and its bias-like (q_lora + kv_lora + rope,),
    two (q_lora,) norm vectors, q_b_proj NZ (1, q_lora/32, H*(nope+rope), 32) and its
    (H*(nope+rope),), the kv norm (kv_lora,), cos and sin (T, rope), W_UK (H, nope,
    kv_lora), the ctkv and krope caches (ceil(T/block), block, 1, kv_lora / rope), the
    slots (T,) and the quantisation scalars; out q_nope (T, H, kv_lora), the two caches,
    q_rope (T, H, rope) and the inner q_lora output (T, q_lora). None unless h and q_lora
    are multiples of the NZ block."""
    nz = MLA_PREPROCESS_NZ_BLOCK
    if hidden_size % nz or q_lora_rank % nz:
        return None
    fused = q_lora_rank + kv_lora_rank + qk_rope_head_dim
    q_out = local_num_heads * (qk_nope_head_dim + qk_rope_head_dim)
    blocks = -(-num_tokens // block_size)
    ins = [(num_tokens, hidden_size), (1, hidden_size // nz, fused, nz), (fused,),
           (q_lora_rank,), (q_lora_rank,), (1, q_lora_rank // nz, q_out, nz), (q_out,),
           (kv_lora_rank,), (num_tokens, qk_rope_head_dim), (num_tokens, qk_rope_head_dim),
           (local_num_heads, qk_nope_head_dim, kv_lora_rank),
           (blocks, block_size, 1, kv_lora_rank), (blocks, block_size, 1, qk_rope_head_dim),
           (num_tokens,), (1,), (1,), (fused,), (1,), (1,), (q_out,), (1,), (1,)]
    outs = [(num_tokens, local_num_heads, kv_lora_rank), ins[11],
            (num_tokens, local_num_heads, qk_rope_head_dim), ins[12],
            (num_tokens, q_lora_rank)]
    return ins, outs


def _runtime_row(row) -> dict | None:
    """A row's semantic key from its `Runtime <field>` cells (None when a cell is not
    readable or the row is `legacy`: TensorCast skips those)."""
    if (row.text(COMPLETENESS) or "legacy").lower() == "legacy":
        return None
    out: dict[str, int | str | bool] = {}
    for name in MLA_PREPROCESS_INTS:
        v = row.number(f"Runtime {name}")
        if v is None or v != int(v):
            return None
        out[name] = int(v)
    for name in MLA_PREPROCESS_STRS:
        out[name] = row.text(f"Runtime {name}")
    for name in MLA_PREPROCESS_BOOLS:
        out[name] = row.text(f"Runtime {name}").lower() in ("true", "1")
    return out


def _layout_fits(row, key: dict, dt: str) -> bool:
    """The row's tensors are the kernel's CANN 8.5 layout for its own semantic key."""
    layout = mla_preprocess_layout(*(int(key[k]) for k in MLA_PREPROCESS_INTS))
    n_in, n_out = MLA_PREPROCESS_IO
    if layout is None:
        return False
    want_in, want_out = layout
    dts, fmts = row.input_dtypes, row.input_formats
    out_dts = row.output_dtypes
    return (list(row.input_shapes) == want_in and list(row.output_shapes) == want_out
            and len(dts) == n_in and len(fmts) == n_in and len(out_dts) == n_out
            and dts[0] == dt and dts[1] == "int8" and dts[5] == "int8"
            and fmts[1] == key["weight_format"] and fmts[5] == key["weight_format"]
            and all(d == dt for d in out_dts) and all(f == "ND" for f in row.output_formats))


def query_mla_preprocess(ctx, spec: SubKernelSpec) -> Candidate | LookupMiss:
    """TensorCast's `_query_mlapo_preprocess`: rows of `spec.kernel_types` whose `Runtime`
    columns equal the call's semantic key (every field but `num_tokens`; `Runtime
    metadata_completeness` present and not `legacy`) and whose tensors are the kernel's
    layout for that key (`mla_preprocess_layout`: shapes, 22 / 5 dtypes and formats, bf16
    hidden and outputs, int8 weights in the key's format, ND outputs). The row at the
    call's `num_tokens` answers; else the nearest rows below and above are interpolated
    linearly in `num_tokens` (bounded only: no extrapolation). Misses:
    `semantic_key_mismatch:mlapo_preprocess:<why>` for a call outside the kernel's
    contract (1-1,024 tokens, NZ alignment, a bf16 hidden), `semantic_context_missing:
    csv:<columns>`, `semantic_key_mismatch:mlapo_preprocess`,
    `shape_mismatch:mlapo_preprocess:bounded_interpolation_only`."""
    key = dict(spec.runtime)
    tokens = int(key["num_tokens"])
    if not 1 <= tokens <= MLA_PREPROCESS_MAX_TOKENS or \
            min(int(key[k]) for k in MLA_PREPROCESS_INTS) <= 0:
        return LookupMiss("semantic_key_mismatch:mlapo_preprocess:num_tokens_out_of_range",
                          f"{tokens} tokens (the kernel takes 1-{MLA_PREPROCESS_MAX_TOKENS})")
    if mla_preprocess_layout(*(int(key[k]) for k in MLA_PREPROCESS_INTS)) is None:
        return LookupMiss("semantic_key_mismatch:mlapo_preprocess:fractal_nz_alignment",
                          f"hidden {key['hidden_size']} / q_lora {key['q_lora_rank']} not "
                          f"multiples of {MLA_PREPROCESS_NZ_BLOCK}")
    if spec.dtype != "bf16":
        return LookupMiss("semantic_key_mismatch:mlapo_preprocess:dtype",
                          f"hidden {spec.dtype} (the kernel takes bf16 / fp16)")
    columns = {f"Runtime {k}" for k in (*MLA_PREPROCESS_INTS, *MLA_PREPROCESS_STRS,
                                        *MLA_PREPROCESS_BOOLS)} | {COMPLETENESS}
    policies = getattr(getattr(ctx, "mapping", None), "latency_overrides", {}) or {}
    found: list[tuple[int, Candidate]] = []
    missing: set[str] = set()
    loaded = False
    for kt in spec.kernel_types:
        table = ctx.tables.get(kt)
        if table is None:
            continue
        loaded = True
        absent = {c for c in columns if not table.has(c)}
        if absent:
            missing |= absent
            continue
        envelope = policies.get(kt, {}).get("profiling_core_envelope_fallback", {}).get(
            "max_duration_to_core_ratio")
        for row in table.rows:
            got = _runtime_row(row)
            if got is None or any(got[k] != key[k] for k in key if k != "num_tokens") or \
                    not _layout_fits(row, got, spec.dtype):
                continue
            cand = Candidate(row.latency_us, kt, table, row, rule="mlapo_runtime_exact",
                             details={"query_mode": "mlapo_preprocess",
                                      "semantic_key": key, **measured_details(row)})
            if envelope is not None:
                cand = core_envelope(cand, float(envelope))
            found.append((int(got["num_tokens"]), cand))
    if not found:
        if not loaded:
            return LookupMiss("csv_not_found", f"no CSV for {', '.join(spec.kernel_types)}")
        if missing:
            return LookupMiss("semantic_context_missing:csv:" + ",".join(sorted(missing)),
                              f"{spec.kernel_type} rows lack the runtime columns")
        return LookupMiss("semantic_key_mismatch:mlapo_preprocess",
                          f"no {spec.kernel_type} row with the key {key}")
    exact = [c for n, c in found if n == tokens]
    if exact:
        return exact[0]
    lower = max((p for p in found if p[0] < tokens), default=None, key=lambda p: p[0])
    upper = min((p for p in found if p[0] > tokens), default=None, key=lambda p: p[0])
    if lower is None or upper is None:
        return LookupMiss("shape_mismatch:mlapo_preprocess:bounded_interpolation_only",
                          f"{tokens} tokens outside the rows' "
                          f"{min(n for n, _ in found)}-{max(n for n, _ in found)}")
    (lo, a), (hi, b) = lower, upper
    latency = a.latency_us + (tokens - lo) / (hi - lo) * (b.latency_us - a.latency_us)
    line = sorted({n: c for n, c in found}.items())
    unc = line_details((a.table.sha256, a.kernel_type, "num_tokens",
                        tuple(c.row.index for _, c in line)),
                       [float(n) for n, _ in line], [c.latency_us for _, c in line],
                       float(tokens), float(lo), float(hi), "num_tokens")
    return Candidate(latency, a.kernel_type, a.table, a.row,
                     rule="mlapo_num_tokens_bounded_interpolation",
                     details={"query_mode": "mlapo_preprocess", "semantic_key": key,
                              "interpolated": True, "bracket_tokens": [lo, hi],
                              "record_ids": [a.record_id, b.record_id], **unc})


COMPOSITE_DECOMPOSERS: dict[str, Decomposer] = {
    "tensor_cast.multihead_latent_attention.default": decompose_mla,
    "tensor_cast.multihead_latent_attention_quant.default": decompose_mla_quant,
    "tensor_cast.mlapo.default": decompose_mlapo,
    "tensor_cast.mlapo_quant.default": decompose_mlapo_quant,
}
