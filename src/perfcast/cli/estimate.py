"""`perfcast estimate MODEL`: one step of a model on a device, costed task by task."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from perfcast.cli.calibration_option import CalibrationOption
from perfcast.cli.calibration_option import load as load_calibration
from perfcast.cli.evidence_options import (
    AllowForeignOption,
    EvidenceOption,
    EvidencePolicyOption,
    RuntimeVersionOption,
    StoreOption,
)
from perfcast.cli.errors import check_output_paths, user_errors
from perfcast.cli.layout import build_plan
from perfcast.cli.estimate_sources import (
    AUTO,
    check_combination,
    engine_evidence,
    evidence_layer,
    evidence_silence,
    model_resolver,
    profiling_provider,
    provider_counts,
)
from perfcast.core.dtypes import parse_dtype
from perfcast.core.errors import ConfigError
from perfcast.plan.step import EstimateRequest, estimate_step
from perfcast.hardware import load_system
from perfcast.workload import Batch, BatchSegment, Precision, load_model_spec
from perfcast.workload.quant import precision_for_model
from perfcast.workload.stacks import stack_names

PERFORMANCE_MODELS = ("analytic", "profiling")
# `--performance-model analytic profiling` (list form): the names after the first reach
# the command as extra arguments, so the command accepts extra args (see cli/main.py).
CONTEXT_SETTINGS = {"allow_extra_args": True}


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


def build_batch(num_queries: int, query_length: int, context_length: int, decode: bool,
                decode_queries: int, decode_context_length: int) -> Batch:
    if decode:
        if context_length < 1:
            raise ConfigError("a decode step needs cached context", field="--context-length",
                              expected="a positive integer with --decode")
        return Batch.decode(num_queries, context_length, query_length)
    if decode_queries:
        if decode_context_length < 1:
            raise ConfigError("decode requests need cached context",
                              field="--decode-context-length", expected="a positive integer")
        return Batch.mixed((BatchSegment(num_queries, query_length, context_length),
                            BatchSegment(decode_queries, 1, decode_context_length)))
    return Batch.prefill(num_queries, query_length, context_length)


def evidence_context(runtime: str, runtime_version: str, implementation: list[str],
                     op_dims: list[str]):
    """CostQueryContext from the evidence flags: `--implementation KERNEL` applies to every
    operation, `--implementation OP=KERNEL` to one; `--op-dim OP:NAME=VALUE` adds a selector."""
    from perfcast.core.frozen import FrozenDict
    from perfcast.evidence.contracts import CostQueryContext
    from perfcast.evidence.query_spec import parse_dim

    default, per_op = "", {}
    for item in implementation:
        if "=" in item:
            op, kernel = item.split("=", 1)
            per_op[op.strip()] = kernel.strip()
        else:
            default = item.strip()
    dims: dict[str, dict] = {}
    for item in op_dims:
        if ":" not in item:
            raise ConfigError(f"bad --op-dim {item!r}", field="--op-dim",
                              expected="OP:NAME=VALUE")
        op, rest = item.split(":", 1)
        key, value = parse_dim(rest)
        dims.setdefault(op.strip(), {})[key] = value
    return CostQueryContext(runtime=runtime, runtime_revision=runtime_version,
                            implementation=default, implementations=FrozenDict(per_op),
                            operation_dimensions=FrozenDict(
                                {op: FrozenDict(d) for op, d in dims.items()}))


def calibrated_for(device: str, revision) -> list:
    """The revision's calibrated analytic providers for `device` ([] for none)."""
    from perfcast.evidence.calibrated import calibrated_providers
    from perfcast.hardware import load_system

    return calibrated_providers(load_system(device), revision)


