"""`perfcast estimate MODEL`: one step of a model on a device, costed task by task."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from perfcast.cli.errors import user_errors
from perfcast.core.dtypes import parse_dtype
from perfcast.core.errors import ConfigError
from perfcast.estimate import EstimateRequest, estimate_step
from perfcast.workload import Batch, BatchSegment, ParallelPlan, Precision


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


def estimate_command(
    model: Annotated[str, typer.Argument(help="config.json path, a folder holding one, or a "
                                              "built-in HuggingFace id (see `perfcast models`)")],
    device: Annotated[str, typer.Option(help="catalog id (see `perfcast devices`) or a YAML path")] = "h100_sxm",
    tp_size: Annotated[int, typer.Option("--tp-size", help="tensor-parallel degree")] = 1,
    pp_size: Annotated[int, typer.Option("--pp-size", help="pipeline-parallel stages")] = 1,
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
    num_microbatches: Annotated[int, typer.Option("--num-microbatches",
                                                  help="split the step's requests into this many "
                                                       "pipeline microbatches")] = 1,
    pp_schedule: Annotated[str, typer.Option("--pp-schedule", help="gpipe | 1f1b")] = "gpipe",
    overlap: Annotated[str, typer.Option("--overlap", help="none | comm | two-microbatch")] = "comm",
    full_timeline: Annotated[bool, typer.Option("--full-timeline",
                                                help="schedule every layer (default: a few "
                                                     "representative layers per block, "
                                                     "extrapolated; implied by --chrome-trace)")] = False,
) -> None:
    """Estimate one step (prefill, decode or mixed) and show where every number came from."""
    with user_errors():
        batch = build_batch(num_queries, query_length, context_length, decode, decode_queries,
                            decode_context_length)
        precision = Precision.uniform(parse_dtype(dtype, field="--dtype").value) if dtype else None
        request = EstimateRequest(model=model, device=device,
                                  plan=ParallelPlan(tp=tp_size, pp=pp_size), batch=batch,
                                  precision=precision, logits=logits, roofline_mode=roofline_mode,
                                  num_microbatches=num_microbatches, pp_schedule=pp_schedule,
                                  overlap=overlap,
                                  full_timeline=full_timeline or chrome_trace is not None)
        result = estimate_step(request)
        if chrome_trace:
            from perfcast.report.chrome_trace import write_chrome_trace

            write_chrome_trace(result, chrome_trace)
        if output_format is OutputFormat.json:
            from perfcast.report.step import step_json

            typer.echo(json.dumps(step_json(result, include_attempts=attempts), indent=2))
        else:
            from perfcast.report.tables import print_step

            print_step(result, Console(), by_shape=dump_input_shapes)
