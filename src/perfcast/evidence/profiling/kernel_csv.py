"""Per-kernel profiling CSVs in the Ascend format.

Tensors are encoded as `"d0,d1;d0,d1"` (`;` between tensors, `,` between dims), dtypes
as `DT_BF16;INT8`, formats as `ND;FRACTAL_NZ`. Empty tensor slots (optional inputs,
`DT_UNDEFINED`) are dropped together with their dtype and format so the remaining
slots stay aligned. The latency column is the first present of `LATENCY_COLUMNS`.

A row's tensors are parsed when a lookup first reads them (an unreadable shape is then an
error naming the CSV line); lookups read only the rows whose first input can match (its
last dim, `KernelTable.rows_for`). Rows without a duration (empty, `N/A`) carry no
evidence and are left out; a duration
that is text, negative or not finite is left out too and its CSV line number listed in
`KernelTable.bad_durations`. A replayed row records the device it was measured on
(`MicroBench Device`): read for another device, its replayed `Average Duration(us)` is
not used (the profiled `Profiling Average Duration(us)` is, when present) and the row is
listed in `KernelTable.foreign_rows`.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from perfcast.core.dtypes import parse_dtype
from perfcast.core.errors import ConfigError, InvalidEvidenceError
from perfcast.evidence.profiling.devices import canonical_device

LATENCY_COLUMNS = ("Average Duration(us)", "Profiling Average Duration(us)", "Duration(us)")
PROFILED_LATENCY = "Profiling Average Duration(us)"
MEASURED_DEVICE = "MicroBench Device"   # the device a replayed row was measured on
EMPTY_CELLS = ("", "N/A", "NA")
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


class KernelRow:
    """One data row: its latency read at load, its tensors parsed on first use (a lookup
    reads the few rows its first-input index points to; see `KernelTable.rows_for`)."""

    __slots__ = ("index", "latency_us", "values", "column_index", "_cols", "_path",
                 "_ins", "_outs")

    def __init__(self, index: int, latency_us: float, values: Sequence[str],
                 column_index: dict[str, int], cols: Sequence[int | None] = (),
                 path: str = "") -> None:
        self.index = index                      # 0-based data row number in the CSV
        self.latency_us = latency_us
        self.values = values
        self.column_index = column_index
        self._cols = cols                       # columns of the six tensor cells
        self._path = path
        self._ins: tuple | None = None
        self._outs: tuple | None = None

    @classmethod
    def from_tensors(cls, input_shapes, input_dtypes, input_formats, output_shapes=(),
                     output_dtypes=(), latency_us: float = 0.0) -> KernelRow:
        """A row built from tensors already known (a row to be written, e.g. by
        `collect grid`), not read from a CSV."""
        row = cls(0, latency_us, (), {})
        row._ins = (tuple(input_shapes), tuple(input_dtypes), tuple(input_formats))
        row._outs = (tuple(output_shapes), tuple(output_dtypes), ("ND",) * len(output_shapes))
        return row

    def _cell(self, k: int) -> str:
        c = self._cols[k] if k < len(self._cols) else None
        return self.values[c] if c is not None and c < len(self.values) else ""

    def _parse(self, first: int) -> tuple:
        try:
            return _tensors(self._cell(first), self._cell(first + 1), self._cell(first + 2))
        except ValueError as exc:
            raise InvalidEvidenceError(
                f"{self._path}: row {self.index + 2}: unreadable shape ({exc})") from None

    def _inputs(self) -> tuple:
        if self._ins is None:
            self._ins = self._parse(0)
        return self._ins

    def _outputs(self) -> tuple:
        if self._outs is None:
            self._outs = self._parse(3)
        return self._outs

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return self._inputs()[0]

    @property
    def input_dtypes(self) -> tuple[str | None, ...]:
        return self._inputs()[1]

    @property
    def input_formats(self) -> tuple[str, ...]:
        return self._inputs()[2]

    @property
    def output_shapes(self) -> tuple[Shape, ...]:
        return self._outputs()[0]

    @property
    def output_dtypes(self) -> tuple[str | None, ...]:
        return self._outputs()[1]

    @property
    def output_formats(self) -> tuple[str, ...]:
        return self._outputs()[2]

    def first_input_last_dim(self) -> int | None:
        """The last dim of the first (non-empty) input as the CSV writes it, read without
        parsing the row; None when it has none, is unreadable or is FRACTAL_NZ (restored
        to another shape before matching)."""
        text = self._cell(0).strip().strip('"')
        head = text.split(";", 1)[0]
        i = 0
        if not head.strip():
            parts = text.split(";")
            i = next((k for k, part in enumerate(parts) if part.strip()), -1)
            if i < 0:
                return None
            head = parts[i]
        fmt = self._cell(2)
        if "FRACTAL_NZ" in fmt:
            formats = _dtypes(fmt)
            if i < len(formats) and formats[i] == "FRACTAL_NZ":
                return None
        try:
            return int(head.rsplit(",", 1)[-1])
        except ValueError:
            return None

    def text(self, column: str) -> str:
        i = self.column_index.get(column)
        return self.values[i].strip() if i is not None and i < len(self.values) else ""

    def number(self, column: str) -> float | None:
        try:
            value = float(self.text(column))
        except ValueError:
            return None
        return value if math.isfinite(value) else None

    def __repr__(self) -> str:
        return f"KernelRow(index={self.index}, latency_us={self.latency_us})"


@dataclass(frozen=True)
class KernelTable:
    kernel_type: str
    path: Path
    columns: tuple[str, ...]
    latency_column: str
    sha256: str
    bad_durations: tuple[int, ...] = ()   # CSV line numbers of unusable duration text
    foreign_rows: tuple[int, ...] = ()    # CSV line numbers measured on another device
    tensor_columns: tuple[int | None, ...] = ()  # the six tensor cells' columns
    # per usable row, in CSV order: its data row number, latency and CSV text (its cells
    # are read again when the row is first used), and the text of its first input's last
    # dim ("" where that is not a plain tensor: NZ, an empty slot). One list per column
    # of numbers and strings, which the cyclic collector does not track: no per-row
    # container for it to scan.
    row_numbers: Sequence[int] = ()
    latencies: Sequence[float] = ()
    lines: Sequence[str] = ()
    first_dim_texts: Sequence[str] = ()

    @property
    def row_count(self) -> int:
        return len(self.lines)

    def has(self, column: str) -> bool:
        return column in self.columns

    def record_id(self, row: KernelRow) -> str:
        return f"{self.kernel_type}.csv#{row.index}"

    @functools.cached_property
    def _column_index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.columns)}

    @functools.cached_property
    def _objects(self) -> list[KernelRow | None]:
        return [None] * len(self.lines)

    def row(self, k: int) -> KernelRow:
        """The k-th usable row (made on first use)."""
        row = self._objects[k]
        if row is None:
            cells = next(csv.reader(io.StringIO(self.lines[k])))
            row = self._objects[k] = KernelRow(self.row_numbers[k], self.latencies[k], cells,
                                               self._column_index, self.tensor_columns,
                                               str(self.path))
        return row

    @functools.cached_property
    def rows(self) -> tuple[KernelRow, ...]:
        """Every usable row, in CSV order (made once; `rows_for` shares them)."""
        return tuple(self.row(k) for k in range(len(self.lines)))

    @functools.cached_property
    def _first_last_dim_index(self) -> tuple[dict[str, list[int]], dict[int, int | None]]:
        """The rows by the text of their first input's last dim, for the rows where it is
        a plain dim; and the other rows with the dim `first_input_last_dim` reads for them
        (None when it has none)."""
        by_text: dict[str, list[int]] = {}
        for k, key in enumerate(self.first_dim_texts):
            by_text.setdefault(key, []).append(k)
        # rows whose text is not a plain dim (NZ tiles, an empty first slot, spaces, "07")
        odd = [t for t in by_text if not (t.isascii() and t.isdigit() and str(int(t)) == t)]
        slow = {k: self.row(k).first_input_last_dim() for t in odd for k in by_text.pop(t)}
        return by_text, slow

    def rows_for(self, last_dims: set[int] | None) -> Sequence[KernelRow]:
        """The rows whose first input's last dim is in `last_dims` (and those the index
        cannot read), in CSV order; every row when `last_dims` is None."""
        if last_dims is None:
            return self.rows
        by_text, slow = self._first_last_dim_index
        picked = [k for d in last_dims for k in by_text.get(str(d), ())]
        picked += [k for k, dim in slow.items() if dim is None or dim in last_dims]
        return [self.row(k) for k in sorted(picked)]


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


def read_kernel_table(kernel_type: str, path: Path, device: str = "") -> KernelTable:
    """Parse one kernel CSV read for `device` ("" = any; cached by path, content digest
    and device: an unchanged file is parsed once per process)."""
    raw = path.read_bytes()
    return _parse(kernel_type, str(path), hashlib.sha256(raw).hexdigest(), raw,
                  canonical_device(device))


def duration_cell(text: str) -> float | None | str:
    """A duration cell: its value, None when empty, or "bad" for unusable text."""
    t = text.strip()
    if t.upper() in EMPTY_CELLS:
        return None
    try:
        value = float(t)
    except ValueError:
        return "bad"
    return value if math.isfinite(value) and value >= 0 else "bad"


@functools.lru_cache(maxsize=256)
def _parse(kernel_type: str, path_text: str, sha: str, raw: bytes, device: str = ""
           ) -> KernelTable:
    return _parse_rows(kernel_type, path_text, sha, raw, device)


def _parse_rows(kernel_type: str, path_text: str, sha: str, raw: bytes, device: str
                ) -> KernelTable:
    path = Path(path_text)
    physical = list(io.StringIO(raw.decode("utf-8-sig")))  # lines, ends kept
    reader = csv.reader(physical)
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
    dev_i, prof_i = index.get(MEASURED_DEVICE), index.get(PROFILED_LATENCY)
    shapes_i, formats_i = cols[0], cols[2]
    numbers: list[int] = []
    latencies: list[float] = []
    lines: list[str] = []
    first_dims: list[str] = []
    bad, foreign = [], []
    end = reader.line_num
    for i, rec in enumerate(reader):
        start, end = end, reader.line_num
        if not rec:
            continue
        cell = lat_i
        if dev_i is not None:
            measured_on = rec[dev_i].strip() if dev_i < len(rec) else ""
            if device and measured_on and canonical_device(measured_on) != device:
                foreign.append(i + 2)
                if prof_i is None or prof_i == lat_i:
                    continue
                cell = prof_i  # the profiled duration, measured on the database's device
        text = rec[cell] if cell < len(rec) else ""
        try:
            latency = float(text)
        except ValueError:
            latency = duration_cell(text)
        else:
            if not 0 <= latency < math.inf:
                latency = "bad"
        if latency == "bad":
            bad.append(i + 2)
            continue
        if latency is None:
            continue  # rows without a duration carry no evidence
        numbers.append(i)
        latencies.append(latency)
        lines.append(physical[start] if end == start + 1 else "".join(physical[start:end]))
        # the text after the first tensor's last comma ("" for an NZ row or no shapes)
        first = rec[shapes_i] if shapes_i is not None and shapes_i < len(rec) else ""
        nz = formats_i is not None and formats_i < len(rec) and "FRACTAL_NZ" in rec[formats_i]
        first_dims.append("" if nz else first.lstrip(' "').split(";", 1)[0].rpartition(",")[2])
    return KernelTable(kernel_type=kernel_type, path=path, columns=columns,
                       latency_column=lat_col, sha256=sha, bad_durations=tuple(bad),
                       foreign_rows=tuple(foreign), tensor_columns=tuple(cols),
                       row_numbers=numbers, latencies=latencies, lines=lines,
                       first_dim_texts=first_dims)


class KernelTables:
    """Lazy, cached access to `{kernel_type}.csv` under a database directory.

    Communication kernels are also searched in `comm_dir` (`communication_data_ref`).
    `device`: the device lookups are for (rows replayed on another are not used)."""

    def __init__(self, data_dir: Path, comm_dir: Path | None = None, device: str = "") -> None:
        self.data_dir = data_dir
        self.comm_dir = comm_dir
        self.device = device
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
            self._cache[key] = read_kernel_table(kernel_type, path, self.device) \
                if path else None
        return self._cache[key]
