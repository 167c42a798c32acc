"""A snapshot of transactional state restores (found by the transaction simulation, seed 1 at 8,000 events:
a follower installing the leader's snapshot raised InvariantViolation and the simulation stopped)."""
from __future__ import annotations

import pytest

from quorum.managers import QuorumState
from records import TransactionalIdRecord, TransactionStateRecord
from records.wire.errors import InvariantViolation

NOW = 1_700_000_000_000


def _apply(state: QuorumState, result):
    assert all(o.accepted for o in state.apply_batch(result.records))
    return result


def test_a_snapshot_with_a_completed_transaction_of_an_earlier_epoch_restores():
    """The id's last transaction completed at epoch 0, then InitProducerId bumped the epoch (KIP-360): the
    snapshot holds the mapping at epoch 1 and the transaction at epoch 0, in that order."""
    s = QuorumState()
    _apply(s, s.registrations.generate_register(1, "inc-1", "h:1", NOW))
    epoch = s.registrations.brokers[1].broker_epoch
    pid, ep = _apply(s, s.transactions.generate_init(1, epoch, "tx", 60_000, -1, -1, registrations=s.registrations,
                                                     producer_ids=s.producer_ids, now_ms=NOW)).response[:2]
    for op in ("add", "commit", "complete"):
        start = s.transactions.txn("tx").start_time_ms if op == "complete" else -1
        _apply(s, s.transactions.generate_txn(op, 1, epoch, "tx", pid, ep, [[1, "t", 0]], start,
                                              registrations=s.registrations, now_ms=NOW + 1, sequence=0))
    _apply(s, s.transactions.generate_init(1, epoch, "tx", 60_000, pid, ep, registrations=s.registrations,
                                           producer_ids=s.producer_ids, now_ms=NOW + 2))
    restored = QuorumState.from_records(s.snapshot_records())
    assert restored.transactions == s.transactions
    assert restored.transactions.get("tx").producer_epoch == ep + 1
    assert restored.transactions.txn("tx").state == "CompleteCommit"


def test_a_snapshot_still_refuses_an_open_transaction_of_another_producer():
    s = QuorumState()
    s.producer_ids.next_producer_id = 10
    mapping = TransactionalIdRecord(transactional_id="tx", producer_id=3, producer_epoch=2, last_producer_id=-1,
                                    last_producer_epoch=-1, timeout_ms=60_000, state="Empty", update_time_ms=NOW,
                                    broker_id=1)
    open_txn = TransactionStateRecord(transactional_id="tx", producer_id=3, producer_epoch=1, state="Ongoing",
                                      partitions='[[1, "t", 0]]', start_time_ms=NOW, update_time_ms=NOW, broker_id=1,
                                      sequence=0)
    with pytest.raises(InvariantViolation, match="not of its current producer"):
        QuorumState.from_records(s.snapshot_records() + [mapping, open_txn])
