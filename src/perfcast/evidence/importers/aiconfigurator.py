"""`AIConfiguratorPerformanceImporter`: NVIDIA AIConfigurator per-kernel Parquet tables.

Layout: `<system>/<family>/<framework>/<version>/<table>.parquet` with a
`collection_meta.yaml` (runtime framework and version: authoritative over the Parquet
`framework`/`version` columns) or a `reuse.yaml` (tables borrowed from another version:
imported under this folder's version, provenance noting the donor). Inside that layout
the `<framework>` folder is the runtime the tables serve: a meta that names a collector
variant (`wideep_vllm` under `comm/vllm/`) is recorded as the table's `collector`
(`layout_runtime`).

Latency is milliseconds per call, stored as seconds. Every row becomes one record whose
selector holds its shape plus three runtime selectors that must match the query:
`runtime` (framework, lower case), `runtime_revision` (version) and `implementation`
(`kernel_source`). Communication libraries (`nccl`) are not a serving runtime: their
rows carry `implementation` plus `<library>_version` instead.

Shape mapping (see docs/evidence.md for the full table):

| table | operation | selector |
|---|---|---|
| gemm_perf | gemm | m, n, k |
| context_attention_perf | attention | batch, q_tokens=isl, kv_len=isl+step, heads, kv_heads, head_dim, v_head_dim=head_dim, phase=prefill, kv_dtype, [window], [beam_width] |
| generation_attention_perf | attention | batch, q_tokens=isl (1), kv_len=isl+step, ..., phase=decode |
| context_mla_perf / generation_mla_perf | mla_attention | batch, q_tokens, kv_len, heads (rank-local; the table's tp_size is not a key), phase, kv_dtype |
| moe_perf | moe | tokens, hidden_size, inter_size, topk, num_experts, moe_tp, moe_ep, distribution |
| nccl_perf | all_reduce, all_gather, reduce_scatter, all_to_all | message_bytes = message_size x dtype bytes, participants |
| custom_allreduce_perf | all_reduce | message_bytes, participants, backend |

`[x]` is present only when it differs from the plain case (window_size 0, beam 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from perfcast.core.dtypes import DType, dtype_bytes
from perfcast.core.errors import ConfigError
from perfcast.core.yamlio import safe_load
from perfcast.evidence.contracts import CostSubject, EstimateMethod
from perfcast.evidence.database import PerformanceDatabase, selector_column
from perfcast.evidence.importers.common import (
    canonical_dtypes,
    check_device_column,
    const,
    device_systems,
    file_digest,
    first_null,
    latency_seconds,
    require_columns,
    row_ids,
)

IMPORTER = "aiconfigurator"
IMPORTER_REVISION = "3"   # 2: MLA kernel rows keyed by local heads (no tp_size); 3: rows of
# unmodelled quant modes left out (w4a8_mxfp4_mxfp8 was read as mxfp4)
SOURCE = "aiconfigurator"
MS = 1e-3

# AIConfigurator spellings that perfcast.core.dtypes does not know.
DTYPE_ALIASES = {"w4a16_mxfp4": DType.MXFP4, "half": DType.FP16}
# AIConfigurator quant modes perfcast has no dtype for (ai-dynamo/aiconfigurator
# sdk/common.py GEMMQuantMode, MoEQuantMode): their rows are left out of an import and
# said, the rest of the table imports. Each would collide with a modelled dtype's rows
# of the same shapes (fp8_static and fp8_ootb with fp8, sq with int8_wo, w4afp8 with
# int4_wo, w4a8_mxfp4_mxfp8 with w4a16_mxfp4: the Blackwell MoE tables hold both, under
# one kernel_source in TensorRT-LLM's) if it were read as one. Any other unknown
# spelling fails the table.
UNMODELLED_QUANT_MODES = {
    "sq": "W8A8 SmoothQuant INT8",
    "fp8_static": "FP8 with static per-tensor scales",
    "fp8_ootb": "FP8 of TensorRT-LLM's TensorRT-engine backend",
    "w4afp8": "INT4 weights with FP8 activations",
    "w4a8_mxfp4_mxfp8": "MXFP4 weights with MXFP8 activations",
}
# Communication libraries: no serving runtime; their version becomes this selector.
LIBRARY_VERSION_KEY = {"nccl": "nccl_version"}
# Upstream collective names -> perfcast operations.
COLLECTIVES = {"all_reduce": "all_reduce", "all_gather": "all_gather",
               "reduce_scatter": "reduce_scatter", "alltoall": "all_to_all"}

# selectors present only where they differ from the plain case (null elsewhere)
OPTIONAL_SELECTORS = frozenset({"window", "beam_width", "backend"})

Column = Callable[[pa.Table, str], "tuple[pa.Array, str] | None"]


def col(name: str) -> Column:
    return lambda t, src: (t.column(name).combine_chunks(), "int")


def value(v: str) -> Column:
    return lambda t, src: (const(v, t.num_rows), "str")


def plus(a: str, b: str) -> Column:
    return lambda t, src: (pc.add(t.column(a), t.column(b)).combine_chunks(), "int")


def dtype_of(name: str) -> Column:
    return lambda t, src: (canonical_dtypes(t.column(name), source=src, field=name,
                                            aliases=DTYPE_ALIASES,
                                            unmodelled=UNMODELLED_QUANT_MODES), "str")


def text(name: str) -> Column:
    return lambda t, src: (t.column(name).combine_chunks().cast(pa.string()), "str")


def unless(name: str, plain: int) -> Column:
    """The column, null where it equals the plain case (absent columns: all plain)."""
    def f(t: pa.Table, src: str):
        if name not in t.column_names:
            return None
        c = t.column(name).combine_chunks()
        return pc.if_else(pc.equal(c, plain), pa.scalar(None, c.type), c), "int"
    return f


def first_text(*names: str) -> Column:
    def f(t: pa.Table, src: str):
        for name in names:
            if name in t.column_names:
                return text(name)(t, src)
        return None
    return f


def message_bytes(size: str, dtype_col: str) -> Column:
    def f(t: pa.Table, src: str):
        if t.column(size).null_count:
            raise ConfigError(f"row {first_null(t.column(size))}: empty value", source=src,
                              field=size)
        dts = canonical_dtypes(t.column(dtype_col), source=src, field=dtype_col,
                               aliases=DTYPE_ALIASES)
        per = np.array([dtype_bytes(d) for d in dts.to_pylist()], dtype=np.float64)
        sizes = np.asarray(t.column(size).to_numpy(), dtype=np.float64)
        return pa.array((sizes * per).astype(np.int64)), "int"
    return f


def _first_fraction(arr: pa.Array) -> str:
    """' (row i: v)' for the first value that is not a whole number, else ''."""
    if not (pa.types.is_floating(arr.type) or pa.types.is_decimal(arr.type)):
        return ""
    values = np.asarray(arr.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=float)
    bad = ~np.isfinite(values) | (values != np.round(values))
    return f" (row {int(np.argmax(bad))}: {values[int(np.argmax(bad))]!r})" if bad.any() else ""


@dataclass(frozen=True)
class TableMapping:
    subject: CostSubject
    operation: str | None            # None: from op_name via COLLECTIVES
    dtype_column: str
    selectors: tuple[tuple[str, Column], ...]
    required: tuple[str, ...]


_ATTN = (("batch", col("batch_size")), ("q_tokens", col("isl")),
         ("kv_len", plus("isl", "step")), ("heads", col("num_heads")),
         ("kv_heads", col("num_key_value_heads")), ("head_dim", col("head_dim")),
         ("v_head_dim", col("head_dim")), ("kv_dtype", dtype_of("kv_cache_dtype")),
         ("window", unless("window_size", 0)), ("beam_width", unless("beam_width", 1)))
_ATTN_REQ = ("batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim",
             "attn_dtype", "kv_cache_dtype", "kernel_source", "latency")
# MLA kernel rows are keyed by the rank-local head count alone: the kernel's work is
# fixed by the local heads (kv_lora_rank 512 and qk_rope_head_dim 64 are the same in
# every collected model), and the collectors sweep local heads under a `tp_size` that
# names a model's tensor parallelism, not a kernel input (the H200 TRT-LLM 1.3.0rc20
# table holds 16 local heads at tp_size 4 -- a 64-head model -- where DeepSeek-V3 at TP 8
# also runs 16; AIConfigurator's loader keys the same tables by local heads only:
# docs/perf_database/head-axis-keying.md, "MLA kernel ... local-only"). Rows of two
# models at one local head count are repeated samples of one point (median).
_MLA = (("batch", col("batch_size")), ("q_tokens", col("isl")),
        ("kv_len", plus("isl", "step")), ("heads", col("num_heads")),
        ("kv_dtype", dtype_of("kv_cache_dtype")))
_MLA_REQ = ("batch_size", "isl", "step", "num_heads", "mla_dtype",
            "kv_cache_dtype", "kernel_source", "latency")

TABLES: dict[str, TableMapping] = {
    "gemm_perf": TableMapping(
        CostSubject.OPERATOR, "gemm", "gemm_dtype",
        (("m", col("m")), ("n", col("n")), ("k", col("k"))),
        ("m", "n", "k", "gemm_dtype", "kernel_source", "latency")),
    "context_attention_perf": TableMapping(
        CostSubject.OPERATOR, "attention", "attn_dtype", (*_ATTN, ("phase", value("prefill"))),
        _ATTN_REQ),
    "generation_attention_perf": TableMapping(
        CostSubject.OPERATOR, "attention", "attn_dtype", (*_ATTN, ("phase", value("decode"))),
        _ATTN_REQ),
    "context_mla_perf": TableMapping(
        CostSubject.OPERATOR, "mla_attention", "mla_dtype", (*_MLA, ("phase", value("prefill"))),
        _MLA_REQ),
    "generation_mla_perf": TableMapping(
        CostSubject.OPERATOR, "mla_attention", "mla_dtype", (*_MLA, ("phase", value("decode"))),
        _MLA_REQ),
    "moe_perf": TableMapping(
        CostSubject.OPERATOR, "moe", "moe_dtype",
        (("tokens", col("num_tokens")), ("hidden_size", col("hidden_size")),
         ("inter_size", col("inter_size")), ("topk", col("topk")),
         ("num_experts", col("num_experts")), ("moe_tp", col("moe_tp_size")),
         ("moe_ep", col("moe_ep_size")), ("distribution", text("distribution"))),
        ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
         "moe_ep_size", "distribution", "moe_dtype", "kernel_source", "latency")),
    "nccl_perf": TableMapping(
        CostSubject.COMMUNICATION, None, "nccl_dtype",
        (("message_bytes", message_bytes("message_size", "nccl_dtype")),
         ("participants", col("num_gpus"))),
        ("op_name", "nccl_dtype", "num_gpus", "message_size", "kernel_source", "latency")),
    "custom_allreduce_perf": TableMapping(
        CostSubject.COMMUNICATION, "all_reduce", "allreduce_dtype",
        (("message_bytes", message_bytes("message_size", "allreduce_dtype")),
         ("participants", col("num_gpus")), ("backend", first_text("backend", "implementation"))),
        ("allreduce_dtype", "num_gpus", "message_size", "kernel_source", "latency")),
}


def import_table(path: str | Path, *, hardware: str | None, framework: str, version: str,
                 table_name: str | None = None, source_revision: str = "",
                 status: str = "", runtime_from: str = "", collector: str = ""
                 ) -> PerformanceDatabase:
    """One AIConfigurator Parquet table -> a database (all-or-nothing). The rows are
    labelled `hardware`; a `device` column naming another model is an error. With
    `hardware=None` the system is the one the `device` column names."""
    import pyarrow.parquet as pq

    path = Path(path)
    name = table_name or path.stem
    mapping = TABLES.get(name)
    if mapping is None:
        raise ConfigError(f"unsupported AIConfigurator table {name!r}", source=str(path),
                          expected="one of " + ", ".join(sorted(TABLES)))
    src = str(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"cannot read Parquet: {exc}", source=src) from None
    require_columns(table, mapping.required, src)
    n = table.num_rows
    if n == 0:
        raise ConfigError("table has no rows", source=src)
    hardware = table_system(table, hardware, src)
    columns: dict[str, pa.Array] = {}
    zero_sized: dict[str, np.ndarray] = {}   # shape key -> rows where it is 0
    for key, make in mapping.selectors:
        made = make(table, src)
        if made is None:
            continue
        arr, kind = made
        if arr.null_count == len(arr):
            continue
        if arr.null_count and key not in OPTIONAL_SELECTORS:
            raise ConfigError(f"row {first_null(arr)}: empty value", source=src, field=key)
        if kind == "int" and not pa.types.is_integer(arr.type):
            raise ConfigError(f"expected integers, found {arr.type}{_first_fraction(arr)}",
                              source=src, field=key)
        if kind == "int" and key not in OPTIONAL_SELECTORS:
            sizes = np.asarray(arr.to_numpy(zero_copy_only=False))
            if (sizes < 0).any():
                row = int(np.argmax(sizes < 0))
                raise ConfigError(f"row {row}: {arr[row].as_py()} is not a positive size",
                                  source=src, field=key, expected="an integer > 0")
            if (sizes == 0).any():
                zero_sized[key] = sizes == 0
        columns[selector_column(key, kind)] = arr
    fw = framework.lower()
    impl = table.column("kernel_source").combine_chunks().cast(pa.string())
    if impl.null_count:
        raise ConfigError(f"row {first_null(impl)}: empty kernel_source", source=src,
                          field="kernel_source")
    columns[selector_column("implementation", "str")] = impl
    if fw in LIBRARY_VERSION_KEY:
        columns[selector_column(LIBRARY_VERSION_KEY[fw], "str")] = const(version, n)
    else:
        columns[selector_column("runtime", "str")] = const(fw, n)
        columns[selector_column("runtime_revision", "str")] = const(version, n)
    if mapping.operation is None:
        ops = table.column("op_name").combine_chunks().cast(pa.string())
        if ops.null_count:
            raise ConfigError(f"row {first_null(ops)}: empty op_name", source=src,
                              field="op_name")
        ops = ops.dictionary_encode()
        names = ops.dictionary.to_pylist()
        unknown = [i for i, o in enumerate(names) if o not in COLLECTIVES]
        if unknown:
            codes = np.asarray(ops.indices.to_numpy(zero_copy_only=False))
            row = int(np.flatnonzero(np.isin(codes, unknown))[0])
            raise ConfigError(f"row {row}: unknown collective(s) "
                              f"{sorted(names[i] for i in unknown)}", source=src,
                              field="op_name", expected="one of " + ", ".join(COLLECTIVES))
        operation = pa.DictionaryArray.from_arrays(
            ops.indices, pa.array([COLLECTIVES[o] for o in ops.dictionary.to_pylist()])
        ).cast(pa.string())
    else:
        operation = const(mapping.operation, n)
    digest = file_digest(path)
    rel = "/".join(path.parts[-4:])
    revision = source_revision or rel.rsplit("/", 1)[0]
    meta = {"table": name, "framework": framework, "version": version}
    if "device" in table.column_names:
        meta["device"] = str(table.column("device")[0].as_py())
    if status:
        meta["status"] = status
    if runtime_from:
        meta["runtime_from"] = runtime_from
    if collector:
        meta["collector"] = collector
    columns.update({
        "record_id": row_ids(f"{rel}#", n),
        "subject": const(mapping.subject.value, n),
        "operation": operation,
        "hardware": const(hardware, n),
        "dtype": canonical_dtypes(table.column(mapping.dtype_column), source=src,
                                  field=mapping.dtype_column, aliases=DTYPE_ALIASES,
                                  unmodelled=UNMODELLED_QUANT_MODES),
        "latency_s": latency_seconds(table.column("latency"), MS, source=src, field="latency"),
        "source": const(SOURCE, n), "source_revision": const(revision, n),
        "importer": const(IMPORTER, n), "importer_revision": const(IMPORTER_REVISION, n),
        "source_digest": const(digest, n),
        "method": const(EstimateMethod.MEASURED.value, n),
        "metadata": const("", n),
    })
    source = {"path": rel, "digest": digest, "rows": n, "revision": revision, **meta}
    unmodelled = _unmodelled_rows(table, columns, mapping)
    kept_rows = None   # the table's row numbers still in `columns`, once some are left out
    if unmodelled is not None:
        # a quant mode perfcast has no dtype for: left out, and said
        rows, spellings = unmodelled
        if len(rows) == n:
            raise ConfigError(
                "every row is of a quant mode perfcast does not model: " + ", ".join(
                    f"{k} ({UNMODELLED_QUANT_MODES[k]})" for k in spellings), source=src,
                field=mapping.dtype_column)
        keep = np.ones(n, dtype=bool)
        keep[rows] = False
        columns = {k: v.filter(pa.array(keep)) for k, v in columns.items()}
        zero_sized = {k: v[keep] for k, v in zero_sized.items()}
        kept_rows = np.flatnonzero(keep)
        source["left_out_quant_modes"] = {
            "reason": "quant mode perfcast does not model: " + ", ".join(
                f"{k} ({UNMODELLED_QUANT_MODES[k]})" for k in spellings),
            "rows": int(len(rows)), "first_rows": [int(r) for r in rows[:5]]}
        source["rows"] = n - int(len(rows))
    if zero_sized:
        # a zero-sized shape answers no query (query dims are > 0): left out, and said
        dropped = np.logical_or.reduce(list(zero_sized.values()))
        rows = np.flatnonzero(dropped) if kept_rows is None else kept_rows[dropped]
        columns = {k: v.filter(pa.array(~dropped)) for k, v in columns.items()}
        source["left_out"] = {
            "reason": "zero-sized shape (" + ", ".join(f"{k}=0" for k in sorted(zero_sized))
                      + "): no query asks it",
            "rows": int(len(rows)), "first_rows": [int(r) for r in rows[:5]]}
        source["rows"] = source["rows"] - int(len(rows))
    return PerformanceDatabase.from_columns(columns, name=f"aiconfigurator:{rel}",
                                            sources=[source])


def _unmodelled_rows(table: pa.Table, columns: dict[str, pa.Array], mapping: TableMapping
                     ) -> tuple[np.ndarray, list[str]] | None:
    """(row numbers, spellings) of the rows whose dtype columns hold an
    `UNMODELLED_QUANT_MODES` spelling (canonical_dtypes mapped them to ""); None if none."""
    mapped = [("dtype", mapping.dtype_column)]
    if "kv_cache_dtype" in mapping.required:
        mapped.append((selector_column("kv_dtype", "str"), "kv_cache_dtype"))
    hit = np.zeros(table.num_rows, dtype=bool)
    spellings: set[str] = set()
    for name, raw in mapped:
        if name not in columns:
            continue
        mask = np.asarray(pc.equal(columns[name], "").to_numpy(zero_copy_only=False),
                          dtype=bool)
        if mask.any():
            hit |= mask
            spellings |= {v.strip().lower() for v in pc.unique(
                table.column(raw).combine_chunks().cast(pa.string()).filter(pa.array(mask))
            ).to_pylist()}
    if not hit.any():
        return None
    return np.flatnonzero(hit), sorted(spellings)


def table_system(table: pa.Table, hardware: str | None, src: str) -> str:
    """`hardware` checked against the table's `device` column, or (None) the one system
    that column names."""
    has_device = "device" in table.column_names
    if hardware is not None:
        if has_device:
            check_device_column(table.column("device"), hardware=hardware, source=src)
        return hardware
    named = set()
    if has_device:
        for device in pc.unique(table.column("device").combine_chunks()).to_pylist():
            named |= device_systems(str(device))
    if len(named) != 1:
        found = f"its device column names {sorted(named)}" if named else \
            "no system in its folder names and no known device column"
        raise ConfigError(f"cannot tell which system the table was measured on ({found})",
                          source=src, field="device",
                          expected="--system <catalog id>, or the AIConfigurator layout "
                                   "<system>/<family>/<framework>/<version>")
    return named.pop()


def layout_runtime(version_folder: Path, meta_framework: str) -> tuple[str, str]:
    """(runtime framework of the records, collector) of a version folder whose
    `collection_meta.yaml` names `meta_framework`. In AIConfigurator's layout the
    `<framework>` folder is the data backend the tables serve; a collector variant
    writes under its base framework's folder and names itself in the meta
    (`collector/framework_manifest.yaml`: `wideep_sglang` with `base_framework: sglang`,
    `data_backend: sglang`, "writes under <family>/sglang/<its version>/"). So inside the
    layout (a catalog system three levels up) a meta framework that is not the folder's
    is the collector, and the records serve the folder's framework; outside the layout
    the meta's framework is the runtime."""
    folder_fw = version_folder.parent.name
    if meta_framework.lower() == folder_fw.lower() or folder_system(version_folder) is None:
        return meta_framework, ""
    return folder_fw, meta_framework


