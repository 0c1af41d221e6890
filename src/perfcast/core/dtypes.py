"""Canonical datatype names and their storage sizes.

Canonical names: fp32, tf32, bf16, fp16, fp8, fp8_block, int8, int4, nvfp4, mxfp4, fp4
(plus int32/int64/bool for indices and masks). Each source's spelling maps here through
`parse_dtype`; the table of aliases is the documented mapping (docs/formats.md).
"""

from __future__ import annotations

import enum

from perfcast.core.errors import ConfigError


class DType(str, enum.Enum):
    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    FP8_BLOCK = "fp8_block"
    INT8 = "int8"
    INT4 = "int4"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"
    FP4 = "fp4"
    INT32 = "int32"
    INT64 = "int64"
    BOOL = "bool"

    def __str__(self) -> str:  # so f-strings print "bf16"
        return self.value


# Storage bytes per element, without block scales (scales are counted as separate work
# by the quantisation rules of the workload layer).
_BYTES: dict[DType, float] = {
    DType.FP32: 4.0, DType.TF32: 4.0, DType.BF16: 2.0, DType.FP16: 2.0,
    DType.FP8: 1.0, DType.FP8_BLOCK: 1.0, DType.INT8: 1.0, DType.INT4: 0.5,
    DType.NVFP4: 0.5, DType.MXFP4: 0.5, DType.FP4: 0.5,
    DType.INT32: 4.0, DType.INT64: 8.0, DType.BOOL: 1.0,
}

# The matrix-engine rate that serves each storage dtype (tf32 runs fp32 GEMMs on tensor
# cores; block-scaled formats run on the fp8/fp4 paths).
_ENGINE_DTYPE: dict[DType, DType] = {
    DType.FP8_BLOCK: DType.FP8, DType.NVFP4: DType.FP4, DType.MXFP4: DType.FP4,
}

ALIASES: dict[str, DType] = {
    # torch / numpy / HF spellings
    "float32": DType.FP32, "float": DType.FP32, "fp32": DType.FP32, "f32": DType.FP32,
    "torch.float32": DType.FP32, "dt_float": DType.FP32,
    "tf32": DType.TF32, "tensorfloat32": DType.TF32,
    "bfloat16": DType.BF16, "bf16": DType.BF16, "torch.bfloat16": DType.BF16, "dt_bf16": DType.BF16,
    "float16": DType.FP16, "half": DType.FP16, "fp16": DType.FP16, "torch.float16": DType.FP16,
    "dt_float16": DType.FP16, "f16": DType.FP16,
    "fp8": DType.FP8, "float8": DType.FP8, "float8_e4m3fn": DType.FP8, "e4m3": DType.FP8,
    "torch.float8_e4m3fn": DType.FP8, "fp8_e4m3": DType.FP8, "float8_e5m2": DType.FP8,
    "dt_float8_e4m3fn": DType.FP8, "fp8_tensor": DType.FP8, "fp8_per_tensor": DType.FP8,
    "fp8_block": DType.FP8_BLOCK, "fp8_blockwise": DType.FP8_BLOCK, "fp8_block_scale": DType.FP8_BLOCK,
    "int8": DType.INT8, "torch.int8": DType.INT8, "dt_int8": DType.INT8, "w8a8": DType.INT8,
    "int8_wo": DType.INT8,
    "int4": DType.INT4, "int4_wo": DType.INT4, "w4a16": DType.INT4, "dt_int4": DType.INT4,
    "nvfp4": DType.NVFP4, "nvfp4_e2m1": DType.NVFP4,
    "mxfp4": DType.MXFP4, "w4a8_mxfp4_mxfp8": DType.MXFP4,
    "fp4": DType.FP4, "float4": DType.FP4, "e2m1": DType.FP4,
    "int32": DType.INT32, "torch.int32": DType.INT32, "dt_int32": DType.INT32,
    "int64": DType.INT64, "torch.int64": DType.INT64, "dt_int64": DType.INT64,
    "bool": DType.BOOL, "torch.bool": DType.BOOL, "dt_bool": DType.BOOL,
}


def parse_dtype(value: str | DType, *, source: str | None = None, field: str | None = None) -> DType:
    """Map any known spelling to a canonical DType, or raise a ConfigError naming it."""
    if isinstance(value, DType):
        return value
    key = str(value).strip().lower()
    try:
        return ALIASES[key]
    except KeyError:
        raise ConfigError(f"unknown dtype {value!r}", source=source, field=field,
                          expected="one of " + ", ".join(d.value for d in DType)) from None


# bytes by exact spelling (a DType member finds its value's entry: str enum, same hash)
_BYTES_BY_NAME: dict[str, float] = {k: _BYTES[v] for k, v in ALIASES.items()}


def dtype_bytes(dtype: str | DType) -> float:
    """Storage bytes per element (0.5 for 4-bit formats)."""
    hit = _BYTES_BY_NAME.get(dtype)
    return hit if hit is not None else _BYTES[parse_dtype(dtype)]


def engine_dtype(dtype: str | DType) -> DType:
    """The peak-rate key of the engine that executes math in this dtype."""
    d = parse_dtype(dtype)
    return _ENGINE_DTYPE.get(d, d)
