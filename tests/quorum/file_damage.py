"""Damage done to a file on disk by the storage tests (journal, audit trail)."""
from __future__ import annotations


def flip(path: str, offset: int, mask: int) -> None:
    """XOR the byte at ``offset`` of the file at ``path`` with ``mask``."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))
