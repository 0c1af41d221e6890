"""Is a device name a source states one of the system an import was told? (devices.yaml)"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import yaml

from perfcast.core.errors import ConfigError


@functools.cache
def device_names(path: str | None = None) -> dict[str, tuple[str, ...]]:
    src = Path(path) if path else Path(str(resources.files("perfcast.observe").joinpath(
        "devices.yaml")))
    data = yaml.safe_load(src.read_text(encoding="utf-8")) or {}
    systems = data.get("systems") or {}
    if not isinstance(systems, dict):
        raise ConfigError("expected a mapping of system -> device names", source=str(src),
                          field="systems")
    return {str(k): tuple(str(n) for n in v or ()) for k, v in systems.items()}


def check_device(device: str, system: str, *, source: str) -> None:
    """ConfigError unless `device` (as a source writes it) names `system`."""
    names = device_names()
    if device.strip().lower() == system.strip().lower() or device in names.get(system, ()):
        return
    other = sorted(s for s, ns in names.items() if device in ns or device.lower() == s.lower())
    if other:
        why = f"says device {device!r} ({', '.join(other)}), not {system}"
    else:
        why = (f"says device {device!r}, which is not a known name of {system} "
               "(list it under the system in perfcast/observe/devices.yaml if it is one)")
    known = names.get(system, ())
    raise ConfigError(why, source=source, field="device",
                      expected=", ".join(repr(n) for n in known) if known
                      else f"the device name {system!r}")
