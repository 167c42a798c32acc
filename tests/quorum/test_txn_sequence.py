"""Every transaction step names its transaction (TransactionStateRecord.sequence): generate/replay, no Raft.

The defect these guard against: a step that reaches the quorum late or twice (a coordinator's retry on
another node after a timeout, a request a paused node forwards once it resumes) was applied to whatever
transaction the id had by then, the producer's next one: its commit prepared although the client never
asked, an abort landing on a later transaction.  Each test delivers such a late copy and checks that it
is refused (or answered as it was) and changes nothing."""
from __future__ import annotations

import dataclasses

import pytest

from quorum.managers import QuorumState
from records import RemoveTransactionalIdRecord
from records.wire.errors import ConcurrentTransactionsError, InvalidRequestError, InvalidTxnStateError, ProducerFencedError

from .test_transactions import DAY, NOW, init

T0, T1 = ("t", 0), ("t", 1)


def step(state: QuorumState, op: str, seq: int, parts=(), *, tid: str = "tx", pid: int, epoch: int,
         start: int = -1, now: int = NOW, apply: bool = True):
    res = state.transactions.generate_txn(op, 1, state.registrations.brokers[1].broker_epoch, tid, pid, epoch,
                                          [[1, t, p] for t, p in parts], start, registrations=state.registrations,
                                          now_ms=now, sequence=seq)
    if apply:
        outcomes = state.apply_batch(res.records)
        assert all(o.accepted for o in outcomes), outcomes
    return res


def committed_once(state: QuorumState, pid: int, epoch: int, seq: int, parts, now: int = NOW) -> None:
    """Transaction ``seq``: add ``parts``, commit, complete."""
    assert step(state, "add", seq, parts, pid=pid, epoch=epoch, now=now).response.sequence == seq
    assert step(state, "commit", seq, pid=pid, epoch=epoch, now=now + 1).response.state == "PrepareCommit"
    assert step(state, "complete", seq, pid=pid, epoch=epoch, now=now + 2).response.state == "CompleteCommit"


def current(state: QuorumState, tid: str = "tx"):
    return state.transactions.txn(tid)


@pytest.fixture
def producer(state):
    pid, epoch, pending = init(state).response
    assert pending is None
    return pid, epoch


def test_transactions_are_numbered_from_zero_and_each_begins_after_the_last(state, producer):
    pid, epoch = producer
    assert state.transactions.last_sequence("tx", []) == -1
    committed_once(state, pid, epoch, 0, [T0])
    committed_once(state, pid, epoch, 1, [T1], now=NOW + 10)
    assert (current(state).sequence, current(state).state) == (1, "CompleteCommit")
    assert state.transactions.last_sequence("tx", []) == 1


def test_a_late_commit_is_refused_by_the_next_transaction(state, producer):
    """The reported anomaly: EndTxn(commit) of transaction 0 delivered again after transaction 1 began."""
    pid, epoch = producer
    committed_once(state, pid, epoch, 0, [T0])
    step(state, "add", 1, [T1], pid=pid, epoch=epoch, now=NOW + 10)
    before = current(state)
    for op in ("commit", "abort"):
        with pytest.raises(InvalidTxnStateError, match="transaction 0.*transaction is 1"):
            step(state, op, 0, pid=pid, epoch=epoch, now=NOW + 11)
    assert current(state) == before  # transaction 1 is still open, with its partitions only


def test_without_a_sequence_the_late_commit_lands_on_the_next_transaction(state, producer):
    """The same late copy naming no transaction (-1, a coordinator that knows none): the old rule, applied
    to the current transaction.  This is what the coordinator never sends once it knows the sequence."""
    pid, epoch = producer
    committed_once(state, pid, epoch, 0, [T0])
    step(state, "add", 1, [T1], pid=pid, epoch=epoch, now=NOW + 10)
    late = step(state, "commit", -1, pid=pid, epoch=epoch, now=NOW + 11).response
    assert (late.sequence, late.state) == (1, "PrepareCommit")


def test_a_repeated_end_is_answered_as_it_ended_and_commits_nothing(state, producer):
    pid, epoch = producer
    step(state, "add", 0, [T0], pid=pid, epoch=epoch)
    step(state, "commit", 0, pid=pid, epoch=epoch)
    again = step(state, "commit", 0, pid=pid, epoch=epoch)
    assert again.records == [] and again.response.state == "PrepareCommit"
    with pytest.raises(InvalidTxnStateError):
        step(state, "abort", 0, pid=pid, epoch=epoch)  # decided: a commit never turns into an abort
    step(state, "complete", 0, pid=pid, epoch=epoch)
    done = step(state, "commit", 0, pid=pid, epoch=epoch)
    assert done.records == [] and done.response.state == "CompleteCommit"


