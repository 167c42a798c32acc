"""The partition's side of transactions (KIP-98): the ongoing ones, the index of aborted ones that
read_committed fetches read, and the checks on transactional batches and end markers.
The design: ``docs/producer-state.md``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from records.wire.errors import Errors

from ..recordbatch import NO_SEQUENCE, TRANSACTIONAL_BIT, BatchHeader
from .rules import APPEND, Action, Decision, _error

# One aborted transaction: the offset of its abort marker, its first offset, the producer, and the last
# stable offset just after the marker (what ``AbortedIndex.collect`` stops on, as Kafka's
# TransactionIndex does).
ABORTED = np.dtype([("last", "<i8"), ("first", "<i8"), ("pid", "<i8"), ("lso", "<i8")])
_ABORTED_SCAN = 64  # first chunk of a collect's scan past the fetch offset (then doubled)


class AbortedIndex:
    """The aborted transactions of a partition, in marker order, as one growing array (32 B each, no
    Python object per entry).

    What read_committed Fetch answers with: ``collect(start, end)`` gives every transaction aborted
    with an offset in [start, end).  A bisect finds the first entry whose marker is at or after
    ``start``; the scan from there stops after the first entry whose ``lso`` (the last stable offset
    just after its marker) is at or beyond ``end``: every later entry began at or after that LSO (it
    was either ongoing then, so not below the LSO, or began after the marker), so none overlaps.  A
    scan therefore reads the answer plus the aborts made while a transaction spanning ``end`` was
    open, which the coordinator's transaction timeout bounds - Kafka's own bound
    (``TransactionIndex.collectAbortedTxns``).  Entries whose marker is below the log start go
    (``truncate_before``), so the index is bounded by retention.
    """

    def __init__(self, entries: np.ndarray | None = None):
        n = 0 if entries is None else len(entries)
        self._a = np.empty(max(16, n), ABORTED)
        if n:
            self._a[:n] = entries
        self._lo, self._n = 0, n

    def __len__(self) -> int:
        return self._n - self._lo

    def entries(self) -> np.ndarray:
        """A view of the entries, in marker order."""
        return self._a[self._lo:self._n]

    def add(self, pid: int, first: int, last: int, lso: int) -> bool:
        """Record producer ``pid``'s transaction from ``first`` aborted by the marker at ``last``; False
        if it is already held (same producer and first offset)."""
        a = self.entries()
        if len(a) and int(a["last"][-1]) >= last:  # not after the newest marker: only a replay does this
            if ((a["pid"] == pid) & (a["first"] == first)).any():
                return False
            self._append((0, 0, 0, 0))
            at = self._lo + int(np.searchsorted(self._a["last"][self._lo:self._n - 1], last, "right"))
            self._a[at + 1:self._n] = self._a[at:self._n - 1].copy()
            self._a[at] = (last, first, pid, lso)
            return True
        self._append((last, first, pid, lso))
        return True

    def _append(self, entry: tuple[int, int, int, int]) -> None:
        if self._n == len(self._a):
            live = self._n - self._lo
            a = np.empty(max(16, 2 * live) if live * 2 > len(self._a) else len(self._a), ABORTED)
            a[:live] = self._a[self._lo:self._n]
            self._a, self._lo, self._n = a, 0, live
        self._a[self._n] = entry
        self._n += 1

    def truncate_before(self, offset: int) -> int:
        """Drop the transactions whose marker is below ``offset`` (the log start); return how many went."""
        a = self.entries()
        k = int(np.searchsorted(a["last"], offset))
        self._lo += k
        if self._lo == self._n:
            self._lo = self._n = 0
        return k

    def collect(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of every aborted transaction overlapping [start, end) - marker at or
        after ``start``, first offset before ``end`` - by first offset (see the class doc)."""
        a = self.entries()
        if end <= start or not len(a):
            return []
        k = int(np.searchsorted(a["last"], start))
        stop, i, step = len(a), k, _ABORTED_SCAN
        lso = a["lso"]
        while i < len(a):
            j = min(i + step, len(a))
            hit = np.flatnonzero(lso[i:j] >= end)
            if hit.size:
                stop = i + int(hit[0]) + 1
                break
            i, step = j, 2 * step
        sel = a[k:stop]
        sel = sel[sel["first"] < end]
        sel = sel[np.argsort(sel["first"], kind="stable")]
        return list(zip(sel["pid"].tolist(), sel["first"].tolist()))


