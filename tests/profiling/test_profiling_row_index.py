"""The compute path reads only the rows whose first input's last dim can match
(`KernelTable.rows_for` + `shape_rules.first_input_last_dims`): never a row that
`match_inputs` would accept is left out."""

import json

import pytest
from profiling_helpers import DB, FIA_DB
from tensorcast_database import TENSORCAST, tensors, write_database

from perfcast.evidence.profiling.kernel_csv import read_kernel_table
from perfcast.evidence.profiling.shape_rules import first_input_last_dims, match_inputs

DTYPES = {"float16": "bf16", "bfloat16": "bf16", "int8": "int8", "int64": "int64",
          "float32": "fp32", "int32": "int32"}


def _tables(root):
    out = []
    for folder in (DB, FIA_DB, root):
        for p in sorted(folder.rglob("*.csv")):
            if "hccl" not in p.parts:
                out.append(read_kernel_table(p.stem, p))
    return out


def _row_queries(table):
    """A table's rows' own inputs, with a leading 1, with input 0's first or last dim
    16-padded, and split per head."""
    out = []
    for r in table.rows:
        ins = [(s, d or "bf16") for s, d in zip(r.input_shapes, r.input_dtypes)]
        if not ins:
            continue
        (s0, d0), rest = ins[0], ins[1:]
        out += [ins, [((1, *s0), d0), *rest],
                [((-(-s0[0] // 16) * 16, *s0[1:]), d0), *rest],
                [((*s0[:-1], -(-s0[-1] // 16) * 16), d0), *rest]]
        if len(s0) == 2 and s0[1] % 128 == 0:  # per-head (T, H, D) of a (T, H*D) row
            out.append([((s0[0], s0[1] // 128, 128), d0), *rest])
    return out


def _tensorcast_queries():
    """The tensors of every TensorCast fixture call."""
    out = []
    for p in sorted(TENSORCAST.glob("*.json")):
        for call in json.loads(p.read_text())["calls"]:
            ins = [(s, DTYPES.get(d, d)) for s, d in tensors(call)]
            if ins and ins not in out:
                out.append(ins)
    return out


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("dbs")
    for case in ("qwen3_8b_decode_w8a8", "qwen3_32b_decode_tp4"):
        write_database(case, root / case)
    return _tables(root)


def test_the_row_index_never_drops_a_matching_row(tables):
    calls = _tensorcast_queries()
    checked = 0
    for t in tables:
        for ins in _row_queries(t) + calls:
            picked = {r.index for r in t.rows_for(first_input_last_dims(t.kernel_type, ins))}
            for count in (None, 1, 2, 3):
                for r in t.rows:
                    if match_inputs(t.kernel_type, ins, r, count) is not None:
                        assert r.index in picked, (t.kernel_type, ins, r.index)
                        checked += 1
    assert checked > 500


def test_rows_for_keeps_csv_order_and_the_unindexed_rows(tmp_path):
    p = tmp_path / "K.csv"
    p.write_text("Input Shapes,Input Data Types,Input Formats,Average Duration(us)\n"
                 '"8,4096;4096,4096",DT_BF16;DT_BF16,ND;ND,1\n'
                 '"8,320,48,16,16;4",DT_BF16;DT_BF16,FRACTAL_NZ;ND,2\n'   # NZ first input
                 '";8,4096",DT_UNDEFINED;DT_BF16,NULL;ND,3\n'               # empty slot 0
                 '"8,4095",DT_BF16,ND,4\n'
                 '"8,1024",DT_BF16,ND,5\n')
    t = read_kernel_table("K", p)
    assert [r.first_input_last_dim() for r in t.rows] == [4096, None, 4096, 4095, 1024]
    assert [r.latency_us for r in t.rows_for({4096})] == [1, 2, 3]
    assert [r.latency_us for r in t.rows_for(None)] == [1, 2, 3, 4, 5]
    # 4096 is 4095 padded to a tile: that row is read, and matches
    q = [((8, 4096), "bf16")]
    picked = t.rows_for(first_input_last_dims("K", q))
    assert [r.latency_us for r in picked] == [1, 2, 3, 4]
    assert match_inputs("K", q, t.rows[3], None) == "padding"


def test_an_unreadable_shape_is_an_error_when_read_and_in_validate(tmp_path, a3):
    from profiling_helpers import op

    from perfcast.core.errors import InvalidEvidenceError
    from perfcast.evidence.profiling.profiling_data_source import ProfilingDataSource
    from perfcast.evidence.profiling.validate import validate_database

    (tmp_path / "op_mapping.yaml").write_text(
        "operator_mappings:\n  aten.mm.default:\n    kernel_type: MatMulV2\n")
    (tmp_path / "MatMulV2.csv").write_text(
        "Input Shapes,Input Data Types,Input Formats,Average Duration(us)\n"
        '"8,4096;4096,x4096",DT_BF16;DT_BF16,ND;ND,1\n')
    report = validate_database(tmp_path)
    assert not report.ok and any("row 2: unreadable shape" in i.message for i in report.issues)
    with pytest.raises(InvalidEvidenceError, match="row 2: unreadable shape"):
        ProfilingDataSource(tmp_path, a3).lookup(
            op("aten.mm.default", [((8, 4096), "bf16"), ((4096, 4096), "bf16")]))
