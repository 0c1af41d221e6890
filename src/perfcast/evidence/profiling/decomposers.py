"""Registered composite decomposers: one perfcast operator -> the NPU kernels it runs as,
derived from the operator's work axes at lookup time.

`COMPOSITE_DECOMPOSERS` is a constant table; `ProfilingDataSource` accepts extra or
replacement entries through its constructor (no registry is mutated at import time).
The registry, not the YAML `decomposer: true` hint, controls runtime dispatch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from perfcast.evidence.profiling.kernel_csv import query_dtype
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping
from perfcast.evidence.profiling.query_paths.attention import AttentionParams

Shape = tuple[int, ...]


@dataclass(frozen=True)
class SubKernelSpec:
    kernel_type: str
    input_shapes: tuple[Shape, ...] = ()
    dtype: str = "bf16"                     # canonical dtype of every input
    attention: AttentionParams | None = None  # set for attention sub-kernels
    tc_input_count: int | None = None
    alternate_kernel_types: tuple[str, ...] = ()

    @property
    def kernel_types(self) -> tuple[str, ...]:
        return (self.kernel_type, *self.alternate_kernel_types)


Decomposer = Callable[[OpInvokeInfo, OperatorMapping], "list[SubKernelSpec] | None"]

MLA_AXES = ("q_tokens", "kv_len", "heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim")


def _mla(op: OpInvokeInfo, first_kernel: str, first_alternates: tuple[str, ...]
         ) -> list[SubKernelSpec] | None:
    """Multi-head latent attention on vLLM-Ascend 0.18.

    decode  (one new token per request): first_kernel(q_nope @ W_UK^T) heads-first
            (H,T,nope)x(H,nope,lora) + FIA over the latent cache (Q (B,H,lora), one KV
            head, no mask) + TransposeBatchMatMul(out @ W_UV) (H,T,lora)x(H,lora,v);
    prefill: MatMulV2(kv_c @ kv_b_proj) (T,lora)x(lora,H*(nope+v)) + FIA on the
            decompressed K/V (Q (T,H,nope), H KV heads, causal).
    Axes: q_tokens (per request), batch (requests), kv_len, heads (local), kv_lora_rank,
    qk_nope_head_dim, v_head_dim."""
    if not op.inputs or any(op.dim(a) is None for a in MLA_AXES):
        return None
    dt = query_dtype(op.inputs[0].dtype)
    q_tokens, kv_len, h = int(op.dim("q_tokens")), int(op.dim("kv_len")), int(op.dim("heads"))
    lora, nope, v = (int(op.dim("kv_lora_rank")), int(op.dim("qk_nope_head_dim")),
                     int(op.dim("v_head_dim")))
    batch = int(op.dim("batch", 1) or 1)
    t = batch * q_tokens
    if q_tokens == 1 and kv_len > 1:
        return [
            SubKernelSpec(first_kernel, ((h, t, nope), (h, nope, lora)), dt,
                          tc_input_count=2 if first_kernel == "QuantBatchMatmulV3" else None,
                          alternate_kernel_types=first_alternates),
            SubKernelSpec("FusedInferAttentionScore", dtype=dt, attention=AttentionParams(
                q_shape_3d=(batch, h, lora), avg_seq_len=kv_len, dtype=dt, sparse_mode=0,
                num_kv_heads=1)),
            SubKernelSpec("TransposeBatchMatMul", ((h, t, lora), (h, lora, v)), dt),
        ]
    return [
        SubKernelSpec("MatMulV2", ((t, lora), (lora, h * (nope + v))), dt, tc_input_count=2),
        SubKernelSpec("FusedInferAttentionScore", dtype=dt, attention=AttentionParams(
            q_shape_3d=(t, h, nope), avg_seq_len=kv_len, dtype=dt, sparse_mode=3,
            num_kv_heads=h)),
    ]


def decompose_mla(op: OpInvokeInfo, mapping: OperatorMapping) -> list[SubKernelSpec] | None:
    return _mla(op, "BatchMatMulV2", ("BatchMatMulNd",))


def decompose_mla_quant(op: OpInvokeInfo, mapping: OperatorMapping) -> list[SubKernelSpec] | None:
    return _mla(op, "QuantBatchMatmulV3", ())


COMPOSITE_DECOMPOSERS: dict[str, Decomposer] = {
    "tensor_cast.multihead_latent_attention.default": decompose_mla,
    "tensor_cast.multihead_latent_attention_quant.default": decompose_mla_quant,
}
