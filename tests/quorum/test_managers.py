"""Unit tests for quorum.managers' producer-id blocks: generate never mutates, replay is the only
mutation; allocation's validation, contiguity and disjointness, replay invariants, exhaustion.
Registration, heartbeats and QuorumState are in test_managers_registration.

Pure in-memory; no Raft, no network, no files.
"""
from __future__ import annotations

import pytest

from quorum.managers import DEFAULT_BLOCK_SIZE, INT32_MAX, Result
from records import AllocateProducerIdsRecord, ProducerIdCursorRecord, RegisterBrokerRecord
from records.schema import LONG_MAX
from records.wire.errors import Errors, InvalidRequestError, StaleBrokerEpochError, UnknownServerError
from tests.quorum.manager_steps import NOW, _refused, allocate, block, fingerprint, heartbeat, register
from tests.quorum.manager_steps import registered, state  # noqa: F401 (fixtures)


# --------------------------------------------------------------------------
# generate never mutates
# --------------------------------------------------------------------------


def test_generate_allocate_does_not_mutate(registered):
    before = fingerprint(registered)
    for _ in range(3):
        res = registered.producer_ids.generate_allocate(1, 1, registered.registrations, 100, NOW)
        assert isinstance(res, Result)
        assert res.response == (0, 100)  # same answer every time: nothing moved
    assert fingerprint(registered) == before
    assert registered.producer_ids.next_producer_id == 0
    assert registered.producer_ids.latest is None


def test_generate_register_does_not_mutate(state):
    before = fingerprint(state)
    for _ in range(3):
        res = state.registrations.generate_register(5, "inc", "h:1", NOW)
        assert res.response == 1
        assert res.records == [RegisterBrokerRecord(broker_id=5, incarnation_id="inc", broker_epoch=1,
                                                    listener="h:1", timestamp_ms=NOW)]
    assert fingerprint(state) == before
    assert state.registrations.brokers == {}
    assert state.registrations.last_epoch == 0


@pytest.mark.parametrize("fence,shut_down", [(True, False), (False, True), (True, True), (False, False)])
def test_generate_heartbeat_does_not_mutate(registered, fence, shut_down):
    before = fingerprint(registered)
    registered.registrations.generate_heartbeat(1, 1, fence, shut_down, NOW)
    assert fingerprint(registered) == before
    assert registered.registrations.brokers[1].fenced is False


def test_failed_generate_does_not_mutate(registered):
    before = fingerprint(registered)
    for call in (
        lambda: registered.producer_ids.generate_allocate(1, 99, registered.registrations, 10, NOW),
        lambda: registered.producer_ids.generate_allocate(2, 1, registered.registrations, 10, NOW),
        lambda: registered.producer_ids.generate_allocate(-1, 1, registered.registrations, 10, NOW),
        lambda: registered.producer_ids.generate_allocate(1, 1, registered.registrations, 0, NOW),
        lambda: registered.registrations.generate_register(-1, "x", "", NOW),
        lambda: registered.registrations.generate_heartbeat(1, 2, False, False, NOW),
    ):
        with pytest.raises((InvalidRequestError, StaleBrokerEpochError)):
            call()
    assert fingerprint(registered) == before


def test_replay_is_the_only_mutation(registered):
    res = registered.producer_ids.generate_allocate(1, 1, registered.registrations, 10, NOW)
    assert registered.producer_ids.next_producer_id == 0
    registered.replay(res.records[0])
    assert registered.producer_ids.next_producer_id == 10
    assert registered.producer_ids.latest == res.records[0]


# --------------------------------------------------------------------------
# allocate: validation
# --------------------------------------------------------------------------


def test_allocate_unregistered_broker_is_stale(state):
    with pytest.raises(StaleBrokerEpochError) as ei:
        state.producer_ids.generate_allocate(1, 1, state.registrations, 10, NOW)
    assert ei.value.code == Errors.STALE_BROKER_EPOCH
    assert "not registered" in str(ei.value)


@pytest.mark.parametrize("epoch", [0, 2, -1, LONG_MAX])
def test_allocate_wrong_epoch_is_stale(registered, epoch):
    with pytest.raises(StaleBrokerEpochError, match="does not match the registered epoch 1"):
        registered.producer_ids.generate_allocate(1, epoch, registered.registrations, 10, NOW)


def test_allocate_other_brokers_epoch_is_stale(registered):
    e2 = register(registered, 2)
    assert e2 == 2
    with pytest.raises(StaleBrokerEpochError):
        registered.producer_ids.generate_allocate(1, e2, registered.registrations, 10, NOW)
    with pytest.raises(StaleBrokerEpochError):
        registered.producer_ids.generate_allocate(2, 1, registered.registrations, 10, NOW)


