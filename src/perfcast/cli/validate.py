"""`perfcast validate silicon FILE`: predicted vs measured TTFT/TPOT per deployment row."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from perfcast.cli.calibration_option import CalibrationOption, all_overheads, analytic_for
from perfcast.cli.calibration_option import load as load_calibration
from perfcast.cli.errors import check_output_paths, user_errors
from perfcast.cli.progress import progress_bar
from perfcast.cli.serving_options import StackOption
from perfcast.core.errors import ConfigError

app = typer.Typer(no_args_is_help=True, help="Compare predictions with measured deployments.")

CSV_COLUMNS = ("id", "system", "model_path", "backend", "backend_version", "mode", "isl", "osl",
               "concurrency", "silicon_ttft_ms", "silicon_tpot_ms", "pred_ttft_ms",
               "pred_tpot_ms", "ttft_ape", "tpot_ape", "reason", "assumptions")


class Format(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def rows_csv(results) -> str:
    from perfcast.serving.silicon import ape

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in results:
        ok = r.predicted
        w.writerow([r.row_id, r.system, r.model, r.backend, r.backend_version, r.mode,
                    r.isl or "", r.osl or "", r.concurrency or "", _fmt(r.measured_ttft_ms),
                    _fmt(r.measured_tpot_ms), _fmt(r.pred_ttft_ms), _fmt(r.pred_tpot_ms),
                    _fmt(ape(r.pred_ttft_ms, r.measured_ttft_ms)) if ok else "",
                    _fmt(ape(r.pred_tpot_ms, r.measured_tpot_ms)) if ok else "",
                    r.reason, "; ".join(r.assumptions)])
    return buf.getvalue()


@dataclass(frozen=True)
class ValidateArgs:
    """The inputs of one `perfcast validate silicon` (paths as strings), shared by the CLI
    and the workbench API."""
    file: str
    evidence_root: Optional[str] = None
    evidence_versions: str = "set"
    model_configs: Optional[str] = None
    mode: Optional[str] = None
    statistic: str = "mean"
    calibration: str = "default"
    stack: str = "auto"
    # a harness YAML file: the benchmark client of the file's rows (`load_harness`)
    harness: Optional[str] = None
    # local processes that simulate the rows (0: one per CPU, 1: this process)
    workers: int = 1


def silicon_rows(a: ValidateArgs) -> list[dict]:
    """The rows of the file `a` names (of `a.mode` only, when given)."""
    from perfcast.serving.silicon import read_rows

    file = Path(a.file)
    if not file.is_file():
        raise ConfigError("does not exist" if not file.exists() else "is not a file",
                          source=str(file), expected="a silicon-sample CSV")
    rows = read_rows(file)
    if a.mode:
        rows = [r for r in rows if (r.get("mode") or "").strip() == a.mode]
    return rows


def run_validate(a: ValidateArgs, rows: list[dict], progress=None):
    """(the `perfcast validate silicon --format json` document, the row results) of the
    rows of `a`; `progress(done, total)` as rows finish. With `a.workers` other than 1 the
    rows are simulated in local processes (tasks: `deployment_groups`); the results do not
    depend on it."""
    from perfcast.serving.silicon import summarize, summarize_by_mode, validate_rows

    if a.workers < 0:
        raise ConfigError(f"workers must be >= 0, got {a.workers}", field="--workers",
                          expected="a number of processes (0: one per CPU, 1: this process)")
    # a row's default id is its position in the file, whichever task simulates it
    rows = [r if "id" in r else {**r, "id": f"row{i + 1}"} for i, r in enumerate(rows)]
    revision = load_calibration(a.calibration)   # an unknown revision fails here, once
    harness = _harness(a)                          # and a bad harness file
    groups = deployment_groups(rows)
    n = a.workers or (os.cpu_count() or 1)
    n = min(n, len(groups))
    if n <= 1:
        results = validate_rows(rows, progress=progress, **_validate_inputs(a, revision))
    else:
        from perfcast.core.executor import map_tasks

        done = [0]

        def group_done(i: int) -> None:
            done[0] += len(groups[i])
            if progress:
                progress(done[0], len(rows))

        parts = map_tasks(_validate_task, [(a, [rows[j] for j in g]) for g in groups],
                          "local", n, group_done,
                          affinity=[_evidence_key(rows[g[0]]) for g in groups],
                          weights=[_task_weight(rows, g) for g in groups])
        results = [None] * len(rows)
        for g, part in zip(groups, parts):
            for j, res in zip(g, part):
                results[j] = res
    attach_bands(results, revision)
    doc = {"rows": [r.__dict__ for r in results], "summary": summarize(results),
           "summary_by_mode": summarize_by_mode(results),
           "calibration": revision.digest if revision else "none", "stack": a.stack,
           "harness": harness or "rules"}
    return doc, results


def attach_bands(results, revision) -> None:
    """Each predicted agg row's held-out error band from `revision` (the bands were
    fitted on agg rows; disagg rows get none)."""
    from perfcast.calibrate.prediction_error import band_json, prediction_band

    bands: dict[str, object] = {}
    for r in results:
        if not r.predicted or r.mode.strip() != "agg":
            continue
        backend = r.backend.strip()
        if backend not in bands:
            bands[backend] = prediction_band(revision, backend)
        r.prediction_band = band_json(bands[backend], r.pred_ttft_ms, r.pred_tpot_ms)


def _harness(a: ValidateArgs) -> dict | None:
    """The client settings of `a.harness` (None: the rules' harness)."""
    if not a.harness:
        return None
    from perfcast.serving.silicon import load_harness

    return load_harness(Path(a.harness))


def deployment_groups(rows: list[dict]) -> list[list[int]]:
    """Row indices per task: each disaggregated row alone, first (one such row simulates
    two engines and costs as much CPU as tens of agg rows), then the agg rows by
    deployment (system, backend, backend version: the rows that share evidence), the
    groups with the most rows first. So the tasks that start last are short."""
    by_key: dict[tuple[str, str, str], list[int]] = {}
    disagg: list[list[int]] = []
    for i, r in enumerate(rows):
        if (r.get("mode") or "").strip() == "disagg":
            disagg.append([i])
            continue
        key = tuple((r.get(k) or "").strip() for k in ("system", "backend", "backend_version"))
        by_key.setdefault(key, []).append(i)
    return disagg + sorted(by_key.values(), key=len, reverse=True)


def _evidence_key(row: dict) -> tuple[str, str]:
    """The evidence a row's task loads (system, backend): tasks that share it run in one
    process as far as the balance allows, so each process imports fewer tables."""
    return tuple((row.get(k) or "").strip() for k in ("system", "backend"))


def _task_weight(rows: list[dict], group: list[int]) -> float:
    """A task's expected cost, for the first split of tasks between processes only (the
    processes then take work from each other): one per agg row, two per disaggregated
    row (two engines)."""
    return float(sum(2 if (rows[j].get("mode") or "").strip() == "disagg" else 1
                     for j in group))


# one worker process's inputs, built at its first task and kept for the next ones
_WORKER_INPUTS: dict[ValidateArgs, dict] = {}


def _validate_inputs(a: ValidateArgs, revision) -> dict:
    """validate_rows' keyword arguments for `a` and its calibration revision: evidence
    loader, calibrated overheads and analytic providers, and one step-graph cache."""
    from perfcast.serving.silicon import StepModelCache

    evidence_for = None
    if a.evidence_root:
        from perfcast.serving.evidence import evidence_loader

        evidence_for = evidence_loader(Path(a.evidence_root), versions=a.evidence_versions)
    return {"configs_dir": Path(a.model_configs) if a.model_configs else None,
            "evidence_for": evidence_for, "statistic": a.statistic,
            "overheads": all_overheads(revision), "analytic_for": analytic_for(revision),
            "stack": a.stack, "cache": StepModelCache(), "harness": _harness(a)}


def _validate_task(task: tuple[ValidateArgs, list[dict]]) -> list:
    """One deployment's rows, in a worker process (its inputs kept across tasks)."""
    from perfcast.serving.silicon import validate_rows

    a, rows = task
    inputs = _WORKER_INPUTS.get(a)
    if inputs is None:
        inputs = _WORKER_INPUTS[a] = _validate_inputs(a, load_calibration(a.calibration))
    return validate_rows(rows, **inputs)


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def summary_table(title: str, groups: list[dict]) -> Table:
    """One mode's summary groups; disagg groups add the coverage of the rows that record
    worker counts (`cov. w/ counts`), groups with error bands the share of measurements
    inside them (`TTFT in band`, `TPOT in band`)."""
    counted = any("rows_with_worker_counts" in g for g in groups)
    banded = any("ttft_band_coverage" in g for g in groups)
    table = Table(title=title)
    cols = ["system", "model", "backend", "rows", "coverage"]
    if counted:
        cols += ["rows w/ counts", "cov. w/ counts"]
    cols += ["TTFT MAPE", "TTFT medAPE", "TPOT MAPE", "TPOT medAPE"]
    if banded:
        cols += ["TTFT in band", "TPOT in band"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("system", "model", "backend")
                         else "right", overflow="fold")
    for g in groups:
        cells = [g["system"], g["model"], g["backend"], str(g["rows"]), _pct(g["coverage"])]
        if counted:
            cells += [str(g.get("rows_with_worker_counts", "")),
                      _pct(g.get("coverage_with_worker_counts"))]
        cells += [_pct(g["ttft_mape"]), _pct(g["ttft_median_ape"]), _pct(g["tpot_mape"]),
                  _pct(g["tpot_median_ape"])]
        if banded:
            cells += [_pct(g.get("ttft_band_coverage")), _pct(g.get("tpot_band_coverage"))]
        table.add_row(*cells)
    return table


@app.command("silicon")
def silicon_command(
    file: Annotated[Path, typer.Argument(help="silicon-sample CSV (AIConfigurator layout)")],
    evidence_root: Annotated[Optional[Path], typer.Option(
        "--evidence-root", help="measured kernels laid out as <system>/<family>/<framework>/"
        "<version>/*.parquet; without it every cost is analytic")] = None,
    evidence_versions: Annotated[str, typer.Option(
        "--evidence-versions", help="set: every family at the GEMM tables' collected version "
        "(one collection); family: each family at its own nearest version")] = "set",
    model_configs: Annotated[Optional[Path], typer.Option(
        "--model-configs", help="folder of org--name_config.json files (default: built-in catalog)")] = None,
    output_format: Annotated[Format, typer.Option("--format", help="table | csv | json")] = Format.table,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write here instead of stdout")] = None,
    mode: Annotated[Optional[str], typer.Option(help="only rows of this mode (agg | disagg)")] = None,
    show_rows: Annotated[bool, typer.Option("--rows/--no-rows", help="table format: list every "
                                            "row before the summary")] = True,
    statistic: Annotated[str, typer.Option(help="per-request aggregate compared with the row: "
                                           "mean | p50 (the file does not say which)")] = "mean",
    calibration: CalibrationOption = "default",
    stack: StackOption = "auto",
    workers: Annotated[int, typer.Option(
        "--workers", help="local processes simulating the rows, one deployment (system, "
        "backend, version) at a time (0: one per CPU; 1: this process)")] = 0,
    harness: Annotated[Optional[Path], typer.Option(
        "--harness", help="YAML describing the benchmark client of the file's rows when it "
        "is not the built-in harness: source (required), range_ratio, "
        "prompts_per_concurrency; applied to every row alike")] = None,
) -> None:
    """Simulate every row and print predicted vs measured TTFT/TPOT, MAPE and coverage."""
    with user_errors():
        check_output_paths(output=output)
        args = ValidateArgs(file=str(file),
                            evidence_root=str(evidence_root) if evidence_root else None,
                            evidence_versions=evidence_versions,
                            model_configs=str(model_configs) if model_configs else None,
                            mode=mode, statistic=statistic, calibration=calibration,
                            stack=stack, workers=workers,
                            harness=str(harness) if harness else None)
        rows = silicon_rows(args)
        with progress_bar("simulating rows", len(rows)) as advance:
            doc, results = run_validate(args, rows, progress=advance)
        if output_format is Format.csv:
            text = rows_csv(results)
        elif output_format is Format.json:
            text = json.dumps(doc, indent=2)
        else:
            text = None
        if text is not None:
            if output:
                output.write_text(text, encoding="utf-8")
            else:
                sys.stdout.write(text)
            return
        # a file gets every column at full width; a terminal or pipe its own width
        console = Console(file=open(output, "w", encoding="utf-8") if output else None,
                          width=200 if output else None)
        if show_rows:
            rows_table = Table(title="per row: predicted vs measured (ms)")
            for col in ("id", "C", "TTFT meas", "TTFT pred", "TPOT meas", "TPOT pred", "reason"):
                rows_table.add_column(col, justify="left" if col in ("id", "reason") else "right",
                                      overflow="fold")
            for r in results:
                rows_table.add_row(r.row_id, str(r.concurrency or ""), _num(r.measured_ttft_ms),
                                   _num(r.pred_ttft_ms), _num(r.measured_tpot_ms),
                                   _num(r.pred_tpot_ms), r.reason)
            console.print(rows_table)
        for mode_name, groups in doc["summary_by_mode"].items():
            console.print(summary_table(f"silicon validation: {file.name}, {mode_name} rows",
                                        groups))
        reasons: dict[str, int] = {}
        for r in results:
            if r.reason:
                reasons[r.reason] = reasons.get(r.reason, 0) + 1
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            console.print(f"{n:5d} not predicted: {reason}")
