"""Request traces (`perfcast serve --trace FILE`): arrival times and lengths of real
requests, read in the layouts public traces are published in. The layout is told by
the column names (CSV header or JSON keys); docs/serving.md lists them with sources.

* `mooncake` (JSONL): `timestamp` (ms from the first request), `input_length`,
  `output_length`, `hash_ids` (one id per 512-token block of the prompt; equal ids are
  a shared prefix). kvcache-ai/Mooncake FAST25-release/README.md and traces/.
* `plain` (CSV or JSONL): the Mooncake columns without `hash_ids`.
* `azure` (CSV, Azure LLM inference traces 2023 and 2024): `TIMESTAMP` (date and time,
  e.g. `2023-11-16 18:17:03.9799600` or `2024-05-12 00:00:00.001163+00:00`),
  `ContextTokens`, `GeneratedTokens`. Azure/AzurePublicDataset
  AzureLLMInferenceDataset2023.md, AzureLLMInferenceDataset2024.md.
* `burstgpt` (CSV): `Timestamp` (seconds), `Model`, `Request tokens`, `Response tokens`,
  `Total tokens`, `Log Type`; rows with `Response tokens` 0 are failed requests (the
  README of HPMLL/BurstGPT) and are left out, counted in `Trace.skipped_rows`.

Rows are replayed in time order, the earliest at t = 0.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from perfcast.core.errors import ConfigError
from perfcast.serving.requests import TraceRequest

# tokens per `hash_ids` block in Mooncake traces (kvcache-ai/Mooncake traces; the
# Dynamo and AIPerf trace tools use the same default block size of 512)
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Layout:
    name: str
    time: str                      # column of the arrival time
    input: str
    output: str
    hashes: str | None = None      # column of the block hashes
    skip_zero_output: bool = False  # zero output tokens mark a failed request


MOONCAKE = Layout("mooncake", "timestamp", "input_length", "output_length", "hash_ids")
PLAIN = Layout("plain", "timestamp", "input_length", "output_length")
AZURE = Layout("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT = Layout("burstgpt", "Timestamp", "Request tokens", "Response tokens",
                  skip_zero_output=True)
CSV_LAYOUTS = (AZURE, BURSTGPT, PLAIN)
LAYOUT_TEXT = ("Mooncake JSONL (timestamp ms, input_length, output_length, hash_ids), "
               "timestamp/input_length/output_length (CSV or JSONL, timestamp in ms), "
               "Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens), "
               "BurstGPT CSV (Timestamp, Request tokens, Response tokens, ...)")


@dataclass(frozen=True)
class Trace:
    path: str
    layout: str
    requests: tuple[TraceRequest, ...]
    skipped_rows: int = 0          # failed requests left out (BurstGPT zero responses)
    truncated: bool = False        # reading stopped at `limit` rows
    block_tokens: int | None = None  # tokens per block hash, when the trace has hashes

    @property
    def has_block_hashes(self) -> bool:
        return any(r.block_hashes for r in self.requests)

    def summary(self) -> dict:
        n = len(self.requests)
        return {"path": self.path, "layout": self.layout, "requests": n,
                "mean_input_tokens": sum(r.input_tokens for r in self.requests) / n,
                "mean_output_tokens": sum(r.output_tokens for r in self.requests) / n,
                "duration_s": self.requests[-1].arrival_s - self.requests[0].arrival_s,
                "skipped_rows": self.skipped_rows, "block_hashes": self.has_block_hashes,
                "block_tokens": self.block_tokens if self.has_block_hashes else None}


def read_trace(path: Path, limit: int | None = None) -> Trace:
    """The requests of the trace at `path` (at most `limit`: the first rows of the file,
    read no further); a bad row is a ConfigError naming the file, line and column.
    Lines starting with `#` before the data are comments."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            return _read(path, f, limit)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the trace: {getattr(exc, 'strerror', None) or exc}",
                          source=str(path), field="--trace") from None


def _read(path: Path, f, limit: int | None) -> Trace:
    skipped_lines = 0
    first = ""
    while True:
        line = f.readline()
        if not line:
            break
        if line.strip() and not line.startswith("#"):
            first = line
            break
        skipped_lines += 1
    if not first:
        raise ConfigError("holds no requests", source=str(path), field="--trace",
                          expected=LAYOUT_TEXT)
    if first.lstrip().startswith("{"):
        layout, rows = MOONCAKE, _jsonl_rows(path, first, f, skipped_lines + 1)
    else:
        layout, rows = _csv_rows(path, first, f, skipped_lines + 1)
    parse_time = _datetime_s if layout is AZURE else (
        (lambda v: _number(v) / 1000.0) if layout.time == "timestamp" else _number)
    out: list[TraceRequest] = []
    skipped = 0
    truncated = False
    for line_no, row in rows:
        if limit is not None and len(out) >= limit:
            truncated = True
            break
        req = _request(path, layout, parse_time, line_no, row)
        if req is None:
            skipped += 1
            continue
        out.append(req)
    if not out:
        raise ConfigError("holds no requests" + (f" ({skipped} failed requests left out)"
                                                 if skipped else ""),
                          source=str(path), field="--trace", expected=LAYOUT_TEXT)
    out.sort(key=lambda r: r.arrival_s)
    t0 = out[0].arrival_s
    reqs = tuple(TraceRequest(r.arrival_s - t0, r.input_tokens, r.output_tokens,
                              r.block_hashes) for r in out)
    hashed = layout.hashes is not None and any(r.block_hashes for r in reqs)
    name = "plain" if layout is MOONCAKE and not hashed else layout.name
    return Trace(str(path), name, reqs, skipped, truncated,
                 MOONCAKE_BLOCK_TOKENS if hashed else None)


