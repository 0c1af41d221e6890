"""Where the silicon-validation error comes from: predicted vs measured per row and per
model x backend x isl/osl group, plus the split of predicted step time.

    python benchmarks/silicon_breakdown.py [CSV] [--evidence-root DIR] [--model SUBSTR]
        [--backend NAME] [--rows] [--steps]

`--rows` prints every row (C, measured and predicted TTFT/TPOT, signed errors);
`--steps` prints, per group, the step-time split of one decode iteration at the
group's median concurrency (GEMM/norm body, LM head, attention, kernel launch, host).
Only agg rows are analysed.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np

from perfcast.serving.silicon import (ModelResolver, load_rules, read_rows, row_config, summarize,
                                      validate_rows)
from perfcast.serving.silicon_bounds import closed_loop_in_decode, ttft_in_completion_gaps

REF = Path(__file__).resolve().parents[1] / ".." / "shared" / "reference"


def _signed(pred: float, meas: float) -> float:
    return 100.0 * (pred - meas) / meas


def step_split(row: dict, configs: Path, evidence_for) -> str:
    """Step-time split of one decode-only iteration of the row's deployment at C
    running requests with context isl + osl/2."""
    from perfcast.serving.deploy import StepModelCache
    from perfcast.serving.step_cost import StepShape

    rules = load_rules()
    cfg, _ = row_config(row, ModelResolver(configs, rules), rules)
    providers, context = (), None
    if evidence_for:
        ev = evidence_for(row["system"], row["backend"], row.get("backend_version", ""))
        providers, context = ev.providers, (ev.context if ev.providers else None)
    from perfcast.evidence.contracts import CostQueryContext
    context = context or CostQueryContext(runtime=cfg.backend.name,
                                          runtime_revision=cfg.backend_version)
    step = StepModelCache().get(cfg.model, cfg.pool.plan, cfg.system, cfg.backend,
                                cfg.precision, providers, context, cfg.interpolate)
    n = cfg.concurrency // cfg.pool.plan.dp or 1
    shape = StepShape(n, cfg.isl + cfg.osl / 2)
    tokens, _ = step.busiest_rank(shape)
    padded = step.graph_padded(shape, tokens)
    body = step.body(padded or tokens)
    head = step.head(n)
    attn = step.attn_decode(n, shape.decode_context)
    ov = step.overheads
    launch = ov.kernel_launch_graph_s if padded else ov.kernel_launch_eager_s
    kern = (body + head + attn).kernels * launch
    host = ov.step_overhead_s + ov.per_request_overhead_s * n
    total = step.step_s(shape)
    pre = step.step_s(StepShape(0, 0.0, ((cfg.isl, 0),)))
    return (f"C={n} pad={padded} body {1e3 * body.kernel_s:.2f} head {1e3 * head.kernel_s:.2f} "
            f"attn {1e3 * attn.kernel_s:.2f} launch {1e3 * kern:.2f} host {1e3 * host:.2f} "
            f"= {1e3 * total:.2f} ms/step; prefill({cfg.isl}) {1e3 * pre:.1f} ms")


def _little(r) -> str:
    c, osl = r.concurrency, r.osl
    return (f"  in-decode {closed_loop_in_decode(c, osl, r.measured_ttft_ms, r.measured_tpot_ms):6.1f} "
            f"pred {closed_loop_in_decode(c, osl, r.pred_ttft_ms, r.pred_tpot_ms):6.1f}  "
            f"TTFT/gap {ttft_in_completion_gaps(c, osl, r.measured_ttft_ms, r.measured_tpot_ms):5.2f} "
            f"pred {ttft_in_completion_gaps(c, osl, r.pred_ttft_ms, r.pred_tpot_ms):5.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="?", default=str(REF / "silicon" / "h100_sxm.csv"))
    ap.add_argument("--evidence-root", default=None)
    ap.add_argument("--model-configs", default=str(REF / "model_configs"))
    ap.add_argument("--model", default="", help="substring of model_path")
    ap.add_argument("--backend", default="")
    ap.add_argument("--rows", action="store_true")
    ap.add_argument("--steps", action="store_true")
    ap.add_argument("--overhead", action="append", default=[],
                    help="BACKEND.FIELD=US or =true|false, e.g. trtllm.frontend_overhead=30000 (sweeps)")
    ap.add_argument("--quiet", action="store_true", help="only the per-model summary")
    ap.add_argument("--calibration", default="default",
                    help="revision whose fitted overheads --overhead changes (none: physics)")
    ap.add_argument("--little", action="store_true",
                    help="with --rows: requests in decode by Little's law and TTFT in units of "
                         "the mean time between completions, measured and predicted")
    args = ap.parse_args(argv)
    rows = [r for r in read_rows(Path(args.csv)) if r.get("mode") == "agg"
            and args.model in r["model_path"] and args.backend in r["backend"]]
    evidence_for = None
    if args.evidence_root:
        from perfcast.serving.evidence import evidence_loader
        evidence_for = evidence_loader(Path(args.evidence_root))
    t0 = time.perf_counter()
    from perfcast.calibrate.serving import serving_overheads
    from perfcast.calibrate.store import load_calibration
    revision = load_calibration(args.calibration)
    overheads = serving_overheads(revision.part("serving_overheads") if revision else None)
    for item in args.overhead:
        key, value = item.split("=")
        backend, fld = key.split(".")
        if value in ("true", "false"):
            overheads.setdefault(backend, {})[fld] = value == "true"
        else:
            overheads.setdefault(backend, {})[f"{fld}_s"] = float(value) * 1e-6
    from perfcast.cli.calibration_option import analytic_for
    results = validate_rows(rows, configs_dir=Path(args.model_configs), evidence_for=evidence_for,
                            overheads=overheads or None, analytic_for=analytic_for(revision))
    wall = time.perf_counter() - t0
    by_id = {r["id"]: r for r in rows}
    groups: dict[tuple, list] = collections.defaultdict(list)
    for res in results:
        if res.predicted:
            groups[(res.model.split("/")[-1], res.backend, res.isl, res.osl)].append(res)
    if not args.quiet:
        print(f"{'group':44s} {'n':>3s} {'TTFT mape':>9s} {'bias':>6s} {'TPOT mape':>9s} {'bias':>6s}")
    for key in ([] if args.quiet else sorted(groups)):
        rs = sorted(groups[key], key=lambda r: r.concurrency)
        t = np.array([_signed(r.pred_ttft_ms, r.measured_ttft_ms) for r in rs])
        p = np.array([_signed(r.pred_tpot_ms, r.measured_tpot_ms) for r in rs])
        label = f"{key[0][:22]} {key[1]} {key[2]}/{key[3]}"
        print(f"{label:44s} {len(rs):3d} {np.abs(t).mean():8.1f}% {t.mean():+6.1f} "
              f"{np.abs(p).mean():8.1f}% {p.mean():+6.1f}")
        if args.steps:
            mid = rs[len(rs) // 2]
            print("    " + step_split(by_id[mid.row_id], Path(args.model_configs), evidence_for))
        if args.rows:
            for r in rs:
                print(f"    C={r.concurrency:4d} v{r.backend_version:14s} "
                      f"TTFT {r.measured_ttft_ms:8.1f} pred {r.pred_ttft_ms:8.1f} "
                      f"({_signed(r.pred_ttft_ms, r.measured_ttft_ms):+6.1f}%)  "
                      f"TPOT {r.measured_tpot_ms:7.2f} pred {r.pred_tpot_ms:7.2f} "
                      f"({_signed(r.pred_tpot_ms, r.measured_tpot_ms):+6.1f}%)"
                      + (_little(r) if args.little else ""))
    for g in summarize(results):
        if g["ttft_mape"] is None:
            continue
        print(f"{g['model'][:34]:34s} {g['backend']:7s} rows {g['rows']:4d} "
              f"cov {100 * g['coverage']:5.1f}%  TTFT MAPE {100 * g['ttft_mape']:5.1f}%  "
              f"TPOT MAPE {100 * g['tpot_mape']:5.1f}%")
    print(f"== {len(rows)} rows in {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
