"""`safe_load` as `yaml.safe_load`, parsed by libyaml when PyYAML has it.

libyaml's parser (`yaml.CSafeLoader`: C scanner and parser, PyYAML's own safe
constructor and resolver) builds the same objects about 8x faster; a text it rejects is
parsed again by the pure-Python loader, so errors read as `yaml.safe_load`'s.
"""

from __future__ import annotations

from typing import Any

import yaml

_FAST = getattr(yaml, "CSafeLoader", None)


def safe_load(text: str) -> Any:
    if _FAST is not None:
        try:
            return yaml.load(text, Loader=_FAST)
        except yaml.YAMLError:
            pass
    return yaml.safe_load(text)
