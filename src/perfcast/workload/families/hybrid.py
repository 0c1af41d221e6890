"""Hybrid linear-attention decoders: gated DeltaNet layers interleaved with full
(softmax) attention layers (Qwen3-Next, Qwen3.5 dense and MoE).

Which layers are linear comes from `layer_types` (`linear_attention` / `full_attention`)
or, without it, `full_attention_interval` (layer i is full when (i + 1) % interval == 0).
Full-attention layers are the plain GQA block (`attention.gqa_attention`) with the
architecture's traits (per-head q/k norm, sigmoid output gate); FFNs follow the MoE
layout fields (`mlp_only_layers`, `decoder_sparse_step`) or are dense.
"""

from __future__ import annotations

from dataclasses import replace

from perfcast.core.errors import ConfigError, UnsupportedModelError
from perfcast.workload.families.attention import gqa_attention
from perfcast.workload.families.decoder import build_layers, mtp_modules
from perfcast.workload.families.ffn import dense_mlp, moe_ffn
from perfcast.workload.families.gated_deltanet import gated_deltanet
from perfcast.workload.families.traits import (
    LayerKind,
    MoeSpec,
    layer_kinds,
    layer_runs,
    traits_for,
)
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.model_spec import ModelSpec

# `layer_types` entry -> token mixer of that layer
HYBRID_LAYER_TYPES = {"linear_attention": "linear", "full_attention": "attention"}


def hybrid_mixers(model: ModelSpec) -> list[str]:
    """Token mixer of every layer (plus the MTP layers, which are full attention)."""
    n = model.num_layers
    types = model.raw.get("layer_types")
    if types:
        if len(types) < n:
            raise ConfigError(f"lists {len(types)} layers", source=model.source,
                              field="layer_types", expected=f"one entry per layer ({n})")
        out = []
        for i, kind in enumerate(types[:n]):
            if kind not in HYBRID_LAYER_TYPES:
                raise UnsupportedModelError(
                    f"layer {i} has type {kind!r}", source=model.source, field="layer_types",
                    expected=" or ".join(HYBRID_LAYER_TYPES))
            out.append(HYBRID_LAYER_TYPES[kind])
        return out
    interval = model.raw.get("full_attention_interval")
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ConfigError("is missing" if interval is None else f"has value {interval!r}",
                          source=model.source, field="layer_types or full_attention_interval",
                          expected="per-layer types or a positive interval")
    return ["attention" if (i + 1) % interval == 0 else "linear" for i in range(n)]


def _is_moe(model: ModelSpec) -> bool:
    return any(model.raw.get(k) for k in ("num_experts", "n_routed_experts",
                                          "num_local_experts"))


def hybrid_kinds(model: ModelSpec) -> list[LayerKind]:
    """Layer kinds with the mixer set; windows do not apply (no sliding layers)."""
    raw = dict(model.raw)
    raw.pop("layer_types", None)  # read by hybrid_mixers, not as attention windows
    base = layer_kinds(replace(model, raw=type(model.raw)(raw), sliding_window=None),
                       moe=_is_moe(model))
    mixers = hybrid_mixers(model)
    return [replace(k, mixer=mixers[i]) for i, k in enumerate(base)]


def periodic_runs(kinds: list[LayerKind], first: int, last: int):
    """Runs of layers first..last as strided runs over the layer pattern's period when
    that gives fewer runs than `layer_runs`: Qwen3.5's 3 linear + 1 full pattern becomes
    L0-56:4, L1-57:4, L2-58:4 (linear) and L3-59:4 (full) instead of 15 + 1 runs."""
    greedy = layer_runs(kinds, first, last)
    n = last - first + 1
    period = next(p for p in range(1, n + 1)
                  if all(kinds[i] == kinds[i + p] for i in range(first, last + 1 - p)))
    if period >= len(greedy):
        return greedy
    runs = []
    for offset in range(period):
        start = first + offset
        end = start + (last - start) // period * period
        runs.append((kinds[start], (start, end, period if end > start else 1)))
    return runs


def build(b: GraphBuilder, layers: tuple[int, int], entry_deps: tuple[str, ...] = (),
          stage: int = 0) -> str:
    """Gated DeltaNet + full-attention layers, dense or MoE FFNs, optional MTP modules."""
    m = b.model
    traits = traits_for(m)
    moe = _is_moe(m)
    spec = MoeSpec.from_model(m) if moe else None
    kinds = hybrid_kinds(m)

    def attention(b, run, deps, stage, kind):
        if kind.mixer == "linear":
            return gated_deltanet(b, run, deps, stage)
        return gqa_attention(b, run, deps, stage, window=None, traits=traits)

    def ffn(b, run, deps, stage, kind):
        if kind.ffn == "moe":
            return moe_ffn(b, run, deps, stage, spec=spec, traits=traits)
        return dense_mlp(b, run, deps, stage, inter=m.intermediate_size)

    last = build_layers(b, layers, entry_deps, stage, kinds, attention, ffn,
                        grouping=periodic_runs)
    if layers[1] == m.num_layers - 1 and b.options.get("mtp_layers", 0):
        declared = int(m.raw.get(traits.mtp_field) or 0) if traits.mtp_field else 0
        mtp_kind = replace(kinds[-1], mixer="attention")
        last = mtp_modules(b, (last,), stage, mtp_kind, attention, ffn, declared,
                           traits.mtp_field)
    return last
