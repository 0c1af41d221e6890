"""`perfcast serve MODEL`: simulate one serving deployment and report TTFT/TPOT/throughput."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from perfcast.cli.calibration_option import (CalibrationOption, analytic_for, backend_overheads,
                                             held_out_error)
from perfcast.cli.calibration_option import load as load_calibration
from perfcast.cli.errors import check_output_paths, user_errors
from perfcast.cli.layout import build_plan
from perfcast.cli.serving_options import (AcceptanceOption, DraftModelOption,
                                           NumSpeculativeTokensOption, SpeculativeOption,
                                           StackOption)
from perfcast.core.errors import ConfigError
from perfcast.serving.limits import MAX_SIMULATED_REQUESTS, check_request_count

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
    concurrency: Annotated[Optional[int], typer.Option(
        help="closed-loop clients (default 8; not with --request-rate / --arrival-trace)")] = None,
    request_rate: Annotated[Optional[float], typer.Option(
        "--request-rate", help="open loop: Poisson arrivals per second")] = None,
    arrival_trace: Annotated[Optional[Path], typer.Option("--arrival-trace", help="open loop: "
                             "a text file with one arrival time (seconds) per line")] = None,
    trace: Annotated[Optional[Path], typer.Option("--trace", help="replay a request trace "
                     "(arrival times and lengths): Mooncake JSONL, Azure LLM inference CSV, "
                     "BurstGPT CSV or timestamp/input_length/output_length")] = None,
    prefix_cache_hit_rate: Annotated[Optional[float], typer.Option(
        "--prefix-cache-hit-rate", help="fraction of each prompt found in the prefix cache "
        "(default: from the trace's hash_ids, else no prefix caching)")] = None,
    num_requests: Annotated[int, typer.Option("--num-requests", help="default 10 x "
                                              "concurrency (closed) or 200 (open)")] = 0,
    warmup_requests: Annotated[int, typer.Option("--warmup-requests")] = 0,
    seed: Annotated[int, typer.Option()] = 0,
    policy: Annotated[Optional[str], typer.Option(help="decode_first | prefill_first | inflight")] = None,
    token_budget: Annotated[Optional[int], typer.Option("--token-budget")] = None,
    max_running_requests: Annotated[Optional[int], typer.Option("--max-running-requests")] = None,
    chunked_prefill: Annotated[Optional[bool], typer.Option("--chunked-prefill/--no-chunked-prefill")] = None,
    speculative: SpeculativeOption = None,
    num_speculative_tokens: NumSpeculativeTokensOption = 0,
    acceptance: AcceptanceOption = None,
    draft_model: DraftModelOption = None,
    stack: StackOption = "auto",
    schedule_conservativeness: Annotated[Optional[float], typer.Option(
        "--schedule-conservativeness", help="prefill_first (SGLang): reserve running requests' "
        "future decode tokens when admitting (SGLang's default 1.0; 0 off)")] = None,
    enable_mixed_chunk: Annotated[Optional[bool], typer.Option(
        "--enable-mixed-chunk/--no-enable-mixed-chunk", help="prefill_first (SGLang): decodes "
        "run in the same batch as a prefill chunk")] = None,
    capacity_scheduler_policy: Annotated[Optional[str], typer.Option(
        "--capacity-scheduler-policy", help="inflight (TRT-LLM): GUARANTEED_NO_EVICT (KV for the "
        "whole output reserved at admission) | MAX_UTILIZATION (allocate per step, pause the "
        "newest request when short)")] = None,
    attention_dp_balance: Annotated[Optional[bool], typer.Option(
        "--attention-dp-balance/--no-attention-dp-balance", help="inflight (TRT-LLM) with "
        "--dp-size > 1: hold context requests until every attention-DP rank has one "
        "(attention_dp_config.enable_balance)")] = None,
    mode: Annotated[str, typer.Option(help="agg | disagg")] = "agg",
    workers: Annotated[int, typer.Option("--workers", help="agg replicas or prefill workers")] = 1,
    decode_workers: Annotated[int, typer.Option("--decode-workers")] = 1,
    decode_tp_size: Annotated[int, typer.Option("--decode-tp-size", help="0: as --tp-size")] = 0,
    decode_dp_size: Annotated[int, typer.Option("--decode-dp-size", help="0: as --dp-size")] = 0,
    decode_ep_size: Annotated[int, typer.Option("--decode-ep-size", help="0: as --ep-size")] = 0,
    decode_max_running_requests: Annotated[Optional[int], typer.Option(
        "--decode-max-running-requests", help="disagg: running requests per decode worker "
        "(e.g. TRT-LLM's decode max_batch_size; default: as --max-running-requests)")] = None,
    evidence_root: Annotated[Optional[Path], typer.Option("--evidence-root", help="AIConfigurator-"
                                                          "layout folder of measured kernels")] = None,
    evidence_versions: Annotated[str, typer.Option(
        "--evidence-versions", help="set: every family at the GEMM tables' collected version "
        "(one collection); family: each family at its own nearest version")] = "set",
    exact: Annotated[bool, typer.Option("--exact", help="cost every step shape exactly "
                                        "(no interpolation between grid nodes)")] = False,
    output_format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    chrome_trace: Annotated[Optional[Path], typer.Option("--chrome-trace", help="write engine "
                                                         "iterations as a Chrome trace")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="where the time goes: per-request "
                                          "phases and the iteration split (table, or an "
                                          "'explain' object in JSON)")] = False,
    calibration: CalibrationOption = "default",
    allow_long_run: Annotated[bool, typer.Option(
        "--allow-long-run", help=f"simulate more than {MAX_SIMULATED_REQUESTS:,} requests")] = False,
) -> None:
    """Simulate clients against one engine configuration and report request metrics."""
    with user_errors():
        check_output_paths(chrome_trace=chrome_trace)
        args = ServeArgs(
            model=model, device=device, backend=backend, backend_version=backend_version,
            tp_size=tp_size, pp_size=pp_size, dp_size=dp_size, ep_size=ep_size,
            moe_tp_size=moe_tp_size, quantize_linear_action=quantize_linear_action,
            kv_cache_dtype=kv_cache_dtype, isl=isl, osl=osl, range_ratio=range_ratio,
            concurrency=concurrency, request_rate=request_rate,
            arrival_trace=str(arrival_trace) if arrival_trace else None,
            trace=str(trace) if trace else None, prefix_cache_hit_rate=prefix_cache_hit_rate,
            num_requests=num_requests, warmup_requests=warmup_requests, seed=seed,
            policy=policy, token_budget=token_budget,
            max_running_requests=max_running_requests, chunked_prefill=chunked_prefill,
            speculative=speculative, num_speculative_tokens=num_speculative_tokens,
            acceptance=acceptance, draft_model=str(draft_model) if draft_model else None,
            stack=stack, mode=mode, workers=workers, decode_workers=decode_workers,
            decode_tp_size=decode_tp_size, decode_dp_size=decode_dp_size,
            decode_ep_size=decode_ep_size, decode_max_running_requests=decode_max_running_requests,
            evidence_root=str(evidence_root) if evidence_root else None,
            evidence_versions=evidence_versions, exact=exact, calibration=calibration,
            allow_long_run=allow_long_run, explain=explain,
            schedule_conservativeness=schedule_conservativeness,
            enable_mixed_chunk=enable_mixed_chunk,
            capacity_scheduler_policy=capacity_scheduler_policy,
            attention_dp_balance=attention_dp_balance)
        metrics, result = run_serve(args, note=lambda text: typer.echo(text, err=True),
                                    record_trace=chrome_trace is not None)
        if chrome_trace:
            from perfcast.report.chrome_trace import write_iteration_trace

            write_iteration_trace(result.engines, chrome_trace)
        if output_format is OutputFormat.json:
            typer.echo(json.dumps(metrics, indent=2))
            return
        from rich.console import Console

        _print_table(metrics, Console())
        if explain:
            print_explain(metrics["explain"], Console())


@dataclass(frozen=True)
class ServeArgs:
    """The inputs of one `perfcast serve` (the command's options by their Python names;
    paths as strings), shared by the CLI and the workbench API."""
    model: str
    device: str = "h100_sxm"
    backend: str = "vllm"
    backend_version: str = ""
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    moe_tp_size: int = 0
    quantize_linear_action: Optional[str] = None
    kv_cache_dtype: Optional[str] = None
    isl: int = 1024
    osl: int = 128
    range_ratio: float = 1.0
    concurrency: Optional[int] = None
    request_rate: Optional[float] = None
    arrival_trace: Optional[str] = None
    trace: Optional[str] = None
    prefix_cache_hit_rate: Optional[float] = None
    num_requests: int = 0
    warmup_requests: int = 0
    seed: int = 0
    policy: Optional[str] = None
    token_budget: Optional[int] = None
    max_running_requests: Optional[int] = None
    chunked_prefill: Optional[bool] = None
    speculative: Optional[str] = None
    num_speculative_tokens: int = 0
    acceptance: Optional[str] = None
    draft_model: Optional[str] = None
    stack: str = "auto"
    mode: str = "agg"
    workers: int = 1
    decode_workers: int = 1
    decode_tp_size: int = 0
    decode_dp_size: int = 0
    decode_ep_size: int = 0
    decode_max_running_requests: Optional[int] = None
    evidence_root: Optional[str] = None
    evidence_versions: str = "set"
    exact: bool = False
    calibration: str = "default"
    allow_long_run: bool = False
    explain: bool = False
    schedule_conservativeness: Optional[float] = None
    enable_mixed_chunk: Optional[bool] = None
    capacity_scheduler_policy: Optional[str] = None
    attention_dp_balance: Optional[bool] = None


def run_serve(a: ServeArgs, note=lambda text: None, record_trace: bool = False):
    """(the `perfcast serve --format json` document, the ServingResult) of `a`;
    `note(text)` receives the model's and the evidence's notes."""
    from perfcast.calibrate.prediction_error import band_json, prediction_band
    from perfcast.hardware import load_system
    from perfcast.serving.backends import defaults_json, load_backend
    from perfcast.serving.deploy import Pool, ServeConfig, run_serving
    from perfcast.serving.pipeline import pipeline_report
    from perfcast.serving.provenance import provenance_json, tallied
    from perfcast.workload import load_model_spec
    from perfcast.workload.quant import precision_for_model
    from perfcast.workload.stacks import resolve_stack

    arrival_trace = Path(a.arrival_trace) if a.arrival_trace else None
    evidence_root = Path(a.evidence_root) if a.evidence_root else None
    client = client_settings(a.concurrency, a.request_rate, arrival_trace, a.num_requests,
                             a.warmup_requests, trace=Path(a.trace) if a.trace else None,
                             allow_long_run=a.allow_long_run)
    trace = client.pop("trace", None)
    if trace is not None and trace.skipped_rows:
        note(f"note: {trace.skipped_rows} failed requests (0 response tokens) of "
             f"{trace.path} left out")
    check_request_count(client["num_requests"] + a.warmup_requests, "--num-requests"
                        if a.num_requests else "--concurrency", a.allow_long_run)
    spec = load_model_spec(a.model)
    for text in spec.notes:
        note(f"note: {text}")
    plan = build_plan(a.tp_size, a.pp_size, a.dp_size, a.ep_size, a.moe_tp_size, 0)
    precision = precision_for_model(spec, linear_action=a.quantize_linear_action,
                                    kv_cache_dtype=a.kv_cache_dtype)
    revision = load_calibration(a.calibration)
    system = load_system(a.device)
    op_stack = resolve_stack(a.stack, system.device.vendor)
    bk = load_backend(a.backend, a.backend_version, system=system, tp=plan.devices_per_stage,
                      pp=plan.pp)
    if bk.version_note and a.backend_version:   # a version given but not matched
        note(f"note: {bk.version_note}")
    bk = bk.with_overheads(**backend_overheads(revision, bk.name)).with_scheduler(
        policy=a.policy, token_budget=a.token_budget,
        max_running_requests=a.max_running_requests, chunked_prefill=a.chunked_prefill)
    bk = engine_options(bk, a)
    decode_pool = None
    if a.decode_max_running_requests is not None and a.mode != "disagg":
        raise ConfigError("applies to disaggregated serving only",
                          field="--decode-max-running-requests", expected="--mode disagg")
    if a.mode == "disagg":
        dplan = build_plan(a.decode_tp_size or a.tp_size, a.pp_size,
                           a.decode_dp_size or a.dp_size, a.decode_ep_size or a.ep_size, 0, 0)
        decode_pool = Pool(dplan, a.decode_workers)
    arrivals = client.pop("arrival_times_s")
    spec_cfg = speculative_config(a)
    cfg = ServeConfig(model=spec, system=system, backend=bk, backend_version=a.backend_version,
                      precision=precision, mode=a.mode, pool=Pool(plan, a.workers),
                      decode_pool=decode_pool,
                      decode_max_running_requests=a.decode_max_running_requests,
                      # a trace's mean lengths size the KV cache (sliding-window layers)
                      isl=round(trace.summary()["mean_input_tokens"]) if trace else a.isl,
                      osl=round(trace.summary()["mean_output_tokens"]) if trace else a.osl,
                      range_ratio=a.range_ratio, concurrency=client["concurrency"],
                      request_rate_per_s=client["request_rate_per_s"],
                      arrival_times_s=arrivals, num_requests=client["num_requests"],
                      trace=trace.requests if trace else None,
                      trace_block_tokens=trace.block_tokens if trace else None,
                      prefix_cache_hit_rate=a.prefix_cache_hit_rate,
                      warmup_requests=a.warmup_requests, seed=a.seed, interpolate=not a.exact,
                      record_trace=record_trace, explain=a.explain, speculative=spec_cfg,
                      stack=a.stack)
    providers, context, evidence = (), None, None
    if evidence_root:
        from perfcast.serving.evidence import evidence_loader

        ev = evidence_loader(evidence_root, versions=a.evidence_versions)(
            system.name, bk.name, a.backend_version)
        providers, context = ev.providers, (ev.context if ev.providers else None)
        evidence = {"root": str(evidence_root), "backend": bk.name,
                    "version": ev.version or None, "note": ev.note or None}
        if ev.note:
            note(f"note: {ev.note}")
    calibrated = (analytic_for(revision) or (lambda _: []))(system.name)
    wrapped, tally = tallied((*providers, *calibrated))
    result = run_serving(cfg, evidence=wrapped, evidence_context=context)
    metrics = result.metrics.to_json()
    metrics["pipeline"] = pipeline_report(result.engines)   # None unless pp > 1
    metrics["calibration"] = revision.digest if revision is not None else "none"
    metrics["calibration_held_out_error"] = held_out_error(revision)
    metrics["prediction_band"] = band_json(prediction_band(revision, bk.name),
                                           metrics["ttft_ms"]["mean"], metrics["tpot_ms"]["mean"])
    metrics["inputs"] = {
        "model": spec.name, "model_digest": spec.digest, "model_source": spec.source,
        "device": system.name, "system_digest": system.digest,
        "backend": bk.name, "backend_version": a.backend_version or None,
        "backend_defaults": defaults_json(bk),
        "mode": a.mode, "layout": _layout(plan, a.workers, decode_pool),
        "precision": {"weight": precision.weight, "activation": precision.activation,
                      "kv_cache": precision.kv_cache},
        "scheduler": {"policy": bk.scheduler.policy,
                      "token_budget": bk.scheduler.token_budget,
                      "max_running_requests": bk.scheduler.max_running_requests,
                      "decode_max_running_requests": a.decode_max_running_requests,
                      "chunked_prefill": bk.scheduler.chunked_prefill,
                      "kv_admission": bk.kv_cache.admission,
                      "schedule_conservativeness": bk.scheduler.schedule_conservativeness,
                      "enable_mixed_chunk": bk.scheduler.enable_mixed_chunk,
                      "attention_dp_balance": bk.scheduler.attention_dp_balance},
        "client": {**client, "isl": None if trace else a.isl, "osl": None if trace else a.osl,
                   "range_ratio": None if trace else a.range_ratio,
                   "warmup_requests": a.warmup_requests, "seed": a.seed},
        "trace": trace.summary() if trace else None,
        "prefix_cache": prefix_cache_inputs(a.prefix_cache_hit_rate, trace, result),
        "kv_cache": kv_cache_inputs(result.engines, bk, spec_cfg),
        "interpolate": not a.exact,
        "speculative": speculative_json(spec_cfg),
        "stack": stack_json(a.stack, op_stack),
        "notes": list(spec.notes) + ([bk.version_note] if bk.version_note else [])}
    metrics["provenance"] = provenance_json(
        tally.rows(), tally.queries if wrapped else None,
        calibration=metrics["calibration"], evidence=evidence)
    if a.explain:
        from perfcast.serving.explain import explain_json

        metrics["explain"] = explain_json(result.finished, result.phases, result.engines)
    return metrics, result


def engine_options(bk, a: ServeArgs):
    """The engine-family options of `a` applied to backend defaults `bk`; an option of
    another family's policy is an error, not ignored."""
    from dataclasses import replace

    from perfcast.serving.backends import Policy
    from perfcast.serving.engines import CapacitySchedulerPolicy

    policy = bk.scheduler.policy
    for flag, value, wants in (
            ("--schedule-conservativeness", a.schedule_conservativeness, Policy.PREFILL_FIRST),
            ("--enable-mixed-chunk", a.enable_mixed_chunk, Policy.PREFILL_FIRST),
            ("--capacity-scheduler-policy", a.capacity_scheduler_policy, Policy.INFLIGHT),
            ("--attention-dp-balance", a.attention_dp_balance, Policy.INFLIGHT)):
        if value is not None and policy is not wants:
            raise ConfigError(f"applies to the {wants} policy, not {policy}", field=flag,
                              expected=f"--policy {wants} (or a backend that uses it)")
    bk = bk.with_scheduler(schedule_conservativeness=a.schedule_conservativeness,
                           enable_mixed_chunk=a.enable_mixed_chunk,
                           attention_dp_balance=a.attention_dp_balance)
    if a.capacity_scheduler_policy is not None:
        try:
            cap = CapacitySchedulerPolicy(a.capacity_scheduler_policy.upper())
        except ValueError:
            raise ConfigError(f"unknown policy {a.capacity_scheduler_policy!r}",
                              field="--capacity-scheduler-policy",
                              expected=" | ".join(CapacitySchedulerPolicy)) from None
        bk = replace(bk, kv_cache=replace(bk.kv_cache, admission=cap.admission))
    return bk


