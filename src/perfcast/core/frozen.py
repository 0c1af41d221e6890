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
        merged = dict(data or {})
        merged.update(kwargs)
        try:
            items = sorted(merged.items(), key=lambda kv: kv[0])
        except TypeError:
            items = list(merged.items())
        self._data: dict[K, V] = dict(items)
        self._hash: int | None = None

    def __getitem__(self, key: K) -> V:
        return self._data[key]

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
