"""Import checks: the system a folder or table names, operation names, duplicate ids,
CSV rows whose cell count differs from the header, columns the spec does not map."""

from __future__ import annotations

import csv
import dataclasses
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostSubject, EstimateMethod
from perfcast.evidence.importers.aiconfigurator import import_system
from perfcast.evidence.importers.common import (
    device_systems,
    known_operations,
    system_id,
)
from perfcast.evidence.importers.tabular import (
    LatencyUnit,
    SimulatorPerformanceImporter,
    TabularImportSpec,
)
from perfcast.evidence.importers.vidur import VidurProfileImporter
from perfcast.evidence.store import open_evidence, systems_of
from perfcast.workload import Batch, ParallelPlan, build_task_graph, load_model_spec

FIX = Path(__file__).parents[1] / "fixtures" / "aiconfigurator" / "h100_sxm"
VIDUR = Path(__file__).parents[1] / "fixtures" / "vidur"
SPEC = TabularImportSpec(
    name="lab", subject=CostSubject.OPERATOR, source="lab", source_revision="r1",
    method=EstimateMethod.MEASURED, latency_column="t_us", latency_unit=LatencyUnit.MICROSECONDS,
    operation_column="op", hardware="h100_sxm", datatype="bf16",
    selector_columns=FrozenDict({"m": "M"}), selector_types=FrozenDict({"m": "int"}),
    record_id_column="id")


def copy_version(dst_system: Path, rel: str = "gemm/vllm/0.19.0", device: str | None = None):
    dst = dst_system / rel
    shutil.copytree(FIX / rel, dst)
    if device is not None:
        for path in dst.glob("*.parquet"):
            t = pq.read_table(path)
            i = t.column_names.index("device")
            pq.write_table(t.set_column(i, "device", pa.array([device] * t.num_rows)), path)
    return dst


def test_known_operations_cover_every_operation_the_workload_emits():
    ops = set()
    for model, plan in (("meta-llama/Llama-3.1-8B", ParallelPlan(tp=2, pp=2)),
                        ("Qwen/Qwen3-235B-A22B", ParallelPlan(tp=2, ep=2)),
                        ("deepseek-ai/DeepSeek-V3", ParallelPlan(tp=2, ep=2)),
                        ("nvidia/Qwen3.5-397B-A17B-NVFP4", ParallelPlan(tp=2)),
                        ("zai-org/GLM-5.2", ParallelPlan(tp=2))):
        spec = load_model_spec(model)
        for batch in (Batch.decode(4, 100), Batch.prefill(2, 256)):
            ops |= {t.operation for t in build_task_graph(spec, plan, batch).tasks}
    assert ops - {"view"} <= known_operations(), sorted(ops - known_operations())


def test_device_names_map_to_catalog_models():
    assert device_systems("NVIDIA H100 80GB HBM3") == {"h100_sxm"}
    assert device_systems("NVIDIA GB200") == {"gb200"}
    assert device_systems("NVIDIA A100-SXM4-80GB") == {"a100_sxm"}
    assert device_systems("some lab box") == set()
    # one model as an SXM and a PCIe part: nvidia-smi's name says which
    assert device_systems("NVIDIA H100 PCIe") == {"h100_pcie"}
    assert device_systems("NVIDIA A100 80GB PCIe") == {"a100_pcie"}
    assert device_systems("NVIDIA H100") == {"h100_sxm"}


def test_a_table_of_the_other_form_factor_is_refused():
    from perfcast.evidence.importers.common import check_device_column
    check_device_column(pa.array(["NVIDIA H100 80GB HBM3"]), hardware="h100_sxm", source="t")
    check_device_column(pa.array(["NVIDIA H100 PCIe"]), hardware="h100_pcie", source="t")
    with pytest.raises(ConfigError, match=r"h100_sxm\), not h100_pcie"):
        check_device_column(pa.array(["NVIDIA H100 80GB HBM3"]), hardware="h100_pcie",
                            source="t")
    # a part the catalog has in one form is judged by its model
    check_device_column(pa.array(["NVIDIA L40S"]), hardware="l40s", source="t")


def test_system_ids_are_checked_and_canonical():
    assert system_id("H100") == "h100_sxm"
    with pytest.raises(ConfigError, match=r"field '--system': unknown system 'h999'.*h200_sxm"):
        system_id("h999")


def test_the_folder_layout_names_the_system(tmp_path):
    copy_version(tmp_path / "h200_sxm", device="NVIDIA H200")
    db = import_system(tmp_path / "h200_sxm")
    assert systems_of(db) == ["h200_sxm"]
    # a version folder, imported on the fly, finds its <system> three levels up
    assert systems_of(open_evidence(str(tmp_path / "h200_sxm/gemm/vllm/0.19.0"),
                                    hardware="h100_sxm")) == ["h200_sxm"]
    with pytest.raises(ConfigError, match="'NVIDIA H200' \\(h200_sxm\\), not h100_sxm"):
        import_system(tmp_path / "h200_sxm", hardware="h100_sxm")
    copy_version(tmp_path / "b", "gemm/vllm/0.19.0", device="lab box")
    (tmp_path / "b").rename(tmp_path / "b200_sxm")
    with pytest.raises(ConfigError, match="holds b200_sxm tables.*not h100_sxm"):
        import_system(tmp_path / "b200_sxm", hardware="h100_sxm")


