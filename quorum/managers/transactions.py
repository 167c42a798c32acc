"""Transactional ids and their transactions: InitProducerId with KIP-360 epochs, and each transaction's steps."""
from __future__ import annotations

import bisect
import collections
import copy
import dataclasses
import heapq
import itertools
import json
from typing import Any

from records import (
    Record,
    RemoveTransactionalIdRecord,
    TransactionalIdRecord,
    TransactionStateRecord,
)
from records.schema import LONG_MAX
from records.wire.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    InvariantViolation,
    ProducerFencedError,
)

from .base import INT32_MAX, Result, TxnSettings, _check_broker_id
from .cursor import ProducerIdsManager
from .registrations import BrokerRegistrationManager


NO_PRODUCER_ID = -1
NO_EPOCH = -1
# An epoch at or above this is exhausted: the next bump rotates to a new producer
# ID.  Short.MAX (32767) itself is never handed out; it is kept back for fencing.
EPOCH_EXHAUSTED = 2**15 - 2
MAX_TRANSACTIONAL_ID_CHARS = 32767                 # a Kafka string
EXPIRE_PER_BATCH = 64                              # expired ids removed per InitProducerId
EXPIRE_LOOK = 4 * EXPIRE_PER_BATCH                 # idle ids one InitProducerId looks at, at most
MAX_REQUEST_ID_CHARS = 100                         # InitTransactionalProducerRequest.request_id
LIST_PAGE_CHARS = 1 << 20                          # list_page: about this much JSON per page at most
LIST_ROW_CHARS = 300                               # a listed transaction's JSON besides its id and partitions


