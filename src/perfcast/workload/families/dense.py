"""Dense decoder family: Llama, Mistral, Qwen2/Qwen3 (GQA, SwiGLU, RoPE)."""

from __future__ import annotations

from perfcast.workload.families.attention import gqa_attention
from perfcast.workload.families.decoder import build_layers
from perfcast.workload.families.ffn import dense_mlp
from perfcast.workload.families.traits import layer_kinds, traits_for
from perfcast.workload.graph import GraphBuilder


def build(b: GraphBuilder, layers: tuple[int, int], entry_deps: tuple[str, ...] = (),
          stage: int = 0) -> str:
    """Emit dense decoder layers first..last (repeated by count); return the last lineage."""
    traits = traits_for(b.model)

    def attention(b, run, deps, stage, kind):
        return gqa_attention(b, run, deps, stage, window=kind.window, traits=traits)

    def ffn(b, run, deps, stage, kind):
        return dense_mlp(b, run, deps, stage, inter=b.model.intermediate_size)

    return build_layers(b, layers, entry_deps, stage, layer_kinds(b.model, moe=False),
                        attention, ffn)
