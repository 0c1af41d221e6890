"""`perfcast evidence ...`: import, list, show, coverage and query evidence snapshots."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from perfcast.cli.errors import user_errors
from perfcast.core.errors import ConfigError, PerfcastError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Measured evidence: import, inspect and query database snapshots.")
import_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="Import a source into the evidence store (atomic, idempotent).")
app.add_typer(import_app, name="import")

StoreOpt = Annotated[Optional[Path], typer.Option(
    "--store", help="evidence store folder (default: $PERFCAST_EVIDENCE_STORE or the user "
                    "data dir)")]


class Fmt(str, Enum):
    table = "table"
    json = "json"


def _store(path: Optional[Path]):
    from perfcast.evidence.store import EvidenceStore

    return EvidenceStore(path)


def _report_import(db, store_path: Optional[Path]) -> None:
    digest = _store(store_path).put(db, note=db.name)
    skipped = [s["skipped"] for s in db.sources if "skipped" in s]
    typer.echo(f"{digest}  {len(db)} records  {db.name}")
    if skipped:
        typer.echo(f"skipped {len(skipped)} table(s) (unsupported or missing); see "
                   f"`perfcast evidence show {digest[7:19]}`")


@import_app.command("aiconfigurator")
def import_aiconfigurator(
    folder: Annotated[Path, typer.Argument(help="system folder (e.g. .../h100_sxm) or one "
                                                "<family>/<framework>/<version> folder")],
    system: Annotated[str, typer.Option("--system", help="perfcast hardware id for the rows")],
    table: Annotated[Optional[list[str]], typer.Option("--table", help="only these tables")] = None,
    store: StoreOpt = None,
) -> None:
    """Import AIConfigurator Parquet tables (gemm, attention, MLA, MoE, NCCL, custom AR)."""
    with user_errors():
        from perfcast.evidence.importers.aiconfigurator import import_system

        _report_import(import_system(folder, hardware=system,
                                     tables=tuple(table) if table else None), store)


@import_app.command("vidur")
def import_vidur(
    path: Annotated[Path, typer.Argument(
        help="Vidur *_mlp.csv, attention.csv, *all_reduce.csv or *send_recv.csv")],
    system: Annotated[str, typer.Option("--system", help="perfcast hardware id for the rows")],
    dtype: Annotated[str, typer.Option("--dtype", help="dtype the profile ran in (Vidur does "
                                                      "not record it)")],
    store: StoreOpt = None,
) -> None:
    """Import a Vidur compute (MLP) or network (all_reduce / send_recv) profile."""
    with user_errors():
        from perfcast.evidence.importers.vidur import VidurProfileImporter

        _report_import(VidurProfileImporter.from_csv(path, hardware=system, dtype=dtype), store)


@import_app.command("table")
def import_table(
    path: Annotated[Path, typer.Argument(help="CSV, JSON, JSONL or Parquet file")],
    spec: Annotated[Path, typer.Option("--spec", help="TabularImportSpec as YAML or JSON")],
    store: StoreOpt = None,
) -> None:
    """Import a simulator/profiler table with a declared mapping (no guessing)."""
    with user_errors():
        from perfcast.evidence.importers.tabular import SimulatorPerformanceImporter, load_spec

        _report_import(SimulatorPerformanceImporter.from_file(path, load_spec(spec)), store)


@app.command("list")
def list_command(store: StoreOpt = None,
                 output_format: Annotated[Fmt, typer.Option("--format")] = Fmt.table) -> None:
    """Snapshots in the store."""
    with user_errors():
        items = _store(store).list()
        if output_format is Fmt.json:
            typer.echo(json.dumps([{k: m[k] for k in ("digest", "name", "rows")} for m in items],
                                  indent=1))
            return
        for m in items:
            typer.echo(f"{m['digest'][7:19]}  {m['rows']:>9}  {m['name']}")


@app.command("show")
def show_command(ref: Annotated[str, typer.Argument(help="snapshot digest or prefix")],
                 store: StoreOpt = None) -> None:
    """A snapshot's manifest: digest, rows, sources (file digests), skipped tables."""
    with user_errors():
        typer.echo(json.dumps(_store(store).manifest(ref), indent=1, sort_keys=True))


