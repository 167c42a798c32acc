"""Checks on the fields of a peer's message (a peer may be of another version, or not a peer at all)."""


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