def speculative_config(a: ServeArgs):
    """The SpeculativeConfig of `--speculative`, `--num-speculative-tokens` and
    `--acceptance` (None without `--speculative`; the other two then are errors)."""
    from perfcast.serving.speculative import SpeculativeConfig, parse_acceptance

    if a.speculative is None:
        given = [flag for flag, value in (("--num-speculative-tokens", a.num_speculative_tokens),
                                          ("--acceptance", a.acceptance),
                                          ("--draft-model", a.draft_model)) if value]
        if given:
            raise ConfigError(f"{', '.join(given)} without --speculative", field=given[0],
                              expected="--speculative mtp | eagle | eagle3 | ngram")
        return None
    if not a.num_speculative_tokens or a.acceptance is None:
        raise ConfigError(f"--speculative {a.speculative} needs the draft length and its "
                          "acceptance", field="--num-speculative-tokens/--acceptance",
                          expected="--num-speculative-tokens K --acceptance A (mean accepted "
                                   "tokens per verify step) or a_1,...,a_K")
    return SpeculativeConfig(a.speculative, a.num_speculative_tokens,
                             parse_acceptance(a.acceptance), draft_model=a.draft_model)


def stack_json(requested: str, stack) -> dict:
    """The operator stack the step graphs were built with: the `--stack` asked for, the
    profile it resolved to on the device, and the MLA call that profile implies."""
    from perfcast.workload.stacks import resolve_mla_call

    return {"requested": requested, "resolved": stack.name,
            "mla_call": resolve_mla_call("auto", stack)}


