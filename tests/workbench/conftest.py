"""A workbench server on a free loopback port over small real slices: the H100 fixture
tables (tests/fixtures/aiconfigurator) and one H200 GEMM curve cut from the shared
AIConfigurator data, both imported with `perfcast evidence import aiconfigurator`; the
silicon fixture imported with `perfcast observe import silicon`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
H200 = REPO.parent / "shared" / "reference" / "aiconfigurator" / "h200_sxm"
PERFCAST = [sys.executable, "-m", "perfcast.cli.main"]
SILICON = FIXTURES / "silicon" / "h100_sxm_slice.csv"


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    r = subprocess.run([*PERFCAST, *args], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, f"perfcast {' '.join(args)}: {r.stderr}"
    return r


def h200_slice(dest: Path) -> Path:
    """One H200 vLLM 0.24.0 GEMM curve (n = k = 4096, bf16) in the AIConfigurator layout."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    src = H200 / "gemm" / "vllm" / "0.24.0"
    assert src.is_dir(), f"{src} is missing (the shared reference data)"
    out = dest / "h200_sxm" / "gemm" / "vllm" / "0.24.0"
    out.mkdir(parents=True)
    t = pq.read_table(src / "gemm_perf.parquet")
    t = t.filter((pc.field("n") == 4096) & (pc.field("k") == 4096)
                 & (pc.field("gemm_dtype") == "bfloat16"))
    pq.write_table(t, out / "gemm_perf.parquet")
    shutil.copy(src / "collection_meta.yaml", out / "collection_meta.yaml")
    return dest / "h200_sxm"


@pytest.fixture(scope="session")
def stores(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("workbench-stores")
    # not PYTEST_*: NiceGUI takes a process that has them for its own test harness
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
           "PERFCAST_EVIDENCE_STORE": str(root / "evidence"),
           "PERFCAST_OBSERVATION_STORE": str(root / "observations"),
           "PERFCAST_CALIBRATION_STORE": str(root / "calibration")}
    cli("evidence", "import", "aiconfigurator", str(FIXTURES / "aiconfigurator" / "h100_sxm"),
        env=env)
    cli("evidence", "import", "aiconfigurator", str(h200_slice(root / "h200")), env=env)
    cli("observe", "import", "silicon", str(SILICON), env=env)
    listed = json.loads(cli("evidence", "list", "--format", "json", env=env).stdout)
    return {"env": env, "root": root, "snapshots": {s["name"]: s["digest"] for s in listed}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(stores):
    """`perfcast workbench` as a subprocess; its base URL once it answers."""
    import httpx

    port = free_port()
    log = open(stores["root"] / "server.log", "w")
    proc = subprocess.Popen([*PERFCAST, "workbench", "--port", str(port)], env=stores["env"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            if httpx.get(url + "/api/evidence", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError("the workbench did not start: "
                               + (stores["root"] / "server.log").read_text()[-3000:])
        time.sleep(0.3)
    yield {"url": url, "proc": proc, **stores}
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session")
def api(server):
    import httpx

    with httpx.Client(base_url=server["url"], timeout=120) as client:
        yield client


CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


@pytest.fixture(scope="session")
def browser():
    """Debian's headless Chromium driven by Selenium (never a browser downloaded at run
    time: `make test` installs chromium and chromium-driver with apt-get)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        assert path.exists(), (f"{path} is missing: `apt-get install -y chromium "
                               "chromium-driver` (make test does it)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1600", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
