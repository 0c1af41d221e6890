"""The per-kernel CSV format of the Ascend/TensorCast profiling database, and atomic I/O.

One `{KernelType}.csv` per kernel type. A row is one group of identical calls:
the key columns (`OP State`, `Accelerator Core`, input/output shapes, dtypes and
formats, plus any runtime columns such as `avg_seq_len`) and the statistics of its
samples. Encodings (as in TensorCast):

* shapes: `"d0,d1;d0,d1"` -- `;` between tensors, `,` between dims, an empty slot for an
  absent tensor, an empty string for a 0-d tensor slot;
* dtypes `DT_BF16;INT8`, formats `ND;FRACTAL_NZ`, one entry per tensor slot.

Latency columns, in the priority the contract reads them: `Average Duration(us)`,
`Profiling Average Duration(us)`, `Duration(us)`. Rows keep every column they arrive
with (unknown columns survive a replay write-back untouched).

Writes are atomic: each file is written to a temporary file in the same folder and
renamed over the target; a batch of files is staged completely before any rename. A
rewritten file keeps its mode; a new one gets the umask's default (0644 under umask 022).
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import stat
import statistics
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.kernel_csv import (INPUT_DTYPES, INPUT_FORMATS, INPUT_SHAPES,
                                                    MEASURED_DEVICE, OUTPUT_DTYPES, OUTPUT_FORMATS,
                                                    OUTPUT_SHAPES)

STATE = "OP State"
CORE = "Accelerator Core"
SHAPE_COLUMNS = (INPUT_SHAPES, INPUT_DTYPES, INPUT_FORMATS, OUTPUT_SHAPES, OUTPUT_DTYPES,
                 OUTPUT_FORMATS)
KEY_COLUMNS = (STATE, CORE) + SHAPE_COLUMNS

AVG = "Average Duration(us)"
MEDIAN = "Median Duration(us)"
STD = "Std Duration(us)"
COUNT = "Count"
PROFILING_AVG = "Profiling Average Duration(us)"
PLAIN_DURATION = "Duration(us)"
LATENCY_PRIORITY = (AVG, PROFILING_AVG, PLAIN_DURATION)
STAT_COLUMNS = (AVG, MEDIAN, STD, COUNT)

MB_AVG = "MicroBench Average Duration(us)"
MB_MEDIAN = "MicroBench Median Duration(us)"
MB_STD = "MicroBench Std Duration(us)"
MB_COUNT = "MicroBench Count"
MB_BACKEND = "MicroBench Backend"
MB_DEVICE = MEASURED_DEVICE
MICROBENCH_COLUMNS = (MB_AVG, MB_MEDIAN, MB_STD, MB_COUNT, MB_BACKEND, MB_DEVICE)

COMM_PREFIX = "hcom_"
COMM_COLUMNS = ("message_bytes", "num_devices", "dtype", "topology_tier", PLAIN_DURATION,
                "bandwidth_gbps")


@dataclass
class KernelTable:
    """One CSV: its header (column order) and string-valued rows. Mutable while a tool
    edits it; written back atomically."""

    kernel_type: str
    header: list[str]
    rows: list[dict[str, str]] = field(default_factory=list)
    path: Path | None = None

    def ensure_columns(self, columns: Iterable[str], *, after: str | None = None) -> None:
        """Add missing columns (at the end, or right after `after` when present)."""
        missing = [c for c in columns if c not in self.header]
        if not missing:
            return
        if after in self.header:
            i = self.header.index(after) + 1
            while i < len(self.header) and self.header[i] in STAT_COLUMNS:
                i += 1
            self.header[i:i] = missing
        else:
            self.header.extend(missing)

    def key_of(self, row: Mapping[str, str]) -> tuple[str, ...]:
        return tuple(row.get(c, "") for c in self.key_columns())

    def key_columns(self) -> tuple[str, ...]:
        """Columns that identify a row: everything that is not a statistic."""
        return tuple(c for c in self.header if not _is_statistic(c))


def _is_statistic(column: str) -> bool:
    return (column in STAT_COLUMNS or column in MICROBENCH_COLUMNS or column == PROFILING_AVG
            or column == PLAIN_DURATION or column == "bandwidth_gbps"
            or column.startswith("Average ") or column.startswith("MicroBench "))


def csv_name(kernel_type: str) -> str:
    """File name of a kernel type: the type itself, with characters unsafe in file names
    (`:`, `/`, spaces, ...) replaced by `_` (`aten::mm` -> `aten__mm.csv`)."""
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in kernel_type)
    if not safe.strip("._"):
        raise ConfigError(f"kernel type {kernel_type!r} has no usable file name",
                          field="Type", expected="a kernel type name")
    return safe + ".csv"


def table_key(name: str) -> str:
    """The database key (file stem) of a kernel type given either way (`aten::mm` or
    `aten__mm`)."""
    return csv_name(name)[:-4]


# -- encodings -----------------------------------------------------------------------
def strip_quotes(text: str) -> str:
    """msprof sometimes writes shape cells wrapped in literal quotes: `"128,4;"`."""
    text = text.strip()
    while len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1].strip()
    return text


def parse_shapes(text: str, *, source: str = "", row: int | None = None,
                 column: str = INPUT_SHAPES) -> tuple[tuple[int, ...] | None, ...]:
    """`"4,16;16,8;"` -> ((4, 16), (16, 8), None). An empty slot is an absent tensor.
    Raises ConfigError naming file, row and column on a malformed cell."""
    text = strip_quotes(text)
    if not text or text.upper() in ("N/A", "NA"):
        return ()
    out: list[tuple[int, ...] | None] = []
    for slot in text.split(";"):
        slot = slot.strip()
        if not slot:
            out.append(None)
            continue
        try:
            dims = tuple(int(d) for d in slot.split(","))
        except ValueError:
            raise ConfigError(f"malformed shape {slot!r} in {text!r}", source=_where(source, row),
                              field=column, expected="integers like \"d0,d1;d0,d1\"") from None
        if any(d < 0 for d in dims):
            raise ConfigError(f"negative dimension in {slot!r}", source=_where(source, row),
                              field=column, expected="non-negative integers")
        out.append(dims)
    return tuple(out)


def format_shapes(shapes: Sequence[Sequence[int] | None]) -> str:
    return ";".join("" if s is None else ",".join(str(int(d)) for d in s) for s in shapes)


def split_list(text: str) -> tuple[str, ...]:
    """`"DT_BF16;INT8"` -> ("DT_BF16", "INT8")."""
    text = strip_quotes(text)
    return tuple(p.strip() for p in text.split(";")) if text else ()


def parse_float(text: str | None, *, source: str, row: int | None, column: str,
                allow_empty: bool = False) -> float | None:
    """A finite, non-negative number, or None for an empty cell when allowed."""
    value = (text or "").strip()
    if not value or value.upper() in ("N/A", "NA"):
        if allow_empty:
            return None
        raise ConfigError("is empty", source=_where(source, row), field=column,
                          expected="a non-negative number")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"has value {value!r}", source=_where(source, row), field=column,
                          expected="a non-negative number") from None
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"has value {value!r}", source=_where(source, row), field=column,
                          expected="a finite non-negative number")
    return number


def _where(source: str, row: int | None) -> str:
    if row is None:
        return source
    return f"{source}, row {row}" if source else f"row {row}"


def valid_duration(row: Mapping[str, str], column: str) -> float | None:
    """The value of a duration cell when it is a positive finite number, else None
    (empty, 0, N/A and garbage all count as "no valid duration")."""
    try:
        value = float((row.get(column) or "").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def row_latency_us(row: Mapping[str, str]) -> tuple[float, str] | None:
    """(latency_us, column) by the contract's column priority, or None."""
    for column in LATENCY_PRIORITY:
        value = valid_duration(row, column)
        if value is not None:
            return value, column
    return None


