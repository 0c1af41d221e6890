"""The column layout of a performance database table (`evidence.database`), shared by
the database and its catalog (`evidence.catalog`) so neither imports the other."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

CORE_COLUMNS = ("subject", "operation", "hardware", "dtype")
PROVENANCE_COLUMNS = ("source", "source_revision", "importer", "importer_revision",
                      "source_digest", "method")
STRING_COLUMNS = ("record_id", *CORE_COLUMNS, *PROVENANCE_COLUMNS, "metadata")
SEL_PREFIX = "sel."
SEL_ARROW: dict[str, pa.DataType] = {"bool": pa.bool_(), "int": pa.int64(),
                                     "float": pa.float64(), "str": pa.string()}


def selector_column(key: str, kind: str) -> str:
    return f"{SEL_PREFIX}{kind}.{key}"


def parse_selector_column(name: str) -> tuple[str, str]:
    """'sel.int.m' -> ('m', 'int')."""
    _, kind, key = name.split(".", 2)
    return key, kind


def dictionary_codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list]:
    """(int64 code per row, -1 for null; the distinct values), without concatenating
    the chunks (copying a million strings costs more than encoding them)."""
    chunked = column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column])
    if chunked.num_chunks == 0 or len(chunked) == 0:
        return np.zeros(0, dtype=np.int64), []
    enc = chunked.dictionary_encode().unify_dictionaries()
    codes = np.concatenate([np.asarray(c.indices.fill_null(-1).to_numpy(), dtype=np.int64)
                            for c in enc.chunks])
    return codes, enc.chunks[0].dictionary.to_pylist()
