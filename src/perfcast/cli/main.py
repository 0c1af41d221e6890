"""`perfcast` entry point: assembles the command groups."""

from __future__ import annotations

import typer

from perfcast.cli import catalog, collect, estimate, profiling, search, serve, validate
from perfcast.cli import calibrate, observe, workbench
from perfcast.cli import evidence as evidence_cli
from perfcast.cli import train
from perfcast.cli import train_search

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Predict LLM inference performance on accelerators, with provenance.")
app.command("estimate", context_settings=estimate.CONTEXT_SETTINGS)(estimate.estimate_command)
app.command("devices")(catalog.devices_command)
app.command("models")(catalog.models_command)
app.add_typer(profiling.app, name="profiling")
app.add_typer(evidence_cli.app, name="evidence")
app.add_typer(collect.app, name="collect")
app.add_typer(observe.app, name="observe")
app.add_typer(calibrate.app, name="calibrate")
app.command("serve")(serve.serve_command)
app.command("search")(search.search_command)
app.add_typer(validate.app, name="validate")
app.command("train")(train.train_command)
app.command("train-search")(train_search.train_search_command)
app.command("workbench")(workbench.workbench_command)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
