"""Which device a collected database was measured on, and which replay backend measures it.

A database declares its device in `op_mapping.yaml` (`device:`) or in the collection
manifest (`--device` of `collect parse`). `collect replay` picks the backend that runs on
that device (`npu` for Ascend, `cuda` for NVIDIA GPUs, `cpu` for a host CPU) and refuses
a backend that measures another one: CPU timings never land in an Ascend database.
"""

from __future__ import annotations

import json
from pathlib import Path

from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.devices import canonical_device, same_device

BACKENDS = ("cpu", "cuda", "npu")
VENDOR_BACKENDS = {"huawei": "npu", "nvidia": "cuda"}


def declared_device(database_path: Path) -> str:
    """The device `op_mapping.yaml` or the collection manifest names ("" when neither does
    or the manifest's runs disagree)."""
    from perfcast.collect.parse import MANIFEST
    from perfcast.evidence.profiling.op_mapping import MAPPING_FILE, load_op_mapping

    root = Path(database_path)
    if (root / MAPPING_FILE).is_file():
        device = load_op_mapping(root).device
        if device:
            return device
    manifest = root / MANIFEST
    if manifest.is_file():
        try:
            runs = json.loads(manifest.read_text(encoding="utf-8")).get("runs", [])
        except (json.JSONDecodeError, AttributeError):
            raise ConfigError("is not a collection manifest", source=str(manifest)) from None
        devices = {str(r.get("device")) for r in runs if isinstance(r, dict) and r.get("device")}
        if len({canonical_device(d) for d in devices}) == 1:
            return devices.pop()
    return ""


def backend_for_device(device: str) -> str | None:
    """The replay backend that runs on `device`, None when unknown."""
    name = canonical_device(device)
    if not name:
        return None
    if name.startswith("atlas") or "ascend" in name:
        return "npu"
    try:
        from perfcast.hardware import load_system

        vendor = load_system(name).device.vendor.lower()
    except ConfigError:  # not a catalog device: judge by its name
        vendor = ""
    if vendor in VENDOR_BACKENDS:
        return VENDOR_BACKENDS[vendor]
    return "cpu" if "cpu" in name else None


def database_device(database_path: Path, device: str = "") -> str:
    """The database's device: the declared one, else `device` (the `--device` flag); a
    ConfigError naming both when they disagree."""
    declared = declared_device(database_path)
    if declared and device and not same_device(declared, device):
        raise ConfigError(f"the database is for {declared}, not {device}",
                          source=str(database_path), field="--device",
                          expected=f"--device {declared} (or leave --device out)")
    return declared or device


def choose_backend(requested: str, device: str) -> str:
    """`requested` ("" or `auto`: the backend of `device`), checked against `device`."""
    requested = (requested or "auto").strip().lower()
    if requested not in (*BACKENDS, "auto"):
        raise ConfigError(f"unknown backend {requested!r}", field="--backend",
                          expected=" | ".join(("auto", *BACKENDS)))
    native = backend_for_device(device)
    if requested == "auto":
        if not device:
            raise ConfigError("the database declares no device, so no backend can be chosen",
                              field="--backend", expected="--device NAME or --backend "
                              + "|".join(BACKENDS))
        if native is None:
            raise ConfigError(f"no replay backend is known to run on {device}",
                              field="--backend", expected="--backend " + "|".join(BACKENDS))
        return native
    if native is not None and native != requested:
        raise ConfigError(f"backend {requested} would write {requested} timings into a "
                          f"database of {device}", field="--backend",
                          expected=f"--backend {native} (the default for {device})")
    return requested
