"""Turn perfcast errors into one clear line on stderr and exit code 2."""

from __future__ import annotations

import contextlib
import sys

import typer

from perfcast.core.errors import PerfcastError


@contextlib.contextmanager
def user_errors():
    try:
        yield
    except PerfcastError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
