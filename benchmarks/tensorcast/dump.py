"""Make TensorCast (msModeling) operator dumps for the fidelity benchmark.

    python benchmarks/tensorcast/dump.py --msmodeling /tmp/tc/msmodeling \
        --python /tmp/tc/venv/bin/python --out /tmp/tc/dumps [CASE ...]

Runs `launch.py -- MODEL --compile --dump-input-shapes --chrome-trace-file ...` once per
case (analytic mode, Atlas 800 A3 die, no weights: the model is built on the meta device
from a folder holding the catalog's config.json, HF_HUB_OFFLINE=1) and writes
OUT/<case>/: stdout.txt (the `--dump-input-shapes` table), stderr.txt, trace.json (the
chrome trace), command.txt, calls.json (launch.py's per-call records) and summary.json
(TensorCast's printed latency and memory, FLOPs per device summed from its calls, versions).

`--fixtures DIR` then writes DIR/<case>.json, the compact form the tests read (see
`compact`). Needs msModeling's own environment (torch, transformers, ...): an optional
reference, never a perfcast dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CATALOG = HERE.parents[1] / "src" / "perfcast" / "workload" / "model_catalog"
DEVICE = "ATLAS_800_A3_752T_128G_DIE"

DECODE_8 = ["--num-queries", "8", "--query-length", "1", "--context-length", "1024", "--decode"]
PREFILL_512 = ["--num-queries", "1", "--query-length", "512"]
BF16 = ["--quantize-linear-action", "DISABLED"]
MATMUL_ALLREDUCE = "enable_matmul_allreduce"
DISPATCH_FFN_COMBINE = "enable_dispatch_ffn_combine"

# case -> (catalog model, TensorCast flags after the model and device)
CASES: dict[str, tuple[str, list[str]]] = {
    "qwen3_8b_decode_tp1": ("Qwen/Qwen3-8B", DECODE_8 + BF16),
    "qwen3_8b_prefill_tp1": ("Qwen/Qwen3-8B", PREFILL_512 + BF16),
    "qwen3_32b_decode_tp4": ("Qwen/Qwen3-32B", DECODE_8 + BF16 + ["--tp-size", "4", "--num-devices", "4"]),
    "qwen3_32b_prefill_tp4": ("Qwen/Qwen3-32B", PREFILL_512 + BF16 + ["--tp-size", "4", "--num-devices", "4"]),
    "qwen3_8b_decode_w8a8": ("Qwen/Qwen3-8B", DECODE_8 + ["--quantize-linear-action", "W8A8_DYNAMIC"]),
    "qwen3_30b_a3b_decode_ep": ("Qwen/Qwen3-30B-A3B", DECODE_8 + BF16 + [
        "--tp-size", "4", "--ep-size", "4", "--num-devices", "4"]),
    "deepseek_v3_decode_tp16_ep16": ("deepseek-ai/DeepSeek-V3", DECODE_8 + BF16 + [
        "--tp-size", "16", "--ep-size", "16", "--num-devices", "16"]),
    "deepseek_v3_decode_tp8": ("deepseek-ai/DeepSeek-V3", [
        "--num-queries", "4", "--query-length", "1", "--context-length", "2048", "--decode",
        *BF16, "--tp-size", "8", "--num-devices", "8"]),
    # W8A8 (TensorCast's default quantize action): MLA preprocessing as mlapo_quant
    "deepseek_v3_decode_w8a8_tp8": ("deepseek-ai/DeepSeek-V3", [
        "--num-queries", "4", "--query-length", "1", "--context-length", "2048", "--decode",
        "--quantize-linear-action", "W8A8_DYNAMIC", "--tp-size", "8", "--num-devices", "8"]),
    "deepseek_v3_decode_w8a8_tp16_ep16": ("deepseek-ai/DeepSeek-V3", DECODE_8 + [
        "--quantize-linear-action", "W8A8_DYNAMIC", "--tp-size", "16", "--ep-size", "16",
        "--num-devices", "16"]),
    "qwen3_30b_a3b_decode_w8a8_ep": ("Qwen/Qwen3-30B-A3B", DECODE_8 + [
        "--quantize-linear-action", "W8A8_DYNAMIC", "--tp-size", "4", "--ep-size", "4",
        "--num-devices", "4"]),
    "qwen3_30b_a3b_prefill_ep": ("Qwen/Qwen3-30B-A3B", PREFILL_512 + BF16 + [
        "--tp-size", "4", "--ep-size", "4", "--num-devices", "4"]),
    "qwen3_30b_a3b_decode_tp4": ("Qwen/Qwen3-30B-A3B", DECODE_8 + BF16 + [
        "--tp-size", "4", "--num-devices", "4"]),
    "deepseek_v3_prefill_tp16_ep16": ("deepseek-ai/DeepSeek-V3", PREFILL_512 + BF16 + [
        "--tp-size", "16", "--ep-size", "16", "--num-devices", "16"]),
    "qwen3_32b_decode_w8a8_tp4": ("Qwen/Qwen3-32B", DECODE_8 + [
        "--quantize-linear-action", "W8A8_DYNAMIC", "--tp-size", "4", "--num-devices", "4"]),
    "qwen3_235b_a22b_decode_ep8": ("Qwen/Qwen3-235B-A22B", [
        "--num-queries", "16", "--query-length", "1", "--context-length", "2048", "--decode",
        *BF16, "--tp-size", "8", "--ep-size", "8", "--num-devices", "8"]),
    # a context that is not a multiple of the 128-token cache block
    "qwen3_8b_decode_ctx1000": ("Qwen/Qwen3-8B", [
        "--num-queries", "3", "--query-length", "1", "--context-length", "1000", "--decode",
        *BF16]),
    # TensorCast's fusion passes that are off by default (tensor_cast/config.py
    # compilation.fusion_patterns), switched on as vLLM-Ascend 0.18 runs them
    "qwen3_32b_decode_tp4_mc2": ("Qwen/Qwen3-32B", DECODE_8 + BF16 + [
        "--tp-size", "4", "--num-devices", "4", "--compilation-config", MATMUL_ALLREDUCE]),
    "qwen3_8b_decode_w8a8_tp4_mc2": ("Qwen/Qwen3-8B", DECODE_8 + [
        "--quantize-linear-action", "W8A8_DYNAMIC", "--tp-size", "4", "--num-devices", "4",
        "--compilation-config", MATMUL_ALLREDUCE]),
    "qwen3_30b_a3b_decode_ep_fused": ("Qwen/Qwen3-30B-A3B", DECODE_8 + BF16 + [
        "--tp-size", "4", "--ep-size", "4", "--num-devices", "4",
        "--compilation-config", DISPATCH_FFN_COMBINE, MATMUL_ALLREDUCE]),
}


def model_dir(model: str, root: Path) -> Path:
    """A folder holding the catalog config as config.json (what TensorCast loads)."""
    src = CATALOG / (model.replace("/", "--") + ".json")
    folder = root / "models" / model.replace("/", "--")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(src.read_text())
    return folder


def versions(python: str, msmodeling: Path) -> dict:
    code = ("import json, torch, transformers, diffusers, compressed_tensors;"
            "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__,"
            "'diffusers': diffusers.__version__, 'compressed_tensors': compressed_tensors.__version__}))")
    out = json.loads(subprocess.run([python, "-c", code], check=True, capture_output=True,
                                    text=True).stdout)
    out["msmodeling_commit"] = subprocess.run(
        ["git", "-C", str(msmodeling), "rev-parse", "HEAD"], check=True, capture_output=True,
        text=True).stdout.strip()
    return out


def parse_stdout(text: str) -> dict:
    found = {}
    if m := re.search(r"\[analytic\] Execution time: ([0-9.eE+-]+) s", text):
        found["latency_s"] = float(m.group(1))
    if m := re.search(r"Total time for analytic: (\S+)", text):
        found["total_time_text"] = m.group(1)
    for key, pat in (("total_device_memory_gb", r"Total device memory: ([0-9.]+) GB"),
                     ("model_weight_gb", r"Model weight size: ([0-9.]+) GB"),
                     ("kv_cache_gb", r"KV cache: ([0-9.]+) GB")):
        if m := re.search(pat, text):
            found[key] = float(m.group(1))
    return found


def run_case(case: str, a) -> dict:
    model, flags = CASES[case]
    out = Path(a.out) / case
    out.mkdir(parents=True, exist_ok=True)
    folder = model_dir(model, Path(a.out))
    tc_args = [str(folder), "--device", DEVICE, *flags, "--compile", "--dump-input-shapes",
               "--chrome-trace-file", str(out / "trace.json")]
    cmd = [a.python, str(HERE / "launch.py"), "--calls-json", str(out / "calls.json"), "--", *tc_args]
    (out / "command.txt").write_text(
        f"cd {a.msmodeling} && HF_HUB_OFFLINE=1 {shlex.join(cmd)}\n"
        f"# TensorCast flags: python -m cli.inference.text_generate {shlex.join(tc_args)}\n"
        f"# model config: {model} (perfcast catalog)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    start = time.time()
    try:
        proc = subprocess.run(cmd, cwd=a.msmodeling, env=env, capture_output=True, text=True,
                              timeout=a.timeout)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = "timeout", exc.stdout or "", exc.stderr or ""
        stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
        stderr = stderr.decode() if isinstance(stderr, bytes) else stderr
    wall = time.time() - start
    (out / "stdout.txt").write_text(stdout)
    (out / "stderr.txt").write_text(stderr)
    summary = {"case": case, "model": model, "tensorcast_args": tc_args, "returncode": rc,
               "wall_s": round(wall, 1), "versions": versions(a.python, Path(a.msmodeling)),
               **parse_stdout(stdout)}
    calls_path = out / "calls.json"
    if rc == 0 and calls_path.exists():
        calls = json.loads(calls_path.read_text())
        summary["calls"] = len(calls)
        summary["mma_ops_per_device"] = sum(c.get("mma_ops", 0) for c in calls)
        summary["gp_ops_per_device"] = sum(c.get("gp_ops", 0) for c in calls)
        summary["flops_per_device"] = summary["mma_ops_per_device"] + summary["gp_ops_per_device"]
    else:
        summary["error"] = stderr.strip().splitlines()[-1:] if stderr.strip() else ["no output"]
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def compact(case_dir: Path) -> dict:
    """The fixture form of one dump: provenance, TensorCast's totals and its calls
    aggregated as unique (op, inputs, outputs, list_inputs, zero_cost) with a count, in
    order of first call; `order` lists, for every call in call order, its group's index."""
    summary = json.loads((case_dir / "summary.json").read_text())
    calls = json.loads((case_dir / "calls.json").read_text())
    groups: dict[str, dict] = {}
    index: dict[str, int] = {}
    order = []
    for c in calls:
        entry = {k: c[k] for k in ("op", "inputs", "outputs", "list_inputs", "kwarg_inputs",
                                   "zero_cost") if k in c}
        key = json.dumps(entry, sort_keys=True)
        index.setdefault(key, len(index))
        g = groups.setdefault(key, {**entry, "count": 0, "mma_ops": c.get("mma_ops", 0),
                                    "gp_ops": c.get("gp_ops", 0)})
        g["count"] += 1
        order.append(index[key])
    command = (case_dir / "command.txt").read_text().splitlines()
    return {
        "case": summary["case"], "model": summary["model"],
        "provenance": {
            "tool": "msModeling TensorCast, python -m cli.inference.text_generate (analytic)",
            "msmodeling_commit": summary["versions"]["msmodeling_commit"],
            "versions": summary["versions"],
            "command": command[0], "tensorcast_args": summary["tensorcast_args"],
            "shim": "benchmarks/tensorcast/launch.py (SiLU decomposition reset to core; "
                    "tensor_cast cache writes not cloned; call recorder)",
            "made_by": "benchmarks/tensorcast/dump.py --fixtures",
        },
        "totals": {k: summary[k] for k in ("latency_s", "flops_per_device", "mma_ops_per_device",
                                           "gp_ops_per_device", "calls", "model_weight_gb",
                                           "kv_cache_gb") if k in summary},
        "calls": list(groups.values()),
        "order": order,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", help=f"default: all of {', '.join(CASES)}")
    p.add_argument("--msmodeling", default="/tmp/tc/msmodeling")
    p.add_argument("--python", default="/tmp/tc/venv/bin/python")
    p.add_argument("--out", default="/tmp/tc/dumps")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--fixtures", default=None,
                   help="write DIR/<case>.json from existing dumps instead of running TensorCast")
    a = p.parse_args(argv)
    cases = a.cases or list(CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    if a.fixtures:
        Path(a.fixtures).mkdir(parents=True, exist_ok=True)
        for case in cases:
            d = Path(a.out) / case
            if not (d / "calls.json").exists():
                print(f"{case}: no dump, skipped", file=sys.stderr)
                continue
            doc = compact(d)
            path = Path(a.fixtures) / f"{case}.json"
            path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
            print(f"{case}: {path} ({path.stat().st_size // 1024} kB, {len(doc['calls'])} groups)")
        return 0
    for case in cases:
        s = run_case(case, a)
        print(f"{case}: rc={s['returncode']} wall={s['wall_s']}s calls={s.get('calls')} "
              f"latency={s.get('latency_s')} flops/device={s.get('flops_per_device')} "
              f"{s.get('error', '')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
