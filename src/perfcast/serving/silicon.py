"""`perfcast validate silicon`: simulate each measured deployment of a silicon-sample
CSV and compare predicted with measured TTFT and TPOT.

Each row becomes a ServeConfig (model config from a configs folder or the built-in
catalog, layout, precision, backend defaults + harness settings, closed-loop clients).
A row that cannot be modelled keeps an explicit reason (inconsistent layout, unknown
model, unsupported architecture, ...) and no number. How rows are read is data:
`silicon_rules.yaml`; the launch recipes it holds are applied by `silicon_recipes`, and
measurements the hardware cannot produce are screened by `silicon_bounds`.
"""

from __future__ import annotations

import csv
import gc
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from perfcast.core.errors import ConfigError, PerfcastError
from perfcast.hardware import System, load_system
from perfcast.serving.backends import load_backend
from perfcast.serving.deploy import (Pool, ServeConfig, StepModelCache, reserved_memory_facts,
                                     run_serving)
from perfcast.serving.silicon_bounds import (above_compute_bound, above_measured_prefill,
                                             below_memory_bound)
from perfcast.serving.silicon_recipes import (disagg_recipe, graphs_up_to, harness_recipe,
                                              launch_settings)
from perfcast.workload import ModelSpec, ParallelPlan, Precision, load_model_spec
from perfcast.workload.families.traits import has_routed_experts
from perfcast.workload.model_spec import model_spec_from_config
from perfcast.workload.quant import LINEAR_ACTIONS, precision_for_model
from perfcast.workload.stacks import resolve_stack

FP4_DTYPES = ("nvfp4", "mxfp4", "fp4")

REQUIRED = ("id", "backend", "model_path", "system", "mode", "isl", "osl",
            "silicon_ttft_ms", "silicon_tpot_ms")


def load_rules() -> dict:
    path = Path(str(resources.files("perfcast.serving").joinpath("silicon_rules.yaml")))
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# The client settings a `--harness` file may state, with their checks: the benchmark
# client of the file's rows when it is not the harness `silicon_rules.yaml` describes.
HARNESS_CLIENT_KEYS = {
    "prompts_per_concurrency": ("an integer >= 1: requests sent per client",
                                lambda v: isinstance(v, int) and not isinstance(v, bool)
                                and v >= 1),
    "range_ratio": ("a number in (0, 1]: shortest sampled length / the row's isl and osl "
                    "(1: fixed lengths)",
                    lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                    and 0 < v <= 1),
}


def load_harness(path: Path) -> dict:
    """The client settings of a harness file (YAML): `source` (where the description of
    the benchmark client comes from; required) and any of `HARNESS_CLIENT_KEYS`. They
    replace the rules' harness settings for every row of one validation alike."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("does not exist" if not path.exists() else "is not a file",
                          source=str(path), expected="a harness YAML file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", source=str(path)) from None
    if not isinstance(doc, dict):
        raise ConfigError("must be a mapping", source=str(path),
                          expected="source and client settings")
    allowed = ", ".join(["source", *HARNESS_CLIENT_KEYS])
    for key, value in doc.items():
        if key == "source":
            continue
        if key not in HARNESS_CLIENT_KEYS:
            raise ConfigError("unknown setting", source=str(path), field=str(key),
                              expected=allowed)
        what, ok = HARNESS_CLIENT_KEYS[key]
        if not ok(value):
            raise ConfigError(f"bad value {value!r}", source=str(path), field=key,
                              expected=what)
    source = doc.get("source")
    if not isinstance(source, str) or not source.strip():
        raise ConfigError("missing", source=str(path), field="source",
                          expected="where the description of the benchmark client comes from")
    if len(doc) == 1:
        raise ConfigError("states no client setting", source=str(path), expected=allowed)
    return dict(doc)


def rules_with_harness(rules: dict, harness: dict | None) -> dict:
    """`rules` with a harness file's client settings in place of the rules' own."""
    if not harness:
        return rules
    client = {k: v for k, v in harness.items() if k in HARNESS_CLIENT_KEYS}
    return {**rules, "harness": {**rules["harness"], **client}}


def harness_note(harness: dict) -> str:
    """The per-row assumption of a `--harness` file's settings."""
    settings = ", ".join(f"{k} {harness[k]}" for k in HARNESS_CLIENT_KEYS if k in harness)
    return f"benchmark client from the harness file: {settings} ({harness['source']})"


