"""The transaction coordinator (KIP-98) of one broker: the quorum decides each step of a transaction, this
broker writes the markers and completes what was decided (also after a crash: the sweeper).  Where the state
lives and why, each step and its late copy, timeouts, KIP-890: docs/transactions.md.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from quorum import failpoints
from quorum.client.quorum import QuorumClient
from records.wire.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    Errors,
    InvalidTxnStateError,
    PidQuorumError,
    StaleBrokerEpochError,
    UnknownTopicOrPartitionError,
    for_code,
)

from .groups.state import OFFSETS_TOPIC
from .storage import Storage

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
MAX_CACHED = 100_000  # transactions this broker remembers adding partitions to (KIP-890 checks without a round trip)
LIST_PAGE = 1000  # transactional ids per quorum read of ListTransactions
INIT_ATTEMPTS = 3
PENDING_LIMIT = 100
LOCK_STRIPES = 64
DESCRIBE_CONCURRENCY = 16  # quorum reads one ListTransactions has in flight
# The steps whose time the broker sums (``TxnCoordinator.step_times``; what each is: the help of the metric
# pidquorum_broker_txn_step_seconds, broker/metrics.py): where a transaction's time goes on the broker.
STEPS = ("add", "end", "verify", "complete", "wait")


@dataclass
class _Known:
    """What this broker last learnt from the quorum of a producer's transactions: which one is its
    current (``sequence``, TransactionStateRecord.sequence; -1 unknown), whether it is open, and the
    partitions of this broker in it.  Every step it sends names that transaction, so a step that reaches
    the quorum late (a retry on another node, a request a paused node forwards after it resumes) cannot
    land on the producer's next transaction."""
    transactional_id: str
    producer_epoch: int
    sequence: int
    open: bool
    partitions: set[tuple[str, int]] = field(default_factory=set)

    def order(self) -> tuple[int, int, int]:
        """Later knowledge of the same producer ID sorts higher: a later epoch, a later transaction, an ended
        one after the same one open (an answer that arrives late must not undo what a newer one taught)."""
        return self.producer_epoch, self.sequence, 0 if self.open else 1

    def names(self, op: str) -> int:
        """The sequence a step ``op`` sends: add joins the open transaction or begins the next one;
        commit and abort end the open one (or are a retry of the one that ended)."""
        if op == "add" and not self.open:
            return 0 if self.sequence < 0 else self.sequence + 1
        return self.sequence


