"""The whole state machine: every slice, the one dispatch of records to them, forks and snapshots."""
from __future__ import annotations

import copy
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
from records.wire.errors import InvariantViolation


from ..client_quotas import ClientQuotaManager
from .acls import AclManager
from .cursor import ProducerIdsManager
from .migration import MigrationManager
from .registrations import BrokerRegistrationManager
from .transactions import TransactionalIdManager

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