@app.command("coverage")
def coverage_command(
    ref: Annotated[str, typer.Argument(help="snapshot digest/prefix, saved database or "
                                            "AIConfigurator folder")],
    hardware: Annotated[str, typer.Option(help="hardware id for on-the-fly imports")] = "h100_sxm",
    store: StoreOpt = None,
    output_format: Annotated[Fmt, typer.Option("--format")] = Fmt.table,
) -> None:
    """Rows and axis ranges per operation, dtype, runtime and implementation."""
    with user_errors():
        from perfcast.evidence.coverage import coverage
        from perfcast.evidence.store import open_evidence

        items = coverage(open_evidence(ref, hardware=hardware, store=_store(store)))
        if output_format is Fmt.json:
            typer.echo(json.dumps(items, indent=1))
            return
        for e in items:
            sel = " ".join(f"{k}={e[k]}" for k in ("runtime", "runtime_revision",
                                                   "implementation", "nccl_version") if k in e)
            axes = " ".join(f"{a}[{lo}..{hi}]" for a, (lo, hi) in e["axes"].items())
            typer.echo(f"{e['operation']:<14} {e['dtype']:<9} {e['rows']:>8}  {sel}  {axes}")


@app.command("query")
def query_command(
    ref: Annotated[str, typer.Argument(help="snapshot digest/prefix, saved database folder or "
                                            "AIConfigurator folder")],
    hardware: Annotated[str, typer.Option(help="catalog id")] = "h100_sxm",
    operation: Annotated[str, typer.Option(help="gemm | attention | all_reduce | ...")] = "",
    dtype: Annotated[str, typer.Option(help="compute dtype")] = "bf16",
    runtime: Annotated[str, typer.Option(help="vllm | sglang | trtllm | ...")] = "",
    runtime_version: Annotated[str, typer.Option("--runtime-version")] = "",
    implementation: Annotated[str, typer.Option(help="kernel / implementation name")] = "",
    dim: Annotated[Optional[list[str]], typer.Option("--dim", help="NAME=VALUE (repeat)")] = None,
    policy: Annotated[str, typer.Option(help="exact | interpolate | extrapolate")] = "interpolate",
    queries: Annotated[Optional[Path], typer.Option("--queries", help="JSONL file: one query "
                                                                       "per line")] = None,
    store: StoreOpt = None,
    output_format: Annotated[Fmt, typer.Option("--format")] = Fmt.json,
) -> None:
    """Resolve queries through database -> interpolation -> roofline/collective model."""
    from perfcast.estimate import make_resolver
    from perfcast.evidence.chain import batch_gc, evidence_providers, resolution_json
    from perfcast.evidence.query_spec import build_query, parse_dim
    from perfcast.evidence.store import open_evidence
    from perfcast.hardware import load_system

    with user_errors():
        system = load_system(hardware)
        db = open_evidence(ref, hardware=hardware, store=_store(store))
        resolver = make_resolver(system, evidence=evidence_providers([db], system, policy))
        if queries is None:
            if not operation:
                raise ConfigError("state --operation (or give --queries FILE.jsonl)",
                                  field="--operation")
            spec = {"operation": operation, "hardware": hardware, "dtype": dtype,
                    "runtime": runtime, "runtime_version": runtime_version,
                    "implementation": implementation,
                    "dims": dict(parse_dim(d) for d in dim or [])}
            out = resolution_json(resolver.resolve(build_query(spec)))
            if output_format is Fmt.json:
                typer.echo(json.dumps(out, indent=1))
            else:
                typer.echo(f"{out['latency_s'] * 1e6:.3f} us  {out['method']}  "
                           f"{out['provider']}  confidence {out['confidence']:.2f}")
                for a in out["attempts"]:
                    typer.echo(f"  {a['provider']}: {a['outcome']} {a['reason']}")
            return
    failures = 0
    try:
        lines = queries.read_text().splitlines()
    except OSError as exc:
        print(f"error: {queries}: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    with batch_gc():
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                spec = json.loads(line)
                res = resolver.resolve(build_query(spec, source=f"{queries}:{i}"))
                out = resolution_json(res)
            except (PerfcastError, json.JSONDecodeError, TypeError, ValueError) as exc:
                failures += 1
                out = {"line": i, "error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
    if failures:
        raise typer.Exit(1)
