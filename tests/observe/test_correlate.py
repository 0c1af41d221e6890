"""Correlation of kernel observations to a task graph, checked by hand.

Llama-3.1-8B (32 layers, hidden 4096, 32 query / 8 KV heads of 128, FFN 14336, vocab
128256), one prefill request of 1024 tokens, bf16. At TP1 the compute tasks and their
repeat counts are: embedding 1; per layer (x32) input norm, qkv_proj, rope, KV-cache
write, attention, o_proj, post-attention norm, gate_up_proj, activation, down_proj;
final norm 1, lm_head 1: 3 + 10 * 32 = 323.

The AIConfigurator slice (tests/fixtures/aiconfigurator/h100_sxm) holds GEMMs with
n = k = 4096 only, and prefill attention with 32/8 heads of 128: of these tasks only
o_proj ([1024, 4096] x [4096, 4096]) and attention (1024 queries over 1024 keys) have a
row: 32 + 32 = 64 of 323.
"""

from __future__ import annotations

import pytest
from observe_helpers import A3, AIC_H100, FIA

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostSubject, EstimateMethod
from perfcast.evidence.database import PerformanceDatabase
from perfcast.evidence.records import EvidenceProvenance, PerformanceRecord
from perfcast.observe import (
    NOT_SUPPORTED,
    ObservationManifest,
    ObservationSet,
    SourceFile,
    correlate,
    import_kernels,
)
from perfcast.workload import Batch, ParallelPlan, load_model_spec
from perfcast.workload.build import build_task_graph


@pytest.fixture(scope="module")
def aic():
    return import_kernels(AIC_H100, system="h100_sxm")


def _graph(tp: int):
    return build_task_graph(load_model_spec("meta-llama/Llama-3.1-8B"), ParallelPlan(tp=tp),
                            Batch.prefill(1, 1024))


def test_portable_tasks_at_tp1(aic):
    report = correlate(aic, _graph(1))
    portable = report.level("portable_task")
    assert portable.supported
    assert (portable.matched, portable.total) == (64.0, 323.0)
    matched = {t.lineage for t in portable.tasks if t.matched}
    assert matched == {"L0-31.attn.o_proj", "L0-31.attn.core"}
    o_proj = next(t for t in portable.tasks if t.lineage == "L0-31.attn.o_proj")
    # vLLM 0.19.0 and 0.24.0 rows, and 0.22.0 borrowing the 0.24.0 table
    assert o_proj.observations == 3
    unmatched = {t.lineage: t.reason for t in portable.unmatched}
    assert unmatched["L0-31.mlp.gate_up_proj"] == \
        "no gemm bf16 observation with k=4096, m=1024, n=28672"  # gate and up: 2 x 14336
    assert unmatched["L0-31.attn.rope"] == "no rope observation"
    # attention is matched only at the task's KV dtype (the fp8-cache row does not count)
    attn = next(t for t in portable.tasks if t.lineage == "L0-31.attn.core")
    assert attn.observations == 1


def test_distributed_tasks_at_tp2(aic):
    dist = correlate(aic, _graph(2)).level("distributed_task")
    # embed + 2 per layer all-reduces of 1024 x 4096 bf16 = 8 MiB over 2 GPUs: NCCL rows;
    # the logits all-gather (1 x 64128 bf16 = 256512 bytes) is not a measured size
    assert (dist.matched, dist.total) == (65.0, 66.0)
    assert [t.lineage for t in dist.unmatched] == ["final.logits_all_gather"]
    # with no collective in the graph the level is supported and has nothing to count
    none = correlate(aic, _graph(1)).level("distributed_task")
    assert none.supported and (none.matched, none.total) == (0.0, 0.0)


def test_concrete_kernels_are_named(aic):
    kernel = correlate(aic, _graph(1)).level("concrete_kernel")
    assert kernel.supported and (kernel.matched, kernel.total) == (64.0, 323.0)
    o_proj = next(t for t in kernel.tasks if t.lineage == "L0-31.attn.o_proj")
    assert o_proj.kernels == ("torch.nn.functional.linear", "vllm_default")
    attn = next(t for t in kernel.tasks if t.lineage == "L0-31.attn.core")
    assert attn.kernels == ("vllm_flash_attn",)


def test_levels_the_data_cannot_support_say_so():
    report = correlate(import_kernels(FIA, system=A3), _graph(2))
    lineage, dist = report.level("model_operation"), report.level("distributed_task")
    assert not lineage.supported and not dist.supported
    assert lineage.coverage is None and dist.coverage is None
    out = {lv["level"]: lv for lv in report.to_json()["levels"]}
    assert out["distributed_task"] == {
        "level": "distributed_task", "supported": False,
        "status": f"{NOT_SUPPORTED}: no collective was measured"}
    assert "matched" not in out["model_operation"]
    # the Ascend kernels are 4-head decode attention: nothing in this prefill graph
    assert out["portable_task"]["supported"] and out["portable_task"]["matched"] == 0.0


def _lineage_set(lineages):
    """Observations that name model operations (no importer records lineage yet)."""
    prov = EvidenceProvenance(source="test", source_revision="r", importer="test",
                              importer_revision="1", source_digest="sha256:" + "0" * 64,
                              method=EstimateMethod.MEASURED, raw_record_id="")
    records = [PerformanceRecord(
        subject=CostSubject.OPERATOR, operation="gemm", hardware="h100_sxm", dtype="bf16",
        selector=FrozenDict(m=1024, n=4096, k=4096), latency_s=1e-5,
        provenance=EvidenceProvenance(**{**prov.__dict__, "raw_record_id": f"r{i}"}),
        metadata=FrozenDict(lineage=name)) for i, name in enumerate(lineages)]
    source = SourceFile(name="annotated", sha256=prov.source_digest, format="test",
                        rows=len(records), revision="r")
    manifest = ObservationManifest(kind="kernels", importer="test", importer_revision="1",
                                   system="h100_sxm", rows=len(records), sources=(source,))
    return ObservationSet("kernels", manifest,
                          records=PerformanceDatabase.from_records(records))


def test_model_operations_are_matched_per_layer():
    obs = _lineage_set(["L3.attn.o_proj", "L5.attn.o_proj", "final.lm_head"])
    level = correlate(obs, _graph(1)).level("model_operation")
    assert level.supported
    by = {t.lineage: t for t in level.tasks}
    assert by["L0-31.attn.o_proj"].matched == pytest.approx(2.0)   # 2 of 32 layers
    assert by["L0-31.attn.o_proj"].reason == "layers observed: 2 of 32"
    assert by["final.lm_head"].matched == 1.0
    assert by["L0-31.attn.qkv_proj"].matched == 0.0
    assert level.matched == pytest.approx(3.0) and level.total == 323.0
    assert [o.lineage for o in obs.observations()] == \
        ["L3.attn.o_proj", "L5.attn.o_proj", "final.lm_head"]


def test_every_record_needs_a_source_in_the_manifest():
    obs = _lineage_set(["L3.attn.o_proj"])
    bare = ObservationManifest(kind="kernels", importer="test", importer_revision="1",
                               system="h100_sxm", rows=1, sources=())
    with pytest.raises(ConfigError, match="no source file in the manifest"):
        ObservationSet("kernels", bare, records=obs.database)
