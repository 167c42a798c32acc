"""Replicated state, one slice per manager, in the style of Kafka's controller.

Each manager has two verbs:

* ``generate_*(request)`` reads state and returns ``Result(records, response)``;
  it never changes anything.
* ``replay(record)`` is the only mutation.  It is deterministic (no clock,
  randomness or I/O) and checks invariants, raising ``InvariantViolation`` for
  a record that would break one; such a record changes nothing.

``QuorumState`` holds the managers, dispatches records to them and forks a
scratch copy for the proposer to generate a batch against.
"""
from __future__ import annotations

import bisect
import collections
import copy
import dataclasses
import datetime
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from records import (
    AclRecord,
    AllocateProducerIdsRecord,
    BridgeReservationRecord,
    BrokerEpochCursorRecord,
    ClientQuotaRecord,
    FenceBrokerRecord,
    MigrationCursorRecord,
    MigrationStateRecord,
    ProducerIdCursorRecord,
    ProducerIdHistoryRecord,
    ProducerIdSeedRecord,
    Record,
    RegisterBrokerRecord,
    RemoveAclRecord,
    RemoveTransactionalIdRecord,
    TransactionalIdRecord,
    TransactionStateRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)
from records.schema import INT_RANGES, LONG_MAX
from quorum.security.acl import Acl, AclError, AclIndex
from records.wire.errors import (
    ConcurrentTransactionsError,
    DuplicateBrokerRegistrationError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    InvariantViolation,
    ProducerFencedError,
    StaleBrokerEpochError,
    UnknownServerError,
)

from .client_quotas import ClientQuotaManager

DEFAULT_BLOCK_SIZE = 1000
INT32_MAX = INT_RANGES["int32"][1]


@dataclass
class Result:
    records: list[Record]
    response: Any


# --------------------------------------------------------------------------
# Broker registrations
# --------------------------------------------------------------------------


# Kafka's broker.session.timeout.ms: a registration whose broker heartbeated within this long is live, and
# a new incarnation of its broker id is refused (DUPLICATE_BROKER_REGISTRATION) until the session lapses.
DEFAULT_BROKER_SESSION_TIMEOUT_MS = 9000


