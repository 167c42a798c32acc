"""Progress of a long pidctl command: a bar on stderr when stderr is a terminal, nothing otherwise.

``with Bar("allocating", total=n, unit="blocks") as bar: ... bar.advance()``.  Off a terminal (a pipe, a
file, CI) it writes nothing, so a script's output stays what it was.  The bar is transient: once the
command is done (or interrupted) it is gone, and what the command prints next is its report.  Beside
cli/render.py, the one module that imports rich.
"""
from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class Bar:
    """A progress bar of ``total`` steps (None: unknown, a pulsing bar) with a note after it."""

    def __init__(self, description: str, total: float | None = None, unit: str = "", stream: TextIO | None = None):
        self.description = description
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self.stream)
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> Bar:
        if self.enabled:
            columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
            if self.unit:
                columns.append(TextColumn(self.unit))
            columns += [TextColumn("{task.fields[note]}"), TimeElapsedColumn(), TextColumn("left"),
                        TimeRemainingColumn()]
            self._progress = Progress(*columns, console=Console(file=self.stream, highlight=False), transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=self.total, note="")
        return self

    def advance(self, steps: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, steps)

    def update(self, *, completed: float | None = None, total: float | None = None, note: str | None = None) -> None:
        if self._progress is not None:
            fields = {k: v for k, v in (("completed", completed), ("total", total)) if v is not None}
            if note is not None:
                fields["note"] = note
            self._progress.update(self._task, **fields)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or a replaced stream (click's test runner)
        return False
