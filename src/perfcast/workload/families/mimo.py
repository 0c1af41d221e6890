"""MiMo-V2-Flash: hybrid sliding-window / global GQA with per-kind shapes, routed experts.

* `hybrid_layer_pattern[i]` = 1: sliding-window layer (`sliding_window` tokens) with its
  own shape (`swa_num_attention_heads`, `swa_num_key_value_heads`, `swa_head_dim`,
  `swa_v_head_dim`) and a learned sink per head when `add_swa_attention_sink_bias`;
  0: global layer (`num_attention_heads`, `num_key_value_heads`, `head_dim`,
  `v_head_dim`, sinks when `add_full_attention_sink_bias`). V heads are narrower than
  Q/K heads (v_head_dim 128 vs head_dim 192): the cache holds kv_heads x (d + dv).
* `moe_layer_freq[i]` = 1: routed experts (`n_routed_experts`, top-k, no shared expert);
  0: dense SwiGLU of `intermediate_size`.
Partial RoPE (`partial_rotary_factor`) and the value scale are not built (elementwise).
"""

from __future__ import annotations

from perfcast.core.errors import ConfigError
from perfcast.workload.families.attention import AttentionShape, gqa_attention
from perfcast.workload.families.decoder import build_layers
from perfcast.workload.families.ffn import dense_mlp, moe_ffn
from perfcast.workload.families.traits import LayerKind, MoeSpec, traits_for
from perfcast.workload.graph import GraphBuilder
from perfcast.workload.model_spec import ModelSpec

# config keys of each layer kind's shape: (heads, kv heads, head dim, v head dim, sinks)
SHAPE_KEYS = {
    "sliding": ("swa_num_attention_heads", "swa_num_key_value_heads", "swa_head_dim",
                "swa_v_head_dim", "add_swa_attention_sink_bias"),
    "global": ("num_attention_heads", "num_key_value_heads", "head_dim", "v_head_dim",
               "add_full_attention_sink_bias"),
}


def _per_layer(model: ModelSpec, key: str) -> list[int]:
    value = model.raw.get(key)
    if not isinstance(value, (list, tuple)) or len(value) < model.num_layers:
        raise ConfigError(f"has value {value!r}", source=model.source, field=key,
                          expected=f"a list of 0/1, one per layer ({model.num_layers})")
    return [int(v) for v in value[: model.num_layers]]


def attention_shape(model: ModelSpec, kind: str) -> AttentionShape:
    keys = SHAPE_KEYS[kind]
    dims = []
    for key in keys[:4]:
        value = model.raw.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError("is missing" if value is None else f"has value {value!r}",
                              source=model.source, field=key, expected="a positive integer")
        dims.append(value)
    return AttentionShape(*dims, sinks=bool(model.raw.get(keys[4])))


def mimo_kinds(model: ModelSpec) -> list[LayerKind]:
    swa = _per_layer(model, "hybrid_layer_pattern")
    moe = _per_layer(model, "moe_layer_freq")
    if any(swa) and not model.sliding_window:
        raise ConfigError("is missing", source=model.source, field="sliding_window",
                          expected="a positive integer for the sliding layers")
    return [LayerKind(window=model.sliding_window if swa[i] else None,
                      ffn="moe" if moe[i] else "dense") for i in range(model.num_layers)]


def build(b: GraphBuilder, layers: tuple[int, int], entry_deps: tuple[str, ...] = (),
          stage: int = 0) -> str:
    m = b.model
    traits = traits_for(m)
    spec = MoeSpec.from_model(m)
    shapes = {k: attention_shape(m, k) for k in SHAPE_KEYS}

    def attention(b, run, deps, stage, kind):
        shape = shapes["sliding" if kind.window else "global"]
        return gqa_attention(b, run, deps, stage, window=kind.window, traits=traits,
                             shape=shape)

    def ffn(b, run, deps, stage, kind):
        if kind.ffn == "moe":
            return moe_ffn(b, run, deps, stage, spec=spec, traits=traits)
        return dense_mlp(b, run, deps, stage, inter=m.intermediate_size)

    return build_layers(b, layers, entry_deps, stage, mimo_kinds(m), attention, ffn)
