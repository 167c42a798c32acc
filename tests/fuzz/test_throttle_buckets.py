"""Regression (found while fuzzing the quorum's AllocateProducerIds): every request naming a
new broker id added a throttle bucket that was never dropped, so garbage with ever new ids
grew the leader's memory without bound."""
from __future__ import annotations

import types

from quorum.config import NodeConfig
from quorum.server import BUCKET_PRUNE_AT, QuorumServer
from records.wire.errors import ThrottlingQuotaExceededError


def _server(rate: float = 1000.0, burst: int = 2000) -> QuorumServer:
    cfg = NodeConfig(node_id=1, data_dir="unused", raft_address="127.0.0.1:1", client_address="127.0.0.1:2",
                     secret="s", allocate_rate_per_broker=rate, allocate_burst=burst)
    return QuorumServer(types.SimpleNamespace(cfg=cfg))


def test_buckets_of_garbage_broker_ids_stay_bounded(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("quorum.server.time.monotonic", lambda: clock[0])
    s = _server()
    for broker_id in range(50 * BUCKET_PRUNE_AT):
        s._throttle(broker_id)
        clock[0] += 0.01  # each bucket refills (1 token at 1000/s) before long
    assert len(s._buckets) <= 2 * BUCKET_PRUNE_AT


def test_pruning_keeps_buckets_that_still_throttle(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("quorum.server.time.monotonic", lambda: clock[0])
    s = _server(rate=1.0, burst=2)
    s._throttle(7)
    s._throttle(7)
    try:
        s._throttle(7)
        raise AssertionError("the third allocation within a second should be throttled")
    except ThrottlingQuotaExceededError:
        pass
    for broker_id in range(1000, 1000 + 3 * BUCKET_PRUNE_AT):  # garbage ids, pruned along the way
        s._throttle(broker_id)
    assert 7 in s._buckets  # broker 7 is still over its rate: its bucket was kept
    try:
        s._throttle(7)
        raise AssertionError("broker 7 is still over its rate")
    except ThrottlingQuotaExceededError:
        pass
