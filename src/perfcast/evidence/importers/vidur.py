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

Attention profiles (`attention.csv`: one row per `is_prefill`, `batch_size`,
`prefill_chunk_size`, `kv_cache_size`, model and tp), operation `attention`:

| row | latency column | selector |
|---|---|---|
| is_prefill true | time_stats.attn_prefill.median | batch=batch_size, q_tokens=prefill_chunk_size, kv_len=kv_cache_size + q_tokens, phase=prefill |
| is_prefill false | time_stats.attn_decode.median | batch=batch_size, q_tokens=1, kv_len=kv_cache_size + 1, phase=decode |

plus heads = n_q_head / tp, kv_heads = max(1, n_kv_head / tp), head_dim = v_head_dim =
n_embd / n_q_head, kv_dtype = the declared dtype, implementation = `attention_backend`
as written. The KV-cache save and reshape timings of those rows are not imported.

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
from perfcast.evidence.importers.common import check_operations, file_digest
from perfcast.evidence.records import EvidenceProvenance, PerformanceRecord

IMPORTER = "vidur"
IMPORTER_REVISION = "1"
MODEL_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens",
                 "num_tensor_parallel_workers", "use_gated_mlp")
NETWORK_COLUMNS = ("num_workers", "size", "collective", "devices_per_node")
ATTENTION_COLUMNS = ("n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers",
                     "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill",
                     "attention_backend")

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


def _attention(row: dict, where: str, path: Path, dtype: str) -> tuple[str, dict]:
    """(Vidur op of the latency column, selector) of one attention.csv row."""
    flag = str(row["is_prefill"]).strip().lower()
    if flag not in ("true", "false"):
        raise ConfigError(f"{where}: is_prefill {row['is_prefill']!r}", source=str(path),
                          field="is_prefill", expected="True or False")
    prefill = flag == "true"
    n = {c: _int(row, c, where, path) for c in ATTENTION_COLUMNS[:7]}
    tp = n["num_tensor_parallel_workers"]
    if min(n["n_embd"], n["n_q_head"], n["n_kv_head"], tp, n["batch_size"]) <= 0 \
            or n["n_embd"] % n["n_q_head"] or n["n_q_head"] % tp:
        raise ConfigError(f"{where}: model or parallel sizes {n} do not divide",
                          source=str(path), field="n_embd")
    q_tokens = n["prefill_chunk_size"] if prefill else 1
    if q_tokens <= 0 or n["kv_cache_size"] < 0:
        raise ConfigError(f"{where}: a prefill row needs prefill_chunk_size > 0 and every "
                          "row kv_cache_size >= 0", source=str(path),
                          field="prefill_chunk_size")
    backend = str(row["attention_backend"]).strip()
    if not backend:
        raise ConfigError(f"{where}: empty attention_backend", source=str(path),
                          field="attention_backend")
    head_dim = n["n_embd"] // n["n_q_head"]
    return ("attn_prefill" if prefill else "attn_decode"), {
        "batch": n["batch_size"], "q_tokens": q_tokens,
        "kv_len": n["kv_cache_size"] + q_tokens, "heads": n["n_q_head"] // tp,
        "kv_heads": max(1, n["n_kv_head"] // tp), "head_dim": head_dim,
        "v_head_dim": head_dim, "kv_dtype": dtype,
        "phase": "prefill" if prefill else "decode", "implementation": backend}


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
        attention = "is_prefill" in header
        needed = NETWORK_COLUMNS if network else ATTENTION_COLUMNS if attention \
            else MODEL_COLUMNS
        missing = [c for c in needed if c not in header]
        if missing:
            raise ConfigError(f"missing column(s) {', '.join(missing)}", source=str(path),
                              field=missing[0],
                              expected="a Vidur mlp, attention or network profile")
        ops = [op for op in COMPUTE_OPS if f"time_stats.{op}.median" in header]
        if not network and not attention and not ops:
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
            if None in row or None in row.values():
                raise ConfigError(f"{where}: the row's cell count differs from the header's "
                                  f"{len(header)}", source=str(path))
            if network:
                op = row["collective"]
                check_operations([op], source=str(path), field="collective", rows=[where])
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
            if attention:
                op, selector = _attention(row, where, path, dt)
                records.append(record(i, op, CostSubject.OPERATOR, "attention", selector,
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
