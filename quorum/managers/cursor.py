"""The producer-ID cursor: the first ID of the next block, and what a ZooKeeper seed is checked against."""
from __future__ import annotations

from typing import Any

from records import (
    AllocateProducerIdsRecord,
    ProducerIdCursorRecord,
    ProducerIdHistoryRecord,
    ProducerIdSeedRecord,
    Record,
)
from records.schema import LONG_MAX
from records.wire.errors import (
    InvalidRequestError,
    InvariantViolation,
    UnknownServerError,
)

from .base import INT32_MAX, Result, _check_broker_id
from .registrations import BrokerRegistrationManager


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
