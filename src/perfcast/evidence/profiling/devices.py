"""Device names of profiling evidence: what `op_mapping.yaml` declares (`device:`), what a
replayed row was measured on (`MicroBench Device`), and the system an estimate is for.

Names compare case-insensitively with `-` = `_`, and catalog aliases resolve to their
catalog name (`ATLAS_800_A3_752T_128G_DIE` = `atlas_800_a3_752t_128g_die`).
"""

from __future__ import annotations

from dataclasses import replace

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict


def canonical_device(name: str) -> str:
    """The comparable form of a device name ("" for none)."""
    text = str(name or "").strip()
    if not text:
        return ""
    from perfcast.hardware import resolve_device_name

    try:
        return resolve_device_name(text)
    except ConfigError:
        return text.lower().replace("-", "_")


def same_device(a: str, b: str) -> bool:
    """True when both name the same device (False when either is empty)."""
    ca, cb = canonical_device(a), canonical_device(b)
    return bool(ca) and ca == cb


def mark_foreign(estimate, measured_on: str, used_for: str):
    """`estimate` (a CostEstimate) saying that its evidence was measured on another
    system: an assumption and `validity["measured_on"]`."""
    note = (f"foreign evidence: measured on {measured_on or 'an undeclared device'}, used "
            f"for {used_for} (--allow-foreign-evidence)")
    return replace(estimate, assumptions=(*estimate.assumptions, note),
                   validity=FrozenDict({**estimate.validity,
                                        "measured_on": measured_on or "undeclared"}))
