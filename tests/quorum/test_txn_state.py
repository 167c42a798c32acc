"""Transactions in the quorum (TransactionStateRecord): the coordinator's state machine, generate/replay with no
Raft.  Ongoing -> PrepareCommit | PrepareAbort -> CompleteCommit | CompleteAbort, timeouts, fencing, KIP-360."""
from __future__ import annotations

import dataclasses

import pytest

from quorum.managers import QuorumState, TxnSettings
from records import TransactionalIdRecord, TransactionStateRecord
from records.wire.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTxnStateError,
    ProducerFencedError,
)

from .test_transactions import DAY, NOW, init

TIMEOUT = 60_000


def step(state: QuorumState, op: str, tid: str = "tx", pid: int = 0, epoch: int = 0, parts=(), start: int = -1,
         now: int = NOW, apply: bool = True):
    res = state.transactions.generate_txn(op, 1, state.registrations.brokers[1].broker_epoch, tid, pid, epoch,
                                          [list(p) for p in parts], start, registrations=state.registrations,
                                          now_ms=now)
    if apply:
        outcomes = state.apply_batch(res.records)
        assert all(o.accepted for o in outcomes), outcomes
    return res


def begin(state: QuorumState, tid: str = "tx") -> tuple[int, int]:
    pid, epoch, pending = init(state, tid, timeout=TIMEOUT).response
    assert pending is None
    return pid, epoch


def test_commit_flow_adds_prepares_and_completes(state):
    pid, epoch = begin(state)
    a = step(state, "add", pid=pid, epoch=epoch, parts=[(1, "orders", 0)]).response
    assert (a.state, a.start_time_ms, a.producer_epoch) == ("Ongoing", NOW, epoch)
    b = step(state, "add", pid=pid, epoch=epoch, parts=[(1, "orders", 1), (1, "orders", 0)], now=NOW + 5).response
    assert b.start_time_ms == NOW and b.partitions == '[[1,"orders",0],[1,"orders",1]]'
    again = step(state, "add", pid=pid, epoch=epoch, parts=[(1, "orders", 1)], now=NOW + 6)
    assert again.records == []  # nothing new: nothing committed
    assert step(state, "verify", pid=pid, epoch=epoch, parts=[(1, "orders", 1)]).records == []
    with pytest.raises(InvalidTxnStateError, match="orders-2"):
        step(state, "verify", pid=pid, epoch=epoch, parts=[(1, "orders", 2)])
    p = step(state, "commit", pid=pid, epoch=epoch, now=NOW + 10).response
    assert p.state == "PrepareCommit"
    with pytest.raises(ConcurrentTransactionsError):
        step(state, "add", pid=pid, epoch=epoch, parts=[(1, "orders", 0)])
    with pytest.raises(InvalidTxnStateError):
        step(state, "abort", pid=pid, epoch=epoch)  # a decided commit cannot turn into an abort
    assert step(state, "commit", pid=pid, epoch=epoch).records == []  # a retried EndTxn: same answer
    c = step(state, "complete", start=NOW, now=NOW + 20).response
    assert c.state == "CompleteCommit"
    assert step(state, "complete", start=NOW, now=NOW + 21).records == []  # a second coordinator: no-op
    assert step(state, "commit", pid=pid, epoch=epoch).response.state == "CompleteCommit"
    n = step(state, "add", pid=pid, epoch=epoch, parts=[(1, "orders", 2)], now=NOW + 30).response
    assert (n.state, n.start_time_ms, n.partitions) == ("Ongoing", NOW + 30, '[[1,"orders",2]]')
    with pytest.raises(InvalidTxnStateError):
        step(state, "complete", start=NOW)  # that transaction is over; another began


def test_end_without_a_transaction_is_invalid_state(state):
    pid, epoch = begin(state)
    for op in ("commit", "abort"):
        with pytest.raises(InvalidTxnStateError):
            step(state, op, pid=pid, epoch=epoch)


def test_fenced_and_unknown_producers_are_refused(state):
    pid, epoch = begin(state)
    step(state, "add", pid=pid, epoch=epoch, parts=[(1, "t", 0)])
    with pytest.raises(InvalidProducerIdMappingError):
        step(state, "add", pid=pid + 1, epoch=epoch, parts=[(1, "t", 0)])
    with pytest.raises(InvalidProducerIdMappingError):
        step(state, "add", tid="nobody", pid=pid, epoch=epoch, parts=[(1, "t", 0)])
    with pytest.raises(ProducerFencedError):
        step(state, "commit", pid=pid, epoch=epoch + 1)