def estimate_command(
    model: Annotated[str, typer.Argument(help="config.json path, a folder holding one, or a "
                                              "built-in HuggingFace id (see `perfcast models`)")],
    device: Annotated[str, typer.Option(help="catalog id (see `perfcast devices`) or a YAML path")] = "h100_sxm",
    tp_size: Annotated[int, typer.Option("--tp-size", help="tensor-parallel degree")] = 1,
    pp_size: Annotated[int, typer.Option("--pp-size", help="pipeline-parallel stages")] = 1,
    dp_size: Annotated[int, typer.Option("--dp-size", help="attention data-parallel ranks: dp x tp "
                                                           "devices serve attention; each holds "
                                                           "1/dp of the requests")] = 0,
    ep_size: Annotated[int, typer.Option("--ep-size", help="expert-parallel degree of MoE layers")] = 1,
    moe_tp_size: Annotated[int, typer.Option("--moe-tp-size", help="tensor-parallel degree inside "
                                                                   "each expert (default: dp x tp / ep)")] = 0,
    num_devices: Annotated[int, typer.Option("--num-devices", help="total devices; must equal "
                                                                   "tp x dp x pp (derives dp when "
                                                                   "--dp-size is not given)")] = 0,
    moe_dispatch: Annotated[str, typer.Option("--moe-dispatch", help="auto | all_reduce | all_to_all "
                                                                     "| all_gather")] = "auto",
    expert_imbalance: Annotated[float, typer.Option("--expert-imbalance", help="routed rows on the "
                                                    "busiest EP rank / the mean (>= 1)")] = 1.0,
    quantize_linear_action: Annotated[Optional[str], typer.Option(
        "--quantize-linear-action", help="DISABLED | W8A16_STATIC | W8A16_DYNAMIC | W8A8_STATIC | "
        "W8A8_DYNAMIC | W4A8_STATIC | W4A8_DYNAMIC | W4A16 | FP8 | FP8_BLOCK | MXFP4 | NVFP4 "
        "(default: the checkpoint's quantisation)")] = None,
    quantize_attention_action: Annotated[Optional[str], typer.Option(
        "--quantize-attention-action", help="DISABLED | INT8 | FP8 (attention and KV cache)")] = None,
    kv_cache_dtype: Annotated[Optional[str], typer.Option("--kv-cache-dtype",
                                                          help="bf16 | fp16 | fp8 | int8")] = None,
    mtp_layers: Annotated[int, typer.Option("--mtp-layers", help="MTP/next-n modules to run "
                                                                 "(at most what the config declares)")] = 0,
    mla_form: Annotated[str, typer.Option("--mla-form", help="auto (absorbed for decode, naive "
                                                             "for prefill) | naive | absorbed")] = "auto",
    mla_call: Annotated[str, typer.Option("--mla-call", help="auto (tensorcast with the "
                                                             "profiling model or the tensorcast "
                                                             "stack, else split) | split | "
                                                             "tensorcast")] = "auto",
    block_size: Annotated[int, typer.Option("--block-size", help="KV-cache page size in tokens "
                                                                 "(0: no rounding)")] = 0,
    stack: Annotated[str, typer.Option("--stack", help="operator conventions of the software "
                                       "stack: auto (tensorcast on Ascend NPUs, else default) "
                                       f"| {' | '.join(stack_names())} (stacks.yaml: fusion "
                                       "boundaries, the tensors each call receives, the "
                                       "fusion passes it runs)")] = "auto",
    reserved_memory_gb: Annotated[float, typer.Option("--reserved-memory-gb",
                                                      help="framework reserve per device "
                                                           "(workspace, graphs), GiB")] = 0.0,
    num_queries: Annotated[int, typer.Option("--num-queries", help="requests in the step")] = 1,
    query_length: Annotated[int, typer.Option("--query-length", help="new tokens per request")] = 1024,
    context_length: Annotated[int, typer.Option("--context-length", help="tokens already cached per request")] = 0,
    decode: Annotated[bool, typer.Option("--decode", help="decode step: query-length new tokens "
                                                          "over context-length cached ones")] = False,
    decode_queries: Annotated[int, typer.Option("--decode-queries", help="mixed step: add this many "
                                                                         "decode requests to the prefill")] = 0,
    decode_context_length: Annotated[int, typer.Option("--decode-context-length",
                                                       help="context of the mixed-step decode requests")] = 0,
    dtype: Annotated[str, typer.Option(help="weights, activations and KV cache dtype")] = "",
    logits: Annotated[str, typer.Option(help="LM-head positions: last (one per request) | all")] = "last",
    roofline_mode: Annotated[str, typer.Option("--roofline-mode", help="roofline | no_overlap")] = "roofline",
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table | json")] = OutputFormat.table,
    chrome_trace: Annotated[Optional[Path], typer.Option("--chrome-trace", help="write a Chrome trace JSON")] = None,
    dump_input_shapes: Annotated[bool, typer.Option("--dump-input-shapes",
                                                    help="group the table by operator and input shape")] = False,
    attempts: Annotated[bool, typer.Option("--attempts", help="include resolver attempts in JSON")] = False,
    performance_model: Annotated[Optional[list[str]], typer.Option(
        "--performance-model", help="analytic | profiling, or both: "
                                    "--performance-model analytic profiling")] = None,
    profiling_database: Annotated[Optional[Path], typer.Option(
        "--profiling-database", help="directory with op_mapping.yaml and kernel CSVs "
                                     "(required by the profiling model)")] = None,
    interpolate: Annotated[bool, typer.Option(
        "--interpolate", help="profiling model: interpolate between bracketing measured "
                              "rows after an exact miss (never extrapolates)")] = False,
    export_empirical_metrics: Annotated[Optional[Path], typer.Option(
        "--export-empirical-metrics", help="write M1-M5 coverage metrics and misses "
                                           "(JSON); needs the profiling model")] = None,
    num_microbatches: Annotated[int, typer.Option("--num-microbatches",
                                                  help="split the step's requests into this many "
                                                       "pipeline microbatches")] = 1,
    pp_schedule: Annotated[str, typer.Option("--pp-schedule", help="gpipe | 1f1b")] = "gpipe",
    overlap: Annotated[str, typer.Option("--overlap", help="none | comm | two-microbatch")] = "comm",
    full_timeline: Annotated[bool, typer.Option("--full-timeline",
                                                help="schedule every layer (default: a few "
                                                     "representative layers per block, "
                                                     "extrapolated; implied by --chrome-trace)")] = False,
    evidence: EvidenceOption = None,
    runtime: Annotated[str, typer.Option(help="runtime of the evidence to use: vllm | sglang | "
                                              "trtllm ...")] = "",
    runtime_version: RuntimeVersionOption = "",
    implementation: Annotated[Optional[list[str]], typer.Option(
        "--implementation", help="KERNEL (every op), OP=KERNEL (repeat), or auto: the kernel "
                                 "the --runtime's dispatch rules pick per op and shape, each "
                                 "op at the collected version nearest --runtime-version")] = None,
    op_dim: Annotated[Optional[list[str]], typer.Option(
        "--op-dim", help="OP:NAME=VALUE extra selector for one operation, e.g. "
                         "all_reduce:backend=vllm_graph (repeat)")] = None,
    evidence_policy: EvidencePolicyOption = "interpolate",
    store: StoreOption = None,
    allow_foreign_evidence: AllowForeignOption = False,
    wide: Annotated[bool, typer.Option("--wide", help="table: every column, full operator "
                                                      "names, however wide")] = False,
    calibration: CalibrationOption = "default",
    ctx: typer.Context = None,  # type: ignore[assignment]
) -> None:
    """Estimate one step (prefill, decode or mixed) and show where every number came from."""
    with user_errors():
        extra = list(ctx.args) if ctx is not None else []
        model, models = performance_models(model, performance_model, extra)
        check_output_paths(chrome_trace=chrome_trace,
                           export_empirical_metrics=export_empirical_metrics)
        args = EstimateArgs(
            model=model, device=device, tp_size=tp_size, pp_size=pp_size, dp_size=dp_size,
            ep_size=ep_size, moe_tp_size=moe_tp_size, num_devices=num_devices,
            moe_dispatch=moe_dispatch, expert_imbalance=expert_imbalance,
            quantize_linear_action=quantize_linear_action,
            quantize_attention_action=quantize_attention_action, kv_cache_dtype=kv_cache_dtype,
            mtp_layers=mtp_layers, mla_form=mla_form, mla_call=mla_call, block_size=block_size,
            stack=stack,
            reserved_memory_gb=reserved_memory_gb, num_queries=num_queries,
            query_length=query_length, context_length=context_length, decode=decode,
            decode_queries=decode_queries, decode_context_length=decode_context_length,
            dtype=dtype, logits=logits, roofline_mode=roofline_mode, attempts=attempts,
            performance_model=models,
            profiling_database=str(profiling_database) if profiling_database else None,
            interpolate=interpolate,
            export_empirical_metrics=(str(export_empirical_metrics)
                                      if export_empirical_metrics else None),
            num_microbatches=num_microbatches, pp_schedule=pp_schedule, overlap=overlap,
            full_timeline=full_timeline or chrome_trace is not None, evidence=evidence,
            runtime=runtime, runtime_version=runtime_version, implementation=implementation,
            op_dim=op_dim, evidence_policy=evidence_policy,
            store=str(store) if store else None,
            allow_foreign_evidence=allow_foreign_evidence, calibration=calibration)
        run = run_estimate(args, note=lambda text: typer.echo(text, err=True))
        for text in run.warnings.values():
            typer.echo(f"warning: {text}", err=True)
        if chrome_trace:
            from perfcast.report.chrome_trace import write_chrome_trace

            for name, result in run.results.items():
                path = chrome_trace if len(run.results) == 1 else chrome_trace.with_name(
                    f"{chrome_trace.stem}.{name}{chrome_trace.suffix}")
                write_chrome_trace(result, path)
        if output_format is OutputFormat.json:
            typer.echo(json.dumps(estimate_record(run), indent=2))
        else:
            from perfcast.report.tables import print_sources, print_step

            console = Console(width=max(Console().width, 220)) if wide else Console()
            for name, result in run.results.items():
                if len(run.results) > 1:
                    console.rule(f"performance model: {name}")
                print_step(result, console, by_shape=dump_input_shapes, wide=wide)
                print_sources(run.sources[name], provider_counts(result), console)
            if run.metrics is not None:
                print_metrics_summary(run.metrics, console)


