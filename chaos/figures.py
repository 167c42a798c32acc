"""How the terminal summaries of chaos and audit verdicts print a figure."""
from __future__ import annotations

from typing import Any


def fmt(v: Any, digits: int = 1) -> str:
    """``-`` for None, thousands separators for numbers (``digits`` decimals for a float), else ``str``."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
