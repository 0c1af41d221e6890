"""Serving observations from a silicon-sample CSV (AIConfigurator `silicon_sample.csv`
layout: `id, silicon_data_source, backend, backend_version, model_path, system, ...,
silicon_ttft_ms, silicon_tpot_ms`).

Strict and all-or-nothing: a missing required column names the file and the column; a
bad value names the file, the line and the field. Every column of every row is kept
verbatim (strings). Environment facts per row: `system`, `backend`, `backend_version`
and `container_image` when `silicon_data_source` names one (`image=<ref>` or a bare
`registry/name:tag` part). They are recorded as facts, not read as rules.
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.importers.common import file_digest
from perfcast.observe.model import (
    ObservationManifest,
    ObservationSet,
    ObservationSource,
    ServingObservation,
    SourceFile,
    environment_summary,
)

IMPORTER = "perfcast.observe.silicon"
IMPORTER_REVISION = "1"
FORMAT = "silicon_csv"

# the columns perfcast.serving.silicon reads a row by
REQUIRED = ("id", "backend", "model_path", "system", "mode", "isl", "osl",
            "silicon_ttft_ms", "silicon_tpot_ms")
# value rules: (kind, required); kind "count" = non-negative whole number,
# "positive" = finite number > 0, "text" = non-empty
_LAYOUT = ("batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
           "moe_ep_size")
RULES: dict[str, tuple[str, bool]] = {
    "id": ("text", True), "backend": ("text", True), "model_path": ("text", True),
    "system": ("text", True), "mode": ("text", True),
    "isl": ("count", True), "osl": ("count", True),
    "silicon_ttft_ms": ("positive", True), "silicon_tpot_ms": ("positive", True),
    **{c: ("count", False) for c in _LAYOUT},
    **{f"{p}_{c}": ("count", False) for p in ("prefill", "decode")
       for c in (*_LAYOUT, "num_workers")},
}
ENVIRONMENT_COLUMNS = {"system": "system", "backend": "backend",
                       "backend_version": "backend_version"}
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._\-]*(?:/[a-z0-9._\-]+)+:[\w.\-]+$")


def container_images(provenance: str) -> list[str]:
    """Container image references named in a `silicon_data_source` text."""
    found = []
    for part in provenance.split(";"):
        part = part.strip()
        if part.startswith("image="):
            part = part[len("image="):].strip()
        if _IMAGE.match(part) and part not in found:
            found.append(part)
    return found


def _check(value: str, kind: str, required: bool) -> str | None:
    """Why `value` breaks its rule, or None."""
    text = value.strip()
    if not text:
        return "is empty" if required else None
    if kind == "text":
        return None
    try:
        number = float(text)
    except ValueError:
        return f"is not a number ({value!r})"
    if not math.isfinite(number):
        return f"is not finite ({value!r})"
    if kind == "positive" and number <= 0:
        return f"must be positive ({value!r})"
    if kind == "count" and (number < 0 or number != int(number)):
        return f"must be a non-negative whole number ({value!r})"
    return None


def _environment(row: dict[str, str]) -> FrozenDict[str, str]:
    env = {fact: row[col].strip() for fact, col in ENVIRONMENT_COLUMNS.items()
           if (row.get(col) or "").strip()}
    images = container_images(row.get("silicon_data_source") or "")
    if images:
        env["container_image"] = ";".join(images)
    return FrozenDict(env)


def import_silicon(path: str | Path, *, name: str | None = None) -> ObservationSet:
    """Read a silicon-sample CSV into a serving ObservationSet (nothing is stored)."""
    path = Path(path)
    src = str(path)
    if not path.is_file():
        raise ConfigError("does not exist or is not a file", source=src,
                          expected="a silicon-sample CSV")
    sha = file_digest(path)
    fname = name or path.name
    observations = []
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header:
            raise ConfigError("is empty", source=src, expected="a CSV header row")
        dupes = sorted({c for c in header if header.count(c) > 1})
        if dupes:
            raise ConfigError(f"column(s) {', '.join(dupes)} appear twice", source=src,
                              field=dupes[0])
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise ConfigError(f"missing column(s) {', '.join(missing)}", source=src,
                              field=missing[0],
                              expected="the silicon-sample CSV layout with columns "
                                       + ", ".join(REQUIRED))
        ids: dict[str, int] = {}
        for values in reader:
            line = reader.line_num
            if not values:
                continue  # csv.DictReader skips blank lines too
            where = f"{src}, row {line}"
            if len(values) != len(header):
                raise ConfigError(f"has {len(values)} fields, the header {len(header)}",
                                  source=where, field=header[len(values)]
                                  if len(values) < len(header) else "(extra field)")
            row = dict(zip(header, values))
            for col, (kind, required) in RULES.items():
                if col in row:
                    problem = _check(row[col], kind, required)
                    if problem:
                        raise ConfigError(problem, source=where, field=col)
            rid = row["id"].strip()
            if rid in ids:
                raise ConfigError(f"id {rid!r} already used on row {ids[rid]}",
                                  source=where, field="id", expected="unique row ids")
            ids[rid] = line
            observations.append(ServingObservation(
                source=ObservationSource(file=fname, sha256=sha, row=line, record_id=rid),
                environment=_environment(row), values=FrozenDict(row)))
    if not observations:
        raise ConfigError("holds no rows", source=src, expected="one row per deployment")
    systems = sorted({o.values["system"].strip() for o in observations})
    manifest = ObservationManifest(
        kind="serving", importer=IMPORTER, importer_revision=IMPORTER_REVISION,
        system=",".join(systems), rows=len(observations),
        sources=(SourceFile(name=fname, sha256=sha, format=FORMAT, rows=len(observations),
                            columns=tuple(header)),),
        environment=environment_summary([o.environment for o in observations]))
    return ObservationSet("serving", manifest, serving=observations)
