"""What `perfcast estimate` answers from: measured evidence (`--evidence`), a profiling
database (`--profiling-database`), calibrated and physics-only analytic models; one
resolver per performance model (`evidence.factory.build_resolver`, as every command
builds it), and the checks that keep it honest.

* Evidence of one device never answers another silently: a profiling database whose
  `device` (op_mapping.yaml) or an evidence snapshot whose systems differ from the
  estimate's device stops the run, naming both; `--allow-foreign-evidence` uses it
  anyway and every such answer says so (`validity.measured_on`, an assumption).
* A profiling database's software stack (`version`, `cann_version`, `pytorch_version`)
  is shown and compared with `--runtime-version`; a difference, or a field the estimate
  takes over unchecked, is a stated assumption (`evidence.profiling.stack`).
* `--evidence` with the profiling model: one resolver asks the profiling database, then
  the evidence, then the analytic models; `analytic profiling` together with
  `--evidence` is refused (the "analytic" run would answer from the evidence).
* After the run: how many ops each provider answered, and why the evidence answered
  none when it did (what it was asked, what it holds).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from perfcast.core.errors import ConfigError

FOREIGN_HINT = "--allow-foreign-evidence to use it anyway (every answer then says so)"


@dataclass
class EvidenceLayer:
    """The measured providers of `--evidence` and what they were built from."""

    providers: list = field(default_factory=list)
    databases: list = field(default_factory=list)
    sources: list[dict] = field(default_factory=list)

    @property
    def names(self) -> set[str]:
        return {p.name for p in self.providers}


def check_combination(models: list[str], evidence: list[str]) -> None:
    if evidence and "analytic" in models and "profiling" in models:
        raise ConfigError("with --evidence, the 'analytic' model would answer from the "
                          "evidence", field="--performance-model",
                          expected="--performance-model profiling --evidence ... (profiling "
                                   "database, then the evidence, then the analytic models), "
                                   "or analytic without --evidence")


def evidence_layer(system, refs: list[str], policy: str, store: Path | None,
                   allow_foreign: bool) -> EvidenceLayer:
    """Measured providers (read through `MeasuredView`, as serving reads them) of each
    `--evidence` source, checked against the estimate's system."""
    layer = EvidenceLayer()
    if not refs:   # no evidence: none of the database machinery is imported
        return layer
    from perfcast.evidence.factory import measured_providers
    from perfcast.evidence.foreign import ForeignEvidence
    from perfcast.evidence.profiling.devices import same_device
    from perfcast.evidence.store import EvidenceStore, open_evidence

    layer.databases = [open_evidence(r, hardware=system.name, store=EvidenceStore(store))
                       for r in refs]
    foreign: dict[int, str] = {}
    for ref, db in zip(refs, layer.databases):
        held = sorted({core[2] for core in db.catalog.schemas})
        source = {"ref": ref, "digest": db.digest, "records": len(db), "hardware": held}
        if held and not any(same_device(h, system.name) for h in held):
            if not allow_foreign:
                raise ConfigError(f"holds measurements of {', '.join(held)}, but the estimate "
                                  f"is for {system.name}", source=ref, field="--evidence",
                                  expected=f"evidence measured on {system.name}, or "
                                           + FOREIGN_HINT)
            if len(held) > 1:
                raise ConfigError(f"holds measurements of {', '.join(held)}; none is "
                                  f"{system.name} and no single one can stand in for it",
                                  source=ref, field="--evidence",
                                  expected=f"evidence of one system, or of {system.name}")
            foreign[db.digest] = source["foreign_measured_on"] = held[0]
        layer.sources.append(source)

    def wrap(p):
        db = getattr(p, "database", None)
        measured_on = foreign.get(db.digest) if db is not None else None
        return ForeignEvidence(p, measured_on, system.name) if measured_on else p

    layer.providers = measured_providers(layer.databases, system, policy, wrap=wrap)
    return layer


