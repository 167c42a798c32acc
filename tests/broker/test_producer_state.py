"""Unit tests for broker.producer_state: Kafka's idempotence rules, several batches in one request,
expiry.  Snapshots and recovery from the log are in test_producer_state_snapshots, the arrays against a
plain model in test_producer_state_model."""
from __future__ import annotations

from broker.producer_state import MAX_CACHED_BATCHES, Action, ProducerStateManager
from broker.recordbatch import INT32_MAX
from records.wire.errors import Errors
from tests.broker.producer_batches import DAY, NOW, Sim, hdr, plain


# ------------------------------------------------------------------ the rules

def test_non_idempotent_batches_are_always_appended():
    s = Sim()
    for _ in range(3):
        s.append(plain(2))
    assert len(s.m) == 0


def test_unknown_producer_is_accepted_at_sequence_zero_and_at_any_sequence():
    m = ProducerStateManager()
    assert m.check(hdr(7, 0, 0)).action is Action.APPEND
    # KIP-360 (Kafka >= 2.5): state may have expired while the producer lived on.
    assert m.check(hdr(7, 0, 123)).action is Action.APPEND
    assert m.check(hdr(7, 3, INT32_MAX)).action is Action.APPEND


def test_in_sequence_batches_are_appended_and_gaps_refused():
    s = Sim()
    s.append(hdr(1, 0, 0, n=3))  # sequences 0..2
    assert s.m.get(1).last_seq == 2
    assert s.m.check(hdr(1, 0, 3)).action is Action.APPEND
    gap = s.m.check(hdr(1, 0, 4))
    assert (gap.action, gap.error) == (Action.ERROR, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert "expected 3" in gap.message
    back = s.m.check(hdr(1, 0, 1))  # overlaps, not a cached batch
    assert back.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_duplicate_of_a_cached_batch_answers_the_original_offsets():
    s = Sim()
    s.append(plain(10))  # other traffic first, so offsets are not sequences
    firsts = [s.append(hdr(1, 0, seq, n=2)) for seq in range(0, 10, 2)]
    for seq, first in zip(range(0, 10, 2), firsts):
        d = s.m.check(hdr(1, 0, seq, n=2))
        assert (d.action, d.error, d.first_offset, d.last_offset) == (Action.DUPLICATE, Errors.NONE, first, first + 1)


def test_same_first_sequence_with_a_different_length_is_not_a_duplicate():
    s = Sim()
    s.append(hdr(1, 0, 0, n=2))
    assert s.m.check(hdr(1, 0, 0, n=3)).error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_only_the_last_five_batches_are_cached():
    s = Sim()
    for seq in range(6):
        s.append(hdr(1, 0, seq))
    assert [b.first_seq for b in s.m.get(1).batches] == [1, 2, 3, 4, 5]
    assert MAX_CACHED_BATCHES == 5
    oldest = s.m.check(hdr(1, 0, 0))  # the 6th-oldest batch, retried
    assert (oldest.action, oldest.error) == (Action.ERROR, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert s.m.check(hdr(1, 0, 1)).action is Action.DUPLICATE


def test_older_epoch_is_fenced_even_for_a_cached_sequence():
    s = Sim()
    s.append(hdr(1, 5, 0))
    d = s.m.check(hdr(1, 4, 0))
    assert (d.action, d.error) == (Action.ERROR, Errors.INVALID_PRODUCER_EPOCH)
    assert "epoch 4" in d.message and "5" in d.message
    assert s.m.check(hdr(1, 4, 1)).error == Errors.INVALID_PRODUCER_EPOCH


def test_epoch_bump_must_restart_at_zero_and_resets_the_cache():
    s = Sim()
    for seq in range(3):
        s.append(hdr(1, 0, seq))
    bad = s.m.check(hdr(1, 1, 3))
    assert bad.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER and "sequence 0" in bad.message
    s.append(hdr(1, 1, 0))
    e = s.m.get(1)
    assert e.epoch == 1 and [b.first_seq for b in e.batches] == [0]
    assert s.m.check(hdr(1, 0, 2)).error == Errors.INVALID_PRODUCER_EPOCH  # retry from the old epoch
    assert s.m.check(hdr(1, 1, 0)).action is Action.DUPLICATE
    assert s.m.check(hdr(1, 1, 1)).action is Action.APPEND


def test_sequence_wraps_from_int32_max_to_zero():
    s = Sim()
    s.append(hdr(1, 0, INT32_MAX - 1, n=2))  # MAX-1, MAX
    assert s.m.get(1).last_seq == INT32_MAX
    assert s.m.check(hdr(1, 0, 0)).action is Action.APPEND
    assert s.m.check(hdr(1, 0, INT32_MAX)).error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    s.append(hdr(1, 0, 0, n=3))
    assert s.m.check(hdr(1, 0, 3)).action is Action.APPEND
    # a batch that itself wraps: MAX, 0, 1
    t = Sim()
    t.append(hdr(2, 0, INT32_MAX - 3, n=3))  # MAX-3..MAX-1
    t.append(hdr(2, 0, INT32_MAX, n=3))
    assert t.m.get(2).last_seq == 1
    assert t.m.check(hdr(2, 0, INT32_MAX, n=3)).action is Action.DUPLICATE
    assert t.m.check(hdr(2, 0, 2)).action is Action.APPEND


def test_producers_are_independent():
    s = Sim()
    s.append(hdr(1, 0, 0))
    s.append(hdr(2, 3, 0))
    assert s.m.check(hdr(1, 0, 1)).action is Action.APPEND
    assert s.m.check(hdr(2, 3, 1)).action is Action.APPEND
    assert s.m.check(hdr(2, 0, 1)).error == Errors.INVALID_PRODUCER_EPOCH
    assert s.m.check(hdr(3, 0, 9)).action is Action.APPEND


def test_check_does_not_change_the_state():
    s = Sim()
    s.append(hdr(1, 0, 0))
    before = s.m.producers()
    for h in (hdr(1, 0, 1), hdr(1, 1, 0), hdr(9, 0, 0), hdr(1, 0, 0)):
        s.m.check(h)
    s.m.check_all([hdr(1, 0, 1), hdr(1, 0, 2), hdr(1, 1, 0), hdr(5, 0, 0)], next_offset=s.end)
    assert s.m.producers() == before


# ------------------------------------------------------------------ several batches in one request

def test_check_all_sees_earlier_batches_of_the_same_request():
    m = ProducerStateManager()
    ds = m.check_all([hdr(1, 0, 0, n=2), hdr(1, 0, 2), hdr(1, 0, 4)], next_offset=100)
    assert [d.action for d in ds] == [Action.APPEND, Action.APPEND, Action.ERROR]
    assert ds[2].error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER and "expected 3" in ds[2].message


def test_check_all_duplicate_within_the_request_gets_the_offsets_it_will_have():
    m = ProducerStateManager()
    ds = m.check_all([plain(3), hdr(1, 0, 0, n=2), hdr(1, 0, 0, n=2)], next_offset=100)
    assert [d.action for d in ds] == [Action.APPEND, Action.APPEND, Action.DUPLICATE]
    assert (ds[2].first_offset, ds[2].last_offset) == (103, 104)


def test_check_all_epoch_bump_inside_a_request():
    s = Sim()
    s.append(hdr(1, 0, 0))
    ds = s.m.check_all([hdr(1, 0, 1), hdr(1, 1, 0), hdr(1, 0, 2)])
    assert [d.action for d in ds] == [Action.APPEND, Action.APPEND, Action.ERROR]
    assert ds[2].error == Errors.INVALID_PRODUCER_EPOCH


def test_check_all_matches_check_for_single_batches():
    s = Sim()
    s.append(hdr(1, 0, 0))
    for h in (hdr(1, 0, 1), hdr(1, 0, 0), hdr(1, 0, 5), hdr(1, 1, 0)):
        assert s.m.check_all([h], next_offset=s.end) == [s.m.check(h)]


# ------------------------------------------------------------------ expiry

def test_expiry_drops_only_idle_producers():
    s = Sim()
    s.append(hdr(1, 0, 0), now=NOW)
    s.append(hdr(2, 0, 0), now=NOW + DAY // 2)
    assert s.m.expire(NOW + DAY - 1, DAY) == 0
    assert s.m.expire(NOW + DAY, DAY) == 1 and s.m.get(1) is None
    assert set(s.m.producers()) == {2}
    # expired producer continues at its next sequence: accepted (cannot tell)
    assert s.m.check(hdr(1, 0, 1)).action is Action.APPEND
    # an append refreshes the clock
    s.append(hdr(2, 0, 1), now=NOW + DAY)
    assert s.m.expire(NOW + DAY + DAY // 2 + 1, DAY) == 0
