"""`perfcast calibrate fit|list|show`: calibration revisions from observation sets."""

from __future__ import annotations

import json
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from perfcast.calibrate.revision import plain
from perfcast.cli.errors import user_errors
from perfcast.cli.progress import progress_bar

app = typer.Typer(no_args_is_help=True, help="Fit calibration revisions on observations "
                  "and inspect them.")


class Format(str, Enum):
    table = "table"
    json = "json"


class Grouping(str, Enum):
    model = "model"
    backend = "backend"
    system = "system"
    campaign = "campaign"


def _observation_sets(ctx: typer.Context, first: list[str], root: Optional[Path],
                      kind: str) -> list:
    """The observation sets `--observations D [D ...]` names (digests may follow the
    first flag as extra arguments), all of `kind`."""
    from perfcast.core.errors import ConfigError
    from perfcast.observe.store import ObservationStore

    store = ObservationStore(root)
    sets = [store.get(r) for r in list(first) + [a for a in ctx.args if not a.startswith("-")]]
    for obs in sets:
        if obs.kind != kind:
            raise ConfigError(f"observation set {obs.digest} holds {obs.kind} observations",
                              field="--observations", expected=f"{kind} observations")
    return sets


PASSES = re.compile(r"(\d+)/(\d+) passes")


def _report(message: str, console: Console, advance) -> None:
    """A fit's progress line: simulation passes move the bar, phases are printed."""
    passes = PASSES.search(message)
    if passes:
        advance(int(passes.group(1)), int(passes.group(2)))
    else:
        console.print(message)


@app.command("fit", context_settings={"allow_extra_args": True})
def fit_command(
    ctx: typer.Context,
    observations: Annotated[list[str], typer.Option(
        "--observations", help="observation-set digests or prefixes (serving rows); more "
        "digests may follow the first")],
    cv: Annotated[list[Grouping], typer.Option(
        "--cv", help="leave-one-group-out cross-validation by model | backend | system | "
        "campaign (repeatable)")],
    evidence_root: Annotated[Optional[Path], typer.Option(
        "--evidence-root", help="measured kernels (AIConfigurator layout) the simulator uses "
        "while fitting")] = None,
    model_configs: Annotated[Optional[Path], typer.Option(
        "--model-configs", help="folder of org--name_config.json files")] = None,
    store: Annotated[Optional[Path], typer.Option(
        "--store", help="calibration store (default: $PERFCAST_CALIBRATION_STORE or the user "
        "data folder)")] = None,
    observation_store: Annotated[Optional[Path], typer.Option(
        "--observation-store", help="where the observation sets are (default: "
        "$PERFCAST_OBSERVATION_STORE or the user data folder)")] = None,
    mode: Annotated[str, typer.Option(help="rows of this mode (agg | disagg | all)")] = "agg",
    name: Annotated[str, typer.Option(help="a name for the revision")] = "serving",
    workers: Annotated[int, typer.Option(help="simulation processes (0: up to 2)")] = 0,
    min_fold_rows: Annotated[int, typer.Option(
        "--min-fold-rows", help="refuse a fold that holds out fewer modelled rows")] = 3,
    min_train_rows: Annotated[int, typer.Option(
        "--min-train-rows", help="refuse a fit on fewer modelled rows")] = 30,
    analytic: Annotated[Optional[str], typer.Option(
        "--analytic", help="a revision with efficiency curves (calibrate fit-kernels) that the "
        "simulator uses while fitting; its parts join the new revision")] = None,
    disagg_handoff: Annotated[bool, typer.Option(
        "--disagg-handoff/--no-disagg-handoff", help="then fit the disaggregated handoff "
        "per engine on the sets' disagg rows that record their worker counts (skipped when "
        "fewer than 10)")] = False,
    output_format: Annotated[Format, typer.Option("--format")] = Format.table,
) -> None:
    """Fit the serving overheads on observed deployments, cross-validated."""
    from perfcast.calibrate.fit_serving import fit_serving_revision
    from perfcast.calibrate.serving import FitOptions
    from perfcast.calibrate.store import CalibrationStore

    with user_errors():
        sets = _observation_sets(ctx, observations, observation_store, "serving")
        err = Console(stderr=True)
        from perfcast.calibrate.store import load_calibration
        curves = load_calibration(analytic, store=CalibrationStore(store)) if analytic else None
        with progress_bar("calibrate fit") as advance:
            rev, _ = fit_serving_revision(
                sets, evidence_root=evidence_root, model_configs=model_configs,
                cv=[g.value for g in cv], mode=None if mode == "all" else mode,
                options=FitOptions(min_held_out_rows=min_fold_rows,
                                   min_train_rows=min_train_rows),
                name=name, workers=workers or None,
                progress=lambda msg: _report(msg, err, advance), analytic=curves,
                disagg_handoff=disagg_handoff)
        CalibrationStore(store).put(rev)
        doc = fit_json(rev)
        if output_format is Format.json:
            typer.echo(json.dumps(doc, indent=2))
            return
        _print_revision(rev, Console())


