"""The kernel rows a profiling lookup reads for one operator call.

`kernel_rows(ds, op)` follows `ProfilingDataSource.lookup`'s dispatch (composite,
communication, attention special, elementwise, MoE fused, zero cost, accepted miss,
compute) and asks each query path's own pieces what it matches on: `tc_inputs` and the
kernel's layout normaliser (compute, MoE fused, static composite), `params_for`
(attention special), the first output (elementwise), the registered decomposer's
sub-kernel specs (MLA), `hccl_message_bytes` and the rank grid's tier (collectives).
Each answer is a `RowSpec` in the kernel's own layout; compute rows are checked with
`match_inputs` before they are returned, so a row that the lookup would not read is an
error here, never a silent miss later.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfcast.core.dtypes import dtype_bytes
from perfcast.core.errors import PerfcastError
from perfcast.evidence.profiling.data_source import LookupMiss
from perfcast.evidence.profiling.kernel_csv import KernelRow, profiling_dtype, query_dtype
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import COMM_PREFIX, OperatorMapping
from perfcast.evidence.profiling.profiling_data_source import (
    QUERY_MODE_PATHS,
    ProfilingDataSource,
)
from perfcast.evidence.profiling.query_paths.attention import AttentionParams, params_for
from perfcast.evidence.profiling.query_paths.communication import hccl_message_bytes
from perfcast.evidence.profiling.query_paths.composite import mc2_message_bytes
from perfcast.evidence.profiling.query_paths.elementwise import output_shape_matches
from perfcast.evidence.profiling.query_paths.moe import (
    EP_COLUMN,
    embedded_compute_query,
    project_dfc_inputs,
    routed_message_bytes,
)
from perfcast.evidence.profiling.shape_rules import (
    DEFAULT_RULE,
    INPUT_NORMALIZERS,
    KERNEL_RULES,
    match_inputs,
    strip_batch_dim,
)

Shape = tuple[int, ...]
Tensor = tuple[Shape, str, str]          # shape, canonical dtype, format

# runtime columns of an attention-special CSV (the real CANN 8.5 FIA table's)
ATTENTION_COLUMNS = ("Runtime avg_seq_len", "Runtime sparse_mode",
                     "Runtime num_key_value_heads", "Runtime input_layout")
FRACTAL_NZ = "FRACTAL_NZ"
# canonical dtype -> the spelling of Ascend kernel_details (read back by profiling_dtype)
CSV_DTYPES = {"bf16": "DT_BF16", "fp16": "FLOAT16", "fp32": "FLOAT", "fp8": "FLOAT8_E4M3FN"}


class RowDerivationError(PerfcastError):
    """A derived row that the lookup would not read (a bug in this module)."""


@dataclass(frozen=True)
class RowSpec:
    """One kernel CSV row: its kernel type, tensors, and the key columns the query path
    filters on (`Runtime avg_seq_len`, `EP Size`, `message_bytes`, ...)."""

    kernel_type: str
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[tuple[Shape, str], ...] = ()
    columns: tuple[tuple[str, str], ...] = ()
    communication: bool = False
    # what the query path matches on: compute | elementwise | attention | comm, and the
    # query's own inputs and tc_input_count (compute)
    mode: str = field(default="compute", compare=False)
    query: tuple[tuple[Shape, str], ...] = field(default=(), compare=False)
    count: int | None = field(default=None, compare=False)


def csv_dtype(dtype: str) -> str:
    """The CSV spelling of a canonical dtype (`bf16` -> `DT_BF16`)."""
    text = CSV_DTYPES.get(dtype, dtype.upper())
    if profiling_dtype(text) != query_dtype(dtype):
        raise RowDerivationError(f"no CSV spelling reads back as {dtype!r}")
    return text


def _nz(shape: Shape, dtype: str) -> Shape | None:
    """(..., K, N) in FRACTAL_NZ tiles (..., N/W0, K/16, 16, W0), W0 = 32 bytes / element
    (16 for 2-byte, 32 for int8); None when it does not tile."""
    w0 = 32 if dtype in ("int8", "fp8", "uint8") else 16
    if len(shape) < 2 or shape[-2] % 16 or shape[-1] % w0:
        return None
    k, n = shape[-2], shape[-1]
    return (*shape[:-2], n // w0, k // 16, 16, w0)


def _kernel_with_csv(ds: ProfilingDataSource, kernels: Sequence[str],
                     communication: bool = False) -> str:
    """The first of `kernels` whose CSV the database holds (the lookup's order), else the
    first: a row written there is the one the lookup reaches."""
    return next((k for k in kernels if ds.tables.path_for(k, communication)), kernels[0])


def _arity(ds: ProfilingDataSource, kernel: str, count: int | None) -> int | None:
    """Tensors per row of `kernel`'s existing CSV (cut to `count`), None without rows."""
    path = ds.tables.path_for(kernel)
    if path is None:
        return None
    n = _first_row_arity(str(path), path.stat().st_mtime_ns)
    return None if n is None else min(n, count) if count is not None else n


@functools.lru_cache(maxsize=256)
def _first_row_arity(path: str, _mtime_ns: int) -> int | None:
    from perfcast.collect.tables import parse_shapes, read_table

    rows = read_table(Path(path)).rows
    if not rows:
        return None
    return len([s for s in parse_shapes(rows[0].get("Input Shapes", "")) if s is not None])


def _kernel_layout(ds, kernel: str, inputs: list[tuple[Shape, str]], count: int | None
                   ) -> list[tuple[Shape, str]]:
    """`inputs` in the kernel's own layout: its registered normaliser at the arity of the
    CSV's rows, else at the smallest arity it accepts; unchanged without one."""
    rule = KERNEL_RULES.get(kernel, DEFAULT_RULE)
    if not rule.normalizer:
        return inputs
    norm = INPUT_NORMALIZERS[rule.normalizer]
    arity = _arity(ds, kernel, count)
    arities = [arity] if arity is not None else range(1, 2 * len(inputs) + 2)
    for n in arities:
        alt = norm(inputs, n)
        if alt is not None and len(alt) == n:
            return list(alt)
    return inputs


def _formats(op: OpInvokeInfo, n: int) -> list[str]:
    fmts = [t.format or "ND" for t in op.tensor_inputs()]
    return (fmts + ["ND"] * n)[:n]


def compute_row(ds: ProfilingDataSource, kernels: Sequence[str],
                inputs: list[tuple[Shape, str]], count: int | None,
                formats: Sequence[str] = (), outputs=(), columns=()) -> RowSpec:
    """The row of the first kernel of `kernels` with a CSV that `find_compute_match`
    reads for `inputs`; a FRACTAL_NZ input is tiled as the kernel records it, kept ND
    when the tiled form would not be read back."""
    kernel = _kernel_with_csv(ds, kernels)
    laid = _kernel_layout(ds, kernel, inputs, count)
    same = laid == list(inputs)
    tensors = [(shape, dt, "ND") for shape, dt in laid]
    for i, (shape, dt) in enumerate(laid):
        if same and i < len(formats) and formats[i] == FRACTAL_NZ:
            nz = _nz(shape, dt)
            tiled = tensors[:i] + [(nz, dt, FRACTAL_NZ)] + tensors[i + 1:]
            if nz is not None and _reads(kernel, inputs, tiled, count):
                tensors = tiled
    if not _reads(kernel, inputs, tensors, count):
        raise RowDerivationError(f"{kernel}: derived row {tensors} does not match "
                                 f"its query {inputs}")
    return RowSpec(kernel, tuple(tensors), tuple(outputs), tuple(columns),
                   query=tuple(inputs), count=count)


def _reads(kernel: str, inputs, tensors, count: int | None) -> bool:
    """`match_inputs` of the compute path on a row holding `tensors`."""
    row = KernelRow.from_tensors(tuple(s for s, _, _ in tensors),
                                 tuple(query_dtype(d) for _, d, _ in tensors),
                                 tuple(f for _, _, f in tensors))
    return match_inputs(kernel, inputs, row, count) is not None


def _outputs(op: OpInvokeInfo) -> tuple[tuple[Shape, str], ...]:
    return tuple((tuple(t.shape), query_dtype(t.dtype)) for t in op.outputs if t.shape)


def attention_row(kernel: str, p: AttentionParams, rest: Sequence[Tensor] = (),
                  outputs=()) -> RowSpec:
    """An attention-special row: Q (T, N, D) first, the call's other tensors after it,
    and the runtime columns the path filters on (`avg_seq_len` matched exactly)."""
    columns = (("Runtime avg_seq_len", str(p.avg_seq_len)),
               ("Runtime sparse_mode", "" if p.sparse_mode is None else str(p.sparse_mode)),
               ("Runtime num_key_value_heads",
                "" if p.num_kv_heads is None else str(p.num_kv_heads)),
               ("Runtime input_layout", p.input_layout or ""))
    return RowSpec(kernel, ((p.q_shape_3d, p.dtype, "ND"), *rest), tuple(outputs), columns,
                   mode="attention")


def _tensors(op: OpInvokeInfo, count: int | None = None) -> list[tuple[Shape, str]]:
    ins = [(tuple(t.shape), query_dtype(t.dtype)) for t in op.tensor_inputs()]
    return ins[:count] if count is not None else ins


def comm_row(ds: ProfilingDataSource, kernel: str, message_bytes: int, participants: int,
             tier_name: str, dtype: str = "") -> RowSpec:
    tier = ds.topology_tier(participants, tier_name)
    cols = [("message_bytes", str(message_bytes)), ("num_devices", str(participants))]
    if tier is not None:
        cols.append(("topology_tier", str(tier)))
    if dtype:
        cols.append(("dtype", dtype))
    return RowSpec(kernel, columns=tuple(cols), communication=True, mode="comm")


def _decomposed(ds: ProfilingDataSource, op: OpInvokeInfo, m: OperatorMapping, decomposer
                ) -> tuple[list[RowSpec], str]:
    specs = decomposer(op, m)
    if not specs:
        return [], "decompose_failed"
    rows = []
    for spec in specs:
        # the candidate layout whose kernels have a CSV (the lookup's order), else the first
        cand = next((c for c in spec.candidates
                     if any(ds.tables.path_for(k) for k in c.kernel_types)), spec.candidates[0])
        if cand.query is not None:  # keyed by Runtime columns a grid row cannot state
            return [], f"opaque_kernel:{cand.kernel_type}"
        if cand.attention is not None:
            rows.append(attention_row(_kernel_with_csv(ds, cand.kernel_types), cand.attention))
            continue
        inputs = cand.inputs
        count = cand.tc_input_count if cand.tc_input_count is not None else len(inputs)
        rows.append(compute_row(ds, cand.kernel_types, inputs, count))
    return rows, ""


def kernel_rows(ds: ProfilingDataSource, op: OpInvokeInfo) -> tuple[list[RowSpec], str]:
    """The rows `ds.lookup(op)` reads, and "" -- or no rows and why none is needed or
    possible (`zero_cost`, `accepted_miss`, `unmapped`, a query path's miss reason)."""
    m = ds.mapping.get(op.func)
    if m is None:
        return [], "unmapped"
    if m.composite:
        decomposer = ds.decomposer_for(op.func)
        if decomposer is not None:
            return _decomposed(ds, op, m, decomposer)
        if not m.sub_kernels:
            return [], "no_sub_kernels"
        compute = [k for k in m.sub_kernels if not k.startswith(COMM_PREFIX)]
        rows = [compute_row(ds, compute, _tensors(op, m.tc_input_count), m.tc_input_count,
                            _formats(op, len(op.tensor_inputs())), _outputs(op))]
        n = int(op.dim("participants", 0) or 0)
        variant = m.runtime_comm_variants.get("sequence_parallel") \
            if ds.sequence_parallel else None
        for kt in (k for k in m.sub_kernels if k.startswith(COMM_PREFIX)):
            if n < 1:
                return [], "invalid_args"
            mb = mc2_message_bytes(op)
            if variant is not None and kt == variant["source_kernel_type"]:
                kt = variant["kernel_type"]
                if variant.get("message_bytes_mode") == "per_rank_output":
                    if n < 2 or mb % n:
                        return [], "invalid_args"
                    mb //= n
            rows.append(comm_row(ds, kt, mb, n, str(op.dim("tier", "") or "")))
        return rows, ""
    if m.category == "communication":
        n = int(op.dim("participants", 0) or 0)
        if not m.kernel_type or n < 1:
            return [], "unmapped" if not m.kernel_type else "invalid_args"
        dtype = query_dtype(op.inputs[0].dtype) if op.inputs else ""
        return [comm_row(ds, m.kernel_type, hccl_message_bytes(op), n,
                         str(op.dim("tier", "") or ""), dtype)], ""
    if m.query_mode in QUERY_MODE_PATHS:
        if not m.kernel_type:
            return [], "unmapped"
        if m.query_mode == "attention_special":
            p = params_for(op)
            if isinstance(p, LookupMiss):
                return [], p.reason
            rest = [(tuple(t.shape), query_dtype(t.dtype), t.format or "ND")
                    for t in op.tensor_inputs()[1:]]
            return [attention_row(_kernel_with_csv(ds, m.kernel_types), p, rest,
                                  _outputs(op))], ""
        if m.query_mode == "elementwise" and op.outputs and op.outputs[0].shape:
            out = _outputs(op)
            if not output_shape_matches(strip_batch_dim(out[0][0]), out[0][0]):
                raise RowDerivationError(f"{m.kernel_type}: output {out[0][0]} unreadable")
            ins = [(s, d, f) for (s, d), f in zip(_tensors(op), _formats(op, len(op.tensor_inputs())))]
            return [RowSpec(m.kernel_type, tuple(ins), out, mode="elementwise")], ""
        if m.query_mode == "moe_fused":
            return _moe_rows(ds, op, m)
    if m.zero_cost:
        return [], "zero_cost"
    if m.accepted_miss:
        return [], "accepted_miss"
    if not m.kernel_type:
        return [], "unmapped"
    return [compute_row(ds, list(m.kernel_types), _tensors(op, m.tc_input_count),
                        m.tc_input_count, _formats(op, len(op.tensor_inputs())),
                        _outputs(op))], ""



def _moe_rows(ds: ProfilingDataSource, op: OpInvokeInfo, m: OperatorMapping
              ) -> tuple[list[RowSpec], str]:
    """The fused MoE kernel's row (its `project_full_shape` inputs when set), then the
    rows of its `embedded_compute` kernels and `embedded_communication` collective."""
    count, inputs = m.tc_input_count, _tensors(op, m.tc_input_count)
    if m.project_full_shape:
        inputs, count = project_dfc_inputs(op), None
        if isinstance(inputs, str):
            return [], "invalid_args"
    rows = [compute_row(ds, [m.kernel_type], inputs, count,
                        () if m.project_full_shape else _formats(op, len(inputs)),
                        _outputs(op), ((EP_COLUMN, str(ds.ep_size or 1)),))]
    if (m.embedded_compute or m.embedded_communication) and len(op.tensor_inputs()) < 2:
        return [], "invalid_args"
    for spec in m.embedded_compute:
        query = embedded_compute_query(op, spec)
        if isinstance(query, LookupMiss):
            return [], query.reason
        ins, n, out = query
        rows.append(compute_row(ds, [spec["kernel_type"]], ins, n,
                                outputs=(out,) if out is not None else ()))
    spec = m.embedded_communication
    if spec is not None:
        n = int(op.dim("participants", 0) or 0)
        if n < 1:
            return [], "invalid_args"
        rows.append(comm_row(ds, spec["kernel_type"], routed_message_bytes(op), n,
                             str(op.dim("tier", "") or "")))
    return rows, ""


def _kernel_row(spec: RowSpec) -> KernelRow:
    return KernelRow.from_tensors(tuple(s for s, _, _ in spec.inputs),
                                  tuple(query_dtype(d) for _, d, _ in spec.inputs),
                                  tuple(f for _, _, f in spec.inputs),
                                  tuple(s for s, _ in spec.outputs),
                                  tuple(d for _, d in spec.outputs))


def _scalable(want: str, have: str | None) -> bool:
    """The elementwise path answers `want` from a row in `have` (equal, or both sized)."""
    if want == have:
        return True
    try:
        dtype_bytes(want), dtype_bytes(have or "")
    except Exception:  # the path's own test: an unknown size is no answer
        return False
    return True


def _numels(shapes) -> tuple[int, ...]:
    return tuple(math.prod(s) for s in shapes)


class RowIndex:
    """The rows a kernel CSV holds, asked the way its query path asks them: does one of
    them already answer the query a new row is for? (A lookup takes the first row at
    distance 0: a batch-stripped, flattened, transposed or -- for elementwise outputs --
    block-padded match answers as well as the row written for the query.)"""

    def __init__(self) -> None:
        self._compute: dict[tuple, list[tuple[KernelRow, tuple]]] = {}
        self._outputs: dict[str, list[tuple[Shape, str | None]]] = {}
        self._keys: set[tuple] = set()

    def answers(self, spec: RowSpec) -> bool:
        if spec.mode == "compute":
            bucket = self._compute.get((spec.kernel_type, _numels(s for s, _ in spec.query)), ())
            cols = dict(spec.columns)
            for row, columns in bucket:
                rule = match_inputs(spec.kernel_type, spec.query, row, spec.count)
                if dict(columns) == cols and rule is not None and "padding" not in rule:
                    return True
            return False
        if spec.mode == "elementwise":
            shape, dtype = spec.outputs[0]
            tc = strip_batch_dim(shape)
            return any(output_shape_matches(tc, out) and _scalable(dtype, d)
                       for out, d in self._outputs.get(spec.kernel_type, ()))
        return self._key(spec) in self._keys

    def add(self, spec: RowSpec) -> None:
        if spec.mode == "compute":
            key = (spec.kernel_type, _numels(s for s, _ in spec.query))
            self._compute.setdefault(key, []).append((_kernel_row(spec), spec.columns))
        elif spec.mode == "elementwise":
            self._outputs.setdefault(spec.kernel_type, []).append(spec.outputs[0])
        self._keys.add(self._key(spec))

    @staticmethod
    def _key(spec: RowSpec) -> tuple:
        if spec.mode == "attention":
            return (spec.kernel_type, spec.inputs[0][:2], spec.columns)
        return (spec.kernel_type, spec.communication, spec.inputs, spec.columns)
