"""`perfcast collect parse|grid|replay|comm`: build a performance database for a device.

Flag names follow the TensorCast collection tools (perf-data-collection-tools spec).
List flags accept repeated use, commas, or (as in the TensorCast tools) several values
after one flag: `--ops all_reduce,all_gather` = `--ops all_reduce all_gather`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

from perfcast.cli.errors import user_errors
from perfcast.cli.progress import progress_bar
from perfcast.core.errors import ConfigError

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Collect performance data: parse profiles, grid shapes, replay, "
                       "collective benchmarks.")

DEFAULT_DEVICE = "ATLAS_800_A3_752T_128G_DIE"
DATABASE_ROOT = Path("perf_database")

DatabaseOpt = Annotated[Optional[Path], typer.Option(
    "--database-path", help="database folder (else derived from --device and versions)")]
DeviceOpt = Annotated[str, typer.Option(
    "--device", help=f"device the data is measured on; names the database folder "
                     f"(default {DEFAULT_DEVICE} there)")]
VllmOpt = Annotated[str, typer.Option("--vllm-version", help="vLLM version or full version-directory name")]
TorchOpt = Annotated[str, typer.Option("--torch-version", help="PyTorch version")]
CannOpt = Annotated[str, typer.Option("--cann-version", help="CANN version")]


LIST_OPTIONS = ("--ops", "--num-devices", "--bytes-grid", "--target-models", "--tp-sizes",
                "--ep-sizes", "--batch-sizes", "--prefill-lengths", "--decode-lengths")


def join_list_values(args: list[str], options: tuple[str, ...] = LIST_OPTIONS) -> list[str]:
    """`--ops a b --x` -> `--ops a,b --x`: the values following a list option up to the
    next option become one comma-separated value (argparse `nargs="+"` style)."""
    out, i = [], 0
    while i < len(args):
        out.append(args[i])
        i += 1
        if out[-1] in options:
            values = []
            while i < len(args) and not args[i].startswith("-"):
                values.append(args[i])
                i += 1
            if values:
                out.append(",".join(values))
    return out


class ListOptionsCommand(TyperCommand):
    """A command whose list options also take several space-separated values."""

    def parse_args(self, ctx, args):  # noqa: ANN001 - click's signature
        return super().parse_args(ctx, join_list_values(list(args)))


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def derive_database_path(database_path: Path | None, device: str, vllm: str, torch: str,
                         cann: str, *, root: Path = DATABASE_ROOT) -> Path:
    """`--database-path`, or `perf_database/{device}/vllm_ascend/vllm{V}_torch{T}_cann{C}`
    (a `--vllm-version` holding `_` is taken as the whole version-directory name)."""
    if database_path is not None:
        return database_path
    device = device or DEFAULT_DEVICE
    if vllm and "_" in vllm:
        return root / device / "vllm_ascend" / vllm
    missing = [f for f, v in (("--vllm-version", vllm), ("--torch-version", torch),
                              ("--cann-version", cann)) if not v]
    if missing:
        raise ConfigError("cannot derive the database folder", field=", ".join(missing),
                          expected="--database-path, or --vllm-version/--torch-version/"
                                   "--cann-version")
    return root / device / "vllm_ascend" / f"vllm{vllm}_torch{torch}_cann{cann}"


@app.command("parse")
def parse_command(
    profiling_path: Annotated[Path, typer.Option("--profiling-path", help="kernel_details*.csv, "
                                                 "op_summary_*.csv, a torch trace, or a folder")],
    database_path: DatabaseOpt = None, device: DeviceOpt = "",
    vllm_version: VllmOpt = "", torch_version: TorchOpt = "", cann_version: CannOpt = "",
) -> None:
    """Parse profiler output into per-kernel CSVs ({KernelType}.csv)."""
    from perfcast.collect.parse import parse_profiling

    with user_errors():
        db = derive_database_path(database_path, device, vllm_version, torch_version, cann_version)
        device = device or ("" if database_path else DEFAULT_DEVICE)  # the folder names it
        provenance = {k: v for k, v in (("device", device), ("vllm_version", vllm_version),
                                         ("torch_version", torch_version),
                                         ("cann_version", cann_version)) if v}
        result = parse_profiling(profiling_path, db, provenance)
        typer.echo(f"parsed {result.samples} kernel calls from {len(result.sources)} file(s) "
                   f"into {len(result.written) - 1} CSV(s) under {db}")
        if result.skipped_communication:
            typer.echo(f"skipped {result.skipped_communication} hcom_* calls (no message size "
                       "in a kernel profile; measure them with `collect comm`)")


@app.command("grid", cls=ListOptionsCommand)
def grid_command(
    database_path: DatabaseOpt = None, device: DeviceOpt = "",
    vllm_version: VllmOpt = "", torch_version: TorchOpt = "", cann_version: CannOpt = "",
    target_models: Annotated[Optional[list[str]], typer.Option(
        "--target-models", help="model config paths or built-in ids (comma-separated); "
                                "default: every built-in model (the full grid)")] = None,
    rows: Annotated[int, typer.Option("--rows", help="max appended rows per CSV; 0 = no cap")] = 1000,
    seed: Annotated[Optional[int], typer.Option("--seed", help="sampling seed (default 0)")] = None,
    max_memory_gb: Annotated[float, typer.Option(
        "--max-memory-gb", "--max-hbm-gb", help="per-row tensor budget in GiB; 0 disables")] = 32.0,
    tp_sizes: Annotated[Optional[list[str]], typer.Option("--tp-sizes", help="TP degrees")] = None,
    ep_sizes: Annotated[Optional[list[str]], typer.Option(
        "--ep-sizes", help="EP degrees of MoE expert GEMM rows")] = None,
    ops: Annotated[Optional[list[str]], typer.Option("--ops", help="only these kernel types")] = None,
    batch_sizes: Annotated[Optional[list[str]], typer.Option(
        "--batch-sizes", help="requests per step (with op_mapping.yaml)")] = None,
    prefill_lengths: Annotated[Optional[list[str]], typer.Option(
        "--prefill-lengths", help="prompt tokens of prefill steps (with op_mapping.yaml)")] = None,
    decode_lengths: Annotated[Optional[list[str]], typer.Option(
        "--decode-lengths", help="context tokens of decode steps (with op_mapping.yaml)")] = None,
) -> None:
    """Append theory shape rows (empty durations) for the target models: with an
    op_mapping.yaml, the kernel rows their estimates look up."""
    from perfcast.collect.grid import (
        BATCH_GRID,
        EP_SIZES,
        PREFILL_GRID,
        TP_SIZES,
        decode_contexts,
        generate_grid,
    )

    def ints(values, default):
        return tuple(int(t) for t in _split(values)) or default

    with user_errors():
        db = derive_database_path(database_path, device, vllm_version, torch_version, cann_version)
        result = generate_grid(db, _split(target_models), rows=rows, seed=seed,
                               max_memory_gb=max_memory_gb, tp_sizes=ints(tp_sizes, TP_SIZES),
                               ops=_split(ops), ep_sizes=ints(ep_sizes, EP_SIZES), device=device,
                               batch_sizes=ints(batch_sizes, BATCH_GRID),
                               prefill_lengths=ints(prefill_lengths, PREFILL_GRID),
                               decode_lengths=ints(decode_lengths, decode_contexts()))
        if result.calls:
            why = ", ".join(f"{n} {reason}" for reason, n in result.no_row.items())
            typer.echo(f"{result.calls} distinct calls looked up" + (f"; without a row: {why}"
                                                                     if why else ""))
        for ktype, n in sorted(result.appended.items()):
            typer.echo(f"{ktype}: +{n} rows")
        typer.echo(f"appended {sum(result.appended.values())} rows to {len(result.written)} CSV(s)")


@app.command("replay", cls=ListOptionsCommand)
def replay_command(
    database_path: DatabaseOpt = None, device: DeviceOpt = "",
    vllm_version: VllmOpt = "", torch_version: TorchOpt = "", cann_version: CannOpt = "",
    ops: Annotated[Optional[list[str]], typer.Option("--ops", help="only these kernel types")] = None,
    repeat_count: Annotated[int, typer.Option("--repeat-count", help="timed calls per row")] = 30,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed calls per row first")] = 3,
    update_mode: Annotated[str, typer.Option("--update-mode", help="all | missing-only")] = "all",
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="stop at the first failure")] = False,
    prune: Annotated[bool, typer.Option("--prune-empty-duration-rows",
                                        help="delete rows still without a valid duration")] = False,
    backend: Annotated[str, typer.Option(
        "--backend", help="auto (the one that runs on the database's device: npu for "
                          "Ascend, cuda for NVIDIA, cpu for a host CPU) | cpu | cuda | npu")] = "auto",
    flush_l2: Annotated[bool, typer.Option("--flush-l2", help="CUDA: cold L2 before each call")] = False,
    max_rows: Annotated[int, typer.Option("--max-rows", help="cap rows per CSV; 0 = all")] = 0,
    num_threads: Annotated[int, typer.Option(
        "--num-threads", help="CPU: torch intra-op threads (0 = torch's default)")] = 0,
    dfc_ep_size: Annotated[int, typer.Option(
        "--dispatch-ffn-combine-ep-size",
        help="EP size for DispatchFFNCombine replay and row matching")] = 16,
    dfc_nproc: Annotated[Optional[int], typer.Option(
        "--dispatch-ffn-combine-nproc-per-node",
        help="torchrun processes per node for DispatchFFNCombine (default: EP size / nnodes)")] = None,
    dfc_nnodes: Annotated[int, typer.Option(
        "--dispatch-ffn-combine-nnodes", help="torchrun nodes for DispatchFFNCombine")] = 1,
    dfc_node_rank: Annotated[int, typer.Option(
        "--dispatch-ffn-combine-node-rank", help="torchrun rank of this node")] = 0,
    dfc_master_addr: Annotated[str, typer.Option(
        "--dispatch-ffn-combine-master-addr", help="torchrun master address")] = "127.0.0.1",
    dfc_master_port: Annotated[Optional[int], typer.Option(
        "--dispatch-ffn-combine-master-port", help="torchrun master port")] = None,
) -> None:
    """Re-measure rows as microbenchmarks and write the durations back, with a report.
    The CSVs are written back every few rows, so a stopped run resumes with
    `--update-mode missing-only`."""
    from perfcast.collect.devices import choose_backend, database_device
    from perfcast.collect.replay import (
        DistributedLaunch,
        ReplaySettings,
        make_backend,
        replay_database,
    )
    from perfcast.collect.report import write_reports

    with user_errors():
        db = derive_database_path(database_path, device, vllm_version, torch_version, cann_version)
        settings = ReplaySettings(repeat_count=repeat_count, warmup=warmup)
        launch = DistributedLaunch(ep_size=dfc_ep_size, nproc_per_node=dfc_nproc,
                                   nnodes=dfc_nnodes, node_rank=dfc_node_rank,
                                   master_addr=dfc_master_addr, master_port=dfc_master_port)
        measured_on = database_device(db, device or ("" if database_path else DEFAULT_DEVICE))
        backend = choose_backend(backend, measured_on)
        runner = make_backend(backend, flush_l2=flush_l2, launch=launch, num_threads=num_threads)
        try:
            with progress_bar("replaying") as advance:
                run = replay_database(db, runner, ops=_split(ops), ep_size=dfc_ep_size,
                                      update_mode=update_mode, settings=settings,
                                      fail_fast=fail_fast, prune_empty_duration_rows=prune,
                                      max_rows=max_rows, device=measured_on, progress=advance)
        except KeyboardInterrupt:
            typer.echo("interrupted: the rows measured so far are written back; rerun with "
                       "--update-mode missing-only to resume", err=True)
            raise typer.Exit(130) from None
        md, _ = write_reports(run)
        typer.echo(f"replayed {len(run.replayed)} rows on {backend} ({run.device}), "
                   f"{len(run.failed)} failed, {run.skipped_valid} skipped"
                   + (f", {run.skipped_other_ep} of another EP size" if run.skipped_other_ep
                      else "") + f"; report {md}")


@app.command("comm", cls=ListOptionsCommand)
def comm_command(
    database_path: Annotated[Optional[Path], typer.Option(
        "--database-path", help="folder for hcom_*.csv (no write without it)")] = None,
    ops: Annotated[Optional[list[str]], typer.Option(
        "--ops", help="all_reduce, all_gather, reduce_scatter, all_to_all, send_recv")] = None,
    num_devices: Annotated[Optional[list[str]], typer.Option(
        "--num-devices", help="group sizes (several allowed)")] = None,
    topology_tier: Annotated[Optional[int], typer.Option(
        "--topology-tier", help="0 inter-pod, 1 intra-pod, 2 die-level (default: from grid)")] = None,
    grid_shape: Annotated[tuple[int, int, int], typer.Option(
        "--grid-shape", help="nodes per pod, chips per node, dies per chip")] = (48, 8, 2),
    dtype: Annotated[str, typer.Option("--dtype", help="tensor dtype")] = "torch.bfloat16",
    bytes_grid: Annotated[Optional[list[str]], typer.Option(
        "--bytes-grid", help="message_bytes values")] = None,
    output_csv: Annotated[Optional[Path], typer.Option(
        "--output-csv", help="single CSV; only with one --ops value")] = None,
    backend: Annotated[str, typer.Option("--backend", help="gloo | nccl | hccl")] = "gloo",
    nproc: Annotated[int, typer.Option("--nproc", help="local processes (default: largest "
                                                       "--num-devices); ignored under torchrun")] = 0,
    iterations: Annotated[int, typer.Option("--iterations", help="timed iterations per point")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed iterations per point")] = 2,
    deadline_s: Annotated[float, typer.Option("--deadline-s", help="kill a local run after")] = 600.0,
) -> None:
    """Collective microbenchmarks with torch.distributed, written as hcom_*.csv."""
    import os

    from perfcast.collect.comm import (
        DEFAULT_OPS,
        CommBenchConfig,
        run_in_torchrun,
        run_local,
        write_comm_tables,
    )

    with user_errors():
        cfg = CommBenchConfig(
            ops=tuple(_split(ops)) or DEFAULT_OPS,
            num_devices=tuple(int(n) for n in _split(num_devices)) or (16,),
            bytes_grid=tuple(int(b) for b in _split(bytes_grid)) or CommBenchConfig.bytes_grid,
            dtype=dtype, topology_tier=topology_tier, grid_shape=tuple(grid_shape),
            warmup=warmup, iterations=iterations, backend=backend)
        if output_csv is not None and len(cfg.ops) != 1:
            raise ConfigError("is only valid with exactly one --ops value", field="--output-csv")
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            result = run_in_torchrun(cfg)
            if result is None:
                return
        else:
            result = run_local(cfg, nproc or max(cfg.num_devices), deadline_s=deadline_s)
        written = write_comm_tables(result, cfg, database_path=database_path,
                                    output_csv=output_csv)
        for why in result.skipped:
            typer.echo(f"skipped: {why}", err=True)
        for op, why in result.failures.items():
            typer.echo(f"failed: {op}: {why}", err=True)
        typer.echo(f"measured {len(result.measurements)} points; wrote "
                   + (", ".join(str(p) for p in written) or "nothing (no --database-path)"))
        if result.failures:
            raise typer.Exit(1)


@app.command("import")
def import_command(
    database_path: Annotated[Path, typer.Option("--database-path", help="collected database folder")],
    hardware: Annotated[str, typer.Option("--hardware", help="system name the rows were "
                                                             "measured on (catalog id or YAML name)")],
    runtime: Annotated[str, typer.Option("--runtime", help="runtime selector, e.g. torch, vllm")] = "",
    runtime_version: Annotated[str, typer.Option("--runtime-version", help="runtime revision selector")] = "",
    kernel_types: Annotated[Optional[list[str]], typer.Option(
        "--kernel-types", help="only these compute kernel types")] = None,
    operations: Annotated[Optional[list[str]], typer.Option(
        "--operations", help="compute operations to import (default gemm, attention)")] = None,
    comm_dtype: Annotated[str, typer.Option("--comm-dtype", help="dtype of hcom rows "
                                                                 "without a dtype column")] = "bf16",
    fmt: Annotated[str, typer.Option("--format", help="parquet | json")] = "parquet",
    output: Annotated[Optional[Path], typer.Option(
        "--output", help="folder to save the snapshot in")] = None,
    to_store: Annotated[bool, typer.Option(
        "--to-store", help="also add the snapshot to the evidence store")] = False,
    store: Annotated[Optional[Path], typer.Option(
        "--store", help="evidence store folder (default: the user data dir)")] = None,
) -> None:
    """Turn a collected database into an immutable evidence snapshot (PerformanceDatabase):
    a saved folder (--output) and/or an entry of the evidence store (--to-store)."""
    from perfcast.collect.evidence import (
        DEFAULT_OPERATIONS,
        ImportSkips,
        collected_database,
        save_database_atomic,
    )

    with user_errors():
        if output is None and not to_store:
            raise ConfigError("says where the snapshot goes", field="--output/--to-store",
                              expected="--output DIR, --to-store, or both")
        skips = ImportSkips()
        db = collected_database(database_path, hardware=hardware, runtime=runtime,
                                runtime_revision=runtime_version,
                                kernel_types=_split(kernel_types),
                                operations=tuple(_split(operations)) or DEFAULT_OPERATIONS,
                                comm_dtype=comm_dtype, skips=skips)
        for line in skips.lines():
            typer.echo(f"warning: {line}", err=True)
        if output is not None:
            save_database_atomic(db, output, fmt=fmt)
            typer.echo(f"{len(db)} records, digest {db.digest}, saved to {output}")
        if to_store:
            from perfcast.evidence.store import EvidenceStore

            digest = EvidenceStore(store).put(db, note=f"perfcast collect import {database_path}")
            typer.echo(f"{len(db)} records in the evidence store as {digest}")
