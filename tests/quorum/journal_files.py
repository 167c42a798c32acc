"""Helpers shared by the journal's tests (test_journal, test_journal_power_loss,
test_journal_recovery): a journal over real files, the entries it holds, and the ways a file is cut short."""
from __future__ import annotations

import os

import msgpack

from quorum.journal import _ENTRY, MAGIC, DurableJournal
from snapshots.storage.disk import Disk


DISK = Disk(preallocate=0)  # files exactly as the entries were written (the format's tests); PREALLOCATED below
PREALLOCATED = Disk(preallocate=4096)

ENTRIES = [
    (b"first command", 1, 1),
    (bytes(range(256)), 2, 1),
    (b"\x00" * 5, 3, 2),
    (b"x" * 4000, 4, 2),
    (msgpack.packb([1, [[7, 0, [1]]]]), 5, 3),
]


def journal(path: str) -> DurableJournal:
    return DurableJournal(path, DISK)


def fill(j: DurableJournal, entries=ENTRIES) -> None:
    for e in entries:
        j.add(*e)


def crash(j: DurableJournal) -> None:
    """Drop the journal as a killed process would: no sync, no meta write."""
    j._file.close()


def reopen(j: DurableJournal) -> DurableJournal:
    crash(j)
    return journal(j.path)


def size(path: str) -> int:
    return os.path.getsize(path)


def entry_offsets(entries) -> list[int]:
    out, pos = [], len(MAGIC)
    for cmd, _, _ in entries:
        out.append(pos)
        pos += _ENTRY.size + len(cmd)
    return out


def cut(path: str, length: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(length)


def durable(j: DurableJournal, commit: int) -> None:
    """Record in the meta file that entries up to ``commit`` are committed (and the log end durable)."""
    j.setRaftCommitIndex(commit)
    j.onOneSecondTimer()
