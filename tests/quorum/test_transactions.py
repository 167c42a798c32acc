"""TransactionalIdManager: InitProducerId with KIP-360 epoch rules, generate/replay with no Raft."""
from __future__ import annotations

import pytest

from quorum.managers import EPOCH_EXHAUSTED, QuorumState, TxnSettings
from records import AllocateProducerIdsRecord, RemoveTransactionalIdRecord, TransactionalIdRecord
from records.wire.errors import (
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvariantViolation,
    ProducerFencedError,
    StaleBrokerEpochError,
)

NOW = 1_700_000_000_000
DAY = 24 * 3600 * 1000


@pytest.fixture
def state() -> QuorumState:
    s = QuorumState()
    for rec in s.registrations.generate_register(1, "inc-1", "h:1", NOW).records:
        s.replay(rec)
    for rec in s.registrations.generate_register(2, "inc-2", "h:2", NOW).records:
        s.replay(rec)
    # broker 1 already holds a block, so transactional PIDs come after it
    for rec in s.producer_ids.generate_allocate(1, 1, s.registrations, 1000, NOW).records:
        s.replay(rec)
    return s


def init(state: QuorumState, tid: str = "tx", pid: int = -1, epoch: int = -1, *, broker: int = 1,
         now: int = NOW, timeout: int = 60_000, settings: TxnSettings = TxnSettings(), apply: bool = True):
    broker_epoch = state.registrations.brokers[broker].broker_epoch
    res = state.transactions.generate_init(broker, broker_epoch, tid, timeout, pid, epoch,
                                           registrations=state.registrations, producer_ids=state.producer_ids,
                                           now_ms=now, settings=settings)
    if apply:
        outcomes = state.apply_batch(res.records)
        assert all(o.accepted for o in outcomes), outcomes
    return res


def test_first_init_takes_a_fresh_one_id_block_with_epoch_zero(state):
    res = init(state)
    assert res.response[:2] == (1000, 0)
    alloc, txn = res.records
    assert isinstance(alloc, AllocateProducerIdsRecord)
    assert (alloc.broker_id, alloc.producer_id_start, alloc.producer_id_len) == (1, 1000, 1)
    assert isinstance(txn, TransactionalIdRecord)
    assert (txn.producer_id, txn.producer_epoch, txn.last_producer_id, txn.last_producer_epoch) == (1000, 0, -1, -1)
    assert state.producer_ids.next_producer_id == 1001
    # the next ordinary block does not overlap the transactional PID
    assert state.producer_ids.generate_allocate(2, 2, state.registrations, 1000, NOW).response == (1001, 1000)


def test_new_instance_bumps_the_epoch_and_fences_the_old_one(state):
    init(state)
    res = init(state, broker=2)  # a second producer, through another broker
    assert res.response[:2] == (1000, 1)
    # The fenced first instance asks again with its (pid, epoch 0): fenced, not taken for a retry
    # (a new instance's bump does not remember the epoch it replaced, as in Kafka).
    with pytest.raises(ProducerFencedError):
        init(state, pid=1000, epoch=0)
    assert state.transactions.get("tx").producer_epoch == 1


def test_bump_by_the_current_instance_and_its_retry(state):
    init(state)
    bumped = init(state, pid=1000, epoch=0)
    assert bumped.response[:2] == (1000, 1)
    retry = init(state, pid=1000, epoch=0)  # the response was lost; same request again
    assert retry.response[:2] == (1000, 1)
    assert retry.records == []  # nothing bumped twice
    assert state.transactions.get("tx").producer_epoch == 1


def test_unknown_producer_for_existing_mapping_is_fenced(state):
    init(state)
    with pytest.raises(ProducerFencedError, match="not the current producer"):
        init(state, pid=424242, epoch=0)
    with pytest.raises(ProducerFencedError):
        init(state, pid=1000, epoch=7)  # an epoch from the future


def test_exhausted_epoch_rotates_to_a_new_producer_id(state):
    init(state)
    state.replay(TransactionalIdRecord(transactional_id="tx", producer_id=1000, producer_epoch=EPOCH_EXHAUSTED,
                                       last_producer_id=1000, last_producer_epoch=EPOCH_EXHAUSTED - 1,
                                       timeout_ms=60_000, update_time_ms=NOW))
    res = init(state, pid=1000, epoch=EPOCH_EXHAUSTED)
    assert res.response[:2] == (1001, 0)
    txn = state.transactions.get("tx")
    assert (txn.last_producer_id, txn.last_producer_epoch) == (1000, EPOCH_EXHAUSTED)
    # the retry of the rotation is recognised through the previous producer id
    assert init(state, pid=1000, epoch=EPOCH_EXHAUSTED, apply=False).response[:2] == (1001, 0)
    assert init(state, pid=1001, epoch=0).response[:2] == (1001, 1)


