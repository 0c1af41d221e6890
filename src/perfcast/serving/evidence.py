"""Measured evidence for serving runs: AIConfigurator-layout folders -> providers.

`evidence_loader(root)` returns `evidence_for(system, backend, version)` that imports
`root/<system>/<family>/<backend>/<version>/*.parquet` once per (system, backend,
version) through the evidence layer's AIConfigurator importer and hands the providers
to the resolver ahead of the analytic models. Which collected version serves a row's
version is `nearest_version`: the collected version nearest in release numbers, ties to
the newest not newer than the row's, else the oldest newer one (recorded as an
assumption by the caller).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostQueryContext
from perfcast.evidence.measured_view import MeasuredView


def version_key(text: str) -> tuple:
    """Orderable key of a version string: 1.2.0rc5 < 1.2.0 < 1.2.0.post1."""
    parts = re.findall(r"\d+|[a-z]+", text.lower())
    key: list[tuple[int, int | str]] = []
    for p in parts:
        if p.isdigit():
            key.append((2, int(p)))
        elif p in ("rc", "a", "b", "dev"):
            key.append((0, p))
        else:  # post, ...
            key.append((3, p))
    key.append((1, 0))
    return tuple(key)


def release_numbers(text: str) -> tuple[int, ...]:
    """The leading numeric release components (major, minor, patch) of a version."""
    nums = re.match(r"\d+(?:\.\d+)*", text)
    parts = tuple(int(p) for p in nums.group(0).split(".")) if nums else ()
    return (parts + (0, 0, 0))[:3]


def release_distance(a: str, b: str) -> tuple[int, ...]:
    """How far apart two releases are, compared component by component (major first):
    0.18 is one minor release from 0.19 and four from 0.14; 1.3.0rc1 is in the same
    release series as 1.3.0rc10 (distance 0) and one minor release from 1.2.0rc5."""
    return tuple(abs(x - y) for x, y in zip(release_numbers(a), release_numbers(b)))


def nearest_version(wanted: str, available: list[str]) -> str | None:
    """The collected version closest in release numbers to `wanted` (kernels, their
    selection and defaults change release by release, so the nearest release measures
    what the row ran most closely); ties go to the newest not newer than `wanted`, then
    the oldest newer. No version given: the newest collected."""
    if not available:
        return None
    if wanted in available:
        return wanted
    if not wanted:
        return max(available, key=version_key)
    best = min(release_distance(wanted, v) for v in available)
    tied = [v for v in available if release_distance(wanted, v) == best]
    older = [v for v in tied if version_key(v) <= version_key(wanted)]
    if older:
        return max(older, key=version_key)
    return min(tied, key=version_key)


ANCHOR_FAMILY = "gemm"  # a collected version counts only if it measured GEMMs


def collected_versions(root: Path, system: str, backend: str) -> list[str]:
    """Versions of `backend` with GEMM tables (a version that only measured, say, one
    exotic kernel family cannot cost a deployment)."""
    base = root / system
    versions: set[str] = set()
    folders = [base / ANCHOR_FAMILY] if (base / ANCHOR_FAMILY).is_dir() else \
        (list(base.iterdir()) if base.is_dir() else [])
    for family in folders:
        folder = family / backend
        if folder.is_dir():
            versions.update(p.name for p in folder.iterdir() if p.is_dir())
    return sorted(versions, key=version_key)


@dataclass(frozen=True)
class DeploymentEvidence:
    """Measured providers for one (system, backend, collected version), and the query
    context that selects them: runtime, the collected version and, per operation, the
    kernel implementation the tables were measured with."""

    providers: tuple
    context: CostQueryContext
    version: str
    note: str = ""


EMPTY = DeploymentEvidence((), CostQueryContext(), "")


def evidence_loader(root: Path, *, policy: str = "interpolate"
                    ) -> Callable[[str, str, str], DeploymentEvidence]:
    """`evidence_for(system, backend, version)` over an AIConfigurator-layout folder."""
    if not root.is_dir():
        raise ConfigError("is not a folder", source=str(root), field="--evidence-root",
                          expected="a folder laid out as <system>/<family>/<framework>/<version>")
    cache: dict[tuple[str, str, str], DeploymentEvidence] = {}

    def evidence_for(system: str, backend: str, version: str) -> DeploymentEvidence:
        chosen = nearest_version(version, collected_versions(root, system, backend))
        if chosen is None:
            return EMPTY
        key = (system, backend, chosen)
        if key not in cache:
            cache[key] = _import(root, system, backend, chosen, policy)
        ev = cache[key]
        if chosen != version:
            note = (f"evidence collected with {backend} {chosen} used for "
                    f"{backend} {version or '(version not given)'}")
            ev = replace(ev, note=note)
        return ev

    return evidence_for


def _import(root: Path, system: str, backend: str, version: str,
            policy: str) -> DeploymentEvidence:
    from perfcast.evidence.chain import evidence_providers
    from perfcast.evidence.database import PerformanceDatabase
    from perfcast.evidence.importers.aiconfigurator import import_system
    from perfcast.evidence.measured_view import gemm_fixed_costs
    from perfcast.hardware import load_system

    sys_obj = load_system(system)
    parts = []
    for family in sorted((root / system).iterdir()):
        folder = family / backend / version
        if not folder.is_dir():
            continue
        try:
            parts.append(import_system(folder, hardware=sys_obj.name))
        except ConfigError:
            continue  # a family without supported tables (e.g. encoder attention)
    if not parts:
        return EMPTY
    library = communication_library(root / system)
    if library is not None:
        parts.append(import_system(library, hardware=sys_obj.name))
    db = PerformanceDatabase.concat(parts, name=f"aiconfigurator:{system}/{backend}/{version}")
    kernels = implementations(db)
    context = CostQueryContext(
        runtime=backend, runtime_revision=version,
        implementations=FrozenDict(kernels),
        operation_dimensions=FrozenDict({op: FrozenDict(d) for op, d in
                                         operation_selectors(db, kernels).items()}))
    excess = harness_gemm_excess(backend, gemm_fixed_costs(db.table))
    providers = tuple(MeasuredView(p, excess, sys_obj.device.memory.bw_bytes_per_s)
                      for p in evidence_providers([db], sys_obj, policy))
    return DeploymentEvidence(providers, context, version)


# Where AIConfigurator's GEMM collector times a quantised GEMM differently from how a
# deployment runs it: (runtime, table dtype) -> (reference dtype of the same table whose
# per-call fixed cost the deployment's call matches, share of the excess fixed cost the
# deployment does not run, why).
HARNESS_GEMM_FIXED_COST = {
    ("trtllm", "fp8"): (
        "bf16", 0.5,
        "AIConfigurator's collector/trtllm/collect_gemm.py loads per-tensor fp8 weights "
        "without an input_scale, so TRT-LLM's FP8QDQLinearMethod quantises activations "
        "dynamically: a scale-reduction kernel, then a quantise kernel, then the GEMM. FP8 "
        "checkpoints carry static input scales (one quantise kernel), so one of the two "
        "extra kernels, half the table's fixed cost above the bf16 GEMM's, is not run"),
    ("vllm", "fp8_block"): (
        "fp8", 1.0,
        "AIConfigurator's collector/vllm/collect_gemm.py times fp8_block GEMMs without a "
        "CUDA graph (use_cuda_graph=False) and per-tensor fp8 with one; both paths are a "
        "quantise kernel plus a GEMM, so the block path's fixed cost above the per-tensor "
        "one is host launch time, which vLLM's CUDA-graph (piecewise) steps do not pay"),
}


def harness_gemm_excess(backend: str, fixed: dict[str, float]) -> dict[str, tuple[float, str]]:
    """Per GEMM table dtype, the fixed cost (s) per call a deployment does not run, and
    why (`HARNESS_GEMM_FIXED_COST`), from the tables' own fitted fixed costs."""
    out = {}
    for (runtime, dtype), (reference, share, why) in HARNESS_GEMM_FIXED_COST.items():
        if runtime == backend and dtype in fixed and reference in fixed:
            excess = share * (fixed[dtype] - fixed[reference])
            if excess > 0.0:
                out[dtype] = (excess, why)
    return out


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


