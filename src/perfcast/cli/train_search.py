"""`perfcast train-search MODEL`: training layouts for GPU budgets that fit memory, ranked
by step time, with the Pareto front of step time against devices."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from perfcast.cli.calibration_option import CalibrationOption
from perfcast.cli.errors import user_errors
from perfcast.cli.evidence_options import (
    AllowForeignOption,
    EvidenceOption,
    EvidencePolicyOption,
    ImplementationOption,
    RuntimeOption,
    RuntimeVersionOption,
    StoreOption,
)
from perfcast.core.errors import ConfigError


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


def parse_sizes(text: str, flag: str) -> tuple[int, ...]:
    """`8,16,32`; `A-B` = A, 2A, 4A, ... up to B; `A-B:S` = A, A+S, ... up to B."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            if "-" in part:
                lo_text, _, rest = part.partition("-")
                hi_text, _, step_text = rest.partition(":")
                lo, hi = int(lo_text), int(hi_text)
                step = int(step_text) if step_text else None
                if lo < 1 or hi < lo or (step is not None and step < 1):
                    raise ValueError
                value = lo
                while value <= hi:
                    out.append(value)
                    value = value + step if step else value * 2
            else:
                out.append(int(part))
        except ValueError:
            raise ConfigError(f"has value {text!r}", field=flag,
                              expected="positive integers: 8,16,32 or a range A-B (doubling) "
                                       "or A-B:STEP") from None
    if not out or min(out) < 1:
        raise ConfigError(f"has value {text!r}", field=flag, expected="positive integers")
    return tuple(sorted(set(out)))


