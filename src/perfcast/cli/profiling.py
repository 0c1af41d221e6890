"""`perfcast profiling validate DIR`: check a TensorCast profiling database;
`perfcast profiling init-mapping`: write an op_mapping.yaml skeleton for one."""

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

    _report(validate_database(directory), warnings)


def _report(report, warnings: bool = True) -> None:
    for issue in report.issues:
        if issue.severity == "error" or warnings:
            typer.echo(str(issue))
    typer.echo(f"{report.directory}: {report.operators} operator mappings, "
               f"{report.kernels_checked} kernel CSVs checked, {len(report.errors)} errors, "
               f"{len(report.warnings)} warnings")
    if not report.ok:
        raise typer.Exit(1)


@app.command("init-mapping")
def init_mapping_command(
    model: Annotated[str, typer.Option("--model", help="model config.json or catalog name")],
    database: Annotated[Path, typer.Option("--database", help="folder of {KernelType}.csv "
                                           "files (Ascend profiling or collect parse)")],
    stack: Annotated[str, typer.Option("--stack", help="seed the entries from this stack's "
                                       "reference mapping: vllm-ascend-0.18")] = "",
    output: Annotated[Path | None, typer.Option("--output", help="where to write "
                                                "(default DATABASE/op_mapping.yaml)")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
    device: Annotated[str, typer.Option("--device", help="the device the database was "
                                        "measured on (default: the collection manifest's)")] = "",
    tp_size: Annotated[int, typer.Option("--tp-size", help="tensor-parallel degree")] = 1,
    ep_size: Annotated[int, typer.Option("--ep-size", help="expert-parallel degree")] = 1,
    warnings: Annotated[bool, typer.Option("--warnings/--no-warnings",
                                           help="also list validate's warnings")] = True,
) -> None:
    """Write an op_mapping.yaml skeleton from the operators the model's prefill and decode
    graphs call and the kernel CSVs in DATABASE, then validate it (exit code as
    `profiling validate`)."""
    from perfcast.cli.errors import check_output_paths, user_errors
    from perfcast.cli.layout import build_plan
    from perfcast.core.errors import ConfigError
    from perfcast.collect.init_mapping import init_mapping, write_skeleton
    from perfcast.evidence.profiling.op_mapping import MAPPING_FILE
    from perfcast.evidence.profiling.validate import validate_database

    target = output or database / MAPPING_FILE
    if output is not None:
        check_output_paths(output=output)
    with user_errors():
        if target.exists() and not force:
            raise ConfigError("exists", source=str(target), field="--output",
                              expected="another --output, or --force to overwrite it")
        sk = init_mapping(model, database, stack=stack, device=device,
                          plan=build_plan(tp_size, 1, 0, ep_size, 0, 0))
        write_skeleton(sk, target, force=True)
    typer.echo(f"wrote {target}: {sk.count('forward')} forward mappings, "
               f"{sk.count('zero_cost')} zero-cost, {sk.count('accepted_miss')} accepted "
               f"misses, {sk.count('todo')} TODO, {sk.count('reverse')} profiling-only kernels")
    _report(validate_database(database, mapping_file=target), warnings)
