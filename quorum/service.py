"""The replicated service on one node: the state machine's host.

``Service`` owns the ``QuorumState``, applies committed entries (from Raft's thread, under a lock),
writes the audit trail and turns the state into snapshot records and back.  The leader's proposer is
``quorum.proposer``; allocation's rules are ``quorum.producer_ids``.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from records import AllocateProducerIdsRecord, Record, RecordError, decode_batch
from snapshots.storage.disk import Disk

from .config import NodeConfig
from .identity import NodeIdentity
from .managers import QuorumState
from .producer_ids import ZooKeeperHook
from .raft import RaftNode
from .stats import AllocationCounts
from .trail import AuditWriter

log = logging.getLogger(__name__)


class Service:
    """``disk`` is where every durable file goes (``snapshots.storage.disk``), ``clock`` what tells the time (the
    ``time`` module), ``new_id`` what draws identity ids (uuid4); tests, fault runs and the simulator
    pass their own.  ``zookeeper``: the hook bridge mode and rollback use (the process entry point
    installs ``quorum.migration.bridge.ZooKeeperBridge``); without one, both are refused."""

    def __init__(self, cfg: NodeConfig, disk: Disk | None = None, clock=time, new_id=None,
                 zookeeper: ZooKeeperHook | None = None, **raft_options):
        self.cfg = cfg
        self.zookeeper = zookeeper
        self.clock = clock  # time.time() for record timestamps, time.monotonic() for the proposer's pacing
        self.disk = disk or Disk()
        self.disk.make_dir(cfg.data_dir)
        self.lock = threading.Lock()
        self.state = QuorumState()
        self.applied_index = 0
        self.allocations = AllocationCounts()  # blocks and IDs committed per broker (counted at apply; bounded)
        self.identity = NodeIdentity.open(cfg.data_dir, cfg.secret, cfg.cluster_id, cfg.client_address,
                                          disk=self.disk, **({"new_id": new_id} if new_id else {}))
        self.audit = AuditWriter(os.path.join(cfg.data_dir, "audit.log"), self.disk)
        self.raft = RaftNode(cfg.raft_address, [peer.raft_address for peer in cfg.peers], cfg.data_dir, cfg.secret,
                             cfg.raft, on_apply=self._apply, snapshot_state=self._snapshot_state,
                             restore_state=self._restore_state, bind_addr=cfg.raft_bind, identity=self.identity,
                             disk=self.disk, clock=clock, **raft_options)

    # ---------------------------------------------- pysyncobj thread callbacks
    def _apply(self, index: int, term: int, payload: bytes) -> list[str | None]:
        try:
            records = decode_batch(payload)
        except RecordError as e:
            # Only our proposer writes entries, so this is a bug or a foreign
            # writer; every node refuses the same way and the state is unchanged.
            log.error("entry %d is not a record batch (%s); it changes nothing", index, e)
            return [str(e)]
        with self.lock:
            outcomes = self.state.apply_batch(records)
            self.applied_index = index
            registered = self.state.registrations.brokers.__contains__
            for o in outcomes:
                if o.accepted and isinstance(o.record, AllocateProducerIdsRecord):
                    self.allocations.count(o.record.broker_id, o.record.producer_id_len, registered)
        for o in outcomes:
            if not o.accepted:
                log.warning("entry %d: replay refused %s: %s", index, type(o.record).__name__, o.error)
        # Before the answer (which the entry's callback writes): a client that reads the trails once it has
        # its answer finds its block there (``pidctl blocks history``).
        self.audit.append(index, term, outcomes)
        return [o.error for o in outcomes]

    def _snapshot_state(self) -> list[Record]:
        self.audit.sync()  # the journal drops these entries after the snapshot
        with self.lock:
            return self.state.snapshot_records()

    def _restore_state(self, records: list[Record], last_index: int) -> None:
        state = QuorumState.from_records(records)
        with self.lock:
            self.state = state
            self.applied_index = last_index
        self.audit.gap(last_index)

    # --------------------------------------------------------------- reading
    def describe(self) -> dict[str, Any]:
        with self.lock:
            summary = self.state.summary()
            issued = self.state.producer_ids.history()
            applied = self.applied_index
            allocations = self.allocations.snapshot()
        snap = self.raft.snapshot_path
        return {
            "node_id": self.cfg.node_id,
            "client_address": self.cfg.client_address,
            "raft": self.raft.status(),
            "applied_index": applied,
            "state": summary,
            "producer_ids_issued": issued,  # what a ZooKeeper seed is checked against (pidctl migrate status)
            "block_size": self.cfg.block_size,
            "snapshot": _file_info(snap),
            "journal_entries": len(self.raft.journal),
            "allocations": allocations,  # since this process started (what pidquorum_allocations_total counts)
        }

    def close(self) -> None:
        self.raft.destroy()
        self.audit.close()


def _file_info(path: str) -> dict[str, Any]:
    try:
        st = os.stat(path)
        return {"path": os.path.abspath(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                "age_s": max(0.0, time.time() - st.st_mtime_ns / 1e9)}
    except FileNotFoundError:
        return {"path": os.path.abspath(path), "bytes": 0, "mtime_ns": 0, "age_s": None}


__all__ = ["Service"]
