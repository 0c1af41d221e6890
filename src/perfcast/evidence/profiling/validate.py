"""Schema and coverage check of a profiling database directory (`perfcast profiling
validate DIR`): mapping fields, mutual exclusions, one CSV per runtime-used kernel type,
and the CSV columns each query path needs. Unknown fields are tolerated."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perfcast.core.errors import PerfcastError
from perfcast.evidence.profiling.decomposers import COMPOSITE_DECOMPOSERS
from perfcast.evidence.profiling.interpolating_data_source import interpolation_policy
from perfcast.evidence.profiling.kernel_csv import (
    INPUT_DTYPES,
    INPUT_SHAPES,
    LATENCY_COLUMNS,
    OUTPUT_DTYPES,
    OUTPUT_SHAPES,
    KernelTables,
)
from perfcast.evidence.profiling.op_mapping import (
    CATEGORIES,
    COMM_PREFIX,
    COMPUTE_SUBCATEGORIES,
    QUERY_MODES,
    OperatorMapping,
    load_op_mapping,
)
from perfcast.evidence.profiling.query_paths.attention import AVG_SEQ_COLUMNS
from perfcast.evidence.profiling.query_paths.communication import REQUIRED_COLUMNS

# Columns each path needs; a tuple inside means "one of".
PATH_COLUMNS: dict[str, tuple] = {
    "compute": (INPUT_SHAPES, INPUT_DTYPES, LATENCY_COLUMNS),
    "moe_fused": (INPUT_SHAPES, INPUT_DTYPES, LATENCY_COLUMNS),
    "elementwise": (OUTPUT_SHAPES, OUTPUT_DTYPES, LATENCY_COLUMNS),
    "attention_special": (INPUT_SHAPES, INPUT_DTYPES, AVG_SEQ_COLUMNS, LATENCY_COLUMNS),
    "communication": (*REQUIRED_COLUMNS, LATENCY_COLUMNS),
}


@dataclass(frozen=True)
class Issue:
    severity: str   # error | warning
    where: str      # operator_mappings.<op>[.field] or a CSV file
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.where}: {self.message}"


@dataclass
class ValidationReport:
    directory: str
    operators: int = 0
    kernels_checked: int = 0
    issues: list[Issue] = field(default_factory=list)

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors


def _path_of(m: OperatorMapping) -> str:
    if m.category == "communication":
        return "communication"
    if m.query_mode == "mtp_projection":  # the compute path with a projection kernel first
        return "compute"
    return m.query_mode if m.query_mode in QUERY_MODES else "compute"


def _unread_fields(m: OperatorMapping, decomposers) -> list[str]:
    """Warnings for the lookup fields set where no perfcast path reads them."""
    out = []
    compute = not (m.composite or m.zero_cost or m.accepted_miss) and _path_of(m) == "compute"
    if m.require_all_sub_kernels and not (m.composite and m.name in decomposers):
        out.append("require_all_sub_kernels is read only for a composite perfcast "
                   "decomposes; this entry has no registered decomposer")
    if m.primary_kernel_type:
        why = ("perfcast's decomposer for it does not read it" if m.name in decomposers
               else "perfcast has no decomposer for it, so its lookups miss (no_sub_kernels)")
        out.append(f"primary_kernel_type {m.primary_kernel_type!r} is read by TensorCast's "
                   f"decomposer of this operator; {why}")
    if m.degenerate_bmm_kernel_type and not compute:
        out.append("degenerate_bmm_kernel_type is read only by the compute path")
    if m.compute_subcategory and m.compute_subcategory not in COMPUTE_SUBCATEGORIES:
        out.append(f"compute_subcategory {m.compute_subcategory!r} is not one of "
                   f"{', '.join(COMPUTE_SUBCATEGORIES)}; `--interpolate` misses it "
                   "(compute_subcategory_unknown)")
    elif m.compute_subcategory and not compute:
        out.append("compute_subcategory is read only by the compute path's interpolation")
    if m.expected_input_formats and m.compute_subcategory != "quantized_matmul":
        out.append("expected_input_formats is read only with compute_subcategory: "
                   "quantized_matmul (its `--interpolate` regime)")
    count = m.tc_input_count
    if m.compute_subcategory == "quantized_matmul" and (
            not m.expected_input_formats
            or (count is not None and len(m.expected_input_formats) != count)):
        out.append("compute_subcategory: quantized_matmul needs one expected_input_formats "
                   f"entry per matched input (tc_input_count {count}); `--interpolate` misses "
                   "it (quantized_matmul_formats_mismatch)")
    mtp = m.query_mode == "mtp_projection"
    if mtp != bool(m.mtp_projection_kernel_type):
        out.append("query_mode: mtp_projection without mtp_projection_kernel_type: the "
                   "compute path alone is used" if mtp else
                   "mtp_projection_kernel_type is read only with query_mode: mtp_projection")
    return out


def _schema(m: OperatorMapping, decomposers) -> list[Issue]:
    w = f"operator_mappings.{m.name}"
    out: list[Issue] = []
    err = lambda msg: out.append(Issue("error", w, msg))  # noqa: E731
    warn = lambda msg: out.append(Issue("warning", w, msg))  # noqa: E731
    if m.composite and m.kernel_type:
        err("kernel_type and composite are mutually exclusive")
    if m.composite and (m.zero_cost or m.accepted_miss):
        err("composite cannot also be zero_cost or accepted_miss")
    if m.zero_cost and m.accepted_miss:
        err("zero_cost and accepted_miss are mutually exclusive")
    if m.zero_cost and m.kernel_type:
        warn("kernel_type is ignored because zero_cost: true (kernel_type, composite and "
             "zero_cost are meant to be exclusive)")
    if m.category not in CATEGORIES:
        err(f"category {m.category!r} is not one of {', '.join(CATEGORIES)}")
    if m.query_mode and m.query_mode not in QUERY_MODES:
        warn(f"query_mode {m.query_mode!r} is not one of {', '.join(QUERY_MODES)}; "
             "the compute path is used")
    if m.decomposer and not m.composite:
        err("decomposer: true requires composite: true")
    registered = m.name in decomposers
    if m.decomposer and not registered:
        warn("decomposer: true but no decomposer is registered for it; lookups miss "
             "(no_sub_kernels) unless sub_kernels are listed")
    if m.composite and not m.sub_kernels and not registered and not m.decomposer:
        err("composite without sub_kernels or a registered decomposer")
    needs_kernel = not (m.composite or m.zero_cost or m.accepted_miss)
    if needs_kernel and not m.kernel_type:
        err("kernel_type is required (unless composite, zero_cost or accepted_miss)")
    if m.alternate_kernel_types and _path_of(m) in ("elementwise", "moe_fused", "communication"):
        warn(f"alternate_kernel_types are not queried by the {_path_of(m)} path")
    for msg in _unread_fields(m, decomposers):
        warn(msg)
    return out


def _runtime_kernels(m: OperatorMapping, decomposers) -> list[tuple[str, str]]:
    """(kernel_type, path) pairs the runtime reads for this mapping."""
    if m.zero_cost or m.accepted_miss or m.is_placeholder:
        return []
    if m.composite:
        if m.name in decomposers:
            return []  # the decomposer chooses kernels at runtime
        return [(k, "communication" if k.startswith(COMM_PREFIX) else "compute")
                for k in m.sub_kernels]
    path = _path_of(m)
    kernels = m.kernel_types if path in ("compute", "attention_special") else m.kernel_types[:1]
    if path == "compute":
        extra = (m.mtp_projection_kernel_type if m.query_mode == "mtp_projection" else "",
                 m.degenerate_bmm_kernel_type)
        kernels = (*kernels, *(k for k in extra if k and k not in kernels))
    return [(k, path) for k in kernels]


def _missing_columns(columns: tuple[str, ...], path: str) -> list[str]:
    missing = []
    for need in PATH_COLUMNS[path]:
        options = need if isinstance(need, tuple) else (need,)
        if not any(o in columns for o in options):
            missing.append(" or ".join(options))
    return missing


def validate_database(directory: str | Path, decomposers=None,
                      mapping_file: str | Path | None = None) -> ValidationReport:
    """Check DIR's op_mapping.yaml (or `mapping_file`, read against DIR's CSVs)."""
    d = Path(directory)
    report = ValidationReport(str(d))
    decomposers = COMPOSITE_DECOMPOSERS if decomposers is None else decomposers
    try:
        mapping = load_op_mapping(mapping_file or d)
    except PerfcastError as exc:
        report.issues.append(Issue("error", str(d), str(exc)))
        return report
    report.operators = len(mapping.operator_mappings)
    comm_dir = (d / mapping.communication_data_ref).resolve() \
        if mapping.communication_data_ref else None
    if comm_dir is not None and not comm_dir.is_dir():
        report.issues.append(Issue("warning", "communication_data_ref",
                                   f"{comm_dir} is not a directory"))
    if not mapping.device:
        report.issues.append(Issue("warning", "device", "op_mapping.yaml declares no device; "
                                   "`estimate` uses it only with --allow-foreign-evidence"))
    try:
        interpolation_policy(mapping)
    except PerfcastError as exc:
        report.issues.append(Issue("warning", "interpolation_policy",
                                   f"{exc}; `estimate --interpolate` refuses this database"))
    tables = KernelTables(d, comm_dir, mapping.device)
    uses: dict[tuple[str, bool], set[str]] = {}
    users: dict[str, list[str]] = {}
    for m in mapping.operator_mappings.values():
        report.issues.extend(_schema(m, decomposers))
        for kernel, path in _runtime_kernels(m, decomposers):
            uses.setdefault((kernel, path == "communication"), set()).add(path)
            users.setdefault(kernel, []).append(m.name)
    for (kernel, comm), paths in sorted(uses.items()):
        report.kernels_checked += 1
        p = tables.path_for(kernel, comm)
        if p is None:
            where = "the database" + (" or communication_data_ref" if comm else "")
            report.issues.append(Issue("error", f"{kernel}.csv",
                                       f"missing from {where} (used by "
                                       f"{', '.join(sorted(set(users[kernel])))})"))
            continue
        try:
            table = tables.get(kernel, comm)
            for row in table.rows:  # tensors are parsed lazily: read every row once here
                row.input_shapes, row.output_shapes  # noqa: B018
        except PerfcastError as exc:
            report.issues.append(Issue("error", p.name, str(exc)))
            continue
        for path in sorted(paths):
            missing = _missing_columns(table.columns, path)
            if missing:
                report.issues.append(Issue("error", p.name,
                                           f"{path} path needs column(s): {'; '.join(missing)}"))
        if table.bad_durations:
            report.issues.append(Issue(
                "warning", p.name, f"{len(table.bad_durations)} row(s) skipped: "
                f"{table.latency_column} is not a non-negative number (line(s) "
                f"{line_list(table.bad_durations)})"))
        if table.foreign_rows:
            report.issues.append(Issue(
                "warning", p.name, f"{len(table.foreign_rows)} row(s) were replayed on another "
                f"device than {mapping.device}; their replayed durations are not used (line(s) "
                f"{line_list(table.foreign_rows)})"))
        if not table.rows:
            report.issues.append(Issue("warning", p.name, "has no rows with a latency"))
    return report


def line_list(lines, limit: int = 10) -> str:
    """`3, 5, 9` (the first `limit`, then how many more)."""
    head = ", ".join(str(n) for n in list(lines)[:limit])
    return head + (f" and {len(lines) - limit} more" if len(lines) > limit else "")
