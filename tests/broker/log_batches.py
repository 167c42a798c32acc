"""Batches and logs shared by the partition log's tests (test_log*): a batch of ``n`` records, the values
read back, a log written two batches to a segment, and a log whose second write fails."""
from __future__ import annotations

import contextlib
import os

from broker import log as logmod
from broker.log import PartitionLog
from broker.recordbatch import decode_all, encode_batch


TS = 1_700_000_000_000


def b(n: int = 1, tag: str = "x", ts: int = TS, size: int = 10) -> bytes:
    return encode_batch([(None, f"{tag}{i}".encode().ljust(size, b".")) for i in range(n)], timestamp_ms=ts)


def values(blob: bytes) -> list[tuple[int, bytes]]:
    return [(off, val) for off, _, _, val in decode_all(blob)]


def two_to_a_segment(d: str, batches: int) -> int:
    """Write a log in ``d`` of ``batches`` one-record batches, two to a segment (segments 0, 2, 4, ...);
    the size of one batch."""
    one = len(b(1))
    with PartitionLog(d, segment_bytes=2 * one) as lg:
        lg.append([b(1) for _ in range(batches)])
    return one


@contextlib.contextmanager
def second_write_fails(monkeypatch):
    """The log's second pwrite in the block fails with ENOSPC."""
    real = os.pwrite
    writes = []

    def flaky(fd, data, pos):
        writes.append(pos)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        return real(fd, data, pos)

    monkeypatch.setattr(logmod.os, "pwrite", flaky)
    try:
        yield
    finally:
        monkeypatch.setattr(logmod.os, "pwrite", real)
