"""Producer IDs bound to whom they were handed to (SASL brokers): a Produce batch with a producer ID is
accepted only from the principal that got the ID, or naming the transactional id it belongs to.  The bindings
are kept in a group-committed file in the data directory.  The rule, the answers and why, the file:
docs/producer-state.md, "Whose producer ID it is".  Event-loop only; file I/O goes to ``run_io``.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import os
import struct
import time
from typing import Any, Callable


from snapshots.storage.disk import Disk, process_failstop
from records.wire.errors import Errors

from .framelog import FrameFile

log = logging.getLogger(__name__)

FILE_NAME = "producer-ids.bindings"
MAGIC = b"PQBIND\x00\x01"
PRINCIPAL, TRANSACTIONAL_ID = 0, 1
SCAN_CHUNK = 65_536
EVICT_FRACTION = 0.01
REWRITE_SLACK = 10_000

# RecordBatch v2 header offsets (broker.recordbatch.HEADER): magic, attributes, producer id.
_HEADER_BYTES, _MAGIC_AT, _ATTRIBUTES_AT, _PRODUCER_ID_AT, _LENGTH_AT = 61, 16, 21, 43, 8
_TRANSACTIONAL_BIT = 0x10
_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


def batch_producers(records: bytes | bytearray | memoryview) -> list[tuple[int, bool]]:
    """(producer id, transactional) of every v2 batch with a producer ID in a Produce partition's records,
    from the headers alone, to the end of the blob (no cap: a batch not looked at could carry an ID).
    Stops quietly at anything malformed: the append refuses the whole blob then."""
    out: list[tuple[int, bool]] = []
    pos, end = 0, len(records)
    while end - pos >= _HEADER_BYTES and records[pos + _MAGIC_AT] == 2:
        pid = _I64.unpack_from(records, pos + _PRODUCER_ID_AT)[0]
        if pid >= 0:
            item = (pid, bool(_I16.unpack_from(records, pos + _ATTRIBUTES_AT)[0] & _TRANSACTIONAL_BIT))
            if item not in out:
                out.append(item)
        length = _I32.unpack_from(records, pos + _LENGTH_AT)[0]
        if length < _HEADER_BYTES - 12:
            break
        pos += 12 + length
    return out


def _check_entry(e: Any) -> None:
    pid, kind, name, last_ms = e
    if not (isinstance(pid, int) and pid >= 0 and kind in (PRINCIPAL, TRANSACTIONAL_ID)
            and isinstance(name, str) and isinstance(last_ms, int)):
        raise ValueError(f"bad entry {e!r:.200}")


class ProducerBindings:
    def __init__(self, data_dir: str, lifetime_ms: int, max_bindings: int,
                 run_io: Callable[..., Any] | None = None, *, disk: Disk | None = None,
                 clock: Callable[[], float] = time.time):
        if lifetime_ms < 1 or max_bindings < 1:
            raise ValueError("lifetime_ms and max_bindings must be positive")
        self.path = os.path.join(data_dir, FILE_NAME)
        self.lifetime_ms = lifetime_ms
        self.max_bindings = max_bindings
        self._run_io = run_io
        self._disk = disk or Disk(failstop=process_failstop, preallocate=0)
        self._clock = clock
        self._b: dict[int, list] = {}  # producer id -> [kind, name, last_used_ms]
        self._frames = FrameFile(self.path, MAGIC, "producer-ID bindings file", _check_entry, self._disk)
        self._last_rewrite_ms = 0
        self._oldest_ms = 0  # a lower bound of the bindings' last use: the expiry scan runs only when due
        self._pending: list[tuple[list, asyncio.Future | None]] = []
        self._wake: asyncio.Event | None = None
        self._writer: asyncio.Task | None = None
        self._closing = False
        self._rewrite_wanted = False
        self._failed: Exception | None = None  # the write error that stopped the writer (where failstop returned)
        self.counters = {"producer_bindings_written": 0, "producer_binding_syncs": 0,
                         "producer_bindings_expired": 0, "producer_bindings_evicted": 0,
                         "producer_binding_rewrites": 0}

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # ------------------------------------------------------------ open / close
    def open(self) -> None:
        """Load the file (creating it empty if missing); blocking, at start."""
        entries = self._frames.load()
        for pid, kind, name, last_ms in entries:
            self._b[pid] = [kind, name, last_ms]
        now = self.now_ms()
        self._last_rewrite_ms = now
        self._oldest_ms = min((e[2] for e in self._b.values()), default=now)
        if self._b:
            log.info("%s: %d producer-ID bindings", self.path, len(self._b))

    def start(self) -> None:
        """The writer task (on the running loop)."""
        self._wake = asyncio.Event()
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    async def close(self) -> None:
        """Write what is pending, rewrite the file with the use times in memory, close it."""
        if self._writer is not None:
            self._closing = True
            self._wake.set()
            await self._writer
            self._writer = None
        if self._frames.file is not None:
            if self._failed is None:
                await self._io(self._rewrite, self._rows())
            self._frames.close()

    async def _io(self, fn: Callable, *args: Any) -> Any:
        if self._run_io is None:
            return fn(*args)
        return await self._run_io(fn, *args)

    # ------------------------------------------------------------ the rule
    def check(self, pid: int, principal: str, tid: str | None, transactional: bool,
              now_ms: int) -> tuple[Errors, str] | None:
        """None: ``principal`` (in a Produce naming ``tid``) may write a batch with ``pid``.  Else the
        answer for the batch's partition and why.  One dict lookup (and one store) per producer ID."""
        e = self._b.get(pid)
        if e is None:
            if transactional and tid is not None:
                return None  # the quorum verifies that the transactional id holds it (then ``learn``)
            return Errors.CLUSTER_AUTHORIZATION_FAILED, (
                f"producer id {pid} is bound to no principal on this broker, so not to {principal} (it was not "
                f"handed out here, or went unused too long and was forgotten): create a new producer")
        if e[0] == PRINCIPAL:
            if e[1] != principal:
                return Errors.CLUSTER_AUTHORIZATION_FAILED, f"producer id {pid} was not handed to {principal}"
        elif e[1] != tid:
            return Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, (
                f"producer id {pid} belongs to a transactional id this request does not name; {principal} may "
                f"not use it")
        e[2] = now_ms
        return None

    def owner(self, pid: int) -> tuple[int, str] | None:
        e = self._b.get(pid)
        return None if e is None else (e[0], e[1])

    # ------------------------------------------------------------ binding
    async def bind(self, pid: int, kind: int, name: str) -> None:
        """Bind ``pid`` to ``name``; returns once the binding is on stable storage (group commit)."""
        now = self.now_ms()
        e = self._b.get(pid)
        if e is not None and e[0] == kind and e[1] == name:
            e[2] = now  # the same binding again (an epoch bump of a transactional id): nothing to write
            return
        if self._failed is not None:
            raise self._failed
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(([pid, kind, name, now], fut))
        self._wake.set()
        await fut

    def learn(self, pid: int, tid: str) -> None:
        """Bind ``pid`` to transactional id ``tid`` now (the quorum said the id holds it), written soon."""
        entry = [pid, TRANSACTIONAL_ID, tid, self.now_ms()]
        self._apply(entry)
        self._pending.append((entry, None))
        if self._wake is not None:
            self._wake.set()

    def _apply(self, entry: list) -> None:
        pid, kind, name, last_ms = entry
        self._b[pid] = [kind, name, last_ms]
        if len(self._b) > self.max_bindings:
            self._evict()

    def _evict(self) -> None:
        """Forget the least recently used 1 % of the bindings at once (one pass per 1 % of a flood)."""
        n = max(1, int(self.max_bindings * EVICT_FRACTION))
        for _, pid in heapq.nsmallest(n, ((e[2], pid) for pid, e in self._b.items())):
            del self._b[pid]
        self.counters["producer_bindings_evicted"] += n
        log.warning("producer-ID bindings: more than %d (max_producers_per_partition): the %d least recently "
                    "used forgotten (their owners get CLUSTER_AUTHORIZATION_FAILED and must re-create their "
                    "producers)", self.max_bindings, n)

    # ------------------------------------------------------------ the writer
    async def _write_loop(self) -> None:
        """The only writer of the file: appends (group commit) and rewrites, one at a time."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._rewrite_wanted:
                self._rewrite_wanted = False
                await self._io(self._rewrite, self._rows())  # rows as of now; pending ones are appended after
            batch, self._pending = self._pending, []
            if batch:
                try:
                    await self._io(self._frames.append, [entry for entry, _ in batch])
                except Exception as e:  # only where failstop returns (tests): nothing is acknowledged any more
                    self._failed = e
                    for _, fut in batch + self._pending:
                        if fut is not None and not fut.done():
                            fut.set_exception(e)
                    return
                self.counters["producer_bindings_written"] += len(batch)
                self.counters["producer_binding_syncs"] += 1
                for entry, fut in batch:
                    if fut is not None:
                        self._apply(entry)
                        if not fut.done():
                            fut.set_result(None)
            if self._closing and not self._pending:
                return

    def _rows(self) -> list[list]:
        return [[pid, *e] for pid, e in self._b.items()]

    def _rewrite(self, rows: list[list]) -> None:
        self._frames.rewrite(rows)
        self.counters["producer_binding_rewrites"] += 1

    # ------------------------------------------------------------ maintenance
    async def maintain(self) -> None:
        """Forget bindings unused for ``lifetime_ms`` when any may be due (in chunks, the loop free in
        between); then have the writer rewrite the file if that is due (docs/producer-state.md)."""
        now = self.now_ms()
        if now - self._oldest_ms >= self.lifetime_ms:
            oldest, gone = now, 0
            items = list(self._b.items())
            for i in range(0, len(items), SCAN_CHUNK):
                for pid, e in items[i:i + SCAN_CHUNK]:
                    if now - e[2] >= self.lifetime_ms:
                        if self._b.get(pid) is e:
                            del self._b[pid]
                            gone += 1
                    else:
                        oldest = min(oldest, e[2])
                await asyncio.sleep(0)
            self._oldest_ms = oldest
            if gone:
                self.counters["producer_bindings_expired"] += gone
                log.info("producer-ID bindings: %d unused for %d ms forgotten; %d left", gone, self.lifetime_ms,
                         len(self._b))
        if self._wake is not None and (self._frames.entries > 2 * len(self._b) + REWRITE_SLACK
                                       or now - self._last_rewrite_ms >= self.lifetime_ms // 7):
            self._last_rewrite_ms = now
            self._rewrite_wanted = True  # by the writer, between two appends
            self._wake.set()

    def stats(self) -> dict[str, int]:
        return {"producer_bindings": len(self._b), **self.counters}