def speculative_json(spec) -> dict | None:
    if spec is None:
        return None
    return {"method": spec.method.value, "num_speculative_tokens": spec.num_speculative_tokens,
            "acceptance": list(spec.acceptance),
            "accepted_tokens_per_step": spec.accepted_tokens,
            "tokens_per_step": spec.tokens_per_step,
            "draft_model": spec.draft_model}


def client_settings(concurrency: int | None, request_rate: float | None,
                    arrival_trace: Path | None, num_requests: int, warmup: int, *,
                    trace: Path | None = None, allow_long_run: bool = False) -> dict:
    """Closed loop (--concurrency, default 8) or open loop (--request-rate,
    --arrival-trace or the replay of a --trace); asking for two is an error, not a
    silent choice."""
    open_flags = [flag for flag, value in (("--request-rate", request_rate),
                                           ("--arrival-trace", arrival_trace),
                                           ("--trace", trace))
                  if value is not None]
    if len(open_flags) >= 2:
        raise ConfigError(f"{' and '.join(open_flags)} all set the arrivals"
                          if len(open_flags) > 2 else
                          f"{open_flags[0]} and {open_flags[1]} both set the arrivals",
                          field=open_flags[-1], expected="one of them")
    if open_flags and concurrency is not None:
        raise ConfigError(f"--concurrency (closed-loop clients) and {open_flags[0]} (open-loop "
                          "arrivals) exclude each other", field="--concurrency",
                          expected="--concurrency C, or --request-rate R / --arrival-trace FILE"
                                   " / --trace FILE")
    if num_requests < 0 or warmup < 0:
        raise ConfigError(f"--num-requests {num_requests}, --warmup-requests {warmup}",
                          field="--num-requests", expected="non-negative integers")
    if trace is not None:
        return trace_settings(trace, num_requests, warmup, allow_long_run)
    if request_rate is not None:
        if not request_rate > 0:
            raise ConfigError(f"has value {request_rate}", field="--request-rate",
                              expected="a positive rate (requests per second)")
        return {"kind": "open_loop_poisson", "concurrency": None,
                "request_rate_per_s": request_rate, "arrival_trace": None,
                "num_requests": num_requests or 200, "arrival_times_s": None}
    if arrival_trace is not None:
        times = _read_trace(arrival_trace)
        n = num_requests or len(times) - warmup
        if n < 1 or n + warmup > len(times):
            raise ConfigError(f"holds {len(times)} arrivals for {n} requests + {warmup} warm-up",
                              source=str(arrival_trace), field="--arrival-trace",
                              expected="one arrival per simulated request")
        return {"kind": "open_loop_trace", "concurrency": None, "request_rate_per_s": None,
                "arrival_trace": str(arrival_trace), "num_requests": n,
                "arrival_times_s": tuple(times)}
    clients = 8 if concurrency is None else concurrency
    if clients < 1:
        raise ConfigError(f"has value {clients}", field="--concurrency",
                          expected="a positive number of clients (open loop: --request-rate "
                                   "or --arrival-trace)")
    return {"kind": "closed_loop", "concurrency": clients, "request_rate_per_s": None,
            "arrival_trace": None, "num_requests": num_requests or 10 * clients,
            "arrival_times_s": None}


