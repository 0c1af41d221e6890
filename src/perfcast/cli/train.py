"""`perfcast train MODEL`: one training step (Megatron-style layout): time, memory, MFU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from perfcast.cli.calibration_option import CalibrationOption
from perfcast.cli.calibration_option import load as load_calibration
from perfcast.cli.evidence_options import (
    AllowForeignOption,
    EvidenceOption,
    EvidencePolicyOption,
    ImplementationOption,
    RuntimeOption,
    RuntimeVersionOption,
    StoreOption,
)
from perfcast.cli.errors import check_output_paths, user_errors
from perfcast.cli.estimate import OutputFormat, calibrated_for, evidence_context
from perfcast.cli.estimate_sources import evidence_layer, evidence_silence


def train_command(
    model: Annotated[str, typer.Argument(help="config.json path, a folder holding one, or a "
                                              "built-in id (see `perfcast models`)")],
    num_devices: Annotated[int, typer.Option("--num-devices", help="total devices; must equal "
                                                                   "tp x pp x dp x cp")],
    global_batch_size: Annotated[int, typer.Option("--global-batch-size",
                                                   help="sequences per optimizer step")],
    micro_batch_size: Annotated[int, typer.Option("--micro-batch-size",
                                                  help="sequences per microbatch and DP rank")],
    seq_length: Annotated[int, typer.Option("--seq-length", help="tokens per sequence")],
    device: Annotated[str, typer.Option(help="catalog id (see `perfcast devices`) or a YAML path")] = "h100_sxm",
    tp_size: Annotated[int, typer.Option("--tp-size", help="tensor-parallel degree")] = 1,
    pp_size: Annotated[int, typer.Option("--pp-size", help="pipeline-parallel ranks")] = 1,
    dp_size: Annotated[int, typer.Option("--dp-size", help="data-parallel replicas")] = 1,
    cp_size: Annotated[int, typer.Option("--cp-size", help="context-parallel degree")] = 1,
    ep_size: Annotated[int, typer.Option("--ep-size", help="expert-parallel degree (carved "
                                                           "out of dp x tp)")] = 1,
    virtual_pipeline_size: Annotated[int, typer.Option(
        "--virtual-pipeline-size", help="model chunks per pipeline rank (> 1: interleaved "
                                        "1F1B)")] = 1,
    sequence_parallel: Annotated[bool, typer.Option(
        "--sequence-parallel", help="TP all-reduces become reduce-scatter + all-gather; "
                                    "norms and dropout run on 1/tp of the tokens")] = False,
    recompute: Annotated[str, typer.Option("--recompute", help="none | selective (attention "
                                                               "core) | full")] = "none",
    zero_stage: Annotated[int, typer.Option("--zero-stage", help="0 | 1 (optimizer state) | "
                                                                 "2 (+ gradients) | 3 (+ weights)")] = 0,
    account_for_embedding_in_pipeline_split: Annotated[bool, typer.Option(
        "--account-for-embedding-in-pipeline-split",
        help="the input embedding takes one layer slot of the pipeline split: the first "
             "chunk holds one layer fewer (Megatron-LM's flag)")] = False,
    account_for_loss_in_pipeline_split: Annotated[bool, typer.Option(
        "--account-for-loss-in-pipeline-split",
        help="the output layer and loss take one layer slot: the last chunk holds one "
             "layer fewer (Megatron-LM's flag)")] = False,
    dtype: Annotated[str, typer.Option(help="bf16 | fp16 | fp8 (GEMM inputs)")] = "bf16",
    no_overlap_grad_reduce: Annotated[bool, typer.Option(
        "--no-overlap-grad-reduce", help="reduce gradients after the last backward pass "
                                         "instead of per layer during it")] = False,
    ddp_bucket_size: Annotated[int, typer.Option(
        "--ddp-bucket-size", help="DP gradient bucket in parameters (0: one bucket per "
                                  "layer)")] = 0,
    tp_comm_overlap: Annotated[bool, typer.Option(
        "--tp-comm-overlap", help="pipeline TP collectives with their GEMMs (Megatron "
                                  "--tp-comm-overlap); default: exposed where the next op "
                                  "needs them")] = False,
    overlap_param_gather: Annotated[bool, typer.Option(
        "--overlap-param-gather", help="ZeRO-1/2: all-gather the updated parameters bucket "
                                       "by bucket under the next step's first forward "
                                       "(Megatron --overlap-param-gather); default: after "
                                       "the optimizer, exposed")] = False,
    no_gradient_accumulation_fusion: Annotated[bool, typer.Option(
        "--no-gradient-accumulation-fusion",
        help="add each microbatch's weight gradients into the accumulated ones in place "
             "(Megatron-LM before 2022-02); default: accumulated inside the wgrad GEMMs")] = False,
    cross_entropy_loss_fusion: Annotated[bool, typer.Option(
        "--cross-entropy-loss-fusion",
        help="the loss as one fused pass over the logits (Megatron "
             "--cross-entropy-loss-fusion); default: the fp32 passes of Megatron's "
             "vocab_parallel_cross_entropy")] = False,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="table | json")] = OutputFormat.table,
    chrome_trace: Annotated[Optional[Path], typer.Option(
        "--chrome-trace", help="write the pipeline schedule as a Chrome trace JSON (every "
                               "microbatch scheduled)")] = None,
    evidence: EvidenceOption = None,
    runtime: RuntimeOption = "",
    runtime_version: RuntimeVersionOption = "",
    implementation: ImplementationOption = None,
    evidence_policy: EvidencePolicyOption = "interpolate",
    store: StoreOption = None,
    allow_foreign_evidence: AllowForeignOption = False,
    calibration: CalibrationOption = "default",
) -> None:
    """Estimate one training step: step time, tokens/s, MFU/HFU, memory per device and
    where the time goes, every op costed by the same resolver as `perfcast estimate`."""
    with user_errors():
        from perfcast.evidence.factory import build_resolver
        from perfcast.hardware import load_system
        from perfcast.training import TrainingLayout, TrainingRequest, estimate_training
        from perfcast.workload import load_model_spec

        check_output_paths(chrome_trace=chrome_trace)
        layout = TrainingLayout(tp=tp_size, pp=pp_size, dp=dp_size, cp=cp_size, ep=ep_size,
                                virtual_pipeline=virtual_pipeline_size,
                                sequence_parallel=sequence_parallel, recompute=recompute,
                                zero_stage=zero_stage,
                                account_for_embedding_in_pipeline_split=(
                                    account_for_embedding_in_pipeline_split),
                                account_for_loss_in_pipeline_split=(
                                    account_for_loss_in_pipeline_split))
        layout.check_devices(num_devices)
        spec = load_model_spec(model)
        for note in spec.notes:
            typer.echo(f"note: {note}", err=True)
        context = evidence_context(runtime, runtime_version, implementation or [], [])
        system = load_system(device)
        revision = load_calibration(calibration)
        layer = evidence_layer(system, evidence or [], evidence_policy, store,
                               allow_foreign_evidence)
        chain = [*layer.providers, *calibrated_for(device, revision)]
        resolver = build_resolver(system, chain) if chain else None
        request = TrainingRequest(model=spec, device=system, layout=layout,
                                  global_batch_size=global_batch_size,
                                  micro_batch_size=micro_batch_size, seq_length=seq_length,
                                  dtype=dtype, context=context,
                                  overlap_grad_reduce=not no_overlap_grad_reduce,
                                  tp_comm_overlap=tp_comm_overlap,
                                  overlap_param_gather=overlap_param_gather,
                                  grad_bucket_params=ddp_bucket_size,
                                  gradient_accumulation_fusion=(
                                      not no_gradient_accumulation_fusion),
                                  cross_entropy_loss_fusion=cross_entropy_loss_fusion)
        result = estimate_training(request, resolver)
        warning = evidence_silence(_AllOps(result), layer, context)
        if warning:
            typer.echo(f"warning: {warning}", err=True)
        if chrome_trace:
            from perfcast.training.report import write_training_trace

            write_training_trace(estimate_training(request, resolver, full_schedule=True)
                                 if result.schedule.scheduled_microbatches else result,
                                 chrome_trace)
        if output_format is OutputFormat.json:
            doc = result.to_json()
            doc["sources"] = {"evidence": layer.sources} if layer.sources else {}
            doc["calibration"] = {"revision": revision.digest if revision else "none"}
            typer.echo(json.dumps(doc, indent=2))
        else:
            from perfcast.training.report import print_training

            print_training(result, Console())


class _AllOps:
    """Every costed op of a training result, in the shape `evidence_silence` reads."""

    def __init__(self, result) -> None:
        tasks = [ct for cc in {id(c): c for c in result.costs}.values()
                 for g in (cc.forward, cc.backward_dp) for ct in g.tasks]

        class _Costed:
            pass

        self.costed = _Costed()
        self.costed.tasks = tasks
