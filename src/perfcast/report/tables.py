"""Rich tables for the terminal."""

from __future__ import annotations

from collections import OrderedDict

from rich.console import Console
from rich.table import Table

from perfcast.estimate import StepResult
from perfcast.report.step import op_rows


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def print_step(result: StepResult, console: Console, *, by_shape: bool = False) -> None:
    rows = op_rows(result)
    g = result.graph
    title = (f"{g.model.name} on {result.system.name} x{g.num_devices} "
             f"(tp={g.plan.tp} pp={g.plan.pp} dp={g.plan.dp} ep={g.plan.ep}) - "
             f"{g.batch.phase}, {g.batch.tokens} tokens")
    table = Table(title=title, show_lines=False)
    for col, just in (("operator", "left"), ("lineage group", "left"), ("calls", "right"),
                      ("total", "right"), ("avg", "right"), ("bound", "left"),
                      ("share", "right"), ("method", "left"), ("provider", "left")):
        table.add_column(col, justify=just)
    if by_shape:
        table.add_column("input shapes")
        groups: OrderedDict = OrderedDict()
        for r in rows:
            key = (r.operator, r.input_shapes)
            groups.setdefault(key, []).append(r)
        for (operator, shapes), rs in groups.items():
            calls = sum(r.count for r in rs)
            total = sum(r.latency_s for r in rs)
            table.add_row(operator, ", ".join(sorted({r.group for r in rs})), str(calls),
                          fmt_time(total), fmt_time(total / calls), rs[0].bound,
                          f"{sum(r.share for r in rs):.1%}", rs[0].method, rs[0].provider, shapes)
    else:
        for r in rows:
            table.add_row(r.operator, r.lineage, str(r.count), fmt_time(r.latency_s),
                          fmt_time(r.avg_latency_s), r.bound, f"{r.share:.1%}", r.method,
                          r.provider)
    console.print(table)
    comm = result.costed.comm_s()
    tl = result.timeline
    if tl is not None:
        o = tl.options
        console.print(f"step latency (plan makespan): [bold]{fmt_time(tl.makespan_s)}[/bold]   "
                      f"overlap={o.overlap} pp-schedule={o.pp_schedule} "
                      f"microbatches={o.num_microbatches}"
                      f"{' full timeline' if o.full_timeline else ' (representative layers, extrapolated)'}")
        console.print(f"  plain sum of tasks (no overlap, no pipelining): "
                      f"{fmt_time(result.sum_of_tasks_s)}   of which communication "
                      f"{fmt_time(comm)}")
        console.print(f"  exposed communication (on the critical path): "
                      f"{fmt_time(tl.exposed_comm_s)}   bubble (mean idle per device): "
                      f"{fmt_time(tl.bubble_s)} ({tl.bubble_fraction:.1%})")
    else:
        console.print(f"step latency (sum of tasks, no overlap): "
                      f"[bold]{fmt_time(result.latency_s)}[/bold]   of which communication "
                      f"{fmt_time(comm)}")
    console.print(f"tokens/s per device: [bold]{result.tokens_per_s_per_device:,.1f}[/bold]   "
                  f"work: {g.total_flops() / 1e12:,.2f} TFLOP, {g.total_bytes() / 1e9:,.2f} GB "
                  f"(all devices)")
    mem = g.memory
    cap = result.system.device.memory.capacity_bytes
    mt = Table(title="memory per device (most loaded)")
    for col in ("weights", "KV cache", "activations", "reserve", "total", "capacity"):
        mt.add_column(col, justify="right")
    mt.add_row(fmt_bytes(mem.weights), fmt_bytes(mem.kv_cache), fmt_bytes(mem.activations),
               fmt_bytes(mem.reserve), fmt_bytes(mem.total), fmt_bytes(cap))
    console.print(mt)
    if mem.total > cap:
        console.print(f"[bold red]WARNING: does not fit: needs {fmt_bytes(mem.total)} per device, "
                      f"{result.system.name} has {fmt_bytes(cap)}[/bold red]")