class TransactionalIdManager:
    """InitProducerId for transactional ids, with KIP-360's epoch rules, as replicated state.

    The whole decision is made in ``generate_init`` against committed state and
    committed as one entry, so a retried or concurrent request on another broker
    (or after a coordinator failover) sees every earlier bump: an epoch is never
    lost or handed out twice.  A new producer ID is a one-ID block taken from
    the producer-ID cursor in the same entry.

    Entries are frozen records; ``fork`` overlays a ChainMap so the proposer's
    scratch copy costs nothing however many ids exist (a removed id is a
    ``None`` in the overlay).
    """

    def __init__(self, entries: dict[str, TransactionalIdRecord | None] | None = None,
                 txns: dict[str, TransactionStateRecord | None] | None = None) -> None:
        self.entries: Any = entries if entries is not None else {}
        self.txns: Any = txns if txns is not None else {}  # the current transaction of each id, if it had one
        # The live ids in order, for ``list_page``: built at its first call, then kept by replay (an id added
        # or removed), so a page costs a bisection and not a sort of every id.  Derived, never snapshotted.
        self._order: list[str] | None = None
        # The ids by their last update, oldest first, for ``_expired``: a heap of (update_time_ms, id), built
        # at its first use and then kept by replay.  An entry whose id has been updated or removed since is
        # stale and is skipped (and dropped once it is on top).  A fork reads its base's and leaves it alone:
        # the ids a fork adds or updates are not idle.  Derived, never snapshotted.
        self._idle: list[tuple[int, str]] | None = None
        self._idle_shared = False
        # The ids whose transaction is open (Ongoing, PrepareCommit, PrepareAbort), in the order they opened,
        # for ``pending`` (each broker's sweeper asks every second): built at its first use, then kept by
        # replay, so a sweep costs the open transactions and not every id that ever had one.  Derived.
        self._open: dict[str, None] | None = None

    def get(self, transactional_id: str) -> TransactionalIdRecord | None:
        return self.entries.get(transactional_id)

    def txn(self, transactional_id: str) -> TransactionStateRecord | None:
        return self.txns.get(transactional_id)

    def __len__(self) -> int:
        return sum(1 for v in self.entries.values() if v is not None)

    def fork(self) -> "TransactionalIdManager":
        out = TransactionalIdManager(collections.ChainMap({}, self.entries), collections.ChainMap({}, self.txns))
        out._idle, out._idle_shared = self._idle_heap(), True
        return out

    def _idle_heap(self) -> list[tuple[int, str]]:
        if self._idle is None:
            self._idle = [(rec.update_time_ms, tid) for tid, rec in self.entries.items() if rec is not None]
            heapq.heapify(self._idle)
        return self._idle

    def _note_update(self, rec: TransactionalIdRecord | None, tid: str) -> None:
        """Keep the idle heap (of this manager, not a fork's base) after ``tid`` became ``rec``."""
        if self._idle is None or self._idle_shared:
            return
        if rec is not None:
            heapq.heappush(self._idle, (rec.update_time_ms, tid))
        heap = self._idle
        while heap and self._stale(heap[0]):
            heapq.heappop(heap)
        if len(heap) > 2 * len(self.entries) + 1024:  # stale entries deeper down: rebuild
            self._idle = None
            self._idle_heap()

    def _stale(self, item: tuple[int, str]) -> bool:
        rec = self.entries.get(item[1])
        return rec is None or rec.update_time_ms != item[0]

    def live(self) -> dict[str, TransactionalIdRecord]:
        return {k: v for k, v in self.entries.items() if v is not None}

    def live_txns(self) -> dict[str, TransactionStateRecord]:
        return {k: v for k, v in self.txns.items() if v is not None}

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TransactionalIdManager) and self.live() == other.live()
                and self.live_txns() == other.live_txns())

    # -- generate ----------------------------------------------------------
    def generate_init(self, broker_id: int, broker_epoch: int, transactional_id: str, timeout_ms: int,
                      expected_pid: int, expected_epoch: int, *, registrations: BrokerRegistrationManager,
                      producer_ids: ProducerIdsManager, now_ms: int, settings: TxnSettings = TxnSettings(),
                      request_id: str = "") -> Result:
        """Response: (producer_id, producer_epoch, pending): ``pending`` is a transaction of the id to complete
        first (prepared, or open and now aborted to fence its producer: its markers, then ``complete``, then
        ask again), else None.  Errors: PRODUCER_FENCED (the broker maps it to
        INVALID_PRODUCER_EPOCH for InitProducerId < v4), INVALID_TRANSACTION_TIMEOUT, INVALID_REQUEST."""
        _check_broker_id(broker_id)
        registrations.check_epoch(broker_id, broker_epoch)
        if not isinstance(transactional_id, str) or not 0 < len(transactional_id) <= MAX_TRANSACTIONAL_ID_CHARS:
            raise InvalidRequestError("transactional id must be a non-empty string")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not 0 < timeout_ms <= settings.max_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction timeout {timeout_ms!r} ms is not in 1..{settings.max_timeout_ms} "
                "(transaction.max.timeout.ms)")
        for name, v, lo, hi in (("producer id", expected_pid, -1, LONG_MAX), ("producer epoch", expected_epoch, -1, 2**15 - 1)):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise InvalidRequestError(f"{name} {v!r} is not in {lo}..{hi}")
        if (expected_pid == NO_PRODUCER_ID) != (expected_epoch == NO_EPOCH):
            raise InvalidRequestError("producer id and epoch must both be -1 or both be set")
        if not isinstance(request_id, str) or len(request_id) > MAX_REQUEST_ID_CHARS:
            raise InvalidRequestError(f"request id must be a string of at most {MAX_REQUEST_ID_CHARS} characters")
        # The request as the state records it: its id with the producer it expected, so that another
        # request that reuses an id (a coordinator's bug) is not taken for a copy of this one.
        request = f"{request_id}/{expected_pid}/{expected_epoch}" if request_id else ""
        repeated = self.get(transactional_id)
        if request and repeated is not None and repeated.init_request == request:
            # This request was applied and the id's state is still its answer: a copy of it (a retry on
            # another node, a request a paused node forwarded late) gets that answer again.  Bumping
            # again would fence the producer it answered, and abort the transaction it has begun since.
            return Result([], (repeated.producer_id, repeated.producer_epoch, None))

        records: list[Record] = self._expired(now_ms, settings, keep=transactional_id)
        cur = self.get(transactional_id)
        if cur is not None and now_ms - cur.update_time_ms > settings.expiration_ms:
            # Idle past transactional.id.expiration.ms: forgotten, as if never seen.
            records.append(RemoveTransactionalIdRecord(transactional_id=transactional_id,
                                                       producer_id=cur.producer_id, timestamp_ms=now_ms))
            cur = None

        def new_pid() -> int:
            scratch = copy.deepcopy(producer_ids)
            alloc = scratch.generate_allocate(broker_id, broker_epoch, registrations, 1, now_ms)
            records.extend(alloc.records)
            return alloc.response[0]

        def state(pid: int, epoch: int, last_pid: int, last_epoch: int) -> Result:
            records.append(TransactionalIdRecord(
                transactional_id=transactional_id, producer_id=pid, producer_epoch=epoch,
                last_producer_id=last_pid, last_producer_epoch=last_epoch, timeout_ms=timeout_ms,
                state="Empty", update_time_ms=now_ms, broker_id=broker_id, init_request=request))
            return Result(records, (pid, epoch, None))

        if cur is None:
            # No mapping (new, or expired): a fresh producer ID, whatever the client expected.
            return state(new_pid(), 0, NO_PRODUCER_ID, NO_EPOCH)
        txn = self.txn(transactional_id)
        if txn is not None and txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
            # A decided transaction is completed before anything else (its markers, then Complete*).
            return Result(records, (cur.producer_id, cur.producer_epoch, txn))
        if expected_pid != NO_PRODUCER_ID:
            if (expected_pid, expected_epoch) == (cur.last_producer_id, cur.last_producer_epoch):
                # A retry of the bump that produced the current state: answer it again, bump nothing.
                return Result(records, (cur.producer_id, cur.producer_epoch, None))
            if (expected_pid, expected_epoch) != (cur.producer_id, cur.producer_epoch):
                raise ProducerFencedError(
                    f"transactional id {transactional_id!r}: producer {expected_pid} epoch {expected_epoch} "
                    f"is not the current producer {cur.producer_id} epoch {cur.producer_epoch}")
        # A new instance (no expectation) or the current one asking for a bump: fence the older one.
        # Only a bump the current instance asked for remembers the epoch it replaced: a new
        # instance's bump must not be claimable as "my retry" by the instance it fenced.
        last_epoch = expected_epoch if expected_pid != NO_PRODUCER_ID else NO_EPOCH
        if txn is not None and txn.state == ONGOING:
            # Kafka's rule: an open transaction is aborted first, with the epoch bumped so its markers fence
            # the instance that began it; the coordinator completes the abort and asks again (the second
            # ask bumps once more for a new instance, or is the retry of this bump for the current one).
            aborted = self._abort_with_bump(cur, txn, last_epoch, broker_id, now_ms, records)
            return Result(records, (aborted.producer_id, aborted.producer_epoch, aborted))
        if cur.producer_epoch >= EPOCH_EXHAUSTED:
            return state(new_pid(), 0, cur.producer_id, last_epoch)
        return state(cur.producer_id, cur.producer_epoch + 1, cur.producer_id, last_epoch)

    def last_sequence(self, transactional_id: str, records: list[Record]) -> int:
        """The sequence of the id's last transaction once ``records`` (an InitProducerId's answered
        without a pending transaction) are applied: -1 if it has had none, or was forgotten in them."""
        if any(isinstance(r, RemoveTransactionalIdRecord) and r.transactional_id == transactional_id
               for r in records):
            return -1
        txn = self.txn(transactional_id)
        return -1 if txn is None else txn.sequence

    def _abort_with_bump(self, cur: TransactionalIdRecord, txn: TransactionStateRecord, last_epoch: int,
                         broker_id: int, now_ms: int, records: list[Record]) -> TransactionStateRecord:
        """PrepareAbort of ``txn`` with the epoch bumped (its markers fence the epoch that began it); at an
        exhausted epoch the markers keep it (KIP-890 part 1 still keeps late batches out)."""
        epoch = cur.producer_epoch
        if epoch < EPOCH_EXHAUSTED:
            epoch += 1
            records.append(dataclasses.replace(cur, producer_epoch=epoch, last_producer_id=cur.producer_id,
                                               last_producer_epoch=last_epoch, update_time_ms=now_ms,
                                               broker_id=broker_id, init_request=""))
        aborted = dataclasses.replace(txn, producer_epoch=epoch, state=PREPARE_ABORT, update_time_ms=now_ms,
                                      broker_id=broker_id)
        records.append(aborted)
        return aborted

    # -- transactions ------------------------------------------------------
    def generate_txn(self, op: str, broker_id: int, broker_epoch: int, transactional_id: str, producer_id: int,
                     producer_epoch: int, partitions: list, start_time_ms: int, *,
                     registrations: BrokerRegistrationManager, now_ms: int, sequence: int = -1) -> Result:
        """One step of a transaction (``TransactionRequest``); the response is the transaction after it.

        Every step names the transaction it is for (``sequence``, the transaction's number among the
        id's: see ``_check_sequence``): a step that arrives late or twice, after the producer moved on
        to its next transaction, is refused (INVALID_TXN_STATE) or answered as it was, never applied to
        another transaction.  -1 names the id's current transaction, whichever it is.

        Client steps (add, verify, commit, abort) need the id's current producer ID and epoch:
        INVALID_PRODUCER_ID_MAPPING for another producer ID (or none), PRODUCER_FENCED for an older
        epoch, except the abort of a transaction the coordinator already aborted on timeout, from the
        epoch that transaction had (answered as done: the client aborts, then bumps with KIP-360), and
        INVALID_PRODUCER_EPOCH for its other steps (abortable, not fatal).  Coordinator steps
        (complete, timeout) do nothing to another transaction than the one they name (by sequence, or
        by start time for a coordinator that sends none)."""
        _check_broker_id(broker_id)
        registrations.check_epoch(broker_id, broker_epoch)
        if isinstance(sequence, bool) or not isinstance(sequence, int) or not -1 <= sequence <= LONG_MAX:
            raise InvalidRequestError(f"transaction sequence {sequence!r} is not in -1..{LONG_MAX}")
        cur = self.get(transactional_id)
        txn = self.txn(transactional_id)
        if op in (COMPLETE, TIMEOUT):
            return self._coordinator_step(op, cur, txn, start_time_ms, broker_id, now_ms, sequence)
        if op == DESCRIBE:
            if txn is None:
                raise InvalidTxnStateError(f"transactional id {transactional_id!r} has no transaction")
            return Result([], txn)
        if op not in (ADD, VERIFY, COMMIT, ABORT):
            raise InvalidRequestError(f"unknown transaction operation {op!r}")
        if cur is None or cur.producer_id != producer_id:
            raise InvalidProducerIdMappingError(
                f"transactional id {transactional_id!r} has no producer {producer_id} (it expired, or another "
                f"instance took it over with a new producer ID)")
        if producer_epoch != cur.producer_epoch:
            timed_out = (txn is not None and txn.state in (PREPARE_ABORT, COMPLETE_ABORT)
                         and (cur.last_producer_id, cur.last_producer_epoch) == (producer_id, producer_epoch)
                         and sequence in (-1, txn.sequence))
            if timed_out and op == ABORT:
                return Result([], txn)
            if timed_out:
                # Not PRODUCER_FENCED (fatal to the client): the clients abort on this one and bump their
                # epoch with InitProducerId (KIP-360), which answers this producer the epoch of the abort.
                raise InvalidProducerIdMappingError(
                    f"transactional id {transactional_id!r}: the transaction of epoch {producer_epoch} was aborted "
                    f"by the coordinator (past transaction.timeout.ms); abort, then InitProducerId")
            raise ProducerFencedError(
                f"transactional id {transactional_id!r}: producer {producer_id} epoch {producer_epoch} was fenced "
                f"by epoch {cur.producer_epoch}")
        state = txn.state if txn is not None else EMPTY
        self._check_sequence(op, transactional_id, txn, sequence)
        if op in (ADD, VERIFY):
            wanted = _partitions(partitions)
            if state in (PREPARE_COMMIT, PREPARE_ABORT):
                raise ConcurrentTransactionsError(f"transactional id {transactional_id!r}: the last transaction "
                                                  f"is still being completed ({state})")
            have = set(map(tuple, json.loads(txn.partitions))) if state == ONGOING else set()
            if op == VERIFY:
                missing = wanted - have
                if missing:
                    raise InvalidTxnStateError(
                        f"transactional id {transactional_id!r}: {_names(missing)} not added to an ongoing "
                        f"transaction (KIP-890)")
                return Result([], txn)
            if state == ONGOING and wanted <= have:
                return Result([], txn)
            if len(have | wanted) > MAX_TXN_PARTITIONS:
                raise InvalidRequestError(f"a transaction may hold at most {MAX_TXN_PARTITIONS} partitions")
            new = TransactionStateRecord(
                transactional_id=transactional_id, producer_id=cur.producer_id, producer_epoch=cur.producer_epoch,
                state=ONGOING, partitions=_dump_partitions(have | wanted),
                start_time_ms=txn.start_time_ms if state == ONGOING else now_ms, update_time_ms=now_ms,
                broker_id=broker_id, sequence=txn.sequence if state == ONGOING else _next_sequence(txn))
            return Result([new], new)
        prepare, complete = (PREPARE_COMMIT, COMPLETE_COMMIT) if op == COMMIT else (PREPARE_ABORT, COMPLETE_ABORT)
        if state == ONGOING:
            new = dataclasses.replace(txn, state=prepare, update_time_ms=now_ms, broker_id=broker_id)
            return Result([new], new)
        if state in (prepare, complete):
            return Result([], txn)  # a retry: answered once the markers are written
        raise InvalidTxnStateError(f"transactional id {transactional_id!r}: cannot {op} in state {state}")

    @staticmethod
    def _check_sequence(op: str, transactional_id: str, txn: TransactionStateRecord | None, sequence: int) -> None:
        """A client step names its transaction: add the open one (or the next one, which it begins),
        verify / commit / abort the one they check or end.  Anything else is a step that arrived late
        or twice, after its transaction ended (or before it began, which no coordinator can send):
        refused, so that it never lands on the producer's next transaction."""
        if sequence == -1:
            return  # the current transaction, whichever it is
        current = txn.sequence if txn is not None else -1
        state = txn.state if txn is not None else EMPTY
        if op == ADD:
            ok = (state == ONGOING and sequence == current) or (
                state != ONGOING and sequence == _next_sequence(txn))
        elif op == VERIFY:
            ok = state == ONGOING and sequence == current
        else:  # commit, abort: a retry of an ended one is answered as it ended
            ok = txn is not None and sequence == current
        if not ok:
            raise InvalidTxnStateError(
                f"transactional id {transactional_id!r}: {op} is for transaction {sequence}, and the id's "
                f"transaction is {current} ({state}): a step that arrived after its transaction ended is refused")

    def _coordinator_step(self, op: str, cur: TransactionalIdRecord | None, txn: TransactionStateRecord | None,
                          start_time_ms: int, broker_id: int, now_ms: int, sequence: int = -1) -> Result:
        if sequence != -1:
            if txn is None or cur is None or txn.sequence != sequence:
                raise InvalidTxnStateError(f"no transaction {sequence} (it ended or another began)")
        elif txn is None or cur is None or txn.start_time_ms != start_time_ms:
            raise InvalidTxnStateError(f"no transaction started at {start_time_ms} (it ended or another began)")
        if op == COMPLETE:
            if txn.state in (COMPLETE_COMMIT, COMPLETE_ABORT):
                return Result([], txn)
            if txn.state not in (PREPARE_COMMIT, PREPARE_ABORT):
                raise InvalidTxnStateError(f"transaction in state {txn.state} is not prepared")
            done = dataclasses.replace(txn, state=COMPLETE_COMMIT if txn.state == PREPARE_COMMIT else COMPLETE_ABORT,
                                       update_time_ms=now_ms, broker_id=broker_id)
            return Result([done], done)
        if txn.state != ONGOING:
            return Result([], txn)  # decided already: drive it as it is
        if now_ms - txn.start_time_ms <= cur.timeout_ms:
            raise InvalidTxnStateError(f"the transaction has run {now_ms - txn.start_time_ms} ms, not past its "
                                       f"timeout of {cur.timeout_ms} ms")
        # The producer may come back: it may abort from the epoch it had and bump from it (KIP-360).
        records: list[Record] = []
        aborted = self._abort_with_bump(cur, txn, cur.producer_epoch, broker_id, now_ms, records)
        return Result(records, aborted)

    def pending(self, now_ms: int, limit: int) -> list[dict]:
        """The transactions some coordinator must drive: prepared ones, and open ones past their timeout."""
        if self._open is None:
            self._open = {tid: None for tid, txn in self.txns.items() if txn is not None and txn.state in _OPEN}
        out = []
        for tid in self._open:
            if len(out) >= limit:
                break
            txn, cur = self.txn(tid), self.get(tid)
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT) or (
                    txn.state == ONGOING and cur is not None and now_ms - txn.start_time_ms > cur.timeout_ms):
                out.append(txn_json(txn, cur))
        return out

    def list_page(self, after: str, limit: int, max_chars: int = LIST_PAGE_CHARS) -> list[dict]:
        """Every live transactional id after ``after``, in id order, with its transaction (``txn_json``): at
        most ``limit`` of them, and no more once about ``max_chars`` of JSON are listed (at least one), so a
        page is bounded however many ids there are and however many partitions their transactions hold.

        An id without a transaction, or whose producer was initialized again since its last transaction
        ended (a new epoch, none begun yet), is ``Empty`` with its current producer, as in Kafka."""
        if self._order is None:
            self._order = sorted(self.live())
        out: list[dict] = []
        size = 0
        for tid in itertools.islice(self._order, bisect.bisect_right(self._order, after), None):
            if len(out) >= limit or (out and size >= max_chars):
                break
            cur = self.entries[tid]
            txn = self.txn(tid)
            if txn is not None and (txn.state not in (COMPLETE_COMMIT, COMPLETE_ABORT)
                                    or (txn.producer_id, txn.producer_epoch) == (cur.producer_id, cur.producer_epoch)):
                row = txn_json(txn, cur)
            else:
                row = txn_json(TransactionStateRecord(
                    transactional_id=tid, producer_id=cur.producer_id, producer_epoch=cur.producer_epoch, state=EMPTY,
                    partitions="[]", start_time_ms=-1, update_time_ms=cur.update_time_ms, broker_id=cur.broker_id,
                    sequence=txn.sequence if txn is not None else -1), cur)
            out.append(row)
            size += len(tid) + (len(txn.partitions) if txn is not None else 0) + LIST_ROW_CHARS
        return out

    def _expired(self, now_ms: int, settings: TxnSettings, keep: str) -> list[Record]:
        """Removal records for up to EXPIRE_PER_BATCH other ids idle past expiration, oldest first; at most
        EXPIRE_LOOK ids are looked at (those with an open transaction are kept, as in Kafka), so one
        InitProducerId costs the same however many ids exist."""
        out: list[Record] = []
        heap, cutoff = self._idle_heap(), now_ms - settings.expiration_ms
        # The heap's smallest entries in order without popping (a fork must not change its base's heap):
        # a best-first walk of the heap's tree.
        todo = [(heap[0], 0)] if heap else []
        looked, seen = 0, set()  # an id may be in the heap twice with the same time
        while todo and len(out) < EXPIRE_PER_BATCH and looked < EXPIRE_LOOK:
            (t, tid), i = heapq.heappop(todo)
            if t >= cutoff:
                break
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(todo, (heap[child], child))
            if tid in seen or self._stale((t, tid)):
                continue
            seen.add(tid)
            looked += 1
            txn = self.txn(tid)
            if txn is not None and txn.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT):
                continue  # an open transaction keeps its id, as in Kafka
            if tid != keep:
                out.append(RemoveTransactionalIdRecord(transactional_id=tid, producer_id=self.entries[tid].producer_id,
                                                       timestamp_ms=now_ms))
        return out

    # -- replay --------------------------------------------------------------
    def replay(self, rec: Record, next_producer_id: int) -> None:
        if isinstance(rec, TransactionalIdRecord):
            if not 0 <= rec.producer_id < next_producer_id:
                raise InvariantViolation(
                    f"transactional id {rec.transactional_id!r}: producer ID {rec.producer_id} was never allocated "
                    f"(next producer ID {next_producer_id})")
            if not 0 <= rec.producer_epoch <= EPOCH_EXHAUSTED:
                raise InvariantViolation(f"producer epoch {rec.producer_epoch} is not in 0..{EPOCH_EXHAUSTED}")
            cur = self.get(rec.transactional_id)
            if cur is not None and (rec.producer_id, rec.producer_epoch) <= (cur.producer_id, cur.producer_epoch):
                raise InvariantViolation(
                    f"transactional id {rec.transactional_id!r}: producer {rec.producer_id} epoch "
                    f"{rec.producer_epoch} does not move past producer {cur.producer_id} epoch {cur.producer_epoch}")
            self.entries[rec.transactional_id] = rec
            self._note_update(rec, rec.transactional_id)
            if cur is None and self._order is not None:
                bisect.insort(self._order, rec.transactional_id)
        elif isinstance(rec, RemoveTransactionalIdRecord):
            cur = self.get(rec.transactional_id)
            if cur is None or cur.producer_id != rec.producer_id:
                raise InvariantViolation(
                    f"transactional id {rec.transactional_id!r} with producer {rec.producer_id} is not known")
            for table in (self.entries, self.txns):
                if isinstance(table, collections.ChainMap):
                    table[rec.transactional_id] = None
                else:
                    table.pop(rec.transactional_id, None)
            self._note_update(None, rec.transactional_id)
            self._note_open(rec.transactional_id, False)
            if self._order is not None:
                del self._order[bisect.bisect_left(self._order, rec.transactional_id)]
        elif isinstance(rec, TransactionStateRecord):
            self._replay_txn(rec)
        else:  # pragma: no cover - dispatch bug
            raise TypeError(f"not a transactional-id record: {rec!r}")

    def _replay_txn(self, rec: TransactionStateRecord) -> None:
        tid = rec.transactional_id
        cur = self.get(tid)
        # A snapshot holds the id's current mapping and its last transaction: a completed one may be of an
        # earlier epoch (InitProducerId bumped the epoch after it ended; live, that record came after it).
        earlier_completed = (self.txn(tid) is None and cur is not None
                             and rec.state in (COMPLETE_COMMIT, COMPLETE_ABORT)
                             and (rec.producer_id, rec.producer_epoch) < (cur.producer_id, cur.producer_epoch))
        if not earlier_completed and (
                cur is None or (cur.producer_id, cur.producer_epoch) != (rec.producer_id, rec.producer_epoch)):
            raise InvariantViolation(f"transactional id {tid!r}: a transaction of producer {rec.producer_id} epoch "
                                     f"{rec.producer_epoch} is not of its current producer")
        if rec.state not in _NEXT:
            raise InvariantViolation(f"transactional id {tid!r}: unknown transaction state {rec.state!r}")
        try:
            parts = _partitions(json.loads(rec.partitions))
        except (ValueError, InvalidRequestError) as e:
            raise InvariantViolation(f"transactional id {tid!r}: bad partitions: {e}") from None
        if not parts or len(parts) > MAX_TXN_PARTITIONS:
            raise InvariantViolation(f"transactional id {tid!r}: {len(parts)} partitions")
        old = self.txn(tid)
        before = old.state if old is not None else EMPTY
        # Without an earlier record (the first transaction of the id, or a snapshot's copy) any state goes.
        if old is not None and rec.state not in _NEXT[before]:
            raise InvariantViolation(f"transactional id {tid!r}: {before} cannot become {rec.state}")
        if rec.sequence < -1:
            raise InvariantViolation(f"transactional id {tid!r}: transaction sequence {rec.sequence}")
        if old is not None and before not in (COMPLETE_COMMIT, COMPLETE_ABORT):
            if (rec.start_time_ms != old.start_time_ms or rec.sequence != old.sequence
                    or not set(map(tuple, json.loads(old.partitions))) <= parts):
                raise InvariantViolation(f"transactional id {tid!r}: {rec.state} is not the same transaction")
            if before != ONGOING and rec.partitions != old.partitions:
                raise InvariantViolation(f"transactional id {tid!r}: partitions changed after {before}")
        elif old is not None and rec.sequence != _next_sequence(old):
            # A new transaction after a completed one: the next number, so that no step of the last
            # one can be taken for it.
            raise InvariantViolation(f"transactional id {tid!r}: transaction {rec.sequence} does not follow "
                                     f"transaction {old.sequence}")
        self.txns[tid] = rec
        self._note_open(tid, rec.state in _OPEN)

    def _note_open(self, tid: str, is_open: bool) -> None:
        if self._open is None:
            return
        if is_open:
            self._open.setdefault(tid, None)
        else:
            self._open.pop(tid, None)

    def snapshot_records(self) -> list[Record]:
        # Each transaction after its id's mapping: replay checks it is of the current producer.
        out: list[Record] = []
        for tid, rec in sorted(self.entries.items()):
            if rec is not None:
                out.append(rec)
                txn = self.txn(tid)
                if txn is not None:
                    out.append(txn)
        return out


