"""Support matrix: which model configs perfcast builds, with what, and why not.

Generated from code so it cannot drift: every config is loaded and built (one decode
step on one device); a config whose `model_type` has no family gets the precise missing
feature from `UNSUPPORTED_FEATURES`, any other failure its error message.

    python -m perfcast.workload.support_matrix [--configs DIR] [--output FILE] [--check]

writes docs/support-matrix.md (default configs: `<repo>/../shared/reference/model_configs`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from perfcast.core.errors import PerfcastError
from perfcast.workload.build import build_task_graph
from perfcast.workload.families import FAMILIES
from perfcast.workload.model_spec import QUANT_SUFFIX, builtin_models, load_model_spec
from perfcast.workload.plan_spec import Batch, ParallelPlan

# model_type (after unwrapping `text_config`) -> what perfcast does not model (data).
UNSUPPORTED_FEATURES: dict[str, str] = {
    "minimax_m3": "MiniMax sparse attention (block top-k selection with index heads, "
                  "`sparse_attention_config`) and the clamped `swigluoai` activation",
    "deepseek_v4": "DeepSeek-V4 attention (compressed sparse / heavily compressed attention, "
                   "`compress_ratios`; grouped low-rank output `o_lora_rank`/`o_groups`), "
                   "hyper-connections (`hc_mult`) and hash-routed layers (`num_hash_layers`)",
    "deepseek_ref": "DeepSeek-V4 reference layout (same features as deepseek_v4: "
                    "`compress_ratios`, `o_lora_rank`, `hc_mult`)",
    "gemma4_text": "Gemma-4: GELU-tanh MLP, K=V shared attention (`attention_k_eq_v`), "
                   "distinct global head dim (`global_head_dim`), per-layer input embeddings",
    "kimi_linear": "Kimi Delta Attention layers (`linear_attn_config.kda_layers`), SiTU "
                   "activation and latent MoE",
    "nemotron-nas": "heterogeneous per-layer blocks (`block_configs`: skipped attention or "
                    "FFN, per-layer FFN widths)",
    "nemotron_h": "Mamba-2 SSM layers and ReLU^2 MLPs (`hybrid_override_pattern`)",
    "step3p7": "Step-3.7 attention and router details beyond config.json are unverified "
               "(router bias/scaling `moe_router_scaling_factor`, 3 MTP modules)",
}

# what a task's operation says about the layer (first match per feature, in order)
FEATURE_OPERATIONS: tuple[tuple[str, str], ...] = (
    ("gdn_decode", "gated DeltaNet"), ("gdn_prefill", "gated DeltaNet"),
    ("mla_sparse_attention", "DSA (sparse MLA)"), ("mla_attention", "MLA"),
    ("attention", "GQA"), ("moe", "MoE"),
)


@dataclass(frozen=True)
class SupportRow:
    config: str
    model_type: str
    supported: bool
    features: str = ""
    weight_dtype: str = ""
    params_b: float = 0.0
    active_b: float = 0.0
    reason: str = ""


def _features(graph) -> str:
    found: list[str] = []
    for op, name in FEATURE_OPERATIONS:
        if name not in found and any(t.operation == op for t in graph.tasks):
            found.append(name)
    if any(t.work.axes.get("window") for t in graph.tasks if t.operation == "attention"):
        found.append("sliding window")
    if any(t.group == "attn.output_gate" for t in graph.tasks):
        found.append("gated attention output")
    return ", ".join(found)


def _local(message: str, path: Path) -> str:
    """An error message without the machine-specific folder of the config."""
    return message.replace(str(path.parent) + "/", "")


def support_row(path: Path, name: str = "") -> SupportRow:
    """Load and build one config (decode, 1 request, 128 cached tokens, one device)."""
    label = name or path.name
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return SupportRow(label, "", False, reason=f"unreadable config: {exc}")
    vision = isinstance(raw, dict) and "vision_config" in raw
    text = raw.get("text_config") if isinstance(raw, dict) else None
    declared = str((text if isinstance(text, dict) and "hidden_size" not in raw else raw
                    ).get("model_type", ""))
    if declared in UNSUPPORTED_FEATURES:
        return SupportRow(label, declared, False, reason=UNSUPPORTED_FEATURES[declared])
    try:
        spec = load_model_spec(path)
    except PerfcastError as exc:
        return SupportRow(label, declared, False, reason=_local(str(exc), path))
    mt = spec.model_type
    if mt not in FAMILIES:
        reason = UNSUPPORTED_FEATURES.get(mt, f"model_type {mt!r} has no family")
        return SupportRow(label, mt, False, reason=reason)
    try:
        g = build_task_graph(spec, ParallelPlan(), Batch.decode(1, 128))
    except PerfcastError as exc:
        return SupportRow(label, mt, False, reason=_local(str(exc), path))
    note = "language model only (vision encoder not modelled)" if vision else ""
    return SupportRow(label, mt, True, features=_features(g),
                      weight_dtype=g.precision.weight,
                      params_b=g.param_count() / 1e9, active_b=g.param_count(active=True) / 1e9,
                      reason=note)


def config_rows(folder: Path) -> list[SupportRow]:
    """Every `*_config.json` in `folder`, plus quantisation configs without a model config."""
    rows = []
    quant_suffix = "_hf_quant_config.json"
    for p in sorted(folder.glob("*.json")):
        if p.name.endswith(quant_suffix):
            base = p.with_name(p.name[: -len(quant_suffix)] + "_config.json")
            if not base.is_file():
                rows.append(SupportRow(p.name, "", False,
                                       reason=f"only an hf_quant_config.json; no {base.name}"))
            continue
        rows.append(support_row(p))
    return rows


def builtin_rows() -> list[SupportRow]:
    from perfcast.workload.model_spec import _catalog_dir

    rows = []
    for name in builtin_models():
        path = _catalog_dir() / (name.replace("/", "--", 1) + ".json")
        assert not path.name.endswith(QUANT_SUFFIX)
        rows.append(support_row(path, name))
    return rows


def _table(rows: list[SupportRow]) -> list[str]:
    out = ["| config | model_type | supported | features | weights | params (B) | "
           "active (B) | reason / note |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        nums = (f"{r.params_b:.2f} | {r.active_b:.2f}" if r.supported else " | ")
        out.append(f"| {r.config} | {r.model_type} | {'yes' if r.supported else 'no'} | "
                   f"{r.features} | {r.weight_dtype} | {nums} | {r.reason.replace('|', '/')} |")
    return out


def render(config_folder: Path | None) -> str:
    fam: dict[str, list[str]] = {}
    for mt, builder in FAMILIES.items():   # builder: "module.function"
        fam.setdefault(builder, []).append(mt)
    lines = ["# Support matrix", "",
             "Generated by `python -m perfcast.workload.support_matrix` from the family table "
             "and by building every config (one decode step, one device, the checkpoint's "
             "precision); do not edit by hand. `active` counts the input embedding (Qwen's "
             "convention); MTP modules are not counted.", "",
             "## Families", "", "| builder | model_type |", "|---|---|"]
    for builder, types in fam.items():
        lines.append(f"| `{builder}` | {', '.join(f'`{t}`' for t in types)} |")
    lines += ["", "## Built-in catalog (`perfcast models`)", ""] + _table(builtin_rows())
    if config_folder is not None:
        rows = config_rows(config_folder)
        n_ok = sum(r.supported for r in rows)
        lines += ["", "## Reference configs (`../shared/reference/model_configs`)", "",
                  f"{n_ok} of {len(rows)} supported.", ""] + _table(rows)
    return "\n".join(lines) + "\n"


def default_config_folder() -> Path:
    return Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "model_configs"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=Path, default=default_config_folder())
    ap.add_argument("--output", type=Path,
                    default=Path(__file__).resolve().parents[3] / "docs" / "support-matrix.md")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when the output file differs from what would be written")
    args = ap.parse_args(argv)
    if not args.configs.is_dir():
        print(f"error: {args.configs}: no such folder (--configs)", file=sys.stderr)
        return 2
    text = render(args.configs)
    if args.check:
        same = args.output.is_file() and args.output.read_text(encoding="utf-8") == text
        print("up to date" if same else f"{args.output} is stale; rerun without --check")
        return 0 if same else 1
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
