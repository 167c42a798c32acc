"""A node's ``raft.snapshot``: the one writer and reader of the file, and its transfer between nodes.

* ``load`` reads and verifies the file once at start (a damaged file is refused).
* ``write`` replaces it whole and durably (``snapshots.storage.disk.Disk.write_file``):
  after a power loss the node has the old snapshot or the new one, never a
  mixture, a zero-length file or none where there was one.
* The leader sends its snapshot to a follower that is too far behind in chunks
  (``chunk``), from the bytes in memory, so a compaction in the middle of a
  transfer cannot mix two files: a new snapshot restarts every transfer.
* A follower gathers the chunks of one sender (``receive``); the whole file is
  verified before it is installed.
"""
from __future__ import annotations

import logging
from typing import Hashable

from snapshots.storage.disk import CorruptFileError, Disk

from .format import Snapshot, decode_snapshot, encode_snapshot

log = logging.getLogger(__name__)

MAX_INCOMING_BYTES = 512 * 1024 * 1024  # a snapshot larger than this from a peer is dropped, not buffered


class SnapshotStore:
    def __init__(self, path: str, disk: Disk):
        self.path = path
        self.disk = disk
        self.current: Snapshot | None = None
        self._bytes: bytes | None = None
        self._sending: dict[Hashable, int] = {}  # peer -> bytes of the current snapshot already sent
        self._incoming: bytearray | None = None
        self._incoming_from: Hashable | None = None

    @property
    def size(self) -> int:
        return len(self._bytes) if self._bytes is not None else 0

    def load(self) -> Snapshot | None:
        """Read and verify the file (CorruptFileError if damaged); None if there is none."""
        data = self.disk.read(self.path)
        if data is None:
            return None
        snap = decode_snapshot(self.path, data)
        self.current, self._bytes = snap, data
        return snap

    def write(self, snap: Snapshot) -> int:
        """Replace the file with ``snap``, durably.  Returns its size in bytes."""
        data = encode_snapshot(snap)
        self._replace(snap, data)
        return len(data)

    def install(self, data: bytes) -> Snapshot:
        """Verify ``data`` (a whole snapshot file from the leader) and make it this node's, durably.
        Raises CorruptFileError (nothing written) if it does not decode."""
        snap = decode_snapshot(f"{self.path} (received)", data)
        self._replace(snap, data)
        return snap

    def _replace(self, snap: Snapshot, data: bytes) -> None:
        self.disk.write_file(self.path, data)
        self.current, self._bytes = snap, data
        self._sending.clear()  # transfers in flight start again with the new file

    # ---------------------------------------------------------- leader side
    def chunk(self, peer: Hashable, size: int) -> tuple[bytes, bool, bool] | None:
        """The next piece of the snapshot for ``peer``: (data, is_first, is_last); None without a snapshot.
        The last piece is empty (the shape pysyncobj's leader loop expects)."""
        if self._bytes is None:
            return None
        sent = self._sending.get(peer, 0)
        data = self._bytes[sent:sent + size]
        if data:
            self._sending[peer] = sent + len(data)
        else:
            self._sending.pop(peer, None)
        return data, sent == 0, not data

    def cancel(self, peer: Hashable) -> None:
        self._sending.pop(peer, None)

    # -------------------------------------------------------- follower side
    def receive(self, sender: Hashable, data: bytes, is_first: bool, is_last: bool) -> bytes | None:
        """Add a chunk from ``sender``; the whole file once its last chunk arrived, else None.
        Chunks that do not continue a transfer from the same sender are dropped."""
        if not isinstance(data, (bytes, bytearray)):
            log.warning("dropping a snapshot chunk of type %s from %s", type(data).__name__, sender)
            return None
        if is_first:
            self._incoming, self._incoming_from = bytearray(), sender
        elif self._incoming is None or self._incoming_from != sender:
            return None
        self._incoming += data
        if len(self._incoming) > MAX_INCOMING_BYTES:
            log.error("dropping a snapshot from %s: over %d bytes", sender, MAX_INCOMING_BYTES)
            self._incoming = self._incoming_from = None
            return None
        if not is_last:
            return None
        whole, self._incoming, self._incoming_from = bytes(self._incoming), None, None
        return whole

    def describe(self) -> dict:
        snap = self.current
        return {"path": self.path, "bytes": self.size,
                "last_index": snap.last_index if snap else None,
                "last_term": snap.last_entry[2] if snap else None}


__all__ = ["SnapshotStore", "CorruptFileError"]
