"""Architecture facts: devices, engines, memory and interconnect tiers."""

from perfcast.hardware.model import (
    Device,
    Efficiency,
    Engine,
    EngineKind,
    InterconnectTier,
    MemorySpec,
    System,
)
from perfcast.hardware.catalog_loader import (
    available_devices,
    device_aliases,
    load_system,
    resolve_device_name,
)

__all__ = [
    "Device",
    "Efficiency",
    "Engine",
    "EngineKind",
    "InterconnectTier",
    "MemorySpec",
    "System",
    "available_devices",
    "device_aliases",
    "load_system",
    "resolve_device_name",
]
