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

    store = EvidenceStore(path)
    for tmp in store.removed:
        print(f"note: removed {tmp}, the temporary folder of an interrupted import",
              file=sys.stderr)
    return store


def _system(text: str, flag: str = "--system") -> str:
    from perfcast.evidence.importers.common import system_id

    return system_id(text, field=flag)


def _catalog_system(hardware: str):
    """The catalog System of a record's hardware id, or None (not screened)."""
    from perfcast.hardware import load_system

    try:
        return load_system(hardware)
    except ConfigError:
        return None


def _report_import(db, store_path: Optional[Path]) -> None:
    """Store the snapshot and say what was imported, skipped (counts per reason), left
    unused and flagged by the plausibility screen; store the GEMM tables' fitted per-call
    overheads beside the snapshot (a derived record)."""
    from perfcast.cli.progress import progress_bar
    from perfcast.evidence.harness_overhead import fit_call_overheads, save_correction
    from perfcast.evidence.plausibility import screen_table, summary_line

    evidence_store = _store(store_path)
    with progress_bar("writing snapshot", 1) as advance:
        digest = evidence_store.put(db, note=db.name)
        advance(1, 1)
    typer.echo(f"{digest}  {len(db)} records  {db.name}")
    hardware = sorted(set(db.table.column("hardware").to_pylist()))
    for hw in hardware:
        system = _catalog_system(hw)
        if system is None:
            continue
        import pyarrow.compute as pc

        part = db.table.filter(pc.equal(db.table["hardware"], hw))
        prefix = f"{hw}: " if len(hardware) > 1 else ""
        typer.echo(prefix + summary_line(screen_table(part, system)))
        fit = fit_call_overheads(part, system, source_revision=digest)
        if fit is not None and fit.entries and len(hardware) == 1:
            path = save_correction(evidence_store.root, digest, fit)
            typer.echo(f"per-call overheads of {len(fit.entries)} GEMM kernel(s) "
                       f"({fit.procedure}) stored in {path}")
    reasons: dict[str, list[str]] = {}
    for s in db.sources:
        if "skipped" in s:
            reasons.setdefault(s["skipped"]["reason"], []).append(s["skipped"]["path"])
    if reasons:
        total = sum(len(v) for v in reasons.values())
        typer.echo(f"skipped {total} table(s):")
        for reason, paths in sorted(reasons.items()):
            shown = ", ".join(paths[:4]) + (f", ... ({len(paths) - 4} more)"
                                            if len(paths) > 4 else "")
            typer.echo(f"  {len(paths)} {reason}: {shown}")
    for s in db.sources:
        for key in ("left_out_quant_modes", "left_out"):
            if s.get(key):
                lo = s[key]
                typer.echo(f"left out {lo['rows']} row(s) of {s['path']}: {lo['reason']} "
                           f"(rows {', '.join(map(str, lo['first_rows']))}"
                           f"{', ...' if lo['rows'] > len(lo['first_rows']) else ''})")
        if s.get("unused_columns"):
            typer.echo(f"not imported: column(s) {', '.join(s['unused_columns'])} of "
                       f"{s['path']} (not in the import spec)")


@import_app.command("aiconfigurator")
def import_aiconfigurator(
    folder: Annotated[Path, typer.Argument(help="system folder (e.g. .../h100_sxm) or one "
                                                "<family>/<framework>/<version> folder")],
    system: Annotated[Optional[str], typer.Option(
        "--system", help="perfcast hardware id for the rows (default: the <system> folder "
                         "of the layout, or the tables' device column)")] = None,
    table: Annotated[Optional[list[str]], typer.Option("--table", help="only these tables")] = None,
    store: StoreOpt = None,
) -> None:
    """Import AIConfigurator Parquet tables (gemm, attention, MLA, MoE, NCCL, custom AR)."""
    with user_errors():
        from perfcast.cli.progress import progress_bar
        from perfcast.evidence.importers.aiconfigurator import TABLES, import_system

        unknown = sorted(set(table or ()) - set(TABLES))
        if unknown:
            raise ConfigError(f"unknown table(s) {unknown}", field="--table",
                              expected="one of " + ", ".join(sorted(TABLES)))
        hardware = _system(system) if system is not None else None
        with progress_bar("importing tables") as advance:
            db = import_system(folder, hardware=hardware,
                               tables=tuple(table) if table else None,
                               progress=lambda name, done, total: advance(done, total))
        _report_import(db, store)


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

        _report_import(VidurProfileImporter.from_csv(path, hardware=_system(system),
                                                     dtype=dtype), store)