def test_epoch_never_reaches_short_max(state):
    init(state)
    state.replay(TransactionalIdRecord(transactional_id="tx", producer_id=1000, producer_epoch=EPOCH_EXHAUSTED - 1,
                                       timeout_ms=60_000, update_time_ms=NOW))
    assert init(state).response[:2] == (1000, EPOCH_EXHAUSTED)
    assert init(state).response[:2] == (1001, 0)
    with pytest.raises(InvariantViolation):
        state.replay(TransactionalIdRecord(transactional_id="tx", producer_id=1001, producer_epoch=2**15 - 1,
                                           timeout_ms=60_000, update_time_ms=NOW))


def test_expired_mapping_gives_a_new_producer_id(state):
    settings = TxnSettings(expiration_ms=DAY)
    init(state, settings=settings)
    later = NOW + DAY + 1
    res = init(state, pid=1000, epoch=0, now=later, settings=settings)
    assert res.response[:2] == (1001, 0)
    assert isinstance(res.records[0], RemoveTransactionalIdRecord)
    # just inside the window: a bump, not a new id
    init(state, tid="other", settings=settings, now=later)
    assert init(state, tid="other", now=later + DAY, settings=settings).response[1] == 1


def test_other_expired_ids_are_swept_by_later_inits(state):
    settings = TxnSettings(expiration_ms=DAY)
    for i in range(5):
        init(state, tid=f"old-{i}", settings=settings)
    assert len(state.transactions) == 5
    init(state, tid="fresh", now=NOW + 2 * DAY, settings=settings)
    assert len(state.transactions) == 1
    assert state.transactions.get("fresh") is not None


@pytest.mark.parametrize("pid,epoch", [(-1, 0), (5, -1)])
def test_only_one_of_pid_and_epoch_is_invalid_request(state, pid, epoch):
    with pytest.raises(InvalidRequestError, match="both"):
        init(state, pid=pid, epoch=epoch)


@pytest.mark.parametrize("timeout", [0, -1, 15 * 60 * 1000 + 1, True, "60000"])
def test_bad_timeout(state, timeout):
    with pytest.raises(InvalidTransactionTimeoutError):
        init(state, timeout=timeout)


@pytest.mark.parametrize("tid", ["", None, 7, "x" * 32768])
def test_bad_transactional_id(state, tid):
    with pytest.raises(InvalidRequestError):
        init(state, tid=tid)


@pytest.mark.parametrize("pid,epoch", [(-2, 0), (0, -2), (0, 2**15), (2**63, 0), (True, 0)])
def test_absurd_pid_or_epoch(state, pid, epoch):
    with pytest.raises(InvalidRequestError):
        init(state, pid=pid, epoch=epoch)


def test_stale_broker_epoch(state):
    with pytest.raises(StaleBrokerEpochError):
        state.transactions.generate_init(1, 99, "tx", 60_000, -1, -1, registrations=state.registrations,
                                         producer_ids=state.producer_ids, now_ms=NOW)


def test_generate_changes_nothing(state):
    init(state)
    before = state.snapshot_records()
    init(state, apply=False)
    init(state, tid="new", apply=False)
    assert state.snapshot_records() == before


def test_replay_refuses_epoch_going_back_or_repeating(state):
    init(state)
    init(state)  # epoch 1
    for epoch in (0, 1):
        with pytest.raises(InvariantViolation, match="does not move past"):
            state.replay(TransactionalIdRecord(transactional_id="tx", producer_id=1000, producer_epoch=epoch,
                                               timeout_ms=1, update_time_ms=NOW))


def test_replay_refuses_a_producer_id_never_allocated(state):
    with pytest.raises(InvariantViolation, match="never allocated"):
        state.replay(TransactionalIdRecord(transactional_id="tx", producer_id=5000, producer_epoch=0,
                                           timeout_ms=1, update_time_ms=NOW))


def test_replay_refuses_removing_an_unknown_or_replaced_mapping(state):
    init(state)
    with pytest.raises(InvariantViolation):
        state.replay(RemoveTransactionalIdRecord(transactional_id="nope", producer_id=1000))
    with pytest.raises(InvariantViolation):
        state.replay(RemoveTransactionalIdRecord(transactional_id="tx", producer_id=1))


def test_two_inits_generated_in_one_batch_see_each_other(state):
    """The proposer generates a batch against one fork: the second sees the first."""
    scratch = state.fork()
    first = init(scratch)
    second = init(scratch, broker=2)
    assert first.response[:2] == (1000, 0) and second.response[:2] == (1000, 1)
    assert len(state.transactions) == 0  # the real state is untouched by the fork
    outcomes = state.apply_batch(first.records + second.records)
    assert all(o.accepted for o in outcomes)
    assert state.transactions.get("tx").producer_epoch == 1


