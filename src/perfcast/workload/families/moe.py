"""MoE decoder families: GQA attention + routed experts (Mixtral, Qwen2-MoE, Qwen3-MoE,
gpt-oss, MiniMax-M2) and MLA + routed experts (DeepSeek-V2/V3, Kimi-K2).

Dense-first layers (`first_k_dense_replace`, `mlp_only_layers`, `decoder_sparse_step`)
use the dense MLP with `intermediate_size`; the rest use `moe_ffn`.
"""

from __future__ import annotations

from perfcast.workload.families.attention import gqa_attention
from perfcast.workload.families.decoder import build_layers, mtp_modules
from perfcast.workload.families.ffn import dense_mlp, moe_ffn
from perfcast.workload.families.mla import mla_attention
from perfcast.workload.families.traits import MoeSpec, layer_kinds, traits_for
from perfcast.workload.graph import GraphBuilder


def _ffn_for(spec: MoeSpec, traits):
    def ffn(b, run, deps, stage, kind):
        if kind.ffn == "moe":
            return moe_ffn(b, run, deps, stage, spec=spec, traits=traits)
        return dense_mlp(b, run, deps, stage, inter=spec.dense_inter)
    return ffn


def build_with_attention(b: GraphBuilder, layers: tuple[int, int],
                         entry_deps: tuple[str, ...], stage: int, attention,
                         kinds=None) -> str:
    """MoE decoder layers (dense-first layers, optional MTP modules) around a family's
    attention block `attention(b, layers, deps, stage, kind)`; `kinds` overrides the
    per-layer kinds read from the config (e.g. with a family-specific `mixer`)."""
    m = b.model
    traits = traits_for(m)
    spec = MoeSpec.from_model(m)
    kinds = kinds or layer_kinds(m, moe=True)
    ffn = _ffn_for(spec, traits)
    last = build_layers(b, layers, entry_deps, stage, kinds, attention, ffn)
    if layers[1] == m.num_layers - 1 and b.options.get("mtp_layers", 0):
        declared = int(m.raw.get(traits.mtp_field) or 0) if traits.mtp_field else 0
        last = mtp_modules(b, (last,), stage, kinds[-1], attention, ffn, declared,
                           traits.mtp_field)
    return last


def build(b: GraphBuilder, layers: tuple[int, int], entry_deps: tuple[str, ...] = (),
          stage: int = 0) -> str:
    """GQA attention + MoE FFN."""
    traits = traits_for(b.model)

    def attention(b, run, deps, stage, kind):
        return gqa_attention(b, run, deps, stage, window=kind.window, traits=traits)

    return build_with_attention(b, layers, entry_deps, stage, attention)


def build_mla(b: GraphBuilder, layers: tuple[int, int], entry_deps: tuple[str, ...] = (),
              stage: int = 0) -> str:
    """MLA attention + MoE FFN (DeepSeek-V2/V3, Kimi-K2)."""

    def attention(b, run, deps, stage, kind):
        return mla_attention(b, run, deps, stage)

    return build_with_attention(b, layers, entry_deps, stage, attention)
