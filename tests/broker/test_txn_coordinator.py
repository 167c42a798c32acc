"""The broker's transaction coordinator over an in-process quorum state (no Raft, no sockets): which
transaction each step names, and what it does when the quorum's transaction is another one."""
from __future__ import annotations

import asyncio
import json

import pytest

from broker.txn_coordinator import TxnCoordinator
from quorum.managers import QuorumState, txn_json
from records import TransactionRequest
from records.wire.errors import ConcurrentTransactionsError, InvalidTxnStateError

NOW = 1_700_000_000_000


class StateQuorum:
    """``QuorumClient``'s transaction calls, decided on a ``QuorumState`` as the leader decides them; every
    step sent is kept (``sent``) so that a test can deliver a copy of it again, late."""

    def __init__(self) -> None:
        self.state = QuorumState()
        self.now = NOW
        self.sent: list[TransactionRequest] = []
        self.inits: list[str] = []
        for broker in (1, 2, 9):
            self._apply(self.state.registrations.generate_register(broker, f"inc-{broker}", f"h:{broker}",
                                                                   NOW).records)

    def _apply(self, records) -> None:
        assert all(o.accepted for o in self.state.apply_batch(records))

    def epoch(self, broker: int) -> int:
        return self.state.registrations.brokers[broker].broker_epoch

    async def init_transactional_sequence(self, broker_id, broker_epoch, tid, timeout_ms, pid=-1, epoch=-1,
                                          request_id=""):
        self.inits.append(request_id)
        res = self.state.transactions.generate_init(broker_id, broker_epoch, tid, timeout_ms, pid, epoch,
                                                    registrations=self.state.registrations,
                                                    producer_ids=self.state.producer_ids, now_ms=self.now,
                                                    request_id=request_id)
        self._apply(res.records)
        if res.response[2] is not None:
            raise ConcurrentTransactionsError("complete it first")
        return res.response[0], res.response[1], self.state.transactions.last_sequence(tid, res.records)

    async def txn(self, broker_id, broker_epoch, op, tid="", pid=-1, epoch=-1, partitions=None,
                  start_time_ms=-1, sequence=-1) -> dict:
        req = TransactionRequest(broker_id=broker_id, broker_epoch=broker_epoch, op=op, transactional_id=tid,
                                 producer_id=pid, producer_epoch=epoch, partitions=json.dumps(partitions or []),
                                 start_time_ms=start_time_ms, sequence=sequence)
        self.sent.append(req)
        return self.deliver(req)

    def deliver(self, req: TransactionRequest) -> dict:
        self.now += 1
        res = self.state.transactions.generate_txn(
            req.op, req.broker_id, req.broker_epoch, req.transactional_id, req.producer_id, req.producer_epoch,
            json.loads(req.partitions), req.start_time_ms, registrations=self.state.registrations, now_ms=self.now,
            sequence=req.sequence)
        self._apply(res.records)
        return txn_json(res.response, self.state.transactions.get(req.transactional_id))

    async def pending_transactions(self, broker_id, limit=100):
        return self.state.transactions.pending(self.now, limit)


class NoStorage:
    def topic(self, name):
        return None  # no partition here: markers are nothing to write (the coordinator's logic only)


def coordinator(q: StateQuorum, broker: int = 1) -> TxnCoordinator:
    async def run_io(fn, *args):
        return fn(*args)

    async def reregister():
        raise AssertionError("not expected")

    return TxnCoordinator(broker, q, NoStorage(), run_io, lambda: q.epoch(broker), reregister)


def run(coro):
    return asyncio.run(coro)


async def open_transaction(c: TxnCoordinator, timeout_ms: int = 60_000) -> tuple[int, int]:
    """A producer of transactional id "tx" with a transaction open on t-0: (producer id, epoch)."""
    pid, epoch = await c.init_producer_id("tx", timeout_ms, -1, -1)
    await c.add_partitions("tx", pid, epoch, [("t", 0)])
    return pid, epoch


@pytest.fixture
def q() -> StateQuorum:
    return StateQuorum()


@pytest.fixture
def c(q) -> TxnCoordinator:
    """Broker 1's coordinator on ``q``."""
    return coordinator(q)


def test_each_step_names_the_transaction_it_is_for(q, c):
    async def go():
        pid, epoch = await c.init_producer_id("tx", 60_000, -1, -1)
        for _ in range(3):
            await c.add_partitions("tx", pid, epoch, [("t", 0)])
            await c.add_partitions("tx", pid, epoch, [("t", 1)])
            await c.end("tx", pid, epoch, commit=True)
        await c.settled("tx")  # EndTxn answers once decided; its completion runs after the answer
    run(go())
    assert [(r.op, r.sequence) for r in q.sent] == [
        ("add", 0), ("add", 0), ("commit", 0), ("complete", 0),
        ("add", 1), ("add", 1), ("commit", 1), ("complete", 1),
        ("add", 2), ("add", 2), ("commit", 2), ("complete", 2)]


def test_late_copies_of_every_step_change_nothing_in_the_next_transaction(q, c):
    async def go():
        pid, epoch = await open_transaction(c)
        await c.end("tx", pid, epoch, commit=False)
        first = list(q.sent)
        await c.add_partitions("tx", pid, epoch, [("t", 1)])
        return first
    first = run(go())
    before = q.state.transactions.txn("tx")
    for req in first:  # a paused node's queue, forwarded once it resumes
        with pytest.raises(InvalidTxnStateError):
            q.deliver(req)
    assert q.state.transactions.txn("tx") == before