@import_app.command("table")
def import_table(
    path: Annotated[Path, typer.Argument(help="CSV, JSON, JSONL or Parquet file")],
    spec: Annotated[Path, typer.Option("--spec", help="TabularImportSpec as YAML or JSON")],
    store: StoreOpt = None,
) -> None:
    """Import a simulator/profiler table with a declared mapping (no guessing)."""
    with user_errors():
        import dataclasses

        from perfcast.evidence.importers.common import system_id
        from perfcast.evidence.importers.tabular import SimulatorPerformanceImporter, load_spec

        loaded = load_spec(spec)
        if loaded.hardware:
            try:
                loaded = dataclasses.replace(loaded, hardware=system_id(loaded.hardware))
            except ConfigError as exc:
                raise ConfigError(f"unknown system {loaded.hardware!r}", source=str(spec),
                                  field="hardware", expected=exc.expected) from None
        _report_import(SimulatorPerformanceImporter.from_file(path, loaded, system=system_id),
                       store)


def list_record(manifests: list[dict]) -> list[dict]:
    """`perfcast evidence list --format json`: digest, name and rows per snapshot."""
    return [{k: m[k] for k in ("digest", "name", "rows")} for m in manifests]


@app.command("list")
def list_command(store: StoreOpt = None,
                 output_format: Annotated[Fmt, typer.Option("--format")] = Fmt.table) -> None:
    """Snapshots in the store."""
    with user_errors():
        st = _store(store)
        items = st.list()
        if output_format is Fmt.json:
            typer.echo(json.dumps(list_record(items), indent=1))
            return
        if not items:
            typer.echo(f"the evidence store {st.root} is empty (add a snapshot with "
                       "`perfcast evidence import aiconfigurator|vidur|table ...`)")
            return
        typer.echo(f"{'snapshot':<12}  {'records':>9}  name")
        for m in items:
            typer.echo(f"{m['digest'][7:19]}  {m['rows']:>9}  {m['name']}")


@app.command("show")
def show_command(ref: Annotated[str, typer.Argument(help="snapshot digest or prefix")],
                 store: StoreOpt = None,
                 output_format: Annotated[Fmt, typer.Option("--format")] = Fmt.table) -> None:
    """A snapshot: tables, record counts, selectors and sources (`--format json`: the
    whole manifest)."""
    with user_errors():
        from perfcast.evidence.store import counts

        st = _store(store)
        manifest = st.manifest(ref)
        if output_format is Fmt.json:
            typer.echo(json.dumps(manifest, indent=1, sort_keys=True))
            return
        db = st.get(ref)
        typer.echo(f"snapshot  {manifest['digest']}\nname      {manifest.get('name', '')}\n"
                   f"records   {manifest['rows']}")
        typer.echo("records per operation:")
        for c in counts(db):
            typer.echo(f"  {c['operation']:<16} {c['hardware']:<12} {c['dtype']:<9} "
                       f"{c['rows']:>9}")
        selectors = sorted({col.split(".", 2)[2] for col in manifest["columns"]
                            if col.startswith("sel.")})
        typer.echo("selectors: " + (", ".join(selectors) or "(none)"))
        sources = [s for s in manifest.get("sources", []) if "skipped" not in s]
        skipped = [s["skipped"] for s in manifest.get("sources", []) if "skipped" in s]
        typer.echo(f"sources ({len(sources)}):")
        for s in sources:
            extra = " ".join(f"{k}={s[k]}" for k in ("framework", "version", "revision",
                                                     "device", "dtype") if s.get(k))
            typer.echo(f"  {s.get('path', '?')}  {s.get('rows', '?')} rows  {extra}".rstrip())
        if skipped:
            typer.echo(f"skipped ({len(skipped)}):")
            for s in skipped:
                typer.echo(f"  {s['path']}: {s['reason']}")


def coverage_record(ref: str, hardware: Optional[str], store) -> list[dict]:
    """`perfcast evidence coverage --format json` of `ref` (a snapshot in `store`, a saved
    database or an AIConfigurator folder)."""
    from perfcast.evidence.coverage import coverage
    from perfcast.evidence.store import open_evidence

    hw = _system(hardware, "--hardware") if hardware else None
    return coverage(open_evidence(ref, hardware=hw, store=store), system_for=_catalog_system)


