"""Elementwise path: match the first output shape (batch dim stripped, block padding and
3D->2D flattening tolerated) on the primary kernel only; a different output dtype scales
the latency by the byte-size ratio, whose error is measured on the shapes the CSV holds
in two dtypes (unknown when fewer than five). Without an output it falls back to
compute."""

from __future__ import annotations

import math

from perfcast.core.dtypes import dtype_bytes
from perfcast.evidence.profiling.data_source import (
    LookupMiss,
    QueryResult,
    QuerySource,
    ShapeMatchInfo,
)
from perfcast.evidence.profiling.kernel_csv import query_dtype
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping
from perfcast.evidence.profiling.query_paths.common import Candidate, LookupContext, find_candidate
from perfcast.evidence.profiling.query_paths.compute import lookup_compute
from perfcast.evidence.profiling.residuals import (
    confidence_of,
    dtype_scale_details,
    measured_details,
)
from perfcast.evidence.profiling.shape_rules import padded_match, strip_batch_dim

Shape = tuple[int, ...]


def output_shape_matches(tc: Shape, csv: Shape) -> bool:
    forms = [tc]
    if len(tc) == 3:
        forms.append((tc[0] * tc[1], tc[2]))
    csv_forms = (csv, strip_batch_dim(csv))
    return any(f == c or padded_match(f, c) for f in forms for c in csv_forms)


def dtype_scale_errors(table) -> list[float]:
    """ln(scaled / measured) of the byte-ratio rule for every output shape of `table`
    measured in two dtypes (each pair once, from the first row of each dtype)."""
    by_shape: dict[tuple, dict[str, float]] = {}
    for row in table.rows:
        if not row.output_shapes or not row.output_dtypes or row.latency_us <= 0:
            continue
        dt = row.output_dtypes[0]
        if dt:
            by_shape.setdefault(strip_batch_dim(row.output_shapes[0]), {}).setdefault(
                dt, row.latency_us)
    errs = []
    for lats in by_shape.values():
        dts = sorted(lats)
        for i, a in enumerate(dts):
            for b in dts[i + 1:]:
                try:
                    ratio = dtype_bytes(b) / dtype_bytes(a)
                except Exception:  # unknown dtype: no byte ratio
                    continue
                errs.append(math.log(lats[a] * ratio / lats[b]))
    return errs


def lookup_elementwise(ctx: LookupContext, op: OpInvokeInfo, mapping: OperatorMapping
                       ) -> QueryResult | LookupMiss:
    if not op.outputs or not op.outputs[0].shape:
        return lookup_compute(ctx, op, mapping)
    if not mapping.kernel_type:
        return LookupMiss("unmapped", f"{mapping.name} has no kernel_type")
    out = op.outputs[0]
    tc_shape = strip_batch_dim(tuple(out.shape))
    tc_dtype = query_dtype(out.dtype)

    def checker(table, row):
        if not row.output_shapes or not output_shape_matches(tc_shape, row.output_shapes[0]):
            return None
        csv_dtype = row.output_dtypes[0] if row.output_dtypes else None
        if csv_dtype == tc_dtype:
            return Candidate(row.latency_us, table.kernel_type, table, row, rule="elementwise")
        try:
            scale = dtype_bytes(tc_dtype) / dtype_bytes(csv_dtype or "")
        except Exception:  # unknown CSV dtype: no byte ratio to scale by
            return None
        unc = dtype_scale_details((table.sha256, table.kernel_type),
                                  lambda: dtype_scale_errors(table))
        return Candidate(row.latency_us * scale, table.kernel_type, table, row,
                         rule="elementwise", confidence=confidence_of(unc),
                         details={"dtype_scale": scale, **unc})

    found = find_candidate(ctx, [mapping.kernel_type], checker)
    if isinstance(found, LookupMiss):
        reason = found.reason if found.reason == "csv_not_found" \
            else "elementwise_output_shape_mismatch"
        return LookupMiss(reason, f"output {tc_shape} {tc_dtype} in {mapping.kernel_type}.csv",
                          ShapeMatchInfo((tc_shape,), (), reason))
    details = {"kernel_type": found.kernel_type, "query_mode": "elementwise",
               "record_ids": [found.record_id], **measured_details(found.row),
               **found.details}
    return QueryResult(latency_us=found.latency_us, confidence=confidence_of(details),
                       source=QuerySource.MEASURED, details=details,
                       shape_match_info=ShapeMatchInfo((tc_shape,), (found.row.output_shapes[0],),
                                                       "elementwise"))
