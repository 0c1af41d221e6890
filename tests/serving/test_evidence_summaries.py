"""Grouped summaries of evidence tables (evidence.deployment) equal their row-by-row
definitions: the (operation, dtype) pairs, the rows per kernel implementation and the
single-valued selectors per operation, in the same order."""

from __future__ import annotations

import collections
import itertools
from pathlib import Path

import pytest

from perfcast.evidence.deployment import (_implementation_counts, _pairs, _selection,
                                          family_versions, implementations,
                                          operation_selectors)
from perfcast.evidence.importers.aiconfigurator import import_system

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "aiconfigurator"


@pytest.mark.parametrize("family,backend,version", [("gemm", "vllm", "0.19.0"),
                                                    ("moe", "vllm", "0.24.0"),
                                                    ("comm", "vllm", "0.19.0")])
def test_table_summaries_equal_their_row_by_row_definitions(family, backend, version):
    """The grouped (pyarrow) summaries of an evidence table equal the row-by-row
    definitions, including the order of operation_selectors' entries."""
    db = import_system(ROOT / "h100_sxm" / family / backend / version, hardware="h100_sxm")
    assert db.table.num_rows
    t = db.table
    ops, dtypes = t.column("operation").to_pylist(), t.column("dtype").to_pylist()
    assert _pairs(db) == frozenset(zip(ops, dtypes))
    impls = (t.column("sel.str.implementation").to_pylist()
             if "sel.str.implementation" in t.column_names else None)
    assert _implementation_counts(db) == (collections.Counter(zip(ops, dtypes, impls))
                                          if impls else collections.Counter())
    chosen = collections.defaultdict(set)
    for key, impl in implementations(db).items():
        chosen[key.split("@", 1)[0]].add(impl)
    expected: dict = {}
    for name in t.column_names:
        if not name.startswith("sel.str.") or name in ("sel.str.implementation",
                                                        "sel.str.runtime",
                                                        "sel.str.runtime_revision"):
            continue
        values: dict = collections.defaultdict(set)
        for op, impl, v in zip(ops, impls or itertools.repeat(None), t.column(name).to_pylist()):
            if v and (impl is None or not chosen[op] or impl in chosen[op]):
                values[op].add(v)
        for op, vs in values.items():
            if len(vs) == 1:
                expected.setdefault(op, {})[name[len("sel.str."):]] = next(iter(vs))
    got = operation_selectors(db)
    assert got == expected
    assert [(k, list(v.items())) for k, v in got.items()] == \
        [(k, list(v.items())) for k, v in expected.items()]


def test_selection_with_pairs_read_once_equals_the_plain_selection():
    """The loader hands `_selection` each folder's pairs computed once; the selection is
    the one `_pairs` of every read gives."""
    available = family_versions(ROOT, "h100_sxm", "vllm")
    parts = {}

    def read(family, version):
        key = (family, version)
        if key not in parts:
            parts[key] = import_system(ROOT / "h100_sxm" / family / "vllm" / version,
                                       hardware="h100_sxm")
        return parts[key]

    calls = collections.Counter()

    def pairs_of(family, version, db):
        calls[(family, version)] += 1
        return _pairs(db)

    for version in ("0.19.0", "0.23.0", "0.24.0"):
        assert _selection(available, version, read, "set", pairs_of) == \
            _selection(available, version, read, "set")
    assert calls and set(calls) <= set(parts)


def _version_folders():
    return sorted(p for p in ROOT.glob("h100_sxm/*/*/*") if p.is_dir())


@pytest.mark.parametrize("folder", _version_folders(), ids=lambda p: "/".join(p.parts[-3:]))
def test_pairs_read_light_hold_every_pair_of_the_full_import(folder):
    from perfcast.evidence.importers.aiconfigurator import pairs_at_most

    full = _pairs(import_system(folder, hardware="h100_sxm"))
    bound = pairs_at_most(folder)
    assert full and bound is not None and full <= bound


def test_pairs_read_light_are_unknown_for_a_table_the_import_refuses(tmp_path):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from perfcast.core.errors import ConfigError
    from perfcast.evidence.importers.aiconfigurator import pairs_at_most

    src = ROOT / "h100_sxm" / "gemm" / "vllm" / "0.19.0"
    folder = tmp_path / "h100_sxm" / "gemm" / "vllm" / "0.19.0"
    shutil.copytree(src, folder)
    path = folder / "gemm_perf.parquet"
    t = pq.read_table(path)
    i = t.column_names.index("gemm_dtype")
    pq.write_table(t.set_column(i, "gemm_dtype", pa.array(["no_such_dtype"] * t.num_rows)),
                   path)
    with pytest.raises(ConfigError):
        import_system(folder, hardware="h100_sxm")
    assert pairs_at_most(folder) is None
    assert pairs_at_most(tmp_path / "missing") is None


def test_selection_passing_over_versions_by_their_light_pairs_equals_the_plain_one():
    """A version whose pairs read light add nothing to what is covered is not read, and
    the selection is the one every full read gives; a bound that is unknown (None) or
    wider than the real pairs changes nothing either."""
    from perfcast.evidence.importers.aiconfigurator import pairs_at_most

    available = family_versions(ROOT, "h100_sxm", "vllm")
    reads = collections.Counter()

    def read(family, version):
        reads[(family, version)] += 1
        return import_system(ROOT / "h100_sxm" / family / "vllm" / version,
                             hardware="h100_sxm")

    def light(family, version):
        return pairs_at_most(ROOT / "h100_sxm" / family / "vllm" / version)

    def wide(family, version):
        return (light(family, version) or frozenset()) | {("gemm", "no_such_dtype")}

    for version in ("0.19.0", "0.23.0", "0.24.0"):
        plain = _selection(available, version, read, "set")
        plain_reads, reads = reads, collections.Counter()
        assert _selection(available, version, read, "set", None, light) == plain
        assert sum(reads.values()) < sum(plain_reads.values())   # some were passed over
        reads.clear()
        assert _selection(available, version, read, "set", None, lambda f, v: None) == plain
        assert _selection(available, version, read, "set", None, wide) == plain
        reads.clear()
