"""Helpers for evidence tests: small hand-built records."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import (
    CostQuery,
    CostQueryContext,
    CostSubject,
    EstimateMethod,
)
from perfcast.evidence.records import EvidenceProvenance, PerformanceRecord


def make_record(latency_s: float, selector: dict, *, rid: str = "r", source: str = "lab",
                revision: str = "r1", operation: str = "gemm", dtype: str = "bf16",
                hardware: str = "h100_sxm",
                subject: CostSubject = CostSubject.OPERATOR) -> PerformanceRecord:
    prov = EvidenceProvenance(source=source, source_revision=revision, importer="test",
                              importer_revision="1", source_digest="sha256:" + "0" * 64,
                              method=EstimateMethod.MEASURED, raw_record_id=rid)
    return PerformanceRecord(subject=subject, operation=operation, hardware=hardware,
                             dtype=dtype, selector=FrozenDict(selector), latency_s=latency_s,
                             provenance=prov)


def gemm_query(m, n, k, *, dtype: str = "bf16", runtime: str = "", revision: str = "",
               implementation: str = "", **extra) -> CostQuery:
    dims = {"m": m, "n": n, "k": k, **extra}
    return CostQuery(subject=CostSubject.OPERATOR, operation="gemm", hardware="h100_sxm",
                     dtype=dtype, flops=2.0 * m * n * k,
                     bytes_read=float((m * k + k * n) * 2), bytes_written=float(m * n * 2),
                     dims=FrozenDict(dims),
                     context=CostQueryContext(runtime=runtime, runtime_revision=revision,
                                              implementation=implementation))


def write_rows(path: Path, rows: list[dict]) -> Path:
    """`rows` as a table file of the format `path`'s suffix names (csv, json, jsonl,
    parquet)."""
    fmt = path.suffix[1:]
    if fmt == "csv":
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    return path
