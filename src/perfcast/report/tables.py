"""Rich tables for the terminal."""

from __future__ import annotations

from collections import OrderedDict

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from perfcast.plan.step import StepResult
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


# Below this width the per-op table drops the avg and bound columns and the operators'
# namespaces (`aten.mm.default` -> `mm`), and wraps long names inside their column;
# `--wide` shows everything.
WIDE_MIN = 132
COLUMNS = (("operator", "left"), ("lineage group", "left"), ("calls", "right"),
           ("total", "right"), ("avg", "right"), ("bound", "left"), ("share", "right"),
           ("method", "left"), ("provider", "left"), ("input shapes", "left"))
FLEXIBLE = {"operator": 9, "lineage group": 10, "provider": 8, "input shapes": 10}  # min widths
SHORT_PROVIDERS = {"calibrated_analytic": "calibrated", "collective_model": "collectives"}


def short_operator(name: str) -> str:
    """`aten.mm.default` -> `mm`, `tensor_cast.all_reduce.default` -> `all_reduce`."""
    parts = name.split(".")
    if len(parts) > 1 and parts[0] in ("aten", "tensor_cast", "prims", "torch"):
        parts = parts[1:]
    if len(parts) > 1 and parts[-1] == "default":
        parts = parts[:-1]
    return ".".join(parts)


def fit_widths(cells: list[dict], keep: list[str], width: int, gap: int) -> dict[str, int]:
    """Column widths that fit `width`: fixed columns keep their natural width; the widest
    flexible one (names) gives up a character at a time, never below its minimum."""
    out = {c: max([len(c)] + [len(row[c]) for row in cells]) for c in keep}
    flex = [c for c in keep if c in FLEXIBLE]
    excess = sum(out.values()) + gap * (len(keep) - 1) - width
    while excess > 0:
        shrinkable = [c for c in flex if out[c] > FLEXIBLE[c]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda c: out[c])
        out[widest] -= 1
        excess -= 1
    return out


def step_cells(result: StepResult, rows, *, by_shape: bool, wide: bool) -> list[dict]:
    name = (lambda op: op) if wide else short_operator  # noqa: E731
    provider = (lambda p: p) if wide else (lambda p: SHORT_PROVIDERS.get(p, p))  # noqa: E731
    if not by_shape:
        return [{"operator": name(r.operator), "lineage group": r.lineage, "calls": str(r.count),
                 "total": fmt_time(r.latency_s), "avg": fmt_time(r.avg_latency_s),
                 "bound": r.bound, "share": f"{r.share:.1%}", "method": r.label,
                 "provider": provider(r.provider)} for r in rows]
    groups: OrderedDict = OrderedDict()
    for r in rows:
        groups.setdefault((r.operator, r.input_shapes), []).append(r)
    out = []
    for (operator, shapes), rs in groups.items():
        calls = sum(r.count for r in rs)
        total = sum(r.latency_s for r in rs)
        out.append({"operator": name(operator),
                    "lineage group": ", ".join(sorted({r.group for r in rs})),
                    "calls": str(calls), "total": fmt_time(total),
                    "avg": fmt_time(total / calls), "bound": rs[0].bound,
                    "share": f"{sum(r.share for r in rs):.1%}", "method": rs[0].label,
                    "provider": provider(rs[0].provider), "input shapes": shapes})
    return out


def print_step(result: StepResult, console: Console, *, by_shape: bool = False,
               wide: bool = False) -> None:
    rows = op_rows(result)
    g = result.graph
    title = (f"{g.model.name} on {result.system.name} x{g.num_devices} "
             f"(tp={g.plan.tp} pp={g.plan.pp} dp={g.plan.dp} ep={g.plan.ep}) - "
             f"{g.batch.phase}, {g.batch.tokens} tokens")
    wide = wide or console.width >= WIDE_MIN
    keep = [c for c, _ in COLUMNS if (by_shape or c != "input shapes")
            and (wide or c not in ("avg", "bound"))]
    cells = step_cells(result, rows, by_shape=by_shape, wide=wide)
    gap = 3 if wide else 1 if by_shape else 2
    widths = fit_widths(cells, keep, console.width - (4 if wide else 0), gap) if not wide \
        else {}
    table = Table(title=title, show_lines=False, pad_edge=False,
                  box=box.HEAVY_HEAD if wide else None, padding=(0, 1) if wide else (0, gap, 0, 0))
    for col, just in COLUMNS:
        if col in keep:
            table.add_column(col, justify=just, overflow="fold", width=widths.get(col),
                             no_wrap=col not in FLEXIBLE)
    for row in cells:
        table.add_row(*(row[c] for c in keep))
    console.print(table)
    notes = []
    stack = g.conventions.get("stack", "default")
    if stack != "default":  # the calls are another stack's (see perfcast.workload.stacks)
        console.print(f"operator stack: {stack} (fusion boundaries and call signatures; "
                      f"--stack)")
    if not wide:
        notes.append("narrow layout: --wide adds avg, bound and full operator names")
    if any(r.label == "partial" for r in rows):
        notes.append("partial: a composite with some sub-kernels measured, the rest priced by the "
                     "analytic model")
    foreign = sorted({r.measured_on for r in rows if r.measured_on})
    if foreign:
        notes.append(f"*: evidence measured on {', '.join(foreign)}, not {result.system.name}")
    for note in notes:
        console.print(f"[dim]{note}[/dim]")
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


def print_sources(sources: dict, counts: dict[str, int], console: Console) -> None:
    """What the estimate answered from and how many ops each provider answered."""
    db = sources.get("profiling_database")
    if db:
        foreign = (f", FOREIGN: measured on {db['foreign_measured_on']}"
                   if db.get("foreign_measured_on") else "")
        from perfcast.evidence.profiling.stack import stack_summary

        console.print(escape(f"profiling database: {db['path']} (device {db['device'] or '?'}, "
                             f"{stack_summary(db)}"
                             f"{', interpolated' if db['interpolate'] else ''}{foreign})"))
        for text in db.get("assumptions", ()):
            console.print(escape(f"  assumption: {text}"))
    for ev in sources.get("evidence", ()):
        foreign = (f", FOREIGN: measured on {ev['foreign_measured_on']}"
                   if ev.get("foreign_measured_on") else "")
        held = ', '.join(ev['hardware']) or 'no system'
        if ev.get("layout") == "aiconfigurator":  # tables read in place: no snapshot digest
            wanted = ev.get("runtime_version") or "any version"
            console.print(escape(
                f"evidence: {ev['ref']} (AIConfigurator tables of {held}, {ev['runtime']} "
                f"{ev['collected_version']} for {ev['runtime']} {wanted}{foreign})"))
        else:
            console.print(escape(f"evidence: {ev['ref']} ({ev['digest'][:19]}, "
                                 f"{ev['records']} records of {held}{foreign})"))
    console.print("ops answered by: " + ", ".join(f"{p} {n}" for p, n in counts.items()))