def _words(text: str, flag: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    values = tuple(w.strip() for w in text.split(",") if w.strip())
    bad = [w for w in values if w not in allowed]
    if bad or not values:
        raise ConfigError(f"has value {text!r}", field=flag, expected=",".join(allowed))
    return values


SP_CHOICES = {"both": (False, True), "on": (True,), "off": (False,)}


@dataclass(frozen=True)
class TrainSearchArgs:
    """The inputs of one `perfcast train-search` (options by their Python names; lists as
    the comma-separated text the flags take), for the CLI and the workbench API."""

    model: str
    device: str = "h100_sxm"
    num_devices: str = "8"
    global_batch_size: int = 512
    seq_length: int = 2048
    dtype: str = "bf16"
    tp_sizes: str = "1,2,4,8"
    pp_sizes: str = "1,2,4,8,16"
    cp_sizes: str = "1"
    ep_sizes: str = "1"
    virtual_pipeline_sizes: str = "1,2"
    micro_batch_sizes: str = "1,2,4"
    sequence_parallel: str = "both"
    recompute: str = "none,selective,full"
    zero_stages: str = "0,1"
    top_n: int = 10
    executor: str = "local"
    workers: int = 0
    tp_comm_overlap: bool = False
    no_overlap_grad_reduce: bool = False
    calibration: str = "default"
    evidence: tuple[str, ...] = ()
    runtime: str = ""
    runtime_version: str = ""
    implementation: tuple[str, ...] = ()
    evidence_policy: str = "interpolate"
    store: str | None = None
    allow_foreign_evidence: bool = False


@functools.lru_cache(maxsize=4)
def _providers(device: str, calibration: str, evidence: tuple[str, ...], policy: str,
               store: str | None, allow_foreign: bool) -> tuple:
    """The provider chain `perfcast train` builds: measured evidence, then the calibration
    revision's analytic providers (cached per process: workers build it once)."""
    from pathlib import Path

    from perfcast.cli.calibration_option import load as load_calibration
    from perfcast.cli.estimate import calibrated_for
    from perfcast.cli.estimate_sources import evidence_layer
    from perfcast.hardware import load_system

    system = load_system(device)
    layer = evidence_layer(system, list(evidence), policy, Path(store) if store else None,
                           allow_foreign)
    return (*layer.providers, *calibrated_for(device, load_calibration(calibration)))


def make_search_resolver(device: str, calibration: str, evidence: tuple[str, ...],
                         policy: str, store: str | None, allow_foreign: bool):
    """A fresh resolver over the cached provider chain (one per chunk of layouts)."""
    from perfcast.evidence.factory import build_resolver
    from perfcast.hardware import load_system

    return build_resolver(load_system(device),
                         _providers(device, calibration, evidence, policy, store, allow_foreign))


def build_space(a: TrainSearchArgs, spec):
    from perfcast.cli.estimate import evidence_context
    from perfcast.training.search import RECOMPUTE_CHOICES, TrainSearchSpace

    if a.sequence_parallel not in SP_CHOICES:
        raise ConfigError(f"has value {a.sequence_parallel!r}", field="--sequence-parallel",
                          expected="both | on | off")
    zero = tuple(int(z) for z in _words(a.zero_stages, "--zero-stages", ("0", "1", "2", "3")))
    return TrainSearchSpace(
        model=spec, device=a.device, num_devices=parse_sizes(a.num_devices, "--num-devices"),
        global_batch_size=a.global_batch_size, seq_length=a.seq_length, dtype=a.dtype,
        tp_sizes=parse_sizes(a.tp_sizes, "--tp-sizes"),
        pp_sizes=parse_sizes(a.pp_sizes, "--pp-sizes"),
        cp_sizes=parse_sizes(a.cp_sizes, "--cp-sizes"),
        ep_sizes=parse_sizes(a.ep_sizes, "--ep-sizes"),
        virtual_pipeline_sizes=parse_sizes(a.virtual_pipeline_sizes, "--virtual-pipeline-sizes"),
        micro_batch_sizes=parse_sizes(a.micro_batch_sizes, "--micro-batch-sizes"),
        sequence_parallel=SP_CHOICES[a.sequence_parallel],
        recompute=_words(a.recompute, "--recompute", RECOMPUTE_CHOICES), zero_stages=zero,
        tp_comm_overlap=a.tp_comm_overlap, overlap_grad_reduce=not a.no_overlap_grad_reduce,
        resolver_factory=functools.partial(make_search_resolver, a.device, a.calibration,
                                           tuple(a.evidence), a.evidence_policy, a.store,
                                           a.allow_foreign_evidence),
        context=evidence_context(a.runtime, a.runtime_version, list(a.implementation), []))


def run_train_search(a: TrainSearchArgs, note=lambda text: None, on_start=None,
                     on_progress=None):
    """(the `--format json` document, the candidates) of `a`."""
    from perfcast.hardware import load_system
    from perfcast.training.search import search
    from perfcast.workload import load_model_spec

    spec = load_model_spec(a.model)
    for text in spec.notes:
        note(f"note: {text}")
    system = load_system(a.device)
    space = build_space(a, spec)
    _providers(a.device, a.calibration, tuple(a.evidence), a.evidence_policy, a.store,
               a.allow_foreign_evidence)   # bad --evidence / --calibration fail here
    result = search(space, executor=a.executor, workers=a.workers or None,
                    on_start=on_start, on_progress=on_progress)
    from perfcast.cli.calibration_option import load as load_calibration

    revision = load_calibration(a.calibration)
    return train_search_report(space, spec, system, result, a.top_n,
                               revision.digest if revision else "none", a.evidence), result


def train_search_report(space, spec, system, result, top_n: int, calibration: str = "none",
                        evidence: tuple[str, ...] = ()) -> dict:
    from perfcast.training.search import best_per_budget, failure_counts, provenance, ranked

    cands = result.candidates
    best = ranked(cands)
    return {
        "inputs": {"model": spec.name, "model_digest": spec.digest, "model_source": spec.source,
                   "device": system.name, "system_digest": system.digest,
                   "num_devices": list(space.num_devices),
                   "global_batch_size": space.global_batch_size,
                   "seq_length": space.seq_length, "dtype": space.dtype,
                   "tp_sizes": list(space.tp_sizes), "pp_sizes": list(space.pp_sizes),
                   "cp_sizes": list(space.cp_sizes), "ep_sizes": list(space.ep_sizes),
                   "virtual_pipeline_sizes": list(space.virtual_pipeline_sizes),
                   "micro_batch_sizes": list(space.micro_batch_sizes),
                   "sequence_parallel": list(space.sequence_parallel),
                   "recompute": list(space.recompute), "zero_stages": list(space.zero_stages),
                   "tp_comm_overlap": space.tp_comm_overlap,
                   "overlap_grad_reduce": space.overlap_grad_reduce,
                   "notes": list(spec.notes)},
        "calibration": calibration,
        "evidence": list(evidence),
        "provenance": provenance(cands),
        "pareto": [c.to_json() for c in cands if c.pareto],
        "best_per_budget": {str(n): c.to_json() for n, c in best_per_budget(cands).items()},
        "top": [c.to_json() for c in best[:top_n]],
        "evaluated": len(cands),
        "fit": sum(c.fits for c in cands),
        "skipped_not_dividing": result.skipped,
        "first_skip_reason": result.first_skip_reason,
        "wall_s": result.wall_s,
        "failures": failure_counts(cands),
        "candidates": [c.to_json() for c in cands],
    }


def train_search_command(
    model: Annotated[str, typer.Argument(help="config.json path, folder or built-in id")],
    device: Annotated[str, typer.Option(help="catalog id or a system YAML path")] = "h100_sxm",
    num_devices: Annotated[str, typer.Option(
        "--num-devices", help="GPU budgets: 64, 8,16,32, or a range 8-64 (doubling) / "
        "8-64:8")] = "8",
    global_batch_size: Annotated[int, typer.Option("--global-batch-size",
                                                   help="sequences per step")] = 512,
    seq_length: Annotated[int, typer.Option("--seq-length")] = 2048,
    dtype: Annotated[str, typer.Option(help="bf16 | fp16 | fp8")] = "bf16",
    tp_sizes: Annotated[str, typer.Option("--tp-sizes")] = "1,2,4,8",
    pp_sizes: Annotated[str, typer.Option("--pp-sizes")] = "1,2,4,8,16",
    cp_sizes: Annotated[str, typer.Option("--cp-sizes")] = "1",
    ep_sizes: Annotated[str, typer.Option("--ep-sizes", help="expert-parallel sizes (MoE)")] = "1",
    virtual_pipeline_sizes: Annotated[str, typer.Option("--virtual-pipeline-sizes")] = "1,2",
    micro_batch_sizes: Annotated[str, typer.Option("--micro-batch-sizes")] = "1,2,4",
    sequence_parallel: Annotated[str, typer.Option(
        "--sequence-parallel", help="both | on | off (on needs TP > 1)")] = "both",
    recompute: Annotated[str, typer.Option(help="any of none,selective,full")
                         ] = "none,selective,full",
    zero_stages: Annotated[str, typer.Option("--zero-stages", help="any of 0,1,2,3")] = "0,1",
    tp_comm_overlap: Annotated[bool, typer.Option(
        "--tp-comm-overlap", help="TP collectives pipelined with their GEMMs (every layout)")
    ] = False,
    no_overlap_grad_reduce: Annotated[bool, typer.Option(
        "--no-overlap-grad-reduce", help="reduce gradients after the last backward pass")
    ] = False,
    top_n: Annotated[int, typer.Option("--top", help="layouts to list")] = 10,
    executor: Annotated[str, typer.Option(help="local (processes) | inline | ray")] = "local",
    workers: Annotated[int, typer.Option(help="local processes (0: one per CPU)")] = 0,
    output_format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    evidence: EvidenceOption = None,
    runtime: RuntimeOption = "",
    runtime_version: RuntimeVersionOption = "",
    implementation: ImplementationOption = None,
    evidence_policy: EvidencePolicyOption = "interpolate",
    store: StoreOption = None,
    allow_foreign_evidence: AllowForeignOption = False,
    calibration: CalibrationOption = "default",
) -> None:
    """Enumerate training layouts for the budgets, keep those that fit memory, rank by step
    time; print the Pareto front of step time vs devices, the best per budget and top-N."""
    from perfcast.cli.progress import progress_bar

    with user_errors():
        args = TrainSearchArgs(
            model=model, device=device, num_devices=num_devices,
            global_batch_size=global_batch_size, seq_length=seq_length, dtype=dtype,
            tp_sizes=tp_sizes, pp_sizes=pp_sizes, cp_sizes=cp_sizes, ep_sizes=ep_sizes,
            virtual_pipeline_sizes=virtual_pipeline_sizes,
            micro_batch_sizes=micro_batch_sizes, sequence_parallel=sequence_parallel,
            recompute=recompute, zero_stages=zero_stages, tp_comm_overlap=tp_comm_overlap,
            no_overlap_grad_reduce=no_overlap_grad_reduce, top_n=top_n, executor=executor,
            workers=workers, calibration=calibration, evidence=tuple(evidence or ()),
            runtime=runtime, runtime_version=runtime_version,
            implementation=tuple(implementation or ()), evidence_policy=evidence_policy,
            store=str(store) if store else None, allow_foreign_evidence=allow_foreign_evidence)
        with progress_bar("estimating layouts") as advance:
            total = {"n": 0}

            def on_start(n: int) -> None:
                total["n"] = n
                advance(0, n)

            doc, _ = run_train_search(args, note=lambda text: typer.echo(text, err=True),
                                      on_start=on_start,
                                      on_progress=lambda done: advance(done, total["n"]))
        if output_format is OutputFormat.json:
            typer.echo(json.dumps(doc, indent=2))
            return
        print_train_search(doc, Console())


def print_train_search(doc: dict, console: Console) -> None:
    from perfcast.training.search import FAILURE_REASONS

    inp = doc["inputs"]
    for line in (f"model      {inp['model']} ({inp['model_digest'][:19]})",
                 f"device     {inp['device']} ({inp['system_digest'][:19]}), budgets "
                 f"{','.join(map(str, inp['num_devices']))}",
                 f"step       global batch {inp['global_batch_size']} x seq "
                 f"{inp['seq_length']}, {inp['dtype']}",
                 f"layouts    TP {inp['tp_sizes']} PP {inp['pp_sizes']} CP {inp['cp_sizes']} "
                 f"EP {inp['ep_sizes']} V {inp['virtual_pipeline_sizes']} micro-batch "
                 f"{inp['micro_batch_sizes']}, recompute {','.join(inp['recompute'])}, ZeRO "
                 f"{inp['zero_stages']}",
                 f"costed by  calibration {doc['calibration'][:19]}, evidence "
                 f"{', '.join(doc['evidence']) or 'none'}"):
        console.print(line, markup=False, highlight=False)
    for title, rows in (("Pareto front: step time vs devices", doc["pareto"]),
                        ("best per budget", list(doc["best_per_budget"].values())),
                        (f"top {len(doc['top'])} by step time", doc["top"])):
        if not rows:
            continue
        table = Table(title=f"{title} (seconds per step; GiB on the most loaded device)",
                      box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
        for col in ("layout", "GPUs", "step s", "ktok/s", "MFU", "GiB", "bubble",
                    "DP exp", "TP exp"):
            table.add_column(col, justify="left" if col == "layout" else "right",
                             no_wrap=col == "layout")
        for c in rows:
            mem, br = c["memory_bytes"], c["breakdown_s"]
            table.add_row(c["label"], str(c["num_devices"]), f"{c['step_time_s']:.3f}",
                          f"{c['tokens_per_s'] / 1e3:,.1f}", _pct(c["mfu"]),
                          f"{mem.get('total', 0) / 2**30:.1f}",
                          _s(br.get("pp_bubble")), _s(br.get("dp_comm_exposed")),
                          _s(br.get("tp_comm_exposed")))
        console.print(table)
    console.print(f"{doc['evaluated']} layouts estimated in {doc['wall_s']:.1f} s, "
                  f"{doc['fit']} fit memory; {doc['skipped_not_dividing']} size combinations "
                  "do not divide", highlight=False)
    for reason, n in doc["failures"].items():
        console.print(f"  {n:>5} {reason}: {FAILURE_REASONS[reason]}", highlight=False)
    answers = doc["provenance"]
    if answers:
        console.print("cost answers: " + ", ".join(f"{k} {v:,}" for k, v in answers.items()),
                      highlight=False)
    first = next((c for c in doc["candidates"] if c["failure"] == "invalid_layout"), None)
    if first:
        console.print(f"  first rejected: {first['label']} ({first['num_devices']} GPUs): "
                      f"{first['error']}", markup=False, highlight=False)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _s(value) -> str:
    return "-" if value is None else f"{value:.3f}"

