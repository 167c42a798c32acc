"""TransactionRequest op list: every live transactional id, a page at a time (TransactionalIdManager.list_page),
with no Raft running: generate/replay on a QuorumState, and the RPC's handler on a stand-in server."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from quorum.client import api as p
from quorum.managers import LIST_PAGE_CHARS, QuorumState
from quorum.rpcs import RPCS
from records import RemoveTransactionalIdRecord, TransactionRequest, TransactionResponse
from records.wire import kafka
from records.wire.errors import InvalidRequestError

from .test_transactions import NOW, init
from .test_txn_state import begin, step


def page_all(state: QuorumState, limit: int) -> list[list[dict]]:
    pages, after = [], ""
    while True:
        page = state.transactions.list_page(after, limit)
        if not page:
            return pages
        assert len(page) <= limit
        assert all(t["transactional_id"] > after for t in page)
        pages.append(page)
        after = page[-1]["transactional_id"]


def ids(pages: list[list[dict]]) -> list[str]:
    return [t["transactional_id"] for page in pages for t in page]


def test_pages_list_every_id_once_in_order(state):
    names = [f"tx-{i:03d}" for i in range(50)]
    for tid in reversed(names):  # created out of order: listed in id order
        begin(state, tid)
    pages = page_all(state, 7)
    assert [len(x) for x in pages] == [7] * 7 + [1]
    assert ids(pages) == names
    assert ids(page_all(state, 10_000)) == names
    assert state.transactions.list_page("tx-048", 7) == [state.transactions.list_page("tx-048", 1)[0]]
    assert state.transactions.list_page("tx-049", 7) == []
    assert ids([state.transactions.list_page("tx-0105", 3)]) == ["tx-011", "tx-012", "tx-013"]  # not an id: after it


def test_each_id_with_its_transaction_or_empty(state):
    pid, epoch = begin(state, "a-open")
    step(state, "add", "a-open", pid, epoch, parts=[(1, "orders", 0), (1, "orders", 1)], now=NOW + 5)
    begin(state, "b-fresh")
    pid_c, epoch_c = begin(state, "c-done")
    step(state, "add", "c-done", pid_c, epoch_c, parts=[(1, "t", 0)])
    step(state, "commit", "c-done", pid_c, epoch_c)
    step(state, "complete", "c-done", start=NOW)
    pid_d, epoch_d = begin(state, "d-again")
    step(state, "add", "d-again", pid_d, epoch_d, parts=[(1, "t", 1)])
    step(state, "abort", "d-again", pid_d, epoch_d)
    step(state, "complete", "d-again", start=NOW)
    init(state, "d-again", pid_d, epoch_d)  # initialized again since: Empty with the new epoch

    rows = {t["transactional_id"]: t for t in state.transactions.list_page("", 100)}
    assert list(rows) == ["a-open", "b-fresh", "c-done", "d-again"]
    a = rows["a-open"]
    assert (a["state"], a["producer_id"], a["partitions"], a["start_time_ms"], a["timeout_ms"]) == (
        "Ongoing", pid, [[1, "orders", 0], [1, "orders", 1]], NOW + 5, 60_000)
    assert (rows["b-fresh"]["state"], rows["b-fresh"]["partitions"], rows["b-fresh"]["start_time_ms"],
            rows["b-fresh"]["timeout_ms"], rows["b-fresh"]["sequence"]) == ("Empty", [], -1, 60_000, -1)
    assert (rows["c-done"]["state"], rows["c-done"]["producer_epoch"]) == ("CompleteCommit", epoch_c)
    d = rows["d-again"]
    assert (d["state"], d["producer_id"], d["producer_epoch"], d["partitions"], d["sequence"]) == (
        "Empty", pid_d, epoch_d + 1, [], 0)
    assert set(d) == set(a)  # the same fields, whatever the state


def test_ids_added_and_removed_after_a_listing_are_listed_as_they_are(state):
    for tid in ("m", "c", "x"):
        begin(state, tid)
    assert ids([state.transactions.list_page("", 10)]) == ["c", "m", "x"]
    begin(state, "a")
    begin(state, "n")
    cur = state.transactions.get("m")
    out = state.apply_batch([RemoveTransactionalIdRecord(transactional_id="m", producer_id=cur.producer_id,
                                                         timestamp_ms=NOW)])
    assert out[0].accepted
    assert ids(page_all(state, 2)) == ["a", "c", "n", "x"]
    # A scratch fork (the proposer's) lists what it sees, and leaves the applied state's listing alone.
    fork = state.fork()
    for rec in fork.transactions.generate_init(1, 1, "b", 1000, -1, -1, registrations=fork.registrations,
                                               producer_ids=fork.producer_ids, now_ms=NOW).records:
        fork.replay(rec)
    assert ids([fork.transactions.list_page("", 10)]) == ["a", "b", "c", "n", "x"]
    assert ids([state.transactions.list_page("", 10)]) == ["a", "c", "n", "x"]


def test_a_restored_snapshot_lists_the_same(state):
    for i in range(5):
        begin(state, f"id-{i}")
    restored = QuorumState.from_records(state.snapshot_records())
    assert restored.transactions.list_page("", 100) == state.transactions.list_page("", 100)


def test_a_page_of_large_transactions_is_bounded_in_size(state):
    topic = "t" * 200
    parts = [(1, topic, i) for i in range(2000)]  # about 420 kB of partitions each
    for tid in ("big-1", "big-2", "big-3", "big-4", "big-5"):
        pid, epoch = begin(state, tid)
        step(state, "add", tid, pid, epoch, parts=parts)
    begin(state, "small")
    pages = page_all(state, 100)
    assert ids(pages) == ["big-1", "big-2", "big-3", "big-4", "big-5", "small"]
    assert len(pages) > 1
    for page in pages:
        encoded = TransactionResponse(error_code=0, transactions=__import__("json").dumps(page))
        assert len(page) == 1 or len(encoded.transactions) < LIST_PAGE_CHARS + 500_000


# ------------------------------------------------------------------ the RPC, on a stand-in server
class _Service:
    def __init__(self, state: QuorumState):
        self.state, self.lock, self.clock = state, threading.Lock(), time


class _Server:
    def __init__(self, state: QuorumState):
        self.service = _Service(state)


def serve(state: QuorumState, **fields) -> list[dict]:
    body = TransactionRequest(broker_id=1, broker_epoch=-1, **fields)
    rpc = RPCS.of(p.RECORD_API_KEY, body)
    req = kafka.Request(p.RECORD_API_KEY, 0, 1, "test", body)
    return asyncio.run(rpc.serve(_Server(state), req))


def test_the_list_rpc_is_a_leader_read_served_from_the_applied_state(state):
    for i in range(12):
        begin(state, f"tx-{i:02d}")
    rpc = RPCS.of(p.RECORD_API_KEY, TransactionRequest(broker_id=1, broker_epoch=-1, op="list"))
    body = TransactionRequest(broker_id=1, broker_epoch=-1, op="list")
    assert rpc.needs_leader(body) and rpc.reads_on_leader(body)  # forwarded by a follower, proposed by nobody
    pending = TransactionRequest(broker_id=1, broker_epoch=-1, op="pending")
    assert not rpc.needs_leader(pending)
    add = TransactionRequest(broker_id=1, broker_epoch=1, op="add")
    assert rpc.needs_leader(add) and not rpc.reads_on_leader(add)
    got = serve(state, op="list", limit=5)
    assert [t["transactional_id"] for t in got] == [f"tx-{i:02d}" for i in range(5)]
    got = serve(state, op="list", limit=5, transactional_id="tx-09")
    assert [t["transactional_id"] for t in got] == ["tx-10", "tx-11"]
    assert len(serve(state, op="list", limit=0)) == 1  # at least one
    assert len(serve(state, op="list", limit=2**31 - 1)) == 12
    with pytest.raises(InvalidRequestError, match="must go to the leader"):
        serve(state, op="add")