class _Transactions:
    """``ProducerStateManager``'s transactions (markers also move the producer's row in ``_Table``)."""

    def _begin_txn(self, pid: int, epoch: int, first_offset: int) -> None:
        txn = self._ongoing.get(pid)
        if txn is None:
            self._ongoing[pid] = (epoch, first_offset)  # at the end: the newest first offset
        elif epoch > txn[0]:
            self._ongoing[pid] = (epoch, txn[1])  # Kafka keeps the transaction across an epoch bump

    @property
    def has_ongoing(self) -> bool:
        return bool(self._ongoing)

    def check_txn(self, headers: Sequence[BatchHeader], decisions: Sequence[Decision]) -> Decision | None:
        """INVALID_TXN_STATE if a batch to be appended is not transactional while its producer has a
        transaction ongoing here (or started by an earlier batch of the request), as Kafka's
        ``ProducerAppendInfo.appendDataBatch``; None if all may go."""
        ongoing = self._ongoing
        started: set[int] = set()
        for h, d in zip(headers, decisions):
            if d.action is not Action.APPEND or not h.has_producer_id:
                continue
            pid = h.producer_id
            if h.attributes & TRANSACTIONAL_BIT:
                started.add(pid)
            elif pid in ongoing or pid in started:
                first = ongoing[pid][1] if pid in ongoing else "this request"
                return _error(Errors.INVALID_TXN_STATE,
                              f"producer {pid}: non-transactional batch while its transaction (from offset "
                              f"{first}) is ongoing on this partition")
        return None

    def check_marker(self, pid: int, epoch: int) -> Decision:
        """What to do with an end-of-transaction marker of producer ``pid`` at ``epoch``: APPEND (write it),
        DUPLICATE (nothing to write: no transaction is ongoing here and the epoch changes nothing), or
        INVALID_PRODUCER_EPOCH if ``epoch`` is older than the producer's."""
        row = self._find(pid)
        txn = self._ongoing.get(pid)
        current = self._rows["epoch"].item(row) if row >= 0 else -1
        if txn is not None:
            current = max(current, txn[0])
        if epoch < current:
            return _error(Errors.INVALID_PRODUCER_EPOCH,
                          f"producer {pid}: marker epoch {epoch} is older than the current epoch {current}")
        if txn is not None:
            return APPEND
        if row >= 0 and epoch > current:
            return APPEND  # no transaction, but the epoch bump must reach the log to outlive a restart
        return Decision(Action.DUPLICATE, message=f"producer {pid}: no transaction ongoing on this partition")

    def end_transaction(self, pid: int, epoch: int, commit: bool, offset: int, now_ms: int,
                        timestamp_ms: int = -1) -> None:
        """Record the marker of producer ``pid`` written (or read back at recovery) at ``offset``.

        The row takes a newer epoch (``foff``/``loff`` = ``offset``, no batch: the next batch must start
        at sequence 0, and a replay skips what precedes the marker); a marker of the producer's epoch
        keeps its batches, so retries of them are still answered as duplicates.  The ongoing
        transaction ends; an aborted one goes into the aborted index.  Either part is skipped when the
        state already holds the marker (``replay``'s rules).
        """
        row = self._find(pid)
        if row < 0 or self._rows["foff"].item(row) < offset:
            if row < 0 or epoch > self._rows["epoch"].item(row):
                if row < 0:
                    row = self._new_row(pid)
                elif pid in self._older:
                    del self._older[pid]
                self._rows[row] = (pid, now_ms, offset, offset, timestamp_ms, NO_SEQUENCE, NO_SEQUENCE,
                                   self._rows["tpos"].item(row), epoch)
            else:
                self._rows["upd"][row] = now_ms
            self._updated(now_ms)
        if offset < self._txn_from:
            return
        txn = self._ongoing.pop(pid, None)
        if txn is not None and not commit:
            lso = next(iter(self._ongoing.values()))[1] if self._ongoing else offset + 1
            self._aborted.add(pid, txn[1], offset, lso)

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest ongoing transaction (the LSO's bound), None if none is ongoing."""
        for _, first in self._ongoing.values():
            return first
        return None

    def ongoing_ids(self) -> Any:
        """The producer ids with a transaction ongoing here (a live view, for membership tests)."""
        return self._ongoing.keys()

    def ongoing(self) -> dict[int, tuple[int, int]]:
        """{producer id: (epoch, first offset)} of the ongoing transactions."""
        return dict(self._ongoing)

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """``AbortedIndex.collect``."""
        return self._aborted.collect(start, end)

    def truncate_before(self, log_start_offset: int) -> int:
        """The log start moved up: forget aborted transactions whose marker is gone with it."""
        return self._aborted.truncate_before(log_start_offset)
