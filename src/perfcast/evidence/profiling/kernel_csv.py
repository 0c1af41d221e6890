"""Per-kernel profiling CSVs in the Ascend format.

Tensors are encoded as `"d0,d1;d0,d1"` (`;` between tensors, `,` between dims), dtypes
as `DT_BF16;INT8`, formats as `ND;FRACTAL_NZ`. Empty tensor slots (optional inputs,
`DT_UNDEFINED`) are dropped together with their dtype and format so the remaining
slots stay aligned. The latency column is the first present of `LATENCY_COLUMNS`.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

from perfcast.core.dtypes import parse_dtype
from perfcast.core.errors import ConfigError, InvalidEvidenceError

LATENCY_COLUMNS = ("Average Duration(us)", "Profiling Average Duration(us)", "Duration(us)")
INPUT_SHAPES = "Input Shapes"
INPUT_DTYPES = "Input Data Types"
INPUT_FORMATS = "Input Formats"
OUTPUT_SHAPES = "Output Shapes"
OUTPUT_DTYPES = "Output Data Types"
OUTPUT_FORMATS = "Output Formats"

Shape = tuple[int, ...]

# Ascend treats fp16 activations on the bf16 kernels of these databases (TensorCast maps
# torch.float16 to DT_BF16); every other dtype must match exactly.
PROFILING_DTYPE_EQUIVALENT = {"fp16": "bf16"}


def profiling_dtype(text: str) -> str | None:
    """Canonical dtype of a CSV spelling (`DT_BF16` -> `bf16`), None if undefined."""
    t = text.strip()
    if not t or t.upper() in ("DT_UNDEFINED", "NULL", "UNDEFINED"):
        return None
    try:
        d = parse_dtype(t).value
    except ConfigError:
        return t.lower()  # unknown spellings only ever match themselves
    return PROFILING_DTYPE_EQUIVALENT.get(d, d)


def query_dtype(dtype: str) -> str:
    """The profiling-side spelling a perfcast tensor dtype is matched against."""
    d = parse_dtype(dtype).value
    return PROFILING_DTYPE_EQUIVALENT.get(d, d)


def parse_shapes(text: str) -> list[Shape | None]:
    """`"4,16,128;;16,128"` -> [(4,16,128), None, (16,128)] (None = empty slot)."""
    t = text.strip().strip('"').strip()
    if not t:
        return []
    out: list[Shape | None] = []
    for part in t.split(";"):
        part = part.strip()
        out.append(tuple(int(x) for x in part.split(",")) if part else None)
    # trailing empty slots carry no tensor
    while out and out[-1] is None:
        out.pop()
    return out


def parse_list(text: str) -> list[str]:
    t = text.strip().strip('"')
    return [x.strip() for x in t.split(";")] if t else []


@dataclass(frozen=True)
class KernelRow:
    index: int                                  # 0-based data row number in the CSV
    latency_us: float
    input_shapes: tuple[Shape, ...]
    input_dtypes: tuple[str | None, ...]
    input_formats: tuple[str, ...]
    output_shapes: tuple[Shape, ...]
    output_dtypes: tuple[str | None, ...]
    values: tuple[str, ...] = field(default=(), compare=False, repr=False)
    column_index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def text(self, column: str) -> str:
        i = self.column_index.get(column)
        return self.values[i].strip() if i is not None and i < len(self.values) else ""

    def number(self, column: str) -> float | None:
        try:
            value = float(self.text(column))
        except ValueError:
            return None
        return value if math.isfinite(value) else None


@dataclass(frozen=True)
class KernelTable:
    kernel_type: str
    path: Path
    columns: tuple[str, ...]
    latency_column: str
    rows: tuple[KernelRow, ...]
    sha256: str

    def has(self, column: str) -> bool:
        return column in self.columns

    def record_id(self, row: KernelRow) -> str:
        return f"{self.kernel_type}.csv#{row.index}"


@functools.lru_cache(maxsize=4096)
def _dtypes(text: str) -> tuple[str, ...]:
    return tuple(parse_list(text))


@functools.lru_cache(maxsize=4096)
def _canonical(dtype: str) -> str | None:
    return profiling_dtype(dtype)


def _tensors(shapes_text: str, dtypes_text: str, formats_text: str
             ) -> tuple[tuple[Shape, ...], tuple[str | None, ...], tuple[str, ...]]:
    shapes = parse_shapes(shapes_text)
    dtypes, formats = _dtypes(dtypes_text), _dtypes(formats_text)
    keep = [i for i, sh in enumerate(shapes) if sh is not None]
    return (tuple(shapes[i] for i in keep),  # type: ignore[misc]
            tuple(_canonical(dtypes[i]) if i < len(dtypes) else None for i in keep),
            tuple((formats[i] if i < len(formats) else "ND") or "ND" for i in keep))


def read_kernel_table(kernel_type: str, path: Path) -> KernelTable:
    """Parse one kernel CSV (cached by path and content digest: an unchanged file is
    parsed once per process)."""
    raw = path.read_bytes()
    return _parse(kernel_type, str(path), hashlib.sha256(raw).hexdigest(), raw)


@functools.lru_cache(maxsize=256)
def _parse(kernel_type: str, path_text: str, sha: str, raw: bytes) -> KernelTable:
    path = Path(path_text)
    reader = csv.reader(io.StringIO(raw.decode("utf-8-sig")))
    header = next(reader, [])
    columns = tuple(c.strip() for c in header)
    index = {c: i for i, c in enumerate(columns)}
    lat_col = next((c for c in LATENCY_COLUMNS if c in index), "")
    if not lat_col:
        raise InvalidEvidenceError(
            f"{path}: no latency column (expected one of {', '.join(LATENCY_COLUMNS)})")
    lat_i = index[lat_col]
    cols = [index.get(c) for c in (INPUT_SHAPES, INPUT_DTYPES, INPUT_FORMATS, OUTPUT_SHAPES,
                                   OUTPUT_DTYPES, OUTPUT_FORMATS)]
    rows = []
    for i, rec in enumerate(reader):
        try:
            latency = float(rec[lat_i])
        except (ValueError, IndexError):
            continue  # rows without a duration carry no evidence
        if not math.isfinite(latency) or latency < 0:
            continue
        get = [rec[c] if c is not None and c < len(rec) else "" for c in cols]
        try:
            ins = _tensors(get[0], get[1], get[2])
            outs = _tensors(get[3], get[4], get[5])
        except ValueError as exc:
            raise InvalidEvidenceError(f"{path}: row {i + 2}: unreadable shape ({exc})") from None
        rows.append(KernelRow(index=i, latency_us=latency, input_shapes=ins[0],
                              input_dtypes=ins[1], input_formats=ins[2],
                              output_shapes=outs[0], output_dtypes=outs[1],
                              values=tuple(rec), column_index=index))
    return KernelTable(kernel_type=kernel_type, path=path, columns=columns,
                       latency_column=lat_col, rows=tuple(rows), sha256=sha)


class KernelTables:
    """Lazy, cached access to `{kernel_type}.csv` under a database directory.

    Communication kernels are also searched in `comm_dir` (`communication_data_ref`)."""

    def __init__(self, data_dir: Path, comm_dir: Path | None = None) -> None:
        self.data_dir = data_dir
        self.comm_dir = comm_dir
        self._cache: dict[tuple[str, bool], KernelTable | None] = {}

    def path_for(self, kernel_type: str, communication: bool = False) -> Path | None:
        candidates = [self.data_dir / f"{kernel_type}.csv"]
        if communication and self.comm_dir is not None:
            candidates.append(self.comm_dir / f"{kernel_type}.csv")
        return next((p for p in candidates if p.is_file()), None)

    def get(self, kernel_type: str, communication: bool = False) -> KernelTable | None:
        key = (kernel_type, communication)
        if key not in self._cache:
            path = self.path_for(kernel_type, communication)
            self._cache[key] = read_kernel_table(kernel_type, path) if path else None
        return self._cache[key]
