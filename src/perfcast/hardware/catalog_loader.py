"""Load a System from the packaged YAML catalog or a user file, validating every field."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from perfcast.core.dtypes import DType
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.core.yamlio import safe_load
from perfcast.hardware.model import (
    CommGrid,
    Device,
    Efficiency,
    Engine,
    EngineKind,
    InterconnectTier,
    MemorySpec,
    System,
)

_CATALOG_PACKAGE = "perfcast.hardware"
_ALIASES_FILE = "aliases.yaml"
_ENGINE_KEYS = {"fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "fp4"}
_TOPOLOGIES = {"switch", "ring", "full_mesh", "torus", "fat_tree"}
# the keys each mapping of a device file may hold (anything else is a typo or a field
# this loader does not read; both are refused rather than silently defaulted)
_KEYS = {
    "": {"name", "description", "vendor", "sources", "device", "efficiency", "interconnect",
         "comm_grid"},
    "device": {"matrix_engine", "vector_engine", "memory", "launch_overhead_us"},
    "engine": {"peak_tflops"},
    "device.memory": {"capacity_gib", "bandwidth_gb_per_s"},
    "efficiency": {"matrix", "vector", "memory"},
    "interconnect": {"name", "bandwidth_gb_per_s", "latency_us", "efficiency", "topology",
                     "group_capacity"},
    "comm_grid": {"shape", "tiers"},
    "comm_grid.tiers": {"topology_tier", "interconnect"},
}
TERA = 1e12
GIGA = 1e9
MICRO = 1e-6


def _catalog_dir() -> Path:
    return Path(str(resources.files(_CATALOG_PACKAGE).joinpath("catalog")))


def available_devices() -> list[str]:
    """Names of the packaged device profiles (file stems)."""
    return sorted(p.stem for p in _catalog_dir().glob("*.yaml"))


def _aliases_path() -> Path:
    return Path(str(resources.files(_CATALOG_PACKAGE).joinpath(_ALIASES_FILE)))


@functools.lru_cache(maxsize=1)
def _load_aliases() -> FrozenDict[str, str]:
    path = _aliases_path()
    data = safe_load(path.read_text(encoding="utf-8")) or {}
    src = str(path)
    if not isinstance(data, dict) or not isinstance(data.get("aliases", {}), dict):
        raise ConfigError("is not a mapping", source=src, field="aliases",
                          expected="a mapping of alias -> catalog name")
    names = set(available_devices())
    out: dict[str, str] = {}
    for alias, target in (data.get("aliases") or {}).items():
        if not isinstance(alias, str) or not isinstance(target, str):
            raise ConfigError(f"has entry {alias!r}: {target!r}", source=src, field="aliases",
                              expected="string keys and values")
        key = _normalise(alias)
        if key in names:
            raise ConfigError(f"alias {alias!r} shadows a catalog device", source=src,
                              field=f"aliases.{alias}", expected="a name that is not a file stem")
        if target not in names:
            raise ConfigError(f"alias {alias!r} names unknown device {target!r}", source=src,
                              field=f"aliases.{alias}", expected="one of " + ", ".join(sorted(names)))
        out[key] = target
    return FrozenDict(out)


def _normalise(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def device_aliases() -> dict[str, str]:
    """Other spellings of packaged device names: alias -> catalog name (a fresh dict).

    The table is data (`perfcast/hardware/aliases.yaml`): spellings other tools use for a
    device we ship under another name (e.g. AIConfigurator's `gb200_sxm` for `gb200`).
    Lookups ignore case and treat `-` as `_`."""
    return dict(_load_aliases())


def resolve_device_name(name: str) -> str:
    """The catalog name for a catalog name or an alias (case-insensitive, `-` = `_`);
    a ConfigError naming the known names when it is neither."""
    names = available_devices()
    key = _normalise(str(name))
    if key in names:
        return key
    aliases = _load_aliases()
    if key in aliases:
        return aliases[key]
    raise ConfigError(f"unknown device {str(name)!r}", field="--device",
                      expected="a catalog name (" + ", ".join(names) + "), an alias ("
                      + ", ".join(sorted(aliases)) + ") or a YAML path")


class _Reader:
    """Typed field access that names file and field on every error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def known_keys(self, node: Any, path: str, group: str) -> None:
        """Refuse keys of mapping `node` (at `path`) outside `_KEYS[group]`."""
        if not isinstance(node, dict):
            return
        known = _KEYS[group]
        unknown = sorted(str(k) for k in node if k not in known)
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r}", source=self.source,
                              field=f"{path}.{unknown[0]}" if path else unknown[0],
                              expected="keys among " + ", ".join(sorted(known)))

    def positive(self, node: Any, key: str, path: str, why: str) -> float:
        """A required number > 0 (a zero rate or bandwidth would divide by zero later)."""
        value = self.get(node, key, path, "number")
        if value <= 0:
            raise ConfigError(f"is {value:g}", source=self.source, field=f"{path}.{key}",
                              expected=f"a positive number ({why})")
        return value

    def get(self, node: Any, key: str, path: str, kind: str, *, required: bool = True,
            default: Any = None) -> Any:
        if not isinstance(node, dict):
            raise ConfigError("is not a mapping", source=self.source, field=path or "<root>",
                              expected="a mapping")
        full = f"{path}.{key}" if path else key
        if key not in node or node[key] is None:
            if required:
                raise ConfigError("is missing", source=self.source, field=full,
                                  expected=kind)
            return default
        value = node[key]
        if kind == "number":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"has value {value!r}", source=self.source, field=full,
                                  expected="a number")
            if value < 0:
                raise ConfigError(f"is negative ({value})", source=self.source, field=full,
                                  expected="a non-negative number")
            return float(value)
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"has value {value!r}", source=self.source, field=full,
                                  expected="an integer")
            return value
        if kind == "str":
            if not isinstance(value, str):
                raise ConfigError(f"has value {value!r}", source=self.source, field=full,
                                  expected="a string")
            return value
        if kind == "mapping":
            if not isinstance(value, dict):
                raise ConfigError(f"has value {value!r}", source=self.source, field=full,
                                  expected="a mapping")
            return value
        if kind == "list":
            if not isinstance(value, list):
                raise ConfigError(f"has value {value!r}", source=self.source, field=full,
                                  expected="a list")
            return value
        raise AssertionError(kind)


