"""`perfcast devices` and `perfcast models`: what ships with the package."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from perfcast.hardware import available_devices, load_system
from perfcast.workload import builtin_models, load_model_spec


def devices_command() -> None:
    """List the device catalog."""
    table = Table(title="device catalog")
    for col in ("id", "description", "bf16 TFLOPS", "memory GiB", "HBM GB/s", "tiers"):
        table.add_column(col)
    for name in available_devices():
        s = load_system(name)
        bf16 = s.device.engine("matrix").peak_ops_per_s.get("bf16", 0) / 1e12
        table.add_row(name, s.description, f"{bf16:g}", f"{s.device.memory.capacity_bytes / 2**30:g}",
                      f"{s.device.memory.bw_bytes_per_s / 1e9:g}",
                      ", ".join(f"{t.name}:{t.bw_bytes_per_s / 1e9:g}GB/s" for t in s.tiers))
    Console().print(table)


def models_command() -> None:
    """List the built-in model configs."""
    table = Table(title="built-in models")
    for col in ("id", "model_type", "layers", "hidden", "heads/kv"):
        table.add_column(col)
    for name in builtin_models():
        m = load_model_spec(name)
        table.add_row(name, m.model_type, str(m.num_layers), str(m.hidden_size),
                      f"{m.num_heads}/{m.num_kv_heads}")
    Console().print(table)
