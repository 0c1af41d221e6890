"""The H100 DeepSeek TRT-LLM disagg rows with decode slots from their InferenceX recipes.

    python benchmarks/disagg_decode_slots.py [FILE] [--evidence-root DIR]

A diagnosis, not a validation rule. The public H100 file's disagg TRT-LLM 0.8.1.post3
rows with worker counts (one prefill worker of 16 GPUs with attention DP, 2-3 decode
workers of TP 16) measure TTFT of 5-14 s at 6-154 clients. Their deployment matches
the InferenceX search space `dsr1-fp8-h100-dynamo-trt` (`.github/configs/nvidia-master.yaml`
at 66d6a351a, 2026-02-07: image tensorrtllm-runtime:0.8.1.post3, model
DeepSeek-R1-0528, which has DeepSeek-V3's architecture), whose srt-slurm recipes set the
decode workers' `max_batch_size` below C / decode workers (C = 6 with 1 slot on each of
3 workers, ...). Under Dynamo the client's tokens stream from the decode worker, so a
request waits for a slot before its first token.

For each such row this prints the measured TTFT/TPOT, the prediction of `validate
silicon` (the row as it is: no slot limit but the engine's) and the prediction with the
recipe's slots (`ServeConfig.decode_max_running_requests`). The rows do not record the
slots and are labelled DeepSeek-V3, so `validate silicon` does not apply them.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "reference"

# (isl, osl, C) -> (decode workers, decode max_batch_size, recipe) of the STP entries of
# dsr1-fp8-h100-dynamo-trt at 66d6a351a; every recipe: 1 prefill worker TP 16, EP 16,
# attention DP; decode TP 16, EP 16, no attention DP
RECIPES = {
    (1024, 1024, 6): (3, 1, "1k1k/stp/ctx1_gen3_tep16_batch1_eplb0_mtp0.yaml"),
    (1024, 1024, 9): (3, 2, "1k1k/stp/ctx1_gen3_tep16_batch2_eplb0_mtp0.yaml"),
    (1024, 1024, 30): (3, 8, "1k1k/stp/ctx1_gen3_tep16_batch8_eplb0_mtp0.yaml"),
    (1024, 1024, 60): (3, 16, "1k1k/stp/ctx1_gen3_tep16_batch16_eplb0_mtp0.yaml"),
    (8192, 1024, 6): (3, 1, "8k1k/stp/ctx1_gen3_tep16_batch1_eplb0_mtp0.yaml"),
    (8192, 1024, 9): (3, 2, "8k1k/stp/ctx1_gen3_tep16_batch2_eplb0_mtp0.yaml"),
    (8192, 1024, 30): (3, 8, "8k1k/stp/ctx1_gen3_tep16_batch8_eplb0_mtp0.yaml"),
    (8192, 1024, 154): (2, 64, "8k1k/stp/ctx1_gen2_tep16_batch64_eplb0_mtp0.yaml"),
}


def matching(row: dict) -> tuple | None:
    """The recipe of a row whose deployment is one of the search space's, or None."""
    def num(k):
        return int(float(row.get(k) or 0))
    if (row["system"].strip(), row["backend"].strip(), row["backend_version"].strip(),
            row["mode"].strip()) != ("h100_sxm", "trtllm", "0.8.1.post3", "disagg"):
        return None
    if (num("prefill_num_workers"), num("prefill_attention_dp_size"), num("prefill_moe_ep_size"),
            num("decode_tp_size"), num("decode_moe_ep_size"), num("decode_attention_dp_size")) \
            != (1, 16, 16, 16, 16, 1):
        return None
    c = num("decode_batch_size") * num("decode_num_workers")
    recipe = RECIPES.get((num("isl"), num("osl"), c))
    return recipe if recipe and recipe[0] == num("decode_num_workers") else None


def main() -> None:
    from perfcast.calibrate.store import load_calibration
    from perfcast.cli.calibration_option import all_overheads, analytic_for
    from perfcast.serving.deploy import run_serving
    from perfcast.serving.evidence import evidence_loader
    from perfcast.serving.silicon import ModelResolver, load_rules, read_rows, row_config

    ap = argparse.ArgumentParser()
    ap.add_argument("file", nargs="?", default=str(SHARED / "silicon" / "h100_sxm.csv"))
    ap.add_argument("--evidence-root", default=str(SHARED / "aiconfigurator"))
    args = ap.parse_args()
    rules = load_rules()
    models = ModelResolver(None, rules)
    revision = load_calibration("default")
    evidence = evidence_loader(Path(args.evidence_root))
    apes = {"row": [], "slots": []}
    print(f"{'isl':>5} {'C':>4} {'slots':>5} | {'TTFT meas':>9} {'row':>7} {'slots':>7} | "
          f"{'TPOT meas':>9} {'row':>6} {'slots':>6} | recipe")
    for row in read_rows(Path(args.file)):
        recipe = matching(row)
        if recipe is None:
            continue
        cfg, _ = row_config(row, models, rules, all_overheads(revision))
        ev = evidence(row["system"], row["backend"], row["backend_version"])
        providers = (*ev.providers, *analytic_for(revision)(row["system"].strip()))
        context = ev.context if ev.providers else None
        out = {}
        for name, c in (("row", cfg), ("slots", replace(cfg, decode_max_running_requests=recipe[1]))):
            m = run_serving(c, evidence=providers, evidence_context=context,
                            itl_summary=False).metrics
            out[name] = (m.ttft_ms["mean"], m.tpot_ms["mean"])
        ttft, tpot = float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])
        for name in apes:
            apes[name].append((abs(out[name][0] / ttft - 1), abs(out[name][1] / tpot - 1)))
        print(f"{cfg.isl:5d} {cfg.concurrency:4d} {recipe[1]:5d} | {ttft:9.0f} "
              f"{out['row'][0]:7.0f} {out['slots'][0]:7.0f} | {tpot:9.1f} {out['row'][1]:6.1f} "
              f"{out['slots'][1]:6.1f} | {recipe[2]}")
    for name, vals in apes.items():
        if vals:
            print(f"{name:>5}: {len(vals)} rows, TTFT MAPE {100 * sum(v[0] for v in vals) / len(vals):.1f}%, "
                  f"TPOT MAPE {100 * sum(v[1] for v in vals) / len(vals):.1f}%")


if __name__ == "__main__":
    main()