@app.command("coverage")
def coverage_command(
    ref: Annotated[str, typer.Argument(help="snapshot digest/prefix, saved database or "
                                            "AIConfigurator folder")],
    hardware: Annotated[Optional[str], typer.Option(
        help="system of a folder imported on the fly, when neither its layout nor its "
             "tables name one")] = None,
    store: StoreOpt = None,
    output_format: Annotated[Fmt, typer.Option("--format")] = Fmt.table,
) -> None:
    """Rows and axis ranges per operation, dtype, runtime and implementation."""
    with user_errors():
        items = coverage_record(ref, hardware, _store(store))
        if output_format is Fmt.json:
            typer.echo(json.dumps(items, indent=1))
            return
        from perfcast.evidence.plausibility import SLOW_FACTOR

        typer.echo(f"screen: rows faster than the roofline / slower than {SLOW_FACTOR:g}x "
                   "roofline + launch (docs/engine-kernels.md)")
        for e in items:
            sel = " ".join(f"{k}={e[k]}" for k in ("runtime", "runtime_revision",
                                                   "implementation", "nccl_version") if k in e)
            axes = " ".join(f"{a}[{lo}..{hi}]" for a, (lo, hi) in e["axes"].items())
            sc = e.get("screen") or {}
            flagged = (f"  screen {sc['below_roofline']} fast / {sc['slower_than_factor']} slow"
                       if sc.get("screened") else "")
            typer.echo(f"{e['operation']:<14} {e['dtype']:<9} {e['rows']:>8}  {sel}  "
                       f"{axes}{flagged}")


class _Resolvers:
    """One resolver per system a query names (its roofline and collective models are that
    system's); says once on stderr when the evidence holds no rows for a system."""

    def __init__(self, db, policy: str, ref: str) -> None:
        from perfcast.evidence.store import systems_of

        self.db, self.policy, self.ref = db, policy, ref
        self.held = systems_of(db)
        self._by_system: dict = {}
        self._names: dict[str, str] = {}
        self._load: dict[str, str] = {}  # catalog name -> what load_system takes

    def name(self, hardware: str, *, source: str | None = None,
             field: str = "hardware") -> str:
        """The catalog name of a system a query names (a ConfigError naming it if none)."""
        from perfcast.evidence.importers.common import system_id

        if not isinstance(hardware, str):
            raise ConfigError(f"{hardware!r} is not a string", source=source, field=field)
        if hardware not in self._names:
            try:
                self._names[hardware] = system_id(hardware, field=field)
            except ConfigError as exc:
                raise ConfigError(f"unknown system {hardware!r}", source=source, field=field,
                                  expected=exc.expected) from None
            self._load.setdefault(self._names[hardware], hardware)
        return self._names[hardware]

    def get(self, hardware: str):
        from perfcast.evidence.factory import build_resolver
        from perfcast.evidence.chain import evidence_providers
        from perfcast.hardware import load_system

        hit = self._by_system.get(hardware)
        if hit is None:
            system = load_system(self._load.get(hardware, hardware))
            hit = self._by_system[hardware] = build_resolver(
                system, evidence=evidence_providers([self.db], system, self.policy))
            if hardware not in self.held:
                print(f"note: {self.ref} holds evidence for {', '.join(self.held) or 'no system'}"
                      f", not {hardware}: queries for {hardware} are answered without it",
                      file=sys.stderr)
        return hit


def query_resolvers(ref: str, hardware: Optional[str], policy: str, store):
    """(the resolvers over `ref`'s evidence, the system a query without "hardware" asks
    about: `hardware`, else the one system the evidence holds)."""
    from perfcast.evidence.store import open_evidence

    db = open_evidence(ref, hardware=_system(hardware, "--hardware") if hardware else None,
                       store=store)
    resolvers = _Resolvers(db, policy, ref)
    hw = resolvers.name(hardware, field="--hardware") if hardware else None
    if hw is None:
        if len(resolvers.held) != 1:
            raise ConfigError(f"{ref} holds evidence for {resolvers.held}; say which system "
                              "to query", field="--hardware", expected="a catalog id")
        hw = resolvers.held[0]
    return resolvers, hw


