"""``ProducerStateManager``: the producer state of one partition, made of the package's parts (rules,
row table, transactions, snapshots), and its recovery from the newest snapshot and the log.
The design: ``docs/producer-state.md``.
"""
from __future__ import annotations

import collections
import logging
from typing import Any

import numpy as np

from snapshots.storage.disk import CorruptFileError

from ..recordbatch import (
    CONTROL_ABORT,
    CONTROL_BIT,
    CONTROL_COMMIT,
    TRANSACTIONAL_BIT,
    BatchError,
    BatchHeader,
    control_record_type,
)
from .rules import ProducerEntry, _SequenceRules
from .snapshot import _Snapshots, list_snapshots
from .table import DEFAULT_RETRY_WINDOW_MS, INT64_MAX, ROW, _MIN_BITS, _MIN_ROWS, _Evicted, _Table
from .transactions import AbortedIndex, _Transactions

# The package's name, as before it was split into modules: log configuration and readers see one
# logger.
log = logging.getLogger(__package__)


class ProducerStateManager(_SequenceRules, _Transactions, _Snapshots, _Table):
    """Producer state of one partition.  Not thread-safe (the partition serialises calls)."""

    def __init__(self, *, retry_window_ms: int = DEFAULT_RETRY_WINDOW_MS, max_producers: int | None = None):
        if max_producers is not None and max_producers < 1:
            raise ValueError("max_producers must be at least 1")
        self.retry_window_ms = retry_window_ms
        self.max_producers = max_producers
        self._rows = np.zeros(_MIN_ROWS, ROW)
        self._rows["upd"] = INT64_MAX
        self._hi = 0  # rows below are live or free
        self._free = np.empty(_MIN_ROWS, np.int64)  # stack of free rows below _hi
        self._nfree = 0
        self._bits = _MIN_BITS
        self._table = np.zeros(1 << self._bits, np.int32)
        self._live = 0
        self._tombs = 0
        self._min_upd = INT64_MAX  # no live producer was updated before this
        # pid -> its older batches, packed (_OLDER each, oldest first), in update order
        self._older: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._evicted: _Evicted | None = None
        self.evictions = 0
        self.recovery_stats: dict[str, int] = {}
        self._generation = 0
        self.shrink_due = False
        self._pass_min = INT64_MAX  # oldest update seen by the expiry pass under way
        self._pass_generation = 0
        self.snapshot_end = -1  # of the snapshot loaded: every batch it held is below this offset
        # Transactions.  pid -> (epoch, first offset) of its ongoing transaction on this partition; in
        # first-offset order (a new one always starts at the log end), so the first is the LSO's.
        self._ongoing: dict[int, tuple[int, int]] = {}
        self._aborted = AbortedIndex()
        # The transactions are exact as of this offset (the loaded snapshot's end): replay changes them
        # only for batches at or after it (rows have their own rule, ``replay``).
        self._txn_from = -1
        self._bind()

    # ------------------------------------------------------------ recovery
    @classmethod
    def recover(cls, directory: str, log_: Any, now_ms: int, **options: Any) -> "ProducerStateManager":
        """Load the newest snapshot in ``directory`` and replay the log's batch headers after it.

        ``log_`` is a ``broker.log.PartitionLog`` (anything with
        ``directory``, ``log_start_offset``, ``log_end_offset``, ``iter_headers``
        and ``read``, which gives a control batch whole to learn its type).  A
        snapshot taken at an offset beyond the log end proves acknowledged
        batches are missing from the log: ``CorruptFileError``.  A damaged
        newest snapshot is refused too (delete it to fall back to the previous
        one).  ``recovery_stats`` tells what was done.  ``options`` go to the
        constructor.
        """
        mgr = cls(**options)
        snaps = list_snapshots(directory)
        end = log_.log_end_offset
        start = log_.log_start_offset
        snap_offset = None
        if snaps:
            offset, path = snaps[-1]
            if offset > end:
                raise CorruptFileError(path, f"producer state snapshot taken at offset {offset} but the log in "
                                             f"{directory} ends at {end}: acknowledged batches are missing from "
                                             f"the log")
            loaded = mgr.load_snapshot(path)
            if loaded != offset:
                raise CorruptFileError(path, f"snapshot says offset {loaded} but its name says {offset}")
            if mgr.snapshot_end > end:
                raise CorruptFileError(path, f"producer state snapshot holds batches up to offset {mgr.snapshot_end} "
                                             f"but the log in {directory} ends at {end}: acknowledged batches are "
                                             f"missing from the log")
            snap_offset = offset
            if offset < start:
                log.warning("producer state %s: snapshot at offset %d is below the log start %d; producers of the "
                            "deleted batches in between are not known", directory, offset, start)
        replayed = 0
        from_offset = start if snap_offset is None else max(snap_offset, start)
        for h in log_.iter_headers(from_offset):
            if snap_offset is not None and h.base_offset < snap_offset:
                continue  # already in the snapshot (only possible if a batch straddles it; ours never do)
            replayed += 1
            if h.attributes & CONTROL_BIT:
                _replay_control(mgr, log_, h, now_ms)
            else:
                mgr.replay(h, h.base_offset, now_ms)
        mgr.truncate_before(start)
        mgr.recovery_stats = {"snapshot_offset": -1 if snap_offset is None else snap_offset,
                              "replayed_batches": replayed, "producers": mgr._live}
        return mgr


def _replay_control(mgr: ProducerStateManager, log_: Any, h: BatchHeader, now_ms: int) -> None:
    """A control batch read back at recovery: an end-of-transaction marker ends its transaction (its type
    is in its record: the batch is read whole).  Only the broker writes control batches."""
    if not (h.attributes & TRANSACTIONAL_BIT and h.has_producer_id):
        return
    batch = log_.read(h.base_offset, 0)[:h.size]
    try:
        kind = control_record_type(batch)
    except BatchError as e:
        raise CorruptFileError(log_.directory, f"control batch at offset {h.base_offset}: {e}") from None
    if kind in (CONTROL_ABORT, CONTROL_COMMIT):
        mgr.end_transaction(h.producer_id, h.producer_epoch, kind == CONTROL_COMMIT, h.base_offset, now_ms,
                            h.max_timestamp)


def read_snapshot(path: str) -> tuple[int, dict[int, ProducerEntry]]:
    """The snapshot in ``path`` as (offset, producers by id) (for tools and tests)."""
    m = ProducerStateManager()
    offset = m.load_snapshot(path)
    return offset, m.producers()
