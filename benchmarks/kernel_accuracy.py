"""Leave-one-out accuracy of kernel latency predictions on H100 AIConfigurator tables.

For each sampled measured point: hold it out, predict it from the rest of its
partition, and compare with the measurement. Prints median and p90 absolute percentage
error for the roofline provider (catalog efficiencies), interpolation of raw latency,
and efficiency-space interpolation, per table/runtime/dtype.

    python benchmarks/kernel_accuracy.py [--data DIR] [--samples 3000] [--seed 0]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostQuery, CostQueryContext, CostSubject
from perfcast.evidence.importers.aiconfigurator import import_system
from perfcast.evidence.interpolation import SPECS, Axis, InterpolatingProvider, _inverse
from perfcast.evidence.roofline import RooflineCostProvider
from perfcast.evidence.work_model import TIED
from perfcast.hardware import load_system

DATA = Path("/work/shared/reference/aiconfigurator/h100_sxm")
CASES = [  # (family folder, runtime, version, operation, dtype)
    ("gemm", "vllm", "0.19.0", "gemm", "bf16"),
    ("gemm", "vllm", "0.19.0", "gemm", "fp8"),
    ("gemm", "trtllm", "1.3.0rc20", "gemm", "bf16"),
    ("gemm", "sglang", "0.5.14", "gemm", "bf16"),
    ("gemm", "vllm", "0.24.0", "gemm", "bf16"),
    ("gemm", "vllm", "0.24.0", "gemm", "fp8"),
    ("attention", "vllm", "0.19.0", "attention", "bf16"),
    ("attention", "trtllm", "1.3.0rc20", "attention", "bf16"),
    ("attention", "sglang", "0.5.14", "attention", "bf16"),
]


def work_query(op: str, dtype: str, facts: dict) -> CostQuery:
    """A query with the workload's FLOPs/bytes for the roofline baseline."""
    dims = {k: v for k, v in facts.items()
            if k not in ("runtime", "runtime_revision", "implementation")}
    flops = bytes_total = 0.0
    if op == "gemm":
        m, n, k = dims["m"], dims["n"], dims["k"]
        b = 1.0 if dtype.startswith("fp8") else 2.0
        flops, bytes_total = 2.0 * m * n * k, (m * k + k * n) * b + m * n * 2.0
    elif op == "attention":
        q, kv, h = dims["q_tokens"], dims["kv_len"], dims["heads"]
        hd, kvh, bsz = dims["head_dim"], dims["kv_heads"], dims["batch"]
        kvb = 1.0 if str(dims.get("kv_dtype")).startswith("fp8") else 2.0
        flops = 4.0 * h * hd * (q * (kv - q) + q * (q + 1) / 2.0) * bsz
        bytes_total = bsz * (2 * q * h * hd * 2.0 + kv * kvh * 2 * hd * kvb)
    return CostQuery(subject=CostSubject.OPERATOR, operation=op, hardware="h100_sxm",
                     dtype=dtype, flops=flops, bytes_read=bytes_total, dims=FrozenDict(dims),
                     context=CostQueryContext(runtime=facts.get("runtime", ""),
                                              runtime_revision=facts.get("runtime_revision", ""),
                                              implementation=facts.get("implementation", "")))


def stats(errors: list[float]) -> str:
    if not errors:
        return "      n/a      "
    e = np.abs(np.asarray(errors)) * 100
    return f"{np.median(e):6.2f}% {np.percentile(e, 90):7.2f}%"


def variants() -> dict[str, dict]:
    """Interpolation variants compared (the default SPECS is one of them)."""
    lat = {op: replace(s, target="latency") for op, s in SPECS.items()}
    eff = {op: replace(s, target="efficiency") for op, s in SPECS.items()}
    sqrt_kv = dict(lat)
    sqrt_kv["attention"] = replace(lat["attention"], axes=(Axis("kv_len", "sqrt"),
                                                           *lat["attention"].axes[1:]))
    no_align = dict(eff)
    no_align["gemm"] = replace(eff["gemm"], axes=(Axis("m"), *eff["gemm"].axes[1:]))
    return {"default": SPECS, "latency-log": lat, "efficiency-log": eff,
            "latency-sqrt-kv": sqrt_kv, "eff-no-align": no_align}


def run(args) -> None:
    system = load_system("h100_sxm")
    roofline = RooflineCostProvider(system)
    names = ["roofline", *variants()]
    print(f"{'case':32s} {'n':>5s} {'cover':>6s} | " + " | ".join(f"{n:>16s}" for n in names))
    print(f"{'':32s} {'':>5s} {'':>6s} | " + " | ".join(f"{'median    p90':>16s}" for _ in names))
    summary: dict[str, list[float]] = {}
    for family, runtime, version, op, dtype in CASES:
        folder = args.data / family / runtime / version
        db = import_system(folder, hardware="h100_sxm")
        provs = {name: InterpolatingProvider(db, system, specs=specs)
                 for name, specs in variants().items()}
        base = provs["default"]
        parts = base.partitions.get(("operator", op, "h100_sxm", dtype), [])
        lookup = {name: {(p.group, _fixed_key(p)): p
                         for p in prov.partitions.get(("operator", op, "h100_sxm", dtype), [])}
                  for name, prov in provs.items()}
        rng = np.random.default_rng(args.seed)
        points = [(p, key, i) for p in parts for key, line in p.lines.items()
                  for i in range(len(line.x))]
        pick = rng.choice(len(points), size=min(args.samples, len(points)), replace=False)
        errs: dict[str, list[float]] = {n: [] for n in names}
        covered = 0
        lat = db.table.column("latency_s").to_numpy()
        spec = SPECS[op]
        for idx in pick:
            part, key, i = points[idx]
            line = part.lines[key]
            row = int(line.rows[i][0])
            measured = float(np.median(lat[line.rows[i]]))
            facts = {k: v for k, v in part.fixed.items() if v is not TIED}
            for a, v in zip(spec.axes[1:], key):
                facts[a.name] = int(v)
            facts[spec.axes[0].name] = int(round(_inverse(spec.axes[0].transform,
                                                          float(line.x[i]))))
            for follower, leader in spec.ties:
                if part.fixed.get(follower) is TIED:
                    facts[follower] = facts[leader]
            got = {}
            for name, prov in provs.items():
                p = lookup[name].get((part.group, _fixed_key(part)))
                got[name] = prov.predict(p, facts, exclude_row=row, policy="interpolate") \
                    if p else None
            if not all(isinstance(g, tuple) for g in got.values()):
                continue  # held-out point not bracketed (an edge of the grid)
            covered += 1
            errs["roofline"].append(roofline.estimate(work_query(op, dtype, facts)).latency_s
                                    / measured - 1)
            for name, g in got.items():
                errs[name].append(g[0] / measured - 1)
        label = f"{op} {runtime} {version} {dtype}"
        print(f"{label:32s} {len(pick):5d} {covered / max(1, len(pick)):6.1%} | "
              + " | ".join(f"{stats(errs[n]):>16s}" for n in names), flush=True)
        for n in names:
            summary.setdefault(f"{op}:{n}", []).extend(errs[n])
    print()
    for key, e in summary.items():
        print(f"all {key:28s} {stats(e)}")


def _fixed_key(part) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in part.fixed.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    run(ap.parse_args())


if __name__ == "__main__":
    main()
