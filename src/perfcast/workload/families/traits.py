"""Per-architecture facts that `config.json` does not spell out, as data.

Each model family builder reads its `model_type`'s `ArchTraits` here instead of
branching on names. `MoeSpec` and `layer_kinds` turn the config fields of MoE and
hybrid-attention models into one normalised description; a field that is missing or
outside what perfcast models raises an error naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.core.errors import ConfigError, UnsupportedModelError
from perfcast.workload.model_spec import ModelSpec


@dataclass(frozen=True)
class ArchTraits:
    """`qk_norm`: none | per_head (RMSNorm over head_dim, Qwen3) | per_layer (over the
    whole q/k width, MiniMax-M2). `qkv_bias`: q/k/v projections carry a bias even when
    `attention_bias` is absent (Qwen2). `attention_sinks`: one learned sink logit per head
    (gpt-oss). `router_bias`/`expert_bias`: biases on the router and expert linears
    (gpt-oss). `shared_expert_gate`: a sigmoid gate on the shared expert (Qwen2-MoE).
    `mtp_field`: the config field that declares how many MTP/next-n modules exist.
    `output_gate`: full-attention layers gate their output with sigmoid(x W_g) before
    `o_proj`, W_g fused into the query projection (Qwen3-Next, Qwen3.5).
    `norm`: rms (RMSNorm) | layer (LayerNorm with bias, GPT-style models)."""

    qk_norm: str = "none"
    qkv_bias: bool = False
    attention_sinks: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    shared_expert_gate: bool = False
    mtp_field: str = ""
    output_gate: bool = False
    norm: str = "rms"


ARCH_TRAITS: dict[str, ArchTraits] = {
    "llama": ArchTraits(),
    "mistral": ArchTraits(),
    "qwen2": ArchTraits(qkv_bias=True),
    "qwen3": ArchTraits(qk_norm="per_head"),
    "mixtral": ArchTraits(),
    "qwen2_moe": ArchTraits(qkv_bias=True, shared_expert_gate=True),
    "qwen3_moe": ArchTraits(qk_norm="per_head"),
    "gpt_oss": ArchTraits(attention_sinks=True, router_bias=True, expert_bias=True),
    "minimax_m2": ArchTraits(qk_norm="per_layer", mtp_field="num_mtp_modules"),
    "deepseek_v2": ArchTraits(),
    "deepseek_v3": ArchTraits(mtp_field="num_nextn_predict_layers"),
    "kimi_k2": ArchTraits(mtp_field="num_nextn_predict_layers"),
    "qwen3_vl_text": ArchTraits(qk_norm="per_head"),
    "qwen3_vl_moe_text": ArchTraits(qk_norm="per_head"),
    "mimo": ArchTraits(qkv_bias=True),
    # GPT-style: LayerNorm, biases on every linear (families.gpt)
    "gpt2": ArchTraits(qkv_bias=True, norm="layer"),
    "gpt_neox": ArchTraits(qkv_bias=True, norm="layer"),
    "gpt_bigcode": ArchTraits(qkv_bias=True, norm="layer"),
    "deepseek_v32": ArchTraits(mtp_field="num_nextn_predict_layers"),
    "glm_moe_dsa": ArchTraits(mtp_field="num_nextn_predict_layers"),
    # hybrid gated DeltaNet + gated full attention (multimodal wrappers: *_text)
    **{t: ArchTraits(qk_norm="per_head", shared_expert_gate=True, output_gate=True,
                     mtp_field="mtp_num_hidden_layers")
       for t in ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")},
}

# Config spellings of the same MoE fact, first present wins (data, not code paths).
NUM_EXPERTS_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token")
EXPERT_INTER_KEYS = ("moe_intermediate_size", "intermediate_size")
SHARED_INTER_KEYS = ("shared_expert_intermediate_size", "shared_intermediate_size")

# Attention kinds a `layer_types` entry may name, and the window each one uses.
LAYER_TYPE_WINDOWED = {"full_attention": False, "sliding_attention": True,
                       "deepseek_sparse_attention": False}


def has_routed_experts(model: ModelSpec) -> bool:
    """Whether the config declares more than one routed expert (an MoE model)."""
    return any(isinstance(model.get(k), int) and model.get(k) > 1 for k in NUM_EXPERTS_KEYS)


def traits_for(model: ModelSpec) -> ArchTraits:
    return ARCH_TRAITS.get(model.model_type, ArchTraits())


def _first_int(model: ModelSpec, keys: tuple[str, ...], what: str) -> tuple[str, int]:
    for key in keys:
        value = model.raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"has value {value!r}", source=model.source, field=key,
                              expected=f"a non-negative integer ({what})")
        return key, value
    raise ConfigError("is missing", source=model.source, field=" or ".join(keys),
                      expected=f"an integer ({what}) for a {model.model_type} MoE model")


@dataclass(frozen=True)
class MoeSpec:
    """Routed experts, top-k, expert and shared-expert widths of one MoE model."""

    num_experts: int
    topk: int
    inter: int
    shared_inter: int
    dense_inter: int

    @staticmethod
    def from_model(model: ModelSpec) -> MoeSpec:
        e_key, experts = _first_int(model, NUM_EXPERTS_KEYS, "routed experts")
        k_key, topk = _first_int(model, TOPK_KEYS, "experts per token")
        _, inter = _first_int(model, EXPERT_INTER_KEYS, "expert intermediate size")
        if experts < 1:
            raise ConfigError(f"has value {experts}", source=model.source, field=e_key,
                              expected="at least one routed expert")
        if not 1 <= topk <= experts:
            raise ConfigError(f"has value {topk}", source=model.source, field=k_key,
                              expected=f"1..{experts} ({e_key})")
        if inter < 1:
            raise ConfigError(f"has value {inter}", source=model.source,
                              field="moe_intermediate_size", expected="a positive integer")
        shared = 0
        n_shared = model.raw.get("n_shared_experts")
        if n_shared:
            shared = int(n_shared) * inter
        else:
            for key in SHARED_INTER_KEYS:
                if model.raw.get(key):
                    shared = int(model.raw[key])
                    break
        return MoeSpec(num_experts=experts, topk=topk, inter=inter, shared_inter=shared,
                       dense_inter=model.intermediate_size)


@dataclass(frozen=True)
class LayerKind:
    """What one decoder layer computes: its attention window and its FFN kind."""

    window: int | None
    ffn: str  # "dense" | "moe"
    # token mixer: "attention" (softmax), "linear" (gated DeltaNet), "chunked" (local
    # attention within chunks of `window` tokens, Llama-4)
    mixer: str = "attention"


def _moe_layer(model: ModelSpec, i: int) -> bool:
    """Whether layer `i` has a routed-expert FFN, from the config's layout fields."""
    raw = model.raw
    first_dense = raw.get("first_k_dense_replace")
    if first_dense is not None:
        freq = raw.get("moe_layer_freq") or 1
        return i >= int(first_dense) and i % int(freq) == 0
    mlp_only = raw.get("mlp_only_layers") or ()
    if i in tuple(mlp_only):
        return False
    step = raw.get("decoder_sparse_step") or 1
    return (i + 1) % int(step) == 0


