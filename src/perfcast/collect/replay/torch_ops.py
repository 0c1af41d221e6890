"""Build a torch callable and its input tensors for a replay case (torch imported lazily).

Tensors get the row's shapes, dtypes and strides (so transposed weights stay transposed);
floating tensors are random normal, integer tensors zeros (always-valid indices).
Formats other than ND (e.g. FRACTAL_NZ) are device-private layouts torch cannot
reproduce; such rows are left to the NPU backend.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from perfcast.collect.replay.base import ReplayCase

ASCEND_TO_TORCH_DTYPE = {
    "FLOAT": "float32", "DT_FLOAT": "float32", "FLOAT32": "float32", "DOUBLE": "float64",
    "FLOAT16": "float16", "DT_FLOAT16": "float16", "DT_BF16": "bfloat16", "BF16": "bfloat16",
    "BFLOAT16": "bfloat16", "INT64": "int64", "DT_INT64": "int64", "INT32": "int32",
    "DT_INT32": "int32", "INT16": "int16", "INT8": "int8", "DT_INT8": "int8",
    "UINT8": "uint8", "BOOL": "bool", "DT_BOOL": "bool",
}
PLAIN_FORMATS = ("ND", "", "NULL", "NCHW", "NHWC")


class NotReplayable(Exception):
    """The case cannot be expressed as a torch call on this backend."""


def torch_dtype(name: str):
    import torch

    key = ASCEND_TO_TORCH_DTYPE.get(name.strip().upper())
    if key is None:
        raise NotReplayable(f"dtype {name!r} has no torch equivalent")
    return getattr(torch, key)


def make_inputs(case: ReplayCase, device: str) -> list[Any]:
    """The row's present tensors, in slot order."""
    return [t for t in make_slot_inputs(case, device) if t is not None]


def make_slot_inputs(case: ReplayCase, device: str) -> list[Any]:
    """One tensor per slot of the row; None for an absent slot."""
    import torch

    for fmt in case.input_formats:
        if fmt.strip().upper() not in PLAIN_FORMATS:
            raise NotReplayable(f"format {fmt} is device-private; replay it on the NPU backend")
    tensors = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for i, shape in enumerate(case.input_shapes):
        if shape is None:
            tensors.append(None)
            continue
        dtype = torch_dtype(case.input_dtypes[i]) if i < len(case.input_dtypes) else torch.float32
        strides = case.input_strides[i] if i < len(case.input_strides) else None
        if strides and len(strides) == len(shape):
            t = torch.empty_strided(shape, strides, dtype=dtype)
        else:
            t = torch.empty(shape, dtype=dtype)
        if dtype.is_floating_point:
            t.copy_(torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype))
        else:
            t.zero_()
        tensors.append(t.to(device) if device != "cpu" else t)
    return tensors


def _rms_norm(x, weight=None, *rest):
    import torch

    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight)


def _swiglu(x, *rest):
    import torch

    a, b = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(a) * b


def _sdpa(q, k, v, *rest):
    import torch

    causal = q.shape[-2] == k.shape[-2] and q.shape[-2] > 1
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=q.shape[-3] != k.shape[-3])


def _add_rms_norm(x1, x2, weight=None, *rest):
    """AddRmsNorm(Bias): y = rms_norm(x1 + x2) * gamma (the sum is returned too)."""
    import torch

    s = x1 + x2
    return torch.nn.functional.rms_norm(s, (s.shape[-1],), weight), s


def _dynamic_quant(x, *rest):
    """Per-token symmetric int8: scale = max|x| / 127 over the last dim."""
    import torch

    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / 127.0
    return torch.round(x.float() / scale).clamp_(-128, 127).to(torch.int8), scale


def _ascend_quant(x, scale, offset=None, *rest):
    """Static int8: round(x * scale + offset)."""
    import torch

    y = x.float() * scale.float()
    if offset is not None:
        y = y + offset.float()
    return torch.round(y).clamp_(-128, 127).to(torch.int8)


