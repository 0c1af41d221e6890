"""`collect comm`: collective microbenchmarks with torch.distributed -> `hcom_*.csv`.

Ops and their files (HCCL profiling names): all_reduce -> `hcom_allReduce_.csv`,
all_gather -> `hcom_allGather_.csv`, reduce_scatter -> `hcom_reduceScatter_.csv`,
all_to_all -> `hcom_alltoallv_.csv`, send_recv -> `hcom_send_.csv`.

Columns: `message_bytes, num_devices, dtype, topology_tier, Duration(us), bandwidth_gbps`
(+ `Mean Duration(us), Std Duration(us), Count`). `message_bytes` follows HCCL's
counting, as TensorCast's communication path reads it: all_reduce the tensor, all_gather
each rank's input (the gathered output is `num_devices` times larger), reduce_scatter
each rank's output (the input is `num_devices` times larger), all_to_all each rank's
send buffer, send_recv the message. (perfcast's task convention counts the full buffer
for all_gather/reduce_scatter; `collect.evidence` converts.)
`Duration(us)` is the median over iterations of the slowest rank's time (each iteration
starts after a barrier; the median resists scheduler noise, the mean is kept in
`Mean Duration(us)`); `bandwidth_gbps` = message_bytes / Duration, in GB/s (1e9 B/s).

`topology_tier` (0 inter-pod, 1 intra-pod, 2 die-level) is `--topology-tier` when given,
else derived from `--grid-shape` (nodes per pod, chips per node, dies per chip; A3
SuperPoD default 48 8 2 = 768 dies): a group within one chip's dies is tier 2, within
one pod (48 x 8 x 2 dies) tier 1, larger groups tier 0.

Launch: under torchrun (RANK/WORLD_SIZE set) every rank runs the sweep and rank 0
writes; otherwise `world_size` local processes are spawned on 127.0.0.1 (gloo on CPU,
nccl on CUDA, hccl on NPU). Every collective has a timeout; a run that exceeds
`deadline_s` is killed and reported, leaving no CSV half-written.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from perfcast.collect.tables import (
    COUNT,
    PLAIN_DURATION,
    STD,
    KernelTable,
    format_number,
    write_tables,
)
from perfcast.core.dtypes import dtype_bytes, parse_dtype
from perfcast.core.errors import ConfigError, PerfcastError

COMM_FILES = {"all_reduce": "hcom_allReduce_", "all_gather": "hcom_allGather_",
              "reduce_scatter": "hcom_reduceScatter_", "all_to_all": "hcom_alltoallv_",
              "send_recv": "hcom_send_"}
DEFAULT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
MEAN = "Mean Duration(us)"
COMM_HEADER = ["message_bytes", "num_devices", "dtype", "topology_tier", PLAIN_DURATION,
               "bandwidth_gbps", MEAN, STD, COUNT]
DEFAULT_GRID_SHAPE = (48, 8, 2)
DEFAULT_BYTES_GRID = tuple(2 ** e for e in range(10, 27, 2))


class CommBenchError(PerfcastError):
    """The collective benchmark could not run (launch failure, timeout, unsupported op)."""


@dataclass(frozen=True)
class CommBenchConfig:
    ops: tuple[str, ...] = DEFAULT_OPS
    num_devices: tuple[int, ...] = (2,)
    bytes_grid: tuple[int, ...] = DEFAULT_BYTES_GRID
    dtype: str = "bf16"
    topology_tier: int | None = None
    grid_shape: tuple[int, ...] = DEFAULT_GRID_SHAPE
    warmup: int = 2
    iterations: int = 10
    backend: str = "gloo"
    collective_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        unknown = [o for o in self.ops if o not in COMM_FILES]
        if unknown:
            raise ConfigError(f"unknown op(s) {', '.join(unknown)}", field="--ops",
                              expected=" | ".join(COMM_FILES))
        if not self.num_devices or any(n < 1 for n in self.num_devices):
            raise ConfigError(f"has value {list(self.num_devices)}", field="--num-devices",
                              expected="positive group sizes")
        if not self.bytes_grid or any(b < 1 for b in self.bytes_grid):
            raise ConfigError(f"has value {list(self.bytes_grid)}", field="--bytes-grid",
                              expected="positive message sizes in bytes")
        if self.topology_tier is not None and self.topology_tier not in (0, 1, 2):
            raise ConfigError(f"has value {self.topology_tier}", field="--topology-tier",
                              expected="0 (inter-pod), 1 (intra-pod) or 2 (die-level)")
        if len(self.grid_shape) != 3 or any(g < 1 for g in self.grid_shape):
            raise ConfigError(f"has value {list(self.grid_shape)}", field="--grid-shape",
                              expected="three positive integers: nodes per pod, chips per node, "
                                       "dies per chip")
        parse_dtype(self.dtype, field="--dtype")
        if self.iterations < 1 or self.warmup < 0:
            raise ConfigError("iterations must be >= 1 and warm-up >= 0", field="--iterations")

    @property
    def canonical_dtype(self) -> str:
        return parse_dtype(self.dtype, field="--dtype").value

    def tier_for(self, num_devices: int) -> int:
        if self.topology_tier is not None:
            return self.topology_tier
        return topology_tier_for(num_devices, self.grid_shape)


def topology_tier_for(num_devices: int, grid_shape: Sequence[int] = DEFAULT_GRID_SHAPE) -> int:
    nodes, chips, dies = grid_shape
    if num_devices <= dies:
        return 2
    if num_devices <= nodes * chips * dies:
        return 1
    return 0


@dataclass(frozen=True)
class CommMeasurement:
    op: str
    message_bytes: int
    num_devices: int
    samples_us: tuple[float, ...]


@dataclass
class CommResult:
    measurements: list[CommMeasurement] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)   # op -> reason
    skipped: list[str] = field(default_factory=list)         # unmeasurable points, why
    written: list[Path] = field(default_factory=list)


# -- worker side (runs in every rank) -----------------------------------------------------
def _elements(op: str, message_bytes: int, n: int, elem: float) -> int | None:
    """Elements of the largest buffer of one rank (the gathered output, the scattered
    input, the send buffer, the tensor), or None when the size does not divide."""
    elems = message_bytes / elem
    if elems != int(elems):
        return None
    elems = int(elems)
    if op in ("all_gather", "reduce_scatter"):
        return elems * n
    if op == "all_to_all" and elems % n:
        return None
    return elems


def _run_point(dist, torch, op: str, elems: int, n: int, rank: int, group, dtype, cfg,
               device) -> list[float]:
    if op == "all_reduce":
        buf = torch.ones(elems, dtype=dtype, device=device)
        fn = lambda: dist.all_reduce(buf, group=group)  # noqa: E731
    elif op == "all_gather":
        inp = torch.ones(elems // n, dtype=dtype, device=device)
        out = torch.empty(elems, dtype=dtype, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        fn = lambda: gather(out, inp, group=group)  # noqa: E731
    elif op == "reduce_scatter":
        inp = torch.ones(elems, dtype=dtype, device=device)
        out = torch.empty(elems // n, dtype=dtype, device=device)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        fn = lambda: scatter(out, inp, group=group)  # noqa: E731
    elif op == "all_to_all":
        inp = torch.ones(elems, dtype=dtype, device=device)
        out = torch.empty(elems, dtype=dtype, device=device)
        fn = lambda: dist.all_to_all_single(out, inp, group=group)  # noqa: E731
    else:  # send_recv between the group's first two ranks
        buf = torch.ones(elems, dtype=dtype, device=device)
        fn = ((lambda: dist.send(buf, dst=1)) if rank == 0 else  # noqa: E731
              (lambda: dist.recv(buf, src=0)))
    sync = {"cuda": lambda: torch.cuda.synchronize(device),
            "npu": lambda: torch.npu.synchronize()}.get(device.type, lambda: None)
    for _ in range(cfg.warmup):
        fn()
    sync()
    times = []
    for _ in range(cfg.iterations):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return slowest.cpu().tolist()


def sweep(cfg: CommBenchConfig, rank: int, world_size: int) -> dict:
    """Run every (op, group size, message size) point; returns rank 0's view."""
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32",
                            "int8": "int8", "int32": "int32", "int64": "int64"}
                    .get(cfg.canonical_dtype, "float32"))
    device = torch.device("cpu")
    if cfg.backend == "nccl":
        device = torch.device("cuda", rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
    elif cfg.backend == "hccl":  # pragma: no cover - needs an NPU
        import torch_npu  # noqa: F401

        device = torch.device("npu", rank % max(torch.npu.device_count(), 1))
        torch.npu.set_device(device)
    elem = dtype_bytes(cfg.canonical_dtype)
    result: dict = {"measurements": [], "failures": {}, "skipped": []}
    groups = {}
    for n in sorted(set(cfg.num_devices)):
        if n > world_size:
            result["skipped"].append(f"num_devices={n} exceeds the {world_size} launched ranks")
            continue
        groups[n] = dist.new_group(ranks=list(range(n))) if n < world_size else dist.group.WORLD
    for op in cfg.ops:
        try:
            for n, group in groups.items():
                if op == "send_recv" and n != 2:
                    result["skipped"].append(f"send_recv needs num_devices=2, not {n}")
                    continue
                for mb in cfg.bytes_grid:
                    elems = _elements(op, mb, n, elem)
                    if elems is None:
                        result["skipped"].append(f"{op}: {mb} bytes do not split into "
                                                 f"{elem:g}-byte elements over {n} ranks")
                        continue
                    if rank < n:
                        times = _run_point(dist, torch, op, elems, n, rank, group, dtype, cfg,
                                           device)
                        result["measurements"].append(
                            {"op": op, "message_bytes": mb, "num_devices": n, "samples_us": times})
                    dist.barrier()
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            result["failures"][op] = f"{cfg.backend}: {str(exc).splitlines()[0]}"
            result["measurements"] = [m for m in result["measurements"] if m["op"] != op]
            dist.barrier()
    return result


def _worker(rank: int, world_size: int, cfg_json: str, addr: str, port: int, out_file: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    cfg = CommBenchConfig(**_cfg_from_json(cfg_json))
    dist.init_process_group(cfg.backend, init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world_size,
                            timeout=timedelta(seconds=cfg.collective_timeout_s))
    try:
        result = sweep(cfg, rank, world_size)
        if rank == 0:
            Path(out_file).write_text(json.dumps(result), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def _cfg_from_json(text: str) -> dict:
    d = json.loads(text)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


# -- launcher side --------------------------------------------------------------------------
def run_local(cfg: CommBenchConfig, world_size: int, *, deadline_s: float = 300.0,
              master_addr: str = "127.0.0.1") -> CommResult:
    """Spawn `world_size` processes on loopback and run the sweep."""
    import torch.multiprocessing as mp

    if world_size < 2:
        raise ConfigError(f"has value {world_size}", field="--nproc",
                          expected="at least 2 processes")
    with tempfile.TemporaryDirectory(prefix="perfcast-comm-") as tmp:
        out_file = str(Path(tmp) / "rank0.json")
        port = free_port(master_addr)
        ctx = mp.start_processes(_worker, args=(world_size, json.dumps(asdict(cfg)), master_addr,
                                                port, out_file),
                                 nprocs=world_size, join=False, start_method="spawn")
        end = time.monotonic() + deadline_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > end:
                    raise CommBenchError(f"collective benchmark exceeded {deadline_s:g} s; "
                                         "shrink --bytes-grid or --iterations")
        except mp.ProcessRaisedException as exc:
            raise CommBenchError(f"a rank failed: {str(exc).strip().splitlines()[-1]}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        if not os.path.exists(out_file):
            raise CommBenchError("rank 0 produced no results")
        return _result_from_json(json.loads(Path(out_file).read_text(encoding="utf-8")))


def run_in_torchrun(cfg: CommBenchConfig) -> CommResult | None:
    """Under torchrun: every rank sweeps; rank 0 gets the result, others None."""
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group(cfg.backend, timeout=timedelta(seconds=cfg.collective_timeout_s))
    try:
        result = sweep(cfg, dist.get_rank(), dist.get_world_size())
        return _result_from_json(result) if dist.get_rank() == 0 else None
    finally:
        dist.destroy_process_group()


def _result_from_json(d: dict) -> CommResult:
    return CommResult(
        measurements=[CommMeasurement(m["op"], m["message_bytes"], m["num_devices"],
                                      tuple(m["samples_us"])) for m in d["measurements"]],
        failures=dict(d["failures"]), skipped=list(d["skipped"]))


def tables_from_result(result: CommResult, cfg: CommBenchConfig) -> dict[str, KernelTable]:
    tables: dict[str, KernelTable] = {}
    for m in result.measurements:
        name = COMM_FILES[m.op]
        table = tables.setdefault(name, KernelTable(name, list(COMM_HEADER)))
        median = statistics.median(m.samples_us)
        table.rows.append({
            "message_bytes": str(m.message_bytes), "num_devices": str(m.num_devices),
            "dtype": cfg.canonical_dtype, "topology_tier": str(cfg.tier_for(m.num_devices)),
            PLAIN_DURATION: format_number(median),
            "bandwidth_gbps": format_number(m.message_bytes / (median * 1e-6) / 1e9),
            MEAN: format_number(statistics.fmean(m.samples_us)),
            STD: format_number(statistics.pstdev(m.samples_us)),
            COUNT: str(len(m.samples_us))})
    return tables


def write_comm_tables(result: CommResult, cfg: CommBenchConfig, *,
                      database_path: Path | None = None,
                      output_csv: Path | None = None) -> list[Path]:
    """Write one `hcom_*.csv` per op under `database_path`, or the single op's table to
    `output_csv`. Existing rows with the same (message_bytes, num_devices, dtype, tier)
    are replaced; others stay."""
    from perfcast.collect.tables import read_table

    tables = tables_from_result(result, cfg)
    if output_csv is not None:
        if len(cfg.ops) != 1:
            raise ConfigError("is only valid with exactly one --ops value", field="--output-csv")
        targets = {name: Path(output_csv) for name in tables}
    elif database_path is not None:
        targets = {name: Path(database_path) / f"{name}.csv" for name in tables}
    else:
        return []
    out = []
    for name, table in tables.items():
        path = targets[name]
        if path.is_file():
            old = read_table(path, name)
            key = lambda r: tuple(r.get(c, "") for c in COMM_HEADER[:4])  # noqa: E731
            fresh = {key(r) for r in table.rows}
            old.ensure_columns(COMM_HEADER)
            table = KernelTable(name, old.header,
                                [r for r in old.rows if key(r) not in fresh] + table.rows)
        table.path = path
        out.append(table)
    return write_tables(out)


def bytes_grid_default(max_bytes: int = 2**26) -> tuple[int, ...]:
    return tuple(b for b in DEFAULT_BYTES_GRID if b <= max_bytes) or (1024,)


__all__ = ["COMM_FILES", "CommBenchConfig", "CommBenchError", "CommMeasurement", "CommResult",
           "run_in_torchrun", "run_local", "tables_from_result", "topology_tier_for",
           "write_comm_tables"]