class TxnCoordinator:
    def __init__(self, broker_id: int, quorum: QuorumClient, storage: Storage, run_io: Callable[..., Any],
                 broker_epoch: Callable[[], int | None], reregister: Callable[[], Any],
                 on_marker: Callable[[str, int], None] = lambda topic, partition: None,
                 offsets_marker: Callable[..., Awaitable[bool]] | None = None,
                 check_interval_s: float = CHECK_INTERVAL_S):
        self.broker_id = broker_id
        self.quorum = quorum
        self.storage = storage
        self._run_io = run_io  # awaitable call of a blocking function in an I/O thread
        self._broker_epoch = broker_epoch
        self._reregister = reregister
        self._on_marker = on_marker
        # The consumer groups' offsets shards ("__consumer_offsets"-<shard>, AddOffsetsToTxn): their marker
        # commits or drops the transaction's offsets (``GroupCoordinator.write_marker``).
        self._offsets_marker = offsets_marker
        self.check_interval_s = check_interval_s
        self._inits = 0  # InitProducerId calls so far (their request ids)
        self._known: OrderedDict[int, _Known] = OrderedDict()  # producer id -> its transactions, as last answered
        # Completions of one id run one at a time: striped locks (an id always maps to the same one).
        self._locks = [asyncio.Lock() for _ in range(LOCK_STRIPES)]
        self._completing: dict[str, asyncio.Task] = {}  # id -> the completion EndTxn left running
        self.counters = {"txn_committed": 0, "txn_aborted": 0, "txn_timed_out": 0, "txn_markers": 0,
                         "txn_completions_deferred": 0, "txn_verify_round_trips": 0, "txn_steps_refused": 0,
                         "txn_sequence_reads": 0, "txn_waits_for_completion": 0}
        self.step_times = {step: [0, 0.0] for step in STEPS}  # step -> [count, seconds]

    @contextlib.contextmanager
    def _timed(self, step: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            entry = self.step_times[step]
            entry[0] += 1
            entry[1] += time.perf_counter() - t0

    # ------------------------------------------------------------ quorum calls
    async def _txn(self, op: str, transactional_id: str = "", producer_id: int = -1, producer_epoch: int = -1,
                   partitions: list | None = None, start_time_ms: int = -1, sequence: int = -1) -> dict:
        for attempt in (1, 2):
            epoch = self._broker_epoch()
            if epoch is None:
                raise CoordinatorLoadInProgressError("broker is not registered with the quorum yet")
            try:
                return await self.quorum.txn(self.broker_id, epoch, op, transactional_id, producer_id,
                                             producer_epoch, partitions, start_time_ms, sequence)
            except StaleBrokerEpochError:
                if attempt == 2:
                    raise
                await self._reregister()
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------ client steps
    async def add_partitions(self, tid: str, pid: int, epoch: int, partitions: list[tuple[str, int]]) -> None:
        """AddPartitionsToTxn: the partitions join the producer's transaction (the next one begins if none is
        open)."""
        await self.settled(tid)
        with self._timed("add"):
            txn = await self._client_step("add", tid, pid, epoch, [[self.broker_id, t, p] for t, p in partitions])
        self._remember(pid, txn)

    async def _client_step(self, op: str, tid: str, pid: int, epoch: int, partitions: list | None = None) -> dict:
        """A client's step, naming the transaction this broker knows the producer to be in (or, knowing
        none, the id's current one).  When the quorum's transaction is another (this broker's knowledge is
        behind: the producer went on through another broker), the broker learns the quorum's and the
        client is told to retry (CONCURRENT_TRANSACTIONS): a client that is still there does, and its retry
        names the right transaction; a request that arrived here late has nobody to retry it."""
        known = self._known_of(tid, pid, epoch)
        if known is None:
            # Nothing known of this producer (a restart, the id moved here, an answer that was lost): read
            # the id's transaction first.  A step naming no transaction would be applied to whichever one
            # the id has when it arrives, and a copy of it may arrive late.
            self.counters["txn_sequence_reads"] += 1
            known = await self._learn(tid, pid) or _Known(tid, epoch, -1, False)
        if op in ("commit", "abort") and known.sequence < 0 and not known.open:
            raise InvalidTxnStateError(f"transactional id {tid[:200]!r} has no transaction to {op}")
        sequence = known.names(op)
        try:
            return await self._txn(op, tid, pid, epoch, partitions, sequence=sequence)
        except InvalidTxnStateError:
            if sequence == -1:
                raise
            current = await self._learn(tid, pid)
            if current is not None and current.names(op) == sequence:
                raise  # the transaction named is the current one: the step itself is not allowed
            self.counters["txn_steps_refused"] += 1
            raise ConcurrentTransactionsError(
                f"transactional id {tid[:200]!r}: this broker named transaction {sequence}, which is not the "
                f"producer's current one; retry") from None

    async def _learn(self, tid: str, pid: int) -> _Known | None:
        """Read the id's transaction through the leader and remember it (None: it has none)."""
        self._known.pop(pid, None)
        try:
            txn = await self._txn("describe", tid)
        except InvalidTxnStateError:
            return None
        self._remember(txn["producer_id"], txn)
        return self._known.get(txn["producer_id"])

    def _remember(self, pid: int, txn: dict) -> None:
        mine = {(t, p) for b, t, p in txn["partitions"] if b == self.broker_id}
        self._keep(pid, _Known(txn["transactional_id"], txn["producer_epoch"], int(txn.get("sequence", -1)),
                               txn["state"] == "Ongoing", mine))

    def _keep(self, pid: int, known: _Known) -> None:
        old = self._known.get(pid)
        if old is not None and old.transactional_id == known.transactional_id and old.order() > known.order():
            return  # an answer that arrived after a newer one
        self._known[pid] = known
        self._known.move_to_end(pid)
        while len(self._known) > MAX_CACHED:
            self._known.popitem(last=False)

    def _known_of(self, tid: str, pid: int, epoch: int) -> _Known | None:
        k = self._known.get(pid)
        return k if k is not None and k.transactional_id == tid and k.producer_epoch == epoch else None

    def _added(self, tid: str, pid: int, epoch: int, topic: str, partition: int) -> bool:
        k = self._known_of(tid, pid, epoch)
        return k is not None and k.open and (topic, partition) in k.partitions

    async def verify(self, tid: str, pid: int, epoch: int, topic: str, partition: int) -> None:
        """KIP-890 part 1: raises INVALID_TXN_STATE unless the partition is in the producer's ongoing
        transaction (PRODUCER_FENCED etc. for a producer that is not the id's current one)."""
        if self._added(tid, pid, epoch, topic, partition):
            return
        await self.settled(tid)
        self.counters["txn_verify_round_trips"] += 1
        with self._timed("verify"):
            txn = await self._txn("verify", tid, pid, epoch, [[self.broker_id, topic, partition]])
        self._remember(pid, txn)

    async def end(self, tid: str, pid: int, epoch: int, commit: bool) -> None:
        """EndTxn: answered once the outcome is decided in the quorum (PrepareCommit or PrepareAbort committed
        there, replicated and fsync'd on a majority); the markers and the completion follow, off the client's
        path, as Kafka's coordinator does (docs/transactions.md, "A transaction's end").

        The prepare is committed under the id's completion lock, and its answer (the transaction as the
        leader applied it) is what the markers are written from, by a task that takes the lock again: no
        re-read.  A completion of the id that gets the lock in between (the sweeper's, a retried EndTxn's)
        completes it first; this one's markers are then not written (``_still_current``) and its completion
        names a transaction already complete (a no-op in the quorum).  The id's next
        step on this broker (an add, a KIP-890 check, InitProducerId) waits for that completion first
        (``settled``): the quorum would refuse it until the transaction is complete."""
        await self.settled(tid)
        lock = self._lock_of(tid)
        async with lock:
            with self._timed("end"):
                txn = await self._client_step("commit" if commit else "abort", tid, pid, epoch)
            self._ended(txn)
            if txn["state"] in ("CompleteCommit", "CompleteAbort"):
                return  # a retry of an EndTxn that was completed
            task = asyncio.get_running_loop().create_task(self._finish(tid, txn, lock))
            self._completing[tid] = task
            task.add_done_callback(lambda t: self._completing.get(tid) is t and self._completing.pop(tid))

    async def _finish(self, tid: str, txn: dict, lock: asyncio.Lock) -> None:
        """The markers and the completion of ``txn``, which EndTxn has answered decided."""
        async with lock:
            try:
                with self._timed("complete"):
                    await self._complete_locked(tid, txn)
            except (PidQuorumError, OSError) as e:
                # Decided: the sweeper completes it.  The client's next step is answered
                # CONCURRENT_TRANSACTIONS until then (retriable).
                self.counters["txn_completions_deferred"] += 1
                log.warning("transaction of %r (producer %d) is %s; completing it later: %s", tid[:200],
                            txn["producer_id"], txn["state"], e)
            except Exception:  # noqa: BLE001 - a task nobody awaits: log; the sweeper completes it
                self.counters["txn_completions_deferred"] += 1
                log.exception("completing the transaction of %r failed; the sweeper completes it", tid[:200])

    async def settled(self, tid: str) -> None:
        """Wait for the completion of the id's last transaction that EndTxn answered, if it is still running."""
        task = self._completing.get(tid)
        if task is not None and not task.done():
            self.counters["txn_waits_for_completion"] += 1
            with self._timed("wait"):
                await asyncio.shield(task)

    async def init_producer_id(self, tid: str, timeout_ms: int, pid: int, epoch: int) -> tuple[int, int]:
        """InitProducerId for a transactional id: an open or prepared transaction of the id is completed
        first (aborted, fencing the producer that began it), then the epoch rules apply (the quorum's)."""
        self._inits += 1
        call = self._inits  # this call's number: another call may begin while this one waits
        await self.settled(tid)
        for attempt in range(INIT_ATTEMPTS):
            broker_epoch = self._broker_epoch()
            if broker_epoch is None:
                raise CoordinatorLoadInProgressError("broker is not registered with the quorum yet")
            # Unique in the cluster (a broker epoch is never handed out twice), the same in every copy of
            # this call: a copy the quorum applies twice is answered as it was, not bumped again.
            request_id = f"{self.broker_id}:{broker_epoch}:{call}"
            try:
                new_pid, new_epoch, last = await self.quorum.init_transactional_sequence(
                    self.broker_id, broker_epoch, tid, timeout_ms, pid, epoch, request_id)
                self._keep(new_pid, _Known(tid, new_epoch, last, False))  # its next transaction is last + 1
                return new_pid, new_epoch
            except StaleBrokerEpochError:
                await self._reregister()
            except ConcurrentTransactionsError:
                if attempt == INIT_ATTEMPTS - 1:
                    raise
                await self.complete(tid)
        raise ConcurrentTransactionsError(f"transactional id {tid[:200]!r}: its last transaction is being completed")

    # ------------------------------------------------------------ completion
    def _lock_of(self, tid: str) -> asyncio.Lock:
        return self._locks[zlib.crc32(tid.encode("utf-8", "surrogatepass")) % LOCK_STRIPES]

    async def complete(self, tid: str) -> None:
        """Write the markers of the id's prepared transaction to this broker's partitions and mark it
        complete.  Serialized per id; the state is read through the quorum leader under the lock."""
        async with self._lock_of(tid):
            try:
                txn = await self._txn("describe", tid)
            except InvalidTxnStateError:
                return  # no transaction (the id expired)
            await self._complete_locked(tid, txn)

    async def _complete_locked(self, tid: str, txn: dict) -> None:
        """Complete ``txn``, the id's transaction as the leader last answered it, under the id's lock."""
        if txn["state"] not in ("PrepareCommit", "PrepareAbort"):
            return
        pid, epoch, commit = txn["producer_id"], txn["producer_epoch"], txn["state"] == "PrepareCommit"
        elsewhere = sorted({b for b, _, _ in txn["partitions"]} - {self.broker_id})
        if elsewhere:
            raise ConcurrentTransactionsError(f"partitions on broker(s) {elsewhere}: their markers are "
                                              f"written there")
        self._ended(txn)  # before any marker: a KIP-890 check must ask the quorum again
        failpoints.hit("broker.txn.prepared", tid, txn["state"])
        # The partitions' markers at once (each fsync'd by its own partition; independent of each other).
        results = await asyncio.gather(*(self._write_marker(topic, partition, pid, epoch, commit,
                                                            self._still_current(txn))
                                         for _, topic, partition in txn["partitions"]), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r  # not complete: the sweeper writes what is missing (a marker written twice is a no-op)
        await self._txn("complete", tid, start_time_ms=txn["start_time_ms"], sequence=txn.get("sequence", -1))
        self.counters["txn_committed" if commit else "txn_aborted"] += 1
        log.debug("transaction of %r (producer %d epoch %d, %d partitions): %s", tid[:200], pid, epoch,
                  len(txn["partitions"]), "committed" if commit else "aborted")

    def _ended(self, txn: dict) -> None:
        """``txn`` is decided (prepared or complete): its producer's next add begins the next transaction."""
        self._keep(txn["producer_id"], _Known(txn["transactional_id"], txn["producer_epoch"],
                                              int(txn.get("sequence", -1)), False))

    def _still_current(self, txn: dict) -> Callable[[], bool]:
        """Whether ``txn`` may still be its producer's transaction, from what this broker knows (asked under
        a partition's lock, right before its marker).  A completion works from an answer that may be late:
        seed 513877 of the transaction simulation read a transaction as prepared, a late copy of an earlier
        completion then completed it, the producer's next transaction began on the same partitions, and the
        markers written from the read ended that one.  Every transactional append on this broker's
        partitions is preceded by this broker learning its transaction (the add's answer, or the KIP-890
        check's), so a later transaction is known here before any of its records can be."""
        tid, pid, ended = txn["transactional_id"], txn["producer_id"], (txn["producer_epoch"],
                                                                         int(txn.get("sequence", -1)), 1)

        def check() -> bool:
            k = self._known.get(pid)
            return k is None or k.transactional_id != tid or k.order() <= ended
        return check

    async def _write_marker(self, topic: str, partition: int, pid: int, epoch: int, commit: bool,
                            still_current: Callable[[], bool] | None = None) -> None:
        if topic == OFFSETS_TOPIC and self._offsets_marker is not None:
            if await self._offsets_marker(partition, pid, epoch, commit, still_current):
                self.counters["txn_markers"] += 1
            return
        try:
            part = self.storage.partition(topic, partition) if self.storage.topic(topic) is not None else None
        except UnknownTopicOrPartitionError:
            part = None
        if part is None:
            log.warning("marker for %s-%d (producer %d): no such partition here; nothing to mark", topic[:200],
                        partition, pid)
            return
        res = await self._run_io(functools.partial(part.write_marker, pid, epoch, commit,
                                                   still_current=still_current))
        if res.error == Errors.INVALID_PRODUCER_EPOCH:
            # The partition has seen a newer epoch of the producer, which only exists once this transaction
            # ended: nothing of it is left open there.
            log.warning("marker for %s-%d: %s (treated as written)", topic[:200], partition, res.message)
        elif res.error != Errors.NONE:
            raise OSError(f"marker for {topic[:200]}-{partition}: {res.error.name}: {res.message}")
        elif not res.duplicate:
            self.counters["txn_markers"] += 1
        self._on_marker(topic, partition)

    # ------------------------------------------------------------ operators' reads
    async def describe(self, tid: str) -> dict | None:
        """The id's transaction as the quorum leader has it (``txn_json``'s dict: state, producer, partitions
        as [broker, topic, partition], start_time_ms, timeout_ms); None for an id the quorum does not know.
        An id whose producer was initialized again since its last transaction ended (a new epoch, no
        transaction begun yet) is Empty with the new producer, as in Kafka."""
        try:
            txn = await self._txn("describe", tid)
        except InvalidTxnStateError:  # no transaction: the id may still have a producer
            txn = None
        if txn is None or txn["state"] in ("CompleteCommit", "CompleteAbort"):
            pid, epoch = await self.quorum.describe_transactional(tid)
            if pid < 0:
                return None
            if txn is None or (txn["producer_id"], txn["producer_epoch"]) != (pid, epoch):
                txn = {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "state": "Empty",
                       "partitions": [], "start_time_ms": -1, "timeout_ms": -1 if txn is None else txn["timeout_ms"]}
        return txn

    async def list_transactions(self, wanted: Callable[[str], bool] = lambda tid: True) -> list[dict]:
        """Every transactional id the quorum knows that ``wanted`` keeps, in id order, with its transaction
        (``describe``'s dict; Empty for an id with none since its producer was initialized), read a page at a
        time from one quorum node's applied state (which may lag the leader by the entries it has not
        applied yet).  A page that cannot be read raises: a partial listing would look complete."""
        out: list[dict] = []
        after = ""
        while True:
            page = await self.quorum.list_transactions(self.broker_id, after, LIST_PAGE)
            if not page:
                return out
            if page[0]["transactional_id"] <= after:  # a page that does not move on would never end
                raise for_code(Errors.COORDINATOR_NOT_AVAILABLE, f"the quorum listed "
                               f"{page[0]['transactional_id'][:200]!r} after {after[:200]!r}")
            out += [t for t in page if wanted(t["transactional_id"])]
            after = page[-1]["transactional_id"]

    async def describe_each(self, tids: list[str]) -> list[dict | None | PidQuorumError]:
        """``describe`` of each of ``tids``, a few quorum reads at a time, in their order; a read that
        failed is its PidQuorumError in the list."""
        limit = asyncio.Semaphore(DESCRIBE_CONCURRENCY)

        async def one(tid: str) -> dict | None | PidQuorumError:
            async with limit:
                try:
                    return await self.describe(tid)
                except PidQuorumError as e:
                    return e
        return list(await asyncio.gather(*(one(t) for t in tids)))

    # ------------------------------------------------------------ the sweeper
    async def run(self) -> None:
        """Every ``check_interval_s``: complete prepared transactions and abort those past their timeout."""
        while True:
            await asyncio.sleep(self.check_interval_s)
            try:
                await self.sweep()
            except PidQuorumError as e:
                log.info("transaction sweep: %s", e)
            except Exception:  # noqa: BLE001 - keep sweeping
                log.exception("transaction sweep failed")

    async def sweep(self) -> int:
        """One pass; how many transactions it completed or aborted."""
        done = 0
        for txn in await self.quorum.pending_transactions(self.broker_id, PENDING_LIMIT):
            if not any(b == self.broker_id for b, _, _ in txn["partitions"]):
                continue  # its partitions are another broker's: that broker completes it
            tid = txn["transactional_id"]
            try:
                if txn["state"] == "Ongoing":
                    await self._txn("timeout", tid, start_time_ms=txn["start_time_ms"],
                                    sequence=txn.get("sequence", -1))
                    self.counters["txn_timed_out"] += 1
                    log.info("transaction of %r (producer %d epoch %d) ran past its timeout of %d ms: aborting",
                             tid[:200], txn["producer_id"], txn["producer_epoch"], txn["timeout_ms"])
                await self.complete(tid)
                done += 1
            except (PidQuorumError, OSError) as e:
                log.info("transaction of %r: %s", tid[:200], e)
        return done