def implementations(db) -> dict[str, str]:
    """Per operation and per (operation, dtype) (key `operation@dtype`), the kernel
    implementation with the most measured rows: a runtime runs one kernel per operation
    and data type (vLLM 0.24: Triton experts for bf16, FlashInfer CUTLASS for fp8, the
    OAI Triton kernel for mxfp4), so one choice per operation would leave every other
    dtype's tables unmatched."""
    import collections

    table = db.table
    if "sel.str.implementation" not in table.column_names:
        return {}
    counts = collections.Counter(zip(table.column("operation").to_pylist(),
                                     table.column("dtype").to_pylist(),
                                     table.column("sel.str.implementation").to_pylist()))
    best: dict[str, tuple[int, str]] = {}
    per_op: collections.Counter = collections.Counter()
    for (op, dtype, impl), n in counts.items():
        if impl:
            per_op[(op, impl)] += n
            key = f"{op}@{dtype}"
            if key not in best or (n, impl) > best[key]:
                best[key] = (n, impl)
    for (op, impl), n in per_op.items():
        if op not in best or (n, impl) > best[op]:
            best[op] = (n, impl)
    return {key: impl for key, (n, impl) in sorted(best.items())}


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
    ops = table.column("operation").to_pylist()
    # vLLM's all-reduce table holds its CUDA-graph and eager kernels, each with its own
    # `backend` value: only the rows of the chosen kernels count
    chosen = collections.defaultdict(set)
    for key, impl in (implementations(db) if kernels is None else kernels).items():
        chosen[key.split("@", 1)[0]].add(impl)
    impls = (table.column("sel.str.implementation").to_pylist()
             if "sel.str.implementation" in table.column_names else [None] * len(ops))
    out: dict[str, dict[str, str]] = {}
    for name in table.column_names:
        if not name.startswith("sel.str.") or name in CONTEXT_SELECTORS:
            continue
        values: dict[str, set] = collections.defaultdict(set)
        for op, impl, v in zip(ops, impls, table.column(name).to_pylist()):
            if v and (impl is None or not chosen[op] or impl in chosen[op]):
                values[op].add(v)
        for op, vs in values.items():
            if len(vs) == 1:
                out.setdefault(op, {})[name[len("sel.str."):]] = next(iter(vs))
    return out
