"""`InterpolatingDataSource(base)`: an explicit opt-in wrapper that, after an exact miss
(or a PARTIAL composite), interpolates between two measured rows that bracket the query.

| path               | axis                                                   |
|--------------------|--------------------------------------------------------|
| compute            | first dim of the first input (all else exact), or the  |
| (mtp_projection)   | M axis of the `compute_subcategory` regime (below)     |
| attention special  | avg_seq_len                                            |
| elementwise        | first dim of the output (dtype-byte scaling allowed)   |
| decomposer         | each missed sub-kernel by its own path, then summed    |
| static composite,  | not interpolated (exact ProfilingDataSource answer)    |
| communication, MoE |                                                        |

Both a lower and an upper measured point are required: it never extrapolates.

Answers are `source=INTERPOLATED`; their `rel_std` and confidence are measured by
leave-one-out on the same bracketing rows (`residuals.line_details`), or unknown with a
reason when the line has too few rows.

The mapping's `interpolation_policy` (TensorCast's fields) is honoured, or refused with
a ConfigError naming the field; nothing in it is ignored (`interpolation_policy()`):

* `kernel_overrides.<Kernel>.max_interpolation_dim`: the most axes one interpolation may
  vary. perfcast varies one axis, so 1 or more allows it and 0 turns interpolation off
  for that kernel;
* `kernel_overrides.<Kernel>.axis_transform` (TensorCast's older `shape_transform`):
  `linear`, or `sqrt_seq` (`sqrt`): interpolate in the square root of the axis, on
  whichever path the kernel is queried;
* `kernel_overrides.<Kernel>.generic_compute.axis`: the compute-path axis, `axis_0`
  (default: first dim of the first input, every other input exact) or `output_numel`
  (the output's element count; the output's trailing dims, input count and input dtypes
  exact, input shapes free). A primary kernel's setting also covers its alternates;
* `allow_extrapolation: false` (top level or per kernel) is what perfcast does; `true`
  is refused. Any other field, and an operator-level `interpolation_policy`, is refused.

An operator's `compute_subcategory` replaces the compute path's axis, as TensorCast's
`_interpolate` does (its multi-axis searches reduced to perfcast's one axis):

* `quantized_matmul` (`_interpolate_compute_multidim`, `_build_compute_target`): M from
  the 2-D activation, K its width, N the 2-D output's; rows of the same regime (input
  count, input dtypes, no batch dims, the input formats `expected_input_formats` names,
  output count, output dtypes, ND outputs) with the query's K and N, bracketed on M;
* `compute_scale` (`_interpolate_compute_scale`): M = the first input's leading dims'
  product, K its last dim; rows whose quantised output has the input's shape and whose
  other outputs give the same scale modes (per_tensor / per_token / per_channel /
  per_block with its block size for DynamicBlockQuant), with the same input dtype
  (fp16 and bf16 apart), ND input, output count, dtypes and ND formats, and the query's
  K, bracketed on M;
* any other value misses (`compute_subcategory_unknown`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from perfcast.core.dtypes import dtype_bytes, parse_dtype
from perfcast.core.errors import ConfigError
from perfcast.evidence.profiling.data_source import (
    DataSourcePerformanceModel,
    LookupMiss,
    LookupOutcome,
    QueryResult,
    QuerySource,
    ShapeMatchInfo,
)
from perfcast.evidence.profiling.kernel_csv import (
    INPUT_DTYPES,
    OUTPUT_DTYPES,
    OUTPUT_FORMATS,
    KernelRow,
    KernelTable,
    parse_list,
    query_dtype,
)
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import COMPUTE_SUBCATEGORIES, OpMapping, OperatorMapping
from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
from perfcast.evidence.profiling.query_paths.attention import (
    AVG_SEQ_COLUMNS,
    AVG_SEQ_LEN_TOLERANCE,
    AttentionParams,
    attention_row,
    params_for,
)
from perfcast.evidence.profiling.query_paths.common import (
    Candidate,
    kernel_list,
    shapes_of,
    tc_inputs,
)
from perfcast.evidence.profiling.query_paths.composite import lookup_decomposed, query_sub_kernel
from perfcast.evidence.profiling.query_paths.elementwise import output_shape_matches
from perfcast.evidence.profiling.residuals import confidence_of, line_details
from perfcast.evidence.profiling.shape_rules import (
    DEFAULT_RULE,
    KERNEL_RULES,
    RELAXED_DTYPE_GROUPS,
    fractal_nz_to_nd,
    match_inputs,
    strip_batch_dim,
)

TRANSFORMS: dict[str, Callable[[float], float]] = {"linear": float, "sqrt_seq": math.sqrt}
# policy spellings -> TRANSFORMS keys (TensorCast accepts `sqrt` for `sqrt_seq`)
TRANSFORM_NAMES = {"linear": "linear", "sqrt_seq": "sqrt_seq", "sqrt": "sqrt_seq"}
GENERIC_AXES = ("axis_0", "output_numel")
KERNEL_FIELDS = ("max_interpolation_dim", "axis_transform", "shape_transform",
                 "generic_compute", "allow_extrapolation")
POLICY = "interpolation_policy"


@dataclass(frozen=True)
class KernelPolicy:
    """One `interpolation_policy.kernel_overrides.<Kernel>` entry ("" = not set)."""

    max_interpolation_dim: int | None = None
    axis_transform: str = ""
    generic_axis: str = ""

    @property
    def enabled(self) -> bool:
        """perfcast interpolates along one axis: allowed unless the ceiling is 0."""
        return self.max_interpolation_dim is None or self.max_interpolation_dim >= 1


def _no_extrapolation(value, source: str, fld: str) -> None:
    if value is not False:
        raise ConfigError(f"has value {value!r}", source=source, field=fld,
                          expected="false (perfcast never extrapolates) or leave it out")


def _kernel_policy(node, source: str, fld: str) -> KernelPolicy:
    if node is None:
        return KernelPolicy()
    if not isinstance(node, dict):
        raise ConfigError(f"has value {node!r}", source=source, field=fld,
                          expected="a mapping of " + ", ".join(KERNEL_FIELDS))
    values: dict = {}
    for key, value in node.items():
        where = f"{fld}.{key}"
        if key == "max_interpolation_dim":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"has value {value!r}", source=source, field=where,
                                  expected="an integer >= 0 (0: no interpolation for this "
                                           "kernel; perfcast varies one axis)")
            values["max_interpolation_dim"] = value
        elif key in ("axis_transform", "shape_transform"):
            name = TRANSFORM_NAMES.get(value) if isinstance(value, str) else None
            if name is None:
                raise ConfigError(f"has value {value!r}", source=source, field=where,
                                  expected=" | ".join(TRANSFORM_NAMES))
            if values.get("axis_transform", name) != name:
                raise ConfigError("axis_transform and shape_transform disagree",
                                  source=source, field=where, expected="one of them")
            values["axis_transform"] = name
        elif key == "generic_compute":
            if value is None:
                continue
            if not isinstance(value, dict) or set(value) - {"axis"}:
                raise ConfigError(f"has value {value!r}", source=source, field=where,
                                  expected="{axis: " + " | ".join(GENERIC_AXES) + "}")
            axis = value.get("axis", "axis_0")
            if axis not in GENERIC_AXES:
                raise ConfigError(f"has value {axis!r}", source=source, field=f"{where}.axis",
                                  expected=" | ".join(GENERIC_AXES))
            values["generic_axis"] = axis
        elif key == "allow_extrapolation":
            _no_extrapolation(value, source, where)
        else:
            raise ConfigError("is not supported by perfcast's interpolation", source=source,
                              field=where, expected="one of " + ", ".join(KERNEL_FIELDS))
    return KernelPolicy(**values)


def interpolation_policy(mapping: OpMapping) -> dict[str, KernelPolicy]:
    """The mapping's `interpolation_policy` per kernel type; a ConfigError naming any
    field perfcast would not honour."""
    source, policy = mapping.source, mapping.interpolation_policy or {}
    for name, entry in mapping.operator_mappings.items():
        if POLICY in entry.extra:
            raise ConfigError("an operator-level interpolation_policy is not supported",
                              source=source, field=f"operator_mappings.{name}.{POLICY}",
                              expected=f"per-kernel settings in the top-level {POLICY}."
                                       "kernel_overrides.<Kernel>")
    for key, value in policy.items():
        if key == "allow_extrapolation":
            _no_extrapolation(value, source, f"{POLICY}.{key}")
        elif key != "kernel_overrides":
            raise ConfigError("is not supported by perfcast's interpolation", source=source,
                              field=f"{POLICY}.{key}",
                              expected="kernel_overrides.<Kernel> (" + ", ".join(KERNEL_FIELDS)
                                       + ") or allow_extrapolation: false")
    overrides = policy.get("kernel_overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"has value {overrides!r}", source=source,
                          field=f"{POLICY}.kernel_overrides",
                          expected="a mapping of kernel type -> settings")
    return {str(k): _kernel_policy(v, source, f"{POLICY}.kernel_overrides.{k}")
            for k, v in overrides.items()}


def numel_shape(shape: Shape) -> Shape:
    """TensorCast's canonical output shape for `output_numel`: a leading 1 of a rank-3+
    shape dropped."""
    return tuple(shape[1:]) if len(shape) >= 3 and shape[0] == 1 else tuple(shape)


Shape = tuple[int, ...]
Point = tuple[float, float, KernelTable, KernelRow]  # (x, latency_us, table, row)

# matmul kernels whose operands keep their batch dims (TensorCast's _BATCHED_MATMUL_KERNELS)
BATCHED_MATMULS = frozenset({"BatchMatMulV2", "BatchMatMulNd", "TransposeBatchMatMul",
                             "QuantBatchMatmulV3"})


def matmul_axes(kernel_type: str, shapes: Sequence[Shape]
                ) -> tuple[int, int, int, tuple[Shape, Shape]] | None:
    """(M, K, N, batch dims) of a matmul's (x, w) as TensorCast's
    `_extract_matmul_axes_from_shapes` reads them: a leading 1 of a rank-3+ operand
    dropped unless the kernel is batched, w as (K, N) or (N, K)."""
    if len(shapes) < 2:
        return None
    lhs, rhs = tuple(shapes[0]), tuple(shapes[1])
    if kernel_type not in BATCHED_MATMULS:
        lhs, rhs = (x[1:] if len(x) >= 3 and x[0] == 1 else x for x in (lhs, rhs))
    if len(lhs) < 2 or len(rhs) < 2:
        return None
    m, k = lhs[-2], lhs[-1]
    if rhs[-2] == k:
        n = rhs[-1]
    elif rhs[-1] == k:
        n = rhs[-2]
    else:
        return None
    return m, k, n, (lhs[:-2], rhs[:-2])


def dtype_key(kernel_type: str, dtype: str | None) -> str | None:
    """A dtype as a regime compares it: the kernels with relaxed dtypes treat each group
    of RELAXED_DTYPE_GROUPS as one (TensorCast's `_dtype_key`)."""
    if dtype is not None and KERNEL_RULES.get(kernel_type, DEFAULT_RULE).relaxed_dtype:
        for group in RELAXED_DTYPE_GROUPS:
            if dtype in group:
                return "|".join(sorted(group))
    return dtype


def exact_dtypes(text: str) -> tuple[str, ...]:
    """A dtype cell with fp16 and bf16 kept apart (the compute_scale regime's; the other
    paths read fp16 rows as bf16)."""
    out = []
    for t in parse_list(text):
        try:
            out.append(parse_dtype(t).value)
        except ConfigError:
            out.append(t.lower())
    return tuple(out)


def scale_mode(kernel_type: str, x: Shape, scale: Shape) -> tuple[str, int | None] | None:
    """How a quantiser's auxiliary output `scale` covers its input `x` (TensorCast's
    `_compute_scale_mode`): per_tensor (0-d), per_token (one per row of the leading
    dims), per_channel (one per last-dim element), per_block with its block size
    (DynamicBlockQuant); None if neither."""
    if not x or min(x) <= 0 or any(d < 0 for d in scale) or math.prod(scale) <= 0:
        return None
    if not scale:
        return "per_tensor", None
    numel, tokens, channels = math.prod(scale), math.prod(x[:-1]), x[-1]
    if kernel_type == "DynamicBlockQuant":
        if len(scale) != 1 or numel > channels:
            return None
        return "per_block", -(-channels // numel)
    if numel == tokens:
        return "per_token", None
    if numel == channels:
        return "per_channel", None
    return None


def logical(shape: Shape, fmt: str) -> Shape:
    return fractal_nz_to_nd(shape) if fmt == "FRACTAL_NZ" else tuple(shape)


def bracket(points: Sequence[Point], x: float, transform: Callable[[float], float] = float
            ) -> tuple[float, Point, Point] | None:
    """Linear interpolation between the nearest points at or below and above `x`
    (first row wins among equal x); None unless both sides exist."""
    lo = hi = None
    for p in points:
        if p[0] <= x and (lo is None or p[0] > lo[0]):
            lo = p
        if p[0] >= x and (hi is None or p[0] < hi[0]):
            hi = p
    if lo is None or hi is None:
        return None
    if hi[0] == lo[0]:
        return lo[1], lo, hi
    tx, tlo, thi = transform(x), transform(lo[0]), transform(hi[0])
    value = lo[1] + (hi[1] - lo[1]) * (tx - tlo) / (thi - tlo)
    return value, lo, hi


def _candidate(kernel_type: str, axis: str, x: float, found, points: Sequence[Point],
               transform: str = "linear") -> Candidate:
    value, lo, hi = found
    ids = [lo[2].record_id(lo[3])] + ([hi[2].record_id(hi[3])] if hi[3] is not lo[3] else [])
    key = (lo[2].sha256, kernel_type, axis, tuple(p[3].index for p in points))
    unc = line_details(key, [p[0] for p in points], [p[1] for p in points], x, lo[0], hi[0],
                       axis, transform, TRANSFORMS[transform])
    return Candidate(value, kernel_type, lo[2], lo[3], rule=f"interpolated:{axis}",
                     confidence=confidence_of(unc),
                     details={"interpolated": True, "interpolation_axis": axis,
                              "interpolation_x": x, "bracket": [lo[0], hi[0]],
                              "transform": transform, "record_ids": ids, **unc})


class InterpolatingDataSource(DataSourcePerformanceModel):
    def __init__(self, base: ProfilingDataSource) -> None:
        self.base = base
        self.policy: dict[str, KernelPolicy] = interpolation_policy(base.mapping)

    @property
    def identity(self) -> str:
        return self.base.identity + "+interpolation"

    def kernel_policy(self, kernel_type: str) -> KernelPolicy:
        return self.policy.get(kernel_type) or KernelPolicy()

    def transform_for(self, kernel_type: str, default: str = "linear") -> str:
        return self.kernel_policy(kernel_type).axis_transform or default

    def generic_axis(self, kernel_type: str, primary: str = "") -> str:
        """The compute axis of `kernel_type`: its own `generic_compute`, else that of the
        operator's primary kernel type, else `axis_0`."""
        return (self.kernel_policy(kernel_type).generic_axis
                or (self.kernel_policy(primary).generic_axis if primary else "") or "axis_0")

    # -- per-path interpolation ------------------------------------------------------
    def compute_candidate(self, kernel_types: Sequence[str], inputs: list[tuple[Shape, str]],
                          tc_input_count: int | None, outputs: Sequence[Shape] = (),
                          primary: str = "") -> Candidate | None:
        if not inputs or not inputs[0][0]:
            return None
        target = inputs[0][0][0]
        for kt in kernel_types:
            table = self.base.tables.get(kt)
            if table is None or not self.kernel_policy(kt).enabled:
                continue
            if self.generic_axis(kt, primary) == "output_numel":
                cand = self.output_numel_candidate(table, inputs, tc_input_count, outputs)
                if cand is not None:
                    return cand
                continue
            points: list[Point] = []
            for row in table.rows:
                for x in sorted({s[0] for s in row.input_shapes if s}):
                    trial = [((x, *inputs[0][0][1:]), inputs[0][1]), *inputs[1:]]
                    if match_inputs(kt, trial, row, tc_input_count) is not None:
                        points.append((float(x), row.latency_us, table, row))
                        break
            found = bracket(points, float(target), TRANSFORMS[self.transform_for(kt)])
            if found is not None:
                return _candidate(kt, "dim0", float(target), found, points,
                                  self.transform_for(kt))
        return None

    def output_numel_candidate(self, table: KernelTable, inputs: list[tuple[Shape, str]],
                               tc_input_count: int | None, outputs: Sequence[Shape]
                               ) -> Candidate | None:
        """`generic_compute.axis: output_numel`: rows with the query's output trailing dims,
        input count and input dtypes, bracketed on the output's element count."""
        if len(outputs) != 1 or not outputs[0]:
            return None
        want = numel_shape(outputs[0])
        dtypes = tuple(d for _, d in inputs)
        points: list[Point] = []
        for row in table.rows:
            if len(row.output_shapes) != 1:
                continue
            got = numel_shape(row.output_shapes[0])
            row_dtypes = row.input_dtypes[:tc_input_count] if tc_input_count is not None \
                else row.input_dtypes
            if got[1:] != want[1:] or tuple(row_dtypes) != dtypes:
                continue
            points.append((float(math.prod(got)), row.latency_us, table, row))
        kt = table.kernel_type
        x = float(math.prod(want))
        found = bracket(points, x, TRANSFORMS[self.transform_for(kt)])
        if found is None:
            return None
        return _candidate(kt, "output_numel", x, found, points, self.transform_for(kt))

    def subcategory_candidate(self, op: OpInvokeInfo, m: OperatorMapping
                              ) -> Candidate | LookupMiss | None:
        """The interpolation an operator's `compute_subcategory` selects (module doc)."""
        if m.compute_subcategory == "quantized_matmul":
            return self.quantized_matmul_candidate(op, m)
        if m.compute_subcategory == "compute_scale":
            return self.compute_scale_candidate(op, m)
        sim = tuple(tuple(t.shape) for t in op.tensor_inputs())
        return LookupMiss("compute_subcategory_unknown",
                          f"{m.name}: compute_subcategory {m.compute_subcategory!r} is not one "
                          f"of {', '.join(COMPUTE_SUBCATEGORIES)}",
                          ShapeMatchInfo(sim, (), "compute_subcategory_unknown"))

    def _bracket_m(self, kt: str, sub: str, points: list[Point], m: int) -> Candidate | None:
        t = self.transform_for(kt)
        found = bracket(points, float(m), TRANSFORMS[t])
        if found is None:
            return None
        cand = _candidate(kt, "M", float(m), found, points, t)
        return replace(cand, details={**cand.details, "compute_subcategory": sub,
                                      "interpolation_path": f"{sub}_1d"})

    def quantized_matmul_candidate(self, op: OpInvokeInfo, m: OperatorMapping
                                   ) -> Candidate | LookupMiss | None:
        ins = tc_inputs(op, m.tc_input_count)
        if len(ins) < 2 or not op.outputs:
            return None
        x, out = ins[0][0], tuple(op.outputs[0].shape)
        if len(x) != 2 or len(out) != 2 or x[0] != out[0] or min(*x, *out) <= 0:
            return None
        count = m.tc_input_count if m.tc_input_count is not None else len(ins)
        formats = m.expected_input_formats
        if len(formats) != count:
            reason = "quantized_matmul_formats_mismatch"
            return LookupMiss(reason, f"{m.name}: expected_input_formats {list(formats)} for "
                              f"{count} matched inputs", ShapeMatchInfo(shapes_of(ins), (), reason))
        out_dtypes = tuple(query_dtype(t.dtype) for t in op.outputs)
        for kt in m.kernel_types:
            table = self.base.tables.get(kt)
            rule = KERNEL_RULES.get(kt, DEFAULT_RULE)
            if table is None or not rule.weight_transpose or not self.kernel_policy(kt).enabled:
                continue
            want = tuple(dtype_key(kt, d) for _, d in ins[:count])
            points: list[Point] = []
            for row in table.rows:
                shapes, fmts = row.input_shapes[:count], row.input_formats[:count]
                if len(shapes) != count or tuple(fmts) != formats or tuple(
                        dtype_key(kt, d) for d in row.input_dtypes[:count]) != want:
                    continue
                axes = matmul_axes(kt, [logical(sh, f) for sh, f in zip(shapes, fmts)])
                if axes is None or axes[3] != ((), ()) or (axes[1], axes[2]) != (x[1], out[1]):
                    continue
                outs = row.output_shapes
                if (tuple(row.output_dtypes) != out_dtypes or len(outs) != len(out_dtypes)
                        or parse_list(row.text(OUTPUT_FORMATS)) != ["ND"] * len(outs)):
                    continue
                points.append((float(axes[0]), row.latency_us, table, row))
            cand = self._bracket_m(kt, "quantized_matmul", points, x[0])
            if cand is not None:
                return cand
        return None

    def compute_scale_candidate(self, op: OpInvokeInfo, m: OperatorMapping
                                ) -> Candidate | None:
        ins = op.tensor_inputs()
        if not ins or len(op.outputs) < 2:
            return None
        x = tuple(ins[0].shape)
        if not x or min(x) <= 0 or tuple(op.outputs[0].shape) != x:
            return None
        in_dt = parse_dtype(ins[0].dtype).value
        out_dts = tuple(parse_dtype(t.dtype).value for t in op.outputs)
        tokens, k = math.prod(x[:-1]), x[-1]
        for kt in m.kernel_types:
            table = self.base.tables.get(kt)
            if table is None or not self.kernel_policy(kt).enabled:
                continue
            modes = [scale_mode(kt, x, tuple(t.shape)) for t in op.outputs[1:]]
            if None in modes:
                continue
            points: list[Point] = []
            for row in table.rows:
                if not row.input_shapes or row.input_formats[0] != "ND":
                    continue
                row_x, outs = tuple(row.input_shapes[0]), row.output_shapes
                row_dt = exact_dtypes(row.text(INPUT_DTYPES))[:1]
                if (len(outs) != len(out_dts) or tuple(outs[0]) != row_x or row_x[-1] != k
                        or parse_list(row.text(OUTPUT_FORMATS)) != ["ND"] * len(outs)
                        or [dtype_key(kt, d) for d in row_dt] != [dtype_key(kt, in_dt)]
                        or exact_dtypes(row.text(OUTPUT_DTYPES)) != out_dts
                        or [scale_mode(kt, row_x, tuple(o)) for o in outs[1:]] != modes):
                    continue
                points.append((float(math.prod(row_x[:-1])), row.latency_us, table, row))
            cand = self._bracket_m(kt, "compute_scale", points, tokens)
            if cand is not None:
                return cand
        return None

    def attention_candidate(self, kernel_types: Sequence[str], p: AttentionParams
                            ) -> Candidate | None:
        for kt in kernel_types:
            table = self.base.tables.get(kt)
            if table is not None and not self.kernel_policy(kt).enabled:
                continue
            col = next((c for c in AVG_SEQ_COLUMNS if table is not None and table.has(c)), None)
            if table is None or col is None:
                continue
            points: list[Point] = []
            for row in table.rows:
                s = row.number(col)
                if s is None or s < 0:
                    continue
                # every attribute but avg_seq_len must match exactly
                if attention_row(table, row, p, tolerance=math.inf) is None:
                    continue
                points.append((s, row.latency_us, table, row))
            t = self.transform_for(kt, "linear")
            found = bracket(points, float(p.avg_seq_len), TRANSFORMS[t])
            if found is not None:
                return _candidate(kt, "avg_seq_len", float(p.avg_seq_len), found, points, t)
        return None

    def elementwise_candidate(self, kernel_type: str, out_shape: Shape, dtype: str
                              ) -> Candidate | None:
        table = self.base.tables.get(kernel_type)
        if table is None or not out_shape or not self.kernel_policy(kernel_type).enabled:
            return None
        points: list[Point] = []
        for row in table.rows:
            if not row.output_shapes:
                continue
            csv = strip_batch_dim(row.output_shapes[0])
            if len(csv) != len(out_shape) or csv[1:] != out_shape[1:]:
                continue
            if not output_shape_matches((csv[0], *out_shape[1:]), row.output_shapes[0]):
                continue
            csv_dt = row.output_dtypes[0] if row.output_dtypes else None
            try:
                scale = 1.0 if csv_dt == dtype else dtype_bytes(dtype) / dtype_bytes(csv_dt or "")
            except Exception:
                continue
            points.append((float(csv[0]), row.latency_us * scale, table, row))
        t = self.transform_for(kernel_type)
        found = bracket(points, float(out_shape[0]), TRANSFORMS[t])
        if found is None:
            return None
        return _candidate(kernel_type, "output_dim0", float(out_shape[0]), found, points, t)

    def sub_kernel(self, spec) -> Candidate | LookupMiss:
        exact = query_sub_kernel(self.base, spec)
        if isinstance(exact, Candidate) or spec.query is not None:  # its query interpolates
            return exact
        if spec.attention is not None:
            cand = self.attention_candidate(spec.kernel_types, spec.attention)
        else:
            inputs = spec.inputs
            count = spec.tc_input_count if spec.tc_input_count is not None else len(inputs)
            cand = self.compute_candidate(spec.kernel_types, inputs, count)
        return cand if cand is not None else exact

    # -- lookup --------------------------------------------------------------------
    def lookup(self, op: OpInvokeInfo) -> LookupOutcome:
        exact = self.base.lookup(op)
        if isinstance(exact, QueryResult) and exact.is_full_hit:
            return exact
        m = self.base.mapping.get(op.func)
        if m is None or m.category == "communication" or m.zero_cost or m.accepted_miss:
            return exact
        if m.composite:
            decomposer = self.base.decomposer_for(op.func)
            if decomposer is None:
                return exact  # static composites stay exact
            return lookup_decomposed(self.base, op, m, decomposer, self.sub_kernel)
        cand: Candidate | None = None
        sim: tuple[Shape, ...] = ()
        if m.query_mode == "attention_special":
            p = params_for(op)
            if isinstance(p, AttentionParams):
                cand = self.attention_candidate(m.kernel_types, p)
                sim = tuple(tuple(t.shape) for t in op.tensor_inputs())
        elif m.query_mode == "elementwise" and op.outputs and op.outputs[0].shape:
            out = strip_batch_dim(tuple(op.outputs[0].shape))
            cand = self.elementwise_candidate(m.kernel_type, out, query_dtype(op.outputs[0].dtype))
            sim = (out,)
        elif m.query_mode not in ("attention_special", "moe_fused") and m.kernel_type:
            # compute path (also elementwise ops without an output, mtp_projection after its
            # exact lookup, unknown query modes); a compute_subcategory picks its own regime
            inputs = tc_inputs(op, m.tc_input_count)
            sim = shapes_of(inputs)
            if m.compute_subcategory:
                found = self.subcategory_candidate(op, m)
                if isinstance(found, LookupMiss):
                    return found
                cand = found
            else:
                cand = self.compute_candidate(kernel_list(m, inputs=inputs), inputs,
                                              m.tc_input_count,
                                              [tuple(t.shape) for t in op.outputs], m.kernel_type)
        if cand is None:
            return exact
        details = {"kernel_type": cand.kernel_type, **cand.details}
        return QueryResult(cand.latency_us, cand.confidence, QuerySource.INTERPOLATED, details,
                           ShapeMatchInfo(sim, tuple(cand.row.input_shapes), cand.rule))


__all__ = ["AVG_SEQ_LEN_TOLERANCE", "InterpolatingDataSource", "KernelPolicy", "bracket",
           "interpolation_policy"]
