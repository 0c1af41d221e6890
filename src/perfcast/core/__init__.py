"""Foundation shared by every layer: canonical encoding, digests, dtypes, errors.

`perfcast.core` imports nothing else from perfcast.
"""

from perfcast.core.canonical import Record, canonical_json, content_digest
from perfcast.core.dtypes import DType, dtype_bytes, parse_dtype
from perfcast.core.errors import (
    AmbiguousEvidenceError,
    ConfigError,
    InvalidEvidenceError,
    PerfcastError,
    UnresolvedCostError,
    UnsupportedModelError,
)
from perfcast.core.frozen import FrozenDict, freeze

__all__ = [
    "AmbiguousEvidenceError",
    "ConfigError",
    "DType",
    "FrozenDict",
    "InvalidEvidenceError",
    "PerfcastError",
    "Record",
    "UnresolvedCostError",
    "UnsupportedModelError",
    "canonical_json",
    "content_digest",
    "dtype_bytes",
    "freeze",
    "parse_dtype",
]