def format_number(value: float) -> str:
    """Durations and counters with enough digits to round-trip sensibly (%.6g)."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


@dataclass(frozen=True)
class SampleStats:
    mean_us: float
    median_us: float
    std_us: float
    count: int

    @staticmethod
    def of(samples_us: Sequence[float]) -> SampleStats:
        if not samples_us:
            raise ValueError("no samples")
        return SampleStats(mean_us=statistics.fmean(samples_us),
                           median_us=statistics.median(samples_us),
                           std_us=statistics.pstdev(samples_us) if len(samples_us) > 1 else 0.0,
                           count=len(samples_us))


# -- files -----------------------------------------------------------------------------
def read_table(path: Path, kernel_type: str | None = None) -> KernelTable:
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise ConfigError("is empty", source=str(path), expected="a CSV header row")
            header = [h.strip() for h in header]
            rows = []
            for lineno, values in enumerate(reader, start=2):
                if not values:
                    continue
                if len(values) > len(header):
                    raise ConfigError(f"has {len(values)} cells but the header has "
                                      f"{len(header)}", source=_where(str(path), lineno),
                                      expected="one cell per header column")
                values = values + [""] * (len(header) - len(values))
                rows.append(dict(zip(header, values)))
    except OSError as exc:
        raise ConfigError(f"cannot be read ({exc.strerror})", source=str(path)) from None
    return KernelTable(kernel_type=kernel_type or path.stem, header=header, rows=rows, path=path)


def load_database(database_path: Path) -> dict[str, KernelTable]:
    """Every `*.csv` directly under the database folder, by kernel type (file stem)."""
    root = Path(database_path)
    if not root.is_dir():
        raise ConfigError("is not a folder", source=str(root), field="--database-path",
                          expected="an existing database folder")
    return {p.stem: read_table(p) for p in sorted(root.glob("*.csv"))}


def _render(table: KernelTable) -> str:
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(table.header)
    for row in table.rows:
        writer.writerow([row.get(c, "") for c in table.header])
    return buf.getvalue()


def write_text_atomic(path: Path, text: str) -> None:
    write_files_atomic({Path(path): text})


def default_mode(folder: bool = False) -> int:
    """The mode `open()` (or `mkdir()`) gives a new file (folder) under the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if folder else 0o666) & ~mask


def _target_mode(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return default_mode()


def write_files_atomic(files: Mapping[Path, str]) -> None:
    """Stage every file as a temporary sibling, then rename each over its target.
    If staging fails, no target is touched and the temporaries are removed."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            staged.append((tmp, path))
            os.chmod(tmp, _target_mode(path))  # mkstemp creates 0600
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
    except BaseException:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)


def write_tables(tables: Iterable[KernelTable],
                 extra_files: Mapping[Path, str] | None = None) -> list[Path]:
    files = dict(extra_files or {})
    for t in tables:
        if t.path is None:
            raise ValueError(f"table {t.kernel_type} has no path")
        files[t.path] = _render(t)
    write_files_atomic(files)
    return list(files)
