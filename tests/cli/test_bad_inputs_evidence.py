"""Bad inputs to `perfcast evidence ...`: each exits 2 with one message naming the file,
field and row, never a traceback, and leaves nothing in the store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from perfcast.cli.main import app

FIXTURES = Path(__file__).parents[1] / "fixtures"
AIC = FIXTURES / "aiconfigurator" / "h100_sxm"
VIDUR = FIXTURES / "vidur"
SPEC = ("name: lab\nsubject: operator\nsource: lab\nsource_revision: r1\nmethod: measured\n"
        "latency_column: t_us\nlatency_unit: us\noperation_column: op\nhardware: {hw}\n"
        "datatype: bf16\nselector_columns: {{m: M}}\nselector_types: {{m: int}}\n"
        "record_id_column: id\n")


def refused(result, store: Path, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.output.startswith("error: ") and result.output.count("error: ") == 1
    for needle in needles:
        assert needle in result.output, (needle, result.output)
    if store.exists():
        assert not list(store.glob("snapshots/*")) and not list(store.glob(".tmp-*"))
        assert not (store / "imports.jsonl").exists()


def run(*args):
    return CliRunner().invoke(app, ["evidence", *map(str, args)])


def table_import(tmp_path, csv_text: str, hw: str = "h100_sxm"):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(hw=hw))
    path = tmp_path / "lab.csv"
    path.write_text(csv_text)
    return run("import", "table", path, "--spec", spec, "--store", tmp_path / "store")


def test_an_unknown_system_is_refused(tmp_path):
    store = tmp_path / "store"
    refused(run("import", "aiconfigurator", AIC / "gemm", "--system", "h999", "--store", store),
            store, "field '--system'", "unknown system 'h999'", "h100_sxm")
    refused(run("import", "vidur", VIDUR / "h100_dgx_all_reduce.csv", "--system", "h999",
                "--dtype", "bf16", "--store", store), store, "field '--system'", "'h999'")
    refused(table_import(tmp_path, "id,op,M,t_us\na,gemm,1,2\n", hw="h999"), store,
            "spec.yaml", "field 'hardware'", "unknown system 'h999'")


def test_a_system_the_device_column_contradicts_is_refused(tmp_path):
    store = tmp_path / "store"
    refused(run("import", "aiconfigurator", AIC / "gemm" / "vllm" / "0.19.0", "--system",
                "h200_sxm", "--store", store), store, "gemm_perf.parquet", "field 'device'",
            "row 0", "'NVIDIA H100 80GB HBM3' (h100_sxm), not h200_sxm")


def gemm_without_device(system_folder: Path) -> None:
    """A copy of the vllm 0.19.0 gemm table under `system_folder`, without its device."""
    folder = system_folder / "gemm" / "vllm" / "0.19.0"
    shutil.copytree(AIC / "gemm" / "vllm" / "0.19.0", folder)
    t = pq.read_table(folder / "gemm_perf.parquet").drop_columns(["device"])
    pq.write_table(t, folder / "gemm_perf.parquet")


def test_a_system_the_folder_layout_contradicts_is_refused(tmp_path):
    gemm_without_device(tmp_path / "b200_sxm")
    store = tmp_path / "store"
    refused(run("import", "aiconfigurator", tmp_path / "b200_sxm", "--system", "h100_sxm",
                "--store", store), store, "field '--system'", "holds b200_sxm tables")


def test_a_folder_that_names_no_system_needs_one(tmp_path):
    gemm_without_device(tmp_path / "lab")
    store = tmp_path / "store"
    refused(run("import", "aiconfigurator", tmp_path / "lab", "--store", store), store,
            "gemm_perf.parquet", "cannot tell which system", "--system")
    refused(run("query", tmp_path / "lab", "--operation", "gemm", "--dim", "m=1", "--store",
                store), store, "cannot tell which system")


@pytest.mark.parametrize("column,value,needles", [
    ("latency", -1.0, ("field 'latency'", "row 5")),
    ("m", None, ("field 'm'", "row 5", "empty value")),
    ("m", -3, ("field 'm'", "row 5", "not a positive size")),
])
def test_a_bad_parquet_row_is_named(tmp_path, column, value, needles):
    folder = tmp_path / "h100_sxm" / "gemm" / "vllm" / "0.19.0"
    shutil.copytree(AIC / "gemm" / "vllm" / "0.19.0", folder)
    t = pq.read_table(folder / "gemm_perf.parquet")
    values = t.column(column).to_pylist()
    values[5] = value
    i = t.column_names.index(column)
    pq.write_table(t.set_column(i, column, pa.array(values, t.schema.field(column).type)),
                   folder / "gemm_perf.parquet")
    store = tmp_path / "store"
    refused(run("import", "aiconfigurator", tmp_path / "h100_sxm", "--store", store), store,
            "gemm_perf.parquet", *needles)


def test_zero_sized_parquet_rows_are_left_out_and_said(tmp_path):
    """A real H100 table (gemm/trtllm/1.2.0rc5) holds m = 0 rows: no query asks a
    zero-sized shape, so they are left out of the snapshot and the report names them;
    the rest imports (a negative size stays an error, above)."""
    folder = tmp_path / "h100_sxm" / "gemm" / "vllm" / "0.19.0"
    shutil.copytree(AIC / "gemm" / "vllm" / "0.19.0", folder)
    t = pq.read_table(folder / "gemm_perf.parquet")
    values = t.column("m").to_pylist()
    values[5] = values[7] = 0
    i = t.column_names.index("m")
    pq.write_table(t.set_column(i, "m", pa.array(values, t.schema.field("m").type)),
                   folder / "gemm_perf.parquet")
    out = run("import", "aiconfigurator", tmp_path / "h100_sxm", "--store", tmp_path / "store")
    assert out.exit_code == 0, out.output
    assert f"{t.num_rows - 2} records" in out.output
    assert "left out 2 row(s) of gemm/vllm/0.19.0/gemm_perf.parquet" in out.output
    assert "zero-sized shape (m=0)" in out.output and "(rows 5, 7)" in out.output


def test_rows_of_an_unmodelled_quant_mode_are_left_out_and_said(tmp_path):
    """AIConfigurator's SmoothQuant INT8 GEMM rows (`gemm_dtype` sq) have no perfcast
    dtype: the import leaves them out, names them and imports the rest of the table."""
    folder = tmp_path / "h100_sxm" / "gemm" / "vllm" / "0.19.0"
    shutil.copytree(AIC / "gemm" / "vllm" / "0.19.0", folder)
    t = pq.read_table(folder / "gemm_perf.parquet")
    values = t.column("gemm_dtype").to_pylist()
    values[3] = values[8] = "sq"
    i = t.column_names.index("gemm_dtype")
    pq.write_table(t.set_column(i, "gemm_dtype", pa.array(values)),
                   folder / "gemm_perf.parquet")
    out = run("import", "aiconfigurator", tmp_path / "h100_sxm", "--store", tmp_path / "store")
    assert out.exit_code == 0, out.output
    assert f"{t.num_rows - 2} records" in out.output
    assert ("left out 2 row(s) of gemm/vllm/0.19.0/gemm_perf.parquet: quant mode perfcast "
            "does not model: sq (W8A8 SmoothQuant INT8) (rows 3, 8)") in out.output


@pytest.mark.parametrize("csv_text,needles", [
    ("id,op,M,t_us\na,gemm,1,2\nb,gemm,2,2,9\n",
     ("lab.csv", "row 1 (line 3)", "5 cells, the header has 4")),
    ("id,op,M,t_us\na,gemm,1,2\nb,gemm,2\n", ("lab.csv", "row 1 (line 3)", "3 cells")),
    ("id,op,M,t_us\na,gemm,1,2\na,gemm,2,2\n",
     ("lab.csv", "field 'id'", "row 1 (line 3)", "record id 'a' is also row 0")),
    ("id,op,M,t_us\na,gemm,1,2\nb,matmul,2,2\n",
     ("lab.csv", "field 'op'", "row 1 (line 3)", "unknown operation 'matmul'")),
    ("id,op,M,t_us\na,gemm,1,2\nb,gemm,-2,x\n", ("lab.csv", "field 't_us'", "row 1 (line 3)")),
])
def test_a_bad_table_row_is_named(tmp_path, csv_text, needles):
    refused(table_import(tmp_path, csv_text), tmp_path / "store", *needles)


def test_a_bad_vidur_row_is_named(tmp_path):
    path = tmp_path / "h100_all_reduce.csv"
    path.write_text((VIDUR / "h100_dgx_all_reduce.csv").read_text().replace(
        "all_reduce", "allreduce"))
    store = tmp_path / "store"
    refused(run("import", "vidur", path, "--system", "h100_sxm", "--dtype", "bf16", "--store",
                store), store, "h100_all_reduce.csv", "field 'collective'", "row 0",
            "unknown operation 'allreduce'")


def test_bad_flags_and_files_are_named(tmp_path):
    store = tmp_path / "store"
    refused(run("import", "aiconfigurator", AIC, "--table", "gemm", "--store", store), store,
            "field '--table'", "unknown table(s) ['gemm']", "gemm_perf")
    refused(run("import", "table", tmp_path / "nope.csv", "--spec", tmp_path / "nope.yaml",
                "--store", store), store, "nope.yaml")
    refused(run("query", AIC / "gemm", "--hardware", "h999", "--operation", "gemm",
                "--store", store), store, "field '--hardware'", "'h999'")
    refused(run("query", AIC / "gemm", "--operation", "gemm", "--dim", "m=-5", "--store",
                store), store, "field '--dim m'", "m=-5 is not a positive number")
    refused(run("query", AIC / "gemm", "--queries", tmp_path / "missing.jsonl", "--store",
                store), store, "missing.jsonl", "cannot read")
    refused(run("show", "abcdef", "--store", store), store, "no snapshot 'abcdef'")
    refused(run("coverage", AIC / "gemm", "--hardware", "h999", "--store", store), store,
            "field '--hardware'")
