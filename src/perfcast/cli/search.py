"""`perfcast search MODEL`: best serving configurations for a GPU budget under SLOs."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from perfcast.cli.calibration_option import CalibrationOption, analytic_for, backend_overheads
from perfcast.cli.calibration_option import load as load_calibration
from perfcast.cli.errors import user_errors


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


def _ints(text: str, flag: str) -> tuple[int, ...]:
    from perfcast.core.errors import ConfigError

    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"has value {text!r}", field=flag,
                          expected="comma-separated integers") from None
    if not values or min(values) < 1:
        raise ConfigError(f"has value {text!r}", field=flag, expected="positive integers")
    return values


def search_command(
    model: Annotated[str, typer.Argument(help="config.json path, folder or built-in id")],
    device: Annotated[str, typer.Option(help="catalog id or a system YAML path")] = "h100_sxm",
    backend: Annotated[str, typer.Option(help="vllm | sglang | trtllm")] = "vllm",
    backend_version: Annotated[str, typer.Option("--backend-version")] = "",
    gpus: Annotated[int, typer.Option(help="GPU budget")] = 8,
    isl: Annotated[int, typer.Option()] = 1024,
    osl: Annotated[int, typer.Option()] = 256,
    concurrency: Annotated[str, typer.Option(help="client concurrencies to try")] = "4,8,16,32,64,128",
    tp_sizes: Annotated[str, typer.Option("--tp-sizes")] = "1,2,4,8",
    dp_sizes: Annotated[str, typer.Option("--dp-sizes", help="attention-DP sizes")] = "1",
    ep_sizes: Annotated[str, typer.Option("--ep-sizes")] = "1",
    modes: Annotated[str, typer.Option(help="agg,disagg")] = "agg,disagg",
    max_ttft_ms: Annotated[Optional[float], typer.Option("--max-ttft-ms")] = None,
    max_tpot_ms: Annotated[Optional[float], typer.Option("--max-tpot-ms")] = None,
    top_n: Annotated[int, typer.Option("--top", help="configurations to list")] = 10,
    executor: Annotated[str, typer.Option(help="local (processes) | inline | ray")] = "local",
    workers: Annotated[int, typer.Option(help="local processes (0: one per CPU)")] = 0,
    evidence_root: Annotated[Optional[Path], typer.Option("--evidence-root")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="write the Pareto plot (.html or .png)")] = None,
    output_format: Annotated[OutputFormat, typer.Option("--format")] = OutputFormat.table,
    calibration: CalibrationOption = "default",
) -> None:
    """Sweep layouts, concurrency and agg vs disagg; print the Pareto frontier and top-N."""
    from perfcast.serving.search import SearchSpace, candidate_json, search, top

    with user_errors():
        revision = load_calibration(calibration)
        from perfcast.hardware import load_system
        from perfcast.serving.backends import load_backend
        fitted = backend_overheads(revision, load_backend(backend).name)
        space = SearchSpace(
            model=model, system=device, backend=backend, backend_version=backend_version,
            gpus=gpus, isl=isl, osl=osl, concurrencies=_ints(concurrency, "--concurrency"),
            tp_sizes=_ints(tp_sizes, "--tp-sizes"), dp_sizes=_ints(dp_sizes, "--dp-sizes"),
            ep_sizes=_ints(ep_sizes, "--ep-sizes"),
            modes=tuple(m.strip() for m in modes.split(",") if m.strip()),
            max_ttft_ms=max_ttft_ms, max_tpot_ms=max_tpot_ms,
            evidence_root=str(evidence_root) if evidence_root else None,
            overheads=tuple(sorted(fitted.items())),
            extra_providers=tuple((analytic_for(revision) or (lambda _: []))(
                load_system(device).name)))
        cands = search(space, executor=executor, workers=workers or None)
        if plot:
            from perfcast.serving.plots import write_plot

            write_plot(cands, plot)
        best = top(cands, top_n)
        front = [c for c in cands if c.pareto]
        if output_format is OutputFormat.json:
            typer.echo(json.dumps({"pareto": [candidate_json(c) for c in front],
                                   "top": [candidate_json(c) for c in best],
                                   "evaluated": len(cands),
                                   "calibration": revision.digest if revision else "none",
                                   "failed": [{"layout": c.layout, "concurrency": c.concurrency,
                                               "error": c.error} for c in cands if c.error]},
                                  indent=2))
            return
        console = Console()
        for title, rows in (("Pareto frontier", front), (f"top {top_n} by tokens/s/GPU", best)):
            table = Table(title=title)
            for col in ("layout", "GPUs", "C", "TTFT ms", "TPOT ms", "tok/s/GPU", "tok/s/user"):
                table.add_column(col, justify="left" if col == "layout" else "right")
            for c in rows:
                m = c.metrics
                table.add_row(c.layout, str(c.gpus), str(c.concurrency),
                              f"{m['ttft_ms']['mean']:.1f}", f"{m['tpot_ms']['mean']:.2f}",
                              f"{m['tokens_per_s_per_gpu']:.1f}",
                              f"{m['tokens_per_s_per_user']:.1f}")
            console.print(table)
        console.print(f"{len(cands)} configurations evaluated, "
                      f"{sum(c.meets_slo for c in cands)} meet the SLOs, "
                      f"{sum(bool(c.error) for c in cands)} failed")
