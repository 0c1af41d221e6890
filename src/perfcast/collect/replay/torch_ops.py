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


NAMED_REPLAYS: dict[str, Callable[..., Any]] = {
    "rms_norm": _rms_norm, "swiglu": _swiglu, "sdpa": _sdpa, "add_rms_norm": _add_rms_norm,
    "dynamic_quant": _dynamic_quant, "ascend_quant": _ascend_quant,
    "softmax_last": _softmax_last, "argmax_last": _argmax_last, "transpose_bmm": _transpose_bmm,
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


CASE_REPLAYS: dict[str, Callable[[ReplayCase, list[Any]], Callable[[], Any]]] = {
    "grouped_matmul": _grouped_matmul, "fia": _fia,
}


def resolve_callable(name: str) -> Callable[..., Any]:
    if not name:
        raise NotReplayable("kernel type has no torch replay (kernel_types.yaml)")
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
    fn = resolve_callable(case.spec.replay)
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