@dataclass
class RowResult:
    row_id: str
    system: str
    model: str
    backend: str
    backend_version: str
    mode: str
    isl: int | None
    osl: int | None
    concurrency: int | None
    measured_ttft_ms: float | None
    measured_tpot_ms: float | None
    pred_ttft_ms: float | None = None
    pred_tpot_ms: float | None = None
    reason: str = ""
    assumptions: list[str] = field(default_factory=list)
    # disagg rows: whether the row records its worker counts and decode batch size
    has_worker_counts: bool | None = None
    # the calibration revision's held-out error band around the prediction
    # (perfcast.calibrate.prediction_error.band_json); agg rows with a revision that has one
    prediction_band: dict | None = None

    @property
    def predicted(self) -> bool:
        return self.pred_ttft_ms is not None and self.pred_tpot_ms is not None


class RowError(Exception):
    """A row cannot be modelled; the message is the reason reported for it."""


def _num(row: dict, key: str, *, required: bool = True) -> float | None:
    text = (row.get(key) or "").strip()
    if not text:
        if required:
            raise RowError(f"field '{key}' is empty")
        return None
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"field '{key}' is not a number ({text!r})") from None
    if not math.isfinite(value):
        raise RowError(f"field '{key}' is not finite")
    return value


def _int(row: dict, key: str, default: int | None = None) -> int:
    value = _num(row, key, required=default is None)
    if value is None:
        return default  # type: ignore[return-value]
    if value != int(value) or value < 0:
        raise RowError(f"field '{key}' is not a non-negative integer ({value})")
    return int(value)


class ModelResolver:
    """model_path -> ModelSpec from a configs folder (`org--name_config.json`) or the
    built-in catalog, trying architecture-identical aliases from the rules."""

    def __init__(self, configs_dir: Path | None, rules: dict) -> None:
        self.dir = configs_dir
        self.aliases = rules.get("model_aliases", {})
        self._cache: dict[str, ModelSpec] = {}

    def candidates(self, name: str) -> list[str]:
        names = [name]
        exact = (self.aliases.get("exact") or {}).get(name)
        if exact:
            names.append(str(exact["base"]))
        for suffix in self.aliases.get("strip_suffixes", []):
            for base in list(names):
                if base.endswith(suffix):
                    names.append(base[: -len(suffix)])
        for base in list(names):
            for old, new in self.aliases.get("prefix_renames", {}).items():
                if base.startswith(old):
                    names.append(new + base[len(old):])
        return list(dict.fromkeys(names))

    def resolve(self, name: str) -> tuple[ModelSpec, str]:
        if name in self._cache:
            return self._cache[name], ""
        for cand in self.candidates(name):
            spec = self._from_dir(cand) or self._from_catalog(cand)
            if spec is not None:
                self._cache[name] = spec
                note = "" if cand == name else f"model config of {cand} used for {name}"
                return spec, note
        raise RowError(f"no config.json for model {name!r} (tried "
                       + ", ".join(self.candidates(name)) + ")")

    def _from_dir(self, name: str) -> ModelSpec | None:
        if self.dir is None:
            return None
        path = self.dir / (name.replace("/", "--", 1) + "_config.json")
        if not path.is_file():
            return None
        import json
        cfg = json.loads(path.read_text(encoding="utf-8"))
        quant = self.dir / (name.replace("/", "--", 1) + "_hf_quant_config.json")
        if quant.is_file() and "quantization_config" not in cfg:
            cfg["quantization_config"] = json.loads(quant.read_text(encoding="utf-8"))
        return model_spec_from_config(cfg, name=name, source=str(path))

    @staticmethod
    def _from_catalog(name: str) -> ModelSpec | None:
        try:
            return load_model_spec(name)
        except ConfigError:
            return None