def test_a_late_add_opens_nothing_after_its_transaction_ended(state, producer):
    pid, epoch = producer
    committed_once(state, pid, epoch, 0, [T0])
    with pytest.raises(InvalidTxnStateError):
        step(state, "add", 0, [T1], pid=pid, epoch=epoch)
    assert current(state).state == "CompleteCommit"
    # ... nor joins the next one
    step(state, "add", 1, [T0], pid=pid, epoch=epoch, now=NOW + 10)
    with pytest.raises(InvalidTxnStateError):
        step(state, "add", 0, [T1], pid=pid, epoch=epoch)
    assert current(state).partitions == '[[1,"t",0]]'


def test_add_names_the_open_transaction_or_the_next_one(state, producer):
    pid, epoch = producer
    for wrong in (1, 5):
        with pytest.raises(InvalidTxnStateError):
            step(state, "add", wrong, [T0], pid=pid, epoch=epoch)  # no coordinator can name one ahead
    step(state, "add", 0, [T0], pid=pid, epoch=epoch)
    joined = step(state, "add", 0, [T1], pid=pid, epoch=epoch).response
    assert (joined.sequence, joined.partitions) == (0, '[[1,"t",0],[1,"t",1]]')
    with pytest.raises(InvalidTxnStateError):
        step(state, "add", 1, [T0], pid=pid, epoch=epoch)  # not while 0 is open
    assert step(state, "verify", 0, [T0], pid=pid, epoch=epoch).records == []
    with pytest.raises(InvalidTxnStateError):
        step(state, "verify", 1, [T0], pid=pid, epoch=epoch)
    step(state, "commit", 0, pid=pid, epoch=epoch)
    with pytest.raises(ConcurrentTransactionsError):
        step(state, "add", 1, [T0], pid=pid, epoch=epoch)  # the next one waits for 0's markers


def test_a_late_completion_does_not_complete_a_later_transaction_started_in_the_same_millisecond(state, producer):
    """The start time named a transaction before; two of an id can start in the same millisecond."""
    pid, epoch = producer
    committed_once(state, pid, epoch, 0, [T0], now=NOW)
    step(state, "add", 1, [T0], pid=pid, epoch=epoch, now=NOW)
    step(state, "commit", 1, pid=pid, epoch=epoch, now=NOW)
    assert current(state).start_time_ms == NOW
    with pytest.raises(InvalidTxnStateError, match="no transaction 0"):
        step(state, "complete", 0, pid=pid, epoch=epoch, start=NOW)
    assert current(state).state == "PrepareCommit"  # its markers are not written yet: not complete


def test_a_late_timeout_does_not_abort_a_later_transaction(state, producer):
    pid, epoch = producer
    committed_once(state, pid, epoch, 0, [T0])
    step(state, "add", 1, [T0], pid=pid, epoch=epoch, now=NOW + 10)
    with pytest.raises(InvalidTxnStateError):
        step(state, "timeout", 0, pid=pid, epoch=epoch, now=NOW + DAY)
    assert (current(state).sequence, current(state).state) == (1, "Ongoing")
    aborted = step(state, "timeout", 1, pid=pid, epoch=epoch, now=NOW + DAY).response
    assert (aborted.sequence, aborted.state, aborted.producer_epoch) == (1, "PrepareAbort", epoch + 1)
    # the timed-out producer's own abort of transaction 1 is answered; one naming transaction 0 is not
    assert step(state, "abort", 1, pid=pid, epoch=epoch).response.state == "PrepareAbort"
    with pytest.raises(ProducerFencedError):
        step(state, "abort", 0, pid=pid, epoch=epoch)


