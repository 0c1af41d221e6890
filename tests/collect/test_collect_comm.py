import pytest

from perfcast.collect.comm import (
    CommBenchConfig,
    CommMeasurement,
    CommResult,
    tables_from_result,
    topology_tier_for,
    write_comm_tables,
)
from perfcast.collect.tables import read_table
from perfcast.core.errors import ConfigError


def test_topology_tier_from_a3_grid():
    assert topology_tier_for(2, (48, 8, 2)) == 2      # the two dies of one chip
    assert topology_tier_for(16, (48, 8, 2)) == 1     # within the pod
    assert topology_tier_for(768, (48, 8, 2)) == 1
    assert topology_tier_for(1536, (48, 8, 2)) == 0   # beyond one pod
    assert topology_tier_for(32, (2, 8, 2)) == 1 and topology_tier_for(64, (2, 8, 2)) == 0
    assert CommBenchConfig(topology_tier=0).tier_for(2) == 0


def test_config_errors_name_the_flag():
    with pytest.raises(ConfigError, match="--ops"):
        CommBenchConfig(ops=("broadcast",))
    with pytest.raises(ConfigError, match="--grid-shape"):
        CommBenchConfig(grid_shape=(8, 2))
    with pytest.raises(ConfigError, match="--dtype"):
        CommBenchConfig(dtype="float7")


def test_rows_use_median_and_bytes_over_duration(tmp_path):
    cfg = CommBenchConfig(ops=("all_reduce",), dtype="torch.bfloat16")
    result = CommResult([CommMeasurement("all_reduce", 1_000_000, 2, (40.0, 50.0, 500.0))])
    row = tables_from_result(result, cfg)["hcom_allReduce_"].rows[0]
    assert row["Duration(us)"] == "50"                      # median of the slowest-rank times
    assert float(row["bandwidth_gbps"]) == pytest.approx(20.0)   # 1e6 B / 50 us = 20 GB/s
    assert (row["dtype"], row["topology_tier"], row["num_devices"]) == ("bf16", "2", "2")
    with pytest.raises(ConfigError, match="--output-csv"):
        write_comm_tables(result, CommBenchConfig(ops=("all_reduce", "all_gather")),
                          output_csv=tmp_path / "x.csv")


def test_gloo_two_processes_on_loopback(tmp_path, lookup_comm):
    pytest.importorskip("torch")
    from perfcast.collect.comm import run_local

    cfg = CommBenchConfig(ops=("all_reduce", "all_gather", "send_recv"), num_devices=(2,),
                          bytes_grid=(4096, 65536), dtype="fp32", warmup=1, iterations=3,
                          collective_timeout_s=30)
    result = run_local(cfg, 2, deadline_s=90)
    assert not result.failures
    written = write_comm_tables(result, cfg, database_path=tmp_path)
    assert sorted(p.name for p in written) == ["hcom_allGather_.csv", "hcom_allReduce_.csv",
                                               "hcom_send_.csv"]
    t = read_table(tmp_path / "hcom_allReduce_.csv")
    assert t.header[:6] == ["message_bytes", "num_devices", "dtype", "topology_tier",
                            "Duration(us)", "bandwidth_gbps"]
    assert [r["message_bytes"] for r in t.rows] == ["4096", "65536"]
    for r in t.rows:
        assert r["Count"] == "3" and float(r["Duration(us)"]) > 0
        assert float(r["bandwidth_gbps"]) == pytest.approx(
            int(r["message_bytes"]) / float(r["Duration(us)"]) / 1e3, rel=1e-3)
    # the tables answer TensorCast's communication path and import as evidence
    hit = lookup_comm(tmp_path, "all_reduce", 4096, 2)
    assert hit.source.value == "MEASURED"
    assert hit.latency_us == float(t.rows[0]["Duration(us)"])
    gathered = read_table(tmp_path / "hcom_allGather_.csv").rows[1]   # 65536 B per rank
    assert lookup_comm(tmp_path, "all_gather", 2 * 65536, 2).latency_us == \
        float(gathered["Duration(us)"])
    from perfcast.collect.evidence import collected_database

    db = collected_database(tmp_path, hardware="local_cpu", runtime="torch")
    recs = {(r.operation, r.selector["message_bytes"]): r for r in db.records()}
    assert recs[("all_gather", 2 * 65536)].latency_s == pytest.approx(
        float(gathered["Duration(us)"]) * 1e-6)
    assert {op for op, _ in recs} == {"all_reduce", "all_gather", "send_recv"}
    # ... and through the generic tabular importer with a declared mapping
    from perfcast.core.frozen import FrozenDict
    from perfcast.evidence.contracts import CostSubject, EstimateMethod
    from perfcast.evidence.importers.tabular import (
        LatencyUnit,
        SimulatorPerformanceImporter,
        TabularImportSpec,
    )

    spec = TabularImportSpec(
        name="hcom", subject=CostSubject.COMMUNICATION, source="perfcast collect comm",
        source_revision="test", method=EstimateMethod.MEASURED, latency_column="Duration(us)",
        latency_unit=LatencyUnit.MICROSECONDS, operation="all_reduce", hardware="local_cpu",
        datatype_column="dtype",
        selector_columns=FrozenDict({"message_bytes": "message_bytes",
                                     "participants": "num_devices"}),
        selector_types=FrozenDict({"message_bytes": "int", "participants": "int"}))
    tab = SimulatorPerformanceImporter.from_file(tmp_path / "hcom_allReduce_.csv", spec)
    assert sorted((r.selector["message_bytes"], r.latency_s) for r in tab.records()) == sorted(
        (r.selector["message_bytes"], r.latency_s) for r in db.records()
        if r.operation == "all_reduce")
