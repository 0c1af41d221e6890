"""`op_mapping.yaml`: the runtime contract between TensorCast operator names and the
per-kernel profiling CSVs.

Loading is tolerant (unknown top-level and per-operator fields are kept in `extra` and
ignored, so newer mapping files still load) but strict about the types of the fields
the runtime consumes: a wrong type names the file, the operator and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from perfcast.core import yamlio
from perfcast.core.errors import ConfigError

MAPPING_FILE = "op_mapping.yaml"
CATEGORIES = ("compute", "communication")
QUERY_MODES = ("attention_special", "elementwise", "moe_fused")
COMM_PREFIX = "hcom_"

# Metadata that is allowed at top level but not consumed by lookup.
METADATA_FIELDS = ("version", "device", "cann_version", "pytorch_version", "op_plugin_version",
                   "collection_date", "communication_fallback", "torch_npu_reference")


@dataclass(frozen=True)
class OperatorMapping:
    """One entry of `operator_mappings`."""

    name: str
    kernel_type: str = ""
    alternate_kernel_types: tuple[str, ...] = ()
    category: str = "compute"
    query_mode: str = ""
    composite: bool = False
    sub_kernels: tuple[str, ...] = ()
    decomposer: bool = False
    tc_input_count: int | None = None
    zero_cost: bool = False
    accepted_miss: str = ""
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def kernel_types(self) -> tuple[str, ...]:
        """Primary kernel type then alternates, in priority order, without repeats."""
        out: list[str] = []
        for k in (self.kernel_type, *self.alternate_kernel_types):
            if k and k not in out:
                out.append(k)
        return tuple(out)

    @property
    def is_placeholder(self) -> bool:
        """`profiling.<Kernel>` entries document profiling-only kernels; never queried."""
        return self.name.startswith("profiling.")


@dataclass(frozen=True)
class OpMapping:
    source: str
    operator_mappings: dict[str, OperatorMapping]
    communication_data_ref: str = ""
    interpolation_policy: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def get(self, operator: str) -> OperatorMapping | None:
        return self.operator_mappings.get(operator)

    @property
    def device(self) -> str:
        """The device the database was measured on (top-level `device:`; "" if unsaid)."""
        return str(self.metadata.get("device") or "").strip()


def _typed(value: Any, kind: str, source: str, fld: str) -> Any:
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"has value {value!r}", source=source, field=fld,
                              expected="a string")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"has value {value!r}", source=source, field=fld,
                              expected="true or false")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"has value {value!r}", source=source, field=fld,
                              expected="a positive integer")
        return value
    if kind == "list":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"has value {value!r}", source=source, field=fld,
                              expected="a list of kernel type names")
        return tuple(value)
    raise AssertionError(kind)


_FIELD_KINDS = {
    "kernel_type": "str", "alternate_kernel_types": "list", "category": "str",
    "query_mode": "str", "composite": "bool", "sub_kernels": "list", "decomposer": "bool",
    "tc_input_count": "int", "zero_cost": "bool", "accepted_miss": "str", "notes": "str",
}


def parse_operator_mapping(name: str, node: Any, source: str) -> OperatorMapping:
    if not isinstance(node, dict):
        raise ConfigError(f"has value {node!r}", source=source,
                          field=f"operator_mappings.{name}", expected="a mapping")
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in node.items():
        kind = _FIELD_KINDS.get(key)
        if kind is None:
            extra[key] = value
        elif value is not None:
            values[key] = _typed(value, kind, source, f"operator_mappings.{name}.{key}")
    return OperatorMapping(name=name, extra=extra, **values)


def op_mapping_from_dict(data: Any, source: str) -> OpMapping:
    if not isinstance(data, dict):
        raise ConfigError("top level is not a mapping", source=source, expected="a mapping")
    ops = data.get("operator_mappings")
    if not isinstance(ops, dict):
        raise ConfigError("is missing or not a mapping", source=source,
                          field="operator_mappings",
                          expected="a mapping of operator name -> query configuration")
    mappings = {str(k): parse_operator_mapping(str(k), v, source) for k, v in ops.items()}
    comm_ref = data.get("communication_data_ref") or ""
    if not isinstance(comm_ref, str):
        raise ConfigError(f"has value {comm_ref!r}", source=source,
                          field="communication_data_ref", expected="a relative directory path")
    policy = data.get("interpolation_policy") or {}
    if not isinstance(policy, dict):
        raise ConfigError(f"has value {policy!r}", source=source, field="interpolation_policy",
                          expected="a mapping")
    metadata = {k: data[k] for k in METADATA_FIELDS if k in data}
    if metadata.get("device") is not None and not isinstance(metadata["device"], str):
        raise ConfigError(f"has value {metadata['device']!r}", source=source, field="device",
                          expected="the device name the database was measured on")
    return OpMapping(source=source, operator_mappings=mappings, communication_data_ref=comm_ref,
                     interpolation_policy=policy, metadata=metadata)


def load_op_mapping(path: str | Path) -> OpMapping:
    """Load an `op_mapping.yaml` file, or the one inside a database directory."""
    p = Path(path)
    if p.is_dir():
        p = p / MAPPING_FILE
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read op mapping: {exc.strerror}", source=str(p),
                          expected=f"a profiling database directory holding {MAPPING_FILE}"
                          ) from None
    try:
        data = yamlio.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"is not valid YAML: {exc}", source=str(p)) from None
    return op_mapping_from_dict(data, str(p))
