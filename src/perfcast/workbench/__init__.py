"""`perfcast workbench`: a local, read-only web application (NiceGUI) and JSON API
(FastAPI, under /api) over the evidence store, observation sets and calibration
revisions. Every API body is the record the CLI's `--format json` prints, built by the
same function (`perfcast.cli.*`); the pages draw those records and the evidence rows."""
