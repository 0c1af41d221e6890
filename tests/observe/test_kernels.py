"""Kernel observations: the evidence importers' records, with sources, facts and device checks."""

from __future__ import annotations

import hashlib
import shutil

import pytest
from observe_helpers import A3, AIC_H100, FIA, TRACE

from perfcast.collect.evidence import collected_records, to_performance_records
from perfcast.core.errors import ConfigError
from perfcast.evidence.importers.aiconfigurator import import_system
from perfcast.evidence.records import PerformanceRecord
from perfcast.observe import KernelObservation, import_kernels


def _sha(path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_aiconfigurator_records_are_the_evidence_importers_records():
    obs = import_kernels(AIC_H100, system="h100_sxm")
    direct = import_system(AIC_H100, hardware="h100_sxm")
    assert obs.database.digest == direct.digest
    assert len(obs) == len(direct) == sum(s.rows for s in obs.manifest.sources)
    records = obs.kernel_records()
    assert all(isinstance(r, PerformanceRecord) for r in records)
    assert records[:3] == list(direct.records())[:3]
    # unsupported tables are listed, not silently dropped
    assert {s["path"] for s in obs.manifest.skipped} >= \
        {"mla/trtllm/1.3.0rc20/mla_context_module_perf.parquet"}


def test_an_aiconfigurator_observation_keeps_row_file_and_facts():
    obs = import_kernels(AIC_H100 / "gemm" / "vllm" / "0.19.0", system="h100_sxm")
    table = AIC_H100 / "gemm" / "vllm" / "0.19.0" / "gemm_perf.parquet"
    first = next(iter(obs.observations()))
    assert isinstance(first, KernelObservation)
    assert (first.source.file, first.source.sha256, first.source.row) == \
        ("gemm_perf.parquet", _sha(table), 1)               # record id "...#0": data row 1
    assert first.source.record_id == "gemm/vllm/0.19.0/gemm_perf.parquet#0"
    assert dict(first.environment) == {"system": "h100_sxm", "backend": "vllm",
                                       "backend_version": "0.19.0",
                                       "device": "NVIDIA H100 80GB HBM3"}
    assert first.kernel == first.record.selector["implementation"] == "vllm_default"
    assert first.record.operation == "gemm" and first.record.latency_s > 0


def test_a_borrowed_table_is_filed_under_the_borrowing_version():
    obs = import_kernels(AIC_H100 / "gemm" / "vllm", system="h100_sxm")
    donor = AIC_H100 / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet"
    same_bytes = [s for s in obs.manifest.sources if s.sha256 == _sha(donor)]
    assert sorted(s.environment["backend_version"] for s in same_bytes) == ["0.22.0", "0.24.0"]
    versions = {o.environment["backend_version"] for o in obs.observations()
                if o.source.sha256 == _sha(donor)}
    assert versions == {"0.22.0", "0.24.0"}


def test_a_table_of_another_device_refuses_the_import():
    with pytest.raises(ConfigError) as err:
        import_kernels(AIC_H100 / "gemm", system="h200_sxm")
    text = str(err.value)
    assert "gemm_perf.parquet" in text and "'NVIDIA H100 80GB HBM3' (h100_sxm)" in text
    assert "not h200_sxm" in text


def test_ascend_kernel_csvs_give_the_collected_records():
    obs = import_kernels(FIA, system=A3)
    direct = to_performance_records(collected_records(
        FIA, hardware=A3, operations=("gemm", "attention")))
    assert obs.kernel_records() == direct
    assert len(obs) == 9
    fia = [o for o in obs.observations() if o.kernel == "FusedInferAttentionScore"]
    assert len(fia) == 7
    assert (fia[0].source.file, fia[0].source.row) == ("FusedInferAttentionScore.csv", 2)
    assert fia[0].source.sha256 == _sha(FIA / "FusedInferAttentionScore.csv")
    assert dict(fia[0].record.selector) == {"batch": 128, "head_dim": 128, "heads": 4,
                                            "kv_heads": 1, "kv_len": 4096, "phase": "decode",
                                            "q_tokens": 1}
    assert fia[0].record.latency_s == pytest.approx(58.2e-6)
    env = obs.manifest.environment
    assert env["device"] == ("ATLAS_800_A3_752T_128G_DIE",) and env["cann_version"] == ("8.5",)


def test_an_ascend_mapping_of_another_device_refuses_the_import(tmp_path):
    with pytest.raises(ConfigError, match=r"op_mapping.yaml: field 'device': says device "
                                          r"'ATLAS_800_A3_752T_128G_DIE'"):
        import_kernels(FIA, system="h100_sxm")


def test_a_torch_trace_is_read_through_collect_parse(tmp_path):
    # torch times nested CPU ops (linear -> matmul -> mm): the same product three times
    with pytest.raises(ConfigError, match=r"cpu_mm_trace.json: .*aten::linear and "
                                          r"aten::matmul both measure gemm"):
        import_kernels(TRACE, system="cpu")
    obs = import_kernels(TRACE, system="cpu", kernel_types=["aten::mm"])
    got = sorted((o.record.selector["m"], o.record.selector["n"], o.record.selector["k"],
                  o.record.metadata["Count"]) for o in obs.observations())
    # the script ran linear(x[64,128], w[256,128]) and mm(x, b[128,32]) three times each
    assert got == [(64, 32, 128, "3"), (64, 256, 128, "3")]
    first = next(iter(obs.observations()))
    assert (first.source.file, first.source.sha256, first.source.row) == \
        ("cpu_mm_trace.json", _sha(TRACE), None)           # an aggregate of 3 calls
    assert first.kernel == ""                               # a CPU trace names no kernel
    assert first.record.metadata["op"] == "aten::mm"
    # a folder of profiles: names are relative to it
    folder = tmp_path / "profiles"
    (folder / "rank0").mkdir(parents=True)
    shutil.copy(TRACE, folder / "rank0" / TRACE.name)
    again = import_kernels(folder, system="cpu", kernel_types=["aten::mm"])
    assert [s.name for s in again.manifest.sources] == ["rank0/cpu_mm_trace.json"]


def test_a_kernel_import_needs_a_system_and_a_readable_path(tmp_path):
    with pytest.raises(ConfigError, match="--system"):
        import_kernels(FIA, system=" ")
    with pytest.raises(ConfigError, match="does not exist"):
        import_kernels(tmp_path / "nothing", system=A3)
