"""ProducerIdsManager.generate_seed / replay: the ZooKeeper migration seed, with no Raft running."""
from __future__ import annotations

import pytest

from quorum.managers import QuorumState
from records import LONG_MAX, ProducerIdCursorRecord, ProducerIdSeedRecord
from records.wire.errors import InvalidRequestError, InvariantViolation

NOW = 1_700_000_000_000


def seed(state: QuorumState, block_end: int, block_start: int | None = None, apply: bool = True):
    start = block_end - 999 if block_start is None else block_start
    res = state.producer_ids.generate_seed(block_end + 1, "export:zk.json", 35, start, block_end, NOW)
    if apply:
        assert all(o.accepted for o in state.apply_batch(res.records))
    return res


def allocate(state: QuorumState) -> tuple[int, int]:
    res = state.producer_ids.generate_allocate(1, 1, state.registrations, 1000, NOW)
    state.apply_batch(res.records)
    return res.response


def test_seed_makes_the_next_block_start_after_zookeepers_last_block(state):
    res = seed(state, block_end=4999, block_start=4000)
    assert res.response == (True, 5000)
    (rec,) = res.records
    assert isinstance(rec, ProducerIdSeedRecord)
    assert (rec.zk_block_start, rec.zk_block_end, rec.zk_broker, rec.origin) == (4000, 4999, 35, "export:zk.json")
    assert allocate(state) == (5000, 1000)  # not 4000: KAFKA-15552 issued that block twice


def test_seeding_twice_is_harmless(state):
    seed(state, 4999)
    again = seed(state, 4999)
    assert again.records == [] and again.response == (False, 5000)
    assert allocate(state)[0] == 5000


def test_seed_below_what_the_quorum_issued_changes_nothing(state):
    seed(state, 4999)
    allocate(state)  # [5000, 6000)
    res = seed(state, 5499)
    assert res.records == [] and res.response == (False, 6000)
    assert allocate(state)[0] == 6000


def test_a_higher_seed_moves_the_cursor_up_over_a_gap(state):
    seed(state, 4999)  # a fresh quorum seeded: IDs from 5000
    allocate(state)  # [5000, 6000), all above the first seed
    assert seed(state, 999_999).response == (True, 1_000_000)  # a re-migration after a rollback
    assert allocate(state)[0] == 1_000_000


def test_replay_never_moves_the_cursor_back(state):
    seed(state, 4999)
    with pytest.raises(InvariantViolation, match="below the next producer ID"):
        state.replay(ProducerIdSeedRecord(next_producer_id=100, origin="x", zk_broker=1, zk_block_start=0,
                                          zk_block_end=99))
    assert state.producer_ids.next_producer_id == 5000


@pytest.mark.parametrize("next_id,start,end,origin", [
    (5000, 4000, 5000, "o"),        # next is not block_end + 1 (the KAFKA-15552 mistake would be 4000)
    (4000, 4000, 4999, "o"),        # seeding the block's start
    (5000, 5000, 4999, "o"),        # end < start
    (0, -1, -1, "o"),               # negative
    (LONG_MAX + 1, 0, LONG_MAX, "o"),  # beyond Long.MAX
    (5000, 4000, 4999, ""),         # no origin
    (True, 0, 0, "o"),              # a bool is not an int
])
def test_bad_seeds_are_invalid_requests(state, next_id, start, end, origin):
    with pytest.raises(InvalidRequestError):
        state.producer_ids.generate_seed(next_id, origin, 35, start, end, NOW)
    assert state.producer_ids.next_producer_id == 0


def test_seed_survives_a_snapshot(state):
    seed(state, 4999)
    recs = state.snapshot_records()
    assert ProducerIdCursorRecord(next_producer_id=5000) in recs
    back = QuorumState.from_records(recs)
    assert back.producer_ids.next_producer_id == 5000
