"""Attention-special path (FusedInferAttentionScore and alternates): enriched CSVs
with `avg_seq_len` (or `Runtime avg_seq_len`).

Q is normalised to (T, N, D) on both sides; dtype, N and D match exactly; optional
runtime columns (`Runtime sparse_mode`, `Runtime num_key_value_heads`,
`Runtime input_layout`) filter when the query can supply the value; `avg_seq_len` is
matched to the nearest row within +-16 (rows with a negative value are skipped); T
matches exactly or up to block padding. The nearest row over all kernel types wins.
A row at a different `avg_seq_len` carries as `rel_std` the latency change the two
nearest measured rows show over that gap (unknown when there is no second row).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from perfcast.evidence.profiling.data_source import (
    LookupMiss,
    QueryResult,
    QuerySource,
    ShapeMatchInfo,
)
from perfcast.evidence.profiling.kernel_csv import query_dtype
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping
from perfcast.evidence.profiling.query_paths.common import (
    Candidate,
    LookupContext,
    find_candidate,
)
from perfcast.evidence.profiling.residuals import (
    confidence_of,
    measured_details,
    unknown_details,
)
from perfcast.evidence.profiling.shape_rules import is_block_padded

AVG_SEQ_LEN_TOLERANCE = 16
AVG_SEQ_COLUMNS = ("Runtime avg_seq_len", "avg_seq_len")
CAUSAL_SPARSE_MODE = 3  # right-down causal: what vLLM-Ascend runs for prefill and decode
LAYOUT_BY_RANK = {3: "TND", 4: "BNSD_NBSD"}

Shape = tuple[int, ...]


@dataclass(frozen=True)
class AttentionParams:
    q_shape_3d: Shape
    avg_seq_len: int
    dtype: str
    sparse_mode: int | None = None
    num_kv_heads: int | None = None
    input_layout: str | None = None


def normalize_q_shape(shape: Shape, head_dim: int = 0) -> Shape | None:
    """(T,N,D) as is; (B,N,1,D) squeezed; (T,N*D) split by head_dim."""
    if len(shape) == 3:
        return shape
    if len(shape) == 4 and shape[2] == 1:
        return (shape[0], shape[1], shape[3])
    if len(shape) == 2 and head_dim > 0 and shape[1] % head_dim == 0:
        return (shape[0], shape[1] // head_dim, head_dim)
    return None


def params_for(op: OpInvokeInfo) -> AttentionParams | LookupMiss:
    if not op.inputs:
        return LookupMiss("invalid_args", "attention op without a query tensor")
    q = op.inputs[0]
    head_dim = int(op.dim("head_dim", 0) or (op.inputs[1].shape[-1] if len(op.inputs) > 1 else 0))
    q3 = normalize_q_shape(tuple(q.shape), head_dim)
    if q3 is None:
        return LookupMiss("q_shape_normalize_failed", f"query shape {q.shape}")
    kv_len = op.dim("avg_seq_len", op.dim("kv_len"))
    if kv_len is None:
        return LookupMiss("missing_seq_lens", "attention op without kv_len")
    kv_heads = op.dim("kv_heads")
    return AttentionParams(
        q_shape_3d=q3, avg_seq_len=int(kv_len), dtype=query_dtype(q.dtype),
        sparse_mode=int(op.dim("sparse_mode", CAUSAL_SPARSE_MODE)),
        num_kv_heads=int(kv_heads) if kv_heads is not None else None,
        input_layout=LAYOUT_BY_RANK.get(len(q.shape)))


def attention_row(table, row, p: AttentionParams,
                  tolerance: float = AVG_SEQ_LEN_TOLERANCE) -> Candidate | None:
    """A candidate when `row` of `table` matches `p` within `tolerance` on avg_seq_len."""
    t, n, d = p.q_shape_3d
    col = next((c for c in AVG_SEQ_COLUMNS if table.has(c)), None)
    if col is None or not row.input_shapes:
        return None
    csv_avg = row.number(col)
    if csv_avg is None or csv_avg < 0:
        return None
    q3 = normalize_q_shape(row.input_shapes[0], d)
    if q3 is None or row.input_dtypes[0] != p.dtype or q3[1:] != (n, d):
        return None
    if table.has("Runtime sparse_mode") and p.sparse_mode is not None \
            and row.number("Runtime sparse_mode") != p.sparse_mode:
        return None
    if table.has("Runtime num_key_value_heads") and p.num_kv_heads is not None \
            and row.number("Runtime num_key_value_heads") != p.num_kv_heads:
        return None
    layout = row.text("Runtime input_layout")
    if layout and p.input_layout is not None and layout != p.input_layout:
        return None
    gap = abs(p.avg_seq_len - csv_avg)
    if gap > tolerance:
        return None
    if q3[0] != t and not is_block_padded(t, q3[0]) and not is_block_padded(q3[0], t):
        return None
    return Candidate(row.latency_us, table.kernel_type, table, row,
                     rule="attention" if q3[0] == t else "attention+padding",
                     distance=gap, details={"csv_avg_seq_len": int(csv_avg)})


def gap_details(table, found: Candidate, p: AttentionParams) -> dict:
    """Uncertainty of answering avg_seq_len with the nearest row: the relative latency
    change over the gap, at the slope of the found row and its nearest other row of the
    same shape (a measured gradient; no held-out rows exist at such small gaps)."""
    gap = found.distance
    if gap == 0:
        return measured_details(found.row)
    col = next(c for c in AVG_SEQ_COLUMNS if table.has(c))
    x0 = found.row.number(col)
    best = None
    for row in table.rows:
        s = row.number(col)
        if row is found.row or s is None or s == x0 or row.latency_us <= 0:
            continue
        if attention_row(table, row, p, tolerance=float("inf")) is None:
            continue
        if best is None or abs(s - x0) < abs(best[0] - x0):
            best = (s, row.latency_us)
    if best is None or found.latency_us <= 0:
        return unknown_details(f"avg_seq_len {p.avg_seq_len} answered by the row at "
                               f"{int(x0)}: no second row of this shape to measure how "
                               "latency changes over the gap")
    slope = abs(math.log(best[1] / found.latency_us)) / abs(best[0] - x0)
    return {"rel_std": slope * gap, "uncertainty_kind": "slope", "loo_samples": 2,
            "uncertainty_method": f"latency change over the gap of {gap:g} at the slope "
                                  f"between rows avg_seq_len={int(x0)} and {int(best[0])}"}


def query_attention(ctx: LookupContext, kernel_types: Sequence[str], p: AttentionParams
                    ) -> Candidate | LookupMiss:
    return find_candidate(ctx, kernel_types, lambda table, row: attention_row(table, row, p),
                          nearest=True)


def lookup_attention(ctx: LookupContext, op: OpInvokeInfo, mapping: OperatorMapping
                     ) -> QueryResult | LookupMiss:
    if not mapping.kernel_type:
        return LookupMiss("unmapped", f"{mapping.name} has no kernel_type")
    sim = tuple(tuple(t.shape) for t in op.tensor_inputs())
    p = params_for(op)
    if isinstance(p, LookupMiss):
        return p
    found = query_attention(ctx, mapping.kernel_types, p)
    if isinstance(found, LookupMiss):
        detail = (f"q={p.q_shape_3d} avg_seq_len={p.avg_seq_len} kv_heads={p.num_kv_heads} "
                  f"dtype={p.dtype}")
        return LookupMiss(found.reason, detail, ShapeMatchInfo(sim, (), found.reason))
    unc = gap_details(found.table, found, p)
    return QueryResult(
        latency_us=found.latency_us, confidence=confidence_of(unc),
        source=QuerySource.MEASURED,
        details={"kernel_type": found.kernel_type, "avg_seq_len": p.avg_seq_len,
                 "csv_avg_seq_len": found.details["csv_avg_seq_len"],
                 "sparse_mode": p.sparse_mode, "num_kv_heads": p.num_kv_heads,
                 "record_ids": [found.record_id], **unc},
        shape_match_info=ShapeMatchInfo(sim, (found.row.input_shapes[0],), found.rule))
