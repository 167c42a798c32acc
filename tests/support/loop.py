"""Helpers for tests that run on one asyncio loop."""
from __future__ import annotations

import asyncio
import time


async def passes(n: int = 5) -> None:
    """Let the event loop run ``n`` passes (no wall-clock wait: everything here is on this loop)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def until(predicate, timeout: float = 5.0, what: str = "condition", *, interval: float = 0.001):
    """``predicate()`` once it is truthy, asked every ``interval`` s while the loop runs the rest;
    AssertionError after ``timeout`` s (``what`` says what was awaited)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
    return value
