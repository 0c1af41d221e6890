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


REF_H200_VLLM_COMM = (Path(__file__).parents[3] / "shared" / "reference" / "aiconfigurator"
                      / "h200_sxm" / "comm" / "vllm" / "0.24.0")


def _collector_folder(root: Path, system: str) -> Path:
    """A version folder laid out as AIConfigurator writes it, whose collection_meta.yaml
    names a collector variant (`wideep_vllm`) rather than the folder's framework: the
    real H200 vLLM 0.24.0 comm folder's meta and custom all-reduce rows (8 GPUs)."""
    meta = (REF_H200_VLLM_COMM / "collection_meta.yaml").read_text()
    assert "framework: wideep_vllm" in meta
    folder = root / system / "comm" / "vllm" / "0.24.0"
    folder.mkdir(parents=True)
    (folder / "collection_meta.yaml").write_text(meta)
    t = pq.read_table(REF_H200_VLLM_COMM / "custom_allreduce_perf.parquet")
    pq.write_table(t.filter(pc.field("num_gpus") == 8), folder / "custom_allreduce_perf.parquet")
    return folder


def test_collector_variant_tables_serve_the_layouts_framework(tmp_path):
    folder = _collector_folder(tmp_path, "h200_sxm")
    db = import_system(folder, hardware="h200_sxm")
    runtimes = set(db.table.column("sel.str.runtime").to_pylist())
    assert runtimes == {"vllm"}
    table_meta = [s for s in db.sources if isinstance(s, dict) and s.get("table")]
    assert table_meta and all(s.get("collector") == "wideep_vllm" for s in table_meta)
    row = pq.read_table(folder / "custom_allreduce_perf.parquet").filter(
        (pc.field("message_size") == 1048576) & (pc.field("backend") == "vllm_graph")
    ).to_pylist()[0]
    est = PerformanceDatabaseProvider(db).estimate(CostQuery(
        subject=CostSubject.COMMUNICATION, operation="all_reduce", hardware="h200_sxm",
        dtype="bf16", dims=FrozenDict({"message_bytes": 2 * 1048576, "participants": 8,
                                       "backend": "vllm_graph"}),
        context=CostQueryContext(runtime="vllm", runtime_revision="0.24.0",
                                 implementation=row["kernel_source"])))
    assert est.latency_s == pytest.approx(row["latency"] * 1e-3)


def test_outside_the_layout_the_meta_names_the_runtime(tmp_path):
    # the same folder under a name that is no catalog system: nothing says which
    # runtime the folder serves, so the meta's framework stays the runtime
    folder = _collector_folder(tmp_path, "my_tables")
    db = import_system(folder, hardware="h200_sxm")
    assert set(db.table.column("sel.str.runtime").to_pylist()) == {"wideep_vllm"}


# --- MLA kernel tables are keyed by the rank-local head count --------------------------
# The H100/H200 TRT-LLM 1.3.0rc20 tables hold 16 local heads under tp_size 4 (the collector
# swept a 64-head model); DeepSeek-V3 (128 heads) at TP 8 runs the same 16 heads a rank.

TRT20 = {"runtime": "trtllm", "runtime_revision": "1.3.0rc20", "implementation": "default"}


@pytest.mark.parametrize("tp_size", [1, 4, 8])
def test_mla_rows_answer_every_layout_with_their_local_heads(provider, tp_size):
    ctx = rows("mla/trtllm/1.3.0rc20/context_mla_perf.parquet", batch_size=1, isl=4096,
               kv_cache_dtype="fp8")[0]
    assert (ctx["num_heads"], ctx["tp_size"]) == (16, 4)
    dims = {"batch": 1, "q_tokens": 4096, "kv_len": 4096, "heads": 16, "tp_size": tp_size,
            "phase": "prefill", "kv_dtype": "fp8"}
    est = provider.estimate(q("mla_attention", "bf16", dims, **TRT20))
    assert est.latency_s == pytest.approx(ctx["latency"] * 1e-3, rel=1e-12)
    assert "heads" in dict(est.validity) and "tp_size" not in dict(est.validity)
    gen = rows("mla/trtllm/1.3.0rc20/generation_mla_perf.parquet", batch_size=2, step=1023,
               kv_cache_dtype="fp8")[0]
    dims = {"batch": 2, "q_tokens": 1, "kv_len": 1024, "heads": 16, "tp_size": tp_size,
            "phase": "decode", "kv_dtype": "fp8"}
    est = provider.estimate(q("mla_attention", "bf16", dims, **TRT20))
    assert est.latency_s == pytest.approx(gen["latency"] * 1e-3, rel=1e-12)
    # another local head count is another kernel shape: no row answers it
    other = {**dims, "heads": 32}
    assert isinstance(provider.estimate(q("mla_attention", "bf16", other, **TRT20)), Miss)


def test_mla_rows_of_two_models_at_one_local_head_count_are_samples_of_one_point(tmp_path):
    """A table holding a 64-head model at TP 4 and a 128-head model at TP 8 (both 16
    heads a rank, as SGLang's and vLLM's tables do): one point, the median of both."""
    base = dict(framework="TRTLLM", version="1.3.0rc20", device="NVIDIA H100 80GB HBM3",
                op_name="mla_context", kernel_source="default", mla_dtype="bfloat16",
                kv_cache_dtype="fp8", num_heads=16, batch_size=1, isl=1024, step=0)
    table = pa.Table.from_pylist([{**base, "tp_size": 4, "latency": 0.030},
                                  {**base, "tp_size": 8, "latency": 0.034}])
    path = tmp_path / "context_mla_perf.parquet"
    pq.write_table(table, path)
    db = import_table(path, hardware="h100_sxm", framework="trtllm", version="1.3.0rc20")
    dims = {"batch": 1, "q_tokens": 1024, "kv_len": 1024, "heads": 16, "tp_size": 8,
            "phase": "prefill", "kv_dtype": "fp8"}
    est = PerformanceDatabaseProvider(db).estimate(q("mla_attention", "bf16", dims, **TRT20))
    assert est.latency_s == pytest.approx(0.032e-3)
    assert est.uncertainty.sample_count == 2


def test_deepseek_prefill_attention_at_tp8_comes_from_the_mla_context_table(db):
    """The MLA core of a DeepSeek-V3 prefill step at TP 8 (16 heads a rank) is the
    table's row, not the roofline; the GEMMs around it are other tasks."""
    from perfcast.evidence.factory import build_resolver, measured_providers
    from perfcast.evidence.queries import query_for_task
    from perfcast.hardware import load_system
    from perfcast.workload import Batch, ParallelPlan, build_task_graph, load_model_spec
    from perfcast.workload.quant import precision_for_model

    spec = load_model_spec("deepseek-ai/DeepSeek-V3")
    precision = precision_for_model(spec, kv_cache_dtype="fp8")
    system = load_system("h100_sxm")
    resolver = build_resolver(system, measured_providers([db], system))
    graph = build_task_graph(spec, ParallelPlan(tp=8, ep=8), Batch.prefill(1, 4096), precision)
    core = [t for t in graph.tasks if t.group == "mla.core"]
    assert core and {t.work.axes["heads"] for t in core} == {16}
    row = rows("mla/trtllm/1.3.0rc20/context_mla_perf.parquet", batch_size=1, isl=4096,
               kv_cache_dtype="fp8")[0]
    for task in core:
        est = resolver.resolve(query_for_task(task, "h100_sxm", CostQueryContext(**TRT20)))
        assert est.estimate.method.value == "measured"
        assert est.estimate.latency_s == pytest.approx(row["latency"] * 1e-3, rel=1e-9)