def trace_settings(path: Path, num_requests: int, warmup: int, allow_long_run: bool) -> dict:
    """Replay of the first `warmup + num_requests` requests of a trace (all by default,
    up to MAX_SIMULATED_REQUESTS without --allow-long-run)."""
    from perfcast.serving.traces import read_trace

    if num_requests:
        limit = num_requests + warmup
    else:
        limit = None if allow_long_run else MAX_SIMULATED_REQUESTS + 1
    trace = read_trace(path, limit=limit)
    if not num_requests and trace.truncated:
        raise ConfigError(f"holds more than {MAX_SIMULATED_REQUESTS:,} requests",
                          source=str(path), field="--trace",
                          expected="--num-requests N (the first N) or --allow-long-run")
    n = num_requests or len(trace.requests) - warmup
    if n < 1 or n + warmup > len(trace.requests):
        raise ConfigError(f"holds {len(trace.requests)} requests for {n} requests + {warmup} "
                          "warm-up", source=str(path), field="--trace",
                          expected="one trace row per simulated request")
    return {"kind": "trace_replay", "concurrency": None, "request_rate_per_s": None,
            "arrival_trace": str(path), "num_requests": n, "arrival_times_s": None,
            "trace": trace}


def prefix_cache_inputs(hit_rate: float | None, trace, result) -> dict:
    """What decided the prefix-cache hits: a declared rate, the trace's block hashes
    (an LRU holding one engine's KV cache in blocks) or nothing."""
    from perfcast.serving.pipeline import replica_kv_tokens

    if hit_rate is not None:
        return {"source": "hit_rate", "hit_rate": hit_rate, "block_tokens": None,
                "capacity_blocks": None}
    if trace is not None and trace.has_block_hashes:
        return {"source": "trace_hash_ids", "hit_rate": None,
                "block_tokens": trace.block_tokens,
                "capacity_blocks": replica_kv_tokens(result.engines) // trace.block_tokens}
    return {"source": "none", "hit_rate": None, "block_tokens": None, "capacity_blocks": None}


def kv_cache_inputs(engines, backend, speculative) -> dict:
    """Per engine role: the memory fraction it ran with (`engine`: the engine's own
    derivation from its chunk size, CUDA-graph batch and layout; `setting`: the backend
    file's or a launch's) and the KV tokens one replica holds."""
    from perfcast.serving.deploy import memory_fraction

    draft = speculative is not None and speculative.loads_draft
    out: dict = {}
    for e in engines:
        role = str(e.role.value)
        if role not in out:
            out[role] = {"memory_fraction": memory_fraction(e.cost, backend, draft),
                         "fraction_from": ("engine" if backend.kv_cache.reserved_memory
                                           is not None else "setting"),
                         "capacity_tokens": sum(x.capacity for x in engines
                                                if x.replica is e.replica)}
    return out


def kv_cache_lines(kv: dict | None) -> list[str]:
    """The table-output line of `kv_cache_inputs`: per role, fraction and KV tokens."""
    if not kv:
        return []
    parts = []
    for role, v in kv.items():
        origin = "the engine's own" if v["fraction_from"] == "engine" else "set"
        parts.append(f"{'' if role == 'agg' else role + ' '}fraction {v['memory_fraction']:g} "
                     f"({origin}), {v['capacity_tokens']:,} tokens per replica")
    return ["kv cache   " + "; ".join(parts)]


def _layout(plan, workers: int, decode_pool) -> dict:
    out = {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "ep": plan.ep,
           "moe_tp": plan.moe_tp_size, "workers": workers}
    if decode_pool is not None:
        d = decode_pool.plan
        out["decode"] = {"tp": d.tp, "pp": d.pp, "dp": d.dp, "ep": d.ep,
                         "workers": decode_pool.workers}
    return out


def _read_trace(path: Path) -> list[float]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the arrival trace: {getattr(exc, 'strerror', None) or exc}",
                          source=str(path), field="--arrival-trace") from None
    times = []
    for i, line in enumerate(text.splitlines(), 1):
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


