"""Speed of the workbench in a real browser (Debian's headless Chromium via Selenium),
against the done-when targets of issue 19:

- the Evidence page over the H100 + H200 snapshots: catalog shown < 1 s (also: heatmap
  and first kernel curve drawn, reported, no target);
- an estimate round-trip in the Estimate page < 1 s (click -> summary, table, plots);
- the Pareto page of a 1,000-configuration search renders < 2 s (page open -> every
  configuration drawn by plotly.js).

    python benchmarks/workbench_speed.py [--store DIR] [--repeats 5]

Without --store it imports ../shared/reference/aiconfigurator/{h100_sxm,h200_sxm} into a
temporary store with `perfcast evidence import aiconfigurator` (a version folder whose
table the importer refuses is left out and named). The search (Llama-3.1-8B, 8 GPUs,
25 layouts x 40 concurrencies, isl 128, osl 16) runs once as a workbench job before
the page timings; its own time is printed but is not a page timing. "first" is the
first load in a fresh browser (nothing cached), "median" the warm loads after it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO.parent / "shared" / "reference" / "aiconfigurator"
PERFCAST = [sys.executable, "-m", "perfcast.cli.main"]


def import_system(system: str, store: Path, env: dict) -> None:
    """Import one system folder as one snapshot (rows the importer leaves out are listed
    in its report)."""
    r = subprocess.run([*PERFCAST, "evidence", "import", "aiconfigurator",
                        str(REFERENCE / system), "--store", str(store)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"import of {system} failed: {r.stderr}")
    print(f"  {r.stdout.splitlines()[0]}")
    for line in r.stdout.splitlines():
        if line.startswith("left out"):
            print(f"  {line}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    o = webdriver.ChromeOptions()
    o.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1600"):
        o.add_argument(a)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)


def until(cond, timeout_s: float = 120.0, poll_s: float = 0.01):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        v = cond()
        if v:
            return v
        time.sleep(poll_s)
    raise TimeoutError


POINTS = """const el = document.querySelector('[data-testid="' + arguments[0] + '"]');
if (!el || !el.data) return 0; let n = 0;
for (const t of el.data) n += t.z ? t.z.flat().length : (t.x ? t.x.length : 0); return n;"""
ROWS = """const el = document.querySelector('[data-testid="' + arguments[0] + '"]');
return el ? el.querySelectorAll('tbody tr').length : 0;"""


def time_evidence(d, url: str, snapshots: int) -> dict:
    t0 = time.perf_counter()
    d.get(url + "/evidence")
    until(lambda: d.execute_script(ROWS, "catalog") >= snapshots)
    catalog = time.perf_counter() - t0
    until(lambda: d.execute_script(POINTS, "heatmap") > 0)
    heatmap = time.perf_counter() - t0
    until(lambda: d.execute_script(POINTS, "kernel-curve") > 0)
    return {"catalog_s": catalog, "heatmap_s": heatmap, "curve_s": time.perf_counter() - t0}


def time_estimate(d, url: str) -> float:
    from selenium.webdriver.common.by import By

    d.get(url + "/estimate")
    button = until(lambda: d.find_elements(By.CSS_SELECTOR, '[data-testid="run-estimate"]'))[0]
    t0 = time.perf_counter()
    button.click()
    until(lambda: d.execute_script(POINTS, "timeline") > 0
          and d.execute_script(ROWS, "ops") > 0)
    return time.perf_counter() - t0


def time_pareto(d, url: str, job: str, configurations: int) -> float:
    t0 = time.perf_counter()
    d.get(f"{url}/serve?job={job}")
    until(lambda: d.execute_script(POINTS, "pareto") >= configurations)
    return time.perf_counter() - t0


def summary(values: list[float]) -> str:
    return (f"first {values[0]:.3f} s, median {statistics.median(values):.3f} s, "
            f"max {max(values):.3f} s over {len(values)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, help="an evidence store (default: import H100 + H200)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="workbench-speed-"))
    env = {**os.environ, "PERFCAST_OBSERVATION_STORE": str(tmp / "observations"),
           "PERFCAST_CALIBRATION_STORE": str(tmp / "calibration")}
    store = args.store
    if store is None:
        store = tmp / "evidence"
        for system in ("h100_sxm", "h200_sxm"):
            t0 = time.perf_counter()
            import_system(system, store, env)
            print(f"imported {system} in {time.perf_counter() - t0:.1f} s")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([*PERFCAST, "workbench", "--port", str(port), "--store",
                               str(store)], env=env, stdout=subprocess.DEVNULL,
                              stderr=open(tmp / "server.log", "w"))
    d = None
    try:
        until(lambda: _up(httpx, url), timeout_s=60, poll_s=0.2)
        listed = httpx.get(url + "/api/evidence").json()
        print(f"snapshots: " + ", ".join(f"{s['name']} ({s['rows']:,} records)" for s in listed))
        search = {"model": "meta-llama/Llama-3.1-8B", "gpus": 8, "isl": 128, "osl": 16,
                  "concurrency": ",".join(map(str, range(1, 41))), "max_tpot_ms": 20.0}
        t0 = time.perf_counter()
        job = httpx.post(url + "/api/search", json=search).json()["id"]
        result = until(lambda: _done(httpx, url, job), timeout_s=1800, poll_s=1.0)
        print(f"search job: {result['result']['evaluated']} configurations in "
              f"{time.perf_counter() - t0:.1f} s")
        d = browser()
        ev = [time_evidence(d, url, len(listed)) for _ in range(args.repeats)]
        est = [time_estimate(d, url) for _ in range(args.repeats)]
        drawn = sum(c["tokens_per_s_per_gpu"] is not None
                    for c in result["result"]["configurations"])
        par = [time_pareto(d, url, job, drawn) for _ in range(args.repeats)]
        figures = {"evidence_catalog_s": [e["catalog_s"] for e in ev],
                   "evidence_heatmap_s": [e["heatmap_s"] for e in ev],
                   "evidence_first_curve_s": [e["curve_s"] for e in ev],
                   "estimate_round_trip_s": est, "pareto_1000_s": par}
        print(f"evidence catalog shown      {summary(figures['evidence_catalog_s'])}"
              "  (target < 1 s)")
        print(f"  + coverage heatmap drawn  {summary(figures['evidence_heatmap_s'])}")
        print(f"  + first kernel curve      {summary(figures['evidence_first_curve_s'])}")
        print(f"estimate round-trip         {summary(est)}  (target < 1 s)")
        print(f"Pareto page, {drawn} points  {summary(par)}  (target < 2 s)")
        print(json.dumps({k: [round(v, 4) for v in vs] for k, vs in figures.items()}))
    finally:
        if d is not None:
            d.quit()
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def _up(httpx, url: str) -> bool:
    try:
        return httpx.get(url + "/api/evidence", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _done(httpx, url: str, job: str):
    j = httpx.get(f"{url}/api/jobs/{job}").json()
    if j["state"] == "running":
        return None
    if j["state"] != "done":
        raise SystemExit(f"the search job {j['state']}: {j.get('error')}")
    return j


if __name__ == "__main__":
    main()