def test_a_coordinator_behind_the_quorum_learns_and_the_client_retries():
    """The producer went on through broker 2; broker 1 still knows only the transaction it ended.  Its
    EndTxn names that one and is refused; it learns the quorum's transaction, and the client's retry names
    the right one."""
    q = StateQuorum()
    one, two = coordinator(q, 1), coordinator(q, 2)

    async def go():
        pid, epoch = await open_transaction(one)
        await one.end("tx", pid, epoch, commit=True)  # transaction 0, through broker 1
        await one.settled("tx")  # its markers and completion, after the answer
        await two.add_partitions("tx", pid, epoch, [("u", 0)])  # transaction 1 began through broker 2
        with pytest.raises(ConcurrentTransactionsError, match="retry"):
            await one.end("tx", pid, epoch, commit=False)  # broker 1 names transaction 0
        assert q.state.transactions.txn("tx").state == "Ongoing"
        assert one.counters["txn_steps_refused"] == 1
        await one.end("tx", pid, epoch, commit=False)  # the client's retry names transaction 1
        await two.complete("tx")  # its partitions are broker 2's: broker 2 writes the markers
    run(go())
    t = q.state.transactions.txn("tx")
    assert (t.sequence, t.state) == (1, "CompleteAbort")


def test_a_step_the_current_transaction_refuses_is_not_turned_into_a_retry(q, c):
    async def go():
        pid, epoch = await open_transaction(c)
        await c.end("tx", pid, epoch, commit=False)
        await c.end("tx", pid, epoch, commit=False)  # a retry: answered as it ended
        for _ in range(2):
            with pytest.raises(InvalidTxnStateError):
                await c.end("tx", pid, epoch, commit=True)  # an aborted transaction is never committed
    run(go())
    assert q.state.transactions.txn("tx").state == "CompleteAbort"


def test_the_sweeper_names_what_it_times_out_and_completes(q, c):
    async def go():
        await open_transaction(c, 1_000)
        q.now += 5_000
        assert await c.sweep() == 1
    run(go())
    assert [(r.op, r.sequence) for r in q.sent][-3:] == [("timeout", 0), ("describe", -1), ("complete", 0)]
    assert q.state.transactions.txn("tx").state == "CompleteAbort"


def test_each_init_producer_id_has_its_own_request_id(q, c):
    async def go():
        await open_transaction(c)
        await c.init_producer_id("tx", 60_000, -1, -1)  # a new instance: aborts first, then asks again
    run(go())
    e = q.epoch(1)
    assert q.inits == [f"1:{e}:1", f"1:{e}:2", f"1:{e}:2"]


def test_a_coordinator_that_knows_nothing_reads_the_transaction_before_naming_one():
    """After a restart (a new coordinator) no step goes out naming "whichever transaction is current": a copy
    of it delivered late would land on the producer's next transaction."""
    q = StateQuorum()
    before = coordinator(q)

    async def go():
        pid, epoch = await open_transaction(before)
        after = coordinator(q)  # the broker restarted: the client retries its EndTxn there
        q.sent.clear()
        await after.end("tx", pid, epoch, commit=True)
        await after.settled("tx")
        assert [(r.op, r.sequence) for r in q.sent] == [("describe", -1), ("commit", 0), ("complete", 0)]
        assert after.counters["txn_sequence_reads"] == 1
        late = q.sent[1]
        await after.add_partitions("tx", pid, epoch, [("t", 1)])  # the next transaction
        with pytest.raises(InvalidTxnStateError):
            q.deliver(late)
        assert q.state.transactions.txn("tx").state == "Ongoing"
    run(go())
    assert all(r.sequence != -1 for r in q.sent if r.op not in ("describe", "verify"))


def test_end_txn_with_no_transaction_sends_nothing(q, c):
    async def go():
        pid, epoch = await c.init_producer_id("tx", 60_000, -1, -1)
        for commit in (True, False):
            with pytest.raises(InvalidTxnStateError, match="no transaction"):
                await c.end("tx", pid, epoch, commit=commit)
    run(go())
    assert q.sent == []


def test_an_answer_that_arrives_after_a_newer_one_teaches_nothing(c):
    """Seed 500818 of the transaction simulation: an add's answer (transaction 5 open, epoch 2) arrived after
    the coordinator had completed that transaction's abort with the epoch bumped to 3; taking it let a batch
    of epoch 2 pass the KIP-890 check without a round trip, into a transaction nobody would end."""
    base = {"transactional_id": "tx", "producer_id": 4, "partitions": [[1, "t", 0]]}
    c._ended({**base, "producer_epoch": 3, "sequence": 5, "state": "CompleteAbort"})
    c._remember(4, {**base, "producer_epoch": 2, "sequence": 5, "state": "Ongoing"})
    assert not c._added("tx", 4, 2, "t", 0)
    assert c._known_of("tx", 4, 3).names("add") == 6
    c._remember(4, {**base, "producer_epoch": 3, "sequence": 6, "state": "Ongoing"})  # newer: taken
    assert c._added("tx", 4, 3, "t", 0)
