"""A transaction step that reaches the quorum late lands on nothing else, with a real client reading back.

What a paused quorum leader did: the coordinator's EndTxn went to it, timed out, was retried on another
node and completed; the client went on to its next transaction; then the paused node resumed and
forwarded the first copy, which prepared the client's *next* transaction.  Here the late copies (of the
commit, of the abort, of the add, of the completion) are delivered to the quorum directly, naming the
transaction the coordinator named, while a confluent-kafka producer is in its next transaction; what a
read_committed consumer sees must be exactly what the client committed.
"""
from __future__ import annotations

import asyncio

import pytest

from quorum.client.quorum import QuorumClient
from records.wire.errors import InvalidTxnStateError
from tests.conftest import wait_for

from .test_transactions import PARTITIONS, end_offsets, read, send, txn_producer, values


def quorum_call(cluster, fn):
    async def go():
        q = QuorumClient(cluster.lc.client_addresses())
        try:
            return await fn(q)
        finally:
            await q.close()
    return asyncio.run(go())


def test_late_steps_of_an_ended_transaction_do_not_touch_the_next_one(cluster, brokers):
    b = brokers(1, "--partitions", str(PARTITIONS))
    p = txn_producer(b.bootstrap, "late-tx")
    p.begin_transaction()
    send(p, "late", range(0, 6))
    p.commit_transaction(30)

    # Another coordinator (a registered broker), as a node that forwards a copy it held would.
    epoch = quorum_call(cluster, lambda q: q.register_broker(9))
    # EndTxn is answered once decided; the markers and the completion follow
    wait_for(lambda: quorum_call(cluster, lambda q: q.txn(9, epoch, "describe", "late-tx"))["state"]
             == "CompleteCommit", 10, what="the commit to complete")
    done = quorum_call(cluster, lambda q: q.txn(9, epoch, "describe", "late-tx"))
    assert (done["state"], done["sequence"]) == ("CompleteCommit", 0)
    pid, pepoch = done["producer_id"], done["producer_epoch"]

    p.begin_transaction()
    send(p, "late", range(100, 106))  # transaction 1 is open, on all three partitions
    parts = [[1, "late", i] for i in range(PARTITIONS)]

    async def late_copies(q: QuorumClient) -> list[str]:
        refused = []
        for op, kw in (("commit", {}), ("abort", {}), ("add", {"partitions": [[1, "late", 0]]}),
                       ("complete", {"start_time_ms": done["start_time_ms"]}),
                       ("timeout", {"start_time_ms": done["start_time_ms"]})):
            try:
                await q.txn(9, epoch, op, "late-tx", pid, pepoch, sequence=0, **kw)
            except InvalidTxnStateError:
                refused.append(op)
        return refused

    assert quorum_call(cluster, late_copies) == ["commit", "abort", "add", "complete", "timeout"]
    now = quorum_call(cluster, lambda q: q.txn(9, epoch, "describe", "late-tx"))
    assert (now["state"], now["sequence"], now["partitions"]) == ("Ongoing", 1, parts)

    p.abort_transaction(30)  # the client's own end of transaction 1
    p.begin_transaction()
    send(p, "late", range(200, 203))
    p.commit_transaction(30)
    assert end_offsets(b.bootstrap, "late", True) == end_offsets(b.bootstrap, "late", False)
    assert values(read(b.bootstrap, "late", committed=True, expect=9)) == [0, 1, 2, 3, 4, 5, 200, 201, 202]
    assert values(read(b.bootstrap, "late", committed=False, expect=15)) == sorted(
        [*range(6), *range(100, 106), *range(200, 203)])


@pytest.mark.parametrize("commit", [True, False])
def test_a_repeated_end_txn_is_answered_as_it_ended(cluster, brokers, commit):
    """The coordinator's own retry of EndTxn (the first copy was applied, its answer lost) gets the recorded
    outcome, and the transaction is not ended twice."""
    b = brokers(1, "--partitions", str(PARTITIONS))
    p = txn_producer(b.bootstrap, "again-tx")
    p.begin_transaction()
    send(p, "again", range(3))
    p.commit_transaction(30) if commit else p.abort_transaction(30)
    epoch = quorum_call(cluster, lambda q: q.register_broker(9))
    # EndTxn is answered once the outcome is decided; the completion follows: compare with the ended state.
    t = wait_for(lambda: (lambda t: t if t["state"] in ("CompleteCommit", "CompleteAbort") else None)(
        quorum_call(cluster, lambda q: q.txn(9, epoch, "describe", "again-tx"))), 10, what="the completion")
    again = quorum_call(cluster, lambda q: q.txn(9, epoch, "commit" if commit else "abort", "again-tx",
                                                 t["producer_id"], t["producer_epoch"], sequence=t["sequence"]))
    assert again == t
    with pytest.raises(InvalidTxnStateError):
        quorum_call(cluster, lambda q: q.txn(9, epoch, "abort" if commit else "commit", "again-tx",
                                             t["producer_id"], t["producer_epoch"], sequence=t["sequence"]))
