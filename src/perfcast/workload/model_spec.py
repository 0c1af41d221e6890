"""ModelSpec: the facts of a HuggingFace `config.json` that determine work."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from perfcast.core.canonical import Record
from perfcast.core.dtypes import DType, parse_dtype
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict, freeze


@dataclass(frozen=True)
class ModelSpec(Record):
    """Architecture facts read from `config.json`. `raw` keeps the whole config so that
    model families can read their own fields; the digest covers everything."""

    name: str
    model_type: str
    architectures: tuple[str, ...]
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    weight_dtype: str
    hidden_act: str = "silu"
    attention_bias: bool = False
    sliding_window: int | None = None
    raw: FrozenDict[str, Any] = field(default_factory=FrozenDict)
    source: str = ""
    # hf_quant_config.json found next to the config (ModelOpt checkpoints), else empty
    quant_config: FrozenDict[str, Any] = field(default_factory=FrozenDict)
    # what the loader wants the user to know (e.g. custom model code it does not run);
    # not part of the digest
    notes: tuple[str, ...] = field(default=(), metadata={"canonical": False})

    DIGEST_DOMAIN = "perfcast.ModelSpec"

    def get(self, key: str, default: Any = None) -> Any:
        value = self.raw.get(key, default)
        return default if value is None else value


def _catalog_dir() -> Path:
    return Path(str(resources.files("perfcast.workload").joinpath("model_catalog")))


QUANT_SUFFIX = ".hf_quant_config.json"


def builtin_models() -> list[str]:
    """HuggingFace ids of the shipped configs."""
    return sorted(p.stem.replace("--", "/", 1) for p in _catalog_dir().glob("*.json")
                  if not p.name.endswith(QUANT_SUFFIX))


def quant_config_path(config_path: Path) -> Path:
    """Where an `hf_quant_config.json` for this config would live: `hf_quant_config.json`
    beside `config.json`, `<org>--<name>_hf_quant_config.json` beside
    `<org>--<name>_config.json`, `<org>--<name>.hf_quant_config.json` in the catalog."""
    name = config_path.name
    if name.endswith("config.json"):
        return config_path.with_name(name[: -len("config.json")] + "hf_quant_config.json")
    return config_path.with_name(config_path.stem + QUANT_SUFFIX)


# Upper bounds on config sizes. The largest published configs have hidden 16384, vocabulary
# 262144, 126 layers, 128 heads and 896 experts; a config far beyond that is a typo
# (vocab_size 1e12) that would otherwise cost hours of simulation.
SIZE_BOUNDS = {"hidden_size": 2**17, "num_attention_heads": 2**12, "num_key_value_heads": 2**12,
               "num_hidden_layers": 2**12, "vocab_size": 2**24, "intermediate_size": 2**20,
               "head_dim": 2**12, "moe_intermediate_size": 2**20, "num_experts": 2**16}
# Weights at one byte per parameter must fit in 32 TiB: more than the HBM of the largest
# scale-up domain of any catalog system (GB300 NVL72: 72 x 279 GiB, about 20 TiB).
MAX_WEIGHT_BYTES = 2**45
_EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
_MLA_HEAD_KEYS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
REMOTE_CODE_KEYS = ("auto_map", "trust_remote_code")


def _check_bounds(cfg: dict, source: str, sizes: dict[str, int]) -> None:
    """Refuse sizes no device could hold (see SIZE_BOUNDS, MAX_WEIGHT_BYTES)."""
    experts = next((cfg[k] for k in _EXPERT_KEYS if isinstance(cfg.get(k), int)), 0)
    moe_inter = cfg.get("moe_intermediate_size")
    values = {**sizes, "num_experts": experts,
              "moe_intermediate_size": moe_inter if isinstance(moe_inter, int) else 0}
    for key, value in values.items():
        if value > SIZE_BOUNDS[key]:
            raise ConfigError(f"has value {value}", source=source, field=key,
                              expected=f"at most {SIZE_BOUNDS[key]} (far beyond any published "
                                       "model; perfcast bounds sizes so a typo cannot run "
                                       "for hours)")
    h, inter = sizes["hidden_size"], sizes["intermediate_size"]
    per_layer = 4 * h * h + 3 * h * inter + 3 * h * values["moe_intermediate_size"] * experts
    weights = sizes["num_hidden_layers"] * per_layer + 2 * sizes["vocab_size"] * h
    if weights > MAX_WEIGHT_BYTES:
        raise ConfigError(
            f"describes about {weights:.3g} parameters (hidden_size={h}, num_hidden_layers="
            f"{sizes['num_hidden_layers']}, intermediate_size={inter}, vocab_size="
            f"{sizes['vocab_size']}, experts={experts})", source=source, field="hidden_size",
            expected=f"weights under {MAX_WEIGHT_BYTES / 2**40:.0f} TiB at one byte per "
                     "parameter: more than the memory of the largest scale-up domain any "
                     "device catalog system has")


def _head_dim(cfg: dict, hidden: int, heads: int, source: str) -> int:
    """`head_dim`, or hidden_size / num_attention_heads when it divides evenly (MLA
    configs give their own head dims and do not use this one)."""
    head_dim = cfg.get("head_dim")
    if head_dim is None or head_dim == 0:
        if hidden % heads and not any(k in cfg for k in _MLA_HEAD_KEYS):
            raise ConfigError(f"hidden_size={hidden} is not a multiple of num_attention_heads="
                              f"{heads} and the config gives no head_dim", source=source,
                              field="head_dim", expected="an explicit head_dim, or "
                              "hidden_size divisible by num_attention_heads")
        head_dim = hidden // heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ConfigError(f"has value {head_dim!r}", source=source, field="head_dim",
                          expected="a positive integer")
    return head_dim


def remote_code_note(cfg: dict, source: str) -> str:
    """A note when the config asks for custom model code (perfcast never runs it)."""
    keys = [k for k in REMOTE_CODE_KEYS if cfg.get(k)]
    if not keys:
        return ""
    return (f"{source}: {' / '.join(keys)} names custom model code; perfcast never runs model "
            f"code: the work is built from the config's fields for model_type "
            f"{cfg.get('model_type')!r}")


def _require(cfg: dict, key: str, source: str, kind: type | tuple = int) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError("is missing", source=source, field=key, expected=_kind_name(kind))
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"has value {value!r}", source=source, field=key,
                          expected=_kind_name(kind))
    if isinstance(value, int) and value <= 0:
        raise ConfigError(f"has value {value!r}", source=source, field=key,
                          expected="a positive integer")
    return value


def _kind_name(kind: type | tuple) -> str:
    return {int: "a positive integer", str: "a string", float: "a number"}.get(kind, str(kind))


def _text_config(cfg: dict) -> dict:
    """Multimodal wrappers (Qwen3-VL, Llama-4, Gemma) keep the LM under `text_config`."""
    inner = cfg.get("text_config")
    if isinstance(inner, dict) and "hidden_size" in inner and "hidden_size" not in cfg:
        merged = dict(inner)
        for key in ("quantization_config", "tie_word_embeddings", "torch_dtype"):
            if key in cfg and key not in merged:
                merged[key] = cfg[key]
        merged.setdefault("architectures", cfg.get("architectures", []))
        return merged
    return cfg


# GPT-style configs spell the common fields their own way (HuggingFace's `attribute_map`)
# and leave some to the config class's defaults; the canonical names are filled from them.
# model_type -> (canonical -> config key) aliases, and defaults applied when both are absent.
CONFIG_KEY_ALIASES: dict[str, dict[str, str]] = {
    "gpt2": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
             "num_attention_heads": "n_head", "intermediate_size": "n_inner",
             "max_position_embeddings": "n_positions", "hidden_act": "activation_function"},
    "gpt_bigcode": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
                    "num_attention_heads": "n_head", "intermediate_size": "n_inner",
                    "max_position_embeddings": "n_positions",
                    "hidden_act": "activation_function"},
}
# HF defaults of those config classes: GPT2Config / GPTBigCodeConfig tie the LM head to
# the embedding and use an inner MLP of 4 x hidden (n_inner None); GPTNeoXConfig does not tie.
CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"tie_word_embeddings": True, "attention_bias": True},
    "gpt_bigcode": {"tie_word_embeddings": True, "attention_bias": True},
    "gpt_neox": {"tie_word_embeddings": False, "attention_bias": True},
}
INNER_FACTOR_DEFAULT = {"gpt2": 4, "gpt_bigcode": 4}


def _canonical_keys(cfg: dict) -> dict:
    """Fill the canonical field names of GPT-style configs (see CONFIG_KEY_ALIASES)."""
    model_type = cfg.get("model_type")
    aliases = CONFIG_KEY_ALIASES.get(model_type, {})
    defaults = CONFIG_DEFAULTS.get(model_type, {})
    if not aliases and not defaults:
        return cfg
    out = dict(cfg)
    for canonical, key in aliases.items():
        if out.get(canonical) is None and out.get(key) is not None:
            out[canonical] = out[key]
    for key, value in defaults.items():
        out.setdefault(key, value)
    factor = INNER_FACTOR_DEFAULT.get(model_type)
    if factor and out.get("intermediate_size") is None and isinstance(out.get("hidden_size"), int):
        out["intermediate_size"] = factor * out["hidden_size"]
    if model_type == "gpt_bigcode" and out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = 1 if out.get("multi_query", True) else out.get(
            "num_attention_heads")
    return out


def model_spec_from_config(cfg: Any, *, name: str = "", source: str = "<config>",
                           quant_config: dict | None = None) -> ModelSpec:
    """Validate a parsed config.json and build a ModelSpec. Errors name file and field."""
    if not isinstance(cfg, dict):
        raise ConfigError("top level is not a JSON object", source=source)
    note = remote_code_note(cfg, source)
    cfg = _text_config(cfg)
    note = note or remote_code_note(cfg, source)
    cfg = _canonical_keys(cfg)
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError("is missing", source=source, field="model_type", expected="a string")
    hidden = _require(cfg, "hidden_size", source)
    heads = _require(cfg, "num_attention_heads", source)
    layers = _require(cfg, "num_hidden_layers", source)
    vocab = _require(cfg, "vocab_size", source)
    kv_heads = cfg.get("num_key_value_heads") or heads
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads <= 0:
        raise ConfigError(f"has value {kv_heads!r}", source=source, field="num_key_value_heads",
                          expected="a positive integer")
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads={heads} is not a multiple of it ({kv_heads})",
                          source=source, field="num_key_value_heads")
    head_dim = _head_dim(cfg, hidden, heads, source)
    intermediate = cfg.get("intermediate_size") or 0
    if isinstance(intermediate, bool) or not isinstance(intermediate, int) or intermediate < 0:
        raise ConfigError(f"has value {intermediate!r}", source=source,
                          field="intermediate_size", expected="a non-negative integer")
    _check_bounds(cfg, source, {"hidden_size": hidden, "num_attention_heads": heads,
                                "num_key_value_heads": kv_heads, "num_hidden_layers": layers,
                                "vocab_size": vocab, "intermediate_size": intermediate,
                                "head_dim": head_dim})
    dtype_text = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    try:
        weight_dtype = parse_dtype(dtype_text, source=source, field="torch_dtype")
    except ConfigError:
        raise
    if weight_dtype not in (DType.BF16, DType.FP16, DType.FP32):
        weight_dtype = DType.BF16
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    archs = cfg.get("architectures") or []
    return ModelSpec(
        name=name or source, model_type=model_type, architectures=tuple(archs),
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=intermediate, vocab_size=vocab,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        weight_dtype=weight_dtype.value, hidden_act=str(cfg.get("hidden_act", "silu")),
        attention_bias=bool(cfg.get("attention_bias", False)),
        sliding_window=window if isinstance(window, int) and window > 0 else None,
        raw=freeze(cfg), source=source, quant_config=freeze(quant_config or {}),
        notes=(note,) if note else ())


def load_model_spec(model: str | Path) -> ModelSpec:
    """MODEL is a config.json path, a folder holding one, or a built-in HuggingFace id."""
    text = str(model)
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError("folder holds no config.json", source=text)
    elif not path.is_file():
        builtin = _catalog_dir() / (text.replace("/", "--", 1) + ".json")
        if not builtin.is_file():
            raise ConfigError(f"unknown model {text!r}", field="MODEL",
                              expected="a config.json path, a folder holding one, or a "
                                       "built-in id (" + ", ".join(builtin_models()) + ")")
        path = builtin
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"is not valid JSON (line {exc.lineno}: {exc.msg})",
                          source=str(path)) from None
    quant = None
    qpath = quant_config_path(path)
    if qpath.is_file():
        try:
            quant = json.loads(qpath.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"is not valid JSON (line {exc.lineno}: {exc.msg})",
                              source=str(qpath)) from None
    name = text if not Path(text).exists() else (cfg.get("_name_or_path") or path.parent.name
                                                 if path.name == "config.json" else path.stem)
    return model_spec_from_config(cfg, name=str(name), source=str(path), quant_config=quant)
