"""Speed of the workbench in a real browser (Debian's headless Chromium via Selenium),
against the done-when targets of issue 19:

- the Evidence page over the H100 + H200 snapshots: catalog shown < 1 s (navigation to
  its rows in the page and painted; also: the interactive table mounted and connected,
  heatmap and first kernel curve drawn, and the browser's load event: reported, no
  target);
- an estimate round-trip in the Estimate page < 1 s (click -> summary, table, plots);
- the Pareto page of a 1,000-configuration search renders < 2 s (page open -> every
  configuration drawn by plotly.js).

    python benchmarks/workbench_speed.py [--store DIR] [--repeats 5]

Without --store it imports ../shared/reference/aiconfigurator/{h100_sxm,h200_sxm} into a
temporary store with `perfcast evidence import aiconfigurator` (a version folder whose
table the importer refuses is left out and named). The search (Llama-3.1-8B, 8 GPUs,
25 layouts x 40 concurrencies, isl 128, osl 16) runs once as a workbench job before
the page timings; its own time is printed but is not a page timing, and so is the
server's start (process start to its API answering). "first" is the first load in a
fresh browser (nothing cached) from a fresh server process, "median" the warm loads
after it. Timers start before the navigation and stop when the page shows the thing
timed (the browser does not wait for its load event: pageLoadStrategy "none").
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
    o.page_load_strategy = "none"  # get() returns at once; the timers poll the page
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)
    d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": MARKS})
    return d


# run in every document before its own scripts: the browser's clock (ms since the
# navigation started) when the catalog's rows first appear (any table, and NiceGUI's in
# #app) and when NiceGUI's page finishes its handshake with the server; a poll from
# here would see them late whenever the page's scripts keep the browser busy
MARKS = """window.__marks = {};
new MutationObserver(() => {
  const m = window.__marks, now = performance.now();
  for (const [key, sel] of [["rows", '[data-testid="catalog"] tbody tr'],
                            ["app_rows", '#app [data-testid="catalog"] tbody tr']]) {
    const n = document.querySelectorAll(sel).length;
    if (n && !m[key + n]) m[key + n] = now;
  }
}).observe(document, {childList: true, subtree: true});
let handshake = false;
Object.defineProperty(window, "did_handshake", {configurable: true, get: () => handshake,
  set: (v) => { handshake = v; if (v && !window.__marks.handshake) window.__marks.handshake = performance.now(); }});"""


def until(cond, timeout_s: float = 120.0, poll_s: float = 0.01):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        v = cond()
        if v:
            return v
        time.sleep(poll_s)
    raise TimeoutError


# every check first asks that the page is the new one: navigate() marks the old one
FRESH = "if (window.__stale) return 0;\n"
POINTS = FRESH + """const el = document.querySelector('[data-testid="' + arguments[0] + '"]');
if (!el || !el.data) return 0; let n = 0;
for (const t of el.data) n += t.z ? t.z.flat().length : (t.x ? t.x.length : 0); return n;"""
ROWS = FRESH + """const el = document.querySelector(arguments[0]);
return el ? el.querySelectorAll('tbody tr').length : 0;"""
SHOWN = FRESH + """if (!performance.getEntriesByName('first-contentful-paint').length) return 0;
const el = document.querySelector('[data-testid="catalog"]');
return el ? el.querySelectorAll('tbody tr').length : 0;"""
MOUNTED = FRESH + """if (window.did_handshake !== true) return 0;
const el = document.querySelector('#app [data-testid="catalog"]');
return el ? el.querySelectorAll('tbody tr').length : 0;"""
CONNECTED = FRESH + "return window.did_handshake === true;"
LOAD_EVENT = FRESH + "return performance.getEntriesByType('navigation')[0].loadEventEnd;"


def js(d, script: str, *args):
    """The script's value, or None while the browser is between documents."""
    from selenium.common.exceptions import WebDriverException

    try:
        return d.execute_script(script, *args)
    except WebDriverException:
        return None


def navigate(d, url: str) -> None:
    js(d, "window.__stale = true;")
    d.get(url)


def time_evidence(d, url: str, snapshots: int, plots: bool = True) -> dict:
    """Seconds from the navigation command to: the catalog's rows in the page and painted
    (the later of the two), NiceGUI's table mounted with the page connected, (plots:) the
    heatmap and first kernel curve drawn; and the browser's load event."""
    t0, wall0 = time.perf_counter(), time.time()
    navigate(d, url + "/evidence")
    until(lambda: (js(d, SHOWN) or 0) >= snapshots)
    until(lambda: (js(d, MOUNTED) or 0) >= snapshots)
    # the marks are ms since the document's timeOrigin, an epoch time in ms
    origin, m, fcp = js(d, "return [performance.timeOrigin, window.__marks, "
                           "performance.getEntriesByName('first-contentful-paint')[0].startTime]")
    at = lambda ms: (origin + ms) / 1000 - wall0  # noqa: E731
    out = {"catalog_s": at(max(m[f"rows{snapshots}"], fcp)),
           "interactive_s": at(max(m[f"app_rows{snapshots}"], m["handshake"]))}
    if plots:
        until(lambda: (js(d, POINTS, "heatmap") or 0) > 0)
        out["heatmap_s"] = time.perf_counter() - t0
        until(lambda: (js(d, POINTS, "kernel-curve") or 0) > 0)
        out["curve_s"] = time.perf_counter() - t0
    out["load_event_s"] = until(lambda: js(d, LOAD_EVENT)) / 1000  # the browser's clock
    return out