def test_bad_partitions_are_invalid_requests(state):
    pid, epoch = begin(state)
    for parts in ([(1, "", 0)], [(1, "t", -1)], [(-1, "t", 0)], [(1, "x" * 250, 0)], [(True, "t", 0)]):
        with pytest.raises(InvalidRequestError):
            step(state, "add", pid=pid, epoch=epoch, parts=parts)
    with pytest.raises(InvalidRequestError):
        step(state, "bogus", pid=pid, epoch=epoch)


def test_timeout_aborts_with_a_bump_and_the_producer_aborts_then_bumps_from_its_epoch(state):
    pid, epoch = begin(state)
    step(state, "add", pid=pid, epoch=epoch, parts=[(1, "t", 0)])
    assert state.transactions.pending(NOW + TIMEOUT, 10) == []
    with pytest.raises(InvalidTxnStateError, match="not past its timeout"):
        step(state, "timeout", start=NOW, now=NOW + TIMEOUT)
    [due] = state.transactions.pending(NOW + TIMEOUT + 1, 10)
    assert (due["state"], due["start_time_ms"], due["timeout_ms"]) == ("Ongoing", NOW, TIMEOUT)
    res = step(state, "timeout", start=NOW, now=NOW + TIMEOUT + 1)
    mapping, aborted = res.records
    assert isinstance(mapping, TransactionalIdRecord) and isinstance(aborted, TransactionStateRecord)
    assert (mapping.producer_epoch, mapping.last_producer_epoch) == (epoch + 1, epoch)
    assert (aborted.state, aborted.producer_epoch) == ("PrepareAbort", epoch + 1)
    assert [t["state"] for t in state.transactions.pending(NOW + TIMEOUT + 2, 10)] == ["PrepareAbort"]
    # The producer, still at its old epoch: its steps are abortable errors, its abort succeeds.
    with pytest.raises(InvalidProducerIdMappingError, match="timeout"):
        step(state, "add", pid=pid, epoch=epoch, parts=[(1, "t", 1)])
    with pytest.raises(InvalidProducerIdMappingError):
        step(state, "commit", pid=pid, epoch=epoch)
    assert step(state, "abort", pid=pid, epoch=epoch).response.state == "PrepareAbort"
    step(state, "complete", start=NOW, now=NOW + TIMEOUT + 3)
    assert step(state, "abort", pid=pid, epoch=epoch).response.state == "CompleteAbort"
    # KIP-360: InitProducerId with its (pid, old epoch) is the retry of the coordinator's bump.
    assert init(state, pid=pid, epoch=epoch, timeout=TIMEOUT).response == (pid, epoch + 1, None)
    n = step(state, "add", pid=pid, epoch=epoch + 1, parts=[(1, "t", 0)], now=NOW + TIMEOUT + 4).response
    assert n.state == "Ongoing"


def test_a_new_instance_aborts_the_open_transaction_first_and_fences_the_old(state):
    pid, epoch = begin(state)
    step(state, "add", pid=pid, epoch=epoch, parts=[(1, "t", 0)])
    res = init(state, timeout=TIMEOUT, now=NOW + 1)
    _, bumped, pending = res.response
    assert bumped == epoch + 1 and pending.state == "PrepareAbort" and pending.producer_epoch == epoch + 1
    # Until it is complete, InitProducerId keeps answering "complete it first" and commits nothing.
    again = init(state, timeout=TIMEOUT, now=NOW + 2)
    assert again.records == [] and again.response[2].state == "PrepareAbort"
    step(state, "complete", start=NOW, now=NOW + 3)
    assert init(state, timeout=TIMEOUT, now=NOW + 4).response == (pid, epoch + 2, None)
    with pytest.raises(ProducerFencedError):  # the old instance stays fenced
        init(state, pid=pid, epoch=epoch, timeout=TIMEOUT)
    with pytest.raises(ProducerFencedError):
        step(state, "abort", pid=pid, epoch=epoch)


def test_open_transactions_keep_their_id_from_expiring(state):
    pid, epoch = begin(state)
    step(state, "add", pid=pid, epoch=epoch, parts=[(1, "t", 0)])
    settings = TxnSettings(expiration_ms=DAY)
    init(state, tid="other", now=NOW + 2 * DAY, settings=settings)
    assert state.transactions.get("tx") is not None


def test_expiry_removes_the_transaction_with_its_id(state):
    pid, epoch = begin(state)
    step(state, "add", pid=pid, epoch=epoch, parts=[(1, "t", 0)])
    step(state, "commit", pid=pid, epoch=epoch)
    step(state, "complete", start=NOW)
    init(state, tid="other", now=NOW + 8 * DAY)
    assert state.transactions.get("tx") is None and state.transactions.txn("tx") is None


def test_snapshot_records_rebuild_the_same_state(state):
    pid, epoch = begin(state)
    step(state, "add", pid=pid, epoch=epoch, parts=[(1, "t", 0), (1, "u", 3)])
    pid2, epoch2 = begin(state, "tx2")
    step(state, "add", tid="tx2", pid=pid2, epoch=epoch2, parts=[(1, "t", 1)])
    step(state, "abort", tid="tx2", pid=pid2, epoch=epoch2)
    again = QuorumState.from_records(state.snapshot_records())
    assert again.transactions == state.transactions
    assert again.transactions.txn("tx2").state == "PrepareAbort"


def test_replay_refuses_impossible_transitions(state):
    pid, epoch = begin(state)
    ongoing = step(state, "add", pid=pid, epoch=epoch, parts=[(1, "t", 0)]).response
    bad = [
        dataclasses.replace(ongoing, state="CompleteCommit"),  # skips the prepare
        dataclasses.replace(ongoing, state="Empty"),
        dataclasses.replace(ongoing, state="Nonsense"),
        dataclasses.replace(ongoing, producer_epoch=epoch + 1),  # not the current epoch
        dataclasses.replace(ongoing, start_time_ms=NOW + 1),  # another transaction while one is open
        dataclasses.replace(ongoing, partitions="[]"),
        dataclasses.replace(ongoing, partitions="not json"),
        dataclasses.replace(ongoing, transactional_id="unknown"),
    ]
    for rec in bad:
        [outcome] = state.apply_batch([rec])
        assert not outcome.accepted, rec
    assert state.transactions.txn("tx") == ongoing


def test_pending_looks_only_at_open_transactions_and_follows_replay(state, monkeypatch):
    """The sweepers' question (every broker, every second) costs the open transactions, not every id that
    ever had one: ids whose transaction completed are not looked at, and the index follows each step."""
    from quorum.managers import transactions as mod
    for i in range(300):
        tid = f"done-{i}"
        pid, epoch, _ = init(state, tid, timeout=TIMEOUT).response
        step(state, "add", tid, pid, epoch, [[1, "t", 0]])
        step(state, "commit", tid, pid, epoch)
        step(state, "complete", tid, start=NOW)
        if i == 0:
            assert state.transactions.pending(NOW, 10) == []  # the index is built here, then kept by replay
    looked = []
    real = mod.TransactionalIdManager.txn
    monkeypatch.setattr(mod.TransactionalIdManager, "txn", lambda self, tid: looked.append(tid) or real(self, tid))
    assert state.transactions.pending(NOW + TIMEOUT + 1, 10) == [] and looked == []
    pid, epoch, _ = init(state, "open", timeout=TIMEOUT).response
    step(state, "add", "open", pid, epoch, [[1, "t", 0]])
    looked.clear()
    assert state.transactions.pending(NOW, 10) == []  # not past its timeout yet
    [due] = state.transactions.pending(NOW + TIMEOUT + 1, 10)
    assert due["transactional_id"] == "open" and set(looked) == {"open"}
    step(state, "commit", "open", pid, epoch)
    assert [t["state"] for t in state.transactions.pending(NOW, 10)] == ["PrepareCommit"]
    step(state, "complete", "open", start=NOW)
    assert state.transactions.pending(NOW + TIMEOUT + 1, 10) == []
    again = QuorumState.from_records(state.snapshot_records())  # built afresh from a snapshot
    assert again.transactions.pending(NOW + TIMEOUT + 1, 10) == []