def layer_kinds(model: ModelSpec, *, moe: bool, num_layers: int | None = None
                ) -> list[LayerKind]:
    """Kind of every layer. Windows come from `layer_types` when present (a type perfcast
    does not model fails naming the field), else `sliding_window` applies to all layers."""
    n = num_layers if num_layers is not None else model.num_layers
    types = model.raw.get("layer_types")
    windows: list[int | None]
    if types:
        if len(types) < model.num_layers:
            raise ConfigError(f"lists {len(types)} layers", source=model.source,
                              field="layer_types",
                              expected=f"one entry per layer ({model.num_layers})")
        windows = []
        for i in range(n):
            kind = types[min(i, len(types) - 1)]
            if kind not in LAYER_TYPE_WINDOWED:
                raise UnsupportedModelError(
                    f"layer {i} has attention type {kind!r}", source=model.source,
                    field="layer_types", expected=" or ".join(LAYER_TYPE_WINDOWED))
            if LAYER_TYPE_WINDOWED[kind] and not model.sliding_window:
                raise ConfigError("is missing for sliding_attention layers",
                                  source=model.source, field="sliding_window",
                                  expected="a positive integer")
            windows.append(model.sliding_window if LAYER_TYPE_WINDOWED[kind] else None)
    else:
        windows = [model.sliding_window] * n
    return [LayerKind(window=windows[i], ffn="moe" if moe and _moe_layer(model, i) else "dense")
            for i in range(n)]


def layer_runs(kinds: list[LayerKind], first: int, last: int
               ) -> list[tuple[LayerKind, tuple[int, int, int]]]:
    """Group layers first..last into runs of one kind with a constant stride, in the
    order of their first layer: DeepSeek-V3 gives (dense, 0-2) and (moe, 3-60);
    gpt-oss gives (sliding, 0-34 step 2) and (full, 1-35 step 2)."""
    by_kind: dict[LayerKind, list[int]] = {}
    for i in range(first, last + 1):
        by_kind.setdefault(kinds[i], []).append(i)
    runs: list[tuple[LayerKind, tuple[int, int, int]]] = []
    for kind, idx in by_kind.items():
        start = 0
        while start < len(idx):
            if start + 1 == len(idx):
                runs.append((kind, (idx[start], idx[start], 1)))
                break
            step = idx[start + 1] - idx[start]
            end = start + 1
            while end + 1 < len(idx) and idx[end + 1] - idx[end] == step:
                end += 1
            runs.append((kind, (idx[start], idx[end], step)))
            start = end + 1
    runs.sort(key=lambda r: r[1][0])
    return runs
