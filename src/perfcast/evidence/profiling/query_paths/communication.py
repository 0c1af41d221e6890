"""Communication path: HCCL-style CSVs keyed by `message_bytes`, `num_devices` and,
when the CSV has the column and the device declares a rank grid, `topology_tier`.

An exact row is MEASURED. Otherwise, when measured sizes bracket the query (same
device count and tier), an alpha-beta line (latency = a + b * bytes) fitted by least
squares to every row of that group (or, with `method="bracket_linear"`, the straight
line between the two bracketing rows) gives the latency, clamped to the bracketing rows:
INTERPOLATED, its `rel_std` measured by holding each interior row out of the fit
(`residuals.alpha_beta_details`). Outside the measured range it misses; it never
extrapolates.
"""

from __future__ import annotations

import numpy as np

from perfcast.evidence.profiling.data_source import (
    LookupMiss,
    QueryResult,
    QuerySource,
    ShapeMatchInfo,
)
from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
from perfcast.evidence.profiling.op_mapping import OperatorMapping
from perfcast.evidence.profiling.query_paths.common import LookupContext
from perfcast.evidence.profiling.residuals import (
    alpha_beta_details,
    confidence_of,
    measured_details,
)

REQUIRED_COLUMNS = ("message_bytes", "num_devices")

# HCCL counts the per-rank part for these collectives (all-gather send count,
# reduce-scatter receive count); perfcast's `message_bytes` is the full buffer.
PER_RANK_MESSAGE_OPERATIONS = frozenset({
    "tensor_cast.all_gather.default", "tensor_cast.reduce_scatter.default"})


def hccl_message_bytes(op: OpInvokeInfo) -> int:
    mb = int(op.dim("message_bytes", 0) or 0)
    n = int(op.dim("participants", 0) or 0)
    if op.func in PER_RANK_MESSAGE_OPERATIONS and n > 1:
        mb //= n
    return mb


def query_comm_csv(ctx: LookupContext, kernel_type: str, message_bytes: int,
                   num_devices: int, topology_tier: int | None, method: str = "alpha_beta"
                   ) -> tuple[float, bool, list[str], dict] | LookupMiss:
    """(latency_us, interpolated, record ids, uncertainty details) or a miss."""
    table = ctx.tables.get(kernel_type, communication=True)
    if table is None:
        return LookupMiss("csv_not_found", f"no CSV for {kernel_type}")
    missing = [c for c in REQUIRED_COLUMNS if not table.has(c)]
    if missing:
        return LookupMiss("csv_format_raw", f"{table.path.name} lacks {', '.join(missing)}")
    use_tier = topology_tier is not None and table.has("topology_tier")
    group = [r for r in table.rows
             if r.number("num_devices") == num_devices
             and (not use_tier or r.number("topology_tier") == topology_tier)
             and r.number("message_bytes") is not None]
    for r in group:
        if r.number("message_bytes") == message_bytes:
            return r.latency_us, False, [table.record_id(r)], measured_details(r)
    where = f"num_devices={num_devices}" + (f", topology_tier={topology_tier}" if use_tier else "")
    if not group:
        return LookupMiss("shape_mismatch", f"{kernel_type}: no rows for {where}")
    sizes = np.array([r.number("message_bytes") for r in group], dtype=np.float64)
    lats = np.array([r.latency_us for r in group], dtype=np.float64)
    below, above = sizes[sizes <= message_bytes], sizes[sizes >= message_bytes]
    if not below.size or not above.size:
        return LookupMiss("shape_mismatch",
                          f"{kernel_type}: message_bytes={message_bytes} outside measured "
                          f"[{int(sizes.min())}, {int(sizes.max())}] for {where}")
    lo, hi = below.max(), above.min()
    lat_lo, lat_hi = lats[sizes == lo][0], lats[sizes == hi][0]
    if method == "bracket_linear":
        value = float(lat_lo + (message_bytes - lo) / (hi - lo) * (lat_hi - lat_lo))
    else:
        a, b = np.linalg.lstsq(np.column_stack([np.ones_like(sizes), sizes]), lats,
                               rcond=None)[0]
        value = float(a + b * message_bytes)
    value = min(max(value, min(lat_lo, lat_hi)), max(lat_lo, lat_hi))
    ids = [table.record_id(r) for r in group if r.number("message_bytes") in (lo, hi)]
    key = (table.sha256, kernel_type, num_devices, topology_tier if use_tier else None)
    unc = alpha_beta_details(key, sizes, lats, float(message_bytes), float(lo), float(hi))
    return value, True, ids, unc


def lookup_communication(ctx: LookupContext, op: OpInvokeInfo, mapping: OperatorMapping
                         ) -> QueryResult | LookupMiss:
    if not mapping.kernel_type:
        return LookupMiss("unmapped", f"{mapping.name} has no kernel_type")
    num_devices = int(op.dim("participants", 0) or 0)
    if num_devices < 1:
        return LookupMiss("invalid_args", "communication op without participants")
    message_bytes = hccl_message_bytes(op)
    tier = ctx.topology_tier(num_devices, str(op.dim("tier", "") or ""))
    # alternates are a compute / attention-special feature: only kernel_type is queried
    kt = mapping.kernel_type
    found = query_comm_csv(ctx, kt, message_bytes, num_devices, tier)
    if isinstance(found, LookupMiss):
        return LookupMiss(found.reason, found.detail,
                          ShapeMatchInfo(((message_bytes,),), (), found.reason))
    latency, interpolated, ids, unc = found
    return QueryResult(
        latency_us=latency, confidence=confidence_of(unc),
        source=QuerySource.INTERPOLATED if interpolated else QuerySource.MEASURED,
        details={"kernel_type": kt, "topology_tier": tier, "message_bytes": message_bytes,
                 "num_devices": num_devices, "record_ids": ids,
                 "interpolation": "alpha_beta" if interpolated else "", **unc},
        shape_match_info=ShapeMatchInfo(((message_bytes,),), ((message_bytes,),), "comm"))