def test_fork_removal_does_not_touch_the_parent(state):
    settings = TxnSettings(expiration_ms=DAY)
    init(state, settings=settings)
    scratch = state.fork()
    init(scratch, tid="x", now=NOW + 2 * DAY, settings=settings)
    assert scratch.transactions.get("tx") is None
    assert state.transactions.get("tx") is not None


def test_snapshot_round_trip_keeps_transactional_ids(state):
    init(state)
    init(state, tid="b")
    init(state)
    back = QuorumState.from_records(state.snapshot_records())
    assert back.transactions == state.transactions
    assert back.transactions.get("tx").producer_epoch == 1
    assert back.summary()["transactional_ids"] == 2


def test_expiry_takes_the_oldest_idle_ids_first_and_at_most_a_batch(state):
    from quorum.managers.transactions import EXPIRE_PER_BATCH
    settings = TxnSettings(expiration_ms=DAY)
    n = EXPIRE_PER_BATCH + 10
    for i in range(n):
        init(state, tid=f"old-{i:03}", now=NOW + i, settings=settings)
    init(state, tid="old-000", pid=state.transactions.get("old-000").producer_id, epoch=0, now=NOW + n,
         settings=settings)  # a bump: old-000 is now the newest
    res = init(state, tid="fresh", now=NOW + DAY + n, settings=settings)
    removed = [r.transactional_id for r in res.records if isinstance(r, RemoveTransactionalIdRecord)]
    assert removed == [f"old-{i:03}" for i in range(1, EXPIRE_PER_BATCH + 1)]
    res = init(state, tid="fresh-2", now=NOW + DAY + n, settings=settings)
    removed = [r.transactional_id for r in res.records if isinstance(r, RemoveTransactionalIdRecord)]
    assert removed == [f"old-{i:03}" for i in range(EXPIRE_PER_BATCH + 1, n)]  # old-000 is not idle long enough


def test_expiry_of_an_id_created_again_in_the_same_millisecond_is_one_removal(state):
    settings = TxnSettings(expiration_ms=DAY)
    init(state, tid="a", settings=settings)
    init(state, tid="b", now=NOW + DAY + 1, settings=settings)  # removes a
    assert state.transactions.get("a") is None
    init(state, tid="a", settings=settings)  # the same update time as the entry removed
    res = init(state, tid="c", now=NOW + 3 * DAY, settings=settings)
    removed = [r.transactional_id for r in res.records if isinstance(r, RemoveTransactionalIdRecord)]
    assert sorted(removed) == ["a", "b"]
    assert state.transactions.get("a") is None and state.transactions.get("c") is not None


def test_a_fork_expires_from_its_base_without_changing_it(state):
    settings = TxnSettings(expiration_ms=DAY)
    for i in range(3):
        init(state, tid=f"old-{i}", settings=settings)
    scratch = state.fork()
    # the fork updates old-0 (no longer idle there) and expires the others, twice over: the second init
    # finds them removed in the fork
    init(scratch, tid="old-0", pid=state.transactions.get("old-0").producer_id, epoch=0, now=NOW + DAY + 5,
         settings=settings)
    assert scratch.transactions.get("old-1") is None and scratch.transactions.get("old-0") is not None
    res = init(scratch, tid="x", now=NOW + DAY + 6, settings=settings)
    assert not any(isinstance(r, RemoveTransactionalIdRecord) for r in res.records)
    assert all(state.transactions.get(f"old-{i}") is not None for i in range(3))
    res = init(state, tid="y", now=NOW + DAY + 6, settings=settings)
    removed = sorted(r.transactional_id for r in res.records if isinstance(r, RemoveTransactionalIdRecord))
    assert removed == ["old-0", "old-1", "old-2"]


def test_expiry_looks_at_a_bounded_number_of_ids_however_many_exist(state, monkeypatch):
    from quorum.managers import transactions as mod
    settings = TxnSettings(expiration_ms=DAY)
    for i in range(2000):
        init(state, tid=f"id-{i}", now=NOW + DAY // 2, settings=settings)
    looked = []
    real = mod.TransactionalIdManager.txn

    def counting(self, tid):
        looked.append(tid)
        return real(self, tid)
    monkeypatch.setattr(mod.TransactionalIdManager, "txn", counting)
    init(state, tid="new", now=NOW + DAY, settings=settings)  # nothing is idle long enough
    assert len(looked) <= 2
    looked.clear()
    res = init(state, tid="newer", now=NOW + 2 * DAY, settings=settings)  # every one is
    assert sum(isinstance(r, RemoveTransactionalIdRecord) for r in res.records) == mod.EXPIRE_PER_BATCH
    assert len(looked) <= mod.EXPIRE_LOOK + 2
