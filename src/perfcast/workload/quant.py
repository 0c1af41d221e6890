"""Quantisation: a model's `Precision` from its checkpoint and TensorCast-style actions.

Sources, in increasing priority:
1. the checkpoint: `quantization_config` in config.json (`fp8` with or without
   `weight_block_size`, `mxfp4`, `compressed-tensors`, `modelopt`, `awq`, `gptq`) and
   `hf_quant_config.json` next to it (ModelOpt: `quant_algo`, `kv_cache_quant_algo`,
   `exclude_modules`);
2. the user's actions: `--quantize-linear-action`, `--quantize-attention-action`,
   `--kv-cache-dtype`.

Modules a checkpoint leaves unquantised (`modules_to_not_convert`, `ignore`,
`exclude_modules`) become `Precision.linear_overrides` by lineage group through
`MODULE_GROUPS`. A module excluded in any layer is treated as excluded in all layers
(tasks are shared by runs of layers). The router and the LM head stay in the activation
dtype unless a checkpoint or action says otherwise (`UNQUANTISED_GROUPS`), as serving
engines do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfcast.core.dtypes import DType, parse_dtype
from perfcast.core.errors import ConfigError, UnsupportedModelError
from perfcast.core.frozen import FrozenDict
from perfcast.workload.graph import Precision
from perfcast.workload.model_spec import ModelSpec

# TensorCast QuantizeLinearAction (+ W4A16, FP8_BLOCK, NVFP4) -> (weight, activation);
# "" means the model's activation dtype.
LINEAR_ACTIONS: dict[str, tuple[str, str] | None] = {
    "DISABLED": None,
    "W8A16_STATIC": ("int8", ""), "W8A16_DYNAMIC": ("int8", ""),
    "W8A8_STATIC": ("int8", "int8"), "W8A8_DYNAMIC": ("int8", "int8"),
    "W4A8_STATIC": ("int4", "int8"), "W4A8_DYNAMIC": ("int4", "int8"),
    "W4A16": ("int4", ""),
    "FP8": ("fp8", "fp8"), "FP8_BLOCK": ("fp8_block", "fp8"),
    "MXFP4": ("mxfp4", "mxfp4"), "NVFP4": ("nvfp4", "nvfp4"),
}

# TensorCast QuantizeAttentionAction -> attention math and KV-cache dtype.
ATTENTION_ACTIONS: dict[str, str | None] = {"DISABLED": None, "INT8": "int8", "FP8": "fp8"}

KV_CACHE_DTYPES = ("bf16", "fp16", "fp8", "int8")

UNQUANTISED_GROUPS = ("moe.router", "final.lm_head", "moe.shared_experts.gate")

# HuggingFace module-name token -> perfcast lineage groups (checked in this order).
MODULE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("lm_head", ("final.lm_head",)),
    ("indexer", ("dsa.indexer",)),
    ("linear_attn", ("gdn",)),
    ("in_proj_qkvz", ("gdn.in_proj_qkvz",)),
    ("in_proj_qkv", ("gdn.in_proj_qkvz",)),
    ("in_proj_z", ("gdn.in_proj_qkvz",)),
    ("in_proj_ba", ("gdn.in_proj_ba",)),
    ("in_proj_b", ("gdn.in_proj_ba",)),
    ("in_proj_a", ("gdn.in_proj_ba",)),
    ("out_proj", ("gdn.out_proj",)),
    ("shared_experts", ("moe.shared_experts",)),
    ("shared_expert", ("moe.shared_experts",)),
    ("experts", ("moe.experts",)),
    ("router", ("moe.router",)),
    ("gate", ("moe.router",)),
    ("q_a_proj", ("mla.q_a_proj",)),
    ("q_b_proj", ("mla.q_b_proj",)),
    ("kv_a_proj_with_mqa", ("mla.kv_a_proj",)),
    ("kv_b_proj", ("mla.kv_b_proj",)),
    ("q_proj", ("attn.qkv_proj", "mla.q_proj")),
    ("k_proj", ("attn.qkv_proj",)),
    ("v_proj", ("attn.qkv_proj",)),
    ("qkv_proj", ("attn.qkv_proj",)),
    ("o_proj", ("attn.o_proj", "mla.o_proj")),
    ("self_attn", ("attn", "mla")),
    ("gate_proj", ("mlp.gate_up_proj",)),
    ("up_proj", ("mlp.gate_up_proj",)),
    ("gate_up_proj", ("mlp.gate_up_proj",)),
    ("down_proj", ("mlp.down_proj",)),
    ("eh_proj", ("mtp",)),
)


def groups_for_module(name: str) -> tuple[str, ...]:
    """Lineage groups of one HuggingFace module name (e.g. `model.layers.*.mlp.gate` ->
    `moe.router`); norms, embeddings and biases map to nothing (they are not linears)."""
    tokens = [t for t in name.replace("*", "").split(".") if t and not t.isdigit()]
    for key, groups in MODULE_GROUPS:
        if key in tokens:
            if key == "gate" and tokens[-1] != "gate":
                continue
            return groups
    return ()


def _action(value: str, table: dict, flag: str):
    key = value.strip().upper()
    if key not in table:
        raise ConfigError(f"unknown action {value!r}", field=flag,
                          expected=" | ".join(table))
    return table[key]


def _scheme(quant: dict[str, Any], source: str) -> tuple[str, str, str | None, list[str]]:
    """(weight, activation, kv_cache or None, unquantised modules) of one quantisation
    config; activation "" = the model's activation dtype."""
    method = str(quant.get("quant_method") or quant.get("quant_algo") or "").lower()
    if isinstance(quant.get("quantization"), Mapping):
        return _scheme({**quant["quantization"], "quant_method": "modelopt"}, source)
    skip = list(quant.get("modules_to_not_convert") or quant.get("ignore")
                or quant.get("exclude_modules") or ())
    if method == "fp8":
        block = quant.get("weight_block_size")
        return ("fp8_block" if block else "fp8"), "fp8", _kv_scheme(quant, source), skip
    if method == "mxfp4":
        return "mxfp4", "", None, skip
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = int(quant.get("bits") or quant.get("w_bit") or 4)
        if bits not in (4, 8):
            raise UnsupportedModelError(f"{method} with {bits} bits is not modelled",
                                        source=source, field="quantization_config.bits",
                                        expected="4 or 8")
        return ("int4" if bits == 4 else "int8"), "", None, skip
    if method == "modelopt":
        algo = str(quant.get("quant_algo", "")).upper()
        table = {"FP8": ("fp8", "fp8"), "NVFP4": ("nvfp4", "nvfp4"),
                 "W4A8_AWQ": ("int4", "fp8"), "W4A16_AWQ": ("int4", ""),
                 "FP8_BLOCK_SCALES": ("fp8_block", "fp8"), "W8A8_SQ_PER_CHANNEL": ("int8", "int8")}
        if algo not in table:
            raise UnsupportedModelError(f"quant_algo {algo!r} is not modelled", source=source,
                                        field="quantization.quant_algo",
                                        expected=" | ".join(table))
        w, a = table[algo]
        return w, a, _kv_scheme(quant, source), skip
    if method == "compressed-tensors":
        return _compressed_tensors(quant, source, skip)
    raise UnsupportedModelError(f"quant_method {method!r} is not modelled", source=source,
                                field="quantization_config.quant_method",
                                expected="fp8 | mxfp4 | compressed-tensors | modelopt | awq | gptq")


