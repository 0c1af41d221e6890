"""`perfcast profiling validate DIR`: check a TensorCast profiling database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(no_args_is_help=True, help="TensorCast profiling databases.")


@app.command("validate")
def validate_command(
    directory: Annotated[Path, typer.Argument(help="directory holding op_mapping.yaml and "
                                                   "{kernel_type}.csv files")],
    warnings: Annotated[bool, typer.Option("--warnings/--no-warnings",
                                           help="also list warnings")] = True,
) -> None:
    """Check op_mapping.yaml (fields, exclusions) and that every kernel the runtime
    reads has a CSV with the columns its query path needs. Exit 1 on errors."""
    from perfcast.evidence.profiling.validate import validate_database

    report = validate_database(directory)
    for issue in report.issues:
        if issue.severity == "error" or warnings:
            typer.echo(str(issue))
    typer.echo(f"{report.directory}: {report.operators} operator mappings, "
               f"{report.kernels_checked} kernel CSVs checked, {len(report.errors)} errors, "
               f"{len(report.warnings)} warnings")
    if not report.ok:
        raise typer.Exit(1)