def _jsonl_rows(path: Path, first: str, f, first_no: int):
    """(line number, object) of each JSON line; the first object must hold the
    Mooncake / plain keys."""
    def parse(i: int, s: str) -> dict:
        try:
            obj = json.loads(s)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"line {i}: not a JSON object ({exc.msg})", source=str(path),
                              field="--trace", expected="one JSON object per line") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"line {i}: {s[:40]!r} is not a JSON object", source=str(path),
                              field="--trace", expected="one JSON object per line")
        return obj

    head = parse(first_no, first.strip())
    missing = [k for k in (MOONCAKE.time, MOONCAKE.input, MOONCAKE.output) if k not in head]
    if missing:
        raise ConfigError(f"line {first_no}: no {', '.join(missing)} key", source=str(path),
                          field=missing[0], expected=LAYOUT_TEXT)
    yield first_no, head
    for i, line in enumerate(f, first_no + 1):
        s = line.strip()
        if s:
            yield i, parse(i, s)


def _csv_rows(path: Path, first: str, f, header_no: int):
    header = [h.strip() for h in next(csv.reader([first]))]
    columns = set(header)
    layout = next((lay for lay in CSV_LAYOUTS
                   if {lay.time, lay.input, lay.output} <= columns), None)
    if layout is None:
        raise ConfigError(f"line {header_no}: header {','.join(header)!r} is no known trace "
                          "layout", source=str(path), field="--trace", expected=LAYOUT_TEXT)
    index = {name: header.index(name) for name in (layout.time, layout.input, layout.output)}

    def rows():
        reader = csv.reader(f)
        for values in reader:
            line_no = header_no + reader.line_num
            if not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise ConfigError(f"line {line_no}: {len(values)} fields, the header has "
                                  f"{len(header)}", source=str(path), field="--trace",
                                  expected="one value per header column")
            yield line_no, {k: values[i].strip() for k, i in index.items()}

    return layout, rows()


def _request(path: Path, layout: Layout, parse_time: Callable, line_no: int,
             row: dict) -> TraceRequest | None:
    def bad(column: str, value, expected: str) -> ConfigError:
        return ConfigError(f"line {line_no}: {value!r} is not {expected}", source=str(path),
                           field=column)

    for column in (layout.time, layout.input, layout.output):
        if column not in row:
            raise ConfigError(f"line {line_no}: no {column!r}", source=str(path),
                              field=column, expected="every row to have the layout's columns")
    raw_t = row[layout.time]
    try:
        t = parse_time(raw_t)
    except (TypeError, ValueError):
        what = ("a date and time (e.g. 2023-11-16 18:17:03.9799600)" if layout is AZURE
                else "a time in " + ("milliseconds" if layout.time == "timestamp" else "seconds"))
        raise bad(layout.time, raw_t, what) from None
    if not math.isfinite(t) or (layout is not AZURE and t < 0):
        raise bad(layout.time, raw_t, "a finite, non-negative time")
    isl = _count(row[layout.input])
    if isl is None or isl < 1:
        raise bad(layout.input, row[layout.input], "a positive number of tokens")
    osl = _count(row[layout.output])
    if osl == 0 and layout.skip_zero_output:
        return None
    if osl is None or osl < 1:
        raise bad(layout.output, row[layout.output], "a positive number of tokens")
    hashes: tuple[int, ...] = ()
    if layout.hashes is not None and layout.hashes in row:
        raw = row[layout.hashes]
        if not isinstance(raw, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                for h in raw):
            raise bad(layout.hashes, raw, "a list of integer block ids")
        blocks = -(-isl // MOONCAKE_BLOCK_TOKENS)
        if len(raw) > blocks:
            raise ConfigError(f"line {line_no}: {len(raw)} block ids for {isl} input tokens",
                              source=str(path), field=layout.hashes,
                              expected=f"at most {blocks} ({MOONCAKE_BLOCK_TOKENS}-token "
                                       "blocks)")
        hashes = tuple(raw)
    return TraceRequest(t, isl, osl, hashes)


def _number(value) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    return float(value)


def _count(value) -> int | None:
    """An integer token count from a JSON number or CSV text; None if it is not one."""
    if isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and f == int(f) else None


def _datetime_s(value) -> float:
    """Seconds since the epoch of an Azure TIMESTAMP; a time without a zone is UTC."""
    if not isinstance(value, str):
        raise ValueError(value)
    d = datetime.fromisoformat(value.strip())
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return d.timestamp()