def profiling_provider(request, system, database: Path, interpolate: bool,
                       allow_foreign: bool, calibrated: list):
    """(EmpiricalPerformanceModel, source description) of `--profiling-database`, checked
    against the estimate's system. Its M5 weight comes from the analytic models."""
    from perfcast.evidence.factory import build_resolver
    from perfcast.evidence.profiling.empirical import EmpiricalPerformanceModel
    from perfcast.evidence.profiling.interpolating_data_source import InterpolatingDataSource
    from perfcast.evidence.profiling.devices import same_device
    from perfcast.evidence.profiling.op_mapping import MAPPING_FILE
    from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
    from perfcast.evidence.profiling.stack import stack_compatibility

    source = ProfilingDataSource(database, system, request.plan)
    mapping = source.mapping
    declared = mapping.device
    foreign = None
    if not same_device(declared, system.name):
        if not allow_foreign:
            what = (f"was measured on {declared}, but the estimate is for {system.name}"
                    if declared else f"declares no device, so its kernel times cannot be "
                                     f"attributed to {system.name}")
            raise ConfigError(what, source=str(Path(database) / MAPPING_FILE), field="device",
                              expected=f"a database of {system.name} (device: {system.name}), "
                                       "or " + FOREIGN_HINT)
        foreign = declared
        source = ProfilingDataSource(database, system, request.plan, lookup_device=declared)
    if interpolate:
        source = InterpolatingDataSource(source)
    analytic = build_resolver(system, list(calibrated), roofline_mode=request.roofline_mode)
    provider = EmpiricalPerformanceModel(system, source, fallback_model=analytic,
                                         foreign_device=foreign)
    info = {"path": str(database), "device": declared or None,
            "identity": source.identity[:23], "interpolate": interpolate,
            **stack_compatibility(mapping, system.name,
                                  request.context.runtime_revision)}
    if foreign is not None:
        info["foreign_measured_on"] = declared or "undeclared"
    return provider, info


def model_resolver(name: str, request, system, layer: EvidenceLayer, calibrated: list,
                   profiling=None):
    """The resolver of one performance model (None: the default analytic one)."""
    from perfcast.evidence.factory import build_resolver

    first = [profiling] if name == "profiling" else []
    chain = [*first, *layer.providers, *calibrated]
    if not chain:
        return None
    return build_resolver(system, chain, roofline_mode=request.roofline_mode)


def provider_counts(result) -> dict[str, int]:
    """Ops (tasks) answered per provider, most first."""
    counts = Counter(ct.resolution.estimate.provider for ct in result.costed.tasks)
    return dict(counts.most_common())


def evidence_silence(result, layer: EvidenceLayer, context) -> str | None:
    """Why `--evidence` answered no op (None when it answered some)."""
    if not layer.providers:
        return None
    names = layer.names
    if any(ct.resolution.estimate.provider in names for ct in result.costed.tasks):
        return None
    reasons = Counter(a.reason for ct in result.costed.tasks for a in ct.resolution.attempts
                      if a.provider in names and a.outcome.value == "miss")
    asked = ", ".join(f"{k} {v!r}" for k, v in (
        ("runtime", context.runtime), ("version", context.runtime_revision),
        ("implementation", context.implementation)) if v) or "no runtime, version or " \
        "implementation"
    text = (f"the evidence answered none of the {len(result.costed.tasks)} ops (asked: "
            f"{asked})")
    if reasons:
        text += "; misses: " + "; ".join(f"{r} (x{n})" for r, n in reasons.most_common(3))
    held = held_context(layer.databases)
    if held:
        text += "; the evidence holds " + "; ".join(f"{k}: {', '.join(v)}"
                                                    for k, v in held.items())
    return text


def held_context(databases) -> dict[str, list[str]]:
    """Runtimes, versions and implementations the databases' records hold."""
    out: dict[str, set] = {}
    for label, key in (("runtimes", "runtime"), ("versions", "runtime_revision"),
                       ("implementations", "implementation")):
        for db in databases:
            out.setdefault(label, set()).update(db.catalog.str_values.get(f"sel.str.{key}", ()))
    return {k: sorted(v) for k, v in out.items() if v}


AUTO = "auto"


def engine_evidence(system, refs: list[str], context, policy: str, store: Path | None,
                    allow_foreign: bool):
    """`--implementation auto`: the evidence asked as the `--runtime` engine runs it, the
    way `serve` asks it. Returns (layer, context, note).

    * One `--evidence` AIConfigurator layout (its root or its `<system>` folder): the
      deployment loader `serve`, `search` and `validate` read (`serving.evidence`):
      every family at the collected version `serve` picks for `--runtime-version`, the
      kernel the runtime's dispatch rules pick per query, the tables' corrections
      (harness fixed cost under the engine's CUDA graphs among them) and the query
      context (kernels, selectors); the same answers as `serve` task by task.
    * Other sources (snapshots, saved databases): each operation at the collected
      version nearest `--runtime-version`, the kernel by the dispatch rules, the most
      measured kernel per operation and dtype where no rule applies, and the GEMM
      harness correction fitted on the chosen version's GEMM rows."""
    if not context.runtime:
        raise ConfigError("--implementation auto needs the runtime whose dispatch rules "
                          "choose the kernels", field="--runtime",
                          expected="vllm | sglang | trtllm ...")
    if not refs:
        raise ConfigError("--implementation auto chooses among measured kernels",
                          field="--evidence", expected="at least one --evidence source")
    from perfcast.evidence.deployment import layout_root

    root = layout_root(Path(refs[0]), system.name) if len(refs) == 1 else None
    if root is None:
        layer = evidence_layer(system, refs, policy, store, allow_foreign)
        return (*_engine_kernels(layer, context, system), "")
    return _deployment_evidence(root, refs[0], system, context, policy)


