"""The quorum's hook into ZooKeeper for bridge mode and rollback (``quorum.service.ZooKeeperHook``).

A node process gets one from its entry point (``pidctl node start``, ``python -m quorum``); the
quorum itself never imports ZooKeeper code.  Used only while the replicated migration state is
``bridge`` (reserve before proposing) or on ``rollback`` (the placeholder block).
"""
from __future__ import annotations

import logging

from .zk import connect, describe_placeholder, reserve_block, write_placeholder

log = logging.getLogger(__name__)


class ZooKeeperBridge:
    """Blocking calls (the proposer runs them in an executor); one client, kept while the hosts stay."""

    def __init__(self, connect_timeout: float = 3.0, op_timeout: float = 2.0):
        self.connect_timeout, self.op_timeout = connect_timeout, op_timeout
        self._zk = None  # KazooClient
        self._hosts = ""

    def reserve(self, hosts: str, min_start: int, length: int, broker_id: int) -> tuple[int, int]:
        """Reserve ``length`` IDs at or above ``min_start`` in the block znode: (start, znode version)."""
        if self._zk is None or self._hosts != hosts:
            self.reset()
            self._zk, self._hosts = connect(hosts, timeout=self.connect_timeout), hosts
        return reserve_block(self._zk, min_start, length, broker_id=broker_id, timeout=self.connect_timeout,
                             op_timeout=self.op_timeout)

    def reset(self) -> None:
        """Drop the client (after a failure, or at shutdown)."""
        zk, self._zk = self._zk, None
        if zk is not None:
            try:
                zk.stop()
                zk.close()
            except Exception:  # noqa: BLE001 - best effort on a broken session
                log.debug("closing the ZooKeeper client failed", exc_info=True)

    def write_placeholder(self, hosts: str, start: int, length: int) -> str:
        """Rollback: the placeholder block (broker -1) at ``start``; what was done, for the operator."""
        zk = connect(hosts, timeout=5.0)
        try:
            result = write_placeholder(zk, start, length, timeout=10.0, op_timeout=3.0)
        finally:
            zk.stop()
            zk.close()
        return describe_placeholder(result, start, length)
