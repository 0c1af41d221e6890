"""Measured evidence of one deployment: AIConfigurator-layout folders -> providers and
the query context that selects them (`serve`, `search`, `validate` and `estimate
--implementation auto` read evidence through this one loader).

`evidence_loader(root, graph_max_tokens=...)` returns `evidence_for(system, backend, version)` that imports
`root/<system>/<family>/<backend>/<version>/*.parquet` through the evidence layer's
AIConfigurator importer and hands the providers to the resolver ahead of the analytic
models. Which collected version each operation family is read at follows a policy
(`set`: the GEMM family's nearest version for all; `family`: each its own nearest; see
`evidence_loader`), with an (operation, dtype) the chosen version lacks read from the
nearest version that has it; the choice is in the returned note. The providers ask,
per query, for the kernel the engine's dispatch rules pick (`evidence.engine_kernels`)
and correct the answers (`evidence.importers.aiconfigurator_corrections`: among them
the GEMM table's fitted per-call overhead, which an engine replaying CUDA graphs of up
to `graph_max_tokens(backend)` tokens does not pay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostQueryContext
from perfcast.evidence.versions import nearest_first, nearest_version, version_key


ANCHOR_FAMILY = "gemm"  # a backend without GEMM tables for a system cannot cost a deployment


def layout_root(path: Path, system: str) -> Path | None:
    """The root of an AIConfigurator layout (`<root>/<system>/<family>/<backend>/<version>`)
    holding GEMM tables of `system`, given that root or its `<system>` folder; None
    when `path` is neither."""
    if not path.is_dir():
        return None
    if (path / system / ANCHOR_FAMILY).is_dir():
        return path
    if path.name == system and (path / ANCHOR_FAMILY).is_dir():
        return path.parent
    return None


def collected_versions(root: Path, system: str, backend: str) -> list[str]:
    """Versions of `backend` with GEMM tables for `system`."""
    return family_versions(root, system, backend).get(ANCHOR_FAMILY, [])


def family_versions(root: Path, system: str, backend: str) -> dict[str, list[str]]:
    """Per operation family folder (`gemm`, `moe`, `attention`, ...), the collected
    versions of `backend` on `system`."""
    base = root / system
    out: dict[str, list[str]] = {}
    if not base.is_dir():
        return out
    for family in sorted(base.iterdir()):
        folder = family / backend
        if folder.is_dir():
            versions = [p.name for p in folder.iterdir() if p.is_dir()]
            if versions:
                out[family.name] = sorted(versions, key=version_key)
    return out


@dataclass(frozen=True)
class DeploymentEvidence:
    """Measured providers for one (system, backend, version asked), and the query
    context that selects them: runtime, the GEMM family's collected version and, per
    operation, the kernel implementation with the most rows (which the providers refine
    per query by the engine's dispatch rules). `family_versions`: the collected version
    each family folder was read at, and (key `operation@dtype`) the other version read
    for a data type the family's version lacks."""

    providers: tuple
    context: CostQueryContext
    version: str
    note: str = ""
    family_versions: FrozenDict = field(default_factory=FrozenDict)


EMPTY = DeploymentEvidence((), CostQueryContext(), "")


def no_tables(system: str, backend: str, why: str) -> DeploymentEvidence:
    """No measured evidence for the deployment; the note says so, and what prices its
    kernels instead."""
    return DeploymentEvidence((), CostQueryContext(), "", note=(
        f"no measured {backend} kernel tables for {system} under the evidence root ({why}): "
        "every kernel priced by the analytic models (the revision's efficiency curves where "
        "they answer for this device, else the roofline and collective models)"))


VERSION_POLICIES = ("set", "family")


def evidence_loader(root: Path, *, graph_max_tokens: Callable[[str], int],
                    policy: str = "interpolate", versions: str = "set"
                    ) -> Callable[[str, str, str], DeploymentEvidence]:
    """`evidence_for(system, backend, version)` over an AIConfigurator-layout folder.
    `graph_max_tokens(backend)`: the largest batch the engine replays as a CUDA graph
    (0: eager; the serving backend files state it: `serving.evidence`).
    `versions`: which collected version each operation family is read at:

    * `set` (default): the tables collected with the GEMM family's nearest version, as
      one set (a collection run's tables share one harness and engine build); a family
      without that version takes its own nearest;
    * `family`: every family at its own nearest version (`nearest_version`).

    Either way an (operation, dtype) that the family's version lacks is read from the
    nearest version that has it, and the note says so."""
    if versions not in VERSION_POLICIES:
        raise ConfigError(f"unknown evidence version policy {versions!r}",
                          field="--evidence-versions", expected=" | ".join(VERSION_POLICIES))
    if not root.is_dir():
        raise ConfigError("is not a folder", source=str(root), field="--evidence-root",
                          expected="a folder laid out as <system>/<family>/<framework>/<version>")
    folders: dict[Path, object] = {}
    folder_pairs: dict[Path, frozenset] = {}   # _pairs of each folder's tables, once
    folder_bounds: dict[Path, frozenset | None] = {}   # their supersets, read light
    tables: dict[tuple, tuple] = {}
    cache: dict[tuple[str, str, str], DeploymentEvidence] = {}

    def read(system: str, family: str, backend: str, version: str):
        folder = root / system / family / backend / version
        if folder not in folders:
            folders[folder] = _read_folder(folder, system)
        return folders[folder]

    def pairs(system: str, backend: str):
        def of(family: str, version: str, db) -> frozenset:
            folder = root / system / family / backend / version
            if folder not in folder_pairs:
                folder_pairs[folder] = _pairs(db)
            return folder_pairs[folder]
        return of

    def at_most(system: str, backend: str):
        def of(family: str, version: str) -> frozenset | None:
            folder = root / system / family / backend / version
            if folder not in folder_bounds:
                folder_bounds[folder] = _pairs_at_most(folder)
            return folder_bounds[folder]
        return of

    def evidence_for(system: str, backend: str, version: str) -> DeploymentEvidence:
        key = (system, backend, version)
        if key not in cache:
            available = family_versions(root, system, backend)
            if ANCHOR_FAMILY not in available:
                cache[key] = no_tables(system, backend, "none at all" if not available else
                                       f"tables of {', '.join(sorted(available))} but no "
                                       f"{ANCHOR_FAMILY}, which every deployment needs")
                return cache[key]
            selection = _selection(available, version,
                                   lambda f, v: read(system, f, backend, v), versions,
                                   pairs(system, backend), at_most(system, backend))
            if not selection:
                cache[key] = no_tables(system, backend,
                                       f"no readable {ANCHOR_FAMILY} version")
                return cache[key]
            if (backend, selection) not in tables:
                tables[(backend, selection)] = _measured(
                    _import(root, system, backend, selection,
                            lambda f, v: read(system, f, backend, v)),
                    system, backend, policy, graph_max_tokens(backend))
            cache[key] = _deployment(tables[(backend, selection)], system, backend, version,
                                     selection)
        return cache[key]

    return evidence_for


def _read_folder(folder: Path, system: str):
    """One family/version folder imported (None: no supported tables)."""
    from perfcast.evidence.importers.aiconfigurator import import_system
    from perfcast.hardware import load_system

    try:
        return import_system(folder, hardware=load_system(system).name)
    except ConfigError:
        return None   # a family without supported tables (e.g. encoder attention)


def _pairs_at_most(folder: Path) -> frozenset | None:
    """A superset of the (operation, dtype) pairs of `_read_folder(folder)`, read from
    those two columns alone (None: unknown without the full import)."""
    from perfcast.evidence.importers.aiconfigurator import pairs_at_most

    return pairs_at_most(folder)


def _pairs(db) -> frozenset:
    """The (operation, dtype) pairs of a database's rows."""
    groups = db.table.group_by(["operation", "dtype"], use_threads=False).aggregate([])
    return frozenset(zip(groups.column("operation").to_pylist(),
                         groups.column("dtype").to_pylist()))


def _selection(available: dict[str, list[str]], version: str, read,
               policy: str = "set", pairs_of=None, pairs_at_most=None) -> tuple:
    """((family, version, pairs), ...): each family at its version under `policy` (pairs
    None: every row), then, nearest first, other versions for the (operation, dtype)
    pairs not yet covered. `pairs_of(family, version, database)`: the (operation,
    dtype) pairs of `read(family, version)` (default: `_pairs` of it).
    `pairs_at_most(family, version)`: a superset of those pairs (None: unknown), read
    without the full import; a version whose superset adds nothing to what is covered
    is passed over unread (it could add nothing either way)."""
    anchor = nearest_version(version, available[ANCHOR_FAMILY])
    out = []
    for family, versions in sorted(available.items()):
        covered = None
        order = nearest_first(version, versions)
        if policy == "set" and anchor in order:
            order.remove(anchor)
            order.insert(0, anchor)
        for v in order:
            if covered is not None and pairs_at_most is not None:
                bound = pairs_at_most(family, v)
                if bound is not None and not bound - covered:
                    continue
            part = read(family, v)
            if part is None:
                continue
            pairs = pairs_of(family, v, part) if pairs_of else _pairs(part)
            if covered is None:
                out.append((family, v, None))
                covered = set(pairs)
            elif pairs - covered:
                out.append((family, v, frozenset(pairs - covered)))
                covered |= pairs
    anchored = any(f == ANCHOR_FAMILY for f, _, pairs in out)
    return tuple(out) if anchored else ()


def _version_note(backend: str, version: str, selection: tuple) -> str:
    """Which collected versions answer a deployment of `backend` `version`: the GEMM
    family's, every family read at another one, and the data types read elsewhere."""
    anchor = next(v for f, v, pairs in selection if f == ANCHOR_FAMILY and pairs is None)
    others: dict[str, list[str]] = {}
    for family, v, pairs in selection:
        if pairs is not None:
            others.setdefault(v, []).extend(sorted(f"{op} {dtype}" for op, dtype in pairs))
        elif v != anchor:
            others.setdefault(v, []).append(family)
    if anchor == version and not others:
        return ""
    extra = "; ".join(f"{', '.join(fams)} at {v}" for v, fams in sorted(others.items()))
    return (f"evidence collected with {backend} {anchor}" + (f" ({extra})" if extra else "")
            + f" used for {backend} {version or '(version not given)'}")


def _import(root: Path, system: str, backend: str, selection: tuple, read) -> tuple:
    """The selected tables: (database, collected version per operation and per
    `operation@dtype` read elsewhere, GEMM harness correction)."""
    import pyarrow.compute as pc

    from perfcast.evidence.database import PerformanceDatabase
    from perfcast.evidence.harness_overhead import fit_call_overheads
    from perfcast.evidence.importers.aiconfigurator import import_system
    from perfcast.hardware import load_system

    sys_obj = load_system(system)
    parts, op_versions, correction = [], {}, None
    for family, version, pairs in selection:
        part = read(family, version)
        if pairs is None:
            parts.append(part)
            for op in set(part.table.column("operation").to_pylist()):
                op_versions.setdefault(op, version)
            if family == ANCHOR_FAMILY:
                correction = fit_call_overheads(
                    part.table, sys_obj, source_revision=f"{family}/{backend}/{version}")
            continue
        table = part.table
        keep = pc.is_in(pc.binary_join_element_wise(table["operation"], table["dtype"], "@"),
                        value_set=_string_array(f"{op}@{dtype}" for op, dtype in pairs))
        parts.append(PerformanceDatabase(table.filter(keep), name=part.name,
                                         sources=part.sources, _validated=True))
        for op, dtype in pairs:
            op_versions[f"{op}@{dtype}"] = version
    library = communication_library(root / system)
    if library is not None:
        parts.append(import_system(library, hardware=sys_obj.name))
    versions = "+".join(sorted({v for _, v, _ in selection}, key=version_key))
    db = PerformanceDatabase.concat(parts, name=f"aiconfigurator:{system}/{backend}/{versions}")
    return db, op_versions, correction


def _string_array(values):
    import pyarrow as pa

    return pa.array(sorted(values), type=pa.string())


def _measured(imported: tuple, system: str, backend: str, policy: str,
              graph_tokens: int) -> tuple | None:
    """Providers (each behind `MeasuredView`, with the GEMM table's harness correction)
    and the base context of imported tables, shared by every deployment version that
    reads the same tables."""
    from perfcast.evidence.factory import measured_providers
    from perfcast.hardware import load_system

    db, op_versions, correction = imported
    if db is None:
        return None
    sys_obj = load_system(system)
    kernels = implementations(db)
    context = CostQueryContext(
        runtime=backend, implementations=FrozenDict(kernels),
        operation_dimensions=FrozenDict({op: FrozenDict(d) for op, d in
                                         operation_selectors(db, kernels).items()}))
    providers = tuple(measured_providers([db], sys_obj, policy, harness=correction,
                                         graph_max_tokens=graph_tokens))
    return providers, context, op_versions, held_kernels(db), {}


def _deployment(measured: tuple | None, system: str, backend: str, version: str,
                selection: tuple) -> DeploymentEvidence:
    """The shared providers asked for what `backend` `version` runs (`EngineKernelView`).
    Versions that the same dispatch rule set covers share one set of views (so their
    step-cost caches are shared too)."""
    from perfcast.evidence.engine_kernels import EngineKernelView
    from perfcast.evidence.kernel_dispatch import dispatch_rules
    from perfcast.hardware import load_system

    if measured is None:
        return EMPTY
    providers, context, op_versions, held, views_cache = measured
    anchor = next(v for f, v, pairs in selection if f == ANCHOR_FAMILY and pairs is None)
    dispatch = dispatch_rules(backend)
    rule_set = dispatch.rule_set(version) if dispatch else None
    key = None if dispatch is None else (rule_set.name if rule_set else f"uncovered {version}")
    if key not in views_cache:
        sys_obj = load_system(system)
        views = tuple(EngineKernelView(p, system=sys_obj, engine_version=version,
                                       family_versions=op_versions, held=held,
                                       dispatch=dispatch)
                      for p in providers)
        views_cache[key] = (views, replace(context, runtime_revision=anchor))
    views, ctx = views_cache[key]
    return DeploymentEvidence(views, ctx, anchor, _version_note(backend, version, selection),
                              FrozenDict(op_versions))


COMMUNICATION_LIBRARY = ("comm", "nccl")


def communication_library(system_dir: Path) -> Path | None:
    """The newest collected NCCL folder (`comm/nccl/<version>`): the collectives a
    runtime issues outside its own custom all-reduce (all-gather, reduce-scatter,
    all-to-all, large all-reduces) run on NCCL whatever the serving runtime."""
    folder = system_dir.joinpath(*COMMUNICATION_LIBRARY)
    if not folder.is_dir():
        return None
    versions = [p.name for p in folder.iterdir() if p.is_dir()]
    return folder / max(versions, key=version_key) if versions else None


def _implementation_counts(db):
    """Rows per (operation, dtype, implementation) of a database (empty: no such column)."""
    import collections

    table = db.table
    if "sel.str.implementation" not in table.column_names:
        return collections.Counter()
    keys = ["operation", "dtype", "sel.str.implementation"]
    groups = table.group_by(keys, use_threads=False).aggregate([([], "count_all")])
    return collections.Counter(dict(zip(zip(*(groups.column(k).to_pylist() for k in keys)),
                                        groups.column("count_all").to_pylist())))


def implementations(db) -> dict[str, str]:
    """Per operation and per (operation, dtype) (key `operation@dtype`), the kernel
    implementation with the most measured rows: a runtime runs one kernel per operation
    and data type (vLLM 0.24: Triton experts for bf16, FlashInfer CUTLASS for fp8, the
    OAI Triton kernel for mxfp4), so one choice per operation would leave every other
    dtype's tables unmatched. The providers refine the GEMM choice per query by the
    engine's dispatch rules (`evidence.engine_kernels`)."""
    import collections

    best: dict[str, tuple[int, str]] = {}
    per_op: collections.Counter = collections.Counter()
    for (op, dtype, impl), n in _implementation_counts(db).items():
        if impl:
            per_op[(op, impl)] += n
            key = f"{op}@{dtype}"
            if key not in best or (n, impl) > best[key]:
                best[key] = (n, impl)
    for (op, impl), n in per_op.items():
        if op not in best or (n, impl) > best[op]:
            best[op] = (n, impl)
    return {key: impl for key, (n, impl) in sorted(best.items())}


def held_kernels(db) -> dict[str, tuple[str, ...]]:
    """Per `operation@dtype`, the kernel implementations the tables hold, most rows first."""
    out: dict[str, list[tuple[int, str]]] = {}
    for (op, dtype, impl), n in _implementation_counts(db).items():
        if impl:
            out.setdefault(f"{op}@{dtype}", []).append((n, impl))
    # the same order `implementations` ranks by: most rows, ties to the larger name
    return {key: tuple(impl for n, impl in sorted(v, reverse=True))
            for key, v in sorted(out.items())}


CONTEXT_SELECTORS = ("sel.str.implementation", "sel.str.runtime", "sel.str.runtime_revision")


def operation_selectors(db, kernels: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Per operation, string selectors the records require beyond the shape and the
    runtime context and that take one value only among the rows of the kernels
    `implementations` chooses (`kernels`: its result when the caller has it; e.g. the
    all-reduce `backend`: `vllm_graph`), so
    the deployment's queries state what its runtime runs. Selectors with several
    values (a phase, a KV dtype, a routing distribution) are shape facts the query must
    state itself; they are never filled in here."""
    import collections

    table = db.table
    # vLLM's all-reduce table holds its CUDA-graph and eager kernels, each with its own
    # `backend` value: only the rows of the chosen kernels count
    chosen = collections.defaultdict(set)
    for key, impl in (implementations(db) if kernels is None else kernels).items():
        chosen[key.split("@", 1)[0]].add(impl)
    has_impl = "sel.str.implementation" in table.column_names
    out: dict[str, dict[str, str]] = {}
    for name in table.column_names:
        if not name.startswith("sel.str.") or name in CONTEXT_SELECTORS:
            continue
        # the distinct (operation, implementation, value) triples of the rows
        keys = ["operation", "sel.str.implementation", name] if has_impl else ["operation", name]
        groups = table.group_by(keys, use_threads=False).aggregate([])
        ops = groups.column("operation").to_pylist()
        impls = groups.column(keys[1]).to_pylist() if has_impl else [None] * len(ops)
        values: dict[str, set] = collections.defaultdict(set)
        for op, impl, v in zip(ops, impls, groups.column(name).to_pylist()):
            if v and (impl is None or not chosen[op] or impl in chosen[op]):
                values[op].add(v)
        for op, vs in values.items():
            if len(vs) == 1:
                out.setdefault(op, {})[name[len("sel.str."):]] = next(iter(vs))
    return out
