"""PyTorch profiler traces (Chrome/Kineto JSON, optionally gzipped) -> kernel samples.

* `cpu_op` events carry `Input Dims` / `Input type` / `Input Strides` (record_shapes=True).
  Only tensor arguments (a known dtype in `Input type`) become tensor slots; scalars and
  lists are dropped, as Ascend's `Input Shapes` lists tensors only.
* A trace with device kernels (`cat` "kernel", linked to the innermost launching op by
  `args["External id"]`, or through a runtime event's `correlation`) is a device trace:
  each op call with kernels is one sample whose duration is the sum of its kernels'
  durations, `Accelerator Core` "GPU" and the kernel names in `Kernel Names`.
* A trace without kernels (a CPU run) makes every `cpu_op` call a sample with its own
  wall duration and `Accelerator Core` "CPU".

The kernel type is the op name (`aten::mm`); its CSV is `aten__mm.csv`. `Input Strides`
is kept as a key column so a replay reproduces transposed operands.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from perfcast.collect.parse.samples import KernelSample
from perfcast.collect.tables import (
    CORE,
    INPUT_DTYPES,
    INPUT_FORMATS,
    INPUT_SHAPES,
    OUTPUT_DTYPES,
    OUTPUT_FORMATS,
    OUTPUT_SHAPES,
    STATE,
    format_shapes,
)
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict

INPUT_STRIDES = "Input Strides"
KERNEL_NAMES = "Kernel Names"

# torch profiler "Input type" spelling -> Ascend profiling dtype spelling
TORCH_TO_ASCEND_DTYPE: dict[str, str] = {
    "float": "FLOAT", "double": "DOUBLE", "c10::Half": "FLOAT16", "c10::BFloat16": "DT_BF16",
    "long int": "INT64", "int": "INT32", "short int": "INT16", "signed char": "INT8",
    "unsigned char": "UINT8", "bool": "BOOL", "c10::Float8_e4m3fn": "FLOAT8_E4M3FN",
    "c10::Float8_e5m2": "FLOAT8_E5M2", "c10::complex<float>": "COMPLEX64",
}
DEVICE_KERNEL_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def looks_like_trace(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith((".json", ".json.gz"))


def load_trace(path: Path) -> dict[str, Any]:
    src = str(path)
    try:
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, EOFError) as exc:
        raise ConfigError(f"cannot be read ({exc})", source=src) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"is not valid JSON (line {exc.lineno}: {exc.msg})", source=src) from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ConfigError("is not a Chrome/Kineto trace", source=src, field="traceEvents",
                          expected="a JSON object with a traceEvents list")
    return data


def is_trace(path: Path) -> bool:
    """True when the file is a JSON object with a `traceEvents` list (checked cheaply)."""
    if not looks_like_trace(path):
        return False
    try:
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            head = fh.read(4096)
    except (OSError, EOFError, UnicodeDecodeError):
        return False
    return "traceEvents" in head or (head.lstrip().startswith("{") and _has_events(path))


def _has_events(path: Path) -> bool:
    try:
        load_trace(path)
        return True
    except ConfigError:
        return False


def parse_torch_trace(path: Path) -> Iterator[KernelSample]:
    path = Path(path)
    src = str(path)
    events = load_trace(path)["traceEvents"]
    ops: dict[int, tuple[int, dict]] = {}
    kernels_by_ext: dict[int, list[dict]] = defaultdict(list)
    runtime_ext: dict[int, int] = {}
    kernels_by_corr: dict[int, list[dict]] = defaultdict(list)
    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        args = ev.get("args") or {}
        if cat == "cpu_op":
            ext = args.get("External id")
            ops[ext if ext is not None else -1 - i] = (i, ev)
        elif cat in DEVICE_KERNEL_CATEGORIES:
            ext = args.get("External id")
            if ext is not None:
                kernels_by_ext[ext].append(ev)
            elif args.get("correlation") is not None:
                kernels_by_corr[args["correlation"]].append(ev)
        elif cat in ("cuda_runtime", "cuda_driver", "runtime"):
            if args.get("correlation") is not None and args.get("External id") is not None:
                runtime_ext[args["correlation"]] = args["External id"]
    for corr, kernels in kernels_by_corr.items():
        if corr in runtime_ext:
            kernels_by_ext[runtime_ext[corr]].extend(kernels)
    device_trace = bool(kernels_by_ext)
    for ext, (index, ev) in sorted(ops.items(), key=lambda kv: kv[1][0]):
        where = f"{src}, event {index}"
        if device_trace:
            kernels = kernels_by_ext.get(ext)
            if not kernels:
                continue
            duration = sum(_duration(k, f"{src}, event of kernel {k.get('name')!r}") for k in kernels)
            core = "GPU"
            names = ";".join(sorted({str(k.get("name", "")) for k in kernels}))
        else:
            duration = _duration(ev, where)
            core = "CPU"
            names = ""
        yield _sample(ev, duration, core, names, where)


def _duration(ev: dict, where: str) -> float:
    dur = ev.get("dur")
    if isinstance(dur, bool) or not isinstance(dur, (int, float)) or not dur >= 0:
        raise ConfigError(f"has duration {dur!r}", source=where, field="dur",
                          expected="a non-negative number of microseconds")
    return float(dur)


def _sample(ev: dict, duration_us: float, core: str, kernel_names: str,
            where: str) -> KernelSample:
    name = ev.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("has no name", source=where, field="name", expected="an op name")
    args = ev.get("args") or {}
    dims = args.get("Input Dims", [])
    types = args.get("Input type", [])
    strides = args.get("Input Strides", [[]] * len(dims))
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        raise ConfigError(f"op {name!r}: 'Input Dims' and 'Input type' disagree", source=where,
                          field="args", expected="lists of equal length (record_shapes=True)")
    shapes, dtypes, strides_out = [], [], []
    for j, (shape, dtype) in enumerate(zip(dims, types)):
        ascend = TORCH_TO_ASCEND_DTYPE.get(dtype)
        if ascend is None:
            continue  # scalar, list, None or an unknown non-tensor argument
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ConfigError(f"op {name!r}: input {j} has shape {shape!r}", source=where,
                              field="Input Dims", expected="a list of non-negative ints")
        shapes.append(tuple(shape))
        dtypes.append(ascend)
        st = strides[j] if j < len(strides) and isinstance(strides[j], list) else []
        strides_out.append(tuple(st))
    key = {STATE: "", CORE: core, INPUT_SHAPES: format_shapes(shapes),
           INPUT_DTYPES: ";".join(dtypes), INPUT_FORMATS: ";".join("ND" for _ in shapes),
           OUTPUT_SHAPES: "", OUTPUT_DTYPES: "", OUTPUT_FORMATS: "",
           INPUT_STRIDES: format_shapes(strides_out)}
    if kernel_names:
        key[KERNEL_NAMES] = kernel_names
    return KernelSample(kernel_type=name, key=FrozenDict(key), duration_us=duration_us,
                        source=where.split(", event")[0])
