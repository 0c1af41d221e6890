"""Property tests of the canonical codec: decoding the bytes gives the value back (ints,
floats and bools distinct), re-encoding gives the same bytes, key order never matters,
and a non-finite float anywhere is refused."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfcast.core import canonical_json, content_digest
from perfcast.core.canonical import CanonicalEncodingError

SETTINGS = settings(max_examples=150, deadline=None)

scalars = (st.none() | st.booleans() | st.integers() | st.text()
           | st.floats(allow_nan=False, allow_infinity=False))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


def tagged(v):
    """The value with every scalar's type made explicit (1, 1.0 and True differ)."""
    if isinstance(v, dict):
        return {k: tagged(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [tagged(x) for x in v]
    if isinstance(v, float):
        return ("float", math.copysign(1.0, v) if v == 0 else v)
    return (type(v).__name__, v)


@SETTINGS
@given(values)
def test_decoding_gives_the_value_back_and_reencoding_the_same_bytes(value):
    data = canonical_json(value)
    decoded = json.loads(data)
    assert tagged(decoded) == tagged(value)
    assert canonical_json(decoded) == data


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=6), values, min_size=2, max_size=6), st.randoms())
def test_key_order_never_changes_bytes_or_digest(mapping, rnd: random.Random):
    items = list(mapping.items())
    rnd.shuffle(items)
    shuffled = dict(items)
    assert canonical_json(shuffled) == canonical_json(mapping)
    assert content_digest("t", shuffled) == content_digest("t", mapping)


@SETTINGS
@given(values, st.sampled_from([math.nan, math.inf, -math.inf]))
def test_a_non_finite_float_anywhere_is_refused(value, bad):
    with pytest.raises(CanonicalEncodingError):
        canonical_json({"v": [value, {"x": bad}]})


@SETTINGS
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_floats_round_trip_exactly(x):
    assert json.loads(canonical_json(x)) == x
    assert type(json.loads(canonical_json(x))) is float
