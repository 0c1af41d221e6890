"""The query digest's inline scalar paths and enum text cache give the generic bytes."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import pytest

from perfcast.core.canonical import CanonicalEncodingError, canonical_json


class _A(str, enum.Enum):
    X = "x"


class _B(str, enum.Enum):
    X = "x"  # equal to _A.X as a str: the cache must still tell the classes apart


@dataclass(frozen=True)
class _Fields:
    s: str
    i: int
    f: float
    b: bool
    n: object
    t: tuple
    e: _A


def test_str_enums_of_two_classes_keep_their_class_names():
    assert canonical_json(_A.X) == b'{"$enum":"_A","value":"x"}'
    assert canonical_json(_B.X) == b'{"$enum":"_B","value":"x"}'
    assert canonical_json([_B.X, _A.X]) == \
        b'[{"$enum":"_B","value":"x"},{"$enum":"_A","value":"x"}]'


def test_dataclass_fields_encode_as_the_same_values_in_a_list():
    value = _Fields("a\"b", 3, 1e-7, False, None, (), _A.X)
    fields = canonical_json(value).decode()
    assert fields == ('{"$type":"_Fields","b":false,"e":{"$enum":"_A","value":"x"},'
                      '"f":1.0e-7,"i":3,"n":null,"s":"a\\"b","t":[]}')
    # 1 and 1.0 and True stay distinct
    assert canonical_json(_Fields("", 1, 1.0, True, 1, (1,), _A.X)) != \
        canonical_json(_Fields("", 1, 1.0, True, 1.0, (1,), _A.X))


def test_non_finite_field_names_its_path():
    with pytest.raises(CanonicalEncodingError, match=r"\.f"):
        canonical_json(_Fields("", 0, float("nan"), False, None, (), _A.X))
