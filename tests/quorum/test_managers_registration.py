"""Unit tests for quorum.managers' broker registrations and heartbeats, and QuorumState (replay,
snapshots, summaries).  Generate never mutates, replay is the only mutation.

Pure in-memory; no Raft, no network, no files.
"""
from __future__ import annotations

import pytest

from quorum.managers import ApplyOutcome, QuorumState
from records import (
    AllocateProducerIdsRecord,
    AuditEntry,
    AuditGap,
    BrokerEpochCursorRecord,
    FenceBrokerRecord,
    ProducerIdCursorRecord,
    RegisterBrokerRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
)
from records.schema import LONG_MAX
from records.wire.errors import Errors, InvalidRequestError, StaleBrokerEpochError, UnknownServerError
from tests.quorum.manager_steps import NOW, _refused, allocate, block, fingerprint, heartbeat, register
from tests.quorum.manager_steps import registered, state  # noqa: F401 (fixtures)


# --------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------


def test_epochs_strictly_increase_across_brokers(state):
    epochs = [register(state, b) for b in (5, 1, 9, 1, 5)]
    # broker 1 and 5 re-register with the same incarnation: same epoch.
    assert epochs == [1, 2, 3, 2, 1]
    new = [register(state, b, incarnation=f"new-{b}") for b in (1, 5, 9)]
    assert new == [4, 5, 6]
    assert state.registrations.last_epoch == 6


def test_same_incarnation_returns_same_epoch_with_no_records(registered):
    res = registered.registrations.generate_register(1, "inc-1", "other:2", NOW)
    assert res.records == []
    assert res.response == 1


def test_new_incarnation_gets_new_epoch_and_old_becomes_stale(registered):
    allocate(registered, 1, 1, 10)
    new_epoch = register(registered, 1, incarnation="inc-1-restarted", listener="h:2")
    assert new_epoch == 2
    reg = registered.registrations.brokers[1]
    assert (reg.broker_epoch, reg.incarnation_id, reg.listener, reg.fenced) == (2, "inc-1-restarted", "h:2", False)
    with pytest.raises(StaleBrokerEpochError):
        registered.producer_ids.generate_allocate(1, 1, registered.registrations, 10, NOW)
    with pytest.raises(StaleBrokerEpochError):
        registered.registrations.generate_heartbeat(1, 1, False, False, NOW)
    assert allocate(registered, 1, new_epoch, 10) == (10, 10)


def test_register_requires_incarnation(state):
    with pytest.raises(InvalidRequestError, match="incarnation"):
        state.registrations.generate_register(1, "", "h:1", NOW)


def test_register_after_unregister_gets_fresh_epoch(registered):
    heartbeat(registered, 1, 1, shut_down=True)
    assert 1 not in registered.registrations.brokers
    assert register(registered, 1) == 2  # same incarnation string, but it was unregistered


def test_fenced_broker_reregistering_with_same_incarnation_gets_new_epoch(registered):
    heartbeat(registered, 1, 1, fence=True)
    res = registered.registrations.generate_register(1, "inc-1", "h:1", NOW)
    assert res.response == 2 and len(res.records) == 1


def test_epochs_continue_after_epoch_cursor(state):
    state.replay(BrokerEpochCursorRecord(last_broker_epoch=41))
    assert register(state, 1) == 42


def test_replay_refuses_register_not_above_last_epoch(state):
    register(state, 1)
    register(state, 2)
    for epoch in (0, 1, 2, -5):
        _refused(state, RegisterBrokerRecord(broker_id=3, incarnation_id="x", broker_epoch=epoch),
                 "is not above the last assigned epoch 2")
    state.replay(RegisterBrokerRecord(broker_id=3, incarnation_id="x", broker_epoch=10))  # gaps are fine
    assert state.registrations.last_epoch == 10


def test_replay_refuses_epoch_cursor_going_backwards(state):
    state.replay(BrokerEpochCursorRecord(last_broker_epoch=5))
    state.replay(BrokerEpochCursorRecord(last_broker_epoch=5))
    _refused(state, BrokerEpochCursorRecord(last_broker_epoch=4), "backwards")


# --------------------------------------------------------------------------
# heartbeats
# --------------------------------------------------------------------------


def test_heartbeat_fence_then_unfence(registered):
    res = heartbeat(registered, 1, 1, fence=True)
    assert res.records == [FenceBrokerRecord(broker_id=1, broker_epoch=1, timestamp_ms=NOW)]
    assert res.response == {"is_fenced": True, "should_shut_down": False}
    assert registered.registrations.brokers[1].fenced is True

    res = heartbeat(registered, 1, 1, fence=True)  # already fenced: nothing to commit
    assert res.records == []
    assert res.response == {"is_fenced": True, "should_shut_down": False}

    res = heartbeat(registered, 1, 1)
    assert res.records == [UnfenceBrokerRecord(broker_id=1, broker_epoch=1, timestamp_ms=NOW)]
    assert res.response == {"is_fenced": False, "should_shut_down": False}
    assert registered.registrations.brokers[1].fenced is False

    res = heartbeat(registered, 1, 1)  # already unfenced
    assert res.records == []
    assert res.response == {"is_fenced": False, "should_shut_down": False}


