"""Compute-path shape matching: perfcast input tensors vs. one CSV row.

Generic rules, tried per input in this order: identity, batch-dim stripping (a leading
1), matmul weight transpose (CSV stores (N,K), perfcast (K,N); a grouped kernel's
per-expert stack (E,N,K) for (E,K,N)), block-padding
tolerance (a dim rounded up to 16/32/64), 3D->2D flattening and merging of the last
two dims. FRACTAL_NZ CSV shapes are restored to ND first. Which kernel admits which
rule is data (`KERNEL_RULES`); layout differences between TensorCast's operator (the
calls perfcast's graph makes on the `tensorcast` stack) and the kernel (RoPE, SwiGlu,
reshape-and-cache) are small registered normalisers, those of TensorCast's
`profiling_data_source.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perfcast.evidence.profiling.kernel_csv import KernelRow

Shape = tuple[int, ...]
TensorIn = tuple[Shape, str]  # (shape, profiling dtype)

BLOCK_SIZES = (16, 32, 64)
# Dtypes a relaxed kernel treats as one (e.g. RoPE records K as FLOAT while the model
# passes bf16; the kernel up-casts internally at the same cost).
RELAXED_DTYPE_GROUPS = ({"bf16", "fp32"},)


@dataclass(frozen=True)
class KernelRule:
    # inputs 1.. may be stored transposed (matmul weights): (K, N) as (N, K), and the
    # per-expert stack (E, K, N) of a grouped kernel as (E, N, K)
    weight_transpose: bool = False
    relaxed_dtype: bool = False      # accept dtypes in RELAXED_DTYPE_GROUPS as equal
    flatten_batch: bool = False      # (B, M, D) may match a CSV (B*M, D)
    merge_last_dims: bool = False    # (T, H, D) may match a CSV (T, H*D)
    normalizer: str = ""             # name in INPUT_NORMALIZERS
    # inputs from this index on are cache pools whose dim 0 (capacity) is not matched;
    # those before it match exactly
    pool_dim0_from: int | None = None


_MATMUL = KernelRule(weight_transpose=True)
KERNEL_RULES: dict[str, KernelRule] = {
    "MatMulV2": KernelRule(weight_transpose=True, relaxed_dtype=True),
    "MatMulV3": _MATMUL, "MatMulCommon": _MATMUL, "MatMul": _MATMUL,
    "QuantBatchMatmulV3": _MATMUL, "BatchMatMulV2": _MATMUL, "TransposeBatchMatMul": _MATMUL,
    "GroupedMatmul": _MATMUL, "GroupedMatmulSwigluQuant": _MATMUL,
    # the router's top-k kernel: TensorCast's _DTYPE_RELAXED_KERNELS
    "MoeGatingTopK": KernelRule(relaxed_dtype=True),
    "PadV3": KernelRule(relaxed_dtype=True), "PadV3AiCore": KernelRule(relaxed_dtype=True),
    "SwiGlu": KernelRule(normalizer="concat_gate_up"),
    "ApplyRotaryPosEmb": KernelRule(relaxed_dtype=True, normalizer="rope_kq_bshd"),
    "_triton_rope": KernelRule(relaxed_dtype=True, normalizer="rope_kq_bshd"),
    "split_qkv_rmsnorm_rope_kernel": KernelRule(relaxed_dtype=True, normalizer="rope_kq_bshd"),
    "ReshapeAndCacheNdKernel": KernelRule(normalizer="split_kv_cache"),
    "reshape_and_cache_200000000": KernelRule(normalizer="split_kv_cache"),
    "AscendQuantV2": KernelRule(flatten_batch=True, merge_last_dims=True),
    "DynamicQuant": KernelRule(flatten_batch=True, merge_last_dims=True),
    "RmsNorm": KernelRule(flatten_batch=True), "AddRmsNormBias": KernelRule(flatten_batch=True),
    "AddRmsNorm": KernelRule(flatten_batch=True),
    "DispatchFFNCombine": KernelRule(flatten_batch=True),
    # (kv, gamma, cos, sin, slots, k_rope cache, ckv cache): TensorCast's
    # `_query_cache_postprocess` (pool_dim0_agnostic)
    "KvRmsNormRopeCache": KernelRule(pool_dim0_from=5),
}
DEFAULT_RULE = KernelRule()


def fractal_nz_to_nd(shape: Shape) -> Shape:
    """[..., W1, H1, H0, W0] tiles -> [..., W1*W0, H1*H0] (matmul transpose covers the
    other orientation): bf16 (N/16, K/16, 16, 16) -> (N, K); int8 (N/32, K/16, 16, 32)
    -> (N, K)."""
    if len(shape) < 4:
        return shape
    *batch, outer0, outer1, inner0, inner1 = shape
    return (*batch, outer0 * inner1, outer1 * inner0)


def strip_batch_dim(shape: Shape) -> Shape:
    return shape[1:] if len(shape) > 1 and shape[0] == 1 else shape


def is_block_padded(padded: int, raw: int) -> bool:
    """`padded` is `raw` rounded up to a tile of 16, 32 or 64."""
    return padded > raw and any(padded == -(-raw // b) * b for b in BLOCK_SIZES)


def padded_match(a: Shape, b: Shape) -> bool:
    """Equal rank and every dim equal or block-padded, with at least one padded."""
    if len(a) != len(b):
        return False
    padded = False
    for x, y in zip(a, b):
        if x == y:
            continue
        if is_block_padded(x, y):
            padded = True
            continue
        return False
    return padded


# -- layout normalisers ------------------------------------------------------------
def _concat_gate_up(inputs: Sequence[TensorIn], csv_count: int) -> list[TensorIn] | None:
    """TensorCast's `swiglu(gate, up)`; the kernel takes them concatenated on the last
    dim."""
    if len(inputs) != 2 or csv_count != 1:
        return None
    (s1, d1), (s2, d2) = inputs
    s1, s2 = strip_batch_dim(s1), strip_batch_dim(s2)
    if d1 != d2 or len(s1) != len(s2) or s1[:-1] != s2[:-1]:
        return None
    return [(s1[:-1] + (s1[-1] + s2[-1],), d1)]


def _rope_kq_bshd(inputs: Sequence[TensorIn], csv_count: int) -> list[TensorIn] | None:
    """TensorCast's `apply_rope(k, q, cos, sin)`, k (B,kv,S,D) and q (B,H,S,D), ->
    the kernel's (q, k[, cos, sin]) in (B,S,H,D), a unit head dim added to 3-D cos/sin
    (`_normalize_rope_inputs`, which names the slots the other way round: the CSV's first
    tensor has the query heads)."""
    if len(inputs) < 2 or csv_count < 2:
        return None
    def bshd(s: Shape) -> Shape:
        return (s[0], s[2], s[1], s[3]) if len(s) == 4 else s
    (k, dk), (q, dq) = inputs[0], inputs[1]
    out = [(bshd(q), dq), (bshd(k), dk)]
    for s, d in inputs[2:4]:
        out.append(((s[0], s[1], 1, s[2]) if len(s) == 3 else s, d))
    return out


def _split_kv_cache(inputs: Sequence[TensorIn], csv_count: int) -> list[TensorIn] | None:
    """TensorCast's `reshape_and_cache(key (N,D), value (N,D), kv_cache (2,...), slots)`
    -> the kernel's (key (N,1,D), value (N,1,D), cache_k, cache_v, slots)
    (`_normalize_reshape_and_cache_inputs`)."""
    if len(inputs) != 4 or csv_count != 5:
        return None
    (k, dk), (v, dv), (c, dc), (s, ds) = inputs
    if len(k) != 2 or len(v) != 2 or len(c) < 2 or c[0] != 2:
        return None
    return [((k[0], 1, k[1]), dk), ((v[0], 1, v[1]), dv), (c[1:], dc), (c[1:], dc), (s, ds)]


INPUT_NORMALIZERS: dict[str, Callable[[Sequence[TensorIn], int], list[TensorIn] | None]] = {
    "concat_gate_up": _concat_gate_up,
    "rope_kq_bshd": _rope_kq_bshd,
    "split_kv_cache": _split_kv_cache,
}


def effective_input_count(kernel_type: str, tc_count: int, csv_count: int) -> int:
    """How many inputs perfcast's side has after its kernel's normaliser (for telling
    `input_count_mismatch` from `shape_mismatch`)."""
    rule = KERNEL_RULES.get(kernel_type, DEFAULT_RULE)
    if rule.normalizer == "concat_gate_up" and tc_count == 2 and csv_count == 1:
        return 1
    if rule.normalizer == "split_kv_cache" and tc_count == 4 and csv_count == 5:
        return 5
    return tc_count


def first_input_last_dims(kernel_type: str, inputs: Sequence[TensorIn]) -> set[int] | None:
    """Every last dim a CSV row's first input can have and still match `inputs` under
    `match_inputs` (input 0 as given or after the kernel's normaliser; equal, or one a
    block-padded dim rounds up from; flattened or merged last dims): a superset, for
    skipping rows without parsing them. None when there is no first input."""
    if not inputs:
        return None
    rule = KERNEL_RULES.get(kernel_type, DEFAULT_RULE)
    firsts = [inputs[0][0]]
    if rule.normalizer:
        for csv_count in range(1, 6):
            alt = INPUT_NORMALIZERS[rule.normalizer](inputs, csv_count)
            if alt:
                firsts.append(alt[0][0])
    lasts = set()
    for shape in firsts:
        if not shape:
            return None
        lasts.add(shape[-1])
        s3 = strip_batch_dim(shape) if len(strip_batch_dim(shape)) == 3 else \
            shape if len(shape) == 3 else None
        if rule.merge_last_dims and s3 is not None:
            lasts.add(s3[1] * s3[2])
    # a CSV dim the query's dim is block padded from lies within the largest block below
    return {d - k for d in lasts for k in range(max(BLOCK_SIZES)) if d - k >= 0}


def _dtype_ok(rule: KernelRule, want: str, have: str | None) -> bool:
    if have == want:
        return True
    return rule.relaxed_dtype and have is not None and any(
        want in g and have in g for g in RELAXED_DTYPE_GROUPS)


# rule precedence when several inputs match by different rules: the most specific wins
_RANK = {"identity": 0, "batch_strip": 1, "padding": 2, "batch_strip+padding": 3,
         "transpose": 4, "batched_transpose": 4, "flatten_3d": 5, "flatten_3d+padding": 6,
         "merge_last_dims": 7,
         "merge_last_dims+padding": 8, "cache_pool_dim0_agnostic": 9}


def _one_input(rule: KernelRule, i: int, tc: Shape, csv_shape: Shape) -> str | None:
    if tc == csv_shape:
        return "identity"
    if rule.pool_dim0_from is not None:
        same = i >= rule.pool_dim0_from and len(tc) == len(csv_shape) and tc[1:] == csv_shape[1:]
        return "cache_pool_dim0_agnostic" if same else None
    tc_s, csv_s = strip_batch_dim(tc), strip_batch_dim(csv_shape)
    if tc_s == csv_s or tc_s == csv_shape:
        return "batch_strip"
    if rule.weight_transpose and i >= 1 and len(tc_s) == 2 and len(csv_shape) == 2 \
            and tc_s == (csv_shape[1], csv_shape[0]):
        return "transpose"
    if rule.weight_transpose and i >= 1 and len(tc_s) == 3 and len(csv_shape) == 3 \
            and tc_s == (csv_shape[0], csv_shape[2], csv_shape[1]):
        return "batched_transpose"
    if padded_match(tc_s, csv_shape):
        return "padding"
    if padded_match(tc_s, csv_s):
        return "batch_strip+padding"
    if len(csv_shape) == 2 and (rule.flatten_batch or rule.merge_last_dims):
        s3 = tc_s if len(tc_s) == 3 else tc if len(tc) == 3 else None
        if s3 is not None:
            candidates = []
            if rule.flatten_batch:
                candidates.append(("flatten_3d", (s3[0] * s3[1], s3[2])))
            if rule.merge_last_dims:
                candidates.append(("merge_last_dims", (s3[0], s3[1] * s3[2])))
            for name, shape in candidates:
                if shape == csv_shape:
                    return name
                if padded_match(shape, csv_shape):
                    return name + "+padding"
    return None


def match_inputs(kernel_type: str, inputs: Sequence[TensorIn], row: KernelRow,
                 tc_input_count: int | None) -> str | None:
    """The name of the rule under which every input matches `row`, or None."""
    rule = KERNEL_RULES.get(kernel_type, DEFAULT_RULE)
    shapes, dtypes, formats = row.input_shapes, row.input_dtypes, row.input_formats
    if tc_input_count is not None:
        shapes, dtypes, formats = (shapes[:tc_input_count], dtypes[:tc_input_count],
                                   formats[:tc_input_count])
    normalized: Sequence[TensorIn] = inputs
    if rule.normalizer:
        alt = INPUT_NORMALIZERS[rule.normalizer](inputs, len(shapes))
        if alt is not None:
            normalized = alt
    if len(normalized) != len(shapes):
        return None
    best = "identity"
    padded = False
    for i, (tc_shape, tc_dtype) in enumerate(normalized):
        if not _dtype_ok(rule, tc_dtype, dtypes[i]):
            return None
        csv_shape = shapes[i]
        if formats[i] == "FRACTAL_NZ":
            csv_shape = fractal_nz_to_nd(csv_shape)
        name = _one_input(rule, i, tc_shape, csv_shape)
        if name is None:
            return None
        padded |= name.endswith("padding")
        if _RANK[name] > _RANK[best]:
            best = name
    return best + "+padding" if padded and not best.endswith("padding") else best