def time_estimate(d, url: str) -> float:
    from selenium.webdriver.common.by import By

    navigate(d, url + "/estimate")
    until(lambda: js(d, CONNECTED))  # a click before the handshake is lost
    button = until(lambda: d.find_elements(By.CSS_SELECTOR, '[data-testid="run-estimate"]'))[0]
    t0 = time.perf_counter()
    button.click()
    until(lambda: (js(d, POINTS, "timeline") or 0) > 0
          and (js(d, ROWS, '[data-testid="ops"]') or 0) > 0)
    return time.perf_counter() - t0


def time_pareto(d, url: str, job: str, configurations: int) -> float:
    t0 = time.perf_counter()
    navigate(d, f"{url}/serve?job={job}")
    until(lambda: (js(d, POINTS, "pareto") or 0) >= configurations)
    return time.perf_counter() - t0


def summary(values: list[float]) -> str:
    return (f"first {values[0]:.3f} s, median {statistics.median(values):.3f} s, "
            f"max {max(values):.3f} s over {len(values)}")


def start_server(store: Path, env: dict, log: Path):
    """`perfcast workbench` on a free port: (process, URL, seconds until its API answered)."""
    import httpx

    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    server = subprocess.Popen([*PERFCAST, "workbench", "--port", url.rsplit(":", 1)[1],
                               "--store", str(store)], env=env, stdout=subprocess.DEVNULL,
                              stderr=open(log, "a"))
    try:
        until(lambda: _up(httpx, url), timeout_s=60, poll_s=0.05)
    except TimeoutError:
        server.kill()
        raise SystemExit(f"the workbench did not start: {log.read_text()[-2000:]}")
    return server, url, time.perf_counter() - t0


def first_loads(n: int, store: Path, env: dict, log: Path, snapshots: int) -> list[dict]:
    """The Evidence page in `n` fresh browsers, each from a fresh server process."""
    out = []
    for _ in range(n):
        server, url, start_s = start_server(store, env, log)
        d = None
        try:
            d = browser()
            out.append({**time_evidence(d, url, snapshots, plots=False),
                        "server_start_s": start_s})
        finally:
            if d is not None:
                d.quit()
            server.terminate()
            server.wait(timeout=10)
    return out


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, help="an evidence store (default: import H100 + H200)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--first-loads", type=int, default=3,
                    help="further first loads of the Evidence page, each in a fresh browser "
                         "from a fresh server process (catalog and interactive table)")
    ap.add_argument("--first-loads-only", action="store_true",
                    help="only those (no search, no warm loads)")
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
    log = tmp / "server.log"
    print(f"load average at start: {load_average()}")
    if args.first_loads_only:
        try:
            report_first_loads(args.first_loads, store, env, log)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    server, url, start_s = start_server(store, env, log)
    d = None
    try:
        print(f"server start (process start to its API answering): {start_s:.2f} s")
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
        ev[0]["server_start_s"] = start_s
        est = [time_estimate(d, url) for _ in range(args.repeats)]
        drawn = sum(c["tokens_per_s_per_gpu"] is not None
                    for c in result["result"]["configurations"])
        par = [time_pareto(d, url, job, drawn) for _ in range(args.repeats)]
        figures = {"evidence_catalog_s": [e["catalog_s"] for e in ev],
                   "evidence_interactive_s": [e["interactive_s"] for e in ev],
                   "evidence_heatmap_s": [e["heatmap_s"] for e in ev],
                   "evidence_first_curve_s": [e["curve_s"] for e in ev],
                   "evidence_load_event_s": [e["load_event_s"] for e in ev],
                   "estimate_round_trip_s": est, "pareto_1000_s": par}
        print(f"evidence catalog shown      {summary(figures['evidence_catalog_s'])}"
              "  (target < 1 s)")
        print(f"  + interactive table       {summary(figures['evidence_interactive_s'])}")
        print(f"  + coverage heatmap drawn  {summary(figures['evidence_heatmap_s'])}")
        print(f"  + first kernel curve      {summary(figures['evidence_first_curve_s'])}")
        print(f"  (browser's load event     {summary(figures['evidence_load_event_s'])})")
        print(f"estimate round-trip         {summary(est)}  (target < 1 s)")
        print(f"Pareto page, {drawn} points  {summary(par)}  (target < 2 s)")
        print(json.dumps({k: [round(v, 4) for v in vs] for k, vs in figures.items()}))
        print(f"load average: {load_average()}")
    finally:
        if d is not None:
            d.quit()
        server.terminate()
        server.wait(timeout=10)
    try:
        if args.first_loads:
            report_first_loads(args.first_loads, store, env, log, ev[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report_first_loads(n: int, store: Path, env: dict, log: Path, earlier: dict | None = None):
    """`n` more first loads (and the main run's first load, `earlier`), summarised."""
    from perfcast.evidence.store import EvidenceStore

    snapshots = len(EvidenceStore(store).list())
    loads = ([earlier] if earlier else []) + first_loads(n, store, env, log, snapshots)
    print(f"first loads (fresh browser, fresh server process), {len(loads)}:")
    for key, name in (("catalog_s", "evidence catalog shown"),
                      ("interactive_s", "  + interactive table"),
                      ("load_event_s", "  (browser's load event")):
        vs = [x[key] for x in loads]
        print(f"  {name:26s} median {statistics.median(vs):.3f} s, min {min(vs):.3f} s, "
              f"max {max(vs):.3f} s")
    starts = [x["server_start_s"] for x in loads if "server_start_s" in x]
    print(f"  (server start, not timed in the page: median {statistics.median(starts):.2f} s)")
    print(json.dumps({"first_loads": [{k: round(v, 4) for k, v in x.items()} for x in loads]}))
    print(f"load average: {load_average()}")


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