# The transaction states (Kafka's TransactionState, without the Empty/Dead bookkeeping states: no record
# is Empty, and an expired id is removed with its transaction).
EMPTY, ONGOING = "Empty", "Ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "PrepareCommit", "PrepareAbort"
_OPEN = frozenset({ONGOING, PREPARE_COMMIT, PREPARE_ABORT})  # a transaction some coordinator must still end
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"
_NEXT = {EMPTY: {ONGOING}, ONGOING: {ONGOING, PREPARE_COMMIT, PREPARE_ABORT},
         PREPARE_COMMIT: {COMPLETE_COMMIT}, PREPARE_ABORT: {COMPLETE_ABORT},
         COMPLETE_COMMIT: {ONGOING}, COMPLETE_ABORT: {ONGOING}}
ADD, VERIFY, COMMIT, ABORT, COMPLETE, TIMEOUT = "add", "verify", "commit", "abort", "complete", "timeout"
DESCRIBE, PENDING, LIST = "describe", "pending", "list"
MAX_TXN_PARTITIONS = 10_000
MAX_TOPIC_CHARS = 249


def _partitions(value: Any) -> set[tuple[int, str, int]]:
    """A list of [broker_id, topic, partition], checked, as a set of tuples."""
    if not isinstance(value, list):
        raise InvalidRequestError("partitions must be a list")
    out = set()
    for item in value:
        if (not isinstance(item, (list, tuple)) or len(item) != 3 or isinstance(item[0], bool)
                or not isinstance(item[0], int) or not 0 <= item[0] <= INT32_MAX
                or not isinstance(item[1], str) or not 0 < len(item[1]) <= MAX_TOPIC_CHARS
                or isinstance(item[2], bool) or not isinstance(item[2], int) or not 0 <= item[2] <= INT32_MAX):
            raise InvalidRequestError(f"not a [broker_id, topic, partition]: {str(item)[:300]}")
        out.add((item[0], item[1], item[2]))
        if len(out) > MAX_TXN_PARTITIONS:
            raise InvalidRequestError(f"a transaction may hold at most {MAX_TXN_PARTITIONS} partitions")
    return out


def _dump_partitions(parts: set[tuple[int, str, int]]) -> str:
    return json.dumps(sorted(parts), separators=(",", ":"))


def _next_sequence(txn: TransactionStateRecord | None) -> int:
    """The sequence of the transaction that begins after ``txn`` (0 for an id's first)."""
    return 0 if txn is None or txn.sequence < 0 else txn.sequence + 1


def _names(parts: set[tuple[int, str, int]]) -> str:
    shown = sorted(parts)[:5]
    more = f" and {len(parts) - 5} more" if len(parts) > 5 else ""
    return ", ".join(f"{t[:100]}-{p}" for _, t, p in shown) + more


def txn_json(txn: TransactionStateRecord, cur: TransactionalIdRecord | None) -> dict:
    """A transaction as the coordinator brokers see it (TransactionResponse.transaction)."""
    out = txn.to_json_dict()
    out["partitions"] = json.loads(txn.partitions)
    out["timeout_ms"] = cur.timeout_ms if cur is not None else -1
    return out
