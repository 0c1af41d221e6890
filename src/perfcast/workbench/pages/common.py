"""What every page shares: the header with the page links, error display, formatting."""

from __future__ import annotations

import json

from perfcast.core.errors import PerfcastError

TITLE = "perfcast workbench"


def header(current: str) -> None:
    from nicegui import ui

    from perfcast.workbench.pages import PAGES

    ui.page_title(f"{current} - {TITLE}")
    with ui.header().classes("items-center bg-blue-grey-10 text-white"):
        ui.label(TITLE).classes("text-h6 text-bold")
        for path, name in PAGES:
            link = ui.link(name, path).classes("text-white").style("text-decoration: none")
            if name == current:
                link.classes("text-bold").style("text-decoration: underline")
        ui.link("API", "/docs").classes("text-white").style("text-decoration: none; margin-left: auto")


def preload_plots() -> None:
    """An empty, hidden plot: plotly.js (a few MB) loads while the form is filled, not
    when the first result arrives."""
    from nicegui import ui

    ui.plotly({"data": [], "layout": {}, "config": {"responsive": False}}).classes("hidden")


def show_error(container, exc: BaseException) -> None:
    """An error a user can act on, in the page (and as a notification)."""
    from nicegui import ui

    text = f"error: {exc}" if isinstance(exc, PerfcastError) else \
        f"error: {type(exc).__name__}: {exc}"
    container.clear()
    with container:
        ui.label(text).classes("text-negative").style("font-family: monospace; white-space: pre-wrap").props(
            'data-testid="error"')
    ui.notify(text, type="negative", multi_line=True)


def json_block(doc) -> None:
    from nicegui import ui

    ui.code(json.dumps(doc, indent=1, sort_keys=True, default=str), language="json") \
        .classes("full-width text-caption").style("max-height: 24rem; overflow: auto")


def us(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.2f}"


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def models() -> list[str]:
    from perfcast.workload import builtin_models

    return list(builtin_models())


def devices() -> list[str]:
    from perfcast.hardware import available_devices

    return list(available_devices())