@dataclass(frozen=True)
class EstimateArgs:
    """The inputs of one `perfcast estimate` (the command's options by their Python names;
    paths as strings). The CLI and the workbench API both build one and hand it to
    `run_estimate`; `estimate_record` turns the run into the `--format json` document."""
    model: str
    device: str = "h100_sxm"
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 0
    ep_size: int = 1
    moe_tp_size: int = 0
    num_devices: int = 0
    moe_dispatch: str = "auto"
    expert_imbalance: float = 1.0
    quantize_linear_action: Optional[str] = None
    quantize_attention_action: Optional[str] = None
    kv_cache_dtype: Optional[str] = None
    mtp_layers: int = 0
    mla_form: str = "auto"
    mla_call: str = "auto"
    block_size: int = 0
    stack: str = "auto"
    reserved_memory_gb: float = 0.0
    num_queries: int = 1
    query_length: int = 1024
    context_length: int = 0
    decode: bool = False
    decode_queries: int = 0
    decode_context_length: int = 0
    dtype: str = ""
    logits: str = "last"
    roofline_mode: str = "roofline"
    attempts: bool = False
    performance_model: Optional[list[str]] = None
    profiling_database: Optional[str] = None
    interpolate: bool = False
    export_empirical_metrics: Optional[str] = None
    num_microbatches: int = 1
    pp_schedule: str = "gpipe"
    overlap: str = "comm"
    full_timeline: bool = False
    evidence: Optional[list[str]] = None
    runtime: str = ""
    runtime_version: str = ""
    implementation: Optional[list[str]] = None
    op_dim: Optional[list[str]] = None
    evidence_policy: str = "interpolate"
    store: Optional[str] = None
    allow_foreign_evidence: bool = False
    calibration: str = "default"


