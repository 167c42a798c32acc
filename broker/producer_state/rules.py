"""The idempotence rules: what a batch with a producer ID is answered (``check``, ``check_all``: epochs,
duplicates, sequences, unknown and evicted producers) and what an appended batch leaves in the state
(``update``, ``replay``).  The design: ``docs/producer-state.md``.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from records.wire.errors import Errors

from ..recordbatch import NO_SEQUENCE, TRANSACTIONAL_BIT, BatchHeader, increment_sequence
from .table import INT64_MAX, _OLDER, _evicted_key

MAX_CACHED_BATCHES = 5


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    """One producer's state as plain objects (what ``get``/``producers`` return; the manager keeps rows)."""
    producer_id: int
    epoch: int
    batches: list[BatchMetadata] = field(default_factory=list)  # oldest first, at most MAX_CACHED_BATCHES
    last_update_ms: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_batch(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


class Action(enum.Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    error: Errors = Errors.NONE
    message: str = ""
    first_offset: int = -1  # DUPLICATE: where the original batch is
    last_offset: int = -1

    @property
    def is_error(self) -> bool:
        return self.action is Action.ERROR


APPEND = Decision(Action.APPEND)


def _error(code: Errors, message: str) -> Decision:
    return Decision(Action.ERROR, code, message)


def _apply(entry: ProducerEntry | None, h: BatchHeader, first_offset: int, now_ms: int) -> ProducerEntry:
    """The entry after appending ``h`` at ``first_offset`` (a new object when the epoch changes or none existed)."""
    if entry is None or entry.epoch != h.producer_epoch:
        entry = ProducerEntry(h.producer_id, h.producer_epoch)
    entry.batches.append(BatchMetadata(h.base_sequence, h.last_sequence, first_offset,
                                       first_offset + h.last_offset_delta if first_offset >= 0 else -1,
                                       h.max_timestamp))
    if len(entry.batches) > MAX_CACHED_BATCHES:
        del entry.batches[0]
    entry.last_update_ms = now_ms
    return entry


class _SequenceRules:
    """``ProducerStateManager``'s checks and updates (over the rows of ``_Table``)."""

    # ------------------------------------------------------------ reading one producer
    def _entry(self, pid: int) -> ProducerEntry | None:
        row = self._find(pid)
        if row < 0:
            return None
        _, upd, foff, loff, mts, fseq, lseq, _, epoch = self._rows[row].item()
        batches = [BatchMetadata(*b) for b in _OLDER.iter_unpack(self._older.get(pid, b""))]
        if fseq != -1 or lseq != -1:
            batches.append(BatchMetadata(fseq, lseq, foff, loff, mts))
        return ProducerEntry(pid, epoch, batches, upd)

    # ------------------------------------------------------------ checking
    def _decide(self, entry: ProducerEntry | None, h: BatchHeader) -> Decision:
        if not h.has_producer_id:
            return APPEND
        pid, epoch, seq = h.producer_id, h.producer_epoch, h.base_sequence
        if entry is None:
            if self._evicted is not None and _evicted_key(pid, epoch) in self._evicted:
                return _error(Errors.UNKNOWN_PRODUCER_ID,
                              f"producer {pid} epoch {epoch}: its state was evicted (more than {self.max_producers} "
                              f"producers in this partition); start a new epoch")
            return APPEND  # unknown producer: accepted at any sequence (KIP-360; docs/producer-state.md)
        if epoch < entry.epoch:
            return _error(Errors.INVALID_PRODUCER_EPOCH,
                          f"producer {pid}: epoch {epoch} is older than the current epoch {entry.epoch} (fenced)")
        if epoch > entry.epoch:
            if seq != 0:
                return _error(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                              f"producer {pid}: new epoch {epoch} must start at sequence 0, got {seq}")
            return APPEND
        dup = entry.find_batch(seq, h.last_sequence)
        if dup is not None:
            return Decision(Action.DUPLICATE, first_offset=dup.first_offset, last_offset=dup.last_offset,
                            message=f"producer {pid}: duplicate of sequences {seq}..{h.last_sequence} "
                                    f"at offset {dup.first_offset}")
        last = entry.last_seq
        expected = 0 if last == NO_SEQUENCE else increment_sequence(last, 1)
        if seq != expected:
            return _error(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                          f"producer {pid} epoch {epoch}: sequence {seq} does not follow the last sequence "
                          f"{last} (expected {expected})")
        return APPEND

    def check(self, h: BatchHeader) -> Decision:
        """What to do with batch ``h`` given the current state (no change to the state)."""
        return self._decide(self._entry(h.producer_id) if h.has_producer_id else None, h)

    def check_all(self, headers: Sequence[BatchHeader], next_offset: int | None = None) -> list[Decision]:
        """Decide for the batches of one request, each as if the earlier APPENDs had been appended.

        ``next_offset`` is where the first appended batch will land (the log
        end); the APPEND batches are assumed to be appended in order and
        contiguously from there, so a later batch that duplicates an earlier
        one of the same request gets exact offsets.  Without it those offsets
        are -1.  Nothing is changed.
        """
        overlay: dict[int, ProducerEntry | None] = {}
        offset = next_offset
        out = []
        for h in headers:
            pid = h.producer_id
            if not h.has_producer_id:
                entry = None
            elif pid in overlay:
                entry = overlay[pid]
            else:
                entry = self._entry(pid)
            d = self._decide(entry, h)
            if d.action is Action.APPEND:
                if h.has_producer_id:
                    overlay[pid] = _apply(entry, h, offset if offset is not None else -1, 0)
                if offset is not None:
                    offset += h.last_offset_delta + 1
            out.append(d)
        return out

    # ------------------------------------------------------------ updating
    def update(self, h: BatchHeader, first_offset: int, now_ms: int, *, txn: bool = True) -> None:
        """Record that batch ``h`` was appended at ``first_offset`` (no-op without a producer ID); a
        transactional batch starts its producer's transaction here unless one is ongoing (not with
        ``txn=False``: the row only)."""
        if not h.has_producer_id:
            return
        pid = h.producer_id
        row = self._find(pid)
        if row < 0:
            row = self._new_row(pid)
            same_epoch = False
        else:
            same_epoch = self._rows["epoch"].item(row) == h.producer_epoch
        r = self._rows[row]
        if same_epoch and r["fseq"] != -1 and now_ms - int(r["upd"]) < self.retry_window_ms:
            prev = (int(r["fseq"]), int(r["lseq"]), int(r["foff"]), int(r["loff"]), int(r["mts"]))
            kept = self._older.pop(pid, b"")
            packed = _OLDER.pack(*prev)
            each = [kept[i:i + _OLDER.size] for i in range(0, len(kept), _OLDER.size)]
            if packed in each:  # already there (a replay after a snapshot copied chunk by chunk)
                kept = b"".join(x for x in each if x != packed)
            # re-inserted: the dict stays in update order
            self._older[pid] = kept[-(MAX_CACHED_BATCHES - 2) * _OLDER.size:] + packed
        elif pid in self._older:
            del self._older[pid]
        last_offset = first_offset + h.last_offset_delta if first_offset >= 0 else -1
        self._rows[row] = (pid, now_ms, first_offset, last_offset, h.max_timestamp, h.base_sequence,
                           h.last_sequence, r["tpos"], h.producer_epoch)
        if now_ms < self._min_upd:
            self._min_upd = now_ms
        if now_ms < self._pass_min:
            self._pass_min = now_ms
        self._trim_older(now_ms)
        if txn and h.attributes & TRANSACTIONAL_BIT:
            self._begin_txn(pid, h.producer_epoch, first_offset)

    def replay(self, h: BatchHeader, first_offset: int, now_ms: int) -> None:
        """``update`` for a data batch read back from the log at recovery: the row is skipped if it already
        holds that batch or a later one (a snapshot copied chunk by chunk; see ``snapshot_begin``), the
        transaction if it is below the offset the loaded transactions are exact at."""
        if not h.has_producer_id:
            return
        row = self._find(h.producer_id)
        if row < 0 or self._rows["foff"].item(row) < first_offset:
            self.update(h, first_offset, now_ms, txn=False)
        if h.attributes & TRANSACTIONAL_BIT and first_offset >= self._txn_from:
            self._begin_txn(h.producer_id, h.producer_epoch, first_offset)

    def producers(self) -> dict[int, ProducerEntry]:
        """A copy of the state, by producer ID (a Python object per producer: for tests and tools)."""
        live = self._rows[:self._hi]
        pids = live["pid"][live["upd"] != INT64_MAX].tolist()
        return {pid: self._entry(pid) for pid in pids}

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._entry(producer_id)