@pytest.mark.parametrize("broker_id", [-1, -(2**31), INT32_MAX + 1, 2**63, LONG_MAX, True, False, "1", 1.0, None])
def test_absurd_broker_ids_are_invalid(registered, broker_id):
    with pytest.raises(InvalidRequestError) as ei:
        registered.producer_ids.generate_allocate(broker_id, 1, registered.registrations, 10, NOW)
    assert ei.value.code == Errors.INVALID_REQUEST
    with pytest.raises(InvalidRequestError):
        registered.registrations.generate_register(broker_id, "inc", "h:1", NOW)
    with pytest.raises(InvalidRequestError):
        registered.registrations.generate_heartbeat(broker_id, 1, False, False, NOW)


def test_extreme_valid_broker_ids(state):
    e0 = register(state, 0)
    emax = register(state, INT32_MAX)
    assert allocate(state, 0, e0, 5) == (0, 5)
    assert allocate(state, INT32_MAX, emax, 5) == (5, 5)


@pytest.mark.parametrize("size", [0, -1, INT32_MAX + 1, -(2**31)])
def test_allocate_bad_block_size_is_invalid(registered, size):
    with pytest.raises(InvalidRequestError, match="block size"):
        registered.producer_ids.generate_allocate(1, 1, registered.registrations, size, NOW)


def test_allocate_block_size_bounds_are_valid(registered):
    assert allocate(registered, 1, 1, 1) == (0, 1)
    assert allocate(registered, 1, 1, INT32_MAX) == (1, INT32_MAX)
    assert registered.producer_ids.next_producer_id == 1 + INT32_MAX


def test_allocate_record_content(registered):
    res = registered.producer_ids.generate_allocate(1, 1, registered.registrations, 250, NOW + 5)
    assert res.records == [AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=0,
                                                     producer_id_len=250, timestamp_ms=NOW + 5)]
    assert res.response == (0, 250)


def test_fenced_broker_can_still_allocate(registered):
    # Fencing is about client traffic; a fenced registration keeps its epoch.
    heartbeat(registered, 1, 1, fence=True)
    assert allocate(registered, 1, 1, 10) == (0, 10)


def test_unregistered_broker_cannot_allocate(registered):
    heartbeat(registered, 1, 1, shut_down=True)
    with pytest.raises(StaleBrokerEpochError, match="not registered"):
        registered.producer_ids.generate_allocate(1, 1, registered.registrations, 10, NOW)


# --------------------------------------------------------------------------
# allocate: contiguity, disjointness
# --------------------------------------------------------------------------


def test_consecutive_allocations_are_contiguous_and_disjoint(state):
    e1, e2 = register(state, 1), register(state, 2)
    sizes = [1, 7, 1000, 3, INT32_MAX, 12, 1]
    blocks = []
    for i, size in enumerate(sizes):
        broker, epoch = (1, e1) if i % 2 == 0 else (2, e2)
        blocks.append(allocate(state, broker, epoch, size))
    assert blocks[0][0] == 0
    for (s1, l1), (s2, _) in zip(blocks, blocks[1:]):
        assert s2 == s1 + l1  # contiguous, no overlap
    ranges = [range(s, s + n) for s, n in blocks]
    for i, a in enumerate(ranges):
        for b in ranges[i + 1:]:
            assert a.stop <= b.start or b.stop <= a.start
    assert state.producer_ids.next_producer_id == sum(sizes)


def test_generate_against_fork_then_replay_on_real_state(registered):
    # The proposer generates a whole batch against a scratch fork.
    scratch = registered.fork()
    batch = []
    for _ in range(3):
        res = scratch.producer_ids.generate_allocate(1, 1, scratch.registrations, 10, NOW)
        scratch.replay(res.records[0])
        batch.extend(res.records)
    assert registered.producer_ids.next_producer_id == 0
    outcomes = registered.apply_batch(batch)
    assert all(o.accepted for o in outcomes)
    assert [r.producer_id_start for r in batch] == [0, 10, 20]
    assert registered.summary() == scratch.summary()


# --------------------------------------------------------------------------
# replay invariants for blocks
# --------------------------------------------------------------------------


def test_replay_refuses_block_below_next(state):
    state.replay(block(100, 50))
    _refused(state, block(0, 10), "starts below the next producer ID 150")
    _refused(state, block(149, 1), "starts below")


