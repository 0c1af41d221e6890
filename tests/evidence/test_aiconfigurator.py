"""AIConfigurator importer on real H100 slices (tests/fixtures/aiconfigurator)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostQuery, CostQueryContext, CostSubject, Miss
from perfcast.evidence.importers.aiconfigurator import import_system, import_table
from perfcast.evidence.provider_db import PerformanceDatabaseProvider

FIX = Path(__file__).parents[1] / "fixtures" / "aiconfigurator" / "h100_sxm"


@pytest.fixture(scope="module")
def db():
    return import_system(FIX, hardware="h100_sxm")


@pytest.fixture(scope="module")
def provider(db):
    return PerformanceDatabaseProvider(db)


def rows(table, **eq):
    t = pq.read_table(FIX / table)
    for k, v in eq.items():
        t = t.filter(pc.field(k) == v)
    return t.to_pylist()


def q(op, dtype, dims, subject=CostSubject.OPERATOR, **ctx):
    return CostQuery(subject=subject, operation=op, hardware="h100_sxm", dtype=dtype,
                     dims=FrozenDict(dims), context=CostQueryContext(**ctx))


VLLM19 = {"runtime": "vllm", "runtime_revision": "0.19.0"}


def test_every_row_is_imported_once_plus_reuse(db):
    counts = {p.parent.relative_to(FIX).as_posix() + "/" + p.stem: pq.read_metadata(p).num_rows
              for p in FIX.glob("**/*.parquet")}
    reused = counts["gemm/vllm/0.24.0/gemm_perf"]  # 0.22.0 reuses 0.24.0's gemm table
    assert len(db) == sum(counts.values()) + reused
    assert db.digest == import_system(FIX, hardware="h100_sxm").digest


def test_gemm_latency_is_milliseconds_as_seconds(provider):
    row = rows("gemm/vllm/0.19.0/gemm_perf.parquet", m=2048, gemm_dtype="bfloat16")[0]
    est = provider.estimate(q("gemm", "bf16", {"m": 2048, "n": 4096, "k": 4096},
                              implementation="vllm_default", **VLLM19))
    assert est.latency_s == pytest.approx(row["latency"] * 1e-3, rel=1e-12)
    assert est.source_revision == "gemm/vllm/0.19.0"
    assert dict(est.validity)["implementation"] == "vllm_default"
    fp8 = rows("gemm/vllm/0.19.0/gemm_perf.parquet", m=2048, gemm_dtype="fp8")[0]
    est8 = provider.estimate(q("gemm", "fp8", {"m": 2048, "n": 4096, "k": 4096},
                               implementation="vllm_default", **VLLM19))
    assert est8.latency_s == pytest.approx(fp8["latency"] * 1e-3, rel=1e-12)


def test_runtime_and_kernel_are_required(provider):
    dims = {"m": 2048, "n": 4096, "k": 4096}
    assert isinstance(provider.estimate(q("gemm", "bf16", dims)), Miss)
    miss = provider.estimate(q("gemm", "bf16", dims, **VLLM19))
    assert isinstance(miss, Miss) and "implementation" in miss.reason
    miss = provider.estimate(q("gemm", "bf16", dims, implementation="vllm_default",
                               runtime="vllm", runtime_revision="0.14.0"))
    assert isinstance(miss, Miss)


def test_reuse_yaml_serves_the_donor_rows_under_the_borrowing_version(provider):
    donor = rows("gemm/vllm/0.24.0/gemm_perf.parquet", m=4096)[0]
    est = provider.estimate(q("gemm", "bf16", {"m": 4096, "n": 4096, "k": 4096},
                              runtime="vllm", runtime_revision="0.22.0",
                              implementation=donor["kernel_source"]))
    assert est.latency_s == pytest.approx(donor["latency"] * 1e-3)
    assert "reuses 0.24.0" in est.source_revision


def test_attention_rows_map_to_per_request_axes(provider):
    ctx = rows("attention/vllm/0.19.0/context_attention_perf.parquet", batch_size=2, isl=1024,
               kv_cache_dtype="bfloat16")[0]
    dims = {"batch": 2, "q_tokens": 1024, "kv_len": 1024, "heads": 32, "kv_heads": 8,
            "head_dim": 128, "v_head_dim": 128, "phase": "prefill", "kv_dtype": "bf16"}
    est = provider.estimate(q("attention", "bf16", dims, implementation=ctx["kernel_source"],
                              **VLLM19))
    assert est.latency_s == pytest.approx(ctx["latency"] * 1e-3)
    gen = rows("attention/vllm/0.19.0/generation_attention_perf.parquet", batch_size=8,
               kv_cache_dtype="fp8")[0]
    dims = {"batch": 8, "q_tokens": 1, "kv_len": 1 + gen["step"], "heads": 32, "kv_heads": 8,
            "head_dim": 128, "v_head_dim": 128, "phase": "decode", "kv_dtype": "fp8"}
    est = provider.estimate(q("attention", "bf16", dims, implementation=gen["kernel_source"],
                              **VLLM19))
    assert est.latency_s == pytest.approx(gen["latency"] * 1e-3)


def test_nccl_uses_the_library_version_and_element_bytes(provider):
    samples = rows("comm/nccl/2.27.3/nccl_perf.parquet", op_name="all_reduce", num_gpus=4,
                   nccl_dtype="half", message_size=1048576)
    assert len(samples) == 2  # the table holds two runs of this point: median of both
    dims = {"message_bytes": 2 * 1048576, "participants": 4, "nccl_version": "2.27.3"}
    est = provider.estimate(q("all_reduce", "fp16", dims, subject=CostSubject.COMMUNICATION,
                              implementation="NCCL"))
    assert est.latency_s == pytest.approx(statistics.median(r["latency"] for r in samples) * 1e-3)
    assert est.uncertainty.sample_count == 2
    # the Parquet says 2.29.2; collection_meta.yaml (the folder) is authoritative
    assert dict(est.validity)["nccl_version"] == "2.27.3"
    alltoall = q("all_to_all", "int8", {"message_bytes": 1048576, "participants": 4,
                                        "nccl_version": "2.27.3"},
                 subject=CostSubject.COMMUNICATION, implementation="NCCL")
    assert provider.estimate(alltoall).latency_s > 0


def test_custom_allreduce_needs_backend(provider):
    row = rows("comm/vllm/0.19.0/custom_allreduce_perf.parquet", num_gpus=2,
               message_size=1048576, backend="vllm_graph")[0]
    dims = {"message_bytes": 2 * 1048576, "participants": 2}
    base = dict(subject=CostSubject.COMMUNICATION, implementation=row["kernel_source"], **VLLM19)
    assert isinstance(provider.estimate(q("all_reduce", "bf16", dims, **base)), Miss)
    est = provider.estimate(q("all_reduce", "bf16", {**dims, "backend": "vllm_graph"}, **base))
    assert est.latency_s == pytest.approx(row["latency"] * 1e-3)


def test_mla_and_moe_tables(provider):
    mla = rows("mla/trtllm/1.3.0rc20/generation_mla_perf.parquet", batch_size=2,
               kv_cache_dtype="bfloat16")[0]
    dims = {"batch": 2, "q_tokens": 1, "kv_len": 1 + mla["step"], "heads": 16,
            "tp_size": mla["tp_size"], "phase": "decode", "kv_dtype": "bf16"}
    est = provider.estimate(q("mla_attention", "bf16", dims, runtime="trtllm",
                              runtime_revision="1.3.0rc20", implementation="default"))
    assert est.latency_s == pytest.approx(mla["latency"] * 1e-3)
    moe = rows("moe/vllm/0.19.0/moe_perf.parquet", moe_dtype="int4_wo")[0]
    dims = {"tokens": moe["num_tokens"], "hidden_size": 4096, "inter_size": moe["inter_size"],
            "topk": moe["topk"], "num_experts": 8, "moe_tp": 1, "moe_ep": 1,
            "distribution": moe["distribution"]}
    est = provider.estimate(q("moe", "int4", dims, implementation=moe["kernel_source"], **VLLM19))
    assert est.raw_record_ids and est.latency_s > 0


def _write(tmp_path, table: pa.Table) -> Path:
    path = tmp_path / "gemm_perf.parquet"
    pq.write_table(table, path)
    return path


def _gemm_table(**override):
    cols = {"kernel_source": ["k"] * 2, "gemm_dtype": ["bfloat16"] * 2, "m": [1, 2],
            "n": [8, 8], "k": [8, 8], "latency": [0.01, 0.02]}
    cols.update(override)
    return pa.table(cols)


def test_missing_column_names_file_and_column(tmp_path):
    path = _write(tmp_path, _gemm_table().drop(["latency"]))
    with pytest.raises(ConfigError, match=r"gemm_perf\.parquet.*latency"):
        import_table(path, hardware="h100_sxm", framework="vllm", version="1")


@pytest.mark.parametrize("bad", [float("nan"), -0.5, 0.0])
def test_bad_latency_names_the_row(tmp_path, bad):
    path = _write(tmp_path, _gemm_table(latency=[0.01, bad]))
    with pytest.raises(ConfigError, match=r"gemm_perf\.parquet.*latency.*row 1"):
        import_table(path, hardware="h100_sxm", framework="vllm", version="1")


def test_unknown_dtype_and_mistyped_shape(tmp_path):
    path = _write(tmp_path, _gemm_table(gemm_dtype=["bfloat16", "fp7"]))
    with pytest.raises(ConfigError, match="gemm_dtype.*fp7"):
        import_table(path, hardware="h100_sxm", framework="vllm", version="1")
    path = _write(tmp_path, _gemm_table(m=[1.0, 2.5]))
    with pytest.raises(ConfigError, match="field 'm'"):
        import_table(path, hardware="h100_sxm", framework="vllm", version="1")


def test_folder_without_tables_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no supported AIConfigurator table"):
        import_system(tmp_path, hardware="h100_sxm")
