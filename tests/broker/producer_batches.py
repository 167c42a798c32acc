"""Batches and steps shared by broker.producer_state's tests (test_producer_state*, test_partition_txn*):
idempotent batches and their headers, a manager over a fake log end, appends through a real log, and a
snapshot file forged with a valid checksum."""
from __future__ import annotations

import struct
import zlib

import msgpack

from broker.log import PartitionLog
from broker.producer_state import SNAPSHOT_MAGIC, Action, ProducerStateManager
from broker.recordbatch import BatchHeader, encode_batch, parse_header


NOW = 1_700_000_000_000
DAY = 24 * 3600 * 1000


def raw(pid: int, epoch: int, seq: int, n: int = 1) -> bytes:
    return encode_batch([(None, b"v%d" % i) for i in range(n)], producer_id=pid, producer_epoch=epoch,
                        base_sequence=seq, timestamp_ms=NOW)


def hdr(pid: int, epoch: int, seq: int, n: int = 1) -> BatchHeader:
    return parse_header(raw(pid, epoch, seq, n))


def plain(n: int = 1) -> BatchHeader:
    return parse_header(encode_batch([(None, b"x")] * n))


class Sim:
    """A manager plus a fake log end, appending the way the partition does."""

    def __init__(self):
        self.m = ProducerStateManager()
        self.end = 0

    def append(self, h: BatchHeader, now: int = NOW) -> int:
        d = self.m.check(h)
        assert d.action is Action.APPEND, d
        first = self.end
        self.m.update(h, first, now)
        self.end += h.records_count
        return first


def _forge(path: str, obj) -> None:
    body = msgpack.packb(obj, use_bin_type=True)
    open(path, "wb").write(SNAPSHOT_MAGIC + struct.pack("<I", len(body)) + body + struct.pack("<I", zlib.crc32(body)))


def _append(lg: PartitionLog, m: ProducerStateManager, batch: bytes, now: int = NOW) -> int:
    h = parse_header(batch)
    assert m.check(h).action is Action.APPEND
    first = lg.append([batch])
    m.update(h, first, now)
    return first
