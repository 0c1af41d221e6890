"""Kernel observations: measured kernel latencies, read by the existing evidence readers.

`import_kernels(path, system=...)` recognises, in this order:

* an AIConfigurator system folder (or one `<family>/<framework>/<version>` folder): a
  `collection_meta.yaml` or `reuse.yaml` below it; read with
  `perfcast.evidence.importers.aiconfigurator.import_system`, one version folder at a time;
* a per-kernel CSV database in the Ascend profiling format (`{KernelType}.csv` with
  `Input Shapes` and a latency column, optional `op_mapping.yaml` and its
  `communication_data_ref` folder); read with `perfcast.collect.evidence.collected_records`
  (on `perfcast.evidence.profiling.kernel_csv`'s columns and `collect/kernel_types.yaml`);
* profiler output: torch.profiler Chrome/Kineto traces and Ascend `kernel_details` /
  `op_summary` CSVs, found and parsed by `perfcast.collect.parse`; each file's calls are
  aggregated per (kernel type, shapes) as `perfcast collect parse` does, then read like
  a collected database. One observation per group; its source is the profile file.

The system is stated by the caller and checked against every device a source names
(AIConfigurator `device` column, op_mapping.yaml `device`, a trace's
`deviceProperties`): a source that says another device refuses the whole import.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import yaml

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.importers.aiconfigurator import import_system, version_folders
from perfcast.evidence.importers.common import file_digest
from perfcast.evidence.profiling.kernel_csv import INPUT_SHAPES, LATENCY_COLUMNS
from perfcast.observe.devices import check_device
from perfcast.observe.model import (
    ObservationManifest,
    ObservationSet,
    SourceFile,
    environment_summary,
)

IMPORTER = "perfcast.observe.kernels"
IMPORTER_REVISION = "1"
MAPPING_FILE = "op_mapping.yaml"
# op_mapping.yaml fields recorded as environment facts (under these names)
MAPPING_FACTS = {"device": "device", "version": "mapping_version",
                 "cann_version": "cann_version", "pytorch_version": "pytorch_version",
                 "op_plugin_version": "op_plugin_version",
                 "collection_date": "collection_date"}

Progress = Callable[[str], None]


def _relative(path: Path, root: Path) -> str:
    base = root if root.is_dir() else root.parent
    return Path(os.path.relpath(path, base)).as_posix()


def _all_operations() -> tuple[str, ...]:
    from perfcast.collect.kernel_types import kernel_type_table

    return tuple(sorted({s.operation for s in kernel_type_table().values()}))


# -- AIConfigurator -------------------------------------------------------------------
def _table_devices(path: Path) -> list[str]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if "device" not in pq.read_schema(path).names:
        return []
    col = pq.read_table(path, columns=["device"]).column("device")
    return sorted(str(v) for v in pc.unique(col).to_pylist() if v is not None)


def _find_table(rel: str, root: Path) -> Path:
    """The file behind an importer source path (its last four parts), under `root` or
    an ancestor (a version folder's reuse donor lives beside it)."""
    for base in (root, *list(root.parents)[:4]):
        if (base / rel).is_file():
            return base / rel
    raise ConfigError(f"cannot find {rel}", source=str(root))


def _aiconfigurator(root: Path, system: str, progress: Progress):
    folders = version_folders(root)
    parts, sources, skipped = [], [], []
    for i, folder in enumerate(folders, 1):
        progress(f"[{i}/{len(folders)}] {_relative(folder, root) or '.'}")
        try:
            db = import_system(folder, hardware=system)
        except ConfigError as exc:
            if "no supported AIConfigurator table" in str(exc):
                skipped.append(FrozenDict(path=_relative(folder, root) or ".",
                                          reason="no supported table"))
                continue
            raise
        for s in db.sources:
            if "skipped" in s:
                skipped.append(FrozenDict(path=_relative(folder / s["skipped"]["path"], root),
                                          reason=s["skipped"]["reason"]))
                continue
            path = _find_table(s["path"], folder)
            env = {"system": system, "backend": s["framework"],
                   "backend_version": s["version"]}
            devices = _table_devices(path)
            for device in devices:
                check_device(device, system, source=str(path))
            if devices:
                env["device"] = ";".join(devices)
            sources.append(SourceFile(name=_relative(path, root), sha256=s["digest"],
                                      format="aiconfigurator_parquet", rows=int(s["rows"]),
                                      revision=s["revision"], environment=FrozenDict(env)))
        parts.append(db)
    if not parts:
        raise ConfigError("no supported AIConfigurator table found", source=str(root))
    return PerformanceDatabase.concat(parts), sources, skipped


# -- Ascend per-kernel CSV database ---------------------------------------------------
def _header(path: Path) -> list[str]:
    from perfcast.collect.parse.ascend import read_header

    return [h.strip() for h in read_header(path)]


def _is_kernel_csv(path: Path) -> bool:
    from perfcast.collect.parse.ascend import detect_layout

    header = _header(path)
    if detect_layout(header):
        return False  # raw profiler output, not an aggregated table
    return INPUT_SHAPES in header and any(c in header for c in LATENCY_COLUMNS)


def _is_comm_csv(path: Path) -> bool:
    from perfcast.collect.tables import COMM_PREFIX

    header = _header(path)
    return path.stem.startswith(COMM_PREFIX) and "message_bytes" in header \
        and any(c in header for c in LATENCY_COLUMNS)


def _mapping_facts(root: Path, system: str) -> tuple[dict[str, str], Path | None]:
    path = root / MAPPING_FILE
    if not path.is_file():
        return {}, None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", source=str(path)) from None
    facts = {name: str(data[key]) for key, name in MAPPING_FACTS.items()
             if data.get(key) not in (None, "")}
    if "device" in facts:
        check_device(facts["device"], system, source=str(path))
    comm = data.get("communication_data_ref")
    comm_dir = (root / str(comm)).resolve() if comm else None
    return facts, comm_dir if comm_dir and comm_dir.is_dir() else None


def _collected(folder: Path, system: str, *, revision: str, kernel_types: Sequence[str] = ()):
    from perfcast.collect.evidence import collected_records, to_performance_records

    return to_performance_records(collected_records(
        folder, hardware=system, operations=_all_operations(), source_revision=revision,
        kernel_types=kernel_types))


def _ascend_database(root: Path, system: str, progress: Progress, kernel_types=()):
    facts, comm_dir = _mapping_facts(root, system)
    env = FrozenDict({"system": system, **facts})
    revision = root.name
    records, skipped = [], []
    for folder in [root] + ([comm_dir] if comm_dir else []):
        progress(f"reading {_relative(folder, root) or '.'}")
        records += _collected(folder, system, revision=revision, kernel_types=kernel_types)
    used = {r.provenance.source_digest for r in records}
    sources = []
    for folder in [root] + ([comm_dir] if comm_dir else []):
        for path in sorted(folder.glob("*.csv")):
            sha = file_digest(path)
            rows = sum(1 for r in records if r.provenance.source_digest == sha)
            if sha in used:
                sources.append(SourceFile(name=_relative(path, root), sha256=sha,
                                          format="ascend_kernel_csv", rows=rows,
                                          revision=revision, environment=env))
            else:
                skipped.append(FrozenDict(
                    path=_relative(path, root),
                    reason="no row perfcast reads (kernel type not in collect/kernel_types.yaml, "
                           "or no valid latency / axes)"))
    return records, sources, skipped


# -- profiler output ------------------------------------------------------------------
def _trace_devices(path: Path) -> list[str]:
    from perfcast.collect.parse.torch_trace import load_trace

    props = load_trace(path).get("deviceProperties") or []
    return sorted({str(p["name"]) for p in props if isinstance(p, dict) and p.get("name")})


def _profile_records(path: Path, kind: str, name: str, system: str,
                     kernel_types: Sequence[str] = ()):
    """One profile file's calls, aggregated per (kernel type, shapes), as records whose
    provenance is the profile file."""
    from perfcast.collect.parse import aggregate, iter_samples, merge_into_database
    from perfcast.collect.tables import COMM_PREFIX, read_table

    samples = [s for s in iter_samples([(path, kind)])
               if not s.kernel_type.startswith(COMM_PREFIX)]
    if not samples:
        return []
    sha = file_digest(path)
    with tempfile.TemporaryDirectory(prefix=".perfcast-observe-") as tmp:
        merge_into_database(aggregate(samples), Path(tmp))
        try:
            records = _collected(Path(tmp), system, revision=name, kernel_types=kernel_types)
        except ConfigError as exc:  # name the profile, not the scratch folder
            raise ConfigError(str(exc).split(": ", 1)[-1] + "; keep one with --kernel-type",
                              source=str(path)) from None
        tables = {p.name: read_table(p) for p in Path(tmp).glob("*.csv")}
    out = []
    for r in records:
        csv_file, _, line = r.provenance.raw_record_id.partition("#row")
        meta = dict(r.metadata)
        if kind == "torch":  # a trace's table is named by the framework op, not a kernel
            meta["op"] = meta.pop("kernel_type")
        names = tables[csv_file].rows[int(line) - 2].get("Kernel Names", "")
        if names:
            meta["kernel_names"] = names
        out.append(replace(r, metadata=FrozenDict(meta), provenance=replace(
            r.provenance, source_digest=sha,
            raw_record_id=f"{name}:{csv_file[:-4]}#{int(line) - 1}")))
    return out


def _profiles(root: Path, system: str, progress: Progress, kernel_types=()):
    from perfcast.collect.parse import find_profiles

    found = find_profiles(root)
    records, sources, skipped = [], [], []
    for i, (path, kind) in enumerate(found, 1):
        name = _relative(path, root)
        progress(f"[{i}/{len(found)}] {name}")
        env = {"system": system}
        devices = _trace_devices(path) if kind == "torch" else []
        for device in devices:
            check_device(device, system, source=str(path))
        if devices:
            env["device"] = ";".join(devices)
        recs = _profile_records(path, kind, name, system, kernel_types)
        if not recs:
            skipped.append(FrozenDict(path=name, reason="no kernel call perfcast reads"))
            continue
        records += recs
        sources.append(SourceFile(
            name=name, sha256=recs[0].provenance.source_digest,
            format="torch_trace" if kind == "torch" else "ascend_profile", rows=len(recs),
            revision=name, environment=FrozenDict(env)))
    return records, sources, skipped


# -- entry point ----------------------------------------------------------------------
def detect_format(path: Path) -> str:
    """aiconfigurator | ascend_kernel_csv | profiles."""
    if path.is_dir() and version_folders(path):
        return "aiconfigurator"
    if path.is_dir() and any(_is_kernel_csv(p) or _is_comm_csv(p) for p in path.glob("*.csv")):
        return "ascend_kernel_csv"
    return "profiles"


def import_kernels(path: str | Path, *, system: str, kernel_types: Sequence[str] = (),
                   progress: Progress | None = None) -> ObservationSet:
    """Read kernel measurements under `path` for `system` into an ObservationSet
    (all-or-nothing; nothing is stored). `kernel_types` keeps only these kernel types
    (CSV databases and profiles; e.g. `aten::mm` where a CPU trace times nested ops that
    measure the same product)."""
    path = Path(path)
    system = system.strip()
    if not system:
        raise ConfigError("a kernel import needs the system it was measured on",
                          field="--system", expected="a perfcast system id such as h100_sxm")
    if not path.exists():
        raise ConfigError("does not exist", source=str(path),
                          expected="an AIConfigurator folder, a per-kernel CSV folder or "
                                   "profiler output")
    say = progress or (lambda _msg: None)
    fmt = detect_format(path)
    if fmt == "aiconfigurator":
        if kernel_types:
            raise ConfigError("kernel types do not select AIConfigurator tables",
                              source=str(path), field="--kernel-type",
                              expected="no --kernel-type for an AIConfigurator folder")
        db, sources, skipped = _aiconfigurator(path, system, say)
    else:
        reader = _ascend_database if fmt == "ascend_kernel_csv" else _profiles
        records, sources, skipped = reader(path, system, say, tuple(kernel_types))
        if not records:
            raise ConfigError("holds no kernel measurement perfcast reads", source=str(path),
                              expected="rows of kernel types listed in "
                                       "perfcast/collect/kernel_types.yaml with a latency")
        db = PerformanceDatabase.from_records(records)
    manifest = ObservationManifest(
        kind="kernels", importer=IMPORTER, importer_revision=IMPORTER_REVISION,
        system=system, rows=len(db), sources=tuple(sources),
        environment=environment_summary([s.environment for s in sources]),
        skipped=tuple(skipped))
    return ObservationSet("kernels", manifest, records=db)