def fit_json(rev) -> dict:
    from perfcast.calibrate.disagg_handoff import PART_NAME as HANDOFF

    part = rev.parts[0]
    doc = {"revision": rev.digest, "name": rev.name, "code_version": rev.code_version,
           "parameters": {p.name: {"value": p.value, "std": p.std, "unit": p.unit}
                          for p in part.parameters},
           "fitted_on": plain(part.fitted_on),
           "cv": rev.to_json()["parts"][0]["cv"]}
    handoff = rev.part(HANDOFF)
    if handoff is not None:
        doc["disagg_handoff"] = {
            "parameters": {p.name: {"value": p.value, "std": p.std, "unit": p.unit}
                           for p in handoff.parameters},
            "fitted_on": plain(handoff.fitted_on), "cv": plain(handoff.cv)}
    return doc


@app.command("fit-kernels", context_settings={"allow_extra_args": True})
def fit_kernels_command(
    ctx: typer.Context,
    observations: Annotated[list[str], typer.Option(
        "--observations", help="kernel observation-set digests or prefixes (perfcast observe "
        "import kernels); more digests may follow the first")],
    store: Annotated[Optional[Path], typer.Option("--store", help="calibration store")] = None,
    observation_store: Annotated[Optional[Path], typer.Option("--observation-store")] = None,
    name: Annotated[str, typer.Option(help="a name for the revision")] = "analytic",
    output_format: Annotated[Format, typer.Option("--format")] = Format.table,
) -> None:
    """Fit the analytic path's efficiency curves on kernel observations, cross-validated
    (leave one system out, and one framework out within each system)."""
    from perfcast.calibrate.efficiency import fit_efficiency
    from perfcast.calibrate.fit_serving import code_version
    from perfcast.calibrate.revision import CalibrationRevision
    from perfcast.calibrate.store import CalibrationStore
    from perfcast.hardware import load_system

    with user_errors():
        sets = _observation_sets(ctx, observations, observation_store, "kernels")
        fit = fit_efficiency([(obs.database, load_system(obs.manifest.system)) for obs in sets])
        part = fit.part()
        part = type(part)(name=part.name, procedure=part.procedure, parameters=part.parameters,
                          fitted_on=part.fitted_on.replace(
                              observation_sets=tuple(obs.digest for obs in sets)),
                          cv=part.cv)
        rev = CalibrationRevision(name=name, code_version=code_version(), parts=(part,))
        CalibrationStore(store).put(rev)
        if output_format is Format.json:
            doc = rev.to_json()
            typer.echo(json.dumps({"revision": rev.digest, "parameters": {
                p.name: {"value": p.value, "std": p.std, "unit": p.unit}
                for p in part.parameters}, "fitted_on": doc["parts"][0]["fitted_on"],
                "cv": doc["parts"][0]["cv"]}, indent=2))
            return
        _print_revision(rev, Console())


def list_record(store: Optional[Path]) -> list[dict]:
    """`perfcast calibrate list --format json`: the shipped default, then the store's."""
    from perfcast.calibrate.store import CalibrationStore, default_revision, summary

    items = [dict(summary(default_revision()), where="shipped default")]
    return items + [dict(s, where="store") for s in CalibrationStore(store).list()]


@app.command("list")
def list_command(
    store: Annotated[Optional[Path], typer.Option("--store")] = None,
    output_format: Annotated[Format, typer.Option("--format")] = Format.table,
) -> None:
    """Stored revisions and the shipped default."""
    with user_errors():
        items = list_record(store)
        if output_format is Format.json:
            typer.echo(json.dumps(items, indent=2))
            return
        table = Table(title="calibration revisions")
        for col in ("revision", "name", "where", "parts", "parameters", "fitted on"):
            table.add_column(col)
        for s in items:
            table.add_row(s["revision"][7:19], s["name"], s["where"], ", ".join(s["parts"]),
                          str(s["parameters"]),
                          ", ".join(d[7:19] for d in s["fitted_on"].get("observation_sets", [])))
        Console().print(table)


