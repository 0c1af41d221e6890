"""What every page shares: the header with the page links, error display, formatting."""

from __future__ import annotations

import json
from html import escape

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


# the look of the header and a table, for HTML shown before NiceGUI's styles and scripts
SERVER_RENDERED_CSS = """
#server-rendered { font-family: Roboto, -apple-system, "Helvetica Neue", Helvetica, Arial,
  sans-serif; font-size: 14px; line-height: 1.5; color: rgba(0, 0, 0, 0.87); }
#server-rendered .bar { display: flex; align-items: center; gap: 16px; padding: 16px;
  background: #263238; color: #fff; }
#server-rendered .bar a { color: #fff; text-decoration: none; }
#server-rendered .bar .title { font-size: 1.25rem; font-weight: 700; }
#server-rendered .bar .current { font-weight: 700; text-decoration: underline; }
#server-rendered .content { padding: 16px; display: flex; flex-direction: column; gap: 16px; }
#server-rendered .caption { color: #616161; }
#server-rendered table { border-collapse: collapse; width: 100%; }
#server-rendered caption { text-align: left; font-size: 20px; padding: 12px 16px; }
#server-rendered th { text-align: left; font-size: 12px; font-weight: 500;
  color: rgba(0, 0, 0, 0.54); padding: 7px 16px; border-bottom: 1px solid rgba(0, 0, 0, 0.12); }
#server-rendered td { padding: 7px 16px; border-bottom: 1px solid rgba(0, 0, 0, 0.12); }
"""


def server_rendered(current: str, content_html: str, until: str) -> str:
    """HTML for `ui.add_body_html`: the header and `content_html`, in the document itself,
    so that they show once the browser has the stylesheets (NiceGUI draws its page only
    when its scripts have loaded and run). The block removes itself when an element matching the
    CSS selector `until` is in NiceGUI's page."""
    from perfcast.workbench.pages import PAGES

    links = "".join(f'<a href="{path}"{" class=current" if name == current else ""}>'
                    f"{escape(name)}</a>" for path, name in PAGES)
    return (f"<style>{SERVER_RENDERED_CSS}</style>"
            f'<div id="server-rendered"><div class="bar"><span class="title">{TITLE}</span>'
            f'{links}<a href="/docs" style="margin-left: auto">API</a></div>'
            f'<div class="content">{content_html}</div></div>'
            "<script>new MutationObserver((_, watch) => {"
            f"if (document.querySelector({json.dumps('#app ' + until)})) {{"
            "document.getElementById('server-rendered').remove(); watch.disconnect(); }"
            "}).observe(document.body, {childList: true, subtree: true});</script>")


def html_table(title: str, columns: list[dict], rows: list[dict], attrs: str = "") -> str:
    """A `ui.table`'s columns and rows as an HTML table (cells escaped)."""
    head = "".join(f"<th>{escape(str(c['label']))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(r.get(c['field'], '')))}</td>"
                                    for c in columns) + "</tr>" for r in rows)
    return (f"<table {attrs}><caption>{escape(title)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


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
