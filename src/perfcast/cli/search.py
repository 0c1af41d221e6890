"""`perfcast search MODEL`: best serving configurations for a GPU budget under SLOs."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from perfcast.cli.calibration_option import CalibrationOption, analytic_for, backend_overheads
from perfcast.cli.calibration_option import load as load_calibration
from perfcast.cli.errors import check_output_paths, user_errors
from perfcast.cli.serving_options import (AcceptanceOption, DraftModelOption,
                                           NumSpeculativeTokensOption, SpeculativeOption,
                                           StackOption)
from perfcast.core.errors import ConfigError
from perfcast.serving.limits import MAX_SIMULATED_REQUESTS, check_request_count


PERCENTILES = ("p50", "p90", "p99")


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"has value {text!r}", field=flag,
                          expected="comma-separated integers") from None
    if not values or min(values) < 1:
        raise ConfigError(f"has value {text!r}", field=flag, expected="positive integers")
    return values


def search_command(
    model: Annotated[str, typer.Argument(help="config.json path, folder or built-in id")],
    device: Annotated[str, typer.Option(help="catalog id or a system YAML path")] = "h100_sxm",
    backend: Annotated[str, typer.Option(help="vllm | sglang | trtllm")] = "vllm",
    backend_version: Annotated[str, typer.Option("--backend-version")] = "",
    gpus: Annotated[int, typer.Option(help="GPU budget")] = 8,
    isl: Annotated[int, typer.Option()] = 1024,
    osl: Annotated[int, typer.Option()] = 256,
    concurrency: Annotated[str, typer.Option(help="closed-loop client concurrencies to try")
                           ] = "4,8,16,32,64,128",
    tp_sizes: Annotated[str, typer.Option("--tp-sizes")] = "1,2,4,8",
    pp_sizes: Annotated[str, typer.Option("--pp-sizes", help="pipeline-parallel sizes "
                                          "(stages pipelined as in `serve --pp-size`)")] = "1",
    dp_sizes: Annotated[str, typer.Option("--dp-sizes", help="attention-DP sizes")] = "1",
    ep_sizes: Annotated[Optional[str], typer.Option(
        "--ep-sizes", help="expert-parallel sizes (default: 1; MoE models also EP = TP x DP)")
    ] = None,
    modes: Annotated[str, typer.Option(help="agg,disagg")] = "agg,disagg",
    max_ttft_ms: Annotated[Optional[float], typer.Option("--max-ttft-ms")] = None,
    max_tpot_ms: Annotated[Optional[float], typer.Option("--max-tpot-ms")] = None,
    slo_percentile: Annotated[Optional[int], typer.Option(
        "--slo-percentile", help="judge the SLOs on the p50, p90 or p99 of each "
        "configuration's requests (default: the mean)")] = None,
    prefix_cache_hit_rate: Annotated[Optional[float], typer.Option(
        "--prefix-cache-hit-rate", help="fraction of each prompt found in the prefix cache "
        "(as serve)")] = None,
    speculative: SpeculativeOption = None,
    num_speculative_tokens: NumSpeculativeTokensOption = 0,
    acceptance: AcceptanceOption = None,
    draft_model: DraftModelOption = None,
    stack: StackOption = "auto",
    top_n: Annotated[int, typer.Option("--top", help="configurations to list")] = 10,
    executor: Annotated[str, typer.Option(help="local (processes) | inline | ray")] = "local",
    workers: Annotated[int, typer.Option(help="local processes (0: one per CPU)")] = 0,
    evidence_root: Annotated[Optional[Path], typer.Option("--evidence-root")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="write the Pareto plot (.html or .png)")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    calibration: CalibrationOption = "default",
    allow_long_run: Annotated[bool, typer.Option(
        "--allow-long-run", help="simulations of more than "
        f"{MAX_SIMULATED_REQUESTS:,} requests each")] = False,
) -> None:
    """Sweep layouts, concurrency and agg vs disagg; print the Pareto frontier and top-N."""
    with user_errors():
        check_output_paths(plot=plot)
        if plot is not None:
            from perfcast.serving.plots import check_plot_path

            check_plot_path(plot)
        args = SearchArgs(
            model=model, device=device, backend=backend, backend_version=backend_version,
            gpus=gpus, isl=isl, osl=osl, concurrency=concurrency, tp_sizes=tp_sizes,
            pp_sizes=pp_sizes, dp_sizes=dp_sizes, ep_sizes=ep_sizes, modes=modes,
            max_ttft_ms=max_ttft_ms, max_tpot_ms=max_tpot_ms, slo_percentile=slo_percentile,
            prefix_cache_hit_rate=prefix_cache_hit_rate, speculative=speculative,
            num_speculative_tokens=num_speculative_tokens, acceptance=acceptance,
            draft_model=draft_model, stack=stack, top_n=top_n, executor=executor, workers=workers,
            evidence_root=str(evidence_root) if evidence_root else None,
            calibration=calibration, allow_long_run=allow_long_run)
        with search_progress() as (on_start, on_done):
            doc, cands = run_search(args, note=lambda text: typer.echo(text, err=True),
                                    on_start=on_start, on_done=on_done)
        if plot:
            from perfcast.serving.plots import write_plot

            write_plot(cands, plot)
        if output_format is OutputFormat.json:
            typer.echo(json.dumps(doc, indent=2))
            return
        print_search(doc, Console())


@dataclass(frozen=True)
class SearchArgs:
    """The inputs of one `perfcast search` (the command's options by their Python names;
    lists as the comma-separated text the flags take), shared by the CLI and the
    workbench API."""
    model: str
    device: str = "h100_sxm"
    backend: str = "vllm"
    backend_version: str = ""
    gpus: int = 8
    isl: int = 1024
    osl: int = 256
    concurrency: str = "4,8,16,32,64,128"
    tp_sizes: str = "1,2,4,8"
    pp_sizes: str = "1"
    dp_sizes: str = "1"
    ep_sizes: Optional[str] = None
    modes: str = "agg,disagg"
    max_ttft_ms: Optional[float] = None
    max_tpot_ms: Optional[float] = None
    slo_percentile: Optional[int] = None
    prefix_cache_hit_rate: Optional[float] = None
    speculative: Optional[str] = None
    num_speculative_tokens: int = 0
    acceptance: Optional[str] = None
    draft_model: Optional[Path] = None
    stack: str = "auto"
    top_n: int = 10
    executor: str = "local"
    workers: int = 0
    evidence_root: Optional[str] = None
    calibration: str = "default"
    allow_long_run: bool = False


def run_search(a: SearchArgs, note=lambda text: None, on_start=None, on_done=None):
    """(the `perfcast search --format json` document, the candidates) of `a`;
    `on_start(layouts)` and `on_done()` report progress per layout."""
    from perfcast.hardware import load_system
    from perfcast.serving.backends import load_backend
    from perfcast.serving.search import SearchSpace, default_ep_sizes, search
    from perfcast.workload import load_model_spec
    from perfcast.workload.stacks import resolve_stack

    if a.slo_percentile not in (None, 50, 90, 99):
        raise ConfigError(f"has value {a.slo_percentile}", field="--slo-percentile",
                          expected="50, 90 or 99 (default: the mean)")
    statistic = "mean" if a.slo_percentile is None else f"p{a.slo_percentile}"
    concurrencies = _ints(a.concurrency, "--concurrency")
    check_request_count(SearchSpace.prompts_per_concurrency * max(concurrencies),
                        "--concurrency", a.allow_long_run)
    spec = load_model_spec(a.model)
    for text in spec.notes:
        note(f"note: {text}")
    system = load_system(a.device)
    op_stack = resolve_stack(a.stack, system.device.vendor)
    revision = load_calibration(a.calibration)
    bk = load_backend(a.backend, a.backend_version, system=system)
    if bk.version_note and a.backend_version:   # a version given but not matched
        note(f"note: {bk.version_note}")
    fitted = backend_overheads(revision, bk.name)
    tps, dps = _ints(a.tp_sizes, "--tp-sizes"), _ints(a.dp_sizes, "--dp-sizes")
    eps = (_ints(a.ep_sizes, "--ep-sizes") if a.ep_sizes is not None
           else default_ep_sizes(spec, tps, dps))
    evidence_root = Path(a.evidence_root) if a.evidence_root else None
    from perfcast.cli.serve import speculative_config
    from perfcast.serving.requests import DeclaredHitRate

    if a.prefix_cache_hit_rate is not None:
        DeclaredHitRate(a.prefix_cache_hit_rate)   # checks the range before any simulation
    spec_decode = speculative_config(a)
    space = SearchSpace(
        model=spec, system=a.device, backend=a.backend,
        backend_version=a.backend_version, gpus=a.gpus, isl=a.isl, osl=a.osl,
        concurrencies=concurrencies, tp_sizes=tps, pp_sizes=_ints(a.pp_sizes, "--pp-sizes"),
        dp_sizes=dps,
        ep_sizes=eps, modes=tuple(m.strip() for m in a.modes.split(",") if m.strip()),
        max_ttft_ms=a.max_ttft_ms, max_tpot_ms=a.max_tpot_ms, slo_statistic=statistic,
        evidence_root=str(evidence_root) if evidence_root else None,
        overheads=tuple(sorted(fitted.items())), allow_long_run=a.allow_long_run,
        extra_providers=tuple((analytic_for(revision) or (lambda _: []))(system.name)),
        prefix_cache_hit_rate=a.prefix_cache_hit_rate, speculative=spec_decode,
        stack=a.stack)
    cands = search(space, executor=a.executor, workers=a.workers or None,
                   on_start=on_start, on_done=on_done)
    calib = revision.digest if revision else "none"
    evidence = ({"root": str(evidence_root), "backend": bk.name,
                 "version": _evidence_version(space, system.name)}
                if evidence_root else None)
    from perfcast.calibrate.prediction_error import prediction_band

    return search_report(space, spec, system, bk.name, cands, a.top_n, calib, evidence,
                         backend_defaults=bk, stack=op_stack,
                         band=prediction_band(revision, bk.name)), cands


def _evidence_version(space, system: str) -> str | None:
    """The collected version the layouts' evidence came from (as evidence_loader picks)."""
    from perfcast.evidence.deployment import collected_versions, nearest_version

    return nearest_version(space.backend_version,
                           collected_versions(Path(space.evidence_root), system, space.backend))