@app.command("show")
def show_command(
    revision: Annotated[str, typer.Argument(help="digest or prefix, `default`, or a JSON file")],
    store: Annotated[Optional[Path], typer.Option("--store")] = None,
    output_format: Annotated[Format, typer.Option("--format")] = Format.table,
) -> None:
    """A revision's parameters, what it was fitted on and its cross-validation scores."""
    from perfcast.calibrate.store import CalibrationStore, load_calibration

    with user_errors():
        if revision == "none":
            from perfcast.core.errors import ConfigError
            raise ConfigError("`none` is no revision (physics only)", field="REVISION")
        rev = load_calibration(revision, store=CalibrationStore(store))
        if output_format is Format.json:
            typer.echo(json.dumps(rev.to_json(), indent=2))
            return
        _print_revision(rev, Console())


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _print_revision(rev, console: Console) -> None:
    console.print(f"revision {rev.digest}  ({rev.name}, perfcast {rev.code_version})")
    for part in rev.parts:
        console.print(f"[bold]{part.name}[/bold]: {part.procedure.get('name')} "
                      f"v{part.procedure.get('version')}")
        for key, val in part.fitted_on.items():
            if isinstance(val, (tuple, list)):
                console.print(f"  fitted on {key}: " + ", ".join(str(v) for v in val))
        table = Table()
        for col in ("parameter", "value", "std", "unit", "bounds"):
            table.add_column(col, justify="left" if col == "parameter" else "right",
                             no_wrap=col == "parameter")
        for p in part.parameters:
            table.add_row(p.name, f"{p.value:.4g}", "-" if p.std is None else f"{p.std:.3g}",
                          p.unit, f"[{p.lower:g}, {p.upper:g}]")
        console.print(table)
        cv = part.cv
        schemes = cv.get("schemes") or ([cv] if "folds" in cv else [])
        # serving schemes: folds named by `group` with in-sample and held-out MAPE (the
        # efficiency curves' folds have their own layout, printed as their summary)
        schemes = [sc for sc in schemes if all("group" in f for f in sc.get("folds", ()))]
        for scheme in schemes:
            t = Table(title=f"cross-validation: leave one {scheme['group_by']} out")
            for col in ("held out", "rows", "in-sample TTFT", "in-sample TPOT", "held-out TTFT",
                        "held-out TPOT"):
                t.add_column(col, justify="left" if col == "held out" else "right")
            for f in scheme["folds"]:
                t.add_row(str(f["group"]), str(f["rows"]), _pct(f["in_sample"].get("ttft_mape")),
                          _pct(f["in_sample"].get("tpot_mape")),
                          _pct(f["held_out"].get("ttft_mape")), _pct(f["held_out"].get("tpot_mape")))
            pooled = scheme["summary"]["held_out"]
            t.add_row("all held out", str(pooled["rows"]), "", "", _pct(pooled["ttft_mape"]),
                      _pct(pooled["tpot_mape"]))
            console.print(t)
        if "efficiency" in part.name:
            console.print(json.dumps(plain(cv).get("summary", {}), indent=1))
        coverage = cv.get("coverage")
        if coverage and "groups" in coverage:   # prediction error bands
            levels = part.procedure.get("levels", {})
            t = Table(title=f"error band coverage: each {cv.get('group_by')}'s band from "
                            f"the others (percentiles TTFT "
                            f"{'/'.join(f'{v:g}' for v in levels.get('ttft', ()))}, TPOT "
                            f"{'/'.join(f'{v:g}' for v in levels.get('tpot', ()))})")
            for col in ("held out", "rows", "TTFT in band", "TPOT in band"):
                t.add_column(col, justify="left" if col == "held out" else "right")
            for g in coverage["groups"]:
                t.add_row(str(g["held_out"]), str(g["rows"]), _pct(g["ttft"]), _pct(g["tpot"]))
            t.add_row("all held out", str(coverage["rows"]), _pct(coverage["ttft"]),
                      _pct(coverage["tpot"]))
            console.print(t)