def input_lines(inputs: dict) -> list[str]:
    """What was simulated, one short line per input, for the table output."""
    from perfcast.serving.backends import defaults_lines

    lay, c = inputs["layout"], inputs["client"]
    layout = f"{inputs['mode']} {lay['workers']}x tp{lay['tp']} pp{lay['pp']} dp{lay['dp']} ep{lay['ep']}"
    if "decode" in lay:
        d = lay["decode"]
        layout += f" + decode {d['workers']}x tp{d['tp']} dp{d['dp']} ep{d['ep']}"
    if c["kind"] == "closed_loop":
        clients = f"closed loop, {c['concurrency']} clients"
    elif c["kind"] == "open_loop_poisson":
        clients = f"open loop, Poisson {c['request_rate_per_s']:g} req/s"
    elif c["kind"] == "trace_replay":
        clients = f"trace replay, {inputs['trace']['layout']} layout, {c['arrival_trace']}"
    else:
        clients = f"open loop, arrivals from {c['arrival_trace']}"
    p = inputs["precision"]
    if inputs.get("trace"):
        t = inputs["trace"]
        lengths = (f"lengths    from the trace: mean input {t['mean_input_tokens']:.0f}, mean "
                   f"output {t['mean_output_tokens']:.0f} tokens")
    else:
        lengths = (f"lengths    isl {c['isl']}, osl {c['osl']}, range ratio "
                   f"{c['range_ratio']:g}")
    pc = inputs.get("prefix_cache") or {"source": "none"}
    extra = []
    if pc["source"] == "hit_rate":
        extra = [f"prefix     declared hit rate {pc['hit_rate']:g} of each prompt"]
    elif pc["source"] == "trace_hash_ids":
        extra = [f"prefix     the trace's hash_ids, LRU of {pc['capacity_blocks']:,} blocks of "
                 f"{pc['block_tokens']} tokens"]
    st = inputs.get("stack")
    if st and st["resolved"] != "default":
        extra.append(f"stack      {st['resolved']} (--stack {st['requested']}), MLA call "
                     f"{st['mla_call']}")
    spec = inputs.get("speculative")
    if spec:
        rates = ", ".join(f"{a:g}" for a in spec["acceptance"])
        draft = f", draft {spec['draft_model']}" if spec.get("draft_model") else ""
        extra.append(f"speculate  {spec['method']}, {spec['num_speculative_tokens']} drafted "
                     f"tokens per step, acceptance {rates} ({spec['tokens_per_step']:g} "
                     f"tokens per verify step){draft}")
    return [f"model      {inputs['model']} ({inputs['model_digest'][:19]})",
            f"device     {inputs['device']} ({inputs['system_digest'][:19]})",
            f"layout     {layout}",
            f"backend    {inputs['backend']} {inputs['backend_version'] or '(version not given)'}"
            f", {inputs['scheduler']['policy']}",
            *defaults_lines(inputs.get("backend_defaults")),
            f"precision  weights {p['weight']}, activations {p['activation']}, "
            f"KV {p['kv_cache']}",
            *kv_cache_lines(inputs.get("kv_cache")),
            f"clients    {clients}; {c['num_requests']} requests (+{c['warmup_requests']} "
            "warm-up)",
            lengths, *extra]


