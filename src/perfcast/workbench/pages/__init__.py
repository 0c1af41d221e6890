"""The workbench pages (NiceGUI). Each page module has `register(wb, jobs)`."""

from perfcast.workbench.pages import calibration, estimate, evidence, query, serve

PAGES = (("/evidence", "Evidence"), ("/query", "Query inspector"), ("/estimate", "Estimate"),
         ("/serve", "Serve and search"), ("/calibration", "Calibration and validation"))


def register(wb, jobs) -> None:
    from nicegui import ui

    @ui.page("/")
    def index() -> None:
        ui.navigate.to("/evidence")

    for module in (evidence, query, estimate, serve, calibration):
        module.register(wb, jobs)