@dataclass
class EstimateRun:
    """What `run_estimate` computed: one StepResult per performance model, with the
    evidence sources, silence warnings, M1-M5 metrics (profiling) and the revision."""
    args: EstimateArgs
    results: dict
    sources: dict
    warnings: dict
    metrics: Optional[dict]
    revision: object
    calibrated: list


def run_estimate(a: EstimateArgs, note=lambda text: None) -> EstimateRun:
    """Estimate the step `a` describes; `note(text)` receives the model's notes."""
    _, models = performance_models(a.model, a.performance_model, [])
    profiling_database = Path(a.profiling_database) if a.profiling_database else None
    export = Path(a.export_empirical_metrics) if a.export_empirical_metrics else None
    store = Path(a.store) if a.store else None
    check_profiling_options(models, profiling_database, a.interpolate, export)
    check_combination(models, a.evidence or [])
    batch = build_batch(a.num_queries, a.query_length, a.context_length, a.decode,
                        a.decode_queries, a.decode_context_length)
    plan = build_plan(a.tp_size, a.pp_size, a.dp_size, a.ep_size, a.moe_tp_size, a.num_devices,
                      a.moe_dispatch, a.expert_imbalance)
    spec = load_model_spec(a.model)
    for text in spec.notes:
        note(f"note: {text}")
    quant_flags = (a.quantize_linear_action, a.quantize_attention_action, a.kv_cache_dtype)
    if a.dtype and any(quant_flags):
        raise ConfigError("--dtype sets every dtype at once", field="--dtype",
                          expected="either --dtype or the quantisation flags, not both")
    if a.dtype:
        precision = Precision.uniform(parse_dtype(a.dtype, field="--dtype").value)
    else:
        precision = precision_for_model(spec, linear_action=a.quantize_linear_action,
                                        attention_action=a.quantize_attention_action,
                                        kv_cache_dtype=a.kv_cache_dtype)
    implementation = a.implementation or []
    auto = AUTO in implementation
    context = evidence_context(a.runtime, a.runtime_version,
                               [i for i in implementation if i != AUTO], a.op_dim or [])
    request = EstimateRequest(model=spec, device=a.device, plan=plan, batch=batch,
                              context=context, precision=precision, logits=a.logits,
                              roofline_mode=a.roofline_mode,
                              num_microbatches=a.num_microbatches, pp_schedule=a.pp_schedule,
                              overlap=a.overlap, full_timeline=a.full_timeline,
                              mtp_layers=a.mtp_layers, mla_form=a.mla_form,
                              block_size=a.block_size, stack=a.stack,
                              reserve_bytes=a.reserved_memory_gb * 2**30,
                              mla_call=mla_call_for(a.mla_call, models))
    revision = load_calibration(a.calibration)
    system = load_system(a.device)
    calibrated = calibrated_for(a.device, revision)
    if auto:
        layer, context, text = engine_evidence(system, a.evidence or [], context,
                                               a.evidence_policy, store,
                                               a.allow_foreign_evidence)
        request = replace(request, context=context)
        if text:
            note(f"note: {text}")
    else:
        layer = evidence_layer(system, a.evidence or [], a.evidence_policy, store,
                               a.allow_foreign_evidence)
    results, sources = {}, {}
    for name in models:
        profiling, sources[name] = None, {}
        if name == "profiling":
            profiling, sources[name]["profiling_database"] = profiling_provider(
                request, system, profiling_database, a.interpolate, a.allow_foreign_evidence,
                calibrated)
        if layer.sources:
            sources[name]["evidence"] = layer.sources
        resolver = model_resolver(name, request, system, layer, calibrated, profiling)
        results[name] = estimate_step(request, resolver)
    warnings = {name: w for name, r in results.items()
                if (w := evidence_silence(r, layer, context))}
    metrics = None
    if "profiling" in results:
        from perfcast.evidence.profiling.metrics import MetricsCollector

        collector = MetricsCollector()
        collector.collect_from_costed(results["profiling"].costed)
        metrics = collector.export_hit_miss_report(export)
    return EstimateRun(a, results, sources, warnings, metrics, revision, calibrated)


