"""Regression (found while fuzzing the quorum's AllocateProducerIds): every request naming a
new broker id added a throttle bucket that was never dropped, so garbage with ever new ids
grew the leader's memory without bound."""
from __future__ import annotations

from quorum.producer_ids import BUCKET_PRUNE_AT, RateLimit
from records.wire.errors import ThrottlingQuotaExceededError


def _server(rate: float = 1000.0, burst: int = 2000) -> RateLimit:
    return RateLimit(rate, burst)


def test_buckets_of_garbage_broker_ids_stay_bounded(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("quorum.producer_ids.time.monotonic", lambda: clock[0])
    s = _server()
    for broker_id in range(50 * BUCKET_PRUNE_AT):
        s.check(broker_id)
        clock[0] += 0.01  # each bucket refills (1 token at 1000/s) before long
    assert len(s.buckets) <= 2 * BUCKET_PRUNE_AT


def test_pruning_keeps_buckets_that_still_throttle(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("quorum.producer_ids.time.monotonic", lambda: clock[0])
    s = _server(rate=1.0, burst=2)
    s.check(7)
    s.check(7)
    try:
        s.check(7)
        raise AssertionError("the third allocation within a second should be throttled")
    except ThrottlingQuotaExceededError:
        pass
    for broker_id in range(1000, 1000 + 3 * BUCKET_PRUNE_AT):  # garbage ids, pruned along the way
        s.check(broker_id)
    assert 7 in s.buckets  # broker 7 is still over its rate: its bucket was kept
    try:
        s.check(7)
        raise AssertionError("broker 7 is still over its rate")
    except ThrottlingQuotaExceededError:
        pass
