"""The broker's copy of the quorum's ACLs, polled with DescribeAcls.

The broker authorizes InitProducerId (IDEMPOTENT_WRITE on the cluster, or WRITE
on the transactional id) and the transactional requests against this copy, so
no client request waits on the quorum for an ACL.

Freshness: the copy is at most ``refresh_s`` plus one DescribeAcls round trip
plus the answering node's replication lag behind the leader (milliseconds)
older than the quorum's committed ACLs.  A copy from a node that has applied
less than the copy in hand is ignored (the view never goes back in time).  When
the quorum cannot be reached the last copy stays in force (logged, counted); a
broker that never got a first copy does not start.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from quorum.client.quorum import ConnectionFailed
from quorum.security.acl import Acl, AclIndex
from records.wire.errors import PidQuorumError

log = logging.getLogger(__name__)


class AclCache:
    def __init__(self, quorum: Any, refresh_s: float = 1.0, super_users: tuple[str, ...] = ()):
        if refresh_s <= 0:
            raise ValueError("acl refresh interval must be positive")
        self.quorum = quorum
        self.refresh_s = refresh_s
        self.super_users = frozenset(super_users)
        self.acls: list[Acl] = []
        self._index = AclIndex()
        self.applied_index = -1
        self.fetched_at: float | None = None  # monotonic time of the last successful fetch
        self.fetches = self.failures = self.stale_answers = 0
        self._task: asyncio.Task | None = None

    async def refresh(self) -> bool:
        """One DescribeAcls; True if the copy was replaced."""
        acls, applied = await self.quorum.describe_acls()
        self.fetches += 1
        self.fetched_at = time.monotonic()
        if applied < self.applied_index:
            self.stale_answers += 1
            return False
        changed = acls != self.acls
        if changed:
            log.info("ACLs: %d entries (quorum applied index %d)", len(acls), applied)
        if changed:
            self._index = AclIndex(acls)
        self.acls, self.applied_index = acls, applied
        return changed

    async def start(self) -> None:
        """The first copy (raises what the quorum answered), then poll in the background."""
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except (PidQuorumError, ConnectionFailed) as e:
                self.failures += 1
                age = time.monotonic() - (self.fetched_at or 0)
                log.warning("ACL refresh failed (%s); keeping the copy from %.1fs ago", e, age)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def authorize(self, principal: str, resource_type: str, name: str, operation: str, host: str | None) -> bool:
        return self._index.authorize(principal, resource_type, name, operation, self.super_users, host)

    def stats(self) -> dict:
        return {"entries": len(self.acls), "applied_index": self.applied_index, "fetches": self.fetches,
                "failures": self.failures, "stale_answers": self.stale_answers,
                "age_s": None if self.fetched_at is None else round(time.monotonic() - self.fetched_at, 3)}
