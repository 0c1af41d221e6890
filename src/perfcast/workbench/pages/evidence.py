"""Evidence: the snapshot catalog, coverage heatmap and kernel curves."""

from __future__ import annotations

from html import escape

from perfcast.workbench import evidence_views as views
from perfcast.workbench import figures
from perfcast.workbench.pages.common import header, html_table, server_rendered, show_error


def catalog_table(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """The catalog's columns and rows (`evidence_views.catalog` rows, shown)."""
    cols = [{"name": k, "label": label, "field": k, "sortable": True, "align": "left"}
            for k, label in (("short", "snapshot"), ("name", "name"), ("rows", "records"),
                             ("importer", "importer"), ("revisions", "source revisions"),
                             ("tables", "tables"), ("skipped", "skipped"),
                             ("licence", "licence"))]
    table_rows = [{**r, "short": r["digest"][7:19],
                   "revisions": ", ".join(r["source_revisions"][:6])
                   + (f" (+{len(r['source_revisions']) - 6})"
                      if len(r["source_revisions"]) > 6 else "")} for r in rows]
    return cols, table_rows


def register(wb, jobs) -> None:
    from nicegui import run, ui

    @ui.page("/evidence")
    async def evidence_page() -> None:
        header("Evidence")
        store_path = wb.evidence_path
        ui.label(f"evidence store: {store_path}").classes("text-body2 text-grey-7")
        try:
            rows = views.catalog(wb.evidence_store().list())
        except Exception as exc:  # noqa: BLE001 - shown to the user
            show_error(ui.column(), exc)
            return
        if not rows:
            ui.label("The evidence store is empty: import a snapshot with `perfcast evidence "
                     "import aiconfigurator|vidur|table ...` (imports are a CLI action).") \
                .props('data-testid="empty-store"')
            return
        cols, table_rows = catalog_table(rows)
        # the catalog in the HTML itself: shown as soon as the document is parsed, while
        # NiceGUI's scripts (Vue, Quasar: about 700 kB) load; it gives way to the table
        # below once that is mounted
        ui.add_body_html(server_rendered(
            "Evidence", f"<div class='caption'>evidence store: {escape(store_path)}</div>"
            + html_table("snapshots", cols, table_rows, 'data-testid="catalog"'),
            until='[data-testid="catalog"]'))
        ui.table(columns=cols, rows=table_rows, row_key="digest", title="snapshots") \
            .classes("full-width").props('data-testid="catalog"')

        options = {r["digest"]: f"{r['digest'][7:19]} {r['name']}" for r in rows}
        with ui.row().classes("items-end"):
            largest = max(rows, key=lambda r: r["rows"])["digest"]
            snap = ui.select(options, value=largest, label="snapshot") \
                .style("width: 24rem").props('data-testid="snapshot"')
            family = ui.select(list(views.CURVE_FAMILIES), value="gemm", label="kernel family") \
                .style("width: 10rem")
            dtype = ui.select(["bf16"], value="bf16", label="dtype").style("width: 8rem")
            curve_sel = ui.select({}, label="curve").style("width: 40rem") \
                .props('data-testid="curve-select"')
        heat_box = ui.column().classes("full-width")
        curve_box = ui.column().classes("full-width")
        # each drawing takes a turn; one overtaken by a later call (a selection that
        # changed meanwhile, or the event a set_options fires) draws nothing
        state: dict = {"curves": [], "heatmap": 0, "series": 0, "curve": 0}

        def turn(what: str) -> int:
            state[what] += 1
            return state[what]

        async def load_snapshot() -> None:
            gen = turn("heatmap")
            try:
                digest, db = await run.io_bound(wb.database, snap.value)
                h = await run.io_bound(wb.cached, (digest, "heatmap"),
                                       lambda: views.heatmap(db))
            except Exception as exc:  # noqa: BLE001
                show_error(heat_box, exc)
                return
            if gen != state["heatmap"]:
                return  # a later call draws
            heat_box.clear()
            with heat_box:
                ui.plotly(figures.heatmap_figure(h)).classes("full-width") \
                    .props('data-testid="heatmap"')
            dtypes = sorted({f.split(" ")[1] for f in h["families"]
                             if f.split(" ")[0] == family.value}) or ["bf16"]
            dtype.set_options(dtypes, value="bf16" if "bf16" in dtypes else dtypes[0])
            await load_series()

        async def load_series() -> None:
            gen = turn("series")
            try:
                digest, db = await run.io_bound(wb.database, snap.value)
                op, dt = family.value, dtype.value
                state["curves"] = await run.io_bound(wb.cached, (digest, "series", op, dt),
                                                     lambda: views.series(db, op, dt))
            except Exception as exc:  # noqa: BLE001
                show_error(curve_box, exc)
                return
            if gen != state["series"]:
                return
            curve_sel.set_options({i: f"{s['label']} ({s['points']} points)"
                                   for i, s in enumerate(state["curves"][:200])},
                                  value=0 if state["curves"] else None)
            if state["curves"]:
                await draw_curve()
            else:
                curve_box.clear()
                with curve_box:
                    ui.label(f"no {family.value} {dtype.value} rows in this snapshot")

        async def draw_curve() -> None:
            if curve_sel.value is None or not state["curves"]:
                return
            gen = turn("curve")
            s = state["curves"][curve_sel.value]
            try:
                digest, db = await run.io_bound(wb.database, snap.value)
                resolvers = await run.io_bound(wb.curve_resolvers, digest,
                                               s["key"]["hardware"])
                op, dt, key = family.value, dtype.value, s["key"]
                c = await run.io_bound(
                    wb.cached, (digest, "curve", op, dt, tuple(sorted(key.items()))),
                    lambda: views.curve(db, digest, op, dt, key, resolvers))
            except Exception as exc:  # noqa: BLE001
                show_error(curve_box, exc)
                return
            if gen != state["curve"]:
                return
            curve_box.clear()
            with curve_box:
                ui.plotly(figures.curve_figure(c)).classes("full-width") \
                    .props('data-testid="kernel-curve"')

        snap.on_value_change(load_snapshot)
        family.on_value_change(load_snapshot)
        dtype.on_value_change(load_series)
        curve_sel.on_value_change(draw_curve)
        # the catalog goes out at once; the heatmap and curves follow over the websocket
        await ui.context.client.connected()
        await load_snapshot()