def _engine(r: _Reader, node: dict, path: str, kind: EngineKind) -> Engine:
    r.known_keys(node, path, "engine")
    peaks = r.get(node, "peak_tflops", path, "mapping")
    rates: dict[str, float] = {}
    for key in peaks:
        if key not in _ENGINE_KEYS:
            raise ConfigError(f"unknown dtype key {key!r}", source=r.source,
                              field=f"{path}.peak_tflops",
                              expected="keys among " + ", ".join(sorted(_ENGINE_KEYS)))
        rates[DType(key).value] = r.positive(peaks, key, f"{path}.peak_tflops",
                                             "a peak rate; leave out a dtype the engine "
                                             "has no path for") * TERA
    if not rates:
        raise ConfigError("is empty", source=r.source, field=f"{path}.peak_tflops",
                          expected="at least one dtype rate")
    return Engine(kind=kind, peak_ops_per_s=FrozenDict(rates))


def system_from_mapping(data: Any, source: str, expected_name: str | None = None) -> System:
    r = _Reader(source)
    if not isinstance(data, dict):
        raise ConfigError("top level is not a mapping", source=source, expected="a mapping")
    r.known_keys(data, "", "")
    name = r.get(data, "name", "", "str")
    if expected_name is not None and name != expected_name:
        raise ConfigError(f"name {name!r} differs from the file stem {expected_name!r}",
                          source=source, field="name")
    dev = r.get(data, "device", "", "mapping")
    r.known_keys(dev, "device", "device")
    engines = {EngineKind.MATRIX.value: _engine(r, r.get(dev, "matrix_engine", "device", "mapping"),
                                                "device.matrix_engine", EngineKind.MATRIX),
               EngineKind.VECTOR.value: _engine(r, r.get(dev, "vector_engine", "device", "mapping"),
                                                "device.vector_engine", EngineKind.VECTOR)}
    if "fp32" not in engines["vector"].peak_ops_per_s:
        raise ConfigError("has no fp32 rate", source=source, field="device.vector_engine.peak_tflops",
                          expected="an fp32 entry")
    mem = r.get(dev, "memory", "device", "mapping")
    r.known_keys(mem, "device.memory", "device.memory")
    memory = MemorySpec(
        capacity_bytes=int(r.positive(mem, "capacity_gib", "device.memory",
                                      "memory capacity") * 2**30),
        bw_bytes_per_s=r.positive(mem, "bandwidth_gb_per_s", "device.memory",
                                  "memory bandwidth") * GIGA)
    device = Device(name=name, vendor=r.get(data, "vendor", "", "str"),
                    engines=FrozenDict(engines), memory=memory,
                    launch_overhead_s=r.get(dev, "launch_overhead_us", "device", "number") * MICRO)
    eff_node = r.get(data, "efficiency", "", "mapping", required=False, default={})
    r.known_keys(eff_node, "efficiency", "efficiency")
    eff = Efficiency(**{k: r.get(eff_node, k, "efficiency", "number", required=False,
                                 default=getattr(Efficiency(), k))
                        for k in ("matrix", "vector", "memory")})
    for k in ("matrix", "vector", "memory"):
        if not 0 < getattr(eff, k) <= 1:
            raise ConfigError(f"is {getattr(eff, k)}", source=source, field=f"efficiency.{k}",
                              expected="a fraction in (0, 1]")
    tiers = []
    for i, node in enumerate(r.get(data, "interconnect", "", "list")):
        path = f"interconnect[{i}]"
        r.known_keys(node, path, "interconnect")
        topology = r.get(node, "topology", path, "str")
        if topology not in _TOPOLOGIES:
            raise ConfigError(f"unknown topology {topology!r}", source=source,
                              field=f"{path}.topology", expected=" | ".join(sorted(_TOPOLOGIES)))
        capacity = r.get(node, "group_capacity", path, "int", required=False)
        if capacity is not None and capacity < 1:
            raise ConfigError(f"is {capacity}", source=source, field=f"{path}.group_capacity",
                              expected="a positive device count, or null for unbounded")
        efficiency = r.get(node, "efficiency", path, "number", required=False, default=0.8)
        if not 0 < efficiency <= 1:
            raise ConfigError(f"is {efficiency}", source=source, field=f"{path}.efficiency",
                              expected="a fraction in (0, 1]")
        tiers.append(InterconnectTier(
            name=r.get(node, "name", path, "str"),
            bw_bytes_per_s=r.positive(node, "bandwidth_gb_per_s", path,
                                      "link bandwidth") * GIGA,
            latency_s=r.get(node, "latency_us", path, "number") * MICRO,
            efficiency=efficiency, topology=topology, group_capacity=capacity))
    sources = r.get(data, "sources", "", "list", required=False, default=[])
    grid = _comm_grid(r, data, {t.name for t in tiers})
    return System(name=name, description=r.get(data, "description", "", "str", required=False,
                                                 default=name),
                  device=device, efficiency=eff, tiers=tuple(tiers),
                  sources=tuple(str(s) for s in sources), comm_grid=grid)


