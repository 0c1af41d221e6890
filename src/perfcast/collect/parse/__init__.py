"""`collect parse`: profiler output -> per-kernel CSV tables.

`parse_profiling(path, database_path)` reads a file or searches a folder recursively for
Ascend `kernel_details`/`op_summary` CSVs and PyTorch traces (recognised by content),
aggregates the samples and writes one `{KernelType}.csv` per kernel type.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from perfcast.collect.parse.ascend import detect_layout, parse_ascend_csv, read_header
from perfcast.collect.parse.samples import KernelSample, aggregate, merge_into_database
from perfcast.collect.parse.torch_trace import is_trace, parse_torch_trace
from perfcast.collect.tables import COMM_PREFIX
from perfcast.core.errors import ConfigError


@dataclass(frozen=True)
class ParseResult:
    sources: tuple[Path, ...]
    written: tuple[Path, ...]
    samples: int
    kernel_types: tuple[str, ...]
    skipped_communication: int = 0   # hcom_* calls: no message size in a kernel profile


def find_profiles(path: Path) -> list[tuple[Path, str]]:
    """(file, kind) for every recognised profile under `path`; kind is `ascend` or `torch`.
    A single file that is not recognised is an error; unrelated files in a folder are
    skipped."""
    path = Path(path)
    if path.is_file():
        kind = _kind(path)
        if kind is None:
            raise ConfigError("is neither an Ascend kernel_details/op_summary CSV nor a PyTorch "
                              "profiler trace", source=str(path), field="--profiling-path",
                              expected="kernel_details*.csv, op_summary_*.csv or a trace JSON")
        return [(path, kind)]
    if not path.is_dir():
        raise ConfigError("does not exist", source=str(path), field="--profiling-path",
                          expected="a profile file or a folder holding one")
    found = [(p, k) for p in sorted(path.rglob("*")) if p.is_file()
             for k in [_kind(p)] if k is not None]
    if not found:
        raise ConfigError("holds no kernel_details/op_summary CSV or PyTorch trace",
                          source=str(path), field="--profiling-path")
    return found


def _kind(path: Path) -> str | None:
    if path.suffix.lower() == ".csv":
        return "ascend" if detect_layout(read_header(path)) else None
    return "torch" if is_trace(path) else None


def iter_samples(profiles: list[tuple[Path, str]]) -> Iterator[KernelSample]:
    for path, kind in profiles:
        yield from (parse_ascend_csv(path) if kind == "ascend" else parse_torch_trace(path))


MANIFEST = "collection_manifest.json"


def manifest_text(database_path: Path, profiles: list[tuple[Path, str]],
                  provenance: Mapping[str, str]) -> str:
    """The database's collection manifest with this run appended: every profile file and
    its sha256, plus the caller's provenance (device, framework versions, ...)."""
    path = Path(database_path) / MANIFEST
    runs = []
    if path.is_file():
        try:
            runs = list(json.loads(path.read_text(encoding="utf-8")).get("runs", []))
        except (json.JSONDecodeError, AttributeError):
            raise ConfigError("is not a collection manifest", source=str(path)) from None
    runs.append({"tool": "perfcast collect parse", **dict(provenance),
                 "profiles": [{"path": str(p), "kind": kind,
                               "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                              for p, kind in profiles]})
    return json.dumps({"runs": runs}, indent=1, sort_keys=True) + "\n"


def parse_profiling(profiling_path: Path, database_path: Path,
                    provenance: Mapping[str, str] | None = None) -> ParseResult:
    """Parse everything first (any malformed row aborts with nothing written), then write.

    Communication kernels (`hcom_*`) are counted but not written: a kernel profile has
    no message size for them, and `hcom_*.csv` is the `collect comm` table format."""
    profiles = find_profiles(profiling_path)
    samples = list(iter_samples(profiles))
    comm = sum(1 for s in samples if s.kernel_type.startswith(COMM_PREFIX))
    samples = [s for s in samples if not s.kernel_type.startswith(COMM_PREFIX)]
    if not samples:
        raise ConfigError("holds no kernel calls", source=str(profiling_path),
                          field="--profiling-path")
    tables = aggregate(samples)
    manifest = {Path(database_path) / MANIFEST: manifest_text(database_path, profiles,
                                                               provenance or {})}
    written = merge_into_database(tables, Path(database_path), manifest)
    return ParseResult(sources=tuple(p for p, _ in profiles), written=tuple(written),
                       samples=len(samples), kernel_types=tuple(sorted(tables)),
                       skipped_communication=comm)


__all__ = ["KernelSample", "ParseResult", "aggregate", "find_profiles", "parse_profiling"]
