"""`VidurProfileImporter`: Vidur compute (`*_mlp.csv`) and network profiles
(`*all_reduce.csv`, `*send_recv.csv`). An explicit user action: the result is a new
perfcast-owned database; nothing from Vidur affects costing unless it is loaded into a
resolver.

Each row's `time_stats.<op>.median` (milliseconds) is one sample. Vidur does not record
the dtype, so the caller declares it.

Compute ops (head_dim = n_embd / n_head, tp = num_tensor_parallel_workers, t = num_tokens):

| Vidur op | operation | selector |
|---|---|---|
| attn_pre_proj | gemm | m=t, n=(n_head + 2 n_kv_head) head_dim / tp, k=n_embd |
| attn_post_proj | gemm | m=t, n=n_embd, k=n_head head_dim / tp |
| mlp_up_proj | gemm | m=t, n=(2 if gated else 1) n_expanded_embd / tp, k=n_embd |
| mlp_down_proj | gemm | m=t, n=n_embd, k=n_expanded_embd / tp |
| emb | embedding | tokens=t, numel=t n_embd |
| input_layernorm, post_attention_layernorm | norm | tokens=t, numel=t n_embd |
| attn_rope | rope | tokens=t, numel=t (n_head + n_kv_head) head_dim / tp |
| mlp_act | activation | tokens=t, numel=t n_expanded_embd / tp |
| add | add | tokens=t, numel=t n_embd |

Network rows: operation = `collective`, message_bytes = `size` (bytes), participants =
`num_workers`, plus `nodes` = ceil(num_workers / devices_per_node) when the group spans
more than one node (state it with `--op-dim send_recv:nodes=2`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

from perfcast.core.dtypes import parse_dtype
from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostSubject, EstimateMethod
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.importers.common import file_digest
from perfcast.evidence.records import EvidenceProvenance, PerformanceRecord

IMPORTER = "vidur"
IMPORTER_REVISION = "1"
MODEL_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens",
                 "num_tensor_parallel_workers", "use_gated_mlp")
NETWORK_COLUMNS = ("num_workers", "size", "collective", "devices_per_node")

Dims = dict[str, int]


def _hd(d: Dims) -> int:
    return d["n_embd"] // d["n_head"]


COMPUTE_OPS: dict[str, tuple[str, Callable[[Dims], dict]]] = {
    "attn_pre_proj": ("gemm", lambda d: {
        "m": d["t"], "n": (d["n_head"] + 2 * d["n_kv_head"]) * _hd(d) // d["tp"],
        "k": d["n_embd"]}),
    "attn_post_proj": ("gemm", lambda d: {
        "m": d["t"], "n": d["n_embd"], "k": d["n_head"] * _hd(d) // d["tp"]}),
    "mlp_up_proj": ("gemm", lambda d: {
        "m": d["t"], "n": (2 if d["gated"] else 1) * d["n_expanded_embd"] // d["tp"],
        "k": d["n_embd"]}),
    "mlp_down_proj": ("gemm", lambda d: {
        "m": d["t"], "n": d["n_embd"], "k": d["n_expanded_embd"] // d["tp"]}),
    "emb": ("embedding", lambda d: {"tokens": d["t"], "numel": d["t"] * d["n_embd"]}),
    "input_layernorm": ("norm", lambda d: {"tokens": d["t"], "numel": d["t"] * d["n_embd"]}),
    "post_attention_layernorm": ("norm", lambda d: {"tokens": d["t"],
                                                    "numel": d["t"] * d["n_embd"]}),
    "attn_rope": ("rope", lambda d: {
        "tokens": d["t"], "numel": d["t"] * (d["n_head"] + d["n_kv_head"]) * _hd(d) // d["tp"]}),
    "mlp_act": ("activation", lambda d: {"tokens": d["t"],
                                         "numel": d["t"] * d["n_expanded_embd"] // d["tp"]}),
    "add": ("add", lambda d: {"tokens": d["t"], "numel": d["t"] * d["n_embd"]}),
}


def _int(row: dict, col: str, where: str, path: Path) -> int:
    raw = row.get(col)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {raw!r} is not a number", source=str(path),
                          field=col) from None
    if not value.is_integer():
        raise ConfigError(f"{where}: {raw!r} is not an integer", source=str(path), field=col)
    return int(value)


def _median_s(row: dict, op: str, where: str, path: Path) -> float:
    col = f"time_stats.{op}.median"
    try:
        value = float(row[col]) * 1e-3
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {row[col]!r} is not a number", source=str(path),
                          field=col) from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}: latency {row[col]!r} ms is not positive and finite",
                          source=str(path), field=col)
    return value


class VidurProfileImporter:
    name = IMPORTER
    revision = IMPORTER_REVISION

    @staticmethod
    def from_csv(path: str | Path, *, hardware: str, dtype: str,
                 source_revision: str = "") -> PerformanceDatabase:
        path = Path(path)
        dt = parse_dtype(dtype, field="--dtype").value
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                header = reader.fieldnames or []
                rows = list(reader)
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc}", source=str(path)) from None
        if not rows:
            raise ConfigError("no data rows", source=str(path))
        digest = file_digest(path)
        rev = source_revision or f"vidur:{path.name}"
        network = "collective" in header
        needed = NETWORK_COLUMNS if network else MODEL_COLUMNS
        missing = [c for c in needed if c not in header]
        if missing:
            raise ConfigError(f"missing column(s) {', '.join(missing)}", source=str(path),
                              field=missing[0], expected="a Vidur mlp or network profile")
        ops = [op for op in COMPUTE_OPS if f"time_stats.{op}.median" in header]
        if not network and not ops:
            raise ConfigError("no time_stats.<op>.median column", source=str(path),
                              expected="one of " + ", ".join(COMPUTE_OPS))
        records = []

        def record(i, op_name, subject, operation, selector, latency):
            prov = EvidenceProvenance(source="vidur", source_revision=rev, importer=IMPORTER,
                                      importer_revision=IMPORTER_REVISION, source_digest=digest,
                                      method=EstimateMethod.MEASURED,
                                      raw_record_id=f"{path.name}#{i}.{op_name}")
            return PerformanceRecord(subject=subject, operation=operation, hardware=hardware,
                                     dtype=dt, selector=FrozenDict(selector), latency_s=latency,
                                     provenance=prov)

        for i, row in enumerate(rows):
            where = f"row {i} (line {i + 2})"
            if network:
                op = row["collective"]
                workers = _int(row, "num_workers", where, path)
                per_node = _int(row, "devices_per_node", where, path)
                selector = {"message_bytes": _int(row, "size", where, path),
                            "participants": workers}
                nodes = math.ceil(workers / max(per_node, 1))
                if nodes > 1:
                    selector["nodes"] = nodes
                records.append(record(i, op, CostSubject.COMMUNICATION, op, selector,
                                      _median_s(row, op, where, path)))
                continue
            d = {"t": _int(row, "num_tokens", where, path),
                 "tp": _int(row, "num_tensor_parallel_workers", where, path),
                 "gated": str(row["use_gated_mlp"]).strip().lower() == "true"}
            for c in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd"):
                d[c] = _int(row, c, where, path)
            for op in ops:
                operation, shape = COMPUTE_OPS[op]
                records.append(record(i, op, CostSubject.OPERATOR, operation, shape(d),
                                      _median_s(row, op, where, path)))
        return PerformanceDatabase.from_records(
            records, name=f"vidur:{path.name}",
            sources=[{"path": path.name, "digest": digest, "rows": len(rows), "dtype": dt}])
