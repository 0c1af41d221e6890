"""Build a `CostQuery` from a plain description (CLI flags or one JSON line).

    {"operation": "gemm", "hardware": "h100_sxm", "dtype": "bf16", "runtime": "vllm",
     "runtime_version": "0.19.0", "implementation": "vllm_default",
     "dims": {"m": 128, "n": 8192, "k": 8192}}

Dims keep their JSON types (128 is an int, 128.0 a float: selectors are type-strict).
The work facts the analytic fallbacks need (FLOPs, bytes, message bytes) are derived
from the dims with the workload layer's formulas for gemm and attention.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from perfcast.core.dtypes import dtype_bytes, parse_dtype
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.collectives import OPERATIONS as COLLECTIVES
from perfcast.evidence.contracts import CostQuery, CostQueryContext, CostSubject, DimValue

FIELDS = {"operation", "hardware", "dtype", "runtime", "runtime_version", "implementation",
          "implementations", "dims", "engine"}


def parse_dim(text: str) -> tuple[str, DimValue]:
    """'m=128' -> ('m', 128); '1.5' is a float, 'true'/'false' a bool, else a string."""
    if "=" not in text:
        raise ConfigError(f"bad dimension {text!r}", field="--dim", expected="NAME=VALUE")
    key, raw = text.split("=", 1)
    value: DimValue = raw
    if raw in ("true", "false"):
        value = raw == "true"
    else:
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                pass
    return key.strip(), value


def work_facts(operation: str, dtype: str, dims: Mapping[str, DimValue]) -> dict[str, float]:
    """FLOPs and bytes of one call, from named axes (empty when unknown)."""
    try:
        if operation == "gemm":
            m, n, k = (float(dims[a]) for a in ("m", "n", "k"))
            batch = float(dims.get("batch", 1))
            b = dtype_bytes(dtype)
            return {"flops": 2.0 * m * n * k * batch,
                    "bytes_read": (m * k + k * n) * b * batch,
                    "bytes_written": m * n * 2.0 * batch}
        if operation == "attention":
            bsz, q, kv = (float(dims[a]) for a in ("batch", "q_tokens", "kv_len"))
            h, hd = float(dims["heads"]), float(dims["head_dim"])
            kvh = float(dims.get("kv_heads", h))
            vhd = float(dims.get("v_head_dim", hd))
            kvb = dtype_bytes(str(dims.get("kv_dtype", dtype)))
            pairs = q * (kv - q) + q * (q + 1) / 2.0
            return {"flops": 2.0 * h * (hd + vhd) * pairs * bsz,
                    "bytes_read": bsz * (q * h * hd * 2.0 + kv * kvh * (hd + vhd) * kvb),
                    "bytes_written": bsz * q * h * vhd * 2.0}
    except (KeyError, TypeError, ValueError):
        return {}
    return {}


STRING_FIELDS = ("operation", "hardware", "dtype", "runtime", "runtime_version",
                 "implementation", "engine")
ENGINES = ("matrix", "vector")


def check_dims(dims: Mapping, *, source: str, prefix: str = "dims.") -> None:
    """Every dimension a number, string or boolean; every number finite and > 0 (a shape,
    count or size: zero or negative is never a real query)."""
    for key, value in dims.items():
        if not isinstance(value, (int, float, str, bool)):
            raise ConfigError(f"dimension value {value!r}", source=source, field=f"{prefix}{key}",
                              expected="a number, string or boolean")
        if isinstance(value, bool) or isinstance(value, str):
            continue
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"dimension {key}={value!r} is not a positive number",
                              source=source, field=f"{prefix}{key}",
                              expected="a finite number > 0")


def build_query(spec: Mapping, *, source: str = "query",
                default_hardware: str = "h100_sxm") -> CostQuery:
    """Every field of `spec` is part of the query; one that cannot be honoured is a
    ConfigError naming it. `hardware` defaults to `default_hardware`."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"expected a JSON object, found {type(spec).__name__}", source=source)
    unknown = set(spec) - FIELDS
    if unknown:
        raise ConfigError(f"unknown field(s) {sorted(unknown)}", source=source,
                          expected="fields " + ", ".join(sorted(FIELDS)))
    for key in STRING_FIELDS:
        if key in spec and not isinstance(spec[key], str):
            raise ConfigError(f"{spec[key]!r} is not a string", source=source, field=key)
    operation = spec.get("operation")
    if not operation:
        raise ConfigError("missing operation", source=source, field="operation")
    dtype = parse_dtype(spec.get("dtype", "bf16"), source=source, field="dtype").value
    if not isinstance(spec.get("dims") or {}, Mapping):
        raise ConfigError("expected an object of NAME: VALUE", source=source, field="dims")
    dims = dict(spec.get("dims") or {})
    check_dims(dims, source=source)
    if "kv_dtype" in dims:
        dims["kv_dtype"] = parse_dtype(dims["kv_dtype"], source=source,
                                       field="dims.kv_dtype").value
    impls = spec.get("implementations") or {}
    if not isinstance(impls, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in impls.items()):
        raise ConfigError(f"{impls!r}", source=source, field="implementations",
                          expected="an object of operation (or operation@dtype): kernel name")
    ctx = CostQueryContext(runtime=spec.get("runtime", ""),
                           runtime_revision=spec.get("runtime_version", ""),
                           implementation=spec.get("implementation", ""),
                           implementations=FrozenDict(impls))
    common = dict(operation=operation, hardware=spec.get("hardware") or default_hardware,
                  dtype=dtype, dims=FrozenDict(dims), context=ctx)
    engine = spec.get("engine")
    if operation in COLLECTIVES:
        if engine not in (None, "network"):
            raise ConfigError(f"engine {engine!r} for the collective {operation}",
                              source=source, field="engine", expected="network (or none)")
        if "participants" in dims and type(dims["participants"]) is not int:
            raise ConfigError(f"participants {dims['participants']!r}", source=source,
                              field="dims.participants", expected="an integer")
        return CostQuery(subject=CostSubject.COMMUNICATION, engine="network",
                         message_bytes=float(dims.get("message_bytes", 0)),
                         participants=int(dims.get("participants", 0)), **common)
    if engine is not None and engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}", source=source, field="engine",
                          expected=" | ".join(ENGINES))
    return CostQuery(subject=CostSubject.OPERATOR, engine=engine or "matrix",
                     **work_facts(operation, dtype, dims), **common)
