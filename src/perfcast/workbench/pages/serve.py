"""Serve and search: simulate one deployment (`perfcast serve`), or search layouts and
concurrency under SLOs (`perfcast search`, a background job) and explore the Pareto
frontier; clicking a configuration simulates it with `serve --explain` and shows that
record and where its time goes."""

from __future__ import annotations

from perfcast.cli.search import SearchArgs
from perfcast.cli.serve import METRIC_ROWS, ServeArgs, run_serve
from perfcast.serving.provenance import provenance_lines
from perfcast.workbench import figures
from perfcast.workbench.pages.common import preload_plots, devices, header, json_block, models, show_error

SCALARS = ("throughput_tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
           "request_throughput_per_s", "completed_requests", "rejected_requests",
           "preemptions", "kv_utilization_mean", "kv_utilization_peak", "num_gpus")


def metrics_view(metrics: dict, testid: str) -> None:
    from nicegui import ui

    rows = []
    for key in METRIC_ROWS:
        stats = metrics[key]
        rows.append({"metric": key, **{k: "-" if stats[k] is None else f"{stats[k]:.2f}"
                                       for k in ("mean", "p50", "p90", "p99")}})
    ui.table(columns=[{"name": k, "label": k, "field": k, "align": "left"}
                      for k in ("metric", "mean", "p50", "p90", "p99")],
             rows=rows, row_key="metric", title="request latency (ms)") \
        .props(f'data-testid="{testid}"')
    with ui.grid(columns=4).classes("text-body2").style("column-gap: 1.5rem"):
        for key in SCALARS:
            v = metrics[key]
            ui.label(key)
            ui.label(f"{v:,.3f}" if isinstance(v, float) else str(v)).style("font-family: monospace")
    ui.label("numbers from").classes("text-bold")
    for line in provenance_lines(metrics["provenance"]):
        ui.label(line).classes("text-caption").style("font-family: monospace")
    band = metrics.get("prediction_band")
    if band:   # the calibration revision's held-out error band of the means
        t, p = band["ttft_ms"], band["tpot_ms"]
        ui.label(f"held-out error band of the mean: TTFT {t['low']:.1f}-{t['high']:.1f} ms, "
                 f"TPOT {p['low']:.2f}-{p['high']:.2f} ms ({band['basis']})") \
            .classes("text-caption").props(f'data-testid="{testid}-band"')


def explain_view(doc: dict, testid: str) -> None:
    """`serve --explain`: phases (table and stacked bars) and the busy-time split."""
    from nicegui import ui

    from perfcast.serving.explain import SPLIT, explain_lines

    cols = ("phase", "mean", "p50", "p90", "p99", "of TTFT", "of e2e")
    ui.table(columns=[{"name": k, "label": k, "field": k, "align": "left"} for k in cols],
             rows=[dict(zip(cols, row)) for row in explain_lines(doc)], row_key="phase",
             title="where the time goes (ms)").props(f'data-testid="{testid}"')
    ui.plotly(figures.explain_figure(doc)).classes("full-width")
    for role, e in doc["iterations"].items():
        ui.label(f"{role} engines busy {e['busy_ms']:.1f} ms: " + ", ".join(
            f"{name} {100 * e[name + '_share']:.0f}%" for name in SPLIT)).classes("text-body2")


