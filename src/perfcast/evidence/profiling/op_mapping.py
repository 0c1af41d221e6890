"""`op_mapping.yaml`: the runtime contract between TensorCast operator names and the
per-kernel profiling CSVs.

Loading is tolerant (unknown top-level and per-operator fields are kept in `extra`; the
fields of the real CANN 8.5 mapping `profiling validate` reports on are listed in
docs/profiling.md) but strict about the types of the fields the runtime consumes: a
wrong type or value names the file, the operator and the field.
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
QUERY_MODES = ("attention_special", "elementwise", "moe_fused", "mtp_projection")
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
    # MoE-fused (DispatchFFNCombine) fields, checked at load (`parse_moe_fields`)
    project_full_shape: bool = False
    embedded_compute: tuple[dict, ...] = field(default=(), compare=False)
    embedded_communication: dict | None = field(default=None, compare=False)
    # {runtime switch: comm variant}; only `sequence_parallel` (`parse_comm_variants`)
    runtime_comm_variants: dict[str, dict] = field(default_factory=dict, compare=False)
    # TP shape contract of a linear (`parse_tp_projection`): (shard_axis, logical dims)
    tp_linear_projection: tuple[str, tuple[int, ...]] | None = None
    # a decomposed composite with a sub-kernel miss has no measured answer (no PARTIAL)
    require_all_sub_kernels: bool = False
    # kernel of a degenerate K=1 bmm (appended to the compute candidates)
    degenerate_bmm_kernel_type: str = ""
    # `query_mode: mtp_projection`: the kernel of the 2H -> H concat projection
    mtp_projection_kernel_type: str = ""
    # read by TensorCast's dsa_indexer decomposer (perfcast has none; validate flags it)
    primary_kernel_type: str = ""
    # interpolation regime (`COMPUTE_SUBCATEGORIES`) and the input formats it matches
    compute_subcategory: str = ""
    expected_input_formats: tuple[str, ...] = ()
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
    # `latency_policy.kernel_overrides` / `query_selection_policy.kernel_overrides`:
    # {kernel type: {option: value}} (`parse_kernel_policies`)
    latency_overrides: dict[str, dict] = field(default_factory=dict)
    selection_overrides: dict[str, dict] = field(default_factory=dict)

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
    if kind == "formats":
        if not isinstance(value, list) or not value or not all(
                isinstance(v, str) and v.strip() for v in value):
            raise ConfigError(f"has value {value!r}", source=source, field=fld,
                              expected="a list of tensor formats (ND, FRACTAL_NZ), one per "
                                       "matched input")
        return tuple(v.strip() for v in value)
    raise AssertionError(kind)


_FIELD_KINDS = {
    "kernel_type": "str", "alternate_kernel_types": "list", "category": "str",
    "query_mode": "str", "composite": "bool", "sub_kernels": "list", "decomposer": "bool",
    "tc_input_count": "int", "zero_cost": "bool", "accepted_miss": "str", "notes": "str",
    "require_all_sub_kernels": "bool", "degenerate_bmm_kernel_type": "str",
    "mtp_projection_kernel_type": "str", "primary_kernel_type": "str",
    "compute_subcategory": "str", "expected_input_formats": "formats",
}

# TensorCast's values (profiling_data_source.py `_lookup_moe`, `_lookup_composite`;
# interpolating_data_source.py `_interpolate` for the compute subcategories)
COMPUTE_SUBCATEGORIES = ("compute_scale", "quantized_matmul")
EMBEDDED_PROJECTIONS = ("residual_norm_from_activation", "routing_weight_cast")
COMM_INTERPOLATIONS = ("alpha_beta", "bracket_linear")
LATENCY_OPTIONS = {"prefer_profiling_rows", "profiling_core_envelope_fallback"}
SELECTION_OPTIONS = {"require_semantic_unique"}


def _bad(value: Any, source: str, fld: str, expected: str) -> ConfigError:
    return ConfigError(f"has value {value!r}", source=source, field=fld, expected=expected)


def _check_keys(node: Any, allowed: dict[str, tuple], source: str, fld: str) -> dict:
    """`node` as a mapping whose keys are in `allowed` ({key: (required?, check, what)})
    and whose values pass their checks."""
    if not isinstance(node, dict):
        raise _bad(node, source, fld, "a mapping")
    for key in node:
        if key not in allowed:
            raise ConfigError(f"has unknown field {key!r}", source=source, field=fld,
                              expected=" | ".join(allowed))
    for key, (required, check, what) in allowed.items():
        if key not in node:
            if required:
                raise ConfigError(f"lacks {key!r}", source=source, field=fld, expected=what)
            continue
        if not check(node[key]):
            raise _bad(node[key], source, f"{fld}.{key}", what)
    return dict(node)


def _is_hcom(v: Any) -> bool:
    return isinstance(v, str) and v.startswith(COMM_PREFIX)


def _is_name(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def parse_moe_fields(name: str, node: dict, source: str) -> dict[str, Any]:
    """`project_full_shape`, `embedded_compute` (one spec or a list) and
    `embedded_communication` of a MoE-fused entry, as TensorCast's `_lookup_moe` reads
    them."""
    out: dict[str, Any] = {}
    fld = f"operator_mappings.{name}"
    if node.get("project_full_shape") is not None:
        out["project_full_shape"] = _typed(node["project_full_shape"], "bool", source,
                                           f"{fld}.project_full_shape")
    if node.get("embedded_compute") is not None:
        specs = node["embedded_compute"]
        specs = specs if isinstance(specs, list) else [specs]
        checked = []
        for i, spec in enumerate(specs):
            f = f"{fld}.embedded_compute[{i}]"
            spec = _check_keys(spec, {
                "input_projection": (True, lambda v: v in EMBEDDED_PROJECTIONS,
                                     " | ".join(EMBEDDED_PROJECTIONS)),
                "kernel_type": (True, _is_name, "a kernel type name"),
                "output_dtype": (False, _is_name, "a CSV data type (e.g. FLOAT)"),
                "flatten_leading_dims": (False, lambda v: isinstance(v, bool), "true or false"),
            }, source, f)
            if spec["input_projection"] == "routing_weight_cast" and "output_dtype" not in spec:
                raise ConfigError("lacks 'output_dtype'", source=source, field=f,
                                  expected="the CSV data type the cast writes (e.g. FLOAT)")
            checked.append(spec)
        out["embedded_compute"] = tuple(checked)
    if node.get("embedded_communication") is not None:
        out["embedded_communication"] = _check_keys(node["embedded_communication"], {
            "kernel_type": (True, _is_hcom, f"a {COMM_PREFIX}* kernel type"),
            "message_bytes_mode": (True, lambda v: v == "routed_input",
                                   "routed_input (x bytes times top-k)"),
            "group_type": (False, lambda v: v in (None, "expert_parallel"),
                           "expert_parallel"),
            "interpolation_method": (False, lambda v: v in COMM_INTERPOLATIONS,
                                     " | ".join(COMM_INTERPOLATIONS)),
        }, source, f"{fld}.embedded_communication")
    for key in ("project_full_shape", "embedded_compute", "embedded_communication"):
        if node.get(key) and node.get("query_mode") != "moe_fused":
            raise ConfigError(f"is set on a {node.get('query_mode') or 'compute'} entry",
                              source=source, field=f"{fld}.{key}",
                              expected="query_mode: moe_fused (the DispatchFFNCombine path "
                                       "is the only one that reads it)")
    return out


def parse_comm_variants(name: str, node: Any, sub_kernels: tuple[str, ...], source: str
                        ) -> dict[str, dict]:
    """`runtime_comm_variants` of a static composite: `sequence_parallel` replaces the
    `source_kernel_type` collective (TensorCast's `_lookup_composite`)."""
    fld = f"operator_mappings.{name}.runtime_comm_variants"
    if not isinstance(node, dict):
        raise _bad(node, source, fld, "a mapping of runtime switch -> comm variant")
    out = {}
    for switch, spec in node.items():
        if switch != "sequence_parallel":
            raise ConfigError(f"has unknown runtime switch {switch!r}", source=source,
                              field=fld, expected="sequence_parallel")
        spec = _check_keys(spec, {
            "source_kernel_type": (True, _is_hcom, f"one of the {COMM_PREFIX}* sub_kernels"),
            "kernel_type": (True, _is_hcom, f"a {COMM_PREFIX}* kernel type"),
            "message_bytes_mode": (False, lambda v: v in ("full_output", "per_rank_output"),
                                   "full_output | per_rank_output"),
            "group_type": (False, lambda v: v in (None, "tensor_parallel"), "tensor_parallel"),
            "interpolation_method": (False, lambda v: v in COMM_INTERPOLATIONS,
                                     " | ".join(COMM_INTERPOLATIONS)),
        }, source, f"{fld}.{switch}")
        if spec["source_kernel_type"] not in sub_kernels:
            raise ConfigError(f"names {spec['source_kernel_type']!r}, not one of the "
                              "entry's sub_kernels", source=source,
                              field=f"{fld}.{switch}.source_kernel_type",
                              expected=" | ".join(k for k in sub_kernels if _is_hcom(k)))
        out[switch] = spec
    return out


def _check_envelope(v: Any) -> bool:
    if not isinstance(v, dict) or set(v) != {"max_duration_to_core_ratio"}:
        return False
    r = v["max_duration_to_core_ratio"]
    return isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0


def parse_kernel_policies(data: dict, key: str, source: str) -> dict[str, dict]:
    """`{key}.kernel_overrides` ({kernel type: options}) of `latency_policy` or
    `query_selection_policy`."""
    node = data.get(key)
    if node is None:
        return {}
    node = _check_keys(node, {"kernel_overrides": (True, lambda v: isinstance(v, dict),
                                                   "a mapping of kernel type -> options")},
                       source, key)
    options = {
        "prefer_profiling_rows": (False, lambda v: isinstance(v, bool), "true or false"),
        "profiling_core_envelope_fallback": (
            False, _check_envelope, "{max_duration_to_core_ratio: a positive number}"),
    } if key == "latency_policy" else {
        "require_semantic_unique": (False, lambda v: isinstance(v, bool), "true or false")}
    return {str(k): _check_keys(v, options, source, f"{key}.kernel_overrides.{k}")
            for k, v in node["kernel_overrides"].items()}


def parse_tp_projection(name: str, node: Any, source: str) -> tuple[str, tuple[int, ...]]:
    """`tp_linear_projection`: `shard_axis` input | output, `logical_global_dims` (positive
    ints), `otherwise: physical_local` (the only mode TensorCast defines)."""
    fld = f"operator_mappings.{name}.tp_linear_projection"
    if not isinstance(node, dict):
        raise _bad(node, source, fld, "a mapping of shard_axis, logical_global_dims, otherwise")
    unknown = set(node) - {"shard_axis", "logical_global_dims", "otherwise"}
    if unknown:
        raise _bad(sorted(unknown), source, fld, "shard_axis, logical_global_dims, otherwise")
    axis, dims = node.get("shard_axis"), node.get("logical_global_dims")
    if axis not in ("input", "output"):
        raise _bad(axis, source, fld + ".shard_axis", "input | output")
    if (not isinstance(dims, list) or not dims
            or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in dims)):
        raise _bad(dims, source, fld + ".logical_global_dims", "a list of positive integers")
    if node.get("otherwise", "physical_local") != "physical_local":
        raise _bad(node.get("otherwise"), source, fld + ".otherwise", "physical_local")
    return axis, tuple(dims)


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
    for key in ("project_full_shape", "embedded_compute", "embedded_communication",
                "runtime_comm_variants", "tp_linear_projection"):
        extra.pop(key, None)
    if node.get("tp_linear_projection") is not None:
        values["tp_linear_projection"] = parse_tp_projection(
            name, node["tp_linear_projection"], source)
    values.update(parse_moe_fields(name, node, source))
    if node.get("runtime_comm_variants") is not None:
        if not values.get("composite") or not values.get("sub_kernels"):
            raise ConfigError("is set on an entry without composite sub_kernels",
                              source=source, field=f"operator_mappings.{name}"
                              ".runtime_comm_variants",
                              expected="a composite entry whose sub_kernels hold the "
                                       "collective it replaces")
        values["runtime_comm_variants"] = parse_comm_variants(
            name, node["runtime_comm_variants"], values["sub_kernels"], source)
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
                     interpolation_policy=policy, metadata=metadata,
                     latency_overrides=parse_kernel_policies(data, "latency_policy", source),
                     selection_overrides=parse_kernel_policies(
                         data, "query_selection_policy", source))


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
