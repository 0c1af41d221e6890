"""Harness recipes of `perfcast validate silicon`: the engine settings a measured
deployment's launch gave (`model_recipes` and `disagg_recipes` in `silicon_rules.yaml`,
each with its source) and how they are laid onto the backend defaults."""

from __future__ import annotations

from dataclasses import replace

from perfcast.core.errors import ConfigError
from perfcast.serving.backends import BackendDefaults
from perfcast.serving.deploy import Pool


def launch_settings(backend: BackendDefaults, settings: dict) -> BackendDefaults:
    """`backend` with a launch's `scheduler`, `kv_cache` and `cuda_graph` settings; a
    memory fraction set at launch ends the engine's own derivation."""
    kv_changes = dict(settings.get("kv_cache") or {})
    kv = backend.kv_cache
    if "memory_fraction" in kv_changes:
        kv = kv.with_memory_fraction(kv_changes.pop("memory_fraction"))
    out = replace(backend, kv_cache=replace(kv, **kv_changes),
                  cuda_graph=replace(backend.cuda_graph, **(settings.get("cuda_graph") or {})))
    return out.with_scheduler(**(settings.get("scheduler") or {}))


def graphs_up_to(backend: BackendDefaults, requests: int) -> BackendDefaults:
    """The harness captures CUDA graphs up to the requests one engine runs."""
    if backend.cuda_graph.max_batch >= requests:
        return backend
    sizes = tuple(sorted(set(backend.cuda_graph.capture_sizes) | {requests}))
    return replace(backend, cuda_graph=replace(backend.cuda_graph, max_batch=requests,
                                               capture_sizes=sizes))


RECIPE_META_KEYS = ("systems", "attention_dp", "lengths", "tp", "precision", "source")


def harness_recipe(harness: dict, model_id: str, backend: str, system: str,
                   attention_dp: bool, lengths: tuple[int, int], tp: int | None = None,
                   precision: str | None = None) -> dict:
    """The harness recipe for one exact model id on one engine and system: the
    settings its launch script passes (`model_recipes` in silicon_rules.yaml, each
    entry citing the script). Entries with `systems` apply only there, with
    `attention_dp` only when the row's layout has (true) or lacks (false) attention DP,
    with `lengths: [isl, osl]` only to rows of those lengths, with `tp: [..]` only to
    rows of those tensor-parallel sizes, with `precision: [..]` only to rows of those
    precision labels (a launch script per checkpoint); later entries override
    earlier ones. The result carries the last applied entry's `source`; an empty dict
    when no recipe applies."""
    entry = (harness.get("model_recipes") or {}).get(model_id, {})
    merged: dict = {}
    for part in entry.get(backend) or ():
        if isinstance(part, str):
            raise ConfigError(f"model_recipes[{model_id!r}][{backend!r}] must be a list of "
                              "settings mappings")
        if "systems" in part and system not in part["systems"]:
            continue
        if "attention_dp" in part and bool(part["attention_dp"]) != attention_dp:
            continue
        if "lengths" in part and tuple(part["lengths"]) != tuple(lengths):
            continue
        if "tp" in part and tp not in part["tp"]:
            continue
        if "precision" in part and precision not in part["precision"]:
            continue
        for key, value in part.items():
            if key in RECIPE_META_KEYS:   # conditions and the source, not settings
                continue
            if key in ("scheduler", "kv_cache"):
                merged.setdefault(key, {}).update(value)
            else:
                merged[key] = value
        merged["source"] = part.get("source") or entry.get("source", "")
    return merged


DISAGG_RUN_FIELDS = ("isl", "osl", "concurrency", "prefill_workers", "decode_workers",
                     "decode_attention_dp", "decode_max_batch_size", "prefill_max_batch_size",
                     "prefill_max_num_tokens", "recipe")