@contextlib.contextmanager
def search_progress():
    """A rich progress bar on stderr over the layouts (only on a terminal): yields
    (on_start(total), on_done())."""
    from perfcast.cli.progress import progress_bar

    with progress_bar("simulating layouts") as advance:
        state = {"done": 0, "total": 0}

        def on_start(total: int) -> None:
            state["total"] = total
            advance(0, total)

        def on_done() -> None:
            state["done"] += 1
            advance(state["done"], state["total"])

        yield on_start, on_done


def search_report(space, spec, system, backend: str, cands, top_n: int, calibration: str,
                  evidence: dict | None, backend_defaults=None, stack=None,
                  band=None) -> dict:
    """The search as JSON: inputs, SLOs, results, failures, provenance;
    `backend_defaults` (BackendDefaults) names the version range the layouts used,
    `stack` (OpStack) the profile `space.stack` resolved to on the device, `band` (a
    `PredictionBand` of the calibration revision) the held-out error band each agg
    configuration of `pareto` and `top` gets as `prediction_band`."""
    from perfcast.calibrate.prediction_error import band_json
    from perfcast.cli.serve import speculative_json, stack_json
    from perfcast.serving.backends import defaults_json
    from perfcast.serving.provenance import provenance_json
    from perfcast.serving.search import (candidate_json, failure_counts, nearest_misses,
                                         search_provenance, top)

    rows, queries = search_provenance(cands)
    best = top(cands, top_n)

    def with_band(c) -> dict:
        d = candidate_json(c)
        m = c.metrics or {}
        mean = (lambda key: (m.get(key) or {}).get("mean"))
        d["prediction_band"] = (band_json(band, mean("ttft_ms"), mean("tpot_ms"))
                                if c.mode == "agg" else None)
        return d

    return {
        "inputs": {"model": spec.name, "model_digest": spec.digest, "model_source": spec.source,
                   "device": system.name, "system_digest": system.digest, "backend": backend,
                   "backend_version": space.backend_version or None, "gpus": space.gpus,
                   "backend_defaults": (defaults_json(backend_defaults)
                                        if backend_defaults is not None else None),
                   "isl": space.isl, "osl": space.osl, "range_ratio": space.range_ratio,
                   "client": {"kind": "closed_loop", "concurrencies": list(space.concurrencies),
                              "requests_per_client": space.prompts_per_concurrency},
                   "tp_sizes": list(space.tp_sizes), "pp_sizes": list(space.pp_sizes),
                   "dp_sizes": list(space.dp_sizes),
                   "ep_sizes": list(space.ep_sizes), "modes": list(space.modes),
                   "prefix_cache_hit_rate": space.prefix_cache_hit_rate,
                   "speculative": speculative_json(space.speculative),
                   "stack": stack_json(space.stack, stack) if stack is not None else None,
                   "notes": list(spec.notes)},
        "slo": {"statistic": space.slo_statistic, "max_ttft_ms": space.max_ttft_ms,
                "max_tpot_ms": space.max_tpot_ms},
        "pareto": [with_band(c) for c in cands if c.pareto],
        "top": [with_band(c) for c in best],
        "nearest_misses": [candidate_json(c) for c in nearest_misses(cands, min(top_n, 5))],
        "configurations": [configuration_row(c, space.slo_statistic) for c in cands],
        "evaluated": len(cands),
        "meet_slo": sum(c.meets_slo for c in cands),
        "failures": failure_counts(cands),
        "failed": [{"layout": c.layout, "concurrency": c.concurrency, "error": c.error}
                   for c in cands if c.error],
        "calibration": calibration,
        "provenance": provenance_json(rows, queries, calibration=calibration,
                                      evidence=evidence),
    }


