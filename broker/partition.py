"""One partition: its log plus its idempotent-producer state, behind one lock.

``append`` is what a Produce handler calls with one partition's records:

1. ``split_batches`` validates the blob (framing, CRC, header rules); a bad
   batch refuses the whole blob with its Kafka code.
2. Unless ``dedup=False``, ``ProducerStateManager.check_all`` decides for every
   batch (each seeing the earlier ones of the request).
3. All or nothing: if any batch is an error, nothing is appended and that error
   (the first one) is the answer.  Duplicates are appended nowhere; the other
   batches go to the log in one group-committed ``PartitionLog.append``, then
   the producer state records them.
4. The answer's ``base_offset`` is the offset of the request's *first* batch:
   the original offset when it is a duplicate (so a retry gets the answer the
   lost response carried), the new one otherwise.

``dedup=False`` skips the duplicate and sequence checks entirely (every batch
is appended), to show what idempotence buys; the state is still tracked, so the
checks are right if the partition is reopened with ``dedup=True``.

The producer state is snapshotted every ``snapshot_every`` appends, on close,
and before any segment is deleted (retention by ``retention_bytes`` after each
append, or ``delete_records_before``), so it survives both restarts and the
loss of the batches it came from; reopening replays only the log after the
newest snapshot.  Producers idle for ``producer_id_expiration_ms`` are dropped
(checked at most once a minute, on append).

Threads: every public method takes the partition's lock, so a front end may
call from any thread; calls on one partition run one at a time (a long read
delays an append).  There is no asyncio here: an asyncio front end should call
through ``loop.run_in_executor`` because appends fsync.

I/O errors while appending are answered as UNKNOWN_SERVER_ERROR (Kafka would
say KAFKA_STORAGE_ERROR, 56, which the project's error enum does not have);
the log undoes the partial append, so the state stays consistent.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from wire.errors import Errors

from .log import DEFAULT_SEGMENT_BYTES, PartitionLog
from .producer_state import (
    APPEND,
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    Action,
    ProducerEntry,
    ProducerStateManager,
)
from .recordbatch import BatchError, split_batches

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_BYTES = 1_048_588  # Kafka's max.message.bytes default
DEFAULT_SNAPSHOT_EVERY = 1000
EXPIRY_CHECK_MS = 60_000


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


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
                 max_batch_bytes: int | None = DEFAULT_MAX_BATCH_BYTES, fsync: bool = True):
        self.directory = directory
        self.dedup = dedup
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.snapshot_every = max(1, snapshot_every)
        self.max_batch_bytes = max_batch_bytes
        self._clock = clock_ms
        self._lock = threading.Lock()
        self._closed = False
        self.log = PartitionLog(directory, segment_bytes=segment_bytes, fsync=fsync)
        try:
            now = self._clock()
            self.state = ProducerStateManager.recover(self.log.directory, self.log, now)
            self.state.expire(now, producer_id_expiration_ms)
            self._last_expiry_check = now
            self._snapshot_offset = self.state.recovery_stats["snapshot_offset"]
            self._appends_since_snapshot = 0
            self._apply_retention()
        except BaseException:
            self.log.close()
            raise

    # ================================================================ append
    def append(self, records: bytes) -> AppendResult:
        """Validate, deduplicate and append one partition's records blob (see the module doc)."""
        with self._lock:
            self._check_open()
            try:
                parts = split_batches(records, max_batch_bytes=self.max_batch_bytes)
            except BatchError as e:
                return self._result(e.code, message=e.message)
            headers = [h for h, _ in parts]
            if self.dedup:
                decisions = self.state.check_all(headers, next_offset=self.log.log_end_offset)
            else:
                decisions = [APPEND] * len(parts)
            for d in decisions:
                if d.is_error:
                    return self._result(d.error, message=d.message)
            new = [(h, raw) for (h, raw), d in zip(parts, decisions) if d.action is Action.APPEND]
            first = -1
            if new:
                now = self._clock()
                try:
                    first = self.log.append([raw for _, raw in new])
                except OSError as e:
                    log.error("partition %s: append failed: %s", self.directory, e)
                    return self._result(Errors.UNKNOWN_SERVER_ERROR, message=f"storage error: {e}")
                offset = first
                for h, _ in new:
                    self.state.update(h, offset, now)
                    offset += h.last_offset_delta + 1
                self._after_append(now)
            d0 = decisions[0]
            base = d0.first_offset if d0.action is Action.DUPLICATE else first
            return self._result(Errors.NONE, base_offset=base, duplicate=not new,
                                message="" if new else d0.message)

    def _result(self, error: Errors, **kw) -> AppendResult:
        return AppendResult(error, log_start_offset=self.log.log_start_offset, **kw)

    def _after_append(self, now: int) -> None:
        self._appends_since_snapshot += 1
        if now - self._last_expiry_check >= min(EXPIRY_CHECK_MS, self.producer_id_expiration_ms):
            self._last_expiry_check = now
            gone = self.state.expire(now, self.producer_id_expiration_ms)
            if gone:
                log.info("partition %s: expired %d idle producers", self.directory, len(gone))
        if self._appends_since_snapshot >= self.snapshot_every:
            self._snapshot()
        self._apply_retention()

    def _snapshot(self) -> None:
        end = self.log.log_end_offset
        self.state.take_snapshot(self.log.directory, end)
        self._snapshot_offset = end
        self._appends_since_snapshot = 0

    def _apply_retention(self) -> None:
        if self.retention_bytes is None and self.retention_ms is None:
            return
        new_start = self.log.plan_retention(self.retention_bytes, self.retention_ms, self._clock())
        if new_start > self.log.log_start_offset:
            self._delete_before(new_start)

    def _delete_before(self, offset: int) -> int:
        if offset > self.log.log_start_offset and self._snapshot_offset != self.log.log_end_offset:
            self._snapshot()  # the state must outlive the batches it came from
        return self.log.delete_records_before(offset)

    # ================================================================= reads
    def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one containing ``offset`` (``PartitionLog.read``; raises OffsetOutOfRangeError)."""
        with self._lock:
            self._check_open()
            return self.log.read(offset, max_bytes)

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

    def describe_producers(self, limit: int) -> tuple[list[tuple[int, int, int, int]], int]:
        """At most ``limit`` producers as (producer id, epoch, last sequence, last timestamp), by producer
        id, and how many the partition has in all (DescribeProducers)."""
        with self._lock:
            return self.state.describe(limit), len(self.state)

    # ============================================================== deletion
    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start up to ``offset`` (producer state snapshotted first)."""
        with self._lock:
            self._check_open()
            return self._delete_before(offset)

    # ================================================================= close
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"partition {self.directory} is closed")

    def close(self) -> None:
        """Snapshot the producer state (if anything changed since the last one) and close the log."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self.log.log_end_offset > max(self._snapshot_offset, 0):
                    self._snapshot()
            finally:
                self.log.close()

    def __enter__(self) -> "Partition":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
