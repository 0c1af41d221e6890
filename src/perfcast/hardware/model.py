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

    def has_matrix_dtype(self, dtype: DType | str) -> bool:
        """Whether the matrix engine (tensor / cube cores) has a native path for `dtype`.

        `dtype` is any spelling `perfcast.core.dtypes.parse_dtype` accepts. It is mapped
        to the engine's rate key first (`nvfp4`, `mxfp4` and `fp4` -> `fp4`, `fp8_block`
        -> `fp8`), and the answer is whether the device profile lists a matrix peak for
        that key. So `nvfp4` is True on B200/GB200/B300/GB300 and False on H100/H200
        (no FP4 tensor cores), `int4` is True on A100 and False on H100.

        The answer is about math whose operands are in `dtype` (a W4A16 scheme's
        activations are not fp4; ask about the dtype the GEMM actually runs in). `fp32`
        is True only where the profile lists a native fp32 matrix rate (MI300X, Ascend);
        NVIDIA tensor cores run fp32 GEMMs as `tf32`, a different precision, so ask for
        `tf32` for that path. Index dtypes (int32, int64, bool) are never matrix dtypes.
        An unknown spelling raises the ConfigError of `parse_dtype` rather than
        answering False.
        """
        engine = self.engines.get(EngineKind.MATRIX.value)
        return engine is not None and engine.peak_for(dtype) is not None


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
class CommGrid(Record):
    """TensorCast-style rank grid: ranks are the row-major indices of an array of
    `shape`; a group's topology tier is the start dimension of the outermost grid
    dimension in which its ranks differ (largest tier key <= that dimension).
    `tiers` maps each tier key to the name of an interconnect tier of the system.
    Profiling communication CSVs record this key in their `topology_tier` column."""

    shape: tuple[int, ...]
    tiers: FrozenDict[int, str]

    def coords(self, rank: int) -> tuple[int, ...]:
        out = []
        for size in reversed(self.shape):
            out.append(rank % size)
            rank //= size
        return tuple(reversed(out))

    def topology_tier(self, group: tuple[int, ...] | list[int]) -> int:
        if not group:
            raise ValueError("an empty group has no topology tier")
        coords = [self.coords(r) for r in group]
        diff = next((d for d in range(len(self.shape))
                     if any(c[d] != coords[0][d] for c in coords[1:])), -1)
        if diff == -1:
            return max(self.tiers)
        keys = [k for k in sorted(self.tiers, reverse=True) if k <= diff]
        if not keys:
            raise ValueError(f"no topology tier covers grid dimension {diff}")
        return keys[0]

    def tier_for_contiguous(self, participants: int) -> int:
        """Tier of the group of ranks 0..participants-1 (TP-style contiguous groups)."""
        return self.topology_tier(list(range(max(participants, 1))))

    def tier_key(self, interconnect_name: str) -> int | None:
        return next((k for k, v in self.tiers.items() if v == interconnect_name), None)


@dataclass(frozen=True)
class System(Record):
    """A device type plus the interconnect tiers that join copies of it."""

    name: str
    description: str
    device: Device
    efficiency: Efficiency
    tiers: tuple[InterconnectTier, ...]
    sources: tuple[str, ...] = field(default=())
    # Optional rank grid for topology-tier lookups (profiling databases). Kept out of
    # the canonical digest so systems without it keep their identity; providers that
    # read it put it into their own revision.
    comm_grid: CommGrid | None = field(default=None, metadata={"canonical": False})

    def tier_for_group(self, group_size: int) -> InterconnectTier:
        """The innermost tier whose group capacity holds `group_size` contiguous devices."""
        if not self.tiers:
            raise ConfigError(f"system {self.name} declares no interconnect tier",
                              field="interconnect")
        for tier in self.tiers:
            if tier.group_capacity is None or group_size <= tier.group_capacity:
                return tier
        return self.tiers[-1]

    def has_matrix_dtype(self, dtype: DType | str) -> bool:
        """Whether this system's device has a native matrix-engine path for `dtype`;
        see `Device.has_matrix_dtype`."""
        return self.device.has_matrix_dtype(dtype)

    def tier_named(self, name: str) -> InterconnectTier:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise ConfigError(f"system {self.name} has no interconnect tier {name!r}",
                          expected="one of " + ", ".join(t.name for t in self.tiers))
