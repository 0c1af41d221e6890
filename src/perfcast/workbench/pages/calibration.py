"""Calibration and validation: revisions (parameters, what they were fitted on, their
cross-validated scores), observation sets, and predicted vs measured TTFT/TPOT of a
silicon file (`perfcast validate silicon`, a background job) before and after a
revision."""

from __future__ import annotations

from perfcast.workbench import figures
from perfcast.workbench.pages.common import header, json_block, pct, show_error


def revision_view(doc: dict) -> None:
    from nicegui import ui

    ui.label(f"revision {doc['revision']} ({doc['name']}, perfcast {doc['code_version']})") \
        .classes("text-bold").props('data-testid="revision"')
    for part in doc["parts"]:
        proc = part.get("procedure", {})
        ui.label(f"{part['name']}: {proc.get('name', '')} v{proc.get('version', '')}") \
            .classes("text-bold q-mt-sm")
        for key, val in part.get("fitted_on", {}).items():
            if isinstance(val, list):
                ui.label(f"fitted on {key}: " + ", ".join(map(str, val[:8]))
                         + (f" (+{len(val) - 8})" if len(val) > 8 else "")).classes("text-caption")
        ui.table(columns=[{"name": k, "label": k, "field": k, "sortable": True, "align": "left"}
                          for k in ("name", "value", "std", "unit", "bounds")],
                 rows=[{"name": p["name"], "value": f"{p['value']:.4g}",
                        "std": "-" if p.get("std") is None else f"{p['std']:.3g}",
                        "unit": p.get("unit", ""),
                        "bounds": f"[{p.get('lower', '')}, {p.get('upper', '')}]"}
                       for p in part["parameters"]], row_key="name", pagination=10,
                 title="parameters").classes("full-width").props('data-testid="parameters"')
        cv = part.get("cv", {})
        schemes = cv.get("schemes") or ([cv] if "folds" in cv and "group_by" in cv
                                        and cv["folds"] and "group" in cv["folds"][0]
                                        else [])
        for scheme in schemes:
            ui.table(columns=[{"name": k, "label": k, "field": k, "align": "left"}
                              for k in ("held out", "rows", "in-sample TTFT", "in-sample TPOT",
                                        "held-out TTFT", "held-out TPOT")],
                     rows=[{"held out": str(f["group"]), "rows": f["held_out"].get("rows"),
                            "in-sample TTFT": pct(f["in_sample"].get("ttft_mape")),
                            "in-sample TPOT": pct(f["in_sample"].get("tpot_mape")),
                            "held-out TTFT": pct(f["held_out"].get("ttft_mape")),
                            "held-out TPOT": pct(f["held_out"].get("tpot_mape"))}
                           for f in scheme["folds"]], row_key="held out",
                     title=f"cross-validation: leave one {scheme.get('group_by', '?')} out") \
                .classes("full-width").props('data-testid="cv"')
        if not schemes and "folds" in cv:
            rows = []
            for f in cv["folds"]:
                for curve, s in sorted((f.get("held_out_scores") or {}).items()):
                    rows.append({"held out": str(f.get("held_out")), "curve": curve,
                                 "records": s.get("records"), "MAPE": pct(s.get("mape")),
                                 "median APE": pct(s.get("median_ape"))})
            ui.table(columns=[{"name": k, "label": k, "field": k, "sortable": True,
                               "align": "left"}
                              for k in ("held out", "curve", "records", "MAPE", "median APE")],
                     rows=[dict(r, i=i) for i, r in enumerate(rows)], row_key="i",
                     pagination=10,
                     title=f"cross-validation: leave one {cv.get('group_by', '?')} out") \
                .classes("full-width").props('data-testid="cv"')
        coverage = cv.get("coverage")
        if coverage and "groups" in coverage:   # prediction error bands
            rows = [{"held out": str(g["held_out"]), "rows": g["rows"],
                     "TTFT in band": pct(g["ttft"]), "TPOT in band": pct(g["tpot"])}
                    for g in coverage["groups"]]
            rows.append({"held out": "all held out", "rows": coverage["rows"],
                         "TTFT in band": pct(coverage["ttft"]),
                         "TPOT in band": pct(coverage["tpot"])})
            ui.table(columns=[{"name": k, "label": k, "field": k, "align": "left"}
                              for k in ("held out", "rows", "TTFT in band", "TPOT in band")],
                     rows=rows, row_key="held out",
                     title=f"error band coverage: each {cv.get('group_by', '?')}'s band from "
                           "the others") \
                .classes("full-width").props('data-testid="band-coverage"')