@pytest.mark.parametrize("fence", [False, True])
def test_heartbeat_shutdown(registered, fence):
    res = heartbeat(registered, 1, 1, fence=fence, shut_down=True)
    assert res.records == [UnregisterBrokerRecord(broker_id=1, broker_epoch=1, timestamp_ms=NOW)]
    assert res.response == {"is_fenced": True, "should_shut_down": True}
    assert registered.registrations.brokers == {}
    assert registered.registrations.last_epoch == 1  # epochs are never reused


def test_heartbeat_stale_epoch(registered):
    for epoch in (0, 2):
        with pytest.raises(StaleBrokerEpochError) as ei:
            registered.registrations.generate_heartbeat(1, epoch, False, False, NOW)
        assert ei.value.code == Errors.STALE_BROKER_EPOCH
    with pytest.raises(StaleBrokerEpochError, match="not registered"):
        registered.registrations.generate_heartbeat(2, 1, False, False, NOW)


@pytest.mark.parametrize("cls", [FenceBrokerRecord, UnfenceBrokerRecord, UnregisterBrokerRecord])
def test_replay_refuses_broker_records_for_unknown_registration(registered, cls):
    _refused(registered, cls(broker_id=1, broker_epoch=2), "broker 1 epoch 2 is not registered")
    _refused(registered, cls(broker_id=7, broker_epoch=1), "broker 7 epoch 1 is not registered")


def test_replay_refuses_fence_for_old_epoch_after_reregister(registered):
    register(registered, 1, incarnation="again")
    _refused(registered, FenceBrokerRecord(broker_id=1, broker_epoch=1), "not registered")
    _refused(registered, UnregisterBrokerRecord(broker_id=1, broker_epoch=1), "not registered")


# --------------------------------------------------------------------------
# QuorumState
# --------------------------------------------------------------------------


def test_apply_batch_outcomes_and_refused_record_changes_nothing(state):
    batch = [
        RegisterBrokerRecord(broker_id=1, incarnation_id="a", broker_epoch=1),
        block(0, 10),
        block(5, 10),                                              # refused: below next
        RegisterBrokerRecord(broker_id=2, incarnation_id="b", broker_epoch=1),  # refused: epoch not above
        block(10, 0),                                              # refused: length
        FenceBrokerRecord(broker_id=9, broker_epoch=1),            # refused: unknown broker
        AuditGap(raft_index=3),                                    # refused: not replicated
        block(10, 10),                                             # later record still applies
        RegisterBrokerRecord(broker_id=2, incarnation_id="b", broker_epoch=2),
    ]
    outcomes = state.apply_batch(batch)
    assert [o.record for o in outcomes] == batch
    assert [o.accepted for o in outcomes] == [True, True, False, False, False, False, False, True, True]
    assert all(o.error is None for o in outcomes if o.accepted)
    assert "starts below" in outcomes[2].error
    assert "not above the last assigned epoch" in outcomes[3].error
    assert "not positive" in outcomes[4].error
    assert "not registered" in outcomes[5].error
    assert "is not a replicated record" in outcomes[6].error
    assert state.producer_ids.next_producer_id == 20
    assert state.producer_ids.latest == block(10, 10)
    assert state.registrations.last_epoch == 2
    assert sorted(state.registrations.brokers) == [1, 2]
    assert state.registrations.brokers[2].broker_epoch == 2


def test_apply_batch_refused_records_equal_to_not_applying_them():
    good = [RegisterBrokerRecord(broker_id=1, incarnation_id="a", broker_epoch=1), block(0, 10), block(10, 5)]
    bad = [block(3, 3), ProducerIdCursorRecord(next_producer_id=1), BrokerEpochCursorRecord(last_broker_epoch=0),
           UnfenceBrokerRecord(broker_id=1, broker_epoch=5)]
    a, b = QuorumState(), QuorumState()
    a.apply_batch([good[0], good[1], bad[0], bad[1], good[2], bad[2], bad[3]])
    b.apply_batch(good)
    assert fingerprint(a) == fingerprint(b)


def test_apply_batch_empty(state):
    assert state.apply_batch([]) == []


def test_replay_refuses_non_replicated_records(state):
    _refused(state, AuditGap(raft_index=1), "not a replicated record")
    _refused(state, AuditEntry(raft_index=1, position=0, accepted=True, record="X"), "not a replicated record")


def test_apply_outcome_accepted():
    rec = block(0)
    assert ApplyOutcome(rec).accepted is True
    assert ApplyOutcome(rec, "why").accepted is False


def test_fork_is_independent(registered):
    allocate(registered, 1, 1, 10)
    before = fingerprint(registered)
    fork = registered.fork()
    assert fork.summary() == registered.summary()
    allocate(fork, 1, 1, 10)
    register(fork, 2)
    heartbeat(fork, 1, 1, fence=True)
    assert fingerprint(registered) == before
    assert registered.registrations.brokers[1].fenced is False
    assert fork.producer_ids.next_producer_id == 20
    # and the other way round
    allocate(registered, 1, 1, 5)
    assert fork.producer_ids.next_producer_id == 20
    assert fork.registrations.brokers[1].fenced is True