def _deployment_evidence(root: Path, ref: str, system, context, policy: str):
    from dataclasses import replace

    from perfcast.serving.evidence import evidence_loader

    ev = evidence_loader(root, policy=policy)(system.name, context.runtime,
                                              context.runtime_revision)
    if not ev.providers:
        raise ConfigError(f"holds no {context.runtime} GEMM tables of {system.name}",
                          source=ref, field="--evidence",
                          expected=f"<system>/gemm/{context.runtime}/<version>/ tables")
    # flags stated on the command line refine the deployment's context
    new_context = replace(
        ev.context, implementation=context.implementation or ev.context.implementation,
        implementations=ev.context.implementations.replace(**dict(context.implementations)),
        operation_dimensions=ev.context.operation_dimensions.replace(
            **dict(context.operation_dimensions)))
    source = {"ref": ref, "layout": "aiconfigurator", "runtime": context.runtime,
              "runtime_version": context.runtime_revision or None,
              "collected_version": ev.version, "family_versions": dict(ev.family_versions),
              "hardware": [system.name]}
    return (EvidenceLayer(providers=list(ev.providers), sources=[source]), new_context,
            ev.note)


def _engine_kernels(layer: EvidenceLayer, context, system):
    """(layer, context) of `engine_evidence` for snapshots and saved databases."""
    from dataclasses import replace

    from perfcast.core.frozen import FrozenDict
    from perfcast.evidence.database import PerformanceDatabase
    from perfcast.evidence.deployment import held_kernels, implementations
    from perfcast.evidence.versions import nearest_version
    from perfcast.evidence.engine_kernels import EngineKernelView
    from perfcast.evidence.kernel_dispatch import dispatch_rules
    from perfcast.evidence.measured_view import MeasuredView
    from perfcast.serving.evidence import cuda_graph_tokens

    db = PerformanceDatabase.concat(layer.databases, name="estimate evidence") \
        if len(layer.databases) > 1 else layer.databases[0]
    versions = _versions_per_operation(db, context.runtime)
    family_versions = {op: nearest_version(context.runtime_revision, vs)
                       for op, vs in versions.items()}
    held = held_kernels(db)
    harness = _gemm_harness(db, system, context.runtime, family_versions.get("gemm"))
    graphs = cuda_graph_tokens(context.runtime)
    views = [EngineKernelView(MeasuredView(p.inner, peak_memory_bw=system.device.memory
                                           .bw_bytes_per_s, harness=harness,
                                           graph_max_tokens=graphs),
                              system=system, engine_version=context.runtime_revision,
                              family_versions=family_versions, held=held,
                              dispatch=dispatch_rules(context.runtime))
             for p in layer.providers]
    new_context = replace(context, implementation="",
                          implementations=FrozenDict({**implementations(db),
                                                      **dict(context.implementations)}))
    return replace(layer, providers=views), new_context


def _gemm_harness(db, system, runtime: str, version: str | None):
    """The harness correction fitted on the GEMM rows `runtime` collected at `version`."""
    import pyarrow.compute as pc

    from perfcast.evidence.harness_overhead import fit_call_overheads

    table = db.table
    cols = ("sel.str.runtime", "sel.str.runtime_revision")
    if not version or not all(c in table.column_names for c in cols):
        return None
    keep = pc.and_(pc.and_(pc.equal(table["operation"], "gemm"),
                           pc.equal(table[cols[0]], runtime)),
                   pc.equal(table[cols[1]], version))
    rows = table.filter(keep)
    if rows.num_rows == 0:
        return None
    return fit_call_overheads(rows, system, source_revision=f"gemm/{runtime}/{version}")


def _versions_per_operation(db, runtime: str) -> dict[str, list[str]]:
    """Per operation, the runtime revisions of `runtime` the records hold."""
    table = db.table
    cols = ("sel.str.runtime", "sel.str.runtime_revision")
    if not all(c in table.column_names for c in cols):
        return {}
    out: dict[str, set] = {}
    for op, rt, rev in zip(table.column("operation").to_pylist(),
                           *(table.column(c).to_pylist() for c in cols)):
        if rt == runtime and rev:
            out.setdefault(op, set()).add(rev)
    return {op: sorted(v) for op, v in out.items()}
