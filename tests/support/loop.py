"""Helpers for tests that run on one asyncio loop."""
from __future__ import annotations

import asyncio


async def passes(n: int = 5) -> None:
    """Let the event loop run ``n`` passes (no wall-clock wait: everything here is on this loop)."""
    for _ in range(n):
        await asyncio.sleep(0)