def _print_table(metrics: dict, console) -> None:
    from rich.table import Table

    from perfcast.serving.provenance import provenance_lines

    for line in input_lines(metrics["inputs"]):
        console.print(line, markup=False, highlight=False)
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
                "preemptions", "kv_utilization_mean", "kv_utilization_peak",
                "prefix_cache_hit_rate", "num_gpus"):
        value = metrics[key]
        console.print(f"{key:28s} {value:.3f}" if isinstance(value, float)
                      else f"{key:28s} {value}")
    pipe = metrics.get("pipeline")
    if pipe:
        stages = ", ".join(f"{100 * b:.1f}%" for b in pipe["stage_bubble_fraction"])
        console.print(f"{'pipeline bubble':28s} {100 * pipe['bubble_fraction']:.1f}% of "
                      f"{pipe['stages']} stages ({stages})", highlight=False)
    console.print("numbers from:", highlight=False)
    for line in provenance_lines(metrics["provenance"]):
        console.print(f"  {line}", markup=False, highlight=False)
    for scheme, err in (metrics.get("calibration_held_out_error") or {}).items():
        console.print(f"  held-out error ({scheme}): TTFT MAPE {100 * err['ttft_mape']:.1f}%, "
                      f"TPOT MAPE {100 * err['tpot_mape']:.1f}% over {err['rows']} rows")
    band = metrics.get("prediction_band")
    if band:
        t, p = band["ttft_ms"], band["tpot_ms"]
        console.print(f"  held-out error band of the mean: TTFT {t['low']:.1f}-{t['high']:.1f} "
                      f"ms, TPOT {p['low']:.2f}-{p['high']:.2f} ms ({band['basis']})",
                      markup=False, highlight=False)


def print_explain(doc: dict, console) -> None:
    """`--explain` tables: request phases, then the engines' busy time split."""
    from rich.table import Table

    from perfcast.serving.explain import SPLIT, explain_lines

    table = Table(title=f"where the time goes ({doc['requests']} requests, ms)")
    for col in ("phase", "mean", "p50", "p90", "p99", "of TTFT", "of e2e"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for row in explain_lines(doc):
        table.add_row(*row)
    console.print(table)
    split = Table(title="engine busy time by kind (ms)")
    split.add_column("engines")
    split.add_column("busy", justify="right")
    for name in SPLIT:
        split.add_column(name, justify="right")
    for role, e in doc["iterations"].items():
        split.add_row(role, f"{e['busy_ms']:.1f}", *(
            f"{e[name + '_ms']:.1f} ({100 * e[name + '_share']:.0f}%)" for name in SPLIT))
    console.print(split)
