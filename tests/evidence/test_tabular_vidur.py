"""Tabular and Vidur importers: declared mappings, strict types, errors that name the row."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest
from evidence_helpers import gemm_query, write_rows

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostQuery, CostSubject, EstimateMethod, Miss
from perfcast.evidence.importers.tabular import (
    LatencyUnit,
    SimulatorPerformanceImporter,
    TabularImportSpec,
    load_spec,
)
from perfcast.evidence.importers.vidur import VidurProfileImporter
from perfcast.evidence.provider_db import PerformanceDatabaseProvider

VIDUR = Path(__file__).parents[1] / "fixtures" / "vidur"

SPEC = TabularImportSpec(
    name="noc-sim-r7", subject=CostSubject.COMMUNICATION, source="our-network-simulator",
    source_revision="git:4e5c", method=EstimateMethod.SIMULATED, latency_column="latency_us",
    latency_unit=LatencyUnit.MICROSECONDS, operation_column="collective",
    hardware="h100_sxm", datatype_column="dtype",
    selector_columns=FrozenDict({"message_bytes": "bytes", "participants": "ranks"}),
    selector_types=FrozenDict({"message_bytes": "int", "participants": "int"}),
    record_id_column="run_id")

ROWS = [{"run_id": "a", "collective": "all_reduce", "dtype": "bfloat16", "bytes": 1048576,
         "ranks": 8, "latency_us": 20.0},
        {"run_id": "b", "collective": "all_reduce", "dtype": "bfloat16", "bytes": 1048576,
         "ranks": 8, "latency_us": 30.0},
        {"run_id": "c", "collective": "all_gather", "dtype": "bfloat16", "bytes": 4096,
         "ranks": 4, "latency_us": 7.5}]


def write(tmp_path, fmt, rows=ROWS):
    return write_rows(tmp_path / f"sim.{fmt}", rows)


def comm_query(op, mb, p):
    return CostQuery(subject=CostSubject.COMMUNICATION, operation=op, hardware="h100_sxm",
                     dtype="bf16", dims=FrozenDict({"message_bytes": mb, "participants": p}))


@pytest.mark.parametrize("fmt", ["csv", "json", "jsonl", "parquet"])
def test_every_format_gives_the_same_records(tmp_path, fmt):
    db = SimulatorPerformanceImporter.from_file(write(tmp_path, fmt), SPEC)
    p = PerformanceDatabaseProvider(db)
    est = p.estimate(comm_query("all_reduce", 1048576, 8))
    assert est.latency_s == pytest.approx(25e-6)  # median of 20 and 30 us
    assert est.method is EstimateMethod.SIMULATED
    assert set(est.raw_record_ids) == {"a", "b"}
    assert p.estimate(comm_query("all_gather", 4096, 4)).latency_s == pytest.approx(7.5e-6)
    assert [dict(r.selector) for r in db.records()][2] == {"message_bytes": 4096,
                                                           "participants": 4}


@pytest.mark.parametrize("fmt,bad,message", [
    ("csv", {"ranks": "8.0"}, r"sim.csv: field 'ranks': row 1 \(line 3\): '8.0' is not an int"),
    ("json", {"ranks": 8.0}, r"sim.json: field 'ranks': row 1: 8.0 is not an integer"),
    ("json", {"ranks": True}, r"field 'ranks': row 1: True is not an integer"),
    ("csv", {"latency_us": "nan"}, r"field 'latency_us': row 1 .*'nan' is not finite"),
    ("json", {"latency_us": -3}, r"field 'latency_us': row 1: latency must be > 0"),
    ("csv", {"bytes": ""}, r"field 'bytes': row 1 \(line 3\): empty value"),
    ("json", {"dtype": "fp7"}, r"unknown dtype 'fp7'"),
])
def test_bad_cells_fail_the_whole_import(tmp_path, fmt, bad, message):
    rows = [dict(ROWS[0]), {**ROWS[1], **bad}]
    with pytest.raises(ConfigError, match=message):
        SimulatorPerformanceImporter.from_file(write(tmp_path, fmt, rows), SPEC)


def test_missing_column_and_empty_file(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "ranks"} for r in ROWS]
    with pytest.raises(ConfigError, match="field 'ranks': row 0: missing column"):
        SimulatorPerformanceImporter.from_file(write(tmp_path, "json", rows), SPEC)
    empty = tmp_path / "e.json"
    empty.write_text("[]")
    with pytest.raises(ConfigError, match="no data rows"):
        SimulatorPerformanceImporter.from_file(empty, SPEC)


def test_spec_must_declare_everything(tmp_path):
    with pytest.raises(ConfigError, match="without a declared type"):
        dataclasses.replace(SPEC, selector_types=FrozenDict())
    with pytest.raises(ConfigError, match="exactly one of operation"):
        dataclasses.replace(SPEC, operation="all_reduce")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        "name: n\nsubject: operator\nsource: s\nsource_revision: r\nmethod: measured\n"
        "latency_column: t\nlatency_unit: ms\noperation: gemm\nhardware: h100_sxm\n"
        "datatype: bf16\nselector_columns: {m: M}\nselector_types: {m: int}\n")
    spec = load_spec(spec_file)
    assert spec.latency_unit is LatencyUnit.MILLISECONDS and spec.selector_columns["m"] == "M"
    spec_file.write_text(spec_file.read_text() + "unit: ms\n")
    with pytest.raises(ConfigError, match="unknown field.*unit"):
        load_spec(spec_file)


def _vidur_row(name, i=0):
    with open(VIDUR / name, newline="") as f:
        return list(csv.DictReader(f))[i]


def test_vidur_mlp_gemms_have_llama_shapes():
    db = VidurProfileImporter.from_csv(VIDUR / "h100_Llama-2-7b-hf_mlp.csv",
                                       hardware="h100_sxm", dtype="fp16")
    row = _vidur_row("h100_Llama-2-7b-hf_mlp.csv", 3)
    t = int(row["num_tokens"])
    p = PerformanceDatabaseProvider(db)
    # Llama-2-7B, TP1: qkv 4096 -> 3 x 4096; up+gate 4096 -> 2 x 11008; down 11008 -> 4096
    for (n, k), op in (((12288, 4096), "attn_pre_proj"), ((22016, 4096), "mlp_up_proj"),
                       ((4096, 11008), "mlp_down_proj"), ((4096, 4096), "attn_post_proj")):
        est = p.estimate(gemm_query(t, n, k, dtype="fp16"))
        assert not isinstance(est, Miss), op
        assert est.latency_s == pytest.approx(float(row[f"time_stats.{op}.median"]) * 1e-3)


def test_vidur_network_profiles():
    db = VidurProfileImporter.from_csv(VIDUR / "h100_dgx_send_recv.csv", hardware="h100_sxm",
                                       dtype="fp16")
    p = PerformanceDatabaseProvider(db)
    intra = _vidur_row("h100_dgx_send_recv.csv", 3)  # devices_per_node 2: one node
    q = CostQuery(subject=CostSubject.COMMUNICATION, operation="send_recv", hardware="h100_sxm",
                  dtype="fp16", dims=FrozenDict({"message_bytes": int(intra["size"]),
                                                 "participants": 2}))
    assert p.estimate(q).latency_s == pytest.approx(
        float(intra["time_stats.send_recv.median"]) * 1e-3)
    cross = _vidur_row("h100_dgx_send_recv.csv", 0)  # devices_per_node 1: two nodes
    q2 = CostQuery(subject=CostSubject.COMMUNICATION, operation="send_recv", hardware="h100_sxm",
                   dtype="fp16", dims=FrozenDict({"message_bytes": int(cross["size"]),
                                                  "participants": 2, "nodes": 2}))
    assert p.estimate(q2).latency_s == pytest.approx(
        float(cross["time_stats.send_recv.median"]) * 1e-3)
    ar = VidurProfileImporter.from_csv(VIDUR / "h100_dgx_all_reduce.csv", hardware="h100_sxm",
                                       dtype="fp16")
    assert {r.operation for r in ar.records()} == {"all_reduce"}


def test_vidur_bad_cell_names_the_line(tmp_path):
    text = (VIDUR / "h100_dgx_all_reduce.csv").read_text().splitlines()
    cells = text[2].split(",")
    cells[8] = "abc"  # size
    text[2] = ",".join(cells)
    bad = tmp_path / "all_reduce.csv"
    bad.write_text("\n".join(text) + "\n")
    with pytest.raises(ConfigError, match=r"all_reduce.csv: field 'size': row 1 \(line 3\): 'abc' is not"):
        VidurProfileImporter.from_csv(bad, hardware="h100_sxm", dtype="fp16")