def query_record(resolvers: _Resolvers, hardware: str, spec: dict, *,
                 source: str = "command line") -> dict:
    """`perfcast evidence query --format json` of one query spec (the fields a `--queries`
    line holds; `hardware` fills a spec that names none)."""
    from perfcast.evidence.chain import resolution_json
    from perfcast.evidence.query_spec import build_query

    return resolution_json(resolvers.get(hardware).resolve(
        build_query(spec, source=source, default_hardware=hardware)))


@app.command("query")
def query_command(
    ref: Annotated[str, typer.Argument(help="snapshot digest/prefix, saved database folder or "
                                            "AIConfigurator folder")],
    hardware: Annotated[Optional[str], typer.Option(
        help="catalog id (default: the one system the evidence holds); with --queries, "
             "for lines without \"hardware\"")] = None,
    operation: Annotated[str, typer.Option(help="gemm | attention | all_reduce | ...")] = "",
    dtype: Annotated[Optional[str], typer.Option(help="compute dtype (default bf16)")] = None,
    runtime: Annotated[str, typer.Option(help="vllm | sglang | trtllm | ...")] = "",
    runtime_version: Annotated[str, typer.Option("--runtime-version")] = "",
    implementation: Annotated[str, typer.Option(help="kernel / implementation name")] = "",
    dim: Annotated[Optional[list[str]], typer.Option("--dim", help="NAME=VALUE (repeat)")] = None,
    policy: Annotated[str, typer.Option(help="exact | interpolate | extrapolate")] = "interpolate",
    queries: Annotated[Optional[Path], typer.Option(
        "--queries", help="JSONL file: one query per line; the flags above fill the fields "
                          "a line leaves out")] = None,
    store: StoreOpt = None,
    output_format: Annotated[Fmt, typer.Option("--format")] = Fmt.json,
) -> None:
    """Resolve queries through database -> interpolation -> roofline/collective model."""
    from perfcast.evidence.chain import batch_gc, resolution_json
    from perfcast.evidence.query_spec import build_query, check_dims, parse_dim

    with user_errors():
        defaults: dict = {k: v for k, v in (
            ("operation", operation), ("dtype", dtype), ("runtime", runtime),
            ("runtime_version", runtime_version), ("implementation", implementation)) if v}
        flag_dims = dict(parse_dim(d) for d in dim or [])
        check_dims(flag_dims, source="command line", prefix="--dim ")
        resolvers, hw = query_resolvers(ref, hardware, policy, _store(store))
        if queries is None:
            if not operation:
                raise ConfigError("state --operation (or give --queries FILE.jsonl)",
                                  field="--operation")
            out = query_record(resolvers, hw, {**defaults, "dims": flag_dims},
                               source="command line")
            if output_format is Fmt.json:
                typer.echo(json.dumps(out, indent=1))
            else:
                typer.echo(f"{out['latency_s'] * 1e6:.3f} us  {out['method']}  "
                           f"{out['provider']}  confidence {out['confidence']:.2f}")
                for a in out["attempts"]:
                    typer.echo(f"  {a['provider']}: {a['outcome']} {a['reason']}")
            return
        try:
            lines = queries.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror or exc}", source=str(queries)) \
                from None
    failures, blank = 0, []
    with batch_gc():
        for i, line in enumerate(lines, 1):
            if not line.strip():
                blank.append(i)
                continue
            where = f"{queries}:{i}"
            try:
                spec = json.loads(line)
                if not isinstance(spec, dict):
                    raise ConfigError("expected a JSON object", source=where)
                spec = {**defaults, **spec, "dims": {**flag_dims, **(spec.get("dims") or {})}}
                line_hw = resolvers.name(spec["hardware"], source=where) \
                    if "hardware" in spec else hw
                res = resolvers.get(line_hw).resolve(
                    build_query({**spec, "hardware": line_hw}, source=where))
                out = {"line": i, **resolution_json(res)}
            except (PerfcastError, json.JSONDecodeError, TypeError, ValueError) as exc:
                failures += 1
                out = {"line": i, "error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
    if blank:
        print(f"note: {queries}: skipped {len(blank)} blank line(s): "
              + ", ".join(map(str, blank[:20])) + (" ..." if len(blank) > 20 else ""),
              file=sys.stderr)
    if failures:
        print(f"error: {queries}: {failures} of {len(lines) - len(blank)} queries failed "
              "(their lines carry \"error\")", file=sys.stderr)
        raise typer.Exit(1)
