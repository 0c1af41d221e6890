"""Typed, immutable hardware description. Units are SI and in the field names."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from perfcast.core.canonical import Record
from perfcast.core.dtypes import DType, engine_dtype
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict


class EngineKind(str, enum.Enum):
    MATRIX = "matrix"
    VECTOR = "vector"


@dataclass(frozen=True)
class Engine(Record):
    kind: EngineKind
    peak_ops_per_s: FrozenDict[str, float]  # canonical dtype name -> dense peak ops/s

    def peak_for(self, dtype: DType | str) -> float | None:
        """Peak ops/s for math in `dtype`, or None when this engine has no such path."""
        key = engine_dtype(dtype).value
        return self.peak_ops_per_s.get(key)


@dataclass(frozen=True)
class MemorySpec(Record):
    capacity_bytes: int
    bw_bytes_per_s: float


@dataclass(frozen=True)
class Efficiency(Record):
    """Achievable fraction of peak; data fitted by calibration, not code constants."""

    matrix: float = 0.8
    vector: float = 0.6
    memory: float = 0.85

    def for_engine(self, kind: EngineKind) -> float:
        return self.matrix if kind is EngineKind.MATRIX else self.vector


@dataclass(frozen=True)
class Device(Record):
    name: str
    vendor: str
    engines: FrozenDict[str, Engine]  # EngineKind value -> engine
    memory: MemorySpec
    launch_overhead_s: float

    def engine(self, kind: EngineKind | str) -> Engine:
        key = EngineKind(kind).value
        try:
            return self.engines[key]
        except KeyError:
            raise ConfigError(f"device {self.name} has no {key} engine") from None


@dataclass(frozen=True)
class InterconnectTier(Record):
    """One level of the network seen from a device (NVLink, PCIe, InfiniBand, HCCS...)."""

    name: str
    bw_bytes_per_s: float  # per device, per direction
    latency_s: float
    efficiency: float
    topology: str  # switch | ring | full_mesh | torus | fat_tree
    group_capacity: int | None  # devices reachable inside this tier; None = unbounded


@dataclass(frozen=True)
class System(Record):
    """A device type plus the interconnect tiers that join copies of it."""

    name: str
    description: str
    device: Device
    efficiency: Efficiency
    tiers: tuple[InterconnectTier, ...]
    sources: tuple[str, ...] = field(default=())

    def tier_for_group(self, group_size: int) -> InterconnectTier:
        """The innermost tier whose group capacity holds `group_size` contiguous devices."""
        if not self.tiers:
            raise ConfigError(f"system {self.name} declares no interconnect tier",
                              field="interconnect")
        for tier in self.tiers:
            if tier.group_capacity is None or group_size <= tier.group_capacity:
                return tier
        return self.tiers[-1]

    def tier_named(self, name: str) -> InterconnectTier:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise ConfigError(f"system {self.name} has no interconnect tier {name!r}",
                          expected="one of " + ", ".join(t.name for t in self.tiers))
