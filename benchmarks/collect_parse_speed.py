"""Speed of `collect parse` on a large synthetic kernel_details.csv.

Writes N rows in the real kernel_details column layout (20 kernel types x 50 shapes,
counters filled), parses them into a database and prints rows per second.

    python benchmarks/collect_parse_speed.py [--rows 200000]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from perfcast.collect.parse import parse_profiling

HEADER = ("Step Id,Device_id,Model ID,Task ID,Stream ID,Name,Type,OP State,Accelerator Core,"
          "Start Time(us),Duration(us),Wait Time(us),Block Dim,Mix Block Dim,HF32 Eligible,"
          "Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,"
          "Output Formats,Context ID,aicore_time(us),aic_total_cycles,aic_mac_ratio,"
          "aiv_time(us),aiv_vec_ratio,cube_utilization(%)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=200_000)
    a = p.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel_details.csv"
        lines = [HEADER]
        for i in range(a.rows):
            kt = f"Kernel{i % 20}"
            m = 16 * (1 + (i // 20) % 50)
            dur = 10 + rng.random()
            lines.append(f"1,0,1,{i},2,aclnn_{kt},{kt},dynamic,AI_CORE,{i * 20.0},{dur:.3f},0.5,24,"
                         f"0,NO,\"{m},5120;5120,1280\",DT_BF16;DT_BF16,ND;FRACTAL_NZ,"
                         f"\"{m},1280\",DT_BF16,ND,N/A,{dur * 0.9:.3f},{int(dur * 1840)},0.61,"
                         "N/A,N/A,55.0")
        src.write_text("\n".join(lines) + "\n")
        t0 = time.perf_counter()
        result = parse_profiling(src, Path(tmp) / "db")
        dt = time.perf_counter() - t0
    print(f"parsed {result.samples} rows into {len(result.kernel_types)} CSVs in {dt:.2f} s "
          f"({result.samples / dt:,.0f} rows/s)")


if __name__ == "__main__":
    main()