def disagg_recipe(harness: dict, model_id: str, backend: str, system: str, precision: str,
                  lengths: tuple[int, int], concurrency: int, prefill: Pool,
                  decode: Pool) -> dict:
    """The multi-node recipe a disagg row's deployment ran (`disagg_recipes` in
    silicon_rules.yaml): a search space of the harness lists one recipe per client
    concurrency and worker counts; a row takes the run whose lengths, concurrency,
    prefill and decode worker counts and decode attention DP are its own, in a space
    for its exact model id, engine, system and precision label. The settings: the
    decode workers' `max_batch_size` per rank (`decode_max_batch_size`) and, where
    every version of the recipe agrees, the prefill worker's `max_batch_size` and
    `max_num_tokens` per rank (the scheduler's `max_running_requests` and
    `token_budget`). A space may instead list `launches` (`launch_recipe`). An empty
    dict when no run matches."""
    for space, entry in (harness.get("disagg_recipes") or {}).items():
        if (model_id not in entry["models"] or backend != entry["backend"]
                or system not in entry["systems"] or precision not in entry["precision"]):
            continue
        for launch in entry.get("launches") or ():
            found = launch_recipe(launch, entry["source"], lengths, concurrency, prefill, decode)
            if found:
                return found
        for run in entry.get("runs") or ():
            if len(run) != len(DISAGG_RUN_FIELDS):
                raise ConfigError(f"disagg_recipes[{space!r}]: a run has {len(run)} fields, "
                                  f"expected {len(DISAGG_RUN_FIELDS)} "
                                  f"({', '.join(DISAGG_RUN_FIELDS)})")
            r = dict(zip(DISAGG_RUN_FIELDS, run))
            if ((r["isl"], r["osl"]) != tuple(lengths) or r["concurrency"] != concurrency
                    or r["prefill_workers"] != prefill.workers
                    or r["decode_workers"] != decode.workers
                    or bool(r["decode_attention_dp"]) != (decode.plan.dp > 1)):
                continue
            out: dict = {"decode_max_batch_size": int(r["decode_max_batch_size"]),
                         "source": f"{entry['source']}; recipe {r['recipe']}"}
            if r["prefill_max_batch_size"] is not None:
                out["scheduler"] = {"max_running_requests": int(r["prefill_max_batch_size"]),
                                    "token_budget": int(r["prefill_max_num_tokens"])}
            return out
    return {}


LAUNCH_KEYS = ("lengths", "concurrencies", "prefill_workers", "decode_workers",
               "prefill_plan", "decode_plan", "prefill", "decode", "recipe")


def launch_recipe(launch: dict, source: str, lengths: tuple[int, int], concurrency: int,
                  prefill: Pool, decode: Pool) -> dict:
    """One multi-node launch of `disagg_recipes` given by its roles' engine arguments
    (an SGLang recipe's prefill and decode `args`): it matches a row whose lengths,
    client concurrency (one of `concurrencies`), worker counts and both pools' layouts
    (`{tp, dp}` each) are its own. `prefill` settings (scheduler, kv_cache) apply to the
    prefill workers; `decode` settings (kv_cache, cuda_graph) run the decode workers'
    own engine, with `max_running_requests` per attention-DP rank."""
    if set(launch) != set(LAUNCH_KEYS):
        raise ConfigError(f"disagg_recipes launch {launch.get('recipe')!r} has keys "
                          f"{sorted(launch)}, expected {sorted(LAUNCH_KEYS)}")
    if (tuple(launch["lengths"]) != tuple(lengths)
            or concurrency not in launch["concurrencies"]
            or launch["prefill_workers"] != prefill.workers
            or launch["decode_workers"] != decode.workers):
        return {}
    for pool, plan in ((prefill, launch["prefill_plan"]), (decode, launch["decode_plan"])):
        if (pool.plan.tp, pool.plan.dp) != (int(plan["tp"]), int(plan["dp"])):
            return {}
    out = {**launch["prefill"], "source": f"{source}; recipe {launch['recipe']}"}
    decode_settings = dict(launch["decode"])
    scheduler = dict(decode_settings.pop("scheduler", {}))
    if "max_running_requests" in scheduler:
        out["decode_max_batch_size"] = int(scheduler.pop("max_running_requests"))
    if scheduler:
        raise ConfigError(f"disagg_recipes launch {launch['recipe']!r}: decode scheduler "
                          f"settings {sorted(scheduler)} are not modelled",
                          expected="max_running_requests only")
    out["decode"] = decode_settings
    return out