def estimate_record(run: EstimateRun) -> dict:
    """The `perfcast estimate --format json` document of a run."""
    from perfcast.report.step import step_json

    docs = {}
    for name, r in run.results.items():
        docs[name] = step_json(r, include_attempts=run.args.attempts)
        docs[name]["sources"] = run.sources[name]
        docs[name]["providers"] = provider_counts(r)
        docs[name]["warnings"] = [run.warnings[name]] if name in run.warnings else []
        # the profiling database's stack: what differs from the estimate's
        docs[name]["warnings"] += run.sources[name].get("profiling_database", {}).get(
            "warnings", [])
    if run.metrics is not None:
        docs["profiling"]["empirical_metrics"] = {k: run.metrics[k] for k in
                                                  ("m1", "m2", "m3", "m4", "m5")}
    doc = next(iter(docs.values())) if len(docs) == 1 else {"models": docs}
    doc["calibration"] = {"revision": run.revision.digest if run.revision else "none",
                          "analytic_efficiency": bool(run.calibrated)}
    return doc


def performance_models(model: str, option: list[str] | None, extra: list[str]
                       ) -> tuple[str, list[str]]:
    """(model argument, performance models) from `--performance-model a b` whose later
    names arrive as extra arguments; repeated flags are accepted too."""
    names = list(option or [])
    rest = []
    for arg in extra:
        (names if arg in PERFORMANCE_MODELS else rest).append(arg)
    if model in PERFORMANCE_MODELS and names and len(rest) == 1:
        # `estimate --performance-model analytic profiling MODEL`: MODEL came last
        names.append(model)
        model, rest = rest[0], []
    if rest:
        raise ConfigError(f"unexpected argument(s) {' '.join(rest)!r}",
                          expected="one MODEL and --performance-model names among "
                                   + ", ".join(PERFORMANCE_MODELS))
    out: list[str] = []
    for n in names or ["analytic"]:
        if n not in PERFORMANCE_MODELS:
            raise ConfigError(f"unknown performance model {n!r}", field="--performance-model",
                              expected=" and/or ".join(PERFORMANCE_MODELS))
        if n not in out:
            out.append(n)
    return model, out


