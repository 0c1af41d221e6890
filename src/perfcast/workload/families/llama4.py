"""Llama-4 (Scout, Maverick) language model: interleaved MoE and dense layers, chunked
local attention on RoPE layers, global attention on NoPE layers.

* FFN: layer i is MoE when (i + 1) % `interleave_moe_layer_step` == 0 (Scout: every
  layer, Maverick: every second); MoE layers route top-`num_experts_per_tok` of
  `num_local_experts` experts of width `intermediate_size` and add one always-on shared
  expert of the same width; dense layers use `intermediate_size_mlp`.
* Attention: layers with RoPE (all but every 4th, or `no_rope_layers`) attend within
  chunks of `attention_chunk_size` tokens (cache: one chunk per request); every 4th layer
  is a global NoPE layer. The weight-free L2 q/k norm (`use_qk_norm`) is not built
  (a few FLOPs per element, no parameters).
"""

from __future__ import annotations

from dataclasses import replace

from perfcast.core.errors import ConfigError
from perfcast.workload.families.attention import gqa_attention
from perfcast.workload.families.common import positive_int_field
from perfcast.workload.families.decoder import build_layers
from perfcast.workload.families.ffn import dense_mlp, moe_ffn
from perfcast.workload.families.traits import LayerKind, MoeSpec, traits_for
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.model_spec import ModelSpec

NOPE_INTERVAL = 4  # HF default: layer i uses RoPE (chunked) unless (i + 1) % 4 == 0


def llama4_kinds(model: ModelSpec) -> list[LayerKind]:
    n = model.num_layers
    step = positive_int_field(model, "interleave_moe_layer_step", "Llama-4")
    chunk = model.raw.get("attention_chunk_size")
    rope = model.raw.get("no_rope_layers") or [int((i + 1) % NOPE_INTERVAL != 0)
                                               for i in range(n)]
    if len(rope) < n:
        raise ConfigError(f"lists {len(rope)} layers", source=model.source,
                          field="no_rope_layers", expected=f"one entry per layer ({n})")
    kinds = []
    for i in range(n):
        chunked = bool(rope[i]) and bool(chunk)
        kinds.append(LayerKind(window=int(chunk) if chunked else None,
                               ffn="moe" if (i + 1) % step == 0 else "dense",
                               mixer="chunked" if chunked else "attention"))
    return kinds


def build(b: GraphBuilder, layers: tuple[int, int], entry_deps: tuple[str, ...] = (),
          stage: int = 0) -> str:
    m = b.model
    traits = traits_for(m)
    kinds = llama4_kinds(m)
    spec = replace(MoeSpec.from_model(m), shared_inter=m.intermediate_size,
                   dense_inter=positive_int_field(m, "intermediate_size_mlp", "Llama-4"))

    def attention(b, run, deps, stage, kind):
        return gqa_attention(b, run, deps, stage, window=None, traits=traits,
                             chunk=kind.window if kind.mixer == "chunked" else None)

    def ffn(b, run, deps, stage, kind):
        if kind.ffn == "moe":
            return moe_ffn(b, run, deps, stage, spec=spec, traits=traits)
        return dense_mlp(b, run, deps, stage, inter=spec.dense_inter)

    return build_layers(b, layers, entry_deps, stage, kinds, attention, ffn)
