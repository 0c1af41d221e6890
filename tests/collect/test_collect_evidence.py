import pytest

from perfcast.collect.comm import CommBenchConfig, CommMeasurement, CommResult, write_comm_tables
from perfcast.collect.evidence import collected_records
from perfcast.collect.parse import parse_profiling
from perfcast.core.errors import ConfigError

def test_comm_tables_answer_through_profiling_data_source(tmp_path, lookup_comm):
    cfg = CommBenchConfig(ops=("all_reduce", "all_gather"), dtype="bf16")
    result = CommResult([CommMeasurement("all_reduce", 65536, 2, (30.0, 31.0, 29.0)),
                         CommMeasurement("all_reduce", 262144, 2, (50.0,)),
                         CommMeasurement("all_gather", 4096, 2, (12.0,))])
    write_comm_tables(result, cfg, database_path=tmp_path)
    db = tmp_path
    hit = lookup_comm(db, "all_reduce", 65536, 2)
    assert (hit.latency_us, hit.source.value) == (30.0, "MEASURED")
    assert hit.details["topology_tier"] == 2            # both dies of one A3 chip
    # perfcast counts the gathered buffer (2 x 4096); HCCL's row the per-rank input
    assert lookup_comm(db, "all_gather", 8192, 2).latency_us == 12.0
    # bracketed size: the alpha-beta path of the data source interpolates between rows
    mid = lookup_comm(db, "all_reduce", 131072, 2)
    assert mid.source.value == "INTERPOLATED" and 30.0 < mid.latency_us < 50.0


def test_comm_rows_become_full_buffer_records(tmp_path):
    cfg = CommBenchConfig(ops=("all_reduce", "all_gather"), dtype="bf16")
    result = CommResult([CommMeasurement("all_reduce", 65536, 2, (30.0,)),
                         CommMeasurement("all_gather", 4096, 4, (12.0,))])
    write_comm_tables(result, cfg, database_path=tmp_path)
    recs = {r.operation: r for r in collected_records(tmp_path, hardware="h100_sxm")}
    assert dict(recs["all_reduce"].selector) == {"message_bytes": 65536, "participants": 2}
    assert dict(recs["all_gather"].selector) == {"message_bytes": 16384, "participants": 4}
    assert recs["all_gather"].latency_s == pytest.approx(12e-6)
    assert recs["all_gather"].subject == "communication" and recs["all_gather"].dtype == "bf16"


def test_parsed_ascend_rows_become_gemm_records(fixtures, tmp_path):
    parse_profiling(fixtures / "ascend_prof", tmp_path)
    recs = collected_records(tmp_path, hardware="atlas_800_a3_752t_128g_die",
                             runtime="vllm", runtime_revision="0.18.0")
    gemm = {r.selector["m"]: r for r in recs if r.operation == "gemm"}
    small = gemm[128]
    assert dict(small.selector) == {"m": 128, "k": 5120, "n": 1280, "runtime": "vllm",
                                    "runtime_revision": "0.18.0"}
    assert small.dtype == "bf16" and small.latency_s == pytest.approx(20.7e-6)
    assert small.provenance["raw_record_id"].startswith("MatMulV2.csv#row")
    assert small.provenance["source_digest"].startswith("sha256:")
    assert small.metadata["Count"] == "2"
    # RmsNorm is not imported by default (elementwise axes are opt-in)
    assert {r.operation for r in recs} == {"gemm"}


def test_two_kernel_types_for_one_shape_are_refused(tmp_path):
    header = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Average Duration(us)\n"
    (tmp_path / "aten__linear.csv").write_text(header + ',CPU,"8,64;128,64;128",FLOAT;FLOAT;FLOAT,ND;ND;ND,9\n')
    (tmp_path / "aten__addmm.csv").write_text(header + ',CPU,"128;8,64;64,128",FLOAT;FLOAT;FLOAT,ND;ND;ND,7\n')
    with pytest.raises(ConfigError, match="aten::addmm and aten::linear"):
        collected_records(tmp_path, hardware="cpu")
    only = collected_records(tmp_path, hardware="cpu", kernel_types=["aten::linear"])
    assert [r.latency_s for r in only] == [pytest.approx(9e-6)]


def test_import_command_saves_a_snapshot_that_loads_to_the_same_digest(fixtures, tmp_path):
    from typer.testing import CliRunner

    from perfcast.cli.main import app
    from perfcast.evidence.database import PerformanceDatabase

    parse_profiling(fixtures / "ascend_prof", tmp_path / "db")
    out = tmp_path / "snap"
    res = CliRunner().invoke(app, ["collect", "import", "--database-path", str(tmp_path / "db"),
                                   "--output", str(out), "--hardware",
                                   "atlas_800_a3_752t_128g_die", "--runtime", "vllm"])
    assert res.exit_code == 0, res.output
    db = PerformanceDatabase.load(out)
    assert f"2 records, digest {db.digest}" in res.output      # the two MatMulV2 shapes
    assert {r.selector["m"] for r in db.records()} == {128, 1024}
    runs = db.sources[0]["collection_runs"]
    assert runs[0]["profiles"][0]["path"].endswith("kernel_details.csv")
    # importing again replaces the snapshot in place with identical content
    res = CliRunner().invoke(app, ["collect", "import", "--database-path", str(tmp_path / "db"),
                                   "--output", str(out), "--hardware",
                                   "atlas_800_a3_752t_128g_die", "--runtime", "vllm"])
    assert res.exit_code == 0 and PerformanceDatabase.load(out).digest == db.digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db", "snap"]


def test_parsed_kernel_tables_answer_the_profiling_compute_path(fixtures, tmp_path):
    from perfcast.core.frozen import FrozenDict
    from perfcast.evidence.profiling.op_invoke import OpInvokeInfo
    from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
    from perfcast.hardware import load_system
    from perfcast.workload.tensors import TensorSpec

    parse_profiling(fixtures / "ascend_prof", tmp_path)
    (tmp_path / "op_mapping.yaml").write_text(
        'operator_mappings:\n  "aten.mm.default":\n    kernel_type: MatMulV2\n')
    ds = ProfilingDataSource(tmp_path, load_system("atlas_800_a3_752t_128g_die"))
    hit = ds.lookup(OpInvokeInfo("aten.mm.default", (TensorSpec((128, 5120), "bf16"),
                                                     TensorSpec((5120, 1280), "bf16")),
                                 dims=FrozenDict(m=128, n=1280, k=5120)))
    assert hit.source.value == "MEASURED" and hit.latency_us == pytest.approx(20.7)


def test_import_command_adds_to_the_evidence_store(fixtures, tmp_path):
    from typer.testing import CliRunner

    from perfcast.cli.main import app
    from perfcast.evidence.store import EvidenceStore

    parse_profiling(fixtures / "ascend_prof", tmp_path / "db")
    args = ["collect", "import", "--database-path", str(tmp_path / "db"), "--hardware",
            "atlas_800_a3_752t_128g_die"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "--output/--to-store" in res.output
    res = CliRunner().invoke(app, args + ["--to-store", "--store", str(tmp_path / "store")])
    assert res.exit_code == 0, res.output
    (digest,) = EvidenceStore(tmp_path / "store").digests()
    assert digest in res.output
    assert len(EvidenceStore(tmp_path / "store").get(digest[:16])) == 2
