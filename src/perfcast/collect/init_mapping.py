"""`perfcast profiling init-mapping`: an `op_mapping.yaml` skeleton for a database.

The operators come from the model's task graphs (a prefill and a decode step, built as
`perfcast estimate` builds them); the kernel types from the `{KernelType}.csv` files of
the database (Ascend kernel_details types, or torch-profiler op stems such as `aten__mm`
written by `collect parse`). Each operator gets, in this order of preference:

* the entry of the stack's reference mapping (`--stack`), its kernel types cut down to
  those with a CSV in the database;
* the kernel types whose CSV rows match one of the operator's calls (input shapes and
  dtypes, by the compute path's matching rules);
* the one kernel type of the database with the operator's operation (kernel_types.yaml),
  or, for a collective, the `collect comm` table of its operation;
* a view task: `zero_cost`;
* otherwise an entry with only a TODO note (which `profiling validate` reports).

Kernel types of the database no entry reads become `profiling.<Kernel>` placeholders.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from perfcast.core.errors import ConfigError, PerfcastError
from perfcast.evidence.profiling.decomposers import COMPOSITE_DECOMPOSERS
from perfcast.evidence.profiling.kernel_csv import KernelTable, read_kernel_table
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import (
    COMM_PREFIX,
    load_op_mapping,
    parse_operator_mapping,
)
from perfcast.evidence.profiling.query_paths.common import tc_inputs
from perfcast.evidence.profiling.shape_rules import Shape, match_inputs

# --stack name -> reference mapping shipped in perfcast/evidence/profiling/stacks/
STACKS = {"vllm-ascend-0.18": "vllm-ascend-0.18.yaml"}
STACK_METADATA = ("version", "cann_version", "pytorch_version", "op_plugin_version")
# the steps whose operators the skeleton covers
PREFILL = (1, 1024)       # requests x prompt tokens
DECODE = (8, 2048)        # requests x context tokens

# perfcast task operation -> the kernel_types.yaml operations that can run it (default:
# the same name)
KERNEL_OPERATIONS = {"add": ("elementwise",), "moe": ("grouped_gemm",)}

SECTIONS = {
    "forward": "Operators of the model's graph and the kernel types that run them",
    "zero_cost": "Zero-cost operators (no kernel runs; answered as 0)",
    "accepted_miss": "Accepted misses (answered as 0 with the reason)",
    "todo": "TODO: operators without a kernel type. Give each a kernel_type, or "
            "`zero_cost: true` when no kernel runs, or `accepted_miss: \"<why>\"` when "
            "the database cannot hold it",
    "reverse": "Profiling-only kernels: CSVs of the database that no operator above reads",
}


@dataclass(frozen=True)
class OperatorCalls:
    """One operator of the graph: its distinct calls (by input tensors) and call count."""

    operator: str
    operation: str
    kind: str
    calls: tuple[OpInvokeInfo, ...]
    count: int


@dataclass
class Entry:
    name: str
    section: str
    fields: dict[str, Any]


@dataclass
class Skeleton:
    metadata: dict[str, Any]
    entries: list[Entry] = field(default_factory=list)
    model: str = ""
    stack: str = ""

    def count(self, section: str) -> int:
        return sum(1 for e in self.entries if e.section == section)

    def to_yaml(self) -> str:
        lines = [f"# op_mapping.yaml skeleton written by `perfcast profiling init-mapping` "
                 f"for {self.model}",
                 f"# (stack: {self.stack or 'none'}; steps: prefill {PREFILL[0]}x{PREFILL[1]}, "
                 f"decode {DECODE[0]} requests at {DECODE[1]} tokens). Review every entry.",
                 ""]
        if self.metadata:
            lines.append(_dump(self.metadata).rstrip())
            lines.append("")
        lines.append("operator_mappings:")
        for section, title in SECTIONS.items():
            entries = [e for e in self.entries if e.section == section]
            if not entries:
                continue
            lines += ["", *textwrap.wrap(f"===== {title}", 90, initial_indent="  # ",
                                         subsequent_indent="  #   ")]
            for e in entries:
                block = _dump({e.name: e.fields})
                lines += ["  " + line if line else line for line in block.rstrip().split("\n")]
        return "\n".join(lines) + "\n"


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, value: str):
    value = value.rstrip("\n")  # folded notes of the reference end in a newline
    style = "|" if "\n" in value.strip() else None
    return dumper.represent_scalar("tag:yaml.org,2002:str",
                                   value.strip() + "\n" if style else value, style=style)


_Dumper.add_representer(str, _text)


def _dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     width=96, allow_unicode=True)


# -- inputs ------------------------------------------------------------------------------
def graph_operators(graphs: Iterable) -> dict[str, OperatorCalls]:
    """Operators of the task graphs in first-call order, each with its distinct calls (as
    the profiling provider sees them: inputs and work axes)."""
    from perfcast.evidence.queries import query_for_task

    calls: dict[str, dict[tuple, OpInvokeInfo]] = {}
    meta: dict[str, tuple[str, str]] = {}
    counts: dict[str, int] = {}
    for graph in graphs:
        for task in graph.tasks:
            op = task.operator
            meta.setdefault(op, (task.operation, task.kind.value))
            counts[op] = counts.get(op, 0) + task.count
            call = OpInvokeInfo.from_query(query_for_task(task, ""))
            key = (tuple((t.shape, t.dtype, t.format) for t in call.inputs),
                   repr(sorted(call.dims.items())))
            calls.setdefault(op, {}).setdefault(key, call)
    return {op: OperatorCalls(op, meta[op][0], meta[op][1], tuple(c.values()), counts[op])
            for op, c in calls.items()}


def model_graphs(model, plan, precision=None) -> list:
    """A prefill and a decode step of `model` under `plan` (the graphs estimate builds)."""
    from perfcast.workload import Batch, build_task_graph

    return [build_task_graph(model, plan, Batch.prefill(*PREFILL), precision),
            build_task_graph(model, plan, Batch.decode(*DECODE), precision)]


def database_csvs(directory: Path) -> dict[str, Path]:
    """Kernel type (CSV stem) -> file, for the CSVs directly in `directory`."""
    return {p.stem: p for p in sorted(directory.glob("*.csv")) if p.is_file()}


def communication_dir(directory: Path) -> str:
    """The sub-folder holding the `hcom_*.csv` tables, when the database keeps them apart
    ("" when they sit in the database itself or nowhere)."""
    if any(directory.glob(f"{COMM_PREFIX}*.csv")):
        return ""
    found = sorted({p.parent for p in directory.rglob(f"{COMM_PREFIX}*.csv")})
    return str(found[0].relative_to(directory)) if found else ""


def load_stack(stack: str) -> dict[str, Any]:
    if stack not in STACKS:
        raise ConfigError(f"unknown stack {stack!r}", field="--stack",
                          expected=" | ".join(STACKS))
    text = resources.files("perfcast.evidence.profiling").joinpath(
        "stacks", STACKS[stack]).read_text(encoding="utf-8")
    return yaml.safe_load(text)


# -- proposals ---------------------------------------------------------------------------
class _Database:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.csvs = database_csvs(directory)
        self.comm_ref = communication_dir(directory)
        comm = directory / self.comm_ref if self.comm_ref else None
        self.comm_csvs = database_csvs(comm) if comm else {}
        self._tables: dict[str, KernelTable | None] = {}
        self._groups: dict[str, list[tuple[Any, set[int]]]] = {}

    def has(self, kernel: str) -> bool:
        return kernel in self.csvs or (kernel.startswith(COMM_PREFIX) and kernel in self.comm_csvs)

    def all_kernels(self) -> list[str]:
        return sorted(set(self.csvs) | set(self.comm_csvs))

    def table(self, kernel: str) -> KernelTable | None:
        if kernel not in self._tables:
            path = self.csvs.get(kernel)
            try:
                self._tables[kernel] = read_kernel_table(kernel, path) if path else None
            except (PerfcastError, OSError, UnicodeDecodeError):  # validate reports them
                self._tables[kernel] = None
        return self._tables[kernel]

    def matching_calls(self, kernel: str, calls: Sequence[OpInvokeInfo],
                       tc_input_count: int | None = None, *, any_tokens: bool = False) -> int:
        """How many of `calls` have a row of `kernel` matching their inputs; with
        `any_tokens`, up to the token count (the leading dim the calls' first input and
        the row's share). Rows that differ only in their token count are tried once."""
        groups = self._token_groups(kernel)
        hits = 0
        for call in calls:
            inputs = tc_inputs(call, tc_input_count)
            tokens = inputs[0][0][0] if inputs and inputs[0][0] else None
            if any((any_tokens or tokens is None or tokens in counts)
                   and match_inputs(kernel, _tokens_as(inputs, row), row, tc_input_count)
                   for row, counts in groups):
                hits += 1
        return hits

    def _token_groups(self, kernel: str) -> list[tuple[Any, set[int]]]:
        """The rows of `kernel` grouped by their tensors with the token count (the first
        input's leading dim, wherever it leads a tensor) left out: one row of each group
        and the group's token counts."""
        if kernel not in self._groups:
            table = self.table(kernel)
            groups: dict[tuple, tuple[Any, set[int]]] = {}
            for row in table.rows if table is not None and not kernel.startswith(COMM_PREFIX) \
                    else ():
                first = row.input_shapes[0] if row.input_shapes else ()
                t = first[0] if first else None
                key = (tuple((-1, *sh[1:]) if t is not None and sh and sh[0] == t else sh
                             for sh in row.input_shapes), row.input_dtypes, row.input_formats)
                groups.setdefault(key, (row, set()))[1].add(t)
            self._groups[kernel] = list(groups.values())
        return self._groups[kernel]


def _tokens_as(inputs: list[tuple[Shape, str]], row) -> list[tuple[Shape, str]]:
    """`inputs` with the token count (leading dim of the first input, wherever it leads
    a tensor) replaced by the row's."""
    if not inputs or not inputs[0][0] or not row.input_shapes or not row.input_shapes[0]:
        return inputs
    t, t_row = inputs[0][0][0], row.input_shapes[0][0]
    return [((t_row, *s[1:]) if s and s[0] == t else s, d) for s, d in inputs]


def _kernel_operation(kernel: str) -> tuple[str, str]:
    from perfcast.collect.kernel_types import spec_for

    spec = spec_for(kernel)
    return (spec.operation, spec.layout) if spec else ("", "")


def _query_mode(kernel: str) -> str:
    operation, layout = _kernel_operation(kernel)
    if layout == "fia":
        return "attention_special"
    return "moe_fused" if operation == "moe_fused" else ""


def _seeded(op: OperatorCalls, ref: dict[str, Any], db: _Database, stack: str) -> Entry:
    """The stack's entry for `op`, its kernel types cut down to the database's CSVs."""
    fields = dict(ref)
    m = parse_operator_mapping(op.operator, ref, stack)
    if m.zero_cost:
        return Entry(op.operator, "zero_cost", fields)
    if m.accepted_miss:
        return Entry(op.operator, "accepted_miss", fields)
    if m.composite:
        if m.sub_kernels and not all(db.has(k) for k in m.sub_kernels):
            missing = [k for k in m.sub_kernels if not db.has(k)]
            return _todo(op, f"{stack} runs it as {' + '.join(m.sub_kernels)}; the database "
                             f"has no {', '.join(k + '.csv' for k in missing)}")
        return Entry(op.operator, "forward", fields)
    present = [k for k in m.kernel_types if db.has(k)]
    if not present:
        return _todo(op, f"{stack} maps it to {', '.join(m.kernel_types)}; the database has "
                         "no CSV of " + ("it" if len(m.kernel_types) == 1 else "any of them"))
    fields["kernel_type"] = present[0]
    if "alternate_kernel_types" in fields or len(present) > 1:
        fields["alternate_kernel_types"] = present[1:]
        if not present[1:]:
            del fields["alternate_kernel_types"]
    dropped = [k for k in m.kernel_types if k not in present]
    note = f"init-mapping: seeded from {stack}"
    if dropped:
        note += f"; dropped (no CSV): {', '.join(dropped)}"
    if m.category != "communication" and not m.query_mode:
        hits = db.matching_calls(present[0], op.calls, m.tc_input_count)
        note += f"; rows of {present[0]}.csv match {hits} of {len(op.calls)} distinct calls"
    fields["notes"] = f"{note}. {fields.get('notes', '')}".strip()
    return Entry(op.operator, "forward", fields)


def _todo(op: OperatorCalls, why: str) -> Entry:
    shapes = "; ".join(",".join(str(d) for d in t.shape) for t in op.calls[0].tensor_inputs())
    return Entry(op.operator, "todo", {
        "notes": f"TODO ({op.operation}, {op.count} calls; first call's inputs {shapes or '-'}): "
                 f"{why}."})


def _proposed(op: OperatorCalls, db: _Database) -> Entry:
    """An entry for `op` from the database alone."""
    if op.kind == "view":
        return Entry(op.operator, "zero_cost", {
            "zero_cost": True, "notes": "shape-only view in perfcast's graph: no kernel runs"})
    if op.kind == "communication":
        from perfcast.collect.comm import COMM_FILES

        kernel = COMM_FILES.get(op.operation, "")
        if kernel and db.has(kernel):
            return Entry(op.operator, "forward", {
                "kernel_type": kernel, "category": "communication",
                "notes": f"init-mapping: the collect comm table of {op.operation}"})
        return _todo(op, f"no {kernel or op.operation} table in the database (measure it with "
                         "`perfcast collect comm`)")
    ours = KERNEL_OPERATIONS.get(op.operation, (op.operation,))
    same = [k for k in db.all_kernels() if _kernel_operation(k)[0] in ours]
    for any_tokens in (False, True):
        scored = sorted((-hits, k) for k in same
                        if (hits := db.matching_calls(k, op.calls, any_tokens=any_tokens)))
        if scored:
            kernels = [k for _, k in scored]
            fields: dict[str, Any] = {"kernel_type": kernels[0]}
            if kernels[1:]:
                fields["alternate_kernel_types"] = kernels[1:]
            shown = ", ".join(f"{k} {-h}" for h, k in scored)
            how = " up to the token count" if any_tokens else ""
            fields["notes"] = (f"init-mapping: rows of {op.operation} kernels match the op's "
                               f"distinct calls{how} ({shown} of {len(op.calls)}); check "
                               "the kernel runs this operator")
            return Entry(op.operator, "forward", fields)
    special = [k for k in same if _query_mode(k)]
    if len(same) == 1 and special:
        fields = {"kernel_type": same[0], "query_mode": _query_mode(same[0]),
                  "notes": f"init-mapping: the database's only {op.operation} kernel "
                           f"(kernel_types.yaml), read by the {_query_mode(same[0])} path"}
        return Entry(op.operator, "forward", fields)
    why = f"no row of the {op.operation} kernels matches its inputs"
    if same:
        why += f"; {op.operation} kernels in the database: {', '.join(same)}"
    unknown = [k for k in db.all_kernels() if not _kernel_operation(k)[0]
               and db.matching_calls(k, op.calls, any_tokens=True)]
    if unknown:
        why += ("; rows of kernels kernel_types.yaml does not know match it up to the "
                f"token count: {', '.join(unknown)}")
    return _todo(op, why)


def _kernels_read(entry: Entry, op: OperatorCalls | None) -> set[str]:
    """Kernel types a forward entry reads (a decomposer's sub-kernels for `op`'s calls)."""
    m = parse_operator_mapping(entry.name, entry.fields, "skeleton")
    out = set(m.kernel_types) | set(m.sub_kernels)
    decomposer = COMPOSITE_DECOMPOSERS.get(entry.name) if m.composite else None
    if decomposer is not None and op is not None:
        for call in op.calls:
            for sub in decomposer(call, m) or ():
                out |= set(sub.kernel_types)
    return out


def _reverse(kernel: str, db: _Database, reference: dict[str, Any], stack: str) -> Entry:
    name = f"profiling.{kernel}"
    if name in reference:
        fields = dict(reference[name])
        fields["kernel_type"] = kernel
        alts = [k for k in fields.get("alternate_kernel_types") or [] if db.has(k)]
        if alts:
            fields["alternate_kernel_types"] = alts
        else:
            fields.pop("alternate_kernel_types", None)
        return Entry(name, "reverse", fields)
    fields = {"kernel_type": kernel}
    if kernel.startswith(COMM_PREFIX):
        fields["category"] = "communication"
    table = db.table(kernel)
    rows = f"{len(table.rows)} row(s)" if table is not None else "a CSV"
    users = sorted(op for op, e in reference.items() if not op.startswith("profiling.")
                   and isinstance(e, dict) and kernel in _entry_kernels(e))
    note = f"TODO: {rows} in the database; no operator of the model's graph reads it."
    if users:
        note += f" {stack} maps {', '.join(users)} to it."
    fields["notes"] = note + " Map an operator to it or say which fusion produces it."
    return Entry(name, "reverse", fields)


def _entry_kernels(entry: dict[str, Any]) -> set[str]:
    out = {entry.get("kernel_type") or ""}
    for key in ("alternate_kernel_types", "sub_kernels"):
        value = entry.get(key) or []
        out |= set([value] if isinstance(value, str) else value)
    return out - {""}


# -- the skeleton ------------------------------------------------------------------------
def build_skeleton(operators: dict[str, OperatorCalls], database: Path, *, stack: str = "",
                   device: str = "", model: str = "") -> Skeleton:
    db = _Database(Path(database))
    ref_doc = load_stack(stack) if stack else {}
    reference = ref_doc.get("operator_mappings") or {}
    metadata: dict[str, Any] = {k: str(ref_doc[k]) for k in STACK_METADATA if k in ref_doc}
    if device:
        metadata = {"device": device, **metadata}
    if db.comm_ref:
        metadata["communication_data_ref"] = db.comm_ref
        metadata["communication_fallback"] = "analytic"
    sk = Skeleton(metadata, model=model, stack=stack)
    read: set[str] = set()
    for op in operators.values():
        ref = reference.get(op.operator)
        entry = _seeded(op, ref, db, stack) if isinstance(ref, dict) else _proposed(op, db)
        sk.entries.append(entry)
        if entry.section == "forward":
            read |= _kernels_read(entry, op)
    for kernel in db.all_kernels():
        if kernel not in read:
            sk.entries.append(_reverse(kernel, db, reference, stack))
    return sk


def init_mapping(model: str, database: Path, *, stack: str = "", device: str = "",
                 plan=None, precision=None) -> Skeleton:
    """The skeleton for `model` (a config path or catalog name) over `database`."""
    from perfcast.collect.devices import database_device
    from perfcast.workload import ParallelPlan, load_model_spec

    database = Path(database)
    if not database.is_dir():
        raise ConfigError("is not a directory", source=str(database), field="--database",
                          expected="a profiling database folder of {KernelType}.csv files")
    if not database_csvs(database):
        raise ConfigError("holds no {KernelType}.csv file", source=str(database),
                          field="--database", expected="a database written by collect parse")
    spec = load_model_spec(model)
    graphs = model_graphs(spec, plan or ParallelPlan(), precision)
    try:
        device = database_device(database, device)
    except ConfigError:
        try:
            load_op_mapping(database)
        except PerfcastError:
            pass  # the mapping being replaced is unreadable: only --device says
        else:
            raise
    return build_skeleton(graph_operators(graphs), database, stack=stack, device=device,
                          model=model)


def write_skeleton(skeleton: Skeleton, output: Path, force: bool = False) -> None:
    from perfcast.collect.tables import write_text_atomic

    if output.exists() and not force:
        raise ConfigError("exists", source=str(output), field="--output",
                          expected="another --output, or --force to overwrite it")
    write_text_atomic(output, skeleton.to_yaml())


__all__ = ["STACKS", "Skeleton", "build_skeleton", "graph_operators",
           "init_mapping", "model_graphs", "write_skeleton"]