def _utc(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")


def duplicate_registration_message(broker_id: int, incarnation_id: str, expires_ms: int, now_ms: int) -> str:
    """The refusal of a new incarnation while ``incarnation_id`` holds ``broker_id`` (one line)."""
    return (f"broker {broker_id} is registered by live incarnation {incarnation_id}: its session expires at "
            f"{_utc(expires_ms)} (in {max(0, expires_ms - now_ms)} ms) unless it heartbeats again; a new "
            "incarnation can register once it has lapsed")


@dataclass
class Registration:
    broker_id: int
    incarnation_id: str
    broker_epoch: int
    listener: str
    fenced: bool = False
    # The time of the broker's last logged heartbeat (an UnfenceBrokerRecord's timestamp_ms: the leader's
    # clock when it generated the record, the same on every node and on replay); None: it never heartbeated.
    heartbeat_ms: int | None = None

    def to_record(self) -> RegisterBrokerRecord:
        return RegisterBrokerRecord(broker_id=self.broker_id, incarnation_id=self.incarnation_id,
                                    broker_epoch=self.broker_epoch, listener=self.listener)

    def session_expires_ms(self, session_timeout_ms: int) -> int | None:
        """When this registration's session lapses; None: it has none (never heartbeated, or fenced).

        Only what the log holds is read, so every node (a new leader, a node replaying the log or a
        snapshot) sees the same session: there is no leader-only state to lose in a failover."""
        if self.fenced or self.heartbeat_ms is None:
            return None
        return self.heartbeat_ms + session_timeout_ms


class BrokerRegistrationManager:
    """Registrations, with Kafka's rule for a broker id held by a live session (``generate_register``).

    A broker's session is its heartbeats: a heartbeat of an unfenced registration that moves the
    session on is logged (``UnfenceBrokerRecord``, whose ``timestamp_ms`` replay keeps as the session
    time), so the liveness every decision reads is replicated state, decided with the batch's clock
    (``now_ms``, the time the accepted records carry) and never the clock at apply time.
    """

    def __init__(self) -> None:
        self.brokers: dict[int, Registration] = {}
        self.last_epoch = 0  # highest epoch ever assigned; epochs start at 1

    # -- generate ----------------------------------------------------------
    def generate_register(self, broker_id: int, incarnation_id: str, listener: str, now_ms: int,
                          session_timeout_ms: int = DEFAULT_BROKER_SESSION_TIMEOUT_MS) -> Result:
        """Register ``broker_id``: a new epoch, or the same one for the same incarnation (a retry).

        A different incarnation while the current registration's session is live (a heartbeat within
        ``session_timeout_ms`` of ``now_ms``) is refused with DUPLICATE_BROKER_REGISTRATION, as in
        Kafka's ClusterControlManager: a running broker is not fenced by a second process (or a
        principal with CLUSTER_ACTION) claiming its id.  A restarted broker registers once the old
        process's session has lapsed (its registration loop retries the refusal)."""
        _check_broker_id(broker_id)
        if not incarnation_id:
            raise InvalidRequestError("incarnation id is required")
        current = self.brokers.get(broker_id)
        if current is not None and current.incarnation_id == incarnation_id and not current.fenced:
            # The same process registering again (a retry): same epoch, nothing to commit.
            return Result([], current.broker_epoch)
        if current is not None and current.incarnation_id != incarnation_id:
            expires = current.session_expires_ms(session_timeout_ms)
            if expires is not None and now_ms <= expires:
                raise DuplicateBrokerRegistrationError(
                    duplicate_registration_message(broker_id, current.incarnation_id, expires, now_ms))
        epoch = self.last_epoch + 1
        rec = RegisterBrokerRecord(broker_id=broker_id, incarnation_id=incarnation_id, broker_epoch=epoch,
                                   listener=listener, timestamp_ms=now_ms)
        return Result([rec], epoch)

    def check_epoch(self, broker_id: int, broker_epoch: int) -> Registration:
        """The registration if ``broker_epoch`` is the broker's current one, else STALE_BROKER_EPOCH."""
        current = self.brokers.get(broker_id)
        if current is None:
            raise StaleBrokerEpochError(f"broker {broker_id} is not registered")
        if current.broker_epoch != broker_epoch:
            raise StaleBrokerEpochError(
                f"broker {broker_id} epoch {broker_epoch} does not match the registered epoch {current.broker_epoch}")
        return current

    def generate_heartbeat(self, broker_id: int, broker_epoch: int, want_fence: bool, want_shut_down: bool,
                           now_ms: int) -> Result:
        """Response: dict(is_fenced, should_shut_down)."""
        _check_broker_id(broker_id)
        reg = self.check_epoch(broker_id, broker_epoch)
        if want_shut_down:
            rec = UnregisterBrokerRecord(broker_id=broker_id, broker_epoch=broker_epoch, timestamp_ms=now_ms)
            return Result([rec], {"is_fenced": True, "should_shut_down": True})
        if want_fence and not reg.fenced:
            rec = FenceBrokerRecord(broker_id=broker_id, broker_epoch=broker_epoch, timestamp_ms=now_ms)
            return Result([rec], {"is_fenced": True, "should_shut_down": False})
        if not want_fence and (reg.fenced or reg.heartbeat_ms is None or now_ms > reg.heartbeat_ms):
            # Unfences a fenced broker; for an unfenced one, renews its session (logged, so that every node
            # and every later leader sees the same session: see generate_register).
            rec = UnfenceBrokerRecord(broker_id=broker_id, broker_epoch=broker_epoch, timestamp_ms=now_ms)
            return Result([rec], {"is_fenced": False, "should_shut_down": False})
        return Result([], {"is_fenced": reg.fenced, "should_shut_down": False})

    # -- replay --------------------------------------------------------------
    def replay(self, rec: Record) -> None:
        if isinstance(rec, RegisterBrokerRecord):
            if rec.broker_epoch <= self.last_epoch:
                raise InvariantViolation(
                    f"broker epoch {rec.broker_epoch} is not above the last assigned epoch {self.last_epoch}")
            self.brokers[rec.broker_id] = Registration(rec.broker_id, rec.incarnation_id, rec.broker_epoch,
                                                       rec.listener)
            self.last_epoch = rec.broker_epoch
        elif isinstance(rec, (FenceBrokerRecord, UnfenceBrokerRecord, UnregisterBrokerRecord)):
            reg = self.brokers.get(rec.broker_id)
            if reg is None or reg.broker_epoch != rec.broker_epoch:
                raise InvariantViolation(f"broker {rec.broker_id} epoch {rec.broker_epoch} is not registered")
            if isinstance(rec, UnregisterBrokerRecord):
                del self.brokers[rec.broker_id]
            elif isinstance(rec, FenceBrokerRecord):  # a new object, never changed in place: forks share them
                self.brokers[rec.broker_id] = dataclasses.replace(reg, fenced=True)
            else:
                # A heartbeat: the session runs from the record's time (the leader's clock in the log), never
                # backwards (a later leader's clock may be behind).  -1: a record without a time.
                heartbeat = reg.heartbeat_ms
                if rec.timestamp_ms >= 0 and (heartbeat is None or rec.timestamp_ms > heartbeat):
                    heartbeat = rec.timestamp_ms
                self.brokers[rec.broker_id] = dataclasses.replace(reg, fenced=False, heartbeat_ms=heartbeat)
        elif isinstance(rec, BrokerEpochCursorRecord):
            if rec.last_broker_epoch < self.last_epoch:
                raise InvariantViolation("broker epoch cursor would move backwards")
            self.last_epoch = rec.last_broker_epoch
        else:  # pragma: no cover - dispatch bug
            raise TypeError(f"not a registration record: {rec!r}")

    def fork(self) -> "BrokerRegistrationManager":
        """A scratch copy: a new dict over the same Registration objects (replay replaces, never mutates, them)."""
        other = BrokerRegistrationManager.__new__(BrokerRegistrationManager)
        other.brokers = dict(self.brokers)
        other.last_epoch = self.last_epoch
        return other

    def snapshot_records(self) -> list[Record]:
        # Registrations in epoch order replay cleanly; the cursor goes last, since
        # a registration's epoch must be above the cursor when it is replayed.
        out: list[Record] = []
        for reg in sorted(self.brokers.values(), key=lambda r: r.broker_epoch):
            out.append(reg.to_record())
            if reg.heartbeat_ms is not None:  # the session, then the fence over it
                out.append(UnfenceBrokerRecord(broker_id=reg.broker_id, broker_epoch=reg.broker_epoch,
                                               timestamp_ms=reg.heartbeat_ms))
            if reg.fenced:
                out.append(FenceBrokerRecord(broker_id=reg.broker_id, broker_epoch=reg.broker_epoch))
        out.append(BrokerEpochCursorRecord(last_broker_epoch=self.last_epoch))
        return out


# --------------------------------------------------------------------------
# Producer-ID cursor
# --------------------------------------------------------------------------


def seed_overlap(lowest_issued: int | None, issued_before_seed: bool, highest_issued: int | None,
                 zk_block_end: int) -> str | None:
    """The refusal of a seed from a ZooKeeper block ending at ``zk_block_end`` (ZooKeeper issued IDs
    0..zk_block_end) into a quorum that issued ``lowest_issued``..``highest_issued``, some of them before
    its first seed; None when they cannot overlap.  ``pidctl migrate from-zk`` checks the same from
    DescribeState before it asks."""
    if not issued_before_seed or lowest_issued is None or lowest_issued > zk_block_end:
        return None
    upto = "" if highest_issued is None else f"..{highest_issued}"
    return (f"the quorum already issued producer IDs {lowest_issued}{upto}, which overlap ZooKeeper's range "
            f"0..{zk_block_end}; seed only a fresh quorum (docs/migration.md)")


class ProducerIdsManager:
    """Owns the producer-ID cursor: the first ID of the next block.

    IDs go up to LONG_MAX - 1: a block must end (exclusive) at or below LONG_MAX,
    as in Kafka.  Gaps between blocks are allowed (migration needs them); going
    backwards never is.

    It also keeps what a ZooKeeper seed is checked against: the lowest ID ever
    issued, and whether any was issued before the first seed.  ZooKeeper hands
    out IDs from 0 up to its block_end, so IDs the quorum issued before it was
    seeded may be ones ZooKeeper issued too: a seed whose block_end reaches them
    is refused (``seed_overlap``) by the proposer, from its applied state (not on replay: see there).
    """

    def __init__(self) -> None:
        self.next_producer_id = 0
        self.latest: AllocateProducerIdsRecord | None = None
        self.lowest_issued: int | None = None  # None: nothing issued yet
        self.issued_before_seed = False
        self.seeded = False

    def generate_allocate(self, broker_id: int, broker_epoch: int, registrations: BrokerRegistrationManager,
                          block_size: int, now_ms: int) -> Result:
        _check_broker_id(broker_id)
        registrations.check_epoch(broker_id, broker_epoch)
        if not 0 < block_size <= INT32_MAX:
            raise InvalidRequestError(f"block size {block_size} is not in 1..{INT32_MAX}")
        start = self.next_producer_id
        if start > LONG_MAX - block_size:
            raise UnknownServerError(
                f"producer ID space exhausted: next ID {start} + block of {block_size} would pass "
                f"{LONG_MAX - 1}, the last ID that can ever be issued")
        rec = AllocateProducerIdsRecord(broker_id=broker_id, broker_epoch=broker_epoch, producer_id_start=start,
                                        producer_id_len=block_size, timestamp_ms=now_ms)
        return Result([rec], (start, block_size))

    def generate_seed(self, next_producer_id: int, origin: str, zk_broker: int, zk_block_start: int,
                      zk_block_end: int, now_ms: int) -> Result:
        """Move the cursor up to ``next_producer_id`` (ZooKeeper's block_end + 1), never back.

        Response: (changed, next producer ID afterwards).  Already there or beyond:
        nothing is committed and the answer says so (running a migration twice is harmless).
        """
        for name, v, lo, hi in (("next producer id", next_producer_id, 0, LONG_MAX),
                                ("zk block start", zk_block_start, 0, LONG_MAX - 1),
                                ("zk block end", zk_block_end, 0, LONG_MAX - 1),
                                ("zk broker", zk_broker, -(2**31), INT32_MAX)):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise InvalidRequestError(f"{name} {v!r} is not in {lo}..{hi}")
        if zk_block_end < zk_block_start or next_producer_id != zk_block_end + 1:
            raise InvalidRequestError(
                f"seed {next_producer_id} does not follow the ZooKeeper block [{zk_block_start}, {zk_block_end}] "
                "(it must be block_end + 1: block_end is inclusive)")
        if not isinstance(origin, str) or not origin:
            raise InvalidRequestError("the seed's origin is required")
        overlap = self.seed_overlap(zk_block_end)
        if overlap is not None:
            raise InvalidRequestError(overlap)
        if next_producer_id <= self.next_producer_id:
            return Result([], (False, self.next_producer_id))
        rec = ProducerIdSeedRecord(next_producer_id=next_producer_id, origin=origin, zk_broker=zk_broker,
                                   zk_block_start=zk_block_start, zk_block_end=zk_block_end, timestamp_ms=now_ms)
        return Result([rec], (True, next_producer_id))

    def seed_overlap(self, zk_block_end: int) -> str | None:
        """Why a seed from a ZooKeeper block ending at ``zk_block_end`` would overlap what the quorum
        issued (one line), or None.  IDs issued after an earlier seed are above that seed's block_end,
        which is how a re-run of the same seed (or one after a rollback) is still accepted."""
        latest = self.latest
        top = latest.producer_id_start + latest.producer_id_len - 1 if latest is not None else None
        return seed_overlap(self.lowest_issued, self.issued_before_seed, top, zk_block_end)

    def history(self) -> dict[str, Any]:
        """What DescribeState shows of it (``pidctl migrate status``): a fresh quorum has lowest None."""
        return {"lowest": self.lowest_issued, "before_seed": self.issued_before_seed, "seeded": self.seeded}

    def _inferred_history(self) -> tuple[int | None, bool, bool]:
        """What a snapshot without a ProducerIdHistoryRecord says: nothing issued if it holds no block;
        else issued from 0 before any seed (all a snapshot written before the record existed allows)."""
        return (None, False, False) if self.latest is None else (0, True, False)

    def assume_history(self) -> None:
        """Restoring a snapshot that holds no ProducerIdHistoryRecord (``QuorumState.from_records``)."""
        self.lowest_issued, self.issued_before_seed, self.seeded = self._inferred_history()

    def replay(self, rec: Record) -> None:
        if isinstance(rec, ProducerIdSeedRecord):
            if rec.next_producer_id < self.next_producer_id:
                raise InvariantViolation(
                    f"seed {rec.next_producer_id} is below the next producer ID {self.next_producer_id}")
            # No overlap check here, on purpose: the leader refused an overlapping seed in generate_seed, from
            # its applied state.  A committed seed is a fact every replica must apply alike; a node restored
            # from a snapshot written before ProducerIdHistoryRecord existed only *infers* its history
            # (assume_history: issued from 0 before any seed), and if it refused what its peers applied its
            # cursor would stay below theirs and, leading, it would issue IDs inside ZooKeeper's range.
            self.next_producer_id = rec.next_producer_id
            self.seeded = True
            return
        if isinstance(rec, ProducerIdHistoryRecord):
            self._replay_history(rec)
            return
        if isinstance(rec, AllocateProducerIdsRecord):
            start, length = rec.producer_id_start, rec.producer_id_len
            if start < self.next_producer_id:
                raise InvariantViolation(
                    f"block [{start}, {start + length}) starts below the next producer ID {self.next_producer_id}")
            if length <= 0:
                raise InvariantViolation(f"block length {length} is not positive")
            if start > LONG_MAX - length:
                raise InvariantViolation(f"block [{start}, +{length}) would pass the last producer ID")
            self.next_producer_id = start + length
            self.latest = rec
            if self.lowest_issued is None or start < self.lowest_issued:
                self.lowest_issued = start
            if not self.seeded:
                self.issued_before_seed = True
        elif isinstance(rec, ProducerIdCursorRecord):
            if rec.next_producer_id < self.next_producer_id:
                raise InvariantViolation(
                    f"cursor {rec.next_producer_id} is below the next producer ID {self.next_producer_id}")
            self.next_producer_id = rec.next_producer_id
        else:  # pragma: no cover - dispatch bug
            raise TypeError(f"not a producer-ID record: {rec!r}")

    def _replay_history(self, rec: Record) -> None:
        """A snapshot's ProducerIdHistoryRecord, after its latest block or cursor: it replaces what
        replaying that one block made of the history."""
        lowest = rec.lowest_issued
        if self.latest is None:
            if lowest != -1 or rec.issued_before_seed:
                raise InvariantViolation(f"a history of issued IDs (lowest {lowest}) without any block")
        elif not 0 <= lowest <= self.latest.producer_id_start:
            raise InvariantViolation(f"lowest issued ID {lowest} is not in 0..{self.latest.producer_id_start}, "
                                     "the start of the latest block")
        elif not (rec.seeded or rec.issued_before_seed):
            raise InvariantViolation("blocks were issued, but neither before a seed nor after one")
        self.lowest_issued = None if lowest == -1 else lowest
        self.issued_before_seed, self.seeded = rec.issued_before_seed, rec.seeded

    def snapshot_records(self) -> list[Record]:
        out: list[Record] = []
        if self.latest is not None:
            out.append(self.latest)
        if self.latest is None or self.latest.producer_id_start + self.latest.producer_id_len != self.next_producer_id:
            out.append(ProducerIdCursorRecord(next_producer_id=self.next_producer_id))
        if (self.lowest_issued, self.issued_before_seed, self.seeded) != self._inferred_history():
            out.append(ProducerIdHistoryRecord(
                lowest_issued=-1 if self.lowest_issued is None else self.lowest_issued,
                issued_before_seed=self.issued_before_seed, seeded=self.seeded))
        return out


# --------------------------------------------------------------------------
# Transactional ids (the transaction coordinator's InitProducerId state)
# --------------------------------------------------------------------------

NO_PRODUCER_ID = -1
NO_EPOCH = -1
# An epoch at or above this is exhausted: the next bump rotates to a new producer
# ID.  Short.MAX (32767) itself is never handed out; it is kept back for fencing.
EPOCH_EXHAUSTED = 2**15 - 2
DEFAULT_TXN_EXPIRATION_MS = 7 * 24 * 3600 * 1000   # transactional.id.expiration.ms
DEFAULT_MAX_TXN_TIMEOUT_MS = 15 * 60 * 1000        # transaction.max.timeout.ms
MAX_TRANSACTIONAL_ID_CHARS = 32767                 # a Kafka string
EXPIRE_PER_BATCH = 64                              # expired ids removed per InitProducerId
MAX_REQUEST_ID_CHARS = 100                         # InitTransactionalProducerRequest.request_id
LIST_PAGE_CHARS = 1 << 20                          # list_page: about this much JSON per page at most
LIST_ROW_CHARS = 300                               # a listed transaction's JSON besides its id and partitions


@dataclass(frozen=True)
class TxnSettings:
    expiration_ms: int = DEFAULT_TXN_EXPIRATION_MS
    max_timeout_ms: int = DEFAULT_MAX_TXN_TIMEOUT_MS


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

    def get(self, transactional_id: str) -> TransactionalIdRecord | None:
        return self.entries.get(transactional_id)

    def txn(self, transactional_id: str) -> TransactionStateRecord | None:
        return self.txns.get(transactional_id)

    def __len__(self) -> int:
        return sum(1 for v in self.entries.values() if v is not None)

    def fork(self) -> "TransactionalIdManager":
        return TransactionalIdManager(collections.ChainMap({}, self.entries), collections.ChainMap({}, self.txns))

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
        out = []
        for tid, txn in self.txns.items():
            if len(out) >= limit:
                break
            if txn is None:
                continue
            cur = self.get(tid)
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
        """Removal records for up to EXPIRE_PER_BATCH other ids idle past expiration."""
        out: list[Record] = []
        for tid, rec in self.entries.items():
            if len(out) >= EXPIRE_PER_BATCH:
                break
            txn = self.txn(tid)
            if txn is not None and txn.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT):
                continue  # an open transaction keeps its id, as in Kafka
            if rec is not None and tid != keep and now_ms - rec.update_time_ms > settings.expiration_ms:
                out.append(RemoveTransactionalIdRecord(transactional_id=tid, producer_id=rec.producer_id,
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


# --------------------------------------------------------------------------
# ZooKeeper migration mode (bridge / finalized / rolled-back)
# --------------------------------------------------------------------------

BRIDGE, FINALIZED, ROLLED_BACK = "bridge", "finalized", "rolled-back"
_TRANSITIONS = {None: {BRIDGE}, BRIDGE: {FINALIZED, ROLLED_BACK}, FINALIZED: {ROLLED_BACK}, ROLLED_BACK: {BRIDGE}}


class MigrationManager:
    """The migration mode, and in bridge mode how far the znode has been reserved.

    In bridge mode every allocation must lie inside a range the leader reserved in
    ZooKeeper *before* proposing it (a BridgeReservationRecord earlier in the same or
    an earlier entry): replay refuses anything else, so no ZooKeeper-mode broker can
    take a range the quorum commits.  Rolled back: the quorum issues nothing.
    """

    def __init__(self) -> None:
        self.mode: str | None = None
        self.zk = ""
        self.reserved_until = 0  # exclusive end of the reserved ranges (bridge mode)

    def generate_command(self, action: str, zk: str, cursor: int, now_ms: int) -> Result:
        """Response: (changed, mode).  Rollback's placeholder is written by the caller, after commit."""
        target = {"bridge": BRIDGE, "finalize": FINALIZED, "rollback": ROLLED_BACK}.get(action)
        if target is None:
            raise InvalidRequestError(f"unknown migration action {action!r} (bridge, finalize, rollback)")
        zk = zk or self.zk
        if target == BRIDGE and not zk:
            raise InvalidRequestError("bridge mode needs the ZooKeeper connect string (--zk)")
        if self.mode == target and (target != BRIDGE or zk == self.zk):
            return Result([], (False, self.mode))
        if target not in _TRANSITIONS[self.mode]:
            raise InvalidRequestError(f"cannot {action} from migration mode {self.mode or 'none'}")
        return Result([MigrationStateRecord(mode=target, zk=zk, timestamp_ms=now_ms)], (True, target))

    def check_allocation(self, start: int, length: int) -> None:
        """Replay-side guard for a block (or one-ID block) about to be committed."""
        if self.mode == ROLLED_BACK:
            raise InvariantViolation("allocation after rollback to ZooKeeper")
        if self.mode == BRIDGE and start + length > self.reserved_until:
            raise InvariantViolation(
                f"bridge mode: block [{start}, {start + length}) is not inside the ZooKeeper reservation "
                f"(reserved below {self.reserved_until})")

    def replay(self, rec: Record, cursor: int) -> int | None:
        """Apply; returns a new cursor for a reservation."""
        if isinstance(rec, MigrationCursorRecord):  # snapshot restore
            if self.mode is not None:
                raise InvariantViolation("a migration cursor over an existing migration state")
            self.mode, self.zk, self.reserved_until = rec.mode, rec.zk, rec.reserved_until
            return None
        if isinstance(rec, MigrationStateRecord):
            if rec.mode not in _TRANSITIONS or rec.mode not in _TRANSITIONS[self.mode] and rec.mode != self.mode:
                raise InvariantViolation(f"migration mode {self.mode} cannot become {rec.mode}")
            if rec.mode == BRIDGE and self.mode != BRIDGE:
                self.reserved_until = cursor  # nothing reserved yet
            self.mode, self.zk = rec.mode, rec.zk
            return None
        if isinstance(rec, BridgeReservationRecord):
            if self.mode != BRIDGE:
                raise InvariantViolation("a ZooKeeper reservation outside bridge mode")
            if rec.reserved_start < cursor or rec.reserved_end < rec.reserved_start:
                raise InvariantViolation(f"reservation [{rec.reserved_start}, {rec.reserved_end}] is below the "
                                         f"next producer ID {cursor} or empty")
            self.reserved_until = rec.reserved_end + 1
            return rec.reserved_start
        raise TypeError(f"not a migration record: {rec!r}")  # pragma: no cover

    def snapshot_records(self) -> list[Record]:
        if self.mode is None:
            return []
        return [MigrationCursorRecord(mode=self.mode, zk=self.zk, reserved_until=self.reserved_until)]

    def summary(self) -> dict[str, Any]:
        return {"mode": self.mode, "zk": self.zk, "reserved_until": self.reserved_until}


# --------------------------------------------------------------------------
# Access-control entries (quorum/security/acl.py decides; this slice stores them)
# --------------------------------------------------------------------------


class AclManager:
    """The ACL entries, keyed by all their fields (the timestamp is audit only)."""

    def __init__(self) -> None:
        self.entries: dict[Acl, AclRecord] = {}
        self._index: AclIndex | None = None

    def acls(self) -> list[Acl]:
        return sorted(self.entries)

    def index(self) -> AclIndex:
        """The entries grouped for checks; rebuilt after a change (read it under the state's lock)."""
        if self._index is None:
            self._index = AclIndex(self.entries)
        return self._index

    def fork(self) -> "AclManager":
        out = AclManager()
        out.entries = dict(self.entries)  # entries are frozen
        return out

    def generate_alter(self, action: str, acl: Acl, now_ms: int) -> Result:
        """Response: changed (False: already there for add, absent for remove; nothing is committed)."""
        if action not in ("add", "remove"):
            raise InvalidRequestError(f"unknown ACL action {action!r} (add, remove)")
        try:
            acl.validate()
        except AclError as e:
            raise InvalidRequestError(str(e)) from None
        present = acl in self.entries
        if (action == "add") == present:
            return Result([], False)
        cls = AclRecord if action == "add" else RemoveAclRecord
        return Result([cls(**acl.to_dict(), timestamp_ms=now_ms)], True)

    def replay(self, rec: Record) -> None:
        acl = Acl.from_obj(rec)
        try:
            acl.validate()
        except AclError as e:
            raise InvariantViolation(f"invalid ACL entry: {e}") from None
        if isinstance(rec, AclRecord):
            if acl in self.entries:
                raise InvariantViolation(f"ACL entry {acl} already exists")
            self.entries[acl] = rec
            self._index = None
        elif isinstance(rec, RemoveAclRecord):
            if acl not in self.entries:
                raise InvariantViolation(f"ACL entry {acl} does not exist")
            del self.entries[acl]
            self._index = None
        else:  # pragma: no cover - dispatch bug
            raise TypeError(f"not an ACL record: {rec!r}")

    def snapshot_records(self) -> list[Record]:
        return [self.entries[a] for a in sorted(self.entries)]


def _check_broker_id(broker_id: int) -> None:
    if isinstance(broker_id, bool) or not isinstance(broker_id, int) or not 0 <= broker_id <= INT32_MAX:
        raise InvalidRequestError(f"broker id {broker_id!r} is not in 0..{INT32_MAX}")


# --------------------------------------------------------------------------
# The whole state machine
# --------------------------------------------------------------------------


@dataclass
class ApplyOutcome:
    """What replay made of one record of an entry."""

    record: Record
    error: str | None = None

    @property
    def accepted(self) -> bool:
        return self.error is None


@dataclass
class QuorumState:
    producer_ids: ProducerIdsManager = field(default_factory=ProducerIdsManager)
    registrations: BrokerRegistrationManager = field(default_factory=BrokerRegistrationManager)
    transactions: TransactionalIdManager = field(default_factory=TransactionalIdManager)
    migration: MigrationManager = field(default_factory=MigrationManager)
    acls: AclManager = field(default_factory=AclManager)
    quotas: ClientQuotaManager = field(default_factory=ClientQuotaManager)

    def replay(self, rec: Record) -> None:
        if isinstance(rec, AllocateProducerIdsRecord):
            self.migration.check_allocation(rec.producer_id_start, rec.producer_id_len)
            self.producer_ids.replay(rec)
        elif isinstance(rec, (ProducerIdCursorRecord, ProducerIdSeedRecord, ProducerIdHistoryRecord)):
            self.producer_ids.replay(rec)
        elif isinstance(rec, (MigrationStateRecord, BridgeReservationRecord, MigrationCursorRecord)):
            cursor = self.migration.replay(rec, self.producer_ids.next_producer_id)
            if cursor is not None and cursor > self.producer_ids.next_producer_id:
                self.producer_ids.next_producer_id = cursor  # the reserved range starts above a gap
        elif isinstance(rec, (TransactionalIdRecord, RemoveTransactionalIdRecord, TransactionStateRecord)):
            self.transactions.replay(rec, self.producer_ids.next_producer_id)
        elif isinstance(rec, (RegisterBrokerRecord, FenceBrokerRecord, UnfenceBrokerRecord, UnregisterBrokerRecord,
                              BrokerEpochCursorRecord)):
            self.registrations.replay(rec)
        elif isinstance(rec, (AclRecord, RemoveAclRecord)):
            self.acls.replay(rec)
        elif isinstance(rec, ClientQuotaRecord):
            self.quotas.replay(rec)
        else:
            raise InvariantViolation(f"{type(rec).__name__} is not a replicated record")

    def apply_batch(self, records: list[Record]) -> list[ApplyOutcome]:
        """Replay every record of one log entry; a refused record changes nothing."""
        out = []
        for rec in records:
            try:
                self.replay(rec)
                out.append(ApplyOutcome(rec))
            except InvariantViolation as e:
                out.append(ApplyOutcome(rec, str(e)))
        return out

    def fork(self) -> "QuorumState":
        """A scratch copy for generating a batch of records against."""
        # Per batch on the leader: no deepcopy (it was the proposer's largest cost).  The cursor and the
        # migration manager hold only ints, strings and frozen records: a shallow copy is a full one.
        return QuorumState(copy.copy(self.producer_ids), self.registrations.fork(), self.transactions.fork(),
                           copy.copy(self.migration), acls=self.acls.fork(), quotas=self.quotas.fork())

    def snapshot_records(self) -> list[Record]:
        """The state as records: the latest block (or cursor), live registrations, live transactional ids."""
        # The migration cursor last: the latest block replays before the mode that would guard it.
        return (self.producer_ids.snapshot_records() + self.registrations.snapshot_records()
                + self.transactions.snapshot_records() + self.migration.snapshot_records()
                + self.acls.snapshot_records() + self.quotas.snapshot_records())

    @classmethod
    def from_records(cls, records: list[Record]) -> "QuorumState":
        """The state a snapshot's records describe."""
        state = cls()
        for rec in records:
            state.replay(rec)
        if not any(isinstance(rec, ProducerIdHistoryRecord) for rec in records):
            state.producer_ids.assume_history()
        return state

    def summary(self) -> dict[str, Any]:
        latest = self.producer_ids.latest
        return {
            "next_producer_id": self.producer_ids.next_producer_id,
            "latest_block": latest.to_json_dict() if latest is not None else None,
            "last_broker_epoch": self.registrations.last_epoch,
            "transactional_ids": len(self.transactions),
            "migration": self.migration.summary(),
            "client_quotas": self.quotas.entries(),
            "brokers": [
                {"broker_id": r.broker_id, "broker_epoch": r.broker_epoch, "incarnation_id": r.incarnation_id,
                 "listener": r.listener, "fenced": r.fenced, "last_heartbeat_ms": r.heartbeat_ms}
                for _, r in sorted(self.registrations.brokers.items())
            ],
        }