def _round_trip(state: QuorumState) -> QuorumState:
    recs = state.snapshot_records()
    back = QuorumState.from_records(recs)
    assert back.summary() == state.summary()
    assert back.snapshot_records() == recs
    return back


def test_snapshot_round_trip_empty_state(state):
    recs = state.snapshot_records()
    assert recs == [ProducerIdCursorRecord(next_producer_id=0), BrokerEpochCursorRecord(last_broker_epoch=0)]
    back = _round_trip(state)
    assert back.summary() == {"next_producer_id": 0, "latest_block": None, "last_broker_epoch": 0, "brokers": [],
                              "transactional_ids": 0,
                              "migration": {"mode": None, "zk": "", "reserved_until": 0}, "client_quotas": []}


def test_snapshot_round_trip_with_fenced_brokers_and_blocks(state):
    e1 = register(state, 1, listener="a:1")
    e2 = register(state, 2, listener="b:2")
    e3 = register(state, 3, listener="c:3")
    allocate(state, 1, e1, 10)
    allocate(state, 2, e2, 20)
    heartbeat(state, 2, e2, fence=True)
    heartbeat(state, 3, e3, shut_down=True)
    register(state, 1, incarnation="restart")  # epoch 4, above the fenced broker's
    back = _round_trip(state)
    summary = back.summary()
    assert summary["next_producer_id"] == 30
    assert summary["latest_block"]["producer_id_start"] == 10
    assert summary["last_broker_epoch"] == 4
    assert [(b["broker_id"], b["broker_epoch"], b["fenced"]) for b in summary["brokers"]] == [(1, 4, False),
                                                                                            (2, 2, True)]
    # The restored state behaves the same: epochs continue, stale epochs stay stale.
    assert register(back, 9) == 5
    with pytest.raises(StaleBrokerEpochError):
        back.producer_ids.generate_allocate(1, e1, back.registrations, 10, NOW)
    with pytest.raises(StaleBrokerEpochError):
        back.producer_ids.generate_allocate(3, e3, back.registrations, 10, NOW)
    assert allocate(back, 2, e2, 5) == (30, 5)


def test_snapshot_round_trip_brokers_but_no_blocks(state):
    register(state, 1)
    register(state, 2)
    recs = state.snapshot_records()
    assert not any(isinstance(r, AllocateProducerIdsRecord) for r in recs)
    assert ProducerIdCursorRecord(next_producer_id=0) in recs
    _round_trip(state)


def test_snapshot_round_trip_cursor_only_after_gap(state):
    state.replay(ProducerIdCursorRecord(next_producer_id=12345))
    recs = state.snapshot_records()
    assert ProducerIdCursorRecord(next_producer_id=12345) in recs
    back = _round_trip(state)
    assert back.producer_ids.next_producer_id == 12345 and back.producer_ids.latest is None


def test_snapshot_round_trip_after_gap_following_a_block(registered):
    allocate(registered, 1, 1, 10)
    registered.replay(ProducerIdCursorRecord(next_producer_id=1000))
    recs = registered.snapshot_records()
    assert block(0, 10, epoch=1) in recs
    assert ProducerIdCursorRecord(next_producer_id=1000) in recs
    back = _round_trip(registered)
    assert back.producer_ids.next_producer_id == 1000
    assert allocate(back, 1, 1, 10) == (1000, 10)


def test_snapshot_round_trip_no_cursor_when_latest_block_carries_it(registered):
    allocate(registered, 1, 1, 10)
    recs = registered.snapshot_records()
    assert not any(isinstance(r, ProducerIdCursorRecord) for r in recs)
    _round_trip(registered)


def test_snapshot_round_trip_epoch_cursor_above_registrations(state):
    register(state, 1)
    register(state, 2)
    heartbeat(state, 2, 2, shut_down=True)  # last epoch 2, only broker 1 (epoch 1) left
    back = _round_trip(state)
    assert back.registrations.last_epoch == 2
    assert register(back, 7) == 3


def test_snapshot_round_trip_at_exhaustion(registered):
    registered.replay(ProducerIdCursorRecord(next_producer_id=LONG_MAX - 10))
    allocate(registered, 1, 1, 10)
    back = _round_trip(registered)
    with pytest.raises(UnknownServerError, match="exhausted"):
        back.producer_ids.generate_allocate(1, 1, back.registrations, 1, NOW)


def _state_after(n_allocations: int) -> QuorumState:
    s = QuorumState()
    e1 = register(s, 1)
    e2 = register(s, 2)
    heartbeat(s, 2, e2, fence=True)
    for i in range(n_allocations):
        s.replay(block(i * 10, 10, broker_id=1, epoch=e1))
    return s


def test_snapshot_record_count_does_not_grow_with_allocations():
    small = _state_after(10).snapshot_records()
    large_state = _state_after(10_000)
    large = large_state.snapshot_records()
    assert len(small) == len(large) == 5  # block + 2 registrations + fence + epoch cursor
    assert large_state.producer_ids.next_producer_id == 100_000
    _round_trip(large_state)
