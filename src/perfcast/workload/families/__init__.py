"""Model families: each turns a ModelSpec into layer tasks through a GraphBuilder.

The family table below is static data: `model_type` -> builder (`module.function` of
this package, imported when a model of that type is first built: a call pays only for
its own family). A model whose type is not listed fails with the unsupported type named,
never silently built as dense. Architecture details that differ within a family live in
`traits.ARCH_TRAITS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from perfcast.core.errors import UnsupportedModelError

FamilyBuilder = Callable[..., str]

FAMILIES: dict[str, str] = {
    # dense decoders: GQA + SwiGLU + RoPE
    "llama": "dense.build",
    "mistral": "dense.build",
    "qwen2": "dense.build",
    "qwen3": "dense.build",
    "qwen3_vl_text": "dense.build",  # language model of Qwen3-VL
    "mimo": "dense.build",  # Qwen2-style MiMo-7B (its MTP layers are not built)
    # GPT-style: LayerNorm, MHA/MQA, GeLU MLP, learned or rotary positions
    "gpt2": "gpt.build",
    "gpt_neox": "gpt.build",
    "gpt_bigcode": "gpt.build",
    # GQA attention + routed experts
    "mixtral": "moe.build",
    "qwen2_moe": "moe.build",
    "qwen3_moe": "moe.build",
    "qwen3_vl_moe_text": "moe.build",
    "gpt_oss": "moe.build",
    "minimax_m2": "moe.build",
    # multi-head latent attention + routed experts
    "deepseek_v2": "moe.build_mla",
    "deepseek_v3": "moe.build_mla",
    "kimi_k2": "moe.build_mla",
    # interleaved MoE/dense layers, chunked local + global NoPE attention
    "llama4_text": "llama4.build",
    "llama4": "llama4.build",
    # sliding/global GQA with per-kind shapes and sinks, routed experts
    "mimo_v2_flash": "mimo.build",
    # DeepSeek Sparse Attention: indexer + sparse MLA, routed experts
    "deepseek_v32": "dsa.build",
    "glm_moe_dsa": "dsa.build",
    # gated DeltaNet linear attention interleaved with gated full attention
    "qwen3_next": "hybrid.build",
    "qwen3_5": "hybrid.build",
    "qwen3_5_text": "hybrid.build",
    "qwen3_5_moe": "hybrid.build",
    "qwen3_5_moe_text": "hybrid.build",
}


def family_for(model_type: str, source: str = "") -> FamilyBuilder:
    """The builder of `model_type` (its module imported now)."""
    try:
        name = FAMILIES[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported", source=source or None,
            field="model_type", expected="one of " + ", ".join(sorted(FAMILIES))) from None
    module, function = name.split(".")
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)
