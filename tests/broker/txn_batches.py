"""Batches and directories shared by the partition's transaction tests (test_partition_txn*): a
transactional batch, what a read returns, a partition's directory and a copy of it as a crash leaves it."""
from __future__ import annotations

import shutil

import pytest

from broker.partition import Partition
from broker.recordbatch import decode_all, encode_batch, parse_header
from tests.broker.test_partition import TS


def txn(pid: int, epoch: int, seq: int, n: int = 1, tag: str = "t") -> bytes:
    return encode_batch([(None, f"{tag}{pid}-{seq + i}".encode()) for i in range(n)], producer_id=pid,
                        producer_epoch=epoch, base_sequence=seq, timestamp_ms=TS, transactional=True)


def offsets_and_values(blob: bytes) -> list[tuple[int, bytes]]:
    return [(o, v) for o, _, _, v in decode_all(blob)]


def batch_bases(blob: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(blob):
        h = parse_header(blob, pos)
        out.append(h.base_offset)
        pos += h.size
    return out


@pytest.fixture
def d(tmp_path) -> str:
    return str(tmp_path / "topic-0")


def crash_copy(p: Partition, tmp_path, name: str = "crashed") -> str:
    """The partition's directory as a crash would leave it: a copy taken without ``close`` (every append
    was fsync'd when it returned; no close-time snapshot)."""
    p.wait_snapshots()
    dst = str(tmp_path / name)
    shutil.copytree(p.directory, dst)
    return dst
