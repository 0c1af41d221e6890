"""Canonical JSON encoding and domain-separated content digests.

The canonical form is the identity of every immutable artifact (model spec, system,
task graph, evidence database, calibration revision):

* mapping keys are sorted; records are tagged with their type name under "$type";
* ints, floats and bools stay distinct (1, 1.0 and true encode differently);
* floats use the shortest repr that round-trips; NaN and infinities are rejected;
* enums encode as {"$enum": "Class", "value": ...}; tuples and lists both as arrays.

A digest is "sha256:" + hex of sha256(domain + NUL + canonical bytes), so equal bytes
in different domains (a query vs. a database) never share a digest.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from perfcast.core.errors import PerfcastError


# Same output as json.dumps(s, ensure_ascii=False), without its per-call overhead.
_json_str = json.encoder.encode_basestring


class CanonicalEncodingError(PerfcastError, ValueError):
    """A value has no canonical form (NaN, infinity, an unsupported type)."""


def _float_token(value: float, path: str) -> str:
    if not math.isfinite(value):
        raise CanonicalEncodingError(f"non-finite float {value!r} at {path or '<root>'}")
    text = repr(float(value))
    if "e" in text or "E" in text:
        mantissa, exponent = text.lower().split("e")
        if "." not in mantissa:
            mantissa += ".0"
        text = f"{mantissa}e{int(exponent)}"
    return text


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_ENUM_TEXT: dict[tuple[type, enum.Enum], str] = {}


def _canonical_fields(cls: type) -> tuple[str, ...]:
    """Names of a dataclass's canonical fields (cached per class: fields never change)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(cls)
                      if f.metadata.get("canonical", True))
        _FIELD_NAMES[cls] = names
    return names


def _encode(value: Any, path: str, out: list[str]) -> None:
    kind = type(value)  # exact-type fast paths for the common scalars
    if kind is str:
        out.append(_json_str(value))
        return
    if kind is float:
        out.append(_float_token(value, path))
        return
    if kind is int:
        out.append(str(value))
        return
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, enum.Enum):
        key = (type(value), value)  # str-valued enums of two classes compare equal
        text = _ENUM_TEXT.get(key)
        if text is None:  # members are constants: encode each once
            sub = ['{"$enum":', json.dumps(type(value).__name__), ',"value":']
            _encode(value.value, path, sub)
            sub.append("}")
            text = _ENUM_TEXT[key] = "".join(sub)
        out.append(text)
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(_float_token(value, path))
    elif isinstance(value, str):
        out.append(_json_str(value))
    elif isinstance(value, bytes):
        raise CanonicalEncodingError(f"bytes are not canonical at {path or '<root>'}")
    elif isinstance(value, Record):
        # frozen records encode the same every time: keep their text (shared contexts,
        # system profiles and specs are encoded once, not once per query)
        text = value.__dict__.get("_canonical_text")
        if text is None:
            sub: list[str] = []
            _encode_dataclass(value, path, sub)
            text = "".join(sub)
            object.__setattr__(value, "_canonical_text", text)
        out.append(text)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        _encode_dataclass(value, path, out)
    elif isinstance(value, Mapping):
        _encode_mapping(value, path, out)
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, f"{path}[{i}]", out)
        out.append("]")
    elif isinstance(value, (set, frozenset)):
        items = sorted(value, key=lambda v: canonical_json(v))
        _encode(list(items), path, out)
    else:
        try:
            import numpy as np  # numpy scalars appear in importer output
        except ImportError:  # pragma: no cover
            np = None
        if np is not None and isinstance(value, np.generic):
            _encode(value.item(), path, out)
            return
        raise CanonicalEncodingError(
            f"no canonical form for {type(value).__name__} at {path or '<root>'}")


_LAYOUTS: dict[type, tuple[tuple[str | None, str], ...]] = {}


def _layout(cls: type) -> tuple[tuple[str | None, str], ...]:
    """(field name or None for "$type", text before its value) in sorted key order,
    cached per class: the same bytes as encoding {**fields, "$type": name} as a mapping."""
    layout = _LAYOUTS.get(cls)
    if layout is None:
        items = []
        for i, name in enumerate(sorted([*_canonical_fields(cls), "$type"])):
            sep = "," if i else ""
            if name == "$type":
                items.append((None, f'{sep}"$type":{_json_str(cls.__name__)}'))
            else:
                items.append((name, f"{sep}{_json_str(name)}:"))
        layout = _LAYOUTS[cls] = tuple(items)
    return layout


def _encode_dataclass(value: Any, path: str, out: list[str]) -> None:
    out.append("{")
    for name, text in _layout(type(value)):
        out.append(text)
        if name is not None:
            item = getattr(value, name)
            kind = type(item)  # the scalar fast paths of _encode, inline (same text)
            if kind is str:
                out.append(_json_str(item))
            elif kind is int:
                out.append(str(item))
            elif kind is float and math.isfinite(item):
                out.append(_float_token(item, ""))
            elif item is None or kind is bool:
                out.append("null" if item is None else "true" if item else "false")
            elif kind is tuple and not item:
                out.append("[]")
            else:
                _encode(item, path + "." + name, out)
    out.append("}")


def _encode_mapping(mapping: Mapping, path: str, out: list[str]) -> None:
    keys = list(mapping.keys())
    for k in keys:
        if not isinstance(k, str):
            raise CanonicalEncodingError(
                f"mapping key {k!r} at {path or '<root>'} is not a string")
    out.append("{")
    for i, key in enumerate(sorted(keys)):
        if i:
            out.append(",")
        out.append(_json_str(key))
        out.append(":")
        _encode(mapping[key], f"{path}.{key}", out)
    out.append("}")


def canonical_json(value: Any) -> bytes:
    """The canonical UTF-8 JSON bytes of a value."""
    out: list[str] = []
    _encode(value, "", out)
    return "".join(out).encode("utf-8")


def content_digest(domain: str, value: Any) -> str:
    """Domain-separated sha256 digest of the canonical encoding of `value`."""
    if not domain or "\0" in domain:
        raise ValueError("digest domain must be a non-empty string without NUL")
    h = hashlib.sha256()
    h.update(domain.encode("utf-8"))
    h.update(b"\0")
    h.update(canonical_json(value))
    return "sha256:" + h.hexdigest()


class Record:
    """Mixin for frozen dataclasses: a stable, cached content `digest`.

    Subclasses set `DIGEST_DOMAIN` (defaults to "perfcast.<ClassName>").
    """

    DIGEST_DOMAIN: str = ""

    @property
    def digest(self) -> str:
        cached = self.__dict__.get("_digest_cache")
        if cached is None:
            domain = self.DIGEST_DOMAIN or f"perfcast.{type(self).__name__}"
            cached = content_digest(domain, self)
            object.__setattr__(self, "_digest_cache", cached)
        return cached
