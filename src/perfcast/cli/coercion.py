"""Parameter values coerced without pydantic where the result is certain.

typer 0.29 (the version this tree runs) coerces the value of every parameter of the
invoked command, defaults included, through a pydantic TypeAdapter that it builds per
parameter on first use (typer/core.py `_TyperParameter.get_runtime_param`,
typer/_coercion.py `build_runtime_param`, typer/_adapters.py): `perfcast serve` paid
~0.25 s for importing pydantic and building ~50 adapters. `plain_coercion(command)`
gives each parameter a coercion that returns at once for the values whose result does
not depend on pydantic (None, a value already of the annotated type, a canonical integer
or decimal string, a normalised path, an enum choice, lists of these) and hands every
other value, valid or not, to typer's own adapter, so results and error messages stay
typer's. With a typer that lacks these internals it does nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, get_args, get_origin

try:
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
    from typer._param_types import coerce_cli_choice, coerce_cli_path
    from typer.core import _TyperParameter
except ImportError:  # another typer: its own coercion throughout
    RuntimeParam = None

# canonical strings, whose int() / float() equals pydantic's lax parse (no "+", spaces,
# underscores, leading zeros, inf/nan, hex; few digits)
_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]{0,15})(?:\.[0-9]{1,17})?(?:[eE]-?[1-9][0-9]?)?")
_TYPER = object()   # "ask typer"


def _number(kind: type, info, value: Any) -> Any:
    if info.min is not None or info.max is not None or info.clamp:
        return _TYPER
    if type(value) is kind:
        return value
    if type(value) is str and (_INT if kind is int else _FLOAT).fullmatch(value):
        return kind(value)
    return _TYPER


def _leaf(annotation: Any, info, value: Any, param, ctx) -> Any:
    if info.parser is not None:
        return _TYPER
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        try:
            return coerce_cli_choice(value, choices=list(annotation),
                                     case_sensitive=info.case_sensitive, ctx=ctx)
        except ValueError:
            return _TYPER
    if annotation is int or annotation is float:
        return _number(annotation, info, value)
    if annotation is str or annotation is bool:
        return value if type(value) is annotation else _TYPER
    if annotation is Path and info.path_type is None:
        if isinstance(value, Path):
            path = value
        elif type(value) is str and value and str(Path(value)) == value:
            path = Path(value)   # (normalised: typer's messages name the same string)
        else:
            return _TYPER
        return coerce_cli_path(path, info, path_type=Path, param=param, ctx=ctx)
    return _TYPER


if RuntimeParam is not None:
    @dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        """typer's coercion contract (None and multi-value checks in `coerce`), with the
        certain cases answered here and the rest by typer's adapter, built on demand."""

        descriptor: TypeDescriptor = field(compare=False)

        def _coerce_value(self, value: Any, param, ctx) -> Any:
            annotation, info = self.annotation, self.parameter_info
            if get_origin(annotation) is list:
                out = _TYPER
                if isinstance(value, (list, tuple)):
                    (item,) = get_args(annotation)
                    out = [_leaf(item, info, v, param, ctx) for v in value]
                    if any(v is _TYPER for v in out):
                        out = _TYPER
            else:
                out = _leaf(annotation, info, value, param, ctx)
            if out is _TYPER:
                return self._typer()._coerce_value(value, param=param, ctx=ctx)
            return out

        def _typer(self):
            built = self.__dict__.get("_built")
            if built is None:
                built = build_runtime_param(self.descriptor)
                object.__setattr__(self, "_built", built)
            return built


def plain_parameter(param) -> None:
    """Give one parameter the coercion above (unless typer has built its own)."""
    if (RuntimeParam is None or not isinstance(param, _TyperParameter)
            or param._runtime_param is not None):
        return
    d = param.type_descriptor
    if d.file_annotation is None:
        try:
            plain = PlainRuntimeParam(parameter_info=d.parameter_info,
                                      annotation=d.annotation, descriptor=d)
        except TypeError:   # a typer whose RuntimeParam changed: typer's own coercion
            return          # (tests/cli/test_startup.py notices)
        param._runtime_param = plain


def plain_coercion(command) -> None:
    """Give the parameters of `command` (a click command or group, recursively) the
    coercion above, also the `--help` option, which click makes on first parse."""
    if RuntimeParam is None:
        return
    for sub in (getattr(command, "commands", None) or {}).values():
        plain_coercion(sub)
    for param in command.params:
        plain_parameter(param)
    if "get_help_option" not in vars(command):
        made = command.get_help_option

        def get_help_option(ctx):
            option = made(ctx)
            plain_parameter(option)
            return option

        command.get_help_option = get_help_option
