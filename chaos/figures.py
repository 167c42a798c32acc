"""How the terminal summaries of chaos and audit verdicts print a figure, and a table of them."""
from __future__ import annotations

from typing import Any, Iterable

from rich.console import Console
from rich.table import Table


def fmt(v: Any, digits: int = 1) -> str:
    """``-`` for None, thousands separators for numbers (``digits`` decimals for a float), else ``str``."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def print_table(out: Console, title: str, columns: Iterable[str], rows: Iterable[Iterable[str]],
                numbers_right: bool = False) -> None:
    """A titled table; with ``numbers_right`` every column but ``source`` is right-justified."""
    t = Table(title=title, title_justify="left")
    for c in columns:
        if numbers_right:
            t.add_column(c, justify="left" if c == "source" else "right")
        else:
            t.add_column(c)
    for row in rows:
        t.add_row(*row)
    out.print(t)