def register(wb, jobs) -> None:
    from nicegui import run, ui

    @ui.page("/calibration")
    def calibration_page() -> None:
        from perfcast.calibrate.store import load_calibration
        from perfcast.cli.calibrate import list_record

        header("Calibration and validation")
        try:
            revisions = list_record(wb.calibration_root)
            observations = wb.observation_store().list()
        except Exception as exc:  # noqa: BLE001
            show_error(ui.column(), exc)
            return
        ui.table(columns=[{"name": k, "label": k, "field": k, "sortable": True, "align": "left"}
                          for k in ("revision", "name", "where", "parts", "parameters")],
                 rows=[{"revision": r["revision"][7:19], "name": r["name"],
                        "where": r["where"], "parts": ", ".join(r["parts"]),
                        "parameters": r["parameters"], "key": r["revision"]}
                       for r in revisions], row_key="key", title="calibration revisions") \
            .classes("full-width").props('data-testid="revisions"')
        ui.table(columns=[{"name": k, "label": k, "field": k, "sortable": True, "align": "left"}
                          for k in ("set", "kind", "rows", "system", "sources")],
                 rows=[{"set": o["observation_set"][7:19], "kind": o.get("kind", "?"),
                        "rows": o.get("rows", "?"), "system": o.get("system", "?"),
                        "sources": o.get("sources", o.get("error", "")),
                        "key": o["observation_set"]} for o in observations],
                 row_key="key", title="observation sets").classes("full-width") \
            .props('data-testid="observations"')
        # the revision's details (long) come after the validation plots
        revision_area = ui.column().classes("full-width")
        with revision_area:
            options = {r["revision"]: f"{r['revision'][7:19]} {r['name']} ({r['where']})"
                       for r in revisions}
            rev_sel = ui.select(options, value=revisions[0]["revision"], label="revision") \
                .style("width: 32rem")
            rev_box = ui.column().classes("full-width")

            def show_revision() -> None:
                rev_box.clear()
                where = {r["revision"]: r["where"] for r in revisions}
                try:
                    ref = "default" if where.get(rev_sel.value) == "shipped default" else rev_sel.value
                    doc = load_calibration(ref, store=wb.calibration_store()).to_json()
                except Exception as exc:  # noqa: BLE001
                    show_error(rev_box, exc)
                    return
                with rev_box:
                    revision_view(doc)

            rev_sel.on_value_change(show_revision)
            show_revision()

        ui.label("predicted vs measured (validate silicon)").classes("text-h6 text-bold q-mt-md")
        with ui.row().classes("items-end"):
            file = ui.input("silicon CSV").style("width: 32rem").props('data-testid="silicon-file"')
            mode = ui.select({"": "all", "agg": "agg", "disagg": "disagg"}, value="",
                             label="mode").style("width: 6rem")
            before = ui.input("before (revision)", value="none").style("width: 9rem") \
                .props('data-testid="before"')
            after = ui.input("after (revision)", value="default").style("width: 9rem")
            go = ui.button("validate").props('data-testid="run-validate"')
            stop = ui.button("cancel", color="negative")
            stop.disable()
        progress = ui.linear_progress(value=0, show_value=False).classes("full-width")
        status = ui.label("").props('data-testid="validate-status"')
        out = ui.column().classes("full-width")
        revision_area.move(target_index=-1)
        state: dict = {"jobs": {}}

        def poll() -> None:
            js = {label: jobs.get(i) for label, i in state["jobs"].items()}
            done = sum(j.done for j in js.values())
            total = sum(j.total for j in js.values())
            progress.set_value(done / total if total else 0)
            status.set_text(", ".join(f"{label}: {j.state} {j.done}/{j.total or '?'}"
                                      for label, j in js.items()))
            if any(j.state == "running" for j in js.values()):
                return
            timer.deactivate()
            go.enable()
            stop.disable()
            failed = [j for j in js.values() if j.state != "done"]
            if failed:
                show_error(out, RuntimeError("; ".join(
                    f"{j.id} {j.state}: {(j.error or {}).get('error', '')}" for j in failed)))
                return
            draw({label: j.result for label, j in js.items()})

        def draw(results: dict) -> None:
            out.clear()
            with out:
                for metric in ("ttft", "tpot"):
                    traces = []
                    for label, doc in results.items():
                        traces += figures.scatter_figure(doc["rows"], metric, f"{label}: ")
                    ui.plotly(figures.validation_figure(traces, metric)).classes("full-width") \
                        .props(f'data-testid="scatter-{metric}"')
                rows = []
                for label, doc in results.items():
                    for g in doc["summary"]:
                        rows.append({"revision": f"{label} ({doc['calibration'][:19]})",
                                     "system": g["system"], "model": g["model"],
                                     "backend": g["backend"], "rows": g["rows"],
                                     "coverage": pct(g["coverage"]),
                                     "TTFT MAPE": pct(g["ttft_mape"]),
                                     "TPOT MAPE": pct(g["tpot_mape"])})
                ui.table(columns=[{"name": k, "label": k, "field": k, "sortable": True,
                                   "align": "left"} for k in rows[0]] if rows else [],
                         rows=[dict(r, i=i) for i, r in enumerate(rows)], row_key="i",
                         title="per system x model x backend").classes("full-width") \
                    .props('data-testid="validate-summary"')

        timer = ui.timer(0.3, poll, active=False)

        async def clicked() -> None:
            from dataclasses import asdict

            from perfcast.cli.validate import ValidateArgs, silicon_rows

            out.clear()
            try:
                args = {label: ValidateArgs(file=file.value, mode=mode.value or None,
                                            calibration=rev)
                        for label, rev in (("before", before.value), ("after", after.value))}
                for a in args.values():
                    await run.io_bound(silicon_rows, a)
                    await run.io_bound(load_calibration, a.calibration,
                                       store=wb.calibration_store())
            except Exception as exc:  # noqa: BLE001
                show_error(out, exc)
                return
            state["jobs"] = {label: jobs.submit("validate", asdict(a)).id
                             for label, a in args.items()}
            go.disable()
            stop.enable()
            timer.activate()

        def cancel() -> None:
            for i in state["jobs"].values():
                jobs.cancel(i)

        go.on_click(clicked)
        stop.on_click(cancel)