def test_the_device_column_names_the_system_of_an_unnamed_folder(tmp_path):
    copy_version(tmp_path / "lab")
    assert systems_of(import_system(tmp_path / "lab")) == ["h100_sxm"]
    with pytest.raises(ConfigError) as err:
        import_system(tmp_path / "lab", hardware="h200_sxm")
    text = str(err.value)
    assert "gemm_perf.parquet" in text and "field 'device'" in text and "row 0" in text
    assert "148 row(s)" in text and "not h200_sxm" in text


def test_a_folder_that_names_no_system_needs_one(tmp_path):
    copy_version(tmp_path / "lab", device="lab box 3")
    with pytest.raises(ConfigError, match="cannot tell which system"):
        import_system(tmp_path / "lab")
    assert systems_of(import_system(tmp_path / "lab", hardware="h200_sxm")) == ["h200_sxm"]
    # a query names its system: the on-the-fly import uses it when nothing else does
    assert systems_of(open_evidence(str(tmp_path / "lab"), hardware="l40s")) == ["l40s"]


def test_parquet_files_the_metadata_does_not_list_are_reported(tmp_path):
    dst = copy_version(tmp_path / "h100_sxm")
    shutil.copy(dst / "gemm_perf.parquet", dst / "extra_perf.parquet")
    db = import_system(tmp_path / "h100_sxm")
    skipped = [s["skipped"] for s in db.sources if "skipped" in s]
    assert skipped == [{"path": "gemm/vllm/0.19.0/extra_perf.parquet",
                        "reason": "not listed in collection_meta.yaml or reuse.yaml"}]


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_duplicate_record_ids_are_refused_naming_both_rows(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["id", "op", "M", "t_us"],
                     [["a", "gemm", 1, 2.0], ["b", "gemm", 2, 2.0], ["a", "gemm", 3, 2.0]])
    with pytest.raises(ConfigError, match=r"field 'id': row 2 \(line 4\): record id 'a' is "
                                          r"also row 0 \(line 2\)"):
        SimulatorPerformanceImporter.from_file(path, SPEC)


def test_unknown_operations_are_refused(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["id", "op", "M", "t_us"],
                     [["a", "gemm", 1, 2.0], ["b", "gemmm", 2, 2.0]])
    with pytest.raises(ConfigError, match=r"field 'op': row 1 \(line 3\): unknown operation "
                                          r"'gemmm'"):
        SimulatorPerformanceImporter.from_file(path, SPEC)
    with pytest.raises(ConfigError, match="unknown operation 'matmul'"):
        dataclasses.replace(SPEC, operation="matmul", operation_column="")
    csv_text = (VIDUR / "h100_dgx_all_reduce.csv").read_text().replace("all_reduce",
                                                                      "allreduce")
    (tmp_path / "ar.csv").write_text(csv_text)
    with pytest.raises(ConfigError, match=r"field 'collective': row 0 .*'allreduce'"):
        VidurProfileImporter.from_csv(tmp_path / "ar.csv", hardware="h100_sxm", dtype="bf16")


def test_extra_cells_fail_and_unmapped_columns_are_recorded(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,op,M,t_us,note\na,gemm,1,2.0,x\nb,gemm,2,2.0,y,surplus\n")
    with pytest.raises(ConfigError, match=r"row 1 \(line 3\): 6 cells, the header has 5"):
        SimulatorPerformanceImporter.from_file(path, SPEC)
    path.write_text("id,op,M,t_us,note\na,gemm,1,2.0,x\nb,gemm,2,2.0,y\n")
    db = SimulatorPerformanceImporter.from_file(path, SPEC)
    assert db.sources[0]["unused_columns"] == ["note"]


def test_hardware_values_are_checked_when_asked(tmp_path):
    spec = dataclasses.replace(SPEC, hardware="", hardware_column="hw")
    path = write_csv(tmp_path / "t.csv", ["id", "op", "M", "t_us", "hw"],
                     [["a", "gemm", 1, 2.0, "H100"], ["b", "gemm", 2, 2.0, "h999"]])
    with pytest.raises(ConfigError, match=r"field 'hw': row 1 \(line 3\): unknown system "
                                          r"'h999'"):
        SimulatorPerformanceImporter.from_file(path, spec, system=system_id)
    path = write_csv(tmp_path / "t.csv", ["id", "op", "M", "t_us", "hw"],
                     [["a", "gemm", 1, 2.0, "H100"]])
    db = SimulatorPerformanceImporter.from_file(path, spec, system=system_id)
    assert systems_of(db) == ["h100_sxm"]
