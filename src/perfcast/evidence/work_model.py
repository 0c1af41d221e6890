"""Roofline time of a record or query from its named axes alone (bare peaks).

The interpolation provider divides measured latency by this to get an achieved
fraction of the roofline ("efficiency"), interpolates that, and multiplies back. The
formulas match the workload layer's work facts:

* gemm: FLOPs 2mnk; bytes (mk + kn) x input bytes + mn x 2 (16-bit output).
* attention: pairs per request = q(kv - q) + q(q + 1)/2 (causal over kv - q cached
  tokens); FLOPs 2 x heads x (head_dim + v_head_dim) x pairs x batch; bytes = Q and O
  (16-bit) + K/V over kv_len x kv_heads x (head_dim + v_head_dim) x kv bytes.

Functions take numpy arrays or scalars, so one code path serves records and queries.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from perfcast.core.dtypes import dtype_bytes, engine_dtype
from perfcast.hardware.model import EngineKind, System

_FALLBACK_RATE = ("bf16", "fp16", "fp32")


_PEAKS: dict[tuple[str, str], float] = {}   # (system digest, dtype) -> ops/s


def matrix_peak(system: System, dtype: str) -> float:
    key0 = (system.digest, dtype)
    hit = _PEAKS.get(key0)
    if hit is not None:
        return hit
    engine = system.device.engine(EngineKind.MATRIX)
    for key in (engine_dtype(dtype).value, *_FALLBACK_RATE):
        rate = engine.peak_ops_per_s.get(key)
        if rate:
            _PEAKS[key0] = float(rate)
            return float(rate)
    raise LookupError(f"{system.name} has no matrix rate for {dtype}")


def _max(a, b):
    return max(a, b) if isinstance(a, float) else np.maximum(a, b)


def gemm_roofline_s(axes: Mapping[str, np.ndarray], fixed: Mapping, dtype: str,
                    system: System):
    m, n, k = axes["m"], axes["n"], axes["k"]
    in_b = dtype_bytes(dtype)
    flops = 2.0 * m * n * k
    nbytes = (m * k + k * n) * in_b + m * n * 2.0
    return _max(flops / matrix_peak(system, dtype), nbytes / system.device.memory.bw_bytes_per_s)


def attention_roofline_s(axes: Mapping[str, np.ndarray], fixed: Mapping, dtype: str,
                         system: System):
    def get(name):
        return axes[name] if name in axes else fixed[name]

    batch, kv, heads = get("batch"), get("kv_len"), get("heads")
    q = axes["kv_len"] if fixed.get("q_tokens") is TIED else get("q_tokens")
    kv_heads, hd = get("kv_heads"), get("head_dim")
    vhd = get("v_head_dim") if ("v_head_dim" in axes or "v_head_dim" in fixed) else hd
    kvb = dtype_bytes(fixed.get("kv_dtype", dtype))
    pairs = q * (kv - q) + q * (q + 1) / 2.0
    flops = 2.0 * heads * (hd + vhd) * pairs * batch
    nbytes = batch * (q * heads * (hd + vhd) * 2.0 + kv * kv_heads * (hd + vhd) * kvb)
    return _max(flops / matrix_peak(system, dtype), nbytes / system.device.memory.bw_bytes_per_s)


class _Tied:
    """Marker: this selector equals its leader axis in every record (q_tokens = kv_len)."""

    def __repr__(self) -> str:
        return "<tied>"


TIED = _Tied()

ROOFLINES = {"gemm": gemm_roofline_s, "attention": attention_roofline_s}
