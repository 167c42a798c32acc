"""The leader-side block reserve (``NodeConfig.allocate_reserve_blocks``): no client waits on the quorum.

With ``allocate_reserve_blocks`` > 0, a broker that allocates again within ``RESERVE_ACTIVE_S`` gets
blocks committed for it (AllocateProducerIdsRecords with its id and epoch, in one entry) before it
asks; its next requests are answered from them at once.

Safety: a block enters the reserve only once its entry is committed and applied here (durable on a
majority), leaves it exactly once (popped), only to the broker and epoch it was committed for, only
while this node leads in the term the reserve was filled in, and only if it lies above every block
this broker got from this node (so a broker sees increasing blocks).  Anything else drops the
reserve: its blocks are skipped, never issued again (the cursor is past them).  A new leader starts
with no reserve.
"""
from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Callable

from .managers import FINALIZED

RESERVE_ACTIVE_S = 1.0  # kept for brokers whose last request is this recent
RESERVE_MAX_BROKERS = 4096  # bookkeeping is pruned beyond 4x this many brokers

Block = tuple[int, int]


@dataclass
class _Reserve:
    term: int
    epoch: int
    blocks: collections.deque = field(default_factory=collections.deque)
    in_flight: int = 0
    refilling: asyncio.Future | None = None


class BlockReserve:
    """``role() -> (is leader, leader, term)``; ``registered(broker) -> (its epoch or None, migration
    mode)`` from the applied state; ``propose(broker, epoch, count)`` commits ``count`` blocks for the
    broker and resolves to them."""

    def __init__(self, size: int, role: Callable[[], tuple[bool, str | None, int]],
                 registered: Callable[[int], tuple[int | None, str | None]], monotonic: Callable[[], float],
                 propose: Callable[[int, int, int], asyncio.Future]):
        self.size = size
        self.served = 0
        self._role, self._registered, self._monotonic, self._propose = role, registered, monotonic, propose
        self._reserves: dict[int, _Reserve] = {}
        self._last_end: dict[int, int] = {}
        self._last_request: dict[int, float] = {}

    async def take(self, broker_id: int, epoch: int, timeout: float) -> tuple[Block | None, bool]:
        """(a reserved block for this broker, or None; whether the broker is active enough to reserve for)."""
        active = self._note_activity(broker_id)
        block = self._pop(broker_id, epoch, active)
        if block is not None:
            return block, active
        r = self._reserves.get(broker_id)
        if r is not None and r.refilling is not None:
            # Its blocks are being committed: wait for them rather than commit one more block after
            # them (which the broker's increasing order would then force us to skip them for).
            await asyncio.wait([r.refilling], timeout=timeout)
            block = self._pop(broker_id, epoch, active)
        return block, active

    def handed_out(self, broker_id: int, epoch: int, block: Block, active: bool) -> None:
        """A block was committed for this broker the ordinary way: later reserved blocks lie above it."""
        start, length = block
        self._last_end[broker_id] = max(self._last_end.get(broker_id, -1), start + length)
        self._refill(broker_id, epoch, active)

    def _pop(self, broker_id: int, epoch: int, active: bool) -> Block | None:
        r = self._reserves.get(broker_id)
        if r is None or not r.blocks:
            return None
        is_leader, _, term = self._role()
        registered_epoch, mode = self._registered(broker_id)
        if (not is_leader or term != r.term or r.epoch != epoch or registered_epoch != epoch
                or mode not in (None, FINALIZED)):
            self._reserves.pop(broker_id, None)
            return None
        floor = self._last_end.get(broker_id, -1)
        while r.blocks:
            start, length = r.blocks.popleft()
            if start >= floor:
                self._last_end[broker_id] = start + length
                self.served += 1
                self._refill(broker_id, epoch, active)
                return (start, length)
        return None

    def _note_activity(self, broker_id: int) -> bool:
        """Whether this broker's previous allocate was less than RESERVE_ACTIVE_S ago."""
        now = self._monotonic()
        last = self._last_request.get(broker_id)
        self._last_request[broker_id] = now
        if len(self._last_request) > 4 * RESERVE_MAX_BROKERS:  # forget brokers long gone
            for b, t in list(self._last_request.items()):
                if now - t > RESERVE_ACTIVE_S:
                    del self._last_request[b]
                    self._reserves.pop(b, None)
                    self._last_end.pop(b, None)
        return last is not None and now - last < RESERVE_ACTIVE_S

    def _refill(self, broker_id: int, epoch: int, active: bool) -> None:
        if not active:
            return
        is_leader, _, term = self._role()
        _, mode = self._registered(broker_id)
        if not is_leader or mode not in (None, FINALIZED):
            return
        r = self._reserves.get(broker_id)
        if r is None or r.term != term or r.epoch != epoch:
            r = self._reserves[broker_id] = _Reserve(term, epoch)
        have = len(r.blocks) + r.in_flight
        if have > self.size // 2:
            return
        count = self.size - have
        r.in_flight += count
        fut = self._propose(broker_id, epoch, count)
        r.refilling = fut

        def filled(f: asyncio.Future) -> None:
            r.in_flight -= count
            if r.refilling is f:
                r.refilling = None
            if f.cancelled() or f.exception() is not None:
                return  # nothing committed, or unknown: those blocks (if any) are skipped
            if self._reserves.get(broker_id) is r:
                r.blocks.extend(f.result())
        fut.add_done_callback(filled)


__all__ = ["BlockReserve", "RESERVE_ACTIVE_S"]
