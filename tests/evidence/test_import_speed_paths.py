"""Import speed paths that must not change a table: constant columns built directly,
and a one-chunk column kept as it is."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from perfcast.evidence.database import _one_array
from perfcast.evidence.importers.common import const


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_const_equals_a_one_entry_dictionary_cast_to_strings(n):
    value = "sha256:" + "ab" * 32
    old = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                         pa.array([value], pa.string())).cast(pa.string())
    new = const(value, n)
    assert new.type == pa.string() and new.equals(old) and new.null_count == 0


def test_one_array_keeps_a_single_chunk_and_combines_several():
    a = pa.array(["x", "y", None, "z"])
    assert _one_array(a) is a
    one = pa.chunked_array([a.slice(1, 3)])
    assert _one_array(one).equals(one.combine_chunks())
    many = pa.chunked_array([a, a.slice(2)])
    assert _one_array(many).equals(many.combine_chunks())
    empty = pa.chunked_array([], type=pa.string())
    assert _one_array(empty).equals(empty.combine_chunks())
