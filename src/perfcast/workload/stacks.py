"""Stack profiles: the operator conventions of the software stack a task graph describes.

A stack decides fusion boundaries (is the residual add inside the next norm?) and the
tensors each call receives (one flat tensor, or the paged KV cache and index tensors
TensorCast passes). Profiles are data (`stacks.yaml`); `auto` picks `tensorcast` for
Ascend NPUs, whose profiling databases are keyed on TensorCast's calls, and `default`
for every other device. A profile may start from another (`base:`) and list the fusion
passes its engine runs (`fusions:`, applied by `perfcast.workload.fusions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from perfcast.core.canonical import Record
from perfcast.core.errors import ConfigError
from perfcast.core.yamlio import safe_load

CHOICES = {
    "residual": ("fused", "per_layer"),
    "qk_norm": ("joint", "separate"),
    "rope_tables": ("in_kernel", "gathered"),
    "tensors": ("flat", "tensorcast"),
    "embedding": ("vocab_parallel", "replicated"),
    "activation_quant": ("in_linear", "separate"),
    "moe_ep_dispatch": ("auto", "all_to_all"),
    "moe_routing": ("expected", "tensorcast_split"),
    "softmax_gating": ("fused", "aten_ops"),
}
AUTO = "auto"
# device vendor -> stack under `auto` (the vendor's serving stack as perfcast models it)
AUTO_BY_VENDOR = {"huawei": "tensorcast"}


@dataclass(frozen=True)
class OpStack(Record):
    name: str
    description: str
    source: str
    residual: str
    qk_norm: str
    rope_tables: str
    tensors: str
    kv_block_size: int
    embedding: str
    logits_gather: bool
    activation_quant: str
    moe_ep_dispatch: str
    moe_routing: str
    softmax_gating: str
    fusions: tuple[str, ...] = ()

    @property
    def tensorcast_tensors(self) -> bool:
        return self.tensors == "tensorcast"


@cache
def _profiles() -> dict[str, OpStack]:
    from perfcast.workload.fusions import check_fusions

    text = resources.files("perfcast.workload").joinpath("stacks.yaml").read_text("utf-8")
    raws = safe_load(text).get("stacks") or {}
    out = {}
    for name, own in raws.items():
        raw = dict(own)
        if "base" in raw:  # the base profile's fields, then this one's
            base = raw.pop("base")
            if base not in raws or "base" in raws[base]:
                raise ConfigError(f"base {base!r} is not a profile without a base",
                                  source="stacks.yaml", field=f"{name}.base",
                                  expected=" | ".join(n for n in raws if "base" not in raws[n]))
            raw = {**raws[base], **raw}
        for key, allowed in CHOICES.items():
            if raw.get(key) not in allowed:
                raise ConfigError(f"has value {raw.get(key)!r}", source="stacks.yaml",
                                  field=f"{name}.{key}", expected=" | ".join(allowed))
        fusions = []
        for i, f in enumerate(raw.get("fusions") or ()):
            if not isinstance(f, dict) or not f.get("name") or not f.get("source"):
                raise ConfigError("needs a name and its source", source="stacks.yaml",
                                  field=f"{name}.fusions[{i}]", expected="{name, source}")
            fusions.append(str(f["name"]))
        out[name] = OpStack(name=name, description=str(raw["description"]).strip(),
                            source=str(raw["source"]).strip(),
                            kv_block_size=int(raw.get("kv_block_size", 0)),
                            logits_gather=bool(raw.get("logits_gather", False)),
                            fusions=check_fusions(fusions, f"{name}.fusions"),
                            **{k: raw[k] for k in CHOICES})
    return out


def stack_names() -> tuple[str, ...]:
    return tuple(_profiles())


def load_stack(name: str) -> OpStack:
    profiles = _profiles()
    if name not in profiles:
        raise ConfigError(f"unknown stack {name!r}", field="stack",
                          expected=" | ".join((AUTO, *profiles)))
    return profiles[name]


def resolve_stack(name: str, vendor: str) -> OpStack:
    """The profile `name` names; `auto` picks it from the device vendor."""
    if name == AUTO:
        return load_stack(AUTO_BY_VENDOR.get(vendor.lower(), "default"))
    return load_stack(name)


def resolve_mla_call(mla_call: str, stack: OpStack) -> str:
    """The MLA call form (`perfcast.workload.families.mla`) of `mla_call` under `stack`:
    `auto` is TensorCast's one MLA call under a stack with TensorCast's tensors,
    perfcast's split tasks otherwise; `split` and `tensorcast` stay."""
    if mla_call != AUTO:
        return mla_call
    return "tensorcast" if stack.tensorcast_tensors else "split"