def _weight_family(dtype: str) -> str:
    return "fp8" if dtype in ("fp8", "fp8_block") else dtype


def _label_action(row: dict, key: str, modes: dict) -> str | None:
    label = (row.get(key) or "").strip()
    if label not in modes:
        raise RowError(f"{key} {label!r} is not modelled (known: {', '.join(modes)})")
    return modes[label]


def _precision(row: dict, model: ModelSpec, system: System, rules: dict
               ) -> tuple[Precision, list[str]]:
    """The precision that ran: the row's labels (`gemm_quant_mode` for linears,
    `moe_quant_mode` for routed experts) describe it, except where they cannot: a label
    whose compute dtype has no matrix units on the device (FP4 on Hopper) falls back to
    the checkpoint's own scheme. A label that names the checkpoint's own scheme keeps
    the checkpoint's details (its unquantised modules). Empty labels: the checkpoint."""
    modes = rules["gemm_quant_modes"]
    notes: list[str] = []
    label = (row.get("precision") or "").strip()
    kv = rules.get("kv_cache_by_precision", {}).get(label)
    engine_default = rules.get("kv_cache_engine_default", {}).get(
        (row.get("backend") or "").strip())
    if engine_default and system.name not in engine_default.get("systems", (system.name,)):
        engine_default = None
    if kv and engine_default:
        # on this system the harness leaves the dtype to the engine, which keeps the
        # model's (a harness recipe may set one, see `row_config`)
        kv = None
        notes.append(f"KV cache in the model's dtype, not fp8 from precision {label}: "
                     f"{engine_default['source']}")
    checkpoint = precision_for_model(model, kv_cache_dtype=kv)
    gemm, moe = _label_action(row, "gemm_quant_mode", modes), _label_action(
        row, "moe_quant_mode", modes) if (row.get("moe_quant_mode") or "").strip() else None
    if gemm is None and moe is None:
        return checkpoint, notes

    def runnable(action: str | None, key: str) -> str | None:
        if action is None:
            return None
        pair = LINEAR_ACTIONS[action]
        compute = pair[1] if pair and pair[1] else (pair[0] if pair else "")
        if compute and compute in FP4_DTYPES and not system.has_matrix_dtype(compute):
            notes.append(f"{key} {row.get(key, '').strip()} needs {compute} matrix units, "
                         f"which {system.name} lacks: the checkpoint's scheme "
                         f"({checkpoint.linear('moe.experts')[0]} experts, "
                         f"{checkpoint.weight} linears) is modelled")
            return "CHECKPOINT"
        return action

    gemm, moe = runnable(gemm, "gemm_quant_mode"), runnable(moe, "moe_quant_mode")
    if gemm in (None, "CHECKPOINT"):
        base = checkpoint
    else:
        labelled = precision_for_model(model, linear_action=gemm, kv_cache_dtype=kv)
        # fp8 and fp8_block name one weight format at two scale granularities; an engine
        # loads an fp8 checkpoint with the scales it has (none re-quantises it)
        same = _weight_family(labelled.weight) == _weight_family(checkpoint.weight) and \
            labelled.linear_activation == checkpoint.linear_activation
        base = checkpoint if same else labelled
        if not same and (model.quant_config or model.raw.get("quantization_config")):
            notes.append(f"row's gemm_quant_mode {row['gemm_quant_mode'].strip()} modelled "
                         f"instead of the checkpoint's {checkpoint.weight} weights")
    if moe not in (None, "CHECKPOINT"):
        pair = LINEAR_ACTIONS[moe]
        act = base.activation
        experts = (act, act) if pair is None else (pair[0], pair[1] or act)
        ckpt = checkpoint.linear("moe.experts")
        if _weight_family(experts[0]) == _weight_family(ckpt[0]) and experts[1] == ckpt[1]:
            experts = ckpt                 # the checkpoint's own scheme: its scales kept
        if base.linear("moe.experts") != experts:
            base = replace(base, linear_overrides=base.linear_overrides.replace(
                **{"moe.experts": experts}))
    notes.append(f"precision from the row's labels: linears {base.weight}, routed experts "
                 f"{base.linear('moe.experts')[0]}, KV cache {base.kv_cache}")
    return base, notes


