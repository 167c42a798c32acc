"""One partition: its log plus its idempotent-producer state, behind one lock.

``append`` validates a Produce's records for one partition, decides every batch against the producer state and
appends all of them or none; ``write_marker`` ends a transaction; snapshots and expiry run in chunks so that no
append waits long.  Every public method takes the lock; appends fsync, so an asyncio caller goes through an
executor.  The rules and why: docs/producer-state.md.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import logging
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from records.wire.errors import Errors, UnknownTopicOrPartitionError

from .log import DEFAULT_SEGMENT_BYTES, PartitionLog
from .producer_state import (
    APPEND,
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    DEFAULT_RETRY_WINDOW_MS,
    Action,
    ProducerEntry,
    ProducerSnapshot,
    ProducerStateManager,
    install_snapshot,
)
from .recordbatch import LOG_OVERHEAD, TRANSACTIONAL_BIT, BatchError, encode_control_batch, split_batches
from .segment_files import SegmentFiles

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_BYTES = 1_048_588  # Kafka's max.message.bytes default
DEFAULT_SNAPSHOT_EVERY = 100_000  # batches; a crash then replays at most this many headers on restart
EXPIRY_CHECK_MS = 60_000
EXPIRY_CHUNK_ROWS = 1 << 16  # about 2.5 ms of the partition lock at most
SNAPSHOT_CHUNK_ROWS = 1 << 16  # about 3.5 MB of rows copied per lock acquisition
MAX_EXPECTING = 100_000  # KIP-890 checks under way, per partition
_BASE_AND_LENGTH = struct.Struct(">qi")  # a batch's base offset and batchLength

_shared_executor: concurrent.futures.ThreadPoolExecutor | None = None
_shared_lock = threading.Lock()


def snapshot_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that writes producer-state snapshots for every partition of the process."""
    global _shared_executor
    with _shared_lock:
        if _shared_executor is None:
            _shared_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="producer-snapshots")
        return _shared_executor


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class PartitionClosedError(UnknownTopicOrPartitionError, ValueError):
    """A closed partition was used: its topic was deleted while a request held it (UNKNOWN_TOPIC_OR_PARTITION
    for that partition; a ValueError as before)."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: Errors
    base_offset: int = -1
    log_append_time: int = -1  # always -1: topics use CreateTime
    log_start_offset: int = -1
    message: str = ""
    duplicate: bool = False  # every batch of the request was a duplicate; nothing was appended

    @property
    def ok(self) -> bool:
        return self.error == Errors.NONE


class Partition:
    def __init__(self, directory: str, *, dedup: bool = True, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 retention_bytes: int | None = None, retention_ms: int | None = None,
                 producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
                 clock_ms: Callable[[], int] = wall_clock_ms, snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
                 max_batch_bytes: int | None = DEFAULT_MAX_BATCH_BYTES, fsync: bool = True,
                 max_producers: int | None = None, retry_window_ms: int = DEFAULT_RETRY_WINDOW_MS,
                 snapshot_executor: concurrent.futures.Executor | None = None,
                 segment_files: SegmentFiles | None = None):
        self.directory = directory
        self.dedup = dedup
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.snapshot_every = max(1, snapshot_every)
        self.max_batch_bytes = max_batch_bytes
        self._clock = clock_ms
        self._executor = snapshot_executor
        self._lock = threading.RLock()  # RLock: a snapshot that finishes at once runs its callback here
        self._closed = False
        self._pending: concurrent.futures.Future | None = None  # the snapshot being written
        self._snapshot_again = False  # a snapshot was asked for while one was being written
        self.snapshot_errors = 0
        self._expecting: dict[int, tuple[int, int]] = {}  # producer id -> (epoch, token): KIP-890 checks under way
        self._tokens = itertools.count(1)
        self.log = PartitionLog(directory, segment_bytes=segment_bytes, fsync=fsync, files=segment_files)
        try:
            now = self._clock()
            self.state = ProducerStateManager.recover(self.log.directory, self.log, now,
                                                      max_producers=max_producers, retry_window_ms=retry_window_ms)
            self.state.expire(now, producer_id_expiration_ms)
            self._last_expiry_check = now
            self._expiry_cursor: int | None = None
            self._snapshot_offset = self.state.recovery_stats["snapshot_offset"]  # newest durable snapshot
            self._batches_since_snapshot = self.state.recovery_stats["replayed_batches"]
            self._apply_retention()
        except BaseException:
            self.log.close()
            raise

    def reconfigure(self, options: dict) -> None:
        """A topic's configs changed (AlterConfigs): its retention, segment size and largest batch from now on
        (the next roll and retention pass use them).  ``options``: as this constructor's."""
        with self._lock:
            self.retention_ms = options.get("retention_ms")
            self.retention_bytes = options.get("retention_bytes")
            self.max_batch_bytes = options.get("max_batch_bytes", DEFAULT_MAX_BATCH_BYTES)
            self.log.segment_bytes = options.get("segment_bytes", DEFAULT_SEGMENT_BYTES)

    # ================================================================ append
    def expect_transaction(self, producer_id: int, producer_epoch: int) -> int:
        """KIP-890 part 1, before the front end asks the coordinator whether this partition is in the
        producer's ongoing transaction: a token for ``append(..., transactional_ok=token)``.  A marker
        for the producer written in between voids it (``write_marker``), so a batch verified against a
        transaction that ended meanwhile is refused instead of opening a transaction nobody will end.
        No lock: one dict store (atomic), called on the event loop."""
        token = next(self._tokens)
        if len(self._expecting) >= MAX_EXPECTING:
            self._expecting.clear()  # abandoned checks (their appends never came): those left fail safe
        self._expecting[producer_id] = (producer_epoch, token)
        return token

    def _transactional_allowed(self, h, transactional_ok: bool | int | None) -> bool:
        if transactional_ok is True:
            return True
        if not transactional_ok:
            return False
        cur = self._expecting.get(h.producer_id)
        return cur == (h.producer_epoch, transactional_ok) or h.producer_id in self.state.ongoing_ids()

    def append(self, records: bytes, *, transactional_ok: bool | int | None = False) -> AppendResult:
        """Validate, deduplicate and append one partition's records blob (docs/producer-state.md, "One partition").

        ``transactional_ok``: the front end says the coordinator verified that this partition is in
        the producer's ongoing transaction (KIP-890 part 1): the token ``expect_transaction`` gave
        before the check (still valid: no marker of the producer since), or True; without it a
        transactional batch is refused with INVALID_TXN_STATE.
        """
        with self._lock:
            self._check_open()
            try:
                parts = split_batches(records, max_batch_bytes=self.max_batch_bytes)
            except BatchError as e:
                return self._result(e.code, message=e.message)
            headers = [h for h, _ in parts]
            txn = False
            for h in headers:
                if h.attributes & TRANSACTIONAL_BIT:
                    if not self._transactional_allowed(h, transactional_ok):
                        # KIP-890 part 1 (Kafka 3.6+): a transactional batch goes only to a partition added
                        # to its producer's ongoing transaction; refused, never shown to read_committed
                        # consumers as if committed.
                        return self._result(Errors.INVALID_TXN_STATE,
                                            message=f"producer {h.producer_id}: transactional batch for a "
                                                    f"partition not added to an ongoing transaction")
                    txn = True
            if self.dedup:
                decisions = self.state.check_all(headers, next_offset=self.log.log_end_offset)
            else:
                decisions = [APPEND] * len(parts)
            for d in decisions:
                if d.is_error:
                    return self._result(d.error, message=d.message)
            if txn or self.state.has_ongoing:
                d = self.state.check_txn(headers, decisions)
                if d is not None:
                    return self._result(d.error, message=d.message)
            new = [(h, raw) for (h, raw), d in zip(parts, decisions) if d.action is Action.APPEND]
            first = -1
            if new:
                now = self._clock()
                segments = len(self.log.segment_base_offsets)
                try:
                    first = self.log.append([raw for _, raw in new])
                except OSError as e:
                    log.error("partition %s: append failed: %s", self.directory, e)
                    return self._result(Errors.UNKNOWN_SERVER_ERROR, message=f"storage error: {e}")
                offset = first
                for h, _ in new:
                    self.state.update(h, offset, now)
                    offset += h.last_offset_delta + 1
                self._after_append(now, len(new), len(self.log.segment_base_offsets) != segments)
            d0 = decisions[0]
            base = d0.first_offset if d0.action is Action.DUPLICATE else first
            return self._result(Errors.NONE, base_offset=base, duplicate=not new,
                                message="" if new else d0.message)

    def write_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                     coordinator_epoch: int = 0, still_current: Callable[[], bool] | None = None) -> AppendResult:
        """WriteTxnMarkers for this partition: end producer ``producer_id``'s transaction here with a COMMIT
        or ABORT control batch (``encode_control_batch``), durable when this returns.

        As Kafka's ``ProducerAppendInfo.appendEndTxnMarker``: an epoch older than the producer's is
        INVALID_PRODUCER_EPOCH (nothing written); a newer one (the coordinator bumped it to abort a
        timed-out transaction, or KIP-890 part 2) becomes the producer's epoch, fencing the older one,
        and the next batch must start at sequence 0.  With no transaction ongoing here (the partition
        was added but got no batch, or the coordinator retries a marker after a restart) nothing is
        written and the answer is success with ``duplicate`` - unless the marker bumps a known
        producer's epoch: then it is written, so that the bump is in the log and outlives a crash (a
        retry of it is then a duplicate).  The coordinator epoch is written in the marker, not checked.

        ``still_current``, asked under the partition's lock, says whether the transaction the marker is
        for may still be the producer's here: a marker names only the producer and its epoch, so one
        written after the producer's next transaction began here would end that one.  False: nothing is
        written (``duplicate``).
        """
        with self._lock:
            self._check_open()
            if still_current is not None and not still_current():
                return self._result(Errors.NONE, duplicate=True,
                                    message="the transaction has ended: a later one of the producer is known")
            self._expecting.pop(producer_id, None)  # a KIP-890 check under way is void: its transaction ended
            d = self.state.check_marker(producer_id, producer_epoch)
            if d.is_error:
                return self._result(d.error, message=d.message)
            if d.action is Action.DUPLICATE:
                return self._result(Errors.NONE, duplicate=True, message=d.message)
            now = self._clock()
            batch = encode_control_batch(producer_id, producer_epoch, commit, coordinator_epoch, timestamp_ms=now)
            segments = len(self.log.segment_base_offsets)
            try:
                offset = self.log.append([batch])
            except OSError as e:
                log.error("partition %s: writing a transaction marker failed: %s", self.directory, e)
                return self._result(Errors.UNKNOWN_SERVER_ERROR, message=f"storage error: {e}")
            self.state.end_transaction(producer_id, producer_epoch, commit, offset, now, now)
            self._after_append(now, 1, len(self.log.segment_base_offsets) != segments)
            return self._result(Errors.NONE, base_offset=offset)

    def _result(self, error: Errors, **kw) -> AppendResult:
        return AppendResult(error, log_start_offset=self.log.log_start_offset, **kw)

    def _after_append(self, now: int, batches: int, rolled: bool) -> None:
        self._batches_since_snapshot += batches
        self._expiry_step(now)
        if rolled or self._batches_since_snapshot >= self.snapshot_every:
            self._snapshot_async()
        self._apply_retention()

    # ------------------------------------------------------------- expiry
    def _expiry_step(self, now: int) -> None:
        """One chunk of an expiry pass (starting one if due), or the rebuild that gives memory back after
        one; caller holds the lock."""
        if self._expiry_cursor is None and self.state.compact():
            return
        if self._expiry_cursor is None:
            if now - self._last_expiry_check < min(EXPIRY_CHECK_MS, self.producer_id_expiration_ms):
                return
            self._last_expiry_check = now
            if not self.state.due_for_expiry(now, self.producer_id_expiration_ms):
                return
            self._expiry_cursor = 0
        start = self._expiry_cursor
        gone = self.state.expire(now, self.producer_id_expiration_ms, start, start + EXPIRY_CHUNK_ROWS)
        self._expiry_cursor = start + EXPIRY_CHUNK_ROWS
        if self._expiry_cursor >= self.state.row_count:
            self._expiry_cursor = None
        if gone:
            log.info("partition %s: expired %d idle producers", self.directory, gone)

    def maintain(self) -> None:
        """Work that must not wait for appends: expiry (a chunk per lock acquisition), retention.
        The broker calls it every few seconds from an I/O thread."""
        while True:
            with self._lock:
                if self._closed:
                    return
                self._expiry_step(self._clock())
                if self._expiry_cursor is None and not self.state.shrink_due:
                    self._apply_retention()
                    return

    # ------------------------------------------------------------- snapshots
    def _snapshot_async(self) -> None:
        """Have the snapshot thread copy the state (a chunk of rows per lock acquisition) and write it."""
        if self._pending is not None:
            self._snapshot_again = True
            return
        self._batches_since_snapshot = 0
        self._snapshot_again = False
        executor = self._executor or snapshot_executor()
        self._pending = executor.submit(self._take_snapshot)
        self._pending.add_done_callback(self._snapshot_done)

    def _take_snapshot(self) -> ProducerSnapshot | None:
        """In the snapshot thread: copy the state ``SNAPSHOT_CHUNK_ROWS`` rows per lock acquisition, then
        encode and write it without the lock.  None if the partition closed meanwhile."""
        t0 = time.perf_counter()
        held = 0.0
        with self._lock:
            if self._closed:
                return None
            c = self.state.snapshot_begin(self.log.log_end_offset)
        while True:
            with self._lock:
                if self._closed:
                    return None
                t = time.perf_counter()
                done = self.state.snapshot_step(c, SNAPSHOT_CHUNK_ROWS)
                if done:
                    snap = self.state.snapshot_finish(c, self.log.log_end_offset)
                held = max(held, time.perf_counter() - t)
            if done:
                break
        copied = time.perf_counter()
        install_snapshot(self.log.directory, snap)
        log.info("partition %s: producer-state snapshot at offset %d: %d rows, copied in %.1f ms (at most "
                 "%.1f ms under the lock, %d restarts), written in %.1f ms", self.directory, snap.offset,
                 len(snap.rows), (copied - t0) * 1000, held * 1000, c.restarts, (time.perf_counter() - copied) * 1000)
        return snap

    def _snapshot_done(self, fut: concurrent.futures.Future) -> None:
        with self._lock:
            if self._pending is fut:
                self._pending = None
            error = fut.exception()
            if error is not None:
                # Nothing is lost: the log still holds every batch after the previous snapshot, and
                # retention deletes nothing below a durable snapshot.
                self.snapshot_errors += 1
                log.error("partition %s: writing a producer-state snapshot failed: %s", self.directory, error)
                return
            snap = fut.result()
            if snap is None:
                return
            self._snapshot_offset = max(self._snapshot_offset, snap.offset)
            if self._closed:
                return
            if self._snapshot_again:
                self._snapshot_async()
            self._apply_retention()

    def wait_snapshots(self, timeout: float | None = None) -> None:
        """Wait until no snapshot is being written (tests, tools, close)."""
        while True:
            with self._lock:
                fut = self._pending
            if fut is None:
                return
            concurrent.futures.wait([fut], timeout)
            if not fut.done():
                raise TimeoutError(f"partition {self.directory}: a snapshot is still being written")

    def _snapshot_now(self) -> None:
        """Write a snapshot at the log end in this thread (caller holds the lock, none is pending)."""
        end = self.log.log_end_offset
        install_snapshot(self.log.directory, self.state.snapshot(end))
        self._snapshot_offset = end
        self._batches_since_snapshot = 0

    # ------------------------------------------------------------- retention
    def _apply_retention(self) -> None:
        if self.retention_bytes is None and self.retention_ms is None:
            return
        new_start = self.log.plan_retention(self.retention_bytes, self.retention_ms, self._clock())
        if new_start <= self.log.log_start_offset:
            return
        if self._snapshot_offset >= new_start:
            self._delete_records(new_start)  # the state of those batches is in a durable snapshot
        else:
            self._snapshot_async()  # deleted once it is durable (_snapshot_done)

    def _delete_before(self, offset: int) -> int:
        if offset > self.log.log_start_offset and self._snapshot_offset < offset:
            self._snapshot_now()  # the state must outlive the batches it came from
        return self._delete_records(offset)

    def _delete_records(self, offset: int) -> int:
        start = self.log.delete_records_before(offset)
        self.state.truncate_before(start)  # aborted transactions whose marker went with the segments
        return start

    # ================================================================= reads
    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None) -> bytes:
        """Whole batches from the one containing ``offset`` (``PartitionLog.read``; raises OffsetOutOfRangeError).

        ``max_offset`` (read_committed passes the last stable offset): only batches starting below it;
        empty if ``offset`` is at or above it (but inside the log).
        """
        with self._lock:
            self._check_open()
            if max_offset is None:
                return self.log.read(offset, max_bytes)
            if offset >= max_offset and self.log.log_start_offset <= offset <= self.log.log_end_offset:
                return b""
            data = self.log.read(offset, max_bytes)
            pos = 0
            while pos < len(data):
                base, length = _BASE_AND_LENGTH.unpack_from(data, pos)
                if base >= max_offset:
                    break
                pos += length + LOG_OVERHEAD
            return data[:pos] if pos < len(data) else data

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: the first offset of the oldest transaction ongoing here (not below the log start),
        else the high watermark.  read_committed consumers read below it only."""
        with self._lock:
            end = self.log.log_end_offset
            first = self.state.first_unstable_offset()
            if first is None:
                return end
            return min(max(first, self.log.log_start_offset), end)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of every transaction aborted here that overlaps
        [start_offset, end_offset) - its abort marker at or after ``start_offset``, its first offset
        before ``end_offset`` - by first offset: a read_committed Fetch's ``aborted_transactions``.
        Bounded cost (``producer_state.AbortedIndex``)."""
        with self._lock:
            self._check_open()
            return self.state.aborted_transactions(start_offset, end_offset)

    def ongoing_transactions(self) -> dict[int, tuple[int, int]]:
        """{producer id: (epoch, first offset)} of the transactions ongoing here (tests, status)."""
        with self._lock:
            return self.state.ongoing()

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """ListOffsets (``PartitionLog.offset_for_timestamp``: -1 latest, -2 earliest, else by time)."""
        with self._lock:
            self._check_open()
            return self.log.offset_for_timestamp(timestamp_ms)

    @property
    def log_start_offset(self) -> int:
        with self._lock:
            return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        with self._lock:
            return self.log.log_end_offset

    @property
    def high_watermark(self) -> int:
        """One replica: everything appended is committed (appends are durable when they return)."""
        return self.log_end_offset

    def producers(self) -> dict[int, ProducerEntry]:
        """The producer state (copies), for tools and tests; DescribeProducers uses ``describe_producers``."""
        with self._lock:
            return self.state.producers()

    def producer_stats(self) -> dict[str, int]:
        """producers, producers_with_older_batches, evictions, array_bytes, snapshot_errors."""
        with self._lock:
            return {**self.state.stats(), "snapshot_errors": self.snapshot_errors}

    def describe_producers(self, limit: int) -> tuple[list[tuple[int, int, int, int, int]], int]:
        """At most ``limit`` producers as (producer id, epoch, last sequence, last timestamp, first offset of
        its ongoing transaction or -1), by producer id, and how many the partition has in all
        (DescribeProducers)."""
        with self._lock:
            return self.state.describe(limit), len(self.state)

    # ============================================================== deletion
    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start up to ``offset`` (producer state snapshotted first)."""
        self.wait_snapshots()
        with self._lock:
            self._check_open()
            if self._pending is not None:  # one started meanwhile: let it finish first
                self._pending.result()
            return self._delete_before(offset)

    # ================================================================= close
    def _check_open(self) -> None:
        if self._closed:
            raise PartitionClosedError(f"partition {self.directory} is closed (its topic was deleted?)")

    def close(self) -> None:
        """Snapshot the producer state (if anything changed since the last one) and close the log."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # no new snapshot starts
            fut = self._pending
        if fut is not None:
            concurrent.futures.wait([fut])
        with self._lock:
            try:
                if self.log.log_end_offset > max(self._snapshot_offset, 0) or self._batches_since_snapshot:
                    self._snapshot_now()
            finally:
                self.log.close()

    def __enter__(self) -> "Partition":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