def mla_call_for(flag: str, models: list[str]) -> str:
    """`--mla-call auto`: TensorCast's one MLA call when a TensorCast profiling database
    answers (it keys MLA on that call); otherwise `auto` stays, and the stack decides
    (`EstimateRequest.mla_call`)."""
    if flag == "auto":
        return "tensorcast" if "profiling" in models else "auto"
    if flag not in ("split", "tensorcast"):
        raise ConfigError(f"has value {flag!r}", field="--mla-call",
                          expected="auto | split | tensorcast")
    return flag


def check_profiling_options(models: list[str], database: Path | None, interpolate: bool,
                            export: Path | None) -> None:
    if "profiling" in models and database is None:
        raise ConfigError("the profiling performance model needs a profiling database",
                          field="--profiling-database",
                          expected="a directory holding op_mapping.yaml and kernel CSVs")
    if "profiling" not in models:
        for flag, value in (("--interpolate", interpolate), ("--export-empirical-metrics", export)):
            if value:
                raise ConfigError("only applies to the profiling performance model", field=flag,
                                  expected="--performance-model profiling (or analytic profiling)")


def print_metrics_summary(metrics: dict, console: Console) -> None:
    m1, m2, m3, m4, m5 = (metrics[k] for k in ("m1", "m2", "m3", "m4", "m5"))
    console.print(f"profiling coverage: M1 {m1['m1_raw_op_count_hr']:.1%} "
                  f"({m1['m1_hit']}/{m1['m1_total']} calls)   M2 {m2['m2_fused_op_hr']:.1%}   "
                  f"M3 {m3['m3_fused_op_hr_no_zc']:.1%}   M4 {m4['m4_per_shape_hr']:.1%}   "
                  f"M5 {m5['m5_simulated_latency_coverage']:.1%}")
    for reason, group in metrics["miss_groups"].items():
        ops = ", ".join(f"{op} (x{n})" for op, n in group["ops"].items())
        console.print(escape(f"  miss [{reason}] {group['label']}: {ops}"))
