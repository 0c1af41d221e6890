"""`perfcast serve MODEL`: simulate one serving deployment and report TTFT/TPOT/throughput."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from perfcast.cli.calibration_option import (CalibrationOption, analytic_for, backend_overheads,
                                             held_out_error)
from perfcast.cli.calibration_option import load as load_calibration
from perfcast.cli.errors import user_errors
from perfcast.cli.estimate import build_plan
from perfcast.core.errors import ConfigError

METRIC_ROWS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "frontend_queue_ms")


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


def serve_command(
    model: Annotated[str, typer.Argument(help="config.json path, folder or built-in id")],
    device: Annotated[str, typer.Option(help="catalog id or a system YAML path")] = "h100_sxm",
    backend: Annotated[str, typer.Option(help="vllm | sglang | trtllm or a backend YAML")] = "vllm",
    backend_version: Annotated[str, typer.Option("--backend-version",
                                                 help="runtime version (selects evidence)")] = "",
    tp_size: Annotated[int, typer.Option("--tp-size")] = 1,
    pp_size: Annotated[int, typer.Option("--pp-size")] = 1,
    dp_size: Annotated[int, typer.Option("--dp-size", help="attention data-parallel ranks")] = 1,
    ep_size: Annotated[int, typer.Option("--ep-size")] = 1,
    moe_tp_size: Annotated[int, typer.Option("--moe-tp-size")] = 0,
    quantize_linear_action: Annotated[Optional[str], typer.Option(
        "--quantize-linear-action", help="FP8 | FP8_BLOCK | NVFP4 | W4A16 | ... "
        "(default: the checkpoint's quantisation)")] = None,
    kv_cache_dtype: Annotated[Optional[str], typer.Option("--kv-cache-dtype")] = None,
    isl: Annotated[int, typer.Option(help="input tokens per request")] = 1024,
    osl: Annotated[int, typer.Option(help="output tokens per request")] = 128,
    range_ratio: Annotated[float, typer.Option("--range-ratio", help="lengths uniform in "
                                               "[ratio x len, len]; 1 = fixed")] = 1.0,
    concurrency: Annotated[int, typer.Option(help="closed-loop clients (0: open loop)")] = 8,
    request_rate: Annotated[float, typer.Option("--request-rate", help="open-loop Poisson "
                                                "arrivals per second")] = 0.0,
    arrival_trace: Annotated[Optional[Path], typer.Option("--arrival-trace", help="open loop: "
                             "a text file with one arrival time (seconds) per line")] = None,
    num_requests: Annotated[int, typer.Option("--num-requests", help="default 10 x "
                                              "concurrency (closed) or 200 (open)")] = 0,
    warmup_requests: Annotated[int, typer.Option("--warmup-requests")] = 0,
    seed: Annotated[int, typer.Option()] = 0,
    policy: Annotated[Optional[str], typer.Option(help="decode_first | prefill_first | inflight")] = None,
    token_budget: Annotated[Optional[int], typer.Option("--token-budget")] = None,
    max_running_requests: Annotated[Optional[int], typer.Option("--max-running-requests")] = None,
    chunked_prefill: Annotated[Optional[bool], typer.Option("--chunked-prefill/--no-chunked-prefill")] = None,
    mode: Annotated[str, typer.Option(help="agg | disagg")] = "agg",
    workers: Annotated[int, typer.Option("--workers", help="agg replicas or prefill workers")] = 1,
    decode_workers: Annotated[int, typer.Option("--decode-workers")] = 1,
    decode_tp_size: Annotated[int, typer.Option("--decode-tp-size", help="0: as --tp-size")] = 0,
    decode_dp_size: Annotated[int, typer.Option("--decode-dp-size", help="0: as --dp-size")] = 0,
    decode_ep_size: Annotated[int, typer.Option("--decode-ep-size", help="0: as --ep-size")] = 0,
    evidence_root: Annotated[Optional[Path], typer.Option("--evidence-root", help="AIConfigurator-"
                                                          "layout folder of measured kernels")] = None,
    exact: Annotated[bool, typer.Option("--exact", help="cost every step shape exactly "
                                        "(no interpolation between grid nodes)")] = False,
    output_format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    chrome_trace: Annotated[Optional[Path], typer.Option("--chrome-trace", help="write engine "
                                                         "iterations as a Chrome trace")] = None,
    calibration: CalibrationOption = "default",
) -> None:
    """Simulate clients against one engine configuration and report request metrics."""
    from perfcast.serving.backends import load_backend
    from perfcast.serving.deploy import Pool, ServeConfig, run_serving
    from perfcast.workload import load_model_spec
    from perfcast.workload.quant import precision_for_model

    with user_errors():
        spec = load_model_spec(model)
        plan = build_plan(tp_size, pp_size, dp_size, ep_size, moe_tp_size, 0)
        precision = precision_for_model(spec, linear_action=quantize_linear_action,
                                        kv_cache_dtype=kv_cache_dtype)
        revision = load_calibration(calibration)
        bk = load_backend(backend)
        bk = bk.with_overheads(**backend_overheads(revision, bk.name)).with_scheduler(
            policy=policy, token_budget=token_budget, max_running_requests=max_running_requests,
            chunked_prefill=chunked_prefill)
        arrivals = _read_trace(arrival_trace) if arrival_trace else None
        if arrivals:
            concurrency, request_rate = 0, 0.0
        if concurrency <= 0 and request_rate <= 0 and not arrivals:
            raise ConfigError("neither clients nor an arrival rate", field="--concurrency",
                              expected="--concurrency > 0 or --request-rate > 0")
        decode_pool = None
        if mode == "disagg":
            dplan = build_plan(decode_tp_size or tp_size, pp_size, decode_dp_size or dp_size,
                               decode_ep_size or ep_size, 0, 0)
            decode_pool = Pool(dplan, decode_workers)
        cfg = ServeConfig(model=spec, system=device, backend=bk, backend_version=backend_version,
                          precision=precision, mode=mode, pool=Pool(plan, workers),
                          decode_pool=decode_pool, isl=isl, osl=osl, range_ratio=range_ratio,
                          concurrency=concurrency or None,
                          request_rate_per_s=request_rate or None,
                          arrival_times_s=tuple(arrivals) if arrivals else None,
                          num_requests=num_requests or None, warmup_requests=warmup_requests,
                          seed=seed, interpolate=not exact, record_trace=chrome_trace is not None)
        providers, context = (), None
        if evidence_root:
            from perfcast.hardware import load_system
            from perfcast.serving.evidence import evidence_loader

            ev = evidence_loader(evidence_root)(load_system(device).name, bk.name,
                                                backend_version)
            providers, context = ev.providers, (ev.context if ev.providers else None)
            if ev.note:
                typer.echo(f"note: {ev.note}", err=True)
        from perfcast.hardware import load_system as _load_system
        calibrated = (analytic_for(revision) or (lambda _: []))(_load_system(device).name)
        result = run_serving(cfg, evidence=(*providers, *calibrated), evidence_context=context)
        if chrome_trace:
            from perfcast.serving.trace import write_iteration_trace

            write_iteration_trace(result.engines, chrome_trace)
        metrics = result.metrics.to_json()
        metrics["calibration"] = revision.digest if revision is not None else "none"
        metrics["calibration_held_out_error"] = held_out_error(revision)
        if output_format is OutputFormat.json:
            typer.echo(json.dumps(metrics, indent=2))
            return
        _print_table(metrics, Console())


def _read_trace(path: Path) -> list[float]:
    times = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            times.append(float(text.split(",")[0]))
        except ValueError:
            raise ConfigError(f"line {i}: {text!r} is not a time in seconds", source=str(path),
                              field="--arrival-trace", expected="one number per line") from None
    if not times:
        raise ConfigError("holds no arrival times", source=str(path), field="--arrival-trace")
    return times


def _print_table(metrics: dict, console: Console) -> None:
    table = Table(title="request latency (ms)")
    table.add_column("metric")
    for k in ("mean", "p50", "p90", "p99"):
        table.add_column(k, justify="right")
    for row in METRIC_ROWS:
        stats = metrics[row]
        table.add_row(row, *("-" if stats[k] is None else f"{stats[k]:.2f}"
                             for k in ("mean", "p50", "p90", "p99")))
    console.print(table)
    for key in ("throughput_tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
                "request_throughput_per_s", "completed_requests", "rejected_requests",
                "preemptions", "kv_utilization_mean", "kv_utilization_peak", "num_gpus"):
        value = metrics[key]
        console.print(f"{key:28s} {value:.3f}" if isinstance(value, float)
                      else f"{key:28s} {value}")
    console.print(f"{'calibration':28s} {metrics['calibration']}")
    for scheme, err in (metrics.get("calibration_held_out_error") or {}).items():
        console.print(f"  held-out error ({scheme}): TTFT MAPE {100 * err['ttft_mape']:.1f}%, "
                      f"TPOT MAPE {100 * err['tpot_mape']:.1f}% over {err['rows']} rows")
