"""Accuracy of perfcast's training-step estimate against published measurements.

    python benchmarks/training_accuracy.py [--data FILE] [--group validation|held_out|all]
        [--rows ID ...] [--json FILE] [--sweep-virtual-pipeline]

Each row of benchmarks/data/training_published.yaml (cited there row by row: Narayanan et
al. 2021 Table 1, Llama 3 Table 4, and held-out lists) is estimated with
`perfcast.training.estimate_training`: the catalog device, physics (roofline with the
catalog's default efficiencies, analytic collectives, the plan layer's pipeline schedule)
and nothing fitted to these rows. The predicted step time is converted into the paper's own
FLOP convention (perfcast.training.published) and compared with the published TFLOP/s per
GPU; the error of per-GPU throughput equals that of step time.

Where a source is silent the row's `assumed` values are used, else the estimator's
defaults (V 1, micro-batch 1, SP off, recompute none, ZeRO 0); the table marks such rows.
`--override FIELD=VALUE` replaces a layout field on the selected rows (an analysis, e.g.
`--rows llama3-405b-8k-8192gpu --override sequence_parallel=true`).
`--sweep-virtual-pipeline` re-runs the rows whose V is assumed with V = 1, 2, 4, 8 (an
analysis of that assumption, not a choice among them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "training_published.yaml"
TARGET_MAE = 0.10

# estimator defaults for fields a source leaves out and the row does not assume
DEFAULTS = {"virtual_pipeline": 1, "micro_batch": 1, "recompute": "none",
            "sequence_parallel": False, "zero_stage": 0, "overlap_grad_reduce": True,
            "attention_kernel": "flash", "tp_comm_overlap": False,
            "overlap_param_gather": False,  # Megatron-LM's default (arguments.py)
            "account_for_embedding_in_pipeline_split": False,
            "account_for_loss_in_pipeline_split": False,
            "gradient_accumulation_fusion": True}
# fields that only apply to some layouts: not an assumption where they cannot matter
# (the pipeline-split flags: off is what every Megatron-LM run without them did, layers
# cut evenly; the flags date from ef490839e8 of 2025-02, default off: not an assumption)
APPLIES = {"overlap_param_gather": lambda values: values["zero_stage"] in (1, 2),
           "account_for_embedding_in_pipeline_split": lambda values: False,
           "account_for_loss_in_pipeline_split": lambda values: False,
           "gradient_accumulation_fusion": lambda values: False}
# what answers the cost queries:
#   physics     the analytic providers alone (roofline with the catalog's default
#               efficiencies, alpha-beta collectives): `perfcast train --calibration none`
#   calibrated  + the shipped calibration revision's analytic curves (fitted on H100/H200
#               kernel tables): what `perfcast train` uses by default; on a device the
#               shipped revision has no curves for (A100), the revisions of
#               `--device-revision` in order, each answering what the one before leaves
#               (a size outside its fitted range): benchmarks/efficiency_a100.py (a GEMM
#               curve fitted on Vidur's measured A100 GEMMs, held out by weight shape),
#               then benchmarks/efficiency_transfer.py (the H100/H200 curve scored on the
#               same records; on their largest quarter by FLOPs closer than the roofline)
#   evidence    + the public measured H100/H200 kernel tables (AIConfigurator, vLLM 0.24.0
#               collection: cuBLAS bf16 GEMMs through torch.nn.functional.linear, FA3
#               attention forward, NCCL collectives) asked first; A100 has none
MODES = ("physics", "calibrated", "evidence")
EVIDENCE_ROOT = ROOT / ".." / "shared" / "reference" / "aiconfigurator"
EVIDENCE_RUNTIME = ("vllm", "0.24.0")
DEVICE_REVISIONS = (ROOT / "benchmarks" / "data" / "calibration_a100_vidur.json",
                    ROOT / "benchmarks" / "data" / "calibration_a100_transfer.json")


def model_spec(run):
    """The row's shape as a ModelSpec: its HuggingFace config (checked against the shape)
    or a GPT-2-style config built from the shape."""
    from perfcast.core.errors import ConfigError
    from perfcast.workload import load_model_spec, model_spec_from_config

    m = run.model
    if m.hf_id:
        spec = load_model_spec(m.hf_id)
        got = (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads,
               spec.intermediate_size, spec.vocab_size)
        want = (m.layers, m.hidden, m.heads, m.num_kv_heads, m.ffn_hidden, m.vocab)
        if got != want:
            raise ConfigError(f"{m.hf_id} has (layers, hidden, heads, kv, ffn, vocab) {got}, "
                              f"the paper {want}", field=f"{run.id}.model.hf_id")
        cfg = dict(spec.raw)
        name = m.hf_id
    else:
        cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
               "n_embd": m.hidden, "n_head": m.heads, "n_layer": m.layers,
               "n_inner": m.ffn_hidden, "n_positions": m.seq_length, "vocab_size": m.vocab,
               "activation_function": "gelu",
               "torch_dtype": "float16" if run.precision == "fp16" else "bfloat16",
               "tie_word_embeddings": m.tied, "resid_pdrop": m.dropout,
               "embd_pdrop": m.dropout, "attn_pdrop": m.dropout}
        name = f"{run.id} (GPT, from the paper's shape)"
    return model_spec_from_config(cfg, name=name, source=f"{DATA.name}:{run.id}")


def layout_for(run, *, virtual_pipeline: int | None = None):
    """(TrainingLayout, every field's value, {field: value} of what was not in the
    source)."""
    from perfcast.training import TrainingLayout

    lay = run.layout
    values, assumed = {}, {}
    for key in DEFAULTS:
        value = getattr(lay, key)
        if value is None:
            value = run.assumed.get(key, DEFAULTS[key])
            if APPLIES.get(key, lambda _: True)(values):
                assumed[key] = value
        values[key] = value
    if virtual_pipeline is not None:
        values["virtual_pipeline"] = virtual_pipeline
        assumed["virtual_pipeline"] = virtual_pipeline
    layout = TrainingLayout(
        tp=lay.tp, pp=lay.pp, dp=lay.dp, cp=lay.cp, virtual_pipeline=values["virtual_pipeline"],
        sequence_parallel=values["sequence_parallel"], recompute=values["recompute"],
        zero_stage=values["zero_stage"],
        account_for_embedding_in_pipeline_split=values[
            "account_for_embedding_in_pipeline_split"],
        account_for_loss_in_pipeline_split=values["account_for_loss_in_pipeline_split"])
    return layout, values, assumed


_CHAINS: dict = {}


def provider_chain(mode: str, device: str, evidence_root: Path,
                   device_revisions: tuple[Path, ...] = DEVICE_REVISIONS):
    """(providers before the analytic ones, query context, evidence note) of a mode."""
    from dataclasses import replace

    from perfcast.cli.calibration_option import load as load_calibration
    from perfcast.cli.estimate import calibrated_for
    from perfcast.core.frozen import FrozenDict
    from perfcast.evidence.contracts import CostQueryContext

    key = (mode, device, tuple(device_revisions))
    if key in _CHAINS:
        return _CHAINS[key]
    providers, ctx, note = [], CostQueryContext(), ""
    if mode in ("calibrated", "evidence"):
        providers = list(calibrated_for(device, load_calibration("default")))
        # curves fitted on this device or declared for it replace the shipped ones,
        # which would apply to it without records of it
        if all((getattr(p, "transfer", None) or {}).get("undeclared") for p in providers):
            used, specific = [], []
            for path in device_revisions:
                rev = load_calibration(str(path))
                more = [p for p in calibrated_for(device, rev)
                        if not (p.transfer or {}).get("undeclared")]
                specific += more
                if more:
                    used.append(f"{path.name} ({rev.short})")
            if used:
                providers = specific
                note = f"calibration {', then '.join(used)} for {device}"
    if mode == "evidence":
        folder = evidence_root / device
        if folder.is_dir():
            from perfcast.serving.evidence import evidence_loader

            ev = evidence_loader(evidence_root)(device, *EVIDENCE_RUNTIME)
            ctx = ev.context or CostQueryContext()
            # training runs NCCL for every collective (not vLLM's custom all-reduce)
            impl = dict(ctx.implementations)
            dims = dict(ctx.operation_dimensions)
            for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
                for k in [k for k in impl if k == op or k.startswith(op + "@")]:
                    impl[k] = "NCCL"
                if op in dims:
                    dims[op] = FrozenDict({k: v for k, v in dims[op].items() if k != "backend"})
            ctx = replace(ctx, implementations=FrozenDict(impl),
                          operation_dimensions=FrozenDict(dims))
            providers = [*ev.providers, *providers]
            note = f"AIConfigurator {device} tables, {EVIDENCE_RUNTIME[0]} {EVIDENCE_RUNTIME[1]}"
        else:
            note = "; ".join(x for x in (f"no kernel evidence for {device}", note) if x)
    _CHAINS[key] = (providers, ctx, note)
    return _CHAINS[key]


def answered_by(res) -> dict[str, float]:
    """Share of one microbatch's compute time per provider (the first chunk)."""
    totals: dict[str, float] = {}
    cc = res.costs[0]
    for g in (cc.forward, cc.backward):
        for ct in g.tasks:
            est = ct.resolution.estimate
            name = est.provider
            if est.method.value == "calibrated":     # which revision's curve
                name += f"@{str(est.source_revision).split(':', 1)[-1][:8]}"
            totals[name] = totals.get(name, 0.0) + ct.total_latency_s
    whole = sum(totals.values()) or 1.0
    return {k: v / whole for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def estimate_row(run, *, mode: str = "evidence", evidence_root: Path = EVIDENCE_ROOT,
                 virtual_pipeline: int | None = None,
                 device_revisions: tuple[Path, ...] = DEVICE_REVISIONS) -> dict:
    from perfcast.core.errors import PerfcastError
    from perfcast.evidence.factory import build_resolver
    from perfcast.hardware import load_system
    from perfcast.training import TrainingRequest, estimate_training
    from perfcast.training.search import layout_label
    from perfcast.training.published import (
        implied_step_time_s,
        predicted_tflops_per_gpu,
        published_tflops_per_gpu,
    )

    out = {"id": run.id, "group": run.group, "source": dict(run.source), "row": run.row,
           "verified": run.verified, "gpus": run.gpus, "device": run.device,
           "flop_convention": run.flop_convention,
           "published_tflops_per_gpu": published_tflops_per_gpu(run),
           "published_step_time_s": implied_step_time_s(run),
           "published_mfu": run.published.get("mfu"), "mode": mode}
    try:
        layout, values, assumed = layout_for(run, virtual_pipeline=virtual_pipeline)
        micro = values["micro_batch"]
        out["layout"], out["assumed"] = layout_label(layout, micro), assumed
        for key in ("attention_kernel", "overlap_grad_reduce", "tp_comm_overlap",
                    "overlap_param_gather", "gradient_accumulation_fusion"):
            out[key] = values[key]
        providers, ctx, out["evidence"] = provider_chain(mode, run.device, evidence_root,
                                                         device_revisions)
        system = load_system(run.device)
        req = TrainingRequest(model=model_spec(run), device=system, layout=layout,
                              global_batch_size=run.layout.global_batch,
                              micro_batch_size=micro, seq_length=run.model.seq_length,
                              dtype=run.precision, context=ctx,
                              attention_kernel=values["attention_kernel"],
                              overlap_grad_reduce=values["overlap_grad_reduce"],
                              tp_comm_overlap=values["tp_comm_overlap"],
                              overlap_param_gather=values["overlap_param_gather"]
                              and values["zero_stage"] in (1, 2),
                              gradient_accumulation_fusion=values[
                                  "gradient_accumulation_fusion"])
        t0 = time.perf_counter()
        res = estimate_training(req, build_resolver(system, providers))
        out["wall_s"] = time.perf_counter() - t0
    except PerfcastError as exc:
        out["error"] = str(exc)
        return out
    pred = predicted_tflops_per_gpu(run, res.step_time_s)
    out.update({
        "predicted_step_time_s": res.step_time_s,
        "predicted_tflops_per_gpu": pred,
        "error": None,
        "rel_error": pred / out["published_tflops_per_gpu"] - 1,
        "perfcast_mfu": res.mfu, "perfcast_hfu": res.hfu, "fits": bool(res.fits),
        "memory_gib": {k: v / 2**30 for k, v in res.memory_bytes.items()},
        "breakdown_s": dict(res.breakdown_s), "answered_by": answered_by(res)})
    return out


def summary(results: list[dict]) -> dict:
    out = {}
    for group in ("validation", "held_out"):
        rows = [r for r in results if r["group"] == group]
        scored = [r for r in rows if r.get("rel_error") is not None]
        by_source: dict[str, list[float]] = {}
        for r in scored:
            key = r["source"].get("paper") or r["source"].get("repository")
            by_source.setdefault(key, []).append(abs(r["rel_error"]))
        out[group] = {
            "rows": len(rows), "predicted": len(scored),
            "mae": (sum(abs(r["rel_error"]) for r in scored) / len(scored)) if scored else None,
            "max_abs_error": max((abs(r["rel_error"]) for r in scored), default=None),
            "mae_by_source": {k: sum(v) / len(v) for k, v in by_source.items()},
            "not_predicted": [{"id": r["id"], "error": r["error"]} for r in rows
                              if r.get("rel_error") is None]}
    out["target_mae"] = TARGET_MAE
    return out


def print_table(results: dict[str, list[dict]], group: str, headline: str) -> None:
    rows = [r for r in results[headline] if r["group"] == group]
    if not rows:
        return
    others = [m for m in results if m != headline]
    by_id = {m: {r["id"]: r for r in results[m]} for m in others}
    print(f"\n{group} rows: published TFLOP/s per GPU in each paper's convention, the "
          f"prediction ({headline}) in the same convention, error = predicted / published - 1")
    head = (f"{'row':<28} {'GPUs':>5} {'layout':<32} {'pub':>6} {'pred':>6} {'error':>7} "
            + "".join(f"{m[:9]:>10}" for m in others)
            + f" {'pub s':>7} {'pred s':>7} {'fits':>4} {'bubble':>6} {'DPexp':>5} {'TPexp':>5}")
    print(head)
    print("-" * len(head))
    for r in rows:
        lay = r.get("layout", "-") + ("*" if r.get("assumed") else "")
        if r.get("rel_error") is None:
            print(f"{r['id']:<28} {r['gpus']:>5} {lay:<32} "
                  f"{r['published_tflops_per_gpu']:>6.1f}   not predicted: {r.get('error')}")
            continue
        b = r["breakdown_s"]
        alt = "".join(f"{_pct(by_id[m].get(r['id'], {}).get('rel_error')):>10}" for m in others)
        print(f"{r['id']:<28} {r['gpus']:>5} {lay:<32} {r['published_tflops_per_gpu']:>6.1f} "
              f"{r['predicted_tflops_per_gpu']:>6.1f} {_pct(r['rel_error']):>7}{alt} "
              f"{r['published_step_time_s']:>7.2f} {r['predicted_step_time_s']:>7.2f} "
              f"{'yes' if r['fits'] else 'NO':>4} {b.get('pp_bubble', 0):>6.2f} "
              f"{b.get('dp_comm_exposed', 0):>5.2f} {b.get('tp_comm_exposed', 0):>5.2f}")
    print("  * a field the source does not give: the row's `assumed` value or the estimator's "
          "default; bubble, DPexp, TPexp: seconds of the step on the rank that ends last")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def print_summary(results: dict[str, list[dict]]) -> dict:
    out = {}
    print()
    for mode, rows in results.items():
        s = out[mode] = summary(rows)
        for group in ("validation", "held_out"):
            g = s[group]
            if not g["rows"]:
                continue
            mae = "-" if g["mae"] is None else f"{100 * g['mae']:.1f}%"
            print(f"{mode:>10} {group:<10}: {g['predicted']}/{g['rows']} rows predicted, "
                  f"MAE {mae} (target <= {100 * TARGET_MAE:.0f}%)")
            for src, v in g["mae_by_source"].items():
                print(f"{'':>24}{100 * v:5.1f}%  {src}")
    return out


def convention_sensitivity(data, results: list[dict]) -> list[dict]:
    """Rows in the PaLM convention: the error if the paper's FLOP count halved the
    attention term for the causal mask (Meta does not print its count)."""
    from perfcast.training.published import palm_model_causal_flops, palm_model_flops

    runs = {r.id: r for r in data.runs}
    out = []
    for r in results:
        run = runs[r["id"]]
        if run.flop_convention != "palm_model" or r.get("rel_error") is None:
            continue
        ratio = (palm_model_causal_flops(run.model, run.layout.global_batch)
                 / palm_model_flops(run.model, run.layout.global_batch))
        out.append({"id": r["id"], "rel_error": r["rel_error"],
                    "rel_error_causal_convention": (1 + r["rel_error"]) * ratio - 1,
                    "flops_ratio": ratio})
    return out


def override(run, items: list[str]):
    """The row with layout fields replaced (`--override FIELD=VALUE`), for analysis."""
    from dataclasses import fields, replace

    if not items:
        return run
    names = {f.name for f in fields(run.layout)}
    changes = {}
    for item in items:
        key, _, text = item.partition("=")
        if key not in names or not text:
            raise SystemExit(f"--override {item!r}: expected FIELD=VALUE with FIELD one of "
                             f"{sorted(names)}")
        low = text.lower()
        changes[key] = (low == "true") if low in ("true", "false") else (
            int(text) if text.isdigit() else text)
    return replace(run, layout=replace(run.layout, **changes))


def code_version() -> dict:
    """The commit the benchmark ran at and whether src/ differed from it."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "src"],
                               check=True, capture_output=True, text=True).stdout.split("\n")
        return {"commit": head, "src_changes": len([x for x in dirty if x.strip()])}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "src_changes": None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--group", choices=("validation", "held_out", "all"), default="all")
    ap.add_argument("--rows", nargs="*", help="only these row ids")
    ap.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES),
                    help="what answers the cost queries (the last is the headline)")
    ap.add_argument("--evidence-root", type=Path, default=EVIDENCE_ROOT,
                    help="AIConfigurator-layout folder of measured kernel tables")
    ap.add_argument("--override", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="analysis: set a layout field on every selected row (e.g. "
                         "sequence_parallel=true, tp_comm_overlap=false, virtual_pipeline=4)")
    ap.add_argument("--device-revision", "--transfer-revision", dest="device_revision",
                    nargs="+", default=[str(p) for p in DEVICE_REVISIONS], metavar="FILE",
                    help="calibration revisions, in order, for devices the shipped one has "
                         "no curves for (`none`: those devices run on the catalog roofline)")
    ap.add_argument("--json", type=Path, help="write the per-row results and summary")
    ap.add_argument("--sweep-virtual-pipeline", action="store_true",
                    help="re-run the rows whose V is assumed with V = 1, 2, 4, 8")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from perfcast.training.published import load_published

    data = load_published(args.data)
    runs = [override(r, args.override) for r in data.runs
            if args.group in ("all", r.group) and (not args.rows or r.id in args.rows)]
    t0 = time.perf_counter()
    device_rev = () if args.device_revision == ["none"] else \
        tuple(Path(p) for p in args.device_revision)
    results = {m: [estimate_row(r, mode=m, evidence_root=args.evidence_root,
                                device_revisions=device_rev) for r in runs]
               for m in args.modes}
    wall = time.perf_counter() - t0
    headline = args.modes[-1]
    for group in ("validation", "held_out"):
        print_table(results, group, headline)
    notes = sorted({r["evidence"] for rows in results.values() for r in rows
                    if r.get("evidence")})
    for n in notes:
        print(f"  evidence: {n}")
    summaries = print_summary(results)
    sens = convention_sensitivity(data, results[headline])
    if sens:
        print("\nFLOP-convention sensitivity (PaLM formula with the attention term halved "
              "for the causal mask):")
        for row in sens:
            print(f"  {row['id']:<30} error {_pct(row['rel_error'])} -> "
                  f"{_pct(row['rel_error_causal_convention'])} (F x {row['flops_ratio']:.3f})")
    version = code_version()
    print(f"wall time {wall:.1f} s for {sum(len(v) for v in results.values())} estimates; "
          f"code {version['commit'] or 'not a git checkout'}"
          + (f" with {version['src_changes']} uncommitted change(s) under src/"
             if version["src_changes"] else ""))
    sweep = []
    if args.sweep_virtual_pipeline:
        for r in runs:
            if r.layout.virtual_pipeline is not None or r.layout.pp == 1:
                continue
            for v in (1, 2, 4, 8):
                sweep.append({"v": v, **estimate_row(r, mode=headline,
                                                     evidence_root=args.evidence_root,
                                                     virtual_pipeline=v,
                                                     device_revisions=device_rev)})
        print(f"\nvirtual-pipeline sensitivity ({headline}; rows whose V the source does not "
              "give)")
        for row in sweep:
            print(f"  {row['id']:<30} V={row['v']}  pred "
                  f"{row.get('predicted_tflops_per_gpu', float('nan')):7.1f} TF/s  error "
                  f"{_pct(row.get('rel_error'))}  bubble "
                  f"{row.get('breakdown_s', {}).get('pp_bubble', float('nan')):.2f} s"
                  + (f"  ({row['error']})" if row.get("rel_error") is None else ""))
    if args.json:
        args.json.write_text(json.dumps({
            "data": str(args.data), "code": version, "headline_mode": headline,
            "rows": results,
            "summary": summaries, "convention_sensitivity": sens,
            "virtual_pipeline_sweep": sweep, "wall_s": wall}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