def scale_up_gpus(system: System, rules: dict) -> int:
    """GPUs one deployment may span: the system's first (scale-up) interconnect tier's
    group, e.g. 8 on an HGX H100 board, 72 in a GB200/GB300 NVL72 rack; the rules'
    `nodes_gpus` when that tier declares no bound."""
    capacity = system.tiers[0].group_capacity if system.tiers else None
    return int(capacity) if capacity else int(rules["harness"].get("nodes_gpus", 8))


def _layout(row: dict, prefix: str = "", *, experts: bool = False) -> tuple[ParallelPlan, int]:
    """(plan, attention-DP size) of the layout fields `<prefix>tp_size`, ... of a row;
    `experts`: the model has routed experts, whose layout fields must then add up."""
    tp = _int(row, f"{prefix}tp_size")
    pp = _int(row, f"{prefix}pp_size", 1)
    adp = _int(row, f"{prefix}attention_dp_size", 1) or 1
    ep = _int(row, f"{prefix}moe_ep_size", 1) or 1
    moe_tp = _int(row, f"{prefix}moe_tp_size", 0)
    if tp < 1 or pp < 1:
        raise RowError(f"{prefix}tp_size and {prefix}pp_size must be >= 1")
    # the expert layout spans the attention layout's GPUs: moe_tp x moe_ep = tp x
    # attention-dp (moe_tp 0 or 1 with moe_ep 1: not given; a dense model's are filler)
    if (ep > 1 or (experts and moe_tp > 1)) and moe_tp * ep not in (0, tp * adp):
        raise RowError(f"inconsistent layout: {prefix}moe_tp {moe_tp} x {prefix}moe_ep {ep} != "
                       f"{prefix}tp {tp} x {prefix}attention-dp {adp}")
    return ParallelPlan(tp=tp, pp=pp, dp=adp, ep=ep, moe_tp=moe_tp if ep > 1 else 0), adp


def _agg_layout(row: dict, rules: dict, node: int, *, experts: bool = False
                ) -> tuple[ParallelPlan, int]:
    tp = _int(row, "tp_size")
    pp = _int(row, "pp_size", 1)
    adp = _int(row, "attention_dp_size", 1) or 1
    gpus = tp * pp * adp
    if tp >= 1 and pp >= 1 and gpus > node:
        raise RowError(f"inconsistent layout: tp {tp} x pp {pp} x attention-dp {adp} = {gpus} "
                       f"GPUs exceeds one {node}-GPU node (scale-up domain) of the system")
    return _layout(row, experts=experts)


