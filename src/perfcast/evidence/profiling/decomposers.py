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

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.kernel_csv import query_dtype
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping
from perfcast.evidence.profiling.query_paths.attention import AttentionParams

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
    specs = [_gemm(t, q_lora + kv_proj, h, (q_lora + kv_proj, h), dt, elem),
             SubKernelSpec("RmsNorm", ((t, q_lora), tuple(q_a_norm.shape)), dt,
                           tc_input_count=2,
                           work=_norm_work(4.0 * t * q_lora, (t * q_lora + q_lora) * elem,
                                           t * q_lora * elem)),
             _gemm(t, q_b.shape[0], q_lora, tuple(q_b.shape), dt, elem)]
    cache = _mapping_options(mapping, "kv_cache_query")
    mode = cache.get("mode")
    kv = (t, 1, 1, kv_proj)
    work = _norm_work(4.0 * t * kv_lora + 3.0 * t * rope,
                      (t * kv_proj + kv_lora + 2 * t * rope) * elem + 8 * t,
                      t * kv_proj * elem)
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
    pool = -(-t // block)
    rot = (t, 1, 1, rope)
    return [*specs, SubKernelSpec(
        "KvRmsNormRopeCache",
        (kv, (kv_lora,), rot, rot, (t,), (pool, block, 1, rope), (pool, block, 1, kv_lora)),
        dt, tc_input_count=7, input_dtypes=(dt, dt, dt, dt, "int64", dt, dt), work=work)]


COMPOSITE_DECOMPOSERS: dict[str, Decomposer] = {
    "tensor_cast.multihead_latent_attention.default": decompose_mla,
    "tensor_cast.multihead_latent_attention_quant.default": decompose_mla_quant,
    "tensor_cast.mlapo.default": decompose_mlapo,
}