def test_init_answers_the_last_sequence_and_a_forgotten_id_starts_again(state, producer):
    pid, epoch = producer
    committed_once(state, pid, epoch, 0, [T0])
    res = init(state, pid=pid, epoch=epoch)
    assert res.response[2] is None and state.transactions.last_sequence("tx", res.records) == 0
    pid, epoch = res.response[:2]
    committed_once(state, pid, epoch, 1, [T0], now=NOW + 10)
    # Idle past transactional.id.expiration.ms: the id is forgotten with its transactions.
    later = init(state, now=NOW + 8 * DAY, apply=False)
    assert any(isinstance(r, RemoveTransactionalIdRecord) for r in later.records)
    assert state.transactions.last_sequence("tx", later.records) == -1


@pytest.mark.parametrize("seq", [-2, 2**63, True, "1"])
def test_a_bad_sequence_is_an_invalid_request(state, producer, seq):
    pid, epoch = producer
    with pytest.raises(InvalidRequestError):
        step(state, "add", seq, [T0], pid=pid, epoch=epoch)


def test_replay_refuses_a_transaction_that_does_not_follow_or_changes_its_number(state, producer):
    pid, epoch = producer
    committed_once(state, pid, epoch, 0, [T0])
    nxt = step(state, "add", 1, [T0], pid=pid, epoch=epoch, now=NOW + 10, apply=False).records[0]
    for bad in (dataclasses.replace(nxt, sequence=0), dataclasses.replace(nxt, sequence=2)):
        [outcome] = state.apply_batch([bad])
        assert not outcome.accepted and "does not follow" in str(outcome.error)
    [ok] = state.apply_batch([nxt])
    assert ok.accepted
    prepared = step(state, "commit", 1, pid=pid, epoch=epoch, apply=False).records[0]
    [outcome] = state.apply_batch([dataclasses.replace(prepared, sequence=7)])
    assert not outcome.accepted and "not the same transaction" in str(outcome.error)


def test_a_snapshot_keeps_the_numbers(state, producer):
    pid, epoch = producer
    committed_once(state, pid, epoch, 0, [T0])
    step(state, "add", 1, [T0], pid=pid, epoch=epoch, now=NOW + 10)
    copy = QuorumState()
    for rec in state.snapshot_records():
        [o] = copy.apply_batch([rec])
        assert o.accepted, o
    assert copy.transactions.txn("tx") == current(state)
    with pytest.raises(InvalidTxnStateError):
        step(copy, "commit", 0, pid=pid, epoch=epoch)


def init_as(state: QuorumState, request_id: str, pid: int = -1, epoch: int = -1, now: int = NOW):
    res = state.transactions.generate_init(1, state.registrations.brokers[1].broker_epoch, "tx", 60_000, pid, epoch,
                                           registrations=state.registrations, producer_ids=state.producer_ids,
                                           now_ms=now, request_id=request_id)
    assert all(o.accepted for o in state.apply_batch(res.records))
    return res


def test_a_late_copy_of_init_producer_id_does_not_fence_the_producer_it_answered(state):
    """A new instance's InitProducerId applied, answered; its producer begins a transaction; then a copy of
    the same request arrives (forwarded late).  Bumping again would fence that producer and abort its
    transaction: the copy gets the first answer, and nothing is committed."""
    pid, epoch, _ = init_as(state, "1:1:1").response
    step(state, "add", 0, [T0], pid=pid, epoch=epoch)
    again = init_as(state, "1:1:1")
    assert again.records == [] and again.response == (pid, epoch, None)
    assert current(state).state == "Ongoing"
    # Another request (a second instance) still fences it, as Kafka does: the open transaction is aborted.
    fenced = init_as(state, "1:1:2")
    assert fenced.response[2] is not None and fenced.response[2].state == "PrepareAbort"
    # ... and that abort-with-bump is not "its answer": the instance's ask after the abort bumps again
    step(state, "complete", 0, pid=pid, epoch=epoch + 1)
    final = init_as(state, "1:1:2").response
    assert final == (pid, epoch + 2, None)
    assert init_as(state, "1:1:2").records == []


def test_an_init_request_id_is_bounded(state):
    with pytest.raises(InvalidRequestError):
        init_as(state, "x" * 101)


def test_a_request_id_reused_with_another_expectation_is_not_a_copy(state):
    """A copy carries the same request id and the same expected producer; a second request that reuses the
    id (two calls of one coordinator under way, seed 500000 of the transaction simulation) is decided."""
    pid, epoch, _ = init_as(state, "1:1:7").response
    bumped = init_as(state, "1:1:7", pid=pid, epoch=epoch)  # the KIP-360 bump of the instance, same id
    assert bumped.response == (pid, epoch + 1, None) and bumped.records