def row_config(row: dict, models: ModelResolver, rules: dict,
               overheads: dict | None = None) -> tuple[ServeConfig, list[str]]:
    """The deployment one row describes, plus the assumptions made to build it."""
    notes: list[str] = []
    for key in REQUIRED:
        if key not in row:
            raise RowError(f"column '{key}' is missing")
    model, note = models.resolve(row["model_path"].strip())
    if note:
        notes.append(note)
    try:
        system = load_system(row["system"].strip())
    except ConfigError as exc:
        raise RowError(f"unknown system: {exc}") from None
    name = row["backend"].strip()
    version = (row.get("backend_version") or "").strip()
    bad = rules.get("known_bad_versions", {}).get(name, {})
    if version in bad:
        raise RowError(bad[version])
    isl, osl = _int(row, "isl"), _int(row, "osl")
    if isl < 1 or osl < 1:
        raise RowError("isl and osl must be >= 1")
    precision, quant_notes = _precision(row, model, system, rules)
    notes.extend(quant_notes)
    harness = rules["harness"]
    mode = row["mode"].strip()
    if mode == "agg":
        plan, adp = _agg_layout(row, rules, scale_up_gpus(system, rules),
                                experts=has_routed_experts(model))
        conc = _clients(row, "batch_size", adp, f"attention-DP {adp}")
        pool, decode_pool = Pool(plan), None
    elif mode == "disagg":
        pool, decode_pool, conc, layout_notes = _disagg_layout(
            row, system, rules, experts=has_routed_experts(model))
        notes.extend(layout_notes)
    else:
        raise RowError(f"mode {mode!r} is neither agg nor disagg")
    if conc < 1:
        raise RowError("concurrency is zero")
    lead = decode_pool or pool   # the pool whose steps set TPOT
    try:
        backend = load_backend(name, version, system=system, tp=lead.plan.devices_per_stage,
                               pp=lead.plan.pp)
    except ConfigError as exc:
        raise RowError(str(exc)) from None
    if overheads and name in overheads:
        backend = backend.with_overheads(**overheads[name])
    if backend.version_note:
        notes.append(backend.version_note)
    per_engine = max(1, conc // max(1, lead.workers * lead.plan.dp))
    budget_rule = harness.get("token_budget", {}).get(name)
    label = (row.get("precision") or "").strip()
    # model_recipes are single-node launch scripts of aggregated serving; disagg rows
    # take the multi-node recipe of their deployment (disagg_recipes)
    if mode == "agg":
        recipe = harness_recipe(harness, row["model_path"].strip(), name, system.name,
                                attention_dp=lead.plan.dp > 1, lengths=(isl, osl),
                                tp=lead.plan.tp, precision=label)
    else:
        recipe = disagg_recipe(harness, row["model_path"].strip(), name, system.name,
                               label, (isl, osl), conc, pool, decode_pool)
    sched_changes: dict = {}
    if budget_rule:
        budget = int(budget_rule.get("min", backend.scheduler.token_budget))
        pad = budget_rule.get("concurrency_plus_isl_pad")
        if pad is not None:
            step = int(budget_rule.get("round_to", 1))
            budget = max(budget, -(-(per_engine + isl + int(pad)) // step) * step)
        multiple = recipe.get("token_budget_isl_multiple")
        if multiple:
            budget = int(multiple) * isl
            notes.append(f"token budget {budget} = {multiple} x isl ({recipe['source']})")
        sched_changes["token_budget"] = budget
    kv_dtype = recipe.get("kv_cache_dtype")
    if kv_dtype and kv_dtype != precision.kv_cache:
        # the launch script's KV-cache dtype (e.g. none given: the engine's default)
        precision = replace(precision, kv_cache=precision_for_model(
            model, kv_cache_dtype=kv_dtype).kv_cache)
        notes.append(f"KV cache {precision.kv_cache} as the launch script sets it "
                     f"({recipe['source']})")
    decode_slots = recipe.get("decode_max_batch_size")
    settings = {**recipe.get("scheduler", {}), **recipe.get("kv_cache", {})}
    if decode_slots is not None:
        settings["decode max_batch_size"] = decode_slots
    for section in ("kv_cache", "cuda_graph"):
        for key, value in (recipe.get("decode", {}).get(section) or {}).items():
            settings[f"decode {key}"] = value
    if settings:
        listed = ", ".join(f"{k} {v}" for k, v in settings.items())
        notes.append(f"harness recipe: {listed} ({recipe['source']})")
    harnessed = backend.with_scheduler(**sched_changes)
    backend = launch_settings(harnessed, recipe)
    # disagg: decode workers launched with their own settings run their own engine
    decode_backend = launch_settings(harnessed, recipe["decode"]) if "decode" in recipe else None
    if harness.get("cuda_graph_covers_concurrency"):
        backend = graphs_up_to(backend, per_engine)
        decode_backend = decode_backend and graphs_up_to(decode_backend, per_engine)
    roles = ((("decode", decode_backend or backend, decode_pool), ("prefill", backend, pool))
             if decode_pool else (("", backend, pool),))
    for role, bk, p in roles:
        rule = bk.kv_cache.reserved_memory
        if rule is not None:
            facts = reserved_memory_facts(bk, system, p.plan)
            notes.append(f"{role + ' ' if role else ''}memory fraction {rule.fraction(**facts)}: "
                         f"no launch setting, so {name}'s own rule "
                         f"({bk.version_range or 'backend file'}) holds back "
                         f"{rule.reserved_mib(**facts) / 1024:.1f} of "
                         f"{facts['memory_gib']:.0f} GiB")
    cfg = ServeConfig(model=model, system=system, backend=backend, backend_version=version,
                      precision=precision, mode=mode, pool=pool, decode_pool=decode_pool,
                      decode_max_running_requests=decode_slots, decode_backend=decode_backend,
                      isl=isl, osl=osl, range_ratio=float(harness.get("range_ratio", 1.0)),
                      concurrency=conc,
                      num_requests=int(harness.get("prompts_per_concurrency", 10)) * conc)
    return cfg, notes


WORKER_FIELDS = ("prefill_num_workers", "decode_num_workers", "decode_batch_size")


def _disagg_layout(row: dict, system: System, rules: dict, *, experts: bool = False
                   ) -> tuple[Pool, Pool, int, list[str]]:
    """(prefill pool, decode pool, client concurrency, assumptions) of a disagg row.
    Concurrency = decode_batch_size x decode workers x decode attention-DP (reference
    README); `prefill_batch_size` is an adapter default there, not a measurement, and is
    not read. A row without worker counts cannot be modelled: how many workers of each
    role ran and how many clients were sent are not recorded, and the harness documents
    no default for them."""
    missing = [k for k in WORKER_FIELDS if not (row.get(k) or "").strip()]
    if missing:
        raise RowError(
            f"disagg row lacks worker counts ({', '.join(missing)} empty): the number of "
            "prefill and decode workers and the client concurrency (decode_batch_size x "
            "decode workers x decode attention-DP) are not recorded, and the harness "
            "documents no default for them (reference README)")
    node = scale_up_gpus(system, rules)
    pools, notes = [], []
    for role in ("prefill", "decode"):
        plan, _ = _layout(row, f"{role}_", experts=experts)
        workers = _int(row, f"{role}_num_workers")
        if workers < 1:
            raise RowError(f"{role}_num_workers must be >= 1")
        if plan.num_devices > node:
            tier = system.tier_for_group(plan.num_devices)
            notes.append(f"each {role} worker spans {plan.num_devices} GPUs, more than one "
                         f"{node}-GPU scale-up domain: its collectives across nodes run "
                         f"over {tier.name}")
        pools.append(Pool(plan, workers))
    prefill, decode = pools
    conc = _clients(row, "decode_batch_size", decode.workers * decode.plan.dp,
                    f"{decode.workers} decode workers x decode attention-DP {decode.plan.dp}")
    return prefill, decode, conc, notes


def _clients(row: dict, key: str, ranks: int, ranks_text: str) -> int:
    """Client concurrency C from a per-rank field (`batch_size` = C / attention-DP,
    `decode_batch_size` = C / (decode workers x decode attention-DP)), which may be a
    fraction (4,301 clients on 8 ranks: 537.625): C is the whole number it gives back."""
    per_rank = _num(row, key)
    total = per_rank * ranks
    conc = round(total)
    if per_rank < 0 or abs(total - conc) > 1e-6 * max(1.0, total):
        raise RowError(f"{key} {per_rank:g} x {ranks_text} = {total:g} is not a whole number "
                       "of clients")
    return conc


# cyclic-GC thresholds while rows are simulated (generations 0, 1, 2; CPython's default
# is 700, 10, 10): the rows allocate millions of short-lived objects next to a large
# long-lived heap (evidence indexes, built graphs, costed terms), and each full
# collection walks all of it (~10 % of a run's CPU). Reference counting still frees
# everything acyclic at once; cycles are still collected, less often. No value changes.
LONG_RUN_GC_THRESHOLDS = (100_000, 20, 10)


@contextmanager
def long_run_gc(thresholds: tuple[int, int, int] = LONG_RUN_GC_THRESHOLDS) -> Iterator[None]:
    """Collect cycles less often inside the block (thresholds restored on exit)."""
    old = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def validate_rows(rows: Sequence[dict], *, configs_dir: Path | None = None,
                  evidence_for: Callable[[str, str, str], list] | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  overheads: dict | None = None, statistic: str = "mean",
                  seed: int = 0, cache: StepModelCache | None = None,
                  analytic_for: Callable[[str], Sequence] | None = None,
                  stack: str = "auto", harness: dict | None = None) -> list[RowResult]:
    """Simulate each row. `evidence_for(system, backend, version)` returns the measured
    evidence of a deployment (`serving.evidence.DeploymentEvidence`; None: analytic only).
    `overheads` ({backend: {field: seconds}}) replaces backend overheads (for sweeps).
    `statistic`: which per-request aggregate is compared with the row (mean | p50).
    `seed`: the simulated clients' seed (request lengths), to measure run-to-run spread.
    `cache`: costed step graphs to reuse across calls (e.g. the passes of a fit).
    `analytic_for(system)`: calibrated analytic providers asked after the measured ones
    and before the physics-only models (the same objects on every call, so cached
    costs stay valid). `stack`: the operator stack of every row's step graphs
    (`ServeConfig.stack`; `auto`: from each row's device vendor). `harness`: client
    settings (`load_harness`) that replace the rules' for every row."""
    if statistic not in ("mean", "p50"):
        raise ConfigError(f"unknown statistic {statistic!r}", field="--statistic",
                          expected="mean | p50")
    resolve_stack(stack, "")   # an unknown name fails here, not on every row
    with long_run_gc():
        return _validate_rows(rows, configs_dir, evidence_for, progress, overheads, statistic,
                              seed, cache if cache is not None else StepModelCache(),
                              analytic_for, stack, harness)


def _validate_rows(rows, configs_dir, evidence_for, progress, overheads, statistic, seed,
                   cache, analytic_for, stack, harness) -> list[RowResult]:
    rules = rules_with_harness(load_rules(), harness)
    models = ModelResolver(configs_dir, rules)
    out: list[RowResult] = []
    for i, row in enumerate(rows):
        res = RowResult(
            row_id=row.get("id", f"row{i + 1}"), system=row.get("system", ""),
            model=row.get("model_path", ""), backend=row.get("backend", ""),
            backend_version=row.get("backend_version", ""), mode=row.get("mode", ""),
            isl=None, osl=None, concurrency=None, measured_ttft_ms=None, measured_tpot_ms=None)
        if res.mode.strip() == "disagg":
            res.has_worker_counts = all((row.get(k) or "").strip() for k in WORKER_FIELDS)
        try:
            res.measured_ttft_ms = _num(row, "silicon_ttft_ms")
            res.measured_tpot_ms = _num(row, "silicon_tpot_ms")
            if res.measured_ttft_ms <= 0 or res.measured_tpot_ms <= 0:
                raise RowError("measured TTFT/TPOT must be positive")
            cfg, notes = row_config(row, models, rules, overheads)
            cfg = replace(cfg, stack=stack)
            if seed:
                cfg = replace(cfg, seed=seed)
            res.isl, res.osl, res.concurrency = cfg.isl, cfg.osl, cfg.concurrency
            res.assumptions = notes + ([harness_note(harness)] if harness else [])
            # the screens apply Little's law, which holds for the requests' means (the
            # default statistic); a row read as medians is not screened
            means = statistic == "mean"
            contradiction = means and (
                below_memory_bound(cfg, res.measured_ttft_ms, res.measured_tpot_ms)
                or above_compute_bound(cfg, res.measured_ttft_ms, res.measured_tpot_ms))
            if contradiction:
                raise RowError(contradiction)
            providers, context = (), None
            if evidence_for:
                ev = evidence_for(res.system, res.backend, res.backend_version)
                providers, context = ev.providers, (ev.context if ev.providers else None)
                if ev.note:
                    res.assumptions.append(ev.note)
                contradiction = means and above_measured_prefill(
                    cfg, res.measured_ttft_ms, res.measured_tpot_ms, providers, context)
                if contradiction:
                    raise RowError(contradiction)
            if analytic_for:
                curves = analytic_for(res.system.strip())
                providers = (*providers, *curves)
                res.assumptions += [note for note in map(curves_note, curves) if note]
            # the rows compare TTFT and TPOT only: no ITL statistics
            sim = run_serving(cfg, evidence=providers, evidence_context=context, cache=cache,
                              itl_summary=False)
            m = sim.metrics
            if m.rejected_requests:
                raise RowError(f"{m.rejected_requests} requests could not be served: "
                               + sim.rejected[0].reject_reason)
            res.pred_ttft_ms = m.ttft_ms[statistic]
            res.pred_tpot_ms = m.tpot_ms[statistic]
        except RowError as exc:
            res.reason = str(exc)
        except PerfcastError as exc:
            res.reason = f"{type(exc).__name__}: {exc}"
        if progress:
            progress(i + 1, len(rows))
        out.append(res)
    return out


def curves_note(provider) -> str:
    """The row assumption of an analytic provider whose efficiency curves apply to the
    row's device without any record of it; "" for any other provider."""
    transfer = getattr(provider, "transfer", None) or {}
    if not transfer.get("undeclared"):
        return ""
    return (f"efficiency curves of calibration revision {provider.revision_digest[:19]} "
            f"fitted on {', '.join(transfer.get('from', ()))}, applied to "
            f"{provider.system.name} without any record of it")


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"missing columns {', '.join(missing)}", source=str(path),
                              expected="the silicon-sample CSV layout")
        return list(reader)


def ape(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas


def summarize(results: Sequence[RowResult], keys=("system", "model", "backend")) -> list[dict]:
    """MAPE and median APE per group (and overall, group '*'), with coverage; for
    groups of disagg rows also the coverage of the rows that record worker counts."""
    groups: dict[tuple, list[RowResult]] = {}
    for r in results:
        groups.setdefault(tuple(getattr(r, k) for k in keys), []).append(r)
    groups[("*",) * len(keys)] = list(results)
    out = []
    for key, rs in groups.items():
        done = [r for r in rs if r.predicted]
        t = np.array([ape(r.pred_ttft_ms, r.measured_ttft_ms) for r in done])
        p = np.array([ape(r.pred_tpot_ms, r.measured_tpot_ms) for r in done])
        group = {**dict(zip(keys, key)), "rows": len(rs), "predicted": len(done),
                 "coverage": len(done) / len(rs) if rs else 0.0,
                 "ttft_mape": float(t.mean()) if t.size else None,
                 "ttft_median_ape": float(np.median(t)) if t.size else None,
                 "tpot_mape": float(p.mean()) if p.size else None,
                 "tpot_median_ape": float(np.median(p)) if p.size else None}
        banded = [r for r in done if r.prediction_band]
        if banded:   # share of measurements inside the revision's error band
            for metric, meas in (("ttft", "measured_ttft_ms"), ("tpot", "measured_tpot_ms")):
                group[f"{metric}_band_coverage"] = sum(
                    r.prediction_band[f"{metric}_ms"]["low"] <= getattr(r, meas)
                    <= r.prediction_band[f"{metric}_ms"]["high"] for r in banded) / len(banded)
        counted = [r for r in rs if r.has_worker_counts]
        if any(r.has_worker_counts is not None for r in rs):
            group["rows_with_worker_counts"] = len(counted)
            group["coverage_with_worker_counts"] = (
                sum(r.predicted for r in counted) / len(counted) if counted else None)
        out.append(group)
    return out


def summarize_by_mode(results: Sequence[RowResult],
                      keys=("system", "model", "backend")) -> dict[str, list[dict]]:
    """`summarize` of each mode's rows apart (agg and disagg are not comparable)."""
    modes = sorted({r.mode.strip() for r in results})
    return {m: summarize([r for r in results if r.mode.strip() == m], keys) for m in modes}
