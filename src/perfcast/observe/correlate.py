"""Which tasks of a TaskGraph do kernel observations cover, and at which level?

Levels, from the most to the least specific identity of a piece of work:

| level | a task is matched when an observation ... | tasks counted |
|---|---|---|
| `model_operation` | names the task's lineage id (`L12.attn.o_proj`; per layer of a repeated run) | compute + communication |
| `distributed_task` | is the same collective: operation, `message_bytes`, `participants` | communication |
| `portable_task` | is the same operation at the same dtype, and every shape fact of its selector (`m, n, k`; attention `batch, q_tokens, kv_len, heads, ...`) equals the task's axis (the evidence layer's exact subset rule, type-strict; runtime context selectors are not shape facts) | compute |
| `concrete_kernel` | matches at the portable / distributed level and names the kernel or implementation that ran | compute + communication |

Counts are weighted by each task's repeat count (`Task.count`); view tasks (declared
zero cost) are not counted. A level the data cannot speak to (no observation names a
lineage, no collective was measured, ...) is reported as not supported, never as 0%.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from perfcast.core.frozen import FrozenDict
from perfcast.evidence.database import SEL_PREFIX, parse_selector_column, selector_column
from perfcast.evidence.records import CONTEXT_KEYS, selector_type_name
from perfcast.observe.model import ObservationSet
from perfcast.workload.graph import TaskGraph
from perfcast.workload.tensors import Task, TaskKind

NOT_SUPPORTED = "not supported by this data"
LEVELS = ("model_operation", "distributed_task", "portable_task", "concrete_kernel")
COLLECTIVE_KEYS = ("message_bytes", "participants")
_LINEAGE = re.compile(r"^L(\d+)(?:-(\d+))?(?::(\d+))?\.(.+)$")
MAX_IDS = 5


@dataclass(frozen=True)
class TaskMatch:
    """One task at one level: its weight (repeat count), the weight matched, how many
    observations matched, a few of their record ids and the kernels they name."""

    lineage: str
    operation: str
    count: int
    matched: float
    observations: int = 0
    record_ids: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class LevelReport:
    level: str
    supported: bool
    reason: str = ""                       # why not supported ("" when supported)
    matched: float = 0.0                   # weighted by repeat count
    total: float = 0.0
    tasks: tuple[TaskMatch, ...] = ()

    @property
    def unmatched(self) -> tuple[TaskMatch, ...]:
        return tuple(t for t in self.tasks if t.matched < t.count)

    @property
    def coverage(self) -> float | None:
        return self.matched / self.total if self.supported and self.total else None

    def to_json(self) -> dict:
        if not self.supported:
            return {"level": self.level, "supported": False,
                    "status": f"{NOT_SUPPORTED}: {self.reason}"}
        return {"level": self.level, "supported": True, "matched": self.matched,
                "total": self.total, "coverage": self.coverage,
                "tasks_matched": sum(1 for t in self.tasks if t.matched >= t.count),
                "tasks_total": len(self.tasks),
                "unmatched": [{"lineage": t.lineage, "operation": t.operation,
                               "count": t.count, "matched": t.matched, "reason": t.reason}
                              for t in self.unmatched]}


@dataclass(frozen=True)
class CorrelationReport:
    observation_set: str
    task_graph: str
    levels: tuple[LevelReport, ...]

    def level(self, name: str) -> LevelReport:
        for lv in self.levels:
            if lv.level == name:
                return lv
        raise KeyError(f"unknown level {name!r} (expected one of {', '.join(LEVELS)})")

    def to_json(self) -> dict:
        return {"observation_set": self.observation_set, "task_graph": self.task_graph,
                "levels": [lv.to_json() for lv in self.levels]}


# -- helpers --------------------------------------------------------------------------
def _kernel_names(table: pa.Table) -> tuple[str, ...]:
    """Kernels named by rows: `implementation` selector, else metadata kernel names/type."""
    col = selector_column("implementation", "str")
    names: set[str] = set()
    impl = table.column(col).to_pylist() if col in table.column_names else [None] * table.num_rows
    for value, meta in zip(impl, table.column("metadata").to_pylist()):
        if value:
            names.add(value)
        elif meta:
            m = json.loads(meta)
            if m.get("kernel_names") or m.get("kernel_type"):
                names.add(m.get("kernel_names") or m["kernel_type"])
    return tuple(sorted(names))


def _names_kernels(table: pa.Table) -> bool:
    col = selector_column("implementation", "str")
    if col in table.column_names and table.column(col).null_count < table.num_rows:
        return True
    meta = table.column("metadata")
    return bool(pc.any(pc.match_substring_regex(meta, '"kernel_(names|type)"')).as_py())


def _match(slice_: pa.Table, task: Task, count: int, kernels: bool,
           expr, why: str) -> TaskMatch:
    rows = slice_.filter(expr) if expr is not None else slice_
    if rows.num_rows == 0:
        return TaskMatch(task.lineage, task.operation, count, 0.0, reason=why)
    ids = tuple(rows.column("record_id").slice(0, MAX_IDS).to_pylist())
    names = _kernel_names(rows) if kernels else ()
    return TaskMatch(task.lineage, task.operation, count, float(count), rows.num_rows,
                     ids, names)


def _facts_filter(slice_: pa.Table, facts: Mapping[str, object]):
    """Rows each of whose shape selectors is a fact with the same type and value."""
    expr = None
    for name in slice_.column_names:
        if not name.startswith(SEL_PREFIX):
            continue
        key, kind = parse_selector_column(name)
        if key in CONTEXT_KEYS:
            continue
        value = facts.get(key)
        term = pc.field(name).is_null()
        if value is not None and selector_type_name(value) == kind:
            term = term | (pc.field(name) == value)
        expr = term if expr is None else expr & term
    return expr


def _describe(facts: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(facts.items()))


# -- levels ---------------------------------------------------------------------------
def _subject_rows(table: pa.Table, subject: str) -> tuple[pa.Table, bool]:
    """The rows of one subject, and whether any of them names a kernel."""
    rows = table.filter(pc.field("subject") == subject)
    return rows, bool(rows.num_rows) and _names_kernels(rows)


def _portable(table: pa.Table, tasks: list[Task], facts: Mapping[str, object]) -> LevelReport:
    ops, kernels = _subject_rows(table, "operator")
    if ops.num_rows == 0:
        return LevelReport("portable_task", False, "no compute kernel was measured")
    out = []
    for t in tasks:
        dtype = t.work.compute_dtype
        same_op = ops.filter(pc.field("operation") == t.operation)
        if same_op.num_rows == 0:
            out.append(TaskMatch(t.lineage, t.operation, t.count, 0.0,
                                 reason=f"no {t.operation} observation"))
            continue
        same = same_op.filter(pc.field("dtype") == dtype)
        if same.num_rows == 0:
            have = sorted(set(same_op.column("dtype").to_pylist()))
            out.append(TaskMatch(t.lineage, t.operation, t.count, 0.0,
                                 reason=f"no {t.operation} observation at {dtype} "
                                        f"(observed: {', '.join(have)})"))
            continue
        task_facts = {**dict(t.work.axes), **dict(facts)}
        out.append(_match(same, t, t.count, kernels, _facts_filter(same, task_facts),
                          f"no {t.operation} {dtype} observation with "
                          f"{_describe(t.work.axes)}"))
    return _level("portable_task", out)


def _distributed(table: pa.Table, tasks: list[Task]) -> LevelReport:
    comm, kernels = _subject_rows(table, "communication")
    if comm.num_rows == 0:
        return LevelReport("distributed_task", False, "no collective was measured")
    out = []
    for t in tasks:
        want = {k: t.work.axes.get(k) for k in COLLECTIVE_KEYS}
        expr = pc.field("operation") == t.operation
        for k, v in want.items():
            col = selector_column(k, "int")
            if col not in comm.column_names or v is None:
                expr = None
                break
            expr = expr & (pc.field(col) == int(v))
        if expr is None:
            out.append(TaskMatch(t.lineage, t.operation, t.count, 0.0,
                                 reason="the data has no message_bytes/participants"))
            continue
        out.append(_match(comm, t, t.count, kernels, expr,
                          f"no {t.operation} observation with {_describe(want)}"))
    return _level("distributed_task", out)


def _layers(task: Task) -> tuple[str, set[int] | None]:
    m = _LINEAGE.match(task.lineage)
    if not m:
        return task.lineage, None
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) else a
    step = int(m.group(3)) if m.group(3) else 1
    return m.group(4), set(range(a, b + 1, step))


def _model_operation(table: pa.Table, tasks: list[Task]) -> LevelReport:
    meta = table.column("metadata")
    tagged = table.filter(pc.match_substring(meta, '"lineage"'))
    if tagged.num_rows == 0:
        return LevelReport("model_operation", False,
                           "no observation names a model-operation lineage id")
    observed: dict[str, set[int] | None] = {}
    ids: dict[str, list[str]] = {}
    for rid, text in zip(tagged.column("record_id").to_pylist(),
                         tagged.column("metadata").to_pylist()):
        lineage = json.loads(text).get("lineage", "")
        m = _LINEAGE.match(lineage)
        group = m.group(4) if m else lineage
        layers = observed.setdefault(group, set() if m else None)
        if m and layers is not None:
            a = int(m.group(1))
            layers.update(range(a, (int(m.group(2)) if m.group(2) else a) + 1,
                                int(m.group(3)) if m.group(3) else 1))
        ids.setdefault(group, []).append(rid)
    out = []
    for t in tasks:
        group, layers = _layers(t)
        seen = observed.get(group, "absent")
        if seen == "absent" or (layers is None) != (seen is None):
            out.append(TaskMatch(t.lineage, t.operation, t.count, 0.0,
                                 reason=f"no observation of {t.lineage}"))
            continue
        share = 1.0 if layers is None else len(layers & seen) / len(layers)
        reason = "" if share == 1.0 else \
            f"layers observed: {len(layers & seen)} of {len(layers)}"
        out.append(TaskMatch(t.lineage, t.operation, t.count, t.count * share,
                             len(ids[group]), tuple(ids[group][:MAX_IDS]), reason=reason))
    return _level("model_operation", out)


def _concrete(portable: LevelReport, distributed: LevelReport, compute: list[Task],
              comm: list[Task], kernels: bool) -> LevelReport:
    if not kernels:
        return LevelReport("concrete_kernel", False,
                           "no observation names the kernel or implementation that ran")
    out = []
    for lv, tasks in ((distributed, comm), (portable, compute)):
        if not lv.supported:
            out += [TaskMatch(t.lineage, t.operation, t.count, 0.0, reason=lv.reason)
                    for t in tasks]
            continue
        for t in lv.tasks:
            if t.kernels:
                out.append(t)
            else:
                out.append(TaskMatch(t.lineage, t.operation, t.count, 0.0,
                                     reason=t.reason or "its observations name no kernel"))
    return _level("concrete_kernel", out)


def _level(name: str, tasks: list[TaskMatch]) -> LevelReport:
    return LevelReport(name, True, matched=sum(t.matched for t in tasks),
                       total=float(sum(t.count for t in tasks)), tasks=tuple(tasks))


def correlate(observations: ObservationSet, graph: TaskGraph, *,
              facts: Mapping[str, object] | None = None) -> CorrelationReport:
    """Match kernel observations to the tasks of `graph` at every level.
    `facts`: shape facts the graph does not carry but the deployment states (added to
    every task's axes at the portable level)."""
    table = observations.database.table
    compute = [t for t in graph.tasks if t.kind is TaskKind.COMPUTE]
    comm = [t for t in graph.tasks if t.kind is TaskKind.COMMUNICATION]
    portable = _portable(table, compute, FrozenDict(facts or {}))
    distributed = _distributed(table, comm)
    lineage = _model_operation(table, compute + comm)
    concrete = _concrete(portable, distributed, compute, comm, _names_kernels(table))
    return CorrelationReport(observation_set=observations.digest, task_graph=graph.digest,
                             levels=(lineage, distributed, portable, concrete))
