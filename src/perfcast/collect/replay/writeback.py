"""Select rows, replay them on a backend and write the durations back.

Update modes (as in the spec):
* `all`: replay every selected row, and append the profiled samples of the replayed
  kernel type that matched no row (backends that profile, i.e. NPU: the device ran the
  kernel with other shapes or formats than recorded) as new rows of that CSV;
* `missing-only`: replay only rows whose `Average Duration(us)` and `Profiling Average
  Duration(us)` are both invalid (empty or 0); rows with any valid duration are skipped.

Write-back of a replayed row: the `MicroBench ...` columns get the replay statistics; the
previous `Average Duration(us)` moves to `Profiling Average Duration(us)` (once, when that
is empty); `Average/Median/Std Duration(us)` and `Count` then describe the replay.
`--prune-empty-duration-rows` deletes rows whose durations are still both invalid.
Rows of a kernel type launched over an EP group (`launch: torchrun`, DispatchFFNCombine)
whose CSV has an `EP Size` column are replayed only when it equals the launch's EP size
(`--dispatch-ffn-combine-ep-size`); the others are counted as `skipped_other_ep`.
Write-back is in batches: a CSV is rewritten atomically every `batch_rows` measured
rows (and at least every `flush_s` seconds), at its end, and when the run stops (a
failure with `fail_fast`, Ctrl-C, an error), so a killed run loses at most one batch and
a rerun with `missing-only` resumes where it stopped.
Every replayed row records its backend (`MicroBench Backend`) and the device it ran on
(`MicroBench Device`: the database's device, or the backend's name when none is known);
a lookup for another device does not use its replayed durations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfcast.collect.kernel_types import spec_for
from perfcast.collect.parse.torch_trace import INPUT_STRIDES
from perfcast.collect.replay.base import (
    DistributedLaunch,
    ReplayBackend,
    ReplayCase,
    ReplayOutcome,
    ReplaySettings,
)
from perfcast.collect.tables import (
    AVG,
    COUNT,
    INPUT_DTYPES,
    INPUT_FORMATS,
    INPUT_SHAPES,
    KEY_COLUMNS,
    MB_AVG,
    MB_BACKEND,
    MB_COUNT,
    MB_DEVICE,
    MB_MEDIAN,
    MB_STD,
    MEDIAN,
    MICROBENCH_COLUMNS,
    OUTPUT_SHAPES,
    PROFILING_AVG,
    STAT_COLUMNS,
    STD,
    KernelTable,
    format_number,
    load_database,
    parse_shapes,
    split_list,
    table_key,
    valid_duration,
    write_tables,
)
from perfcast.core.errors import ConfigError, PerfcastError
from perfcast.evidence.profiling.query_paths.moe import EP_COLUMN

UPDATE_MODES = ("all", "missing-only")


class ReplayFailed(PerfcastError):
    """A replay failed and `fail_fast` was set."""


@dataclass(frozen=True)
class RowResult:
    kernel_type: str
    row_index: int
    input_shapes: str
    outcome: ReplayOutcome
    profiling_avg_us: float | None


@dataclass
class ReplayRun:
    database_path: Path
    backend: str
    update_mode: str
    device: str = ""             # what MicroBench Device says of the replayed rows
    results: list[RowResult] = field(default_factory=list)
    skipped_valid: int = 0
    skipped_other_ep: int = 0
    not_replayable_types: list[str] = field(default_factory=list)
    pruned: int = 0
    appended: int = 0            # rows added from unmatched profiled samples (all mode)
    written: list[Path] = field(default_factory=list)

    @property
    def replayed(self) -> list[RowResult]:
        return [r for r in self.results if r.outcome.ok]

    @property
    def failed(self) -> list[RowResult]:
        return [r for r in self.results if not r.outcome.ok]


def make_backend(name: str, *, flush_l2: bool = False,
                 launch: DistributedLaunch | None = None, num_threads: int = 0) -> ReplayBackend:
    from perfcast.collect.replay.cpu import CpuBackend
    from perfcast.collect.replay.cuda import CudaBackend
    from perfcast.collect.replay.npu import NpuBackend

    backends = {"cpu": lambda: CpuBackend(num_threads=num_threads), "cuda": lambda: CudaBackend(flush_l2=flush_l2),
                "npu": lambda: NpuBackend(launch=launch)}
    if name not in backends:
        raise ConfigError(f"unknown backend {name!r}", field="--backend",
                          expected=" | ".join(backends))
    return backends[name]()


def needs_replay(row: dict[str, str], update_mode: str) -> bool:
    if update_mode == "all":
        return True
    return valid_duration(row, AVG) is None and valid_duration(row, PROFILING_AVG) is None


def case_for_row(table: KernelTable, index: int) -> ReplayCase | None:
    spec = spec_for(table.kernel_type)
    if spec is None:
        return None
    row = table.rows[index]
    src = str(table.path or table.kernel_type)
    return ReplayCase(
        case_id=f"{table.kernel_type}#{index}", spec=spec,
        input_shapes=parse_shapes(row.get(INPUT_SHAPES, ""), source=src, row=index + 2),
        input_dtypes=split_list(row.get(INPUT_DTYPES, "")),
        input_formats=split_list(row.get(INPUT_FORMATS, "")),
        input_strides=parse_shapes(row.get(INPUT_STRIDES, ""), source=src, row=index + 2,
                                   column=INPUT_STRIDES),
        runtime=tuple((c, row.get(c, "")) for c in table.key_columns()
                      if c not in KEY_COLUMNS and c != INPUT_STRIDES and (row.get(c) or "").strip()),
        output_shapes=parse_shapes(row.get(OUTPUT_SHAPES, ""), source=src, row=index + 2,
                                   column=OUTPUT_SHAPES))


def apply_outcome(table: KernelTable, index: int, outcome: ReplayOutcome, backend: str,
                  device: str = "") -> None:
    row = table.rows[index]
    stats = outcome.stats
    assert stats is not None
    table.ensure_columns([PROFILING_AVG], after=AVG)
    table.ensure_columns(list(STAT_COLUMNS) + list(MICROBENCH_COLUMNS))
    if not (row.get(PROFILING_AVG) or "").strip() and valid_duration(row, AVG) is not None:
        row[PROFILING_AVG] = row[AVG]
    row.update({MB_AVG: format_number(stats.mean_us), MB_MEDIAN: format_number(stats.median_us),
                MB_STD: format_number(stats.std_us), MB_COUNT: str(stats.count),
                MB_BACKEND: backend, MB_DEVICE: device or backend,
                AVG: format_number(stats.mean_us),
                MEDIAN: format_number(stats.median_us), STD: format_number(stats.std_us),
                COUNT: str(stats.count)})


def append_samples(table: KernelTable, samples: list, backend: str,
                   cells: dict[str, str] | None = None, device: str = "") -> int:
    """Aggregate profiled samples into rows (as `collect parse` does) and append those
    whose key the table lacks, with their statistics as the MicroBench columns; `cells`
    fills key columns the samples do not carry (the `EP Size` of an EP-group replay)."""
    from perfcast.collect.parse.samples import aggregate

    if not samples:
        return 0
    new = aggregate(samples).get(table.kernel_type)
    if new is None:
        return 0
    table.ensure_columns([c for c in new.header if c not in STAT_COLUMNS])
    table.ensure_columns(list(STAT_COLUMNS) + list(MICROBENCH_COLUMNS))
    have = {table.key_of(r) for r in table.rows}
    added = 0
    for row in new.rows:
        row.update(cells or {})
        if table.key_of(row) in have:
            continue
        row.update({MB_AVG: row[AVG], MB_MEDIAN: row[MEDIAN], MB_STD: row[STD],
                    MB_COUNT: row[COUNT], MB_BACKEND: backend, MB_DEVICE: device or backend})
        table.rows.append(row)
        added += 1
    return added


def _ep_of(row: dict[str, str]) -> int | None:
    try:
        return int(float((row.get(EP_COLUMN) or "").strip()))
    except ValueError:
        return None


def replay_database(database_path: Path, backend: ReplayBackend, *,
                    ops: Sequence[str] = (), update_mode: str = "all",
                    settings: ReplaySettings | None = None, fail_fast: bool = False,
                    prune_empty_duration_rows: bool = False, max_rows: int = 0,
                    progress: Callable[[int, int], None] | None = None,
                    ep_size: int | None = None, device: str = "", batch_rows: int = 16,
                    flush_s: float = 30.0) -> ReplayRun:
    """Replay rows of every CSV (or of the kernel types in `ops`) and write them back.
    `max_rows` > 0 caps the replayed rows per CSV (first rows in file order); `ep_size`
    selects the `EP Size` rows of EP-group kernel types (default: the backend's launch
    EP size, else every row); `device`: the device the backend measures (recorded in
    each replayed row); `batch_rows`/`flush_s`: how often a CSV is written back."""
    if update_mode not in UPDATE_MODES:
        raise ConfigError(f"unknown update mode {update_mode!r}", field="--update-mode",
                          expected=" | ".join(UPDATE_MODES))
    reason = backend.unavailable_reason()
    if reason:
        raise ConfigError(f"backend {backend.name} cannot run here: {reason}", field="--backend")
    settings = settings or ReplaySettings()
    tables = load_database(Path(database_path))
    ops = [table_key(o) for o in ops]
    unknown = [o for o in ops if o not in tables]
    if unknown:
        raise ConfigError(f"no CSV for kernel type(s) {', '.join(unknown)}",
                          source=str(database_path), field="--ops",
                          expected="kernel types with a {KernelType}.csv in the database")
    run = ReplayRun(Path(database_path), backend.name, update_mode, device or backend.name)
    if ep_size is None:
        launch = getattr(backend, "launch", None)
        ep_size = launch.ep_size if launch is not None else None
    selected = [tables[o] for o in ops] if ops else [t for k, t in tables.items()
                                                     if not k.startswith("hcom_")]
    plan: list[tuple[KernelTable, list[int]]] = []
    for table in selected:
        if spec_for(table.kernel_type) is None:
            run.not_replayable_types.append(table.kernel_type)
            continue
        candidates = range(len(table.rows))
        if spec_for(table.kernel_type).launch and EP_COLUMN in table.header and ep_size:
            candidates = [i for i in candidates if _ep_of(table.rows[i]) == ep_size]
            run.skipped_other_ep += len(table.rows) - len(candidates)
        rows = [i for i in candidates if needs_replay(table.rows[i], update_mode)]
        run.skipped_valid += len(candidates) - len(rows)
        if max_rows:
            rows = rows[:max_rows]
        plan.append((table, rows))
    total = sum(len(rows) for _, rows in plan)
    done = 0
    for table, rows in plan:
        cases = [case_for_row(table, i) for i in rows]  # malformed rows fail before any run
        pending, last = 0, time.monotonic()
        try:
            for i, case in zip(rows, cases):  # one at a time: progress and fail-fast per row
                outcome = backend.measure([case], settings)[0]
                done += 1
                prof = valid_duration(table.rows[i], PROFILING_AVG) or \
                    valid_duration(table.rows[i], AVG)
                run.results.append(RowResult(table.kernel_type, i,
                                             table.rows[i].get(INPUT_SHAPES, ""), outcome, prof))
                if outcome.ok:
                    apply_outcome(table, i, outcome, backend.name, device)
                    pending += 1
                if progress:
                    progress(done, total)
                if not outcome.ok and fail_fast:
                    raise ReplayFailed(f"{case.case_id} ({table.path}): {outcome.error}")
                if pending >= batch_rows or (pending and time.monotonic() - last >= flush_s):
                    _write(run, table)
                    pending, last = 0, time.monotonic()
        except BaseException:
            if pending:  # keep what was measured before the stop
                _write(run, table)
            raise
        added = 0
        if update_mode == "all" and hasattr(backend, "take_unmatched"):
            ep_cells = ({EP_COLUMN: str(ep_size)} if ep_size and EP_COLUMN in table.header
                        and spec_for(table.kernel_type).launch else {})
            added = append_samples(table, backend.take_unmatched(table.kernel_type), backend.name,
                                   ep_cells, device)
            run.appended += added
        if prune_empty_duration_rows:
            before = len(table.rows)
            table.rows = [r for r in table.rows if not needs_replay(r, "missing-only")]
            run.pruned += before - len(table.rows)
        if rows or prune_empty_duration_rows or added:
            _write(run, table)
    return run


def _write(run: ReplayRun, table: KernelTable) -> None:
    for path in write_tables([table]):
        if path not in run.written:
            run.written.append(path)