def test_replay_refuses_block_nested_inside_earlier_one(state):
    state.replay(block(0, 1000))
    state.replay(block(1000, 1000))
    _refused(state, block(200, 10), "starts below")
    _refused(state, block(1500, 100), "starts below")


def test_replay_refuses_stale_duplicate_of_previous_block(state):
    prev = block(0, 10)
    state.replay(prev)
    state.replay(block(10, 10))
    _refused(state, block(10, 10), "starts below the next producer ID 20")
    _refused(state, prev, "starts below")
    assert state.producer_ids.latest == block(10, 10)


@pytest.mark.parametrize("length", [0, -1, -(2**31)])
def test_replay_refuses_non_positive_length(state, length):
    state.replay(block(0, 10))
    _refused(state, block(10, length), "is not positive")


def test_replay_refuses_overflow_past_long_max(state):
    _refused(state, block(LONG_MAX - 9, 10), "would pass the last producer ID")
    _refused(state, block(LONG_MAX, 1), "would pass the last producer ID")
    _refused(state, block(LONG_MAX - 1, INT32_MAX), "would pass")


def test_replay_allows_block_ending_exactly_at_long_max(state):
    state.replay(block(LONG_MAX - 10, 10))
    assert state.producer_ids.next_producer_id == LONG_MAX


def test_replay_allows_gaps(state):
    state.replay(block(0, 10))
    state.replay(block(500, 10))
    assert state.producer_ids.next_producer_id == 510
    state.replay(block(510, 10))  # and contiguous afterwards
    assert state.producer_ids.next_producer_id == 520


def test_replay_cursor(state):
    state.replay(block(0, 10))
    state.replay(ProducerIdCursorRecord(next_producer_id=10))  # equal is fine
    state.replay(ProducerIdCursorRecord(next_producer_id=5000))
    assert state.producer_ids.next_producer_id == 5000
    assert state.producer_ids.latest == block(0, 10)
    _refused(state, ProducerIdCursorRecord(next_producer_id=4999), "cursor 4999 is below the next producer ID 5000")
    _refused(state, ProducerIdCursorRecord(next_producer_id=-1), "below")
    _refused(state, block(4990, 5), "starts below")


def test_generate_after_gap_continues_from_cursor(registered):
    registered.replay(ProducerIdCursorRecord(next_producer_id=10**12))
    assert allocate(registered, 1, 1, 10) == (10**12, 10)


# --------------------------------------------------------------------------
# exhaustion
# --------------------------------------------------------------------------


def test_exhaustion_raises_unknown_server_error(registered):
    registered.replay(ProducerIdCursorRecord(next_producer_id=LONG_MAX - DEFAULT_BLOCK_SIZE + 1))
    before = fingerprint(registered)
    with pytest.raises(UnknownServerError) as ei:
        registered.producer_ids.generate_allocate(1, 1, registered.registrations, DEFAULT_BLOCK_SIZE, NOW)
    assert "exhausted" in str(ei.value)
    assert ei.value.code == Errors.UNKNOWN_SERVER_ERROR
    assert fingerprint(registered) == before
    # A smaller block still fits.
    assert allocate(registered, 1, 1, DEFAULT_BLOCK_SIZE - 1) == (LONG_MAX - DEFAULT_BLOCK_SIZE + 1,
                                                                  DEFAULT_BLOCK_SIZE - 1)


def test_block_ending_exactly_at_long_max_is_allowed_then_exhausted(registered):
    registered.replay(ProducerIdCursorRecord(next_producer_id=LONG_MAX - DEFAULT_BLOCK_SIZE))
    start, length = allocate(registered, 1, 1, DEFAULT_BLOCK_SIZE)
    assert (start, length) == (LONG_MAX - DEFAULT_BLOCK_SIZE, DEFAULT_BLOCK_SIZE)
    assert start + length - 1 == LONG_MAX - 1  # last ID issued
    assert registered.producer_ids.next_producer_id == LONG_MAX
    with pytest.raises(UnknownServerError, match="exhausted"):
        registered.producer_ids.generate_allocate(1, 1, registered.registrations, 1, NOW)


def test_cursor_at_long_max_exhausts_even_one_id(registered):
    registered.replay(ProducerIdCursorRecord(next_producer_id=LONG_MAX))
    with pytest.raises(UnknownServerError, match="exhausted"):
        registered.producer_ids.generate_allocate(1, 1, registered.registrations, 1, NOW)


def test_last_single_id_is_long_max_minus_one(registered):
    registered.replay(ProducerIdCursorRecord(next_producer_id=LONG_MAX - 1))
    assert allocate(registered, 1, 1, 1) == (LONG_MAX - 1, 1)