def _ct_dtype(spec: dict | None, source: str, what: str) -> str:
    if not spec:
        return ""
    bits, kind = int(spec.get("num_bits", 16)), str(spec.get("type", "int"))
    table = {("float", 8): "fp8", ("int", 8): "int8", ("int", 4): "int4", ("float", 4): "nvfp4"}
    if (kind, bits) not in table:
        raise UnsupportedModelError(f"{kind}{bits} {what} is not modelled", source=source,
                                    field=f"quantization_config.config_groups.{what}",
                                    expected="float8, int8, int4 or float4")
    dt = table[(kind, bits)]
    if dt == "fp8" and spec.get("strategy") == "block":
        dt = "fp8_block"
    return dt


def _compressed_tensors(quant: dict, source: str, skip: list[str]):
    groups = quant.get("config_groups") or {}
    if not groups:
        raise ConfigError("is missing", source=source,
                          field="quantization_config.config_groups",
                          expected="at least one quantisation group")
    first = next(iter(groups.values()))
    w = _ct_dtype(first.get("weights"), source, "weights")
    a = _ct_dtype(first.get("input_activations"), source, "input_activations")
    return w or "bf16", a, _kv_scheme(quant, source), skip


def _kv_scheme(quant: Mapping, source: str) -> str | None:
    """KV-cache dtype a checkpoint declares: `kv_cache_quant_algo` (ModelOpt) or
    `kv_cache_scheme` (compressed-tensors: a dict, or a name such as "FP8")."""
    kv = quant.get("kv_cache_quant_algo") or quant.get("kv_cache_scheme")
    if not kv:
        return None
    if isinstance(kv, Mapping):
        return _ct_dtype(dict(kv), source, "kv_cache_scheme") or None
    return parse_dtype(str(kv), source=source, field="kv_cache_quant_algo").value


def precision_for_model(model: ModelSpec, *, linear_action: str | None = None,
                        attention_action: str | None = None,
                        kv_cache_dtype: str | None = None) -> Precision:
    """The deployment precision: checkpoint quantisation, then the user's actions."""
    act = model.weight_dtype
    weight, lin_act, kv = act, act, act
    overrides: dict[str, tuple[str, str]] = {}
    # hf_quant_config.json (ModelOpt's own record) wins over the config.json copy
    quant = model.quant_config or model.raw.get("quantization_config") or None
    if quant:
        w, a, kv_q, skip = _scheme(dict(quant), model.source)
        weight, lin_act = w, a or act
        kv = kv_q or kv
        for name in skip:
            for group in groups_for_module(str(name)):
                overrides[group] = (act, act)
        for group in UNQUANTISED_GROUPS:
            overrides.setdefault(group, (act, act))
    if linear_action is not None:
        pair = _action(linear_action, LINEAR_ACTIONS, "--quantize-linear-action")
        weight, lin_act = (act, act) if pair is None else (pair[0], pair[1] or act)
        overrides = {g: (act, act) for g in UNQUANTISED_GROUPS} if pair is not None else {}
    attention = act
    if attention_action is not None:
        attn = _action(attention_action, ATTENTION_ACTIONS, "--quantize-attention-action")
        if attn:
            attention, kv = attn, attn
    if kv_cache_dtype:
        kv = parse_dtype(kv_cache_dtype, field="--kv-cache-dtype").value
        if kv not in KV_CACHE_DTYPES:
            raise ConfigError(f"has value {kv_cache_dtype!r}", field="--kv-cache-dtype",
                              expected=" | ".join(KV_CACHE_DTYPES))
    for value in (weight, lin_act, kv, attention):
        DType(value)
    return Precision(weight=weight, activation=act, kv_cache=kv, attention=attention,
                     linear_activation=lin_act if lin_act != act else "",
                     linear_overrides=FrozenDict(overrides))