def register(wb, jobs) -> None:
    from nicegui import run, ui

    @ui.page("/serve")
    async def serve_page(job: str | None = None) -> None:
        header("Serve and search")
        preload_plots()
        with ui.row().classes("items-end full-width"):
            model = ui.select(models(), value="meta-llama/Llama-3.1-8B", label="model",
                              with_input=True, new_value_mode="add-unique").style("width: 18rem")
            device = ui.select(devices(), value="h100_sxm", label="device").style("width: 10rem")
            backend = ui.select(["vllm", "sglang", "trtllm"], value="vllm", label="backend") \
                .style("width: 7rem")
            version = ui.input("backend version").style("width: 7rem")
            isl = ui.number("isl", value=1024, min=1, precision=0).style("width: 6rem") \
                .props('data-testid="isl"')
            osl = ui.number("osl", value=128, min=1, precision=0).style("width: 6rem") \
                .props('data-testid="osl"')
            calibration = ui.input("calibration", value="default").style("width: 8rem")
            evidence_root = ui.input("evidence root (AIConfigurator folder, optional)") \
                .style("width: 20rem")
        ui.label("serve one configuration").classes("text-h6 text-bold q-mt-md")
        with ui.row().classes("items-end"):
            tp = ui.number("TP", value=1, min=1, precision=0).style("width: 5rem")
            dp = ui.number("attention DP", value=1, min=1, precision=0).style("width: 7rem")
            ep = ui.number("EP", value=1, min=1, precision=0).style("width: 5rem")
            conc = ui.number("concurrency", value=8, min=1, precision=0).style("width: 7rem") \
                .props('data-testid="concurrency"')
            nreq = ui.number("requests (0: 10 x C)", value=0, min=0, precision=0) \
                .style("width: 9rem")
            serve_btn = ui.button("serve").props('data-testid="run-serve"')
        serve_out = ui.column().classes("full-width")

        def common() -> dict:
            return {"model": model.value, "device": device.value, "backend": backend.value,
                    "backend_version": version.value or "", "isl": int(isl.value or 1),
                    "osl": int(osl.value or 1), "calibration": calibration.value or "default",
                    "evidence_root": evidence_root.value or None}

        async def serve_clicked() -> None:
            serve_out.clear()
            try:
                a = ServeArgs(**common(), tp_size=int(tp.value or 1), dp_size=int(dp.value or 1),
                              ep_size=int(ep.value or 1), concurrency=int(conc.value or 1),
                              num_requests=int(nreq.value or 0))
                metrics, _ = await run.io_bound(run_serve, a)
            except Exception as exc:  # noqa: BLE001 - shown to the user
                show_error(serve_out, exc)
                return
            with serve_out:
                metrics_view(metrics, "serve-metrics")
                with ui.expansion("the record (serve --format json)"):
                    json_block(metrics)

        serve_btn.on_click(serve_clicked)

        ui.label("search layouts and concurrency").classes("text-h6 text-bold q-mt-md")
        with ui.row().classes("items-end"):
            gpus = ui.number("GPUs", value=8, min=1, precision=0).style("width: 5rem") \
                .props('data-testid="gpus"')
            tps = ui.input("TP sizes", value="1,2,4,8").style("width: 7rem") \
                .props('data-testid="tp-sizes"')
            concs = ui.input("concurrencies", value="4,8,16,32,64,128").style("width: 11rem") \
                .props('data-testid="concurrencies"')
            modes = ui.input("modes", value="agg,disagg").style("width: 7rem") \
                .props('data-testid="modes"')
            ttft = ui.number("max TTFT ms", value=None).style("width: 7rem")
            tpot = ui.number("max TPOT ms", value=None).style("width: 7rem") \
                .props('data-testid="max-tpot"')
            pctl = ui.select({0: "mean", 50: "p50", 90: "p90", 99: "p99"}, value=0,
                             label="SLO statistic").style("width: 7rem")
            search_btn = ui.button("search").props('data-testid="run-search"')
            cancel_btn = ui.button("cancel", color="negative").props(
                'data-testid="cancel-search"')
            cancel_btn.disable()
        progress = ui.linear_progress(value=0, show_value=False).classes("full-width")
        status = ui.label("").props('data-testid="search-status"')
        search_out = ui.column().classes("full-width")
        detail = ui.column().classes("full-width")
        state: dict = {"job": None}

        def show_search(doc: dict) -> None:
            search_out.clear()
            detail.clear()
            state["doc"] = doc
            with search_out:
                plot = ui.plotly(figures.pareto_figure(doc)).classes("full-width") \
                    .props('data-testid="pareto"')
                plot.on("plotly_click", point_clicked)
                ui.label("click a point: its configuration, its `serve` record and where "
                         "its time goes").classes(
                    "text-sm text-gray-600")
                top = doc["top"] or doc["nearest_misses"]
                ui.table(columns=[{"name": k, "label": k, "field": k, "sortable": True,
                                   "align": "left"}
                                  for k in ("layout", "gpus", "concurrency", "tok/s/GPU",
                                            "tok/s/user")],
                         rows=[{"i": i, "layout": c["layout"], "gpus": c["gpus"],
                                "concurrency": c["concurrency"],
                                "tok/s/GPU": round(c["metrics"]["tokens_per_s_per_gpu"], 1),
                                "tok/s/user": round(c["metrics"]["tokens_per_s_per_user"], 1)}
                               for i, c in enumerate(top)],
                         row_key="i", title="top by tokens/s/GPU" if doc["top"]
                         else "nothing meets the SLOs: nearest misses").classes("full-width")

        async def point_clicked(e) -> None:
            points = (e.args or {}).get("points") or []
            if not points or points[0].get("customdata") is None:
                return
            row = state["doc"]["configurations"][int(points[0]["customdata"])]
            detail.clear()
            with detail:
                ui.label(f"{row['layout']}, concurrency {row['concurrency']}").classes(
                    "text-lg font-bold").props('data-testid="point-detail"')
                json_block(row)
                box = ui.column().classes("full-width")
                with box:
                    ui.spinner()
            try:
                a = ServeArgs(**figures.serve_args_for(state["doc"], row), explain=True)
                metrics, _ = await run.io_bound(run_serve, a)
            except Exception as exc:  # noqa: BLE001
                show_error(box, exc)
                return
            box.clear()
            with box:
                ui.label("perfcast serve " + " ".join(
                    f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
                    for k, v in vars(a).items()
                    if v not in (None, "") and v != getattr(ServeArgs, k, None)
                    and k != "model") + f" {a.model}").classes("text-caption").style("font-family: monospace")
                metrics_view(metrics, "point-serve")
                explain_view(metrics["explain"], "point-explain")

        def poll() -> None:
            j = jobs.get(state["job"]) if state["job"] else None
            if j is None:
                return
            progress.set_value(j.done / j.total if j.total else 0)
            status.set_text(f"{j.id}: {j.state}, {j.done}/{j.total or '?'} layouts")
            if j.state == "running":
                return
            timer.deactivate()
            cancel_btn.disable()
            search_btn.enable()
            if j.state == "done":
                show_search(j.result)
            elif j.state == "failed":
                show_error(search_out, RuntimeError((j.error or {}).get("error", "failed")))

        timer = ui.timer(0.3, poll, active=False)

        async def search_clicked() -> None:
            from perfcast.workbench.api import check_search

            search_out.clear()
            detail.clear()
            try:
                c = common()
                a = SearchArgs(model=c["model"], device=c["device"], backend=c["backend"],
                               backend_version=c["backend_version"], isl=c["isl"],
                               osl=c["osl"], calibration=c["calibration"],
                               evidence_root=c["evidence_root"], gpus=int(gpus.value or 1),
                               tp_sizes=tps.value, concurrency=concs.value, modes=modes.value,
                               max_ttft_ms=ttft.value, max_tpot_ms=tpot.value,
                               slo_percentile=pctl.value or None)
                a = await run.io_bound(check_search, a)
            except Exception as exc:  # noqa: BLE001
                show_error(search_out, exc)
                return
            from dataclasses import asdict

            state["job"] = jobs.submit("search", asdict(a)).id
            search_btn.disable()
            cancel_btn.enable()
            timer.activate()

        def cancel_clicked() -> None:
            if state["job"]:
                jobs.cancel(state["job"])

        search_btn.on_click(search_clicked)
        cancel_btn.on_click(cancel_clicked)
        if job:
            j = jobs.get(job)
            if j is None:
                show_error(search_out, KeyError(f"no job {job!r}"))
            else:
                state["job"] = job
                if j.state == "running":
                    search_btn.disable()
                    cancel_btn.enable()
                    timer.activate()
                else:
                    poll()
