"""What a browser with nothing cached gets first: the Evidence page's HTML holds the
catalog itself (rows from the store, escaped), a browser with scripts off shows it, and
it gives way to NiceGUI's table once that is mounted; the preload hints name files the
server sends, uncompressed on loopback."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from tests.workbench.test_browser import open_page, text, until


class Tables(HTMLParser):
    """Cell texts of each <table data-testid=...> and the <link> tags of a document."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.links: list[dict] = []
        self._table = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "link":
            self.links.append(a)
        elif tag == "table" and "data-testid" in a:
            self._table = self.tables.setdefault(a["data-testid"], [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag == "td" and self._table is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._table[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def page(api, path: str) -> Tables:
    r = api.get(path)
    assert r.status_code == 200
    doc = Tables()
    doc.feed(r.text)
    return doc


def test_evidence_html_holds_the_catalog(api, server):
    rows = [r for r in page(api, "/evidence").tables["catalog"] if r]
    listed = api.get("/api/evidence").json()
    assert len(rows) == len(listed) == 2
    by_name = {r[1]: r for r in rows}
    for snap in listed:
        row = by_name[snap["name"]]
        assert row[0] == snap["digest"][7:19]
        assert row[2] == str(snap["rows"])
        assert row[-1] == "Apache-2.0 (NVIDIA AIConfigurator)"


def test_html_table_escapes_its_cells():
    from perfcast.workbench.pages.common import html_table

    out = html_table("t", [{"label": "a<b", "field": "x"}], [{"x": "<script>alert(1)</script>"}])
    assert "<script>" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out and "a&lt;b" in out


def test_preloaded_files_are_served_uncompressed_on_loopback(api):
    links = [a for a in page(api, "/evidence").links
             if a.get("rel") in ("preload", "modulepreload")]
    hrefs = [a["href"] for a in links]
    assert any(h.endswith(".woff2") for h in hrefs)
    assert any(h.endswith("/nicegui.js") for h in hrefs)
    for href in hrefs:
        r = api.get(href, headers={"accept-encoding": "gzip"})
        assert r.status_code == 200, href
        assert "content-encoding" not in r.headers, href
    font = next(a for a in links if a["href"].endswith(".woff2"))
    assert font["as"] == "font" and "crossorigin" in font


def test_latin_font_is_robotos_regular_latin_face():
    import nicegui

    from perfcast.workbench.app import latin_font

    css = Path(nicegui.__file__).parent / "static" / "fonts.css"
    name = latin_font(css, "Roboto")
    assert name and (css.parent / name).is_file()
    rule = next(r for r in re.findall(r"@font-face\s*{([^}]*)}", css.read_text())
                if name in r and "font-weight: 400" in r)
    assert '"Roboto"' in rule and "U+0000-00FF" in rule
    assert latin_font(css, "No Such Family") is None


def test_catalog_shows_without_scripts_then_gives_way(browser, server):
    from selenium.webdriver.common.by import By

    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        browser.get(server["url"] + "/evidence")
        table = until(lambda: browser.find_elements(By.CSS_SELECTOR,
                                                    '[data-testid="catalog"]'),
                      what="the catalog without scripts")[0]
        assert table.is_displayed() and table.size["height"] > 40
        assert "aiconfigurator:h200_sxm" in table.text and "Apache-2.0" in table.text
        assert browser.find_elements(By.CSS_SELECTOR, "#app *") == []
    finally:
        browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})
    open_page(browser, server, "/evidence")
    until(lambda: text(browser, "catalog"), what="the catalog")
    assert browser.execute_script("""return [
        document.querySelectorAll('[data-testid="catalog"]').length,
        document.querySelectorAll('#app [data-testid="catalog"]').length,
        document.getElementById('server-rendered')]""") == [1, 1, None]
