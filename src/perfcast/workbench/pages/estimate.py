"""Estimate: one step of a model on a device, as `perfcast estimate --format json`
reports it, with the per-op table, the memory bar and the step timeline."""

from __future__ import annotations

import json

from perfcast.cli.estimate import EstimateArgs, estimate_record, run_estimate
from perfcast.workbench import figures
from perfcast.workbench.pages.common import preload_plots, devices, header, json_block, models, show_error, us


def estimate_with_timeline(wb, args: EstimateArgs) -> tuple[dict, list[dict]]:
    """(the estimate record, the Chrome trace events of its timeline) of `args`."""
    from perfcast.report.chrome_trace import chrome_trace_events
    from perfcast.workbench.api import estimate_args

    run = run_estimate(estimate_args(wb, args))
    result = next(iter(run.results.values()))
    events = chrome_trace_events(result) if result.timeline is not None else []
    return estimate_record(run), events


OP_COLUMNS = (("lineage", "lineage"), ("operator", "operator"), ("count", "calls"),
              ("latency_us", "latency (us, all calls)"), ("share", "share"),
              ("method", "method"), ("provider", "provider"), ("bound", "bound"))


def op_rows(doc: dict) -> list[dict]:
    total = doc["sum_of_tasks_s"] or 1.0
    return [{"i": i, "lineage": o["lineage"], "operator": o["operator"], "count": o["count"],
             "latency_us": round(o["latency_s"] * 1e6, 3),
             "share": round(100 * o["latency_s"] / total, 2), "method": o["method"],
             "provider": o["provider"], "bound": o["bound"]} for i, o in enumerate(doc["ops"])]


def register(wb, jobs) -> None:
    from nicegui import run, ui

    @ui.page("/estimate")
    def estimate_page() -> None:
        header("Estimate")
        preload_plots()
        snapshots = {"": "(none: analytic and calibrated only)"}
        snapshots.update({m["digest"]: f"{m['digest'][7:19]} {m.get('name', '')}"
                          for m in wb.evidence_store().list()})
        with ui.row().classes("items-end full-width"):
            model = ui.select(models(), value="meta-llama/Llama-3.1-8B", label="model",
                              with_input=True, new_value_mode="add-unique") \
                .style("width: 18rem").props('data-testid="model"')
            device = ui.select(devices(), value="h100_sxm", label="device").style("width: 10rem")
            tp = ui.number("TP", value=1, min=1, precision=0).style("width: 5rem") \
                .props('data-testid="tp"')
            pp = ui.number("PP", value=1, min=1, precision=0).style("width: 5rem")
            dp = ui.number("attention DP", value=1, min=1, precision=0).style("width: 6rem")
            ep = ui.number("EP", value=1, min=1, precision=0).style("width: 5rem")
            nq = ui.number("requests", value=1, min=1, precision=0).style("width: 6rem") \
                .props('data-testid="num-queries"')
            ql = ui.number("query length", value=1024, min=1, precision=0).style("width: 7rem")
            cl = ui.number("context length", value=0, min=0, precision=0).style("width: 7rem")
            decode = ui.checkbox("decode")
        with ui.row().classes("items-end full-width"):
            evidence = ui.select(snapshots, value="", label="evidence snapshot") \
                .style("width: 24rem")
            runtime = ui.input("runtime").style("width: 7rem")
            version = ui.input("runtime version").style("width: 7rem")
            impl = ui.input("implementation (KERNEL or OP=KERNEL, comma-separated)") \
                .style("width: 20rem")
            calibration = ui.input("calibration", value="default").style("width: 10rem")
            go = ui.button("estimate").props('data-testid="run-estimate"')
        out = ui.column().classes("full-width")
        state: dict = {}

        def args() -> EstimateArgs:
            return EstimateArgs(
                model=model.value, device=device.value, tp_size=int(tp.value or 1),
                pp_size=int(pp.value or 1), dp_size=int(dp.value or 1),
                ep_size=int(ep.value or 1), num_queries=int(nq.value or 1),
                query_length=int(ql.value or 1), context_length=int(cl.value or 0),
                decode=bool(decode.value), evidence=[evidence.value] if evidence.value else None,
                runtime=runtime.value or "", runtime_version=version.value or "",
                implementation=[s.strip() for s in (impl.value or "").split(",") if s.strip()]
                or None, calibration=calibration.value or "default")

        async def clicked() -> None:
            out.clear()
            try:
                a = args()
                doc, events = await run.io_bound(estimate_with_timeline, wb, a)
            except Exception as exc:  # noqa: BLE001 - shown to the user
                show_error(out, exc)
                return
            state["args"] = a
            with out:
                ui.label(f"{doc['model']} on {doc['device']}: step {doc['latency_s'] * 1e3:.3f} "
                         f"ms, {doc['tokens_per_s_per_device']:,.1f} tokens/s per device, "
                         f"calibration {doc['calibration']['revision'][:19]}") \
                    .classes("text-h6 text-bold").props('data-testid="estimate-summary"')
                for w in doc["warnings"]:
                    ui.label(f"warning: {w}").classes("text-warning")
                ui.plotly(figures.memory_figure(doc)).classes("full-width") \
                    .props('data-testid="memory"')
                ui.table(columns=[{"name": k, "label": label, "field": k, "sortable": True,
                                   "align": "left"} for k, label in OP_COLUMNS],
                         rows=op_rows(doc), row_key="i", pagination=25) \
                    .classes("full-width").props('data-testid="ops"')
                if events:
                    ui.plotly(figures.timeline_figure(events)).classes("full-width") \
                        .props('data-testid="timeline"')
                ui.button("download Chrome trace (every layer)", on_click=download) \
                    .props('data-testid="trace"')
                with ui.expansion("the record (estimate --format json)"):
                    json_block(doc)

        async def download() -> None:
            from perfcast.workbench.api import estimate_trace

            try:
                trace = await run.io_bound(estimate_trace, wb, state["args"])
            except Exception as exc:  # noqa: BLE001
                show_error(out, exc)
                return
            ui.download.content(json.dumps(trace), "perfcast-estimate-trace.json",
                                "application/json")

        go.on_click(clicked)

