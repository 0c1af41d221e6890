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


def check_output_paths(**paths) -> None:
    """Refuse output paths whose folder does not exist before any work is done (a long
    computation must not end in a FileNotFoundError). Keyword: the flag, value: the path
    or None."""
    from pathlib import Path

    for flag, path in paths.items():
        if path is None:
            continue
        parent = Path(path).expanduser().parent
        if not parent.is_dir():
            name = "--" + flag.replace("_", "-")
            print(f"error: {name} {path}: folder {parent} does not exist", file=sys.stderr)
            raise typer.Exit(2)
