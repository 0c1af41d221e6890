"""Property tests of the CSV/JSON and Parquet importers: a table with one malformed row
anywhere never imports partially, and the error names the row (and the column)."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from evidence_helpers import write_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfcast.core.errors import ConfigError
from perfcast.core.frozen import FrozenDict
from perfcast.evidence.contracts import CostSubject, EstimateMethod
from perfcast.evidence.importers.aiconfigurator import import_table
from perfcast.evidence.importers.tabular import (
    LatencyUnit,
    SimulatorPerformanceImporter,
    TabularImportSpec,
)

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
FIX = Path(__file__).parents[1] / "fixtures" / "aiconfigurator" / "h100_sxm"
GEMM = FIX / "gemm" / "vllm" / "0.19.0" / "gemm_perf.parquet"

SPEC = TabularImportSpec(
    name="lab", subject=CostSubject.OPERATOR, source="lab", source_revision="r1",
    method=EstimateMethod.MEASURED, latency_column="t_us", latency_unit=LatencyUnit.MICROSECONDS,
    operation_column="op", hardware="h100_sxm", datatype="bf16",
    selector_columns=FrozenDict({"m": "M", "n": "N"}),
    selector_types=FrozenDict({"m": "int", "n": "int"}), record_id_column="id")

good_rows = st.lists(st.fixed_dictionaries({
    "M": st.integers(1, 1 << 20), "N": st.integers(1, 1 << 20),
    "t_us": st.floats(1e-3, 1e6, allow_nan=False),
    "op": st.sampled_from(["gemm", "norm", "all_reduce"])}), min_size=1, max_size=12)

# (column, bad value, whether CSV keeps it distinct from a good cell)
BAD_CELLS = [("t_us", -1.0), ("t_us", 0), ("t_us", "nan"), ("t_us", "fast"), ("M", "1.5"),
             ("M", ""), ("N", "x"), ("op", "gemmm"), ("op", "")]


def write(folder: Path, fmt: str, rows: list[dict]) -> Path:
    return write_rows(folder / f"t.{fmt}", rows)


@pytest.fixture()
def folder():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@SETTINGS
@given(good_rows, st.data(), st.sampled_from(["csv", "jsonl"]))
def test_one_bad_cell_fails_the_whole_table_naming_its_row(folder, rows, data, fmt):
    rows = [{"id": f"r{i}", **r} for i, r in enumerate(rows)]
    bad_row = data.draw(st.integers(0, len(rows) - 1))
    column, value = data.draw(st.sampled_from(BAD_CELLS + [("id", "r0" if bad_row else "")]))
    if fmt == "jsonl" and column in ("M", "N", "t_us") and isinstance(value, str) \
            and value not in ("",):
        value = {"M": 1.5, "N": "x"}.get(column, value)
    rows[bad_row] = {**rows[bad_row], column: value}
    with pytest.raises(ConfigError) as err:
        SimulatorPerformanceImporter.from_file(write(folder, fmt, rows), SPEC)
    assert re.search(rf"\brow {bad_row}\b", str(err.value)), str(err.value)
    assert f"'{column}'" in str(err.value) or column == "op" and "operation" in str(err.value)


@SETTINGS
@given(good_rows, st.data())
def test_a_csv_row_with_more_or_fewer_cells_is_named(folder, rows, data):
    path = write(folder, "csv", [{"id": f"r{i}", **r} for i, r in enumerate(rows)])
    lines = path.read_text().splitlines()
    bad = data.draw(st.integers(0, len(rows) - 1))
    lines[bad + 1] += data.draw(st.sampled_from([",extra", ",1,2"]))
    if data.draw(st.booleans()):
        lines[bad + 1] = lines[bad + 1].rsplit(",", 3)[0]  # fewer cells
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=rf"row {bad} \(line {bad + 2}\): \d+ cells, "
                                          r"the header has 5"):
        SimulatorPerformanceImporter.from_file(path, SPEC)


PARQUET_BAD = [("latency", -1.0), ("latency", 0.0), ("latency", float("nan")),
               ("latency", None), ("m", None), ("m", -5), ("gemm_dtype", None),
               ("gemm_dtype", "fp7"), ("kernel_source", None)]


@SETTINGS
@given(st.data())
def test_a_bad_parquet_row_fails_the_table_naming_the_row(folder, data):
    table = pq.read_table(GEMM)
    row = data.draw(st.integers(0, table.num_rows - 1))
    column, value = data.draw(st.sampled_from(PARQUET_BAD))
    values = table.column(column).to_pylist()
    values[row] = value
    i = table.column_names.index(column)
    table = table.set_column(i, column, pa.array(values, table.schema.field(column).type))
    path = folder / "gemm_perf.parquet"
    pq.write_table(table, path)
    with pytest.raises(ConfigError) as err:
        import_table(path, hardware="h100_sxm", framework="vllm", version="0.19.0")
    text = str(err.value)
    first_bad = row if column != "gemm_dtype" or value is None else \
        min(r for r, v in enumerate(values) if v == "fp7")
    assert f"'{column}'" in text and (f"row {first_bad}" in text or "fp7" in text), text


@SETTINGS
@given(st.data())
def test_zero_sized_parquet_rows_are_left_out_and_listed(folder, data):
    table = pq.read_table(GEMM)
    rows = sorted(data.draw(st.sets(st.integers(0, table.num_rows - 1), min_size=1,
                                    max_size=8)))
    column = data.draw(st.sampled_from(["m", "n", "k"]))
    values = table.column(column).to_pylist()
    for r in rows:
        values[r] = 0
    i = table.column_names.index(column)
    table = table.set_column(i, column, pa.array(values, table.schema.field(column).type))
    pq.write_table(table, folder / "gemm_perf.parquet")
    db = import_table(folder / "gemm_perf.parquet", hardware="h100_sxm", framework="vllm",
                      version="0.19.0")
    assert len(db) == table.num_rows - len(rows)
    left = db.sources[0]["left_out"]
    assert left["rows"] == len(rows) and left["first_rows"] == rows[:5]
    assert f"{column}=0" in left["reason"]
    kept = {int(r.rsplit("#", 1)[1]) for r in db.table.column("record_id").to_pylist()}
    assert kept.isdisjoint(rows) and len(kept) == len(db)


def test_the_property_tables_import_when_nothing_is_broken(folder):
    rows = [{"id": "a", "M": 1, "N": 2, "t_us": 3.0, "op": "gemm"},
            {"id": "b", "M": 2, "N": 2, "t_us": 4.0, "op": "norm"}]
    for fmt in ("csv", "jsonl", "parquet"):
        db = SimulatorPerformanceImporter.from_file(write(folder, fmt, rows), SPEC)
        assert len(db) == 2
    shutil.copy(GEMM, folder / "gemm_perf.parquet")
    assert len(import_table(folder / "gemm_perf.parquet", hardware="h100_sxm",
                            framework="vllm", version="0.19.0")) == 148


@SETTINGS
@given(st.data())
def test_rows_of_an_unmodelled_quant_mode_are_left_out_and_listed(folder, data):
    """AIConfigurator quant modes perfcast has no dtype for (e.g. `sq`, SmoothQuant INT8,
    which its Ampere GEMM collector writes) leave their rows out with the reason; the
    other rows import under their own row numbers, zero-sized shapes still counted by
    theirs."""
    table = pq.read_table(GEMM)
    n = table.num_rows
    rows = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=8)))
    mode = data.draw(st.sampled_from(["sq", "fp8_static", "FP8_OOTB", "w4afp8",
                                      "w4a8_mxfp4_mxfp8"]))
    dtypes = table.column("gemm_dtype").to_pylist()
    for r in rows:
        dtypes[r] = mode
    zero = data.draw(st.sampled_from([r for r in range(n) if r not in rows][:50]))
    ms = table.column("m").to_pylist()
    ms[zero] = 0
    for name, values in (("gemm_dtype", dtypes), ("m", ms)):
        i = table.column_names.index(name)
        table = table.set_column(i, name, pa.array(values, table.schema.field(name).type))
    pq.write_table(table, folder / "gemm_perf.parquet")
    db = import_table(folder / "gemm_perf.parquet", hardware="h100_sxm", framework="vllm",
                      version="0.19.0")
    source = db.sources[0]
    left = source["left_out_quant_modes"]
    assert left["rows"] == len(rows) and left["first_rows"] == rows[:5]
    assert mode.lower() in left["reason"]
    assert source["left_out"]["first_rows"] == [zero]
    assert len(db) == source["rows"] == n - len(rows) - 1
    kept = {int(r.rsplit("#", 1)[1]) for r in db.table.column("record_id").to_pylist()}
    assert kept == set(range(n)) - set(rows) - {zero}
    assert "" not in set(db.table.column("dtype").to_pylist())


def test_a_table_of_unmodelled_quant_modes_only_fails_naming_them(folder):
    table = pq.read_table(GEMM)
    i = table.column_names.index("gemm_dtype")
    table = table.set_column(i, "gemm_dtype", pa.array(["sq"] * table.num_rows))
    pq.write_table(table, folder / "gemm_perf.parquet")
    with pytest.raises(ConfigError, match=r"every row is of a quant mode perfcast does not "
                                          r"model: sq \(W8A8 SmoothQuant INT8\)"):
        import_table(folder / "gemm_perf.parquet", hardware="h100_sxm", framework="vllm",
                     version="0.19.0")