def configuration_row(c, statistic: str) -> dict:
    """One evaluated configuration in a line: what a Pareto plot of every configuration
    needs (TTFT and TPOT are the SLO statistic's, their p50 / p90 / p99 beside them;
    None where not simulated)."""
    m = c.metrics or {}
    ttft, tpot = m.get("ttft_ms") or {}, m.get("tpot_ms") or {}
    return {"layout": c.layout, "mode": c.mode, "gpus": c.gpus, "concurrency": c.concurrency,
            "tokens_per_s_per_gpu": m.get("tokens_per_s_per_gpu"),
            "tokens_per_s_per_user": m.get("tokens_per_s_per_user"),
            "ttft_ms": ttft.get(statistic), "tpot_ms": tpot.get(statistic),
            "ttft_percentiles_ms": {k: ttft.get(k) for k in PERCENTILES},
            "tpot_percentiles_ms": {k: tpot.get(k) for k in PERCENTILES},
            "meets_slo": c.meets_slo, "pareto": c.pareto, "failures": list(c.failures),
            "error": c.error}


def print_search(doc: dict, console: Console) -> None:
    from perfcast.serving.backends import defaults_lines
    from perfcast.serving.provenance import provenance_lines
    from perfcast.serving.search import FAILURE_REASONS

    inp, slo = doc["inputs"], doc["slo"]
    stat = slo["statistic"]
    for line in (f"model      {inp['model']} ({inp['model_digest'][:19]})",
                 f"device     {inp['device']} ({inp['system_digest'][:19]}), {inp['gpus']} GPUs",
                 f"backend    {inp['backend']} {inp['backend_version'] or '(version not given)'}",
                 *defaults_lines(inp.get("backend_defaults")),
                 f"clients    closed loop, concurrency "
                 f"{','.join(map(str, inp['client']['concurrencies']))}, "
                 f"{inp['client']['requests_per_client']} requests per client",
                 f"layouts    {'/'.join(inp['modes'])}, TP {inp['tp_sizes']}, "
                 f"PP {inp.get('pp_sizes', [1])}, DP {inp['dp_sizes']}, EP {inp['ep_sizes']}",
                 f"lengths    isl {inp['isl']}, osl {inp['osl']}, range ratio "
                 f"{inp['range_ratio']:g}",
                 "SLO        " + _slo_text(slo)):
        console.print(line, markup=False, highlight=False)
    tables = [("Pareto frontier", doc["pareto"]), (f"top {len(doc['top'])} by tokens/s/GPU",
                                                   doc["top"])]
    if doc["nearest_misses"]:
        tables.append(("nothing meets the SLOs: nearest misses", doc["nearest_misses"]))
    for title, rows in tables:
        if not rows:
            continue
        table = Table(title=f"{title} (TTFT, TPOT: {stat}, ms)")
        cols = ["layout", "GPUs", "C", "TTFT", "TPOT", "tok/s/GPU", "tok/s/user"]
        if rows is doc["nearest_misses"]:
            cols.append("x SLO")
        for col in cols:
            table.add_column(col, justify="left" if col == "layout" else "right",
                             no_wrap=col == "layout")
        for c in rows:
            m = c["metrics"]
            cells = [c["layout"], str(c["gpus"]), str(c["concurrency"]),
                     _ms(m["ttft_ms"][stat], 1), _ms(m["tpot_ms"][stat], 2),
                     f"{m['tokens_per_s_per_gpu']:.1f}", f"{m['tokens_per_s_per_user']:.1f}"]
            if rows is doc["nearest_misses"]:
                cells.append(f"{c['slo_excess']:.2f}")
            table.add_row(*cells)
        console.print(table)
    shown = {(c["layout"], c["concurrency"]): c for _, rows in tables for c in rows}
    if shown:
        table = Table(title="latency percentiles of the configurations above (ms)")
        for col in ("layout", "C", "TTFT p50/p90/p99", "TPOT p50/p90/p99"):
            table.add_column(col, justify="left" if col == "layout" else "right",
                             no_wrap=col == "layout")
        for c in shown.values():
            m = c["metrics"]
            table.add_row(c["layout"], str(c["concurrency"]), _percentiles(m["ttft_ms"], 1),
                          _percentiles(m["tpot_ms"], 2))
        console.print(table)
    console.print(f"{doc['evaluated']} configurations evaluated, {doc['meet_slo']} meet the "
                  f"SLOs, {doc['evaluated'] - doc['meet_slo']} do not", highlight=False)
    for reason, n in doc["failures"].items():
        console.print(f"  {n:>5} {reason}: {FAILURE_REASONS[reason]}", highlight=False)
    errors = [f for f in doc["failed"] if f["error"]]
    if errors:
        console.print(f"  first error: {errors[0]['layout']} C={errors[0]['concurrency']}: "
                      f"{errors[0]['error']}", markup=False, highlight=False)
    console.print("numbers from:", highlight=False)
    for line in provenance_lines(doc["provenance"]):
        console.print(f"  {line}", markup=False, highlight=False)


def _slo_text(slo: dict) -> str:
    limits = [f"{name} <= {slo[key]:g} ms" for name, key in (("TTFT", "max_ttft_ms"),
                                                               ("TPOT", "max_tpot_ms"))
              if slo[key] is not None]
    if not limits:
        return f"none given (tables show the {slo['statistic']})"
    text = (", ".join(limits) + f", judged on the {slo['statistic']} of each configuration's "
            "requests")
    if slo["statistic"] == "mean":
        text += " (the default; --slo-percentile 50|90|99 judges a percentile)"
    return text


def _percentiles(stats: dict, digits: int) -> str:
    return "/".join(_ms(stats[k], digits) for k in PERCENTILES)


def _ms(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
