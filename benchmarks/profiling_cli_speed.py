"""Wall time of one `perfcast estimate` CLI call with the profiling model against a large
database: the `a3_qwen3_8b` fixture plus N MatMulV2 rows of shapes no query asks for
(default 100,000), for a Qwen3-32B TP4 decode step on the Atlas 800 A3 die.

    .venv/bin/python benchmarks/profiling_cli_speed.py [N] [--repeat R]

With PYTHONDONTWRITEBYTECODE set, every call compiles perfcast's modules again (about
0.3 s here); unset it for the time an installed package takes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DB = ROOT / "tests" / "fixtures" / "msmodeling" / "a3_qwen3_8b"
COMMAND = ["estimate", "Qwen/Qwen3-32B", "--device", "atlas_800_a3_752t_128g_die",
           "--tp-size", "4", "--num-queries", "8", "--query-length", "1",
           "--context-length", "2048", "--decode", "--performance-model", "profiling",
           "--format", "json"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="?", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    perfcast = Path(sys.executable).with_name("perfcast")
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "db"
        shutil.copytree(DB, db)
        with open(db / "MatMulV2.csv", "a") as f:
            for i in range(args.rows):
                f.write(f'"{1000 + i},7000;3000,7000",DT_BF16;DT_BF16,ND;ND,"{1000 + i},3000",'
                        f"DT_BF16,ND,{50 + i * 0.01:.2f}\n")
        walls = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([str(perfcast), *COMMAND, "--profiling-database", str(db)],
                           check=True, stdout=subprocess.DEVNULL)
            walls.append(time.perf_counter() - t0)
            print(f"{args.rows} extra rows: {walls[-1]:.2f} s wall "
                  f"(load average {os.getloadavg()[0]:.1f})")
        bytecode = "not written" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "cached"
        print(f"median {statistics.median(walls):.2f} s, range {min(walls):.2f}-"
              f"{max(walls):.2f} s over {len(walls)} calls (Python bytecode {bytecode})")


if __name__ == "__main__":
    main()