def _comm_grid(r: _Reader, data: dict, tier_names: set[str]) -> CommGrid | None:
    """Optional `comm_grid: {shape: [..], tiers: [{topology_tier: k, interconnect: name}]}`."""
    node = r.get(data, "comm_grid", "", "mapping", required=False)
    if node is None:
        return None
    r.known_keys(node, "comm_grid", "comm_grid")
    shape = r.get(node, "shape", "comm_grid", "list")
    if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
        raise ConfigError(f"has value {shape!r}", source=r.source, field="comm_grid.shape",
                          expected="a list of positive integers")
    tiers: dict[int, str] = {}
    for i, t in enumerate(r.get(node, "tiers", "comm_grid", "list")):
        path = f"comm_grid.tiers[{i}]"
        r.known_keys(t, path, "comm_grid.tiers")
        key = r.get(t, "topology_tier", path, "int")
        name = r.get(t, "interconnect", path, "str")
        if not 0 <= key < len(shape):
            raise ConfigError(f"is {key}", source=r.source, field=f"{path}.topology_tier",
                              expected=f"a grid dimension in 0..{len(shape) - 1}")
        if name not in tier_names:
            raise ConfigError(f"names unknown interconnect {name!r}", source=r.source,
                              field=f"{path}.interconnect",
                              expected="one of " + ", ".join(sorted(tier_names)))
        tiers[key] = name
    if 0 not in tiers:
        raise ConfigError("has no tier for grid dimension 0", source=r.source,
                          field="comm_grid.tiers", expected="an entry with topology_tier: 0")
    return CommGrid(shape=tuple(shape), tiers=FrozenDict(tiers))


def load_system_file(path: str | Path) -> System:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read device file: {exc.strerror}", source=str(p)) from None
    try:
        data = safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"is not valid YAML: {exc}", source=str(p)) from None
    return system_from_mapping(data, str(p))


@functools.lru_cache(maxsize=64)
def _load_catalog(name: str) -> System:
    path = _catalog_dir() / f"{name}.yaml"
    data = safe_load(path.read_text(encoding="utf-8"))
    return system_from_mapping(data, str(path), expected_name=name)


def load_system(device: str | Path) -> System:
    """A catalog name (`h100_sxm`), an alias of one (`gb200_sxm` -> `gb200`, see
    `device_aliases`), or a path to a YAML file of the same schema. An alias loads the
    very same System (same name and digest) as its catalog name."""
    text = str(device)
    if text.endswith((".yaml", ".yml")) or "/" in text or Path(text).is_file():
        return load_system_file(text)
    return _load_catalog(resolve_device_name(text))
