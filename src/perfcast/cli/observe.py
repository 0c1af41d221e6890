"""`perfcast observe ...`: import measured results as observation sets; list and show them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from perfcast.cli.errors import user_errors
from perfcast.cli.evidence import Fmt

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Observations: measured serving runs and kernel times as immutable sets.")
import_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="Import measurements into the observation store (atomic, "
                              "idempotent).")
app.add_typer(import_app, name="import")

StoreOpt = Annotated[Optional[Path], typer.Option(
    "--store", help="observation store folder (default: $PERFCAST_OBSERVATION_STORE or the "
                    "user data dir)")]


FormatOpt = Annotated[Fmt, typer.Option("--format", help="table | json")]


def _store(path: Optional[Path]):
    from perfcast.observe.store import ObservationStore

    return ObservationStore(path)


def _progress(message: str) -> None:
    print(f"observe: {message}", file=sys.stderr, flush=True)


def _report_import(obs, store: Optional[Path], source: Path) -> None:
    _progress(f"storing {len(obs)} observations")
    digest = _store(store).put(obs, note=f"imported from {source.resolve()}")
    typer.echo(json.dumps({"observation_set": digest, "kind": obs.kind, "rows": len(obs),
                           "system": obs.manifest.system,
                           "sources": len(obs.manifest.sources),
                           "skipped": [dict(s) for s in obs.manifest.skipped]},
                          indent=1, sort_keys=True))


@import_app.command("silicon")
def import_silicon_command(
    file: Annotated[Path, typer.Argument(help="silicon-sample CSV (AIConfigurator layout)")],
    store: StoreOpt = None,
) -> None:
    """Import measured end-to-end deployments (TTFT, TPOT per row) as a serving set."""
    with user_errors():
        from perfcast.observe.silicon import import_silicon

        _progress(f"reading {file}")
        _report_import(import_silicon(file), store, file)


@import_app.command("kernels")
def import_kernels_command(
    path: Annotated[Path, typer.Argument(help="AIConfigurator system folder, per-kernel CSV "
                                              "folder (Ascend format), or profiler output "
                                              "(torch.profiler traces, kernel_details CSVs)")],
    system: Annotated[str, typer.Option("--system", help="perfcast system id the kernels "
                                                         "ran on (e.g. h100_sxm)")],
    kernel_type: Annotated[Optional[list[str]], typer.Option(
        "--kernel-type", help="keep only this kernel type (repeatable; CSV databases and "
                              "profiles), e.g. aten::mm")] = None,
    store: StoreOpt = None,
) -> None:
    """Import measured kernel latencies as a kernel set (refuses another device's data)."""
    with user_errors():
        from perfcast.observe.kernels import import_kernels

        _report_import(import_kernels(path, system=system, kernel_types=tuple(kernel_type or ()),
                                      progress=_progress), store, path)


@app.command("list")
def list_command(store: StoreOpt = None, output_format: FormatOpt = Fmt.table) -> None:
    """Observation sets in the store."""
    with user_errors():
        items = _store(store).list()
        if output_format is Fmt.json:
            typer.echo(json.dumps(items, indent=1, sort_keys=True))
            return
        for m in items:
            if "error" in m:
                typer.echo(f"{m['observation_set'][7:19]}  {m['error']}")
                continue
            typer.echo(f"{m['observation_set'][7:19]}  {m['kind']:<8} {m['rows']:>9}  "
                       f"{m['system']}  {m['sources']} source(s)")


def show_record(obs) -> dict:
    """`perfcast observe show --format json` of a loaded (verified) observation set."""
    from perfcast.observe.codec import manifest_json

    return {"observation_set": obs.digest, "verified": True, **manifest_json(obs.manifest)}


@app.command("show")
def show_command(ref: Annotated[str, typer.Argument(help="observation set digest or prefix")],
                 store: StoreOpt = None, output_format: FormatOpt = Fmt.table) -> None:
    """A set's manifest (sources with sha256, importer, environment facts), verified."""
    with user_errors():
        obs = _store(store).get(ref)
        doc = show_record(obs)
        m = doc
        if output_format is Fmt.json:
            typer.echo(json.dumps(doc, indent=1, sort_keys=True))
            return
        typer.echo(f"observation set {obs.digest} (verified)")
        typer.echo(f"kind {m['kind']}, {m['rows']} rows, system {m['system']}, importer "
                   f"{m['importer']} r{m['importer_revision']}")
        for fact, values in sorted(m["environment"].items()):
            typer.echo(f"  {fact}: {', '.join(values)}")
        typer.echo("sources:")
        for s in m["sources"]:
            rev = s["revision"]
            note = f"  [{rev}]" if rev and rev not in (s["name"], s["name"].rsplit("/", 1)[0]) \
                else ""
            typer.echo(f"  {s['sha256'][7:19]}  {s['rows']:>8}  {s['format']:<22} "
                       f"{s['name']}{note}")
        for s in m["skipped"]:
            typer.echo(f"  skipped {s.get('path', '')}: {s.get('reason', '')}")
