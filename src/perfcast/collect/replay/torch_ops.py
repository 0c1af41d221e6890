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
    import torch

    for fmt in case.input_formats:
        if fmt.strip().upper() not in PLAIN_FORMATS:
            raise NotReplayable(f"format {fmt} is device-private; replay it on the NPU backend")
    tensors = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for i, shape in enumerate(case.input_shapes):
        if shape is None:
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


NAMED_REPLAYS: dict[str, Callable[..., Any]] = {
    "rms_norm": _rms_norm, "swiglu": _swiglu, "sdpa": _sdpa,
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

    try:
        call()  # validate shapes once, outside timing
    except (RuntimeError, TypeError, ValueError) as exc:
        raise NotReplayable(f"torch rejected the row: {str(exc).splitlines()[0]}") from None
    return call
