"""The snapshot file.

A snapshot is the state *as records* (``QuorumState.snapshot_records``: the
latest block, or a cursor, plus live registrations and the epoch cursor), not
a pickle of Python objects, so its size does not depend on how many blocks
were ever issued.  It also carries what pysyncobj needs to resume its log
after the snapshot: the last two applied entries and the cluster members.

Layout: ``MAGIC | u32 body length | body (msgpack) | u32 crc32(body)``.
The file is always replaced whole (temp file, fsync, rename, fsync of the
directory: ``snapshots.storage.disk.Disk.write_file``); ``snapshots.store`` keeps the
node's copy and is the only writer of ``raft.snapshot``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from records import Record, RecordError
from records.codec import from_obj, to_obj
from snapshots.storage.disk import CorruptFileError, Disk
from snapshots.storage.files import atomic_write, read_whole, seal, unseal

MAGIC = b"PQSNAP\x00\x01"
FORMAT = 1

Entry = tuple[bytes, int, int]  # (command, raft index, raft term), as pysyncobj keeps them


@dataclass
class Snapshot:
    records: list[Record]
    last_entry: Entry
    prev_entry: Entry
    cluster: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def last_index(self) -> int:
        return self.last_entry[1]


def encode_snapshot(snap: Snapshot) -> bytes:
    return seal(MAGIC, {
        "format": FORMAT,
        "last_entry": list(snap.last_entry),
        "prev_entry": list(snap.prev_entry),
        "cluster": sorted(snap.cluster),
        "records": [to_obj(r) for r in snap.records],
        "meta": snap.meta,
    })


def write_snapshot(path: str, snap: Snapshot, disk: Disk | None = None) -> int:
    """Replace ``path`` with ``snap``, durably (``Disk.write_file``; without a node's ``disk``, an I/O
    error raises); returns its size in bytes."""
    data = encode_snapshot(snap)
    if disk is None:
        atomic_write(path, data)
    else:
        disk.write_file(path, data)
    return len(data)


def _entry(path: str, obj: Any, name: str) -> Entry:
    if (not isinstance(obj, list) or len(obj) != 3 or not isinstance(obj[0], bytes)
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in obj[1:])):
        raise CorruptFileError(path, f"{name} is not a (bytes, index, term) entry")
    return (bytes(obj[0]), int(obj[1]), int(obj[2]))


def decode_snapshot(path: str, data: bytes) -> Snapshot:
    obj = unseal(path, data, MAGIC, "snapshot")
    fmt = obj.get("format")
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt != FORMAT:  # True == 1 == 1.0 in Python
        raise CorruptFileError(path, f"unsupported snapshot format {fmt!r}")
    try:
        records = [from_obj(o) for o in obj["records"]]
    except (RecordError, KeyError, TypeError) as e:
        raise CorruptFileError(path, f"bad record: {e}") from None
    cluster, meta = obj.get("cluster"), obj.get("meta")
    if not isinstance(cluster, list) or not all(isinstance(a, str) for a in cluster):
        raise CorruptFileError(path, f"cluster is not an array of addresses: {cluster!r}")
    if not isinstance(meta, dict):
        raise CorruptFileError(path, f"meta is of type {type(meta).__name__}, not a map")
    return Snapshot(records=records, last_entry=_entry(path, obj.get("last_entry"), "last_entry"),
                    prev_entry=_entry(path, obj.get("prev_entry"), "prev_entry"), cluster=cluster, meta=meta)


def read_snapshot(path: str) -> Snapshot:
    return decode_snapshot(path, read_whole(path))


def inspect_snapshot(path: str) -> dict[str, Any]:
    snap = read_snapshot(path)
    return {
        "file": path,
        "size_bytes": os.path.getsize(path),
        "last_index": snap.last_entry[1],
        "last_term": snap.last_entry[2],
        "cluster": snap.cluster,
        "meta": snap.meta,
        "records": [r.to_json_dict() for r in snap.records],
    }