def _softmax_last(x, *rest):
    import torch

    return torch.softmax(x, dim=-1)


def _argmax_last(x, *rest):
    import torch

    return torch.argmax(x, dim=-1)


def _transpose_bmm(x, w, *rest):
    """x (m, batch, k) x w (batch, k, n) -> (m, batch, n)."""
    import torch

    return torch.bmm(x.transpose(0, 1), w).transpose(0, 1)


def _masked_fill(x, mask, *rest):
    """MaskedFill (aclnnInplaceMaskedFillScalar): x[mask] = 0 in place."""
    import torch

    return x.masked_fill_(mask.to(torch.bool), 0.0)


def _interleave_rope(x, cos, sin, *rest):
    """InterleaveRope: x (B, N, S, D) holds (even, odd) pairs; they are de-interleaved to
    halves and rotated: y = x' * cos + rotate_half(x') * sin."""
    import torch

    d = x.shape[-1]
    x = x.unflatten(-1, (d // 2, 2)).transpose(-1, -2).flatten(-2)
    rotated = torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)
    return x * cos + rotated * sin


NAMED_REPLAYS: dict[str, Callable[..., Any]] = {
    "rms_norm": _rms_norm, "swiglu": _swiglu, "sdpa": _sdpa, "add_rms_norm": _add_rms_norm,
    "dynamic_quant": _dynamic_quant, "ascend_quant": _ascend_quant,
    "softmax_last": _softmax_last, "argmax_last": _argmax_last, "transpose_bmm": _transpose_bmm,
    "masked_fill": _masked_fill, "interleave_rope": _interleave_rope,
}


# -- replays that need the row itself (slot roles, runtime columns) ------------------------
def _even_groups(rows: int, groups: int) -> list[int]:
    """Row counts of `groups` experts receiving `rows` routed rows evenly (the first
    experts take the remainder) -- the balanced routing the grid's m stands for."""
    base, extra = divmod(rows, groups)
    return [base + (1 if g < extra else 0) for g in range(groups)]


def _grouped_matmul(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """x (M, K) split evenly over E experts, each group times its expert's weight
    (E, K, N) (or (E, N, K), transposed); the group list's values are not read."""
    import torch

    from perfcast.collect.kernel_types import axes_of

    axes = axes_of(case.spec, case.input_shapes, case.input_formats)
    if axes is None:
        raise NotReplayable("grouped matmul row needs x (M, K) and weight (E, K, N)")
    x, w = slots[0], slots[1]
    if w.shape[1] != axes["k"]:
        w = w.transpose(1, 2)
    bounds = [0]
    for rows in _even_groups(axes["m"], axes["experts"]):
        bounds.append(bounds[-1] + rows)
    x2 = x.reshape(-1, axes["k"])

    def call():
        out = torch.empty(x2.shape[0], axes["n"], dtype=x.dtype, device=x.device)
        for e in range(axes["experts"]):
            lo, hi = bounds[e], bounds[e + 1]
            if hi > lo:
                torch.mm(x2[lo:hi], w[e], out=out[lo:hi])
        return out

    return call


def _fia(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """FusedInferAttentionScore in TND layout: each of B requests has q = T/B query tokens
    and kv_len (`avg_seq_len`) keys. With a paged cache the call gathers each request's
    blocks through the block table (filled with distinct blocks) and runs SDPA on them,
    so the KV read is timed; causal when q = kv_len (prefill)."""
    import torch

    from perfcast.collect.kernel_types import (
        FIA_BLOCK_TABLE,
        FIA_COLUMNS,
        FIA_K,
        FIA_Q,
        FIA_V,
        axes_of,
    )

    kv_text = case.runtime_value(*[c for c, a in FIA_COLUMNS.items() if a == "kv_len"])
    axes = axes_of(case.spec, case.input_shapes, case.input_formats,
                   {"avg_seq_len": kv_text} if kv_text else None)
    if not axes or "batch" not in axes or "kv_len" not in axes or "kv_heads" not in axes:
        raise NotReplayable("FIA row needs Q (T, N, D), K/V, per-request lengths and an "
                            "avg_seq_len column")
    b, q_len, kv = axes["batch"], axes["q_tokens"], axes["kv_len"]
    n, kvh, d = axes["heads"], axes["kv_heads"], axes["head_dim"]
    q = slots[FIA_Q].reshape(b, q_len, n, d).transpose(1, 2)
    kc, vc = slots[FIA_K], slots[FIA_V]
    table = slots[FIA_BLOCK_TABLE] if FIA_BLOCK_TABLE < len(slots) else None
    causal = q_len == kv and q_len > 1
    if table is not None:
        bs = kc.shape[1]
        per_req = -(-kv // bs)
        if per_req > table.shape[1]:
            raise NotReplayable(f"block table holds {table.shape[1]} blocks per request; "
                                f"avg_seq_len {kv} needs {per_req}")
        ids = torch.arange(b * per_req, device=kc.device).remainder(kc.shape[0])
        table = ids.reshape(b, per_req)

        def gather(cache):
            return cache[table].reshape(b, per_req * bs, kvh, d)[:, :kv].transpose(1, 2)
    else:
        if kc.shape[0] < b * kv:
            raise NotReplayable(f"K holds {kc.shape[0]} tokens; {b} requests x {kv} need more")

        def gather(cache):
            return cache[:b * kv].reshape(b, kv, kvh, d).transpose(1, 2)

    def call():
        return torch.nn.functional.scaled_dot_product_attention(
            q, gather(kc), gather(vc), is_causal=causal, enable_gqa=n != kvh)

    return call


# -- replays that read the recorded output shape or build their own index tensors --------
def _output(case: ReplayCase, x) -> tuple[int, ...]:
    out = case.output_shapes[0] if case.output_shapes else None
    if out is None or len(out) != x.dim():
        raise NotReplayable(f"{case.kernel_type} row needs an output shape of rank {x.dim()}")
    return tuple(out)


def _generator():
    import torch

    return torch.Generator(device="cpu").manual_seed(0)


def _distinct_rows(n: int, total: int, device) -> Any:
    """`n` distinct row indices out of `total` (a legal scatter target), int64."""
    import torch

    if n > total:
        raise NotReplayable(f"{n} rows do not fit into {total}")
    return torch.randperm(total, generator=_generator())[:n].to(device)


def _pad_to_output(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """PadV3: constant (0) padding at the end of each dim up to the recorded output."""
    import torch

    x = slots[0]
    out = _output(case, x)
    if any(o < i for o, i in zip(out, x.shape)):
        raise NotReplayable(f"output {out} is smaller than input {tuple(x.shape)}")
    pad = [p for i, o in zip(reversed(x.shape), reversed(out)) for p in (0, o - i)]
    return lambda: torch.nn.functional.pad(x, pad, mode="constant", value=0.0)


def _slice_to_output(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """Slice (npu_slice at offset 0): a dense copy of the leading output-shaped block."""
    import torch

    x = slots[0]
    out = _output(case, x)
    if any(o > i for o, i in zip(out, x.shape)):
        raise NotReplayable(f"output {out} is larger than input {tuple(x.shape)}")
    index = tuple(slice(0, o) for o in out)
    return lambda: x[index].clone(memory_format=torch.contiguous_format)


def _transpose_to_output(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """Transpose: swap the first two dims where input and output differ (dims 0 and 1
    when they differ in fewer), then make the result dense."""
    x = slots[0]
    out = _output(case, x)
    diff = [i for i, (a, b) in enumerate(zip(x.shape, out)) if a != b]
    d0, d1 = (diff[0], diff[1]) if len(diff) >= 2 else (0, 1)
    if x.dim() < 2 or tuple(x.transpose(d0, d1).shape) != out:
        raise NotReplayable(f"output {out} is not input {tuple(x.shape)} with two dims swapped")
    return lambda: x.transpose(d0, d1).contiguous()


def _index_rows(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """Index (aten.index.Tensor on dim 0): gather the output's row count of source rows."""
    import torch

    x = slots[0]
    out = _output(case, x)
    if not out or out[0] > x.shape[0] or tuple(out[1:]) != tuple(x.shape[1:]):
        raise NotReplayable(f"output {out} is not a row selection of {tuple(x.shape)}")
    idx = torch.arange(out[0], device=x.device)
    return lambda: x[idx]


def _scatter_nd_update(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """ScatterNdUpdate: data (R, ...), indices (N, 1), updates (N, ...): N distinct rows of
    data replaced in place."""
    data, indices, updates = (slots + [None] * 3)[:3]
    if data is None or indices is None or updates is None or indices.dim() != 2 \
            or indices.shape[1] != 1 or tuple(updates.shape[1:]) != tuple(data.shape[1:]):
        raise NotReplayable("ScatterNdUpdate row needs data (R, ...), indices (N, 1) and "
                            "updates (N, ...)")
    rows = _distinct_rows(indices.shape[0], data.shape[0], data.device)
    return lambda: data.index_copy_(0, rows, updates)


def _reshape_and_cache(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """ReshapeAndCacheNdKernel: key, value (N, KVH, D) written into N distinct slots of
    the paged caches (blocks, block_size, KVH, D); the slot mapping is the row's (N,)."""
    if len([t for t in slots if t is not None]) != 5:
        raise NotReplayable("ReshapeAndCacheNdKernel row needs key, value, key_cache, "
                            "value_cache and slot_mapping")
    key, value, kc, vc, slot_mapping = slots[:5]
    n = key.shape[0]
    flat_k = kc.reshape(kc.shape[0] * kc.shape[1], -1) if kc.dim() >= 2 else kc
    flat_v = vc.reshape(vc.shape[0] * vc.shape[1], -1) if vc.dim() >= 2 else vc
    k2, v2 = key.reshape(n, -1), value.reshape(n, -1)
    if flat_k.dim() != 2 or k2.shape[1] != flat_k.shape[1] or v2.shape[1] != flat_v.shape[1] \
            or slot_mapping.numel() != n:
        raise NotReplayable(f"key {tuple(key.shape)} does not fit cache slots "
                            f"{tuple(kc.shape)}")
    slots_idx = _distinct_rows(n, flat_k.shape[0], kc.device)

    def call():
        flat_k.index_copy_(0, slots_idx, k2)
        return flat_v.index_copy_(0, slots_idx, v2)

    return call


def _moe_token_permute(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """MoeTokenPermute: tokens (T, H) and expert ids (T, k) -> the T*k token copies
    sorted by expert (a stable sort of distinct ids, then a row gather)."""
    import torch

    tokens, indices = (slots + [None] * 2)[:2]
    if tokens is None or indices is None or indices.shape[0] != tokens.shape[0]:
        raise NotReplayable("MoeTokenPermute row needs tokens (T, H) and indices (T, k)")
    k = indices.shape[1] if indices.dim() == 2 else 1
    ids = torch.randperm(indices.numel(), generator=_generator()).to(indices.device)

    def call():
        order = torch.argsort(ids, stable=True)
        return tokens.index_select(0, order // k), order

    return call


def _moe_token_unpermute(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """MoeTokenUnpermute: permuted (T*k, H), sorted indices (T*k,), probs (T, k) -> each
    token's k expert outputs gathered back and summed with its routing weights."""
    import torch

    permuted, sorted_idx, probs = (slots + [None] * 3)[:3]
    if permuted is None or sorted_idx is None or probs is None or probs.dim() != 2 \
            or probs.numel() != permuted.shape[0]:
        raise NotReplayable("MoeTokenUnpermute row needs permuted (T*k, H), sorted indices "
                            "and probs (T, k) (without probs the top-k is unknown)")
    t, k = probs.shape
    order = torch.randperm(permuted.shape[0], generator=_generator()).to(permuted.device)
    return lambda: (permuted.index_select(0, order).view(t, k, -1)
                    * probs.unsqueeze(-1).to(permuted.dtype)).sum(1)


def _quant_matmul(case: ReplayCase, slots: list[Any]) -> Callable[[], Any]:
    """QuantBatchMatmulV3 (W8A8): int8 x (M, K) times int8 weight (K, N) or (N, K) into
    int32 (torch._int_mm), dequantised by the per-channel scale (and per-token scale when
    recorded) to bf16."""
    import torch

    x, w, scale = (slots + [None] * 3)[:3]
    if x is None or w is None or x.dtype != torch.int8 or w.dtype != torch.int8 or w.dim() != 2:
        raise NotReplayable("QuantBatchMatmulV3 row needs int8 x (M, K) and int8 weight (2-D)")
    k = x.shape[-1]
    if w.shape[0] != k:
        if w.shape[1] != k:
            raise NotReplayable(f"weight {tuple(w.shape)} does not contract x {tuple(x.shape)}")
        w = w.t().contiguous()
    per_token = next((t for t in slots[3:] if t is not None and t.dim() == 1
                      and t.shape[0] == x.numel() // k and t.dtype.is_floating_point), None)
    x2 = x.reshape(-1, k)

    def call():
        y = torch._int_mm(x2, w).float()
        if scale is not None:
            y = y * scale.float()
        if per_token is not None:
            y = y * per_token.float().unsqueeze(-1)
        return y.to(torch.bfloat16)

    return call


CASE_REPLAYS: dict[str, Callable[[ReplayCase, list[Any]], Callable[[], Any]]] = {
    "grouped_matmul": _grouped_matmul, "fia": _fia, "pad_to_output": _pad_to_output,
    "slice_to_output": _slice_to_output, "transpose_to_output": _transpose_to_output,
    "index_rows": _index_rows, "scatter_nd_update": _scatter_nd_update,
    "reshape_and_cache": _reshape_and_cache, "moe_token_permute": _moe_token_permute,
    "moe_token_unpermute": _moe_token_unpermute, "quant_matmul": _quant_matmul,
}


def resolve_callable(name: str, reason: str = "") -> Callable[..., Any]:
    if not name:
        raise NotReplayable(reason or "kernel type has no torch replay (kernel_types.yaml)")
    if name in NAMED_REPLAYS:
        return NAMED_REPLAYS[name]
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        raise NotReplayable(f"replay callable {name!r} does not exist in this torch") from None


def build_call(case: ReplayCase, device: str) -> Callable[[], Any]:
    """A zero-argument closure that runs the case once on `device`."""
    if case.spec.launch and device != "npu":
        raise NotReplayable(f"{case.kernel_type} runs over an EP group ({case.spec.launch}); "
                            "replay it with --backend npu")
    if case.spec.replay in CASE_REPLAYS:
        call = CASE_REPLAYS[case.spec.replay](case, make_slot_inputs(case, device))
        return _validated(call)
    fn = resolve_callable(case.spec.replay, case.spec.not_replayable)
    tensors = make_inputs(case, device)
    if case.spec.args is not None:
        try:
            tensors = [tensors[i] for i in case.spec.args]
        except IndexError:
            raise NotReplayable(f"row has {len(tensors)} tensors; kernel_types.yaml args "
                                f"{list(case.spec.args)} need more") from None

    def call():
        return fn(*tensors)

    return _validated(call)


def _validated(call: Callable[[], Any]) -> Callable[[], Any]:
    try:
        call()  # validate shapes once, outside timing
    except (RuntimeError, TypeError, ValueError) as exc:
        raise NotReplayable(f"torch rejected the row: {str(exc).splitlines()[0]}") from None
    return call
