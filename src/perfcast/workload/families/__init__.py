"""Model families: each turns a ModelSpec into layer tasks through a GraphBuilder.

The family table below is static data: `model_type` -> builder. A model whose type is
not listed fails with the unsupported type named, never silently built as dense.
"""

from __future__ import annotations

from collections.abc import Callable

from perfcast.core.errors import UnsupportedModelError
from perfcast.workload.families import dense

FamilyBuilder = Callable[..., None]

# model_type -> builder; every dense decoder with GQA + SwiGLU + RoPE shares one builder.
FAMILIES: dict[str, FamilyBuilder] = {
    "llama": dense.build,
    "mistral": dense.build,
    "qwen2": dense.build,
    "qwen3": dense.build,
}


def family_for(model_type: str, source: str = "") -> FamilyBuilder:
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported", source=source or None,
            field="model_type", expected="one of " + ", ".join(sorted(FAMILIES))) from None
