"""Assemble and run the workbench: one NiceGUI server, its FastAPI app carrying the JSON
API (/api, OpenAPI page at /docs) and the pages."""

from __future__ import annotations

from pathlib import Path

from perfcast.workbench.state import Workbench


def create(wb: Workbench):
    """Register the API and the pages on NiceGUI's app; returns (app, jobs)."""
    from nicegui import app

    from perfcast.workbench import pages
    from perfcast.workbench.api import build_router, install_error_handler
    from perfcast.workbench.jobs import JobManager

    import perfcast.cli.estimate  # noqa: F401 - the cost path, imported at start rather
    import perfcast.report.step  # noqa: F401   than on the first request
    import perfcast.serving.deploy  # noqa: F401

    jobs = JobManager()
    preload_assets()
    warm_up()
    app.include_router(build_router(wb, jobs))
    install_error_handler(app)
    openapi_page(app)
    pages.register(wb, jobs)
    app.on_shutdown(jobs.shutdown)
    return app, jobs


# what every NiceGUI page loads from nicegui/static: the text font is found only once
# the stylesheets are parsed (Roboto's faces have no font-display: text stays invisible
# until it has loaded); dompurify and dynamic_properties only once the modules that
# import them have loaded; the small deferred scripts (low priority in Chromium) queue
# behind the component modules on the six connections a browser opens to one host.
# Not quasar.umd.prod.js (500 kB): preloaded, it competes with the stylesheets and the
# font, which the first paint waits for (measured: docs/workbench.md, Speed)
PRELOAD_SCRIPTS = ("socket.io.min.js", "nicegui.js", "lang/en-US.umd.prod.js")
PRELOAD_MODULES = ("dompurify.mjs", "utils/dynamic_properties.js")


def preload_assets() -> None:
    """<link rel=preload> hints in every page's head, so that a browser with nothing
    cached asks for the text font and NiceGUI's scripts with the stylesheets."""
    import nicegui
    from nicegui import ui

    static = Path(nicegui.__file__).parent / "static"
    base = f"/_nicegui/{nicegui.__version__}/static"
    font = latin_font(static / "fonts.css", "Roboto")
    links = []
    if font and (static / font).is_file():
        links.append(f'<link rel="preload" as="font" type="font/woff2" crossorigin '
                     f'href="{base}/{font}">')
    links += [f'<link rel="preload" as="script" href="{base}/{f}">'
              for f in PRELOAD_SCRIPTS if (static / f).is_file()]
    links += [f'<link rel="modulepreload" href="{base}/{f}">'
              for f in PRELOAD_MODULES if (static / f).is_file()]
    ui.add_head_html("\n".join(links), shared=True)


def latin_font(css: Path, family: str) -> str | None:
    """The file of `family`'s regular (400) face for Latin text in a stylesheet of
    @font-face rules (the face whose unicode-range starts at U+0000), or None."""
    import re

    if not css.is_file():
        return None
    for rule in re.findall(r"@font-face\s*{([^}]*)}", css.read_text()):
        if (re.search(rf'font-family:\s*"?{re.escape(family)}"?\s*;', rule)
                and re.search(r"font-weight:\s*400\b", rule)
                and re.search(r"unicode-range:\s*U\+0000-", rule)):
            src = re.search(r"url\(([^)]+)\)", rule)
            return src.group(1).strip("'\"") if src else None
    return None


def warm_up() -> None:
    """What the first page request would do otherwise (about 0.1 s): compile NiceGUI's
    page template and import the element classes the pages use."""
    import nicegui.client
    from nicegui import ui

    templates = getattr(nicegui.client, "templates", None)
    if templates is not None:
        templates.get_template("index.html")
    for name in ("header", "link", "label", "table", "select", "row", "column", "plotly",
                 "button", "input", "number", "textarea", "code", "tabs", "notify"):
        getattr(ui, name, None)


def openapi_page(app) -> None:
    """/openapi.json and its Swagger UI at /docs, with the UI's files served from the
    swagger-ui-bundle package (FastAPI's default page loads them from a CDN, and the
    workbench must work offline)."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import JSONResponse
    from fastapi.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    app.title, app.version = "perfcast workbench API", _version()
    app.mount("/_swagger", StaticFiles(directory=swagger_ui_path), name="swagger")

    @app.get("/openapi.json", include_in_schema=False)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/openapi-3.0.json", include_in_schema=False)
    def openapi30() -> JSONResponse:
        return JSONResponse(openapi_30(app.openapi()))

    @app.get("/docs", include_in_schema=False)
    def docs():
        return get_swagger_ui_html(openapi_url="/openapi-3.0.json", title=app.title,
                                   swagger_js_url="/_swagger/swagger-ui-bundle.js",
                                   swagger_css_url="/_swagger/swagger-ui.css",
                                   swagger_favicon_url="/_swagger/favicon-32x32.png")


def openapi_30(doc: dict) -> dict:
    """The OpenAPI 3.1 document in the 3.0 form the bundled Swagger UI (4.x) reads:
    `anyOf: [X, {type: null}]` becomes X with `nullable: true`; `examples` lists are
    dropped (3.0 has a single `example`)."""
    def down(node):
        if isinstance(node, list):
            return [down(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {k: down(v) for k, v in node.items() if k != "examples"}
        alts = out.get("anyOf")
        if isinstance(alts, list) and {"type": "null"} in alts:
            rest = [a for a in alts if a != {"type": "null"}]
            del out["anyOf"]
            out.update(rest[0] if len(rest) == 1 else {"anyOf": rest})
            out["nullable"] = True
        return out

    return {**down(doc), "openapi": "3.0.3"}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("perfcast")
    except PackageNotFoundError:
        return "unknown"


def serve(wb: Workbench, *, host: str = "127.0.0.1", port: int = 8080) -> None:
    from nicegui import ui

    from perfcast.cli.workbench import LOOPBACK

    create(wb)
    print(f"perfcast workbench on http://{host}:{port}/ (API: /api, OpenAPI: /docs; "
          f"evidence store {wb.evidence_path})", flush=True)
    # no gzip on loopback: compressing each response costs the server and the browser
    # more time than the bytes it saves on a local connection
    extra = {"gzip_middleware_factory": None} if host in LOOPBACK else {}
    # tailwind=False: Quasar's classes only (the in-browser Tailwind compiler costs about
    # half a second per page load); reconnect_timeout: a page whose connection drops for
    # a while (a busy machine) keeps its state instead of being rebuilt after 3 s
    ui.run(host=host, port=port, reload=False, show=False, title="perfcast workbench",
           show_welcome_message=False, favicon="📈", tailwind=False, reconnect_timeout=30.0,
           uvicorn_logging_level="warning", **extra)