def folder_system(version_folder: Path) -> str | None:
    """The catalog name of `<system>` in `<system>/<family>/<framework>/<version>`, or
    None when that folder is not named after a catalog device (or an alias of one)."""
    from perfcast.hardware.catalog_loader import resolve_device_name

    if len(version_folder.parts) < 4:
        return None
    try:
        return resolve_device_name(version_folder.parents[2].name)
    except ConfigError:
        return None


def _read_yaml(path: Path) -> dict:
    try:
        data = safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", source=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping", source=str(path))
    return data


def version_folders(root: Path) -> list[Path]:
    """Every `<family>/<framework>/<version>/` folder (or `root` itself if it is one)."""
    if (root / "collection_meta.yaml").exists() or (root / "reuse.yaml").exists():
        return [root]
    found = sorted({p.parent for p in root.glob("**/collection_meta.yaml")}
                   | {p.parent for p in root.glob("**/reuse.yaml")})
    return found


def _plan(folder: Path, root: Path, wanted: set[str]) -> tuple[list[tuple[Path, dict]],
                                                               list[dict]]:
    """(table file, import_table keywords) to import and the skipped files with reasons,
    for one version folder."""
    def rel(path: Path) -> str:
        return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)

    todo: list[tuple[Path, dict]] = []
    skipped: list[dict] = []
    framework, version = folder.parent.name, folder.name
    listed: set[str] = set()
    meta_path = folder / "collection_meta.yaml"
    collector = ""
    if meta_path.exists():
        meta = _read_yaml(meta_path)
        runtime = meta.get("runtime") or {}
        framework, collector = layout_runtime(folder, str(runtime.get("framework", framework)))
        version = str(runtime.get("version", version))
        for table, info in sorted((meta.get("tables") or {}).items()):
            listed.add(table)
            status = str((info or {}).get("status", ""))
            path = folder / f"{table}.parquet"
            reason = "unsupported table" if table not in TABLES else \
                "not requested" if table not in wanted else \
                "file missing" if not path.exists() else ""
            if reason:
                skipped.append({"path": rel(path), "reason": reason})
                continue
            todo.append((path, dict(framework=framework, version=version, table_name=table,
                                    status=status, collector=collector)))
    reuse_path = folder / "reuse.yaml"
    if reuse_path.exists():
        for entry in _read_yaml(reuse_path).get("reuse") or []:
            table = str(entry.get("table", ""))
            donor = str(entry.get("from_version", ""))
            listed.add(table)
            path = folder.parent / donor / f"{table}.parquet"
            if table not in TABLES or table not in wanted:
                skipped.append({"path": rel(folder / f"{table}.parquet"),
                                "reason": "unsupported table" if table not in TABLES
                                else "not requested"})
                continue
            if not path.exists():
                raise ConfigError(f"reuse of {table} from {donor}: {path} does not exist",
                                  source=str(reuse_path), field="from_version")
            rev = f"{'/'.join(folder.parts[-3:])} (reuses {donor})"
            todo.append((path, dict(framework=framework, version=version, table_name=table,
                                    source_revision=rev)))
    for path in sorted(folder.glob("*.parquet")):
        if path.stem not in listed:
            skipped.append({"path": rel(path),
                            "reason": "not listed in collection_meta.yaml or reuse.yaml"})
    return todo, skipped


