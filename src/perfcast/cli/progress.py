"""A rich progress bar on stderr for long commands (hidden when stderr is not a terminal,
so piped output and tests stay clean)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


@contextlib.contextmanager
def progress_bar(label: str, total: int | None = None
                 ) -> Iterator[Callable[[int, int], None]]:
    """Yields `advance(done, total)`, the callback the long-running functions take."""
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                  disable=not sys.stderr.isatty(), transient=True) as bar:
        task = bar.add_task(label, total=total)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance
