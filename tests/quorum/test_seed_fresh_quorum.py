"""Only a fresh quorum may be seeded from ZooKeeper (issue 38): what the quorum issued before its first
seed is replicated state (ProducerIdsManager), checked by generate_seed and again by replay, and kept
across snapshots.  No Raft running."""
from __future__ import annotations

import pytest

from quorum.managers import QuorumState, seed_overlap
from records import (
    AllocateProducerIdsRecord,
    ProducerIdCursorRecord,
    ProducerIdHistoryRecord,
    ProducerIdSeedRecord,
    decode_batch,
    encode_batch,
)
from records.wire.errors import InvalidRequestError, InvariantViolation

NOW = 1_700_000_000_000


def seed(state: QuorumState, block_end: int):
    res = state.producer_ids.generate_seed(block_end + 1, "export:zk.json", 35, max(0, block_end - 999), block_end,
                                           NOW)
    outcomes = state.apply_batch(res.records)
    assert all(o.accepted for o in outcomes), outcomes
    return res.response


def allocate(state: QuorumState, n: int = 1) -> list[int]:
    starts = []
    for _ in range(n):
        res = state.producer_ids.generate_allocate(1, 1, state.registrations, 1000, NOW)
        assert all(o.accepted for o in state.apply_batch(res.records))
        starts.append(res.response[0])
    return starts


def seed_record(block_end: int) -> ProducerIdSeedRecord:
    return ProducerIdSeedRecord(next_producer_id=block_end + 1, origin="export:zk.json", zk_broker=35,
                                zk_block_start=max(0, block_end - 999), zk_block_end=block_end, timestamp_ms=NOW)


def restored(state: QuorumState) -> QuorumState:
    """The state a node restores from this state's snapshot (through the codec, as on disk)."""
    return QuorumState.from_records(decode_batch(encode_batch(state.snapshot_records())))


# ---------------------------------------------------------------- the refusal
def test_a_quorum_that_issued_ids_before_its_seed_refuses_a_zookeeper_range_over_them(state):
    allocate(state, 3)  # [0, 3000), as `pidctl demo` leaves it
    with pytest.raises(InvalidRequestError) as e:
        state.producer_ids.generate_seed(100_000, "export:zk.json", 35, 99_000, 99_999, NOW)
    assert str(e.value.message) == ("the quorum already issued producer IDs 0..2999, which overlap ZooKeeper's "
                                    "range 0..99999; seed only a fresh quorum (docs/migration.md)")
    assert state.producer_ids.next_producer_id == 3000 and not state.producer_ids.seeded


def test_a_seed_below_what_the_quorum_issued_before_it_is_refused_not_ignored(state):
    allocate(state, 6)  # [0, 6000): ZooKeeper's 0..4999 are among them
    with pytest.raises(InvalidRequestError, match=r"issued producer IDs 0\.\.5999, which overlap ZooKeeper's "
                                                  r"range 0\.\.4999"):
        state.producer_ids.generate_seed(5000, "export:zk.json", 35, 4000, 4999, NOW)


def test_replay_applies_a_committed_seed_even_over_earlier_ids(state):
    # The leader refuses the overlapping seed (generate_seed); once committed (an older leader let it
    # through) every replica applies it alike, or one that infers its history from an old snapshot would
    # keep a lower cursor than its peers.
    allocate(state, 3)
    (outcome,) = state.apply_batch([seed_record(99_999)])
    assert outcome.accepted, outcome.error
    assert state.producer_ids.next_producer_id == 100_000
    assert state.producer_ids.history() == {"lowest": 0, "before_seed": True, "seeded": True}
    with pytest.raises(InvalidRequestError, match=r"0\.\.2999, which overlap ZooKeeper's range 0\.\.99999"):
        state.producer_ids.generate_seed(100_000, "export:zk.json", 35, 99_000, 99_999, NOW)


def test_a_replica_with_an_inferred_history_applies_the_seed_its_peers_apply():
    # Peer A replayed the whole log (seeded, then issued above the seed); peer B was restored from a
    # snapshot written before the history record existed (a block, no history: inferred "issued from 0").
    # A higher seed after a rollback is accepted by A's proposer; B must move its cursor just as A does.
    a = QuorumState()
    a.apply_batch(a.registrations.generate_register(1, "inc-1", "h:1", NOW).records)
    a.apply_batch([seed_record(99_999)])
    a.apply_batch([AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=100_000,
                                             producer_id_len=1000)])
    old_snapshot = [r for r in a.snapshot_records() if not isinstance(r, ProducerIdHistoryRecord)]
    b = QuorumState.from_records(old_snapshot)
    assert b.producer_ids.history() == {"lowest": 0, "before_seed": True, "seeded": False}
    later = a.producer_ids.generate_seed(500_000, "export:zk.json", 35, 499_000, 499_999, NOW).records
    assert later  # A knows every ID it issued lies above the first seed
    for s in (a, b):
        (outcome,) = s.apply_batch(later)
        assert outcome.accepted, outcome.error
    assert a.producer_ids.next_producer_id == b.producer_ids.next_producer_id == 500_000
    with pytest.raises(InvalidRequestError):  # B, leading, is stricter: it refuses any further seed
        b.producer_ids.generate_seed(600_000, "export:zk.json", 35, 599_000, 599_999, NOW)


def test_ids_issued_before_the_seed_but_above_zookeepers_range_do_not_overlap(state):
    state.replay(ProducerIdCursorRecord(next_producer_id=1_000_000))  # e.g. a gap left by an earlier reservation
    allocate(state)  # [1_000_000, 1_001_000)
    assert seed(state, 4999) == (False, 1_001_000)  # ZooKeeper's 0..4999 are all below: nothing to do
    with pytest.raises(InvalidRequestError, match=r"1000000\.\.1000999, which overlap ZooKeeper's range 0\.\.1000000"):
        state.producer_ids.generate_seed(1_000_001, "o", 35, 999_001, 1_000_000, NOW)


# ---------------------------------------------------------------- what is still accepted
def test_a_fresh_quorum_is_seeded_and_the_same_seed_again_changes_nothing(state):
    assert state.producer_ids.history() == {"lowest": None, "before_seed": False, "seeded": False}
    assert seed(state, 4999) == (True, 5000)
    assert allocate(state, 2) == [5000, 6000]
    assert state.producer_ids.history() == {"lowest": 5000, "before_seed": False, "seeded": True}
    assert seed(state, 4999) == (False, 7000)  # the runbook's step 3 run again: accepted, nothing committed


def test_after_a_rollback_a_higher_seed_still_moves_the_cursor_up(state):
    seed(state, 4999)
    allocate(state)  # [5000, 6000), then a rollback: ZooKeeper goes on above a placeholder
    assert seed(state, 999_999) == (True, 1_000_000)
    assert allocate(state) == [1_000_000]


def test_seed_overlap_names_both_ranges():
    assert seed_overlap(None, False, None, 10) is None
    assert seed_overlap(0, False, 99, 10) is None  # everything issued after a seed
    assert seed_overlap(11, True, 99, 10) is None
    assert seed_overlap(10, True, 99, 10).startswith("the quorum already issued producer IDs 10..99, which overlap "
                                                     "ZooKeeper's range 0..10;")


# ---------------------------------------------------------------- snapshots
@pytest.mark.parametrize("build,history", [
    (lambda s: None, {"lowest": None, "before_seed": False, "seeded": False}),
    (lambda s: seed(s, 4999), {"lowest": None, "before_seed": False, "seeded": True}),
    (lambda s: (seed(s, 4999), allocate(s, 2)), {"lowest": 5000, "before_seed": False, "seeded": True}),
    (lambda s: allocate(s, 3), {"lowest": 0, "before_seed": True, "seeded": False}),
    (lambda s: (s.replay(ProducerIdCursorRecord(next_producer_id=7000)), allocate(s)),
     {"lowest": 7000, "before_seed": True, "seeded": False}),
], ids=["fresh", "seeded", "seeded-then-issued", "issued-from-0", "issued-above-a-gap"])
def test_the_history_survives_a_snapshot(state, build, history):
    build(state)
    assert state.producer_ids.history() == history
    back = restored(state)
    assert back.producer_ids.history() == history
    assert back.snapshot_records() == state.snapshot_records()


def test_the_history_record_is_written_only_when_it_says_more_than_its_absence(state):
    allocate(state, 3)  # issued from 0 before any seed: what a snapshot without the record is read as
    assert not any(isinstance(r, ProducerIdHistoryRecord) for r in state.snapshot_records())
    seed_state = QuorumState()
    seed(seed_state, 4999)
    assert ProducerIdHistoryRecord(lowest_issued=-1, issued_before_seed=False, seeded=True) in (
        seed_state.snapshot_records())


def test_an_old_snapshot_with_a_block_is_read_conservatively(state):
    # Written before the record existed: the latest block only.  Its earlier blocks are unknown, so the
    # quorum is taken to have issued from 0 before any seed.
    old = [AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=50_000, producer_id_len=1000),
           *state.registrations.snapshot_records()]
    back = QuorumState.from_records(old)
    assert back.producer_ids.history() == {"lowest": 0, "before_seed": True, "seeded": False}
    with pytest.raises(InvalidRequestError, match=r"0\.\.50999, which overlap ZooKeeper's range 0\.\.99999"):
        back.producer_ids.generate_seed(100_000, "o", 35, 99_000, 99_999, NOW)


def test_an_old_snapshot_without_a_block_is_fresh(state):
    back = QuorumState.from_records([ProducerIdCursorRecord(next_producer_id=0),
                                     *state.registrations.snapshot_records()])
    assert back.producer_ids.history() == {"lowest": None, "before_seed": False, "seeded": False}
    assert seed(back, 4999) == (True, 5000)


@pytest.mark.parametrize("records,problem", [
    ([ProducerIdHistoryRecord(lowest_issued=0, issued_before_seed=True, seeded=False)], "without any block"),
    ([AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=5000, producer_id_len=10),
      ProducerIdHistoryRecord(lowest_issued=6000, issued_before_seed=False, seeded=True)], "not in 0..5000"),
    ([AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=5000, producer_id_len=10),
      ProducerIdHistoryRecord(lowest_issued=-1, issued_before_seed=False, seeded=True)], "not in 0..5000"),
    ([AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=5000, producer_id_len=10),
      ProducerIdHistoryRecord(lowest_issued=5000, issued_before_seed=False, seeded=False)], "neither before"),
])
def test_a_history_record_that_contradicts_the_blocks_is_refused(records, problem):
    state = QuorumState()
    *before, history = records
    for rec in before:
        state.replay(rec)
    with pytest.raises(InvariantViolation, match=problem):
        state.replay(history)


def test_log_replay_and_snapshot_restore_agree():
    # A log as the proposer writes it: a registration, blocks from 0, an overlapping seed an older node let
    # through (applied on replay, as every replica must), more blocks.  Replayed from the start, or restored from a snapshot
    # taken at the end, the node knows the same history.
    live = QuorumState()
    log = [live.registrations.generate_register(1, "inc-1", "h:1", NOW).records]
    live.apply_batch(log[-1])
    for rec_batch in ([AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=0, producer_id_len=1000)],
                      [seed_record(99_999)],
                      [AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=100_000,
                                                 producer_id_len=1000)]):
        log.append(rec_batch)
        live.apply_batch(rec_batch)
    replayed = QuorumState()
    for batch in log:
        replayed.apply_batch(decode_batch(encode_batch(batch)))
    expected = {"lowest": 0, "before_seed": True, "seeded": True}
    assert live.producer_ids.history() == replayed.producer_ids.history() == restored(live).producer_ids.history() \
        == expected
    assert replayed.producer_ids.next_producer_id == 101_000