def import_system(root: str | Path, *, hardware: str | None = None,
                  tables: tuple[str, ...] | None = None,
                  progress: Callable[[str, int, int], None] | None = None
                  ) -> PerformanceDatabase:
    """Every supported table of a system folder (or of one family/framework/version
    folder). `collection_meta.yaml` names the runtime; `reuse.yaml` borrows tables.
    Unsupported tables are listed in the manifest as skipped.

    The system is the `<system>` folder of the layout when it is named after a catalog
    device, else the one the tables' `device` column names. A given `hardware` that
    contradicts either is an error. `progress(table, done, total)` is called before
    each table."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError("not a folder", source=str(root),
                          expected="an AIConfigurator system folder")
    wanted = set(tables or TABLES)
    todo: list[tuple[Path, dict, Path]] = []
    skipped: list[dict] = []
    for folder in version_folders(root):
        found, skips = _plan(folder, root, wanted)
        todo += [(path, kw, folder) for path, kw in found]
        skipped += skips
    parts: list[PerformanceDatabase] = []
    for i, (path, kw, folder) in enumerate(todo):
        if progress is not None:
            progress(str(path.relative_to(root)) if path.is_relative_to(root) else str(path),
                     i, len(todo))
        named = folder_system(folder)
        # the device column first: it names the table and row
        parts.append(import_table(path, hardware=hardware or named, **kw))
        if hardware is not None and named is not None and named != hardware:
            raise ConfigError(
                f"the folder {folder.parents[2]} holds {named} tables (AIConfigurator layout "
                f"<system>/<family>/<framework>/<version>), not {hardware}", source=str(root),
                field="--system", expected=f"--system {named} (or leave it out)")
    if not parts:
        raise ConfigError("no supported AIConfigurator table found", source=str(root),
                          expected="<family>/<framework>/<version>/<table>.parquet with "
                                   "collection_meta.yaml; tables: " + ", ".join(sorted(TABLES)))
    systems = sorted({h for p in parts for h in pc.unique(p.table.column("hardware")).to_pylist()})
    if len(systems) > 1:
        raise ConfigError(f"the tables name different systems {systems}", source=str(root),
                          field="device", expected="--system <catalog id>")
    db = PerformanceDatabase.concat(parts, name=f"aiconfigurator:{root.name}")
    return PerformanceDatabase(db.table, name=db.name, _validated=True,
                               sources=[*db.sources, *({"skipped": s} for s in skipped)])


def pairs_at_most(root: str | Path) -> frozenset | None:
    """The (operation, dtype) pairs of every table `import_system(root)` would import,
    read from those two columns alone: a superset of the pairs of its database (rows
    it leaves out, such as zero-sized shapes, count here, and nothing is validated), for
    a caller that only asks whether a folder could add a pair. None when a table cannot
    be read that way (the full import says why)."""
    import pyarrow.parquet as pq

    root = Path(root)
    if not root.is_dir():
        return None
    out: set[tuple[str, str]] = set()
    try:
        for folder in version_folders(root):
            for path, kw in _plan(folder, root, set(TABLES))[0]:
                mapping = TABLES[kw["table_name"]]
                names = [mapping.dtype_column]
                if mapping.operation is None:
                    names.append("op_name")
                table = pq.read_table(path, columns=names)
                dtypes = canonical_dtypes(table.column(mapping.dtype_column), source=str(path),
                                          field=mapping.dtype_column, aliases=DTYPE_ALIASES,
                                          unmodelled=UNMODELLED_QUANT_MODES)
                if mapping.operation is None:
                    ops = table.column("op_name").combine_chunks().cast(pa.string())
                    if ops.null_count:
                        return None
                else:
                    ops = const(mapping.operation, table.num_rows)
                groups = pa.table({"operation": ops, "dtype": dtypes}).group_by(
                    ["operation", "dtype"], use_threads=False).aggregate([])
                for op, dtype in zip(groups.column("operation").to_pylist(),
                                     groups.column("dtype").to_pylist()):
                    if not dtype:   # an unmodelled quant mode: never imported
                        continue
                    if mapping.operation is None:
                        if op not in COLLECTIVES:
                            return None
                        op = COLLECTIVES[op]
                    out.add((op, dtype))
    except (ConfigError, OSError, pa.ArrowException):
        return None
    return frozenset(out)


def table_runtime(path: Path, framework: str | None = None, version: str | None = None
                  ) -> tuple[str, str, str]:
    """(framework, version, where they come from) of one table: the caller's keywords,
    else `collection_meta.yaml` beside the file (`runtime:`), else the table's own
    `framework` / `version` columns (one value each). A keyword that contradicts the file,
    or a file that says nothing, is an error."""
    import pyarrow.parquet as pq

    src = str(path)
    said: dict[str, tuple[str, str]] = {}       # field -> (value, where)
    meta = path.parent / "collection_meta.yaml"
    if meta.exists():
        runtime = _read_yaml(meta).get("runtime") or {}
        for key in ("framework", "version"):
            if runtime.get(key) not in (None, ""):
                said[key] = (str(runtime[key]), meta.name)
        if "framework" in said:
            fw, collector = layout_runtime(path.parent, said["framework"][0])
            if collector:
                said["framework"] = (fw, f"the layout's framework folder (collector {collector} "
                                         f"in {meta.name})")
    try:
        names = set(pq.read_schema(path).names)
        wanted = [k for k in ("framework", "version") if k in names and k not in said]
        cols = pq.read_table(path, columns=wanted) if wanted else None
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"cannot read Parquet: {exc}", source=src) from None
    for key in wanted:
        values = sorted({str(v) for v in pc.unique(cols.column(key)).to_pylist()
                         if v not in (None, "")})
        if len(values) > 1:
            raise ConfigError(f"holds several values {values}", source=src, field=key,
                              expected=f"one {key} per table, or {key}=... to import it")
        if values:
            said[key] = (values[0], f"the {key} column")
    out = {}
    for key, given in (("framework", framework), ("version", version)):
        found = said.get(key)
        if given:
            if found and found[0].lower() != str(given).lower():
                raise ConfigError(f"{found[1]} says {key} {found[0]!r}, not {given!r}",
                                  source=src, field=key,
                                  expected=f"{key}={found[0]!r}, or leave it out")
            out[key] = (str(given), "the arguments")
        elif found:
            out[key] = found
        else:
            raise ConfigError(
                f"cannot tell the runtime {key} of the table: no collection_meta.yaml "
                f"beside it names one and it has no {key} column", source=src, field=key,
                expected=f"{key}=... , or the AIConfigurator layout "
                         "<system>/<family>/<framework>/<version>/ with collection_meta.yaml")
    where = sorted({w for _, w in out.values()})
    return out["framework"][0], out["version"][0], " and ".join(where)


class AIConfiguratorPerformanceImporter:
    """Facade: `from_file` for one table, `from_system` for a whole folder."""

    name = IMPORTER
    revision = IMPORTER_REVISION

    @staticmethod
    def from_file(path: str | Path, *, hardware_name: str | None = None,
                  source_revision: str = "", framework: str | None = None,
                  version: str | None = None) -> PerformanceDatabase:
        """One table. `hardware_name` is a catalog id or alias (`h100-sxm`); without it,
        the `<system>` folder of the layout, else the table's `device` column. The
        runtime framework and version come from the file (`table_runtime`) unless given."""
        from perfcast.evidence.importers.common import system_id

        path = Path(path)
        hardware = system_id(hardware_name, field="hardware_name") if hardware_name \
            else folder_system(path.parent)
        fw, ver, where = table_runtime(path, framework, version)
        return import_table(path, hardware=hardware, framework=fw, version=ver,
                            source_revision=source_revision, runtime_from=where)

    @staticmethod
    def from_system(root: str | Path, *, hardware_name: str | None = None,
                    tables: tuple[str, ...] | None = None) -> PerformanceDatabase:
        return import_system(root, hardware=hardware_name, tables=tables)
