"""The JSON API under /api. Request bodies are the commands' options (by their Python
names); responses are the records `--format json` prints, built by the same functions
(`perfcast.cli.*.run_*` / `*_record`). Bad input: 422 (a field of the wrong type, from
FastAPI) or 400 naming the field (a PerfcastError); never a 500."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Optional

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from perfcast.cli.estimate import EstimateArgs, estimate_record, run_estimate
from perfcast.cli.search import SearchArgs
from perfcast.cli.serve import ServeArgs, run_serve
from perfcast.cli.validate import ValidateArgs
from perfcast.core.errors import ConfigError, PerfcastError
from perfcast.workbench.jobs import JobManager, error_json
from perfcast.workbench.state import Workbench


class QueryBody(BaseModel):
    """One `perfcast evidence query` (the fields of a `--queries` line, plus the policy)."""
    model_config = ConfigDict(extra="forbid")
    operation: str
    hardware: Optional[str] = None
    dtype: Optional[str] = None
    runtime: Optional[str] = None
    runtime_version: Optional[str] = None
    implementation: Optional[str] = None
    implementations: Optional[dict[str, str]] = None
    engine: Optional[str] = None
    dims: dict[str, Any] = {}
    policy: str = "interpolate"

    def spec(self) -> dict:
        return {k: v for k, v in self.model_dump().items()
                if v is not None and k not in ("policy", "hardware")}


def install_error_handler(app: FastAPI) -> None:
    async def perfcast_error(request: Request, exc: PerfcastError):
        return JSONResponse(status_code=400, content={"detail": error_json(exc)})

    app.add_exception_handler(PerfcastError, perfcast_error)


def estimate_args(wb: Workbench, args: EstimateArgs) -> EstimateArgs:
    """The request's arguments as the server runs them: its evidence store; no file
    written (`export_empirical_metrics` is refused)."""
    if args.export_empirical_metrics:
        raise ConfigError("the workbench writes no files", field="export_empirical_metrics",
                          expected="null (use the CLI to export the metrics)")
    return replace(args, store=str(wb.evidence_store().root))


def estimate_trace(wb: Workbench, args: EstimateArgs) -> dict:
    """The Chrome trace `estimate --chrome-trace` writes for `args` (first model)."""
    from perfcast.report.chrome_trace import write_chrome_trace

    run = run_estimate(replace(estimate_args(wb, args), full_timeline=True))
    result = next(iter(run.results.values()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        write_chrome_trace(result, path)
        return json.loads(path.read_text(encoding="utf-8"))


def check_search(args: SearchArgs) -> SearchArgs:
    """The checks `run_search` makes before simulating, made here so a bad request is a
    400 and not a failed job; the job runs in one process (executor inline) so that
    cancelling it ends all its work."""
    from perfcast.cli.search import _ints

    for flag, text in (("--concurrency", args.concurrency), ("--tp-sizes", args.tp_sizes),
                       ("--dp-sizes", args.dp_sizes)):
        _ints(text, flag)
    if args.ep_sizes is not None:
        _ints(args.ep_sizes, "--ep-sizes")
    if args.slo_percentile not in (None, 50, 90, 99):
        raise ConfigError(f"has value {args.slo_percentile}", field="--slo-percentile",
                          expected="50, 90 or 99 (default: the mean)")
    from perfcast.hardware import load_system
    from perfcast.serving.backends import load_backend
    from perfcast.workload import load_model_spec

    load_model_spec(args.model)
    load_system(args.device)
    load_backend(args.backend)
    return replace(args, executor="inline", workers=0)


def build_router(wb: Workbench, jobs: JobManager) -> APIRouter:
    r = APIRouter(prefix="/api")

    @r.post("/estimate", summary="perfcast estimate --format json")
    def estimate(args: EstimateArgs) -> dict:
        return estimate_record(run_estimate(estimate_args(wb, args)))

    @r.post("/estimate/trace", summary="the Chrome trace of perfcast estimate --chrome-trace")
    def trace(args: EstimateArgs) -> dict:
        return estimate_trace(wb, args)

    @r.post("/serve", summary="perfcast serve --format json")
    def serve(args: ServeArgs) -> dict:
        return run_serve(args)[0]

    @r.post("/search", status_code=202, summary="start perfcast search (a job)")
    def search(args: SearchArgs) -> dict:
        return jobs.submit("search", asdict(check_search(args))).status(False)

    @r.post("/validate", status_code=202, summary="start perfcast validate silicon (a job)")
    def validate(args: ValidateArgs) -> dict:
        from perfcast.cli.validate import silicon_rows

        silicon_rows(args)
        return jobs.submit("validate", asdict(args)).status(False)

    @r.get("/jobs", summary="every job: state and progress")
    def job_list() -> list[dict]:
        return [j.status(False) for j in jobs.list()]

    @r.get("/jobs/{job_id}", summary="a job: state, progress and, when done, its record")
    def job(job_id: str) -> dict:
        j = jobs.get(job_id)
        if j is None:
            raise HTTPException(404, detail={"error": f"no job {job_id!r}", "field": "job_id"})
        return j.status()

    @r.post("/jobs/{job_id}/cancel", summary="cancel a running job")
    def cancel(job_id: str) -> dict:
        j = jobs.cancel(job_id)
        if j is None:
            raise HTTPException(404, detail={"error": f"no job {job_id!r}", "field": "job_id"})
        return j.status(False)

    @r.get("/evidence", summary="perfcast evidence list --format json")
    def evidence_list() -> list[dict]:
        from perfcast.cli.evidence import list_record

        return list_record(wb.evidence_store().list())

    @r.get("/evidence/{ref}", summary="perfcast evidence show --format json")
    def evidence_show(ref: str) -> dict:
        return wb.evidence_store().manifest(ref)

    @r.get("/evidence/{ref}/coverage", summary="perfcast evidence coverage --format json")
    def evidence_coverage(ref: str, hardware: Optional[str] = None) -> list[dict]:
        from perfcast.cli.evidence import coverage_record

        return coverage_record(wb.evidence_store().resolve(ref), hardware, wb.evidence_store())

    @r.post("/evidence/{ref}/query", summary="perfcast evidence query --format json")
    def evidence_query(ref: str, body: QueryBody) -> dict:
        from perfcast.cli.evidence import query_record

        resolvers, hw = wb.query_resolvers(ref, body.hardware, body.policy)
        return query_record(resolvers, hw, body.spec(), source="request body")

    @r.get("/observations", summary="perfcast observe list --format json")
    def observations() -> list[dict]:
        return wb.observation_store().list()

    @r.get("/observations/{ref}", summary="perfcast observe show --format json")
    def observation(ref: str) -> dict:
        from perfcast.cli.observe import show_record

        return show_record(wb.observation_store().get(ref))

    @r.get("/calibrations", summary="perfcast calibrate list --format json")
    def calibrations() -> list[dict]:
        from perfcast.cli.calibrate import list_record

        return list_record(wb.calibration_root)

    @r.get("/calibrations/{ref}", summary="perfcast calibrate show --format json")
    def calibration(ref: str) -> dict:
        from perfcast.calibrate.store import load_calibration

        if ref == "none":
            raise ConfigError("`none` is no revision (physics only)", field="ref")
        return load_calibration(ref, store=wb.calibration_store()).to_json()

    @r.get("/evidence/{ref}/curves", summary="workbench: the kernel curves of a family")
    def curves(ref: str, operation: str, dtype: str = "bf16") -> list[dict]:
        from perfcast.workbench.evidence_views import CURVE_FAMILIES, series

        if operation not in CURVE_FAMILIES:
            raise ConfigError(f"no kernel curves for {operation!r}", field="operation",
                              expected=" | ".join(CURVE_FAMILIES))
        return series(wb.database(ref)[1], operation, dtype)

    return r
