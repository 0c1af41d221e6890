"""Assemble and run the workbench: one NiceGUI server, its FastAPI app carrying the JSON
API (/api, OpenAPI page at /docs) and the pages."""

from __future__ import annotations

from perfcast.workbench.state import Workbench


def create(wb: Workbench):
    """Register the API and the pages on NiceGUI's app; returns (app, jobs)."""
    from nicegui import app

    from perfcast.workbench import pages
    from perfcast.workbench.api import build_router, install_error_handler
    from perfcast.workbench.jobs import JobManager

    jobs = JobManager()
    app.include_router(build_router(wb, jobs))
    install_error_handler(app)
    pages.register(wb, jobs)
    app.on_shutdown(jobs.shutdown)
    return app, jobs


def serve(wb: Workbench, *, host: str = "127.0.0.1", port: int = 8080) -> None:
    from nicegui import ui

    create(wb)
    print(f"perfcast workbench on http://{host}:{port}/ (API: /api, OpenAPI: /docs; "
          f"evidence store {wb.evidence_path})", flush=True)
    ui.run(host=host, port=port, reload=False, show=False, title="perfcast workbench",
           fastapi_docs=True, show_welcome_message=False, favicon="📈",
           uvicorn_logging_level="warning")
