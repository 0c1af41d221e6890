import math
from dataclasses import dataclass

import pytest

from perfcast.core import FrozenDict, Record, canonical_json, content_digest
from perfcast.core.canonical import CanonicalEncodingError
from perfcast.core.dtypes import DType, dtype_bytes, parse_dtype
from perfcast.core.errors import ConfigError


@dataclass(frozen=True)
class Point(Record):
    x: int
    y: float
    tags: FrozenDict = FrozenDict()


def test_sorted_keys_and_exact_bytes():
    assert canonical_json({"b": 1, "a": [1.0, True, None, "x"]}) == \
        b'{"a":[1.0,true,null,"x"],"b":1}'


def test_int_float_bool_are_distinct():
    encodings = {canonical_json(v) for v in (1, 1.0, True)}
    assert len(encodings) == 3


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_rejected(bad):
    with pytest.raises(CanonicalEncodingError):
        canonical_json({"v": [1, bad]})


def test_record_tagged_with_type():
    assert canonical_json(Point(1, 2.0)) == b'{"$type":"Point","tags":{},"x":1,"y":2.0}'


def test_digest_independent_of_key_order_and_stable():
    a = Point(1, 2.5, FrozenDict({"a": 1, "b": 2}))
    b = Point(1, 2.5, FrozenDict({"b": 2, "a": 1}))
    assert a.digest == b.digest
    # Pinned: the canonical form must never change silently between releases.
    assert a.digest == content_digest("perfcast.Point",
                                      {"$type": "Point", "x": 1, "y": 2.5,
                                       "tags": {"a": 1, "b": 2}})


def test_domain_separation():
    assert content_digest("a", {"x": 1}) != content_digest("b", {"x": 1})


def test_digest_differs_when_value_differs():
    assert Point(1, 2.0).digest != Point(1, 2.0000001).digest


def test_dtype_aliases_and_sizes():
    assert parse_dtype("bfloat16") is DType.BF16
    assert parse_dtype("DT_BF16") is DType.BF16
    assert parse_dtype("float8_e4m3fn") is DType.FP8
    assert dtype_bytes("nvfp4") == 0.5
    assert dtype_bytes("fp32") == 4
    with pytest.raises(ConfigError, match="unknown dtype 'fp7'"):
        parse_dtype("fp7", field="--dtype")
