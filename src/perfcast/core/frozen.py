"""Immutable containers usable as fields of frozen records."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FrozenDict(Mapping[K, V]):
    """A read-only, hashable mapping. Iteration order is the sorted key order."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[K, V] | None = None, /, **kwargs: V) -> None:
        if type(data) is dict and not kwargs:   # the common case: no copy to merge into
            merged = data
        else:
            merged = dict(data or {})
            merged.update(kwargs)
        try:
            keys = sorted(merged)   # keys are unique: the items' order by key
        except TypeError:
            self._data: dict[K, V] = dict(merged)
        else:
            self._data = {k: merged[k] for k in keys}
        self._hash: int | None = None

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    # Mapping's get / __contains__ go through __getitem__ and KeyError; the dict's own
    # answer the same without it
    def get(self, key, default=None):
        return self._data.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def keys(self):
        return self._data.keys()

    def items(self):
        return self._data.items()

    def values(self):
        return self._data.values()

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._data.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenDict):
            return self._data == other._data
        if isinstance(other, Mapping):
            return self._data == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenDict({self._data!r})"

    def replace(self, **changes: V) -> FrozenDict[K, V]:
        merged = dict(self._data)
        merged.update(changes)  # type: ignore[arg-type]
        return FrozenDict(merged)


def freeze(value: Any) -> Any:
    """Recursively turn dicts into FrozenDicts and lists into tuples."""
    if isinstance(value, FrozenDict):
        return value
    if isinstance(value, Mapping):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value
