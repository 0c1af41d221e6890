"""What a profiling database was measured on and with (op_mapping.yaml `device`,
`version`, `cann_version`, `pytorch_version`), compared with the estimate it answers.

* device: the database's `device` against the estimate's system (catalog aliases
  resolve: `ATLAS_800_A3_752T_128G_DIE` = `atlas_800_a3_752t_128g_die`); a mismatch
  stops the estimate before any lookup (`estimate_sources.profiling_provider`);
* software: `version` (the vLLM-Ascend release) against `--runtime-version` when one is
  given. perfcast states no CANN or PyTorch version of its own, so `cann_version` and
  `pytorch_version` are not compared: the estimate takes them from the database. Every
  difference, and every field taken over unchecked, is a stated assumption, never an
  error: kernel times are assumed to carry over.
"""

from __future__ import annotations

from perfcast.evidence.profiling.devices import canonical_device, same_device
from perfcast.evidence.profiling.op_mapping import OpMapping

STACK_FIELDS = ("version", "cann_version", "pytorch_version")
LABELS = {"version": "version", "cann_version": "CANN", "pytorch_version": "PyTorch"}
# the estimate's flag for each field (None: perfcast has no such notion)
ESTIMATE_FLAGS = {"version": "--runtime-version", "cann_version": None,
                  "pytorch_version": None}


def _text(value) -> str:
    return str(value).strip() if value is not None else ""


def _same_version(a: str, b: str) -> bool:
    return a.lower().removeprefix("v") == b.lower().removeprefix("v")


def stack_compatibility(mapping: OpMapping, system: str, runtime_version: str = "") -> dict:
    """The database's device and stack, each compared with the estimate's: a JSON-ready
    dict with `compatibility` (per field: database, estimate, status), `assumptions`
    (every one stated) and `warnings` (those that deserve a look: a field that differs
    or that the database does not declare).

    status: `same`, `differs`, `not_stated` (the estimate states none), `undeclared`
    (op_mapping.yaml declares none)."""
    declared = mapping.device
    out: dict = {f: _text(mapping.metadata.get(f)) or None for f in STACK_FIELDS}
    compat: dict = {"device": {"database": declared or None,
                               "database_catalog_id": canonical_device(declared) or None,
                               "estimate": system, "same": same_device(declared, system)}}
    warnings: list[str] = []
    taken: list[str] = []
    asked = {"version": _text(runtime_version)}
    for f in STACK_FIELDS:
        db, est = out[f] or "", asked.get(f, "")
        flag = ESTIMATE_FLAGS[f]
        if not db:
            status = "undeclared"
        elif not est:
            status = "not_stated"
        else:
            status = "same" if _same_version(db, est) else "differs"
        compat[f] = {"database": db or None, "estimate": est or None, "status": status,
                     "estimate_flag": flag}
        if status == "differs":
            warnings.append(
                f"software stack: the profiling database was measured with {LABELS[f]} {db} "
                f"(op_mapping.yaml {f}), the estimate asks {est} ({flag}); its kernel times "
                f"are assumed to hold for {est}")
        elif status == "not_stated":
            taken.append(f"{LABELS[f]} {db}")
    missing = [f for f in STACK_FIELDS if compat[f]["status"] == "undeclared"]
    if missing:
        warnings.append(f"software stack: op_mapping.yaml declares no {', '.join(missing)}; "
                        "what its kernel times were measured with is unknown")
    assumptions = list(warnings)
    if taken:
        why = ("no --runtime-version given; perfcast states no CANN or PyTorch version"
               if compat["version"]["status"] == "not_stated" else
               "perfcast states no CANN or PyTorch version")
        assumptions.append("software stack: the estimate assumes the profiling database's "
                           f"{', '.join(taken)} ({why})")
    out.update(compatibility=compat, assumptions=assumptions, warnings=warnings)
    return out


def stack_summary(info: dict) -> str:
    """`version 0.18.0, CANN 8.5, PyTorch 2.9.0` of a `stack_compatibility` dict."""
    return ", ".join(f"{LABELS[f]} {info[f]}" for f in STACK_FIELDS if info.get(f)) \
        or "no software stack declared"
