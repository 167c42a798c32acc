"""ListTransactions (66) and DescribeTransactions (65), KIP-664, against a real broker process and quorum:
on the wire (``quorum.client.broker_admin``, kio's schemas) and through another tool, kafka-python's admin client
(``list_transactions`` / ``describe_transactions``, as kafka-transactions.sh sends them)."""
from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer
from kafka.admin import KafkaAdminClient

from broker.config import BrokerConfig
from broker.frontend import DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS, BrokerServer
from broker.txn_coordinator import TxnCoordinator
from quorum.client.broker_admin import BrokerAdmin
from quorum.security import acl as a
from tests.broker.test_pid_binding import AclIndexCache
from tests.conftest import wait_for
from records.wire import kafka
from records.wire.errors import Errors, InvalidTxnStateError, RequestTimedOutError

PARTITIONS = 2


def admin_call(bootstrap: str, method: str, *args, security=None, **kwargs):
    async def go():
        admin = BrokerAdmin(bootstrap, 10.0, security=security)
        try:
            return await getattr(admin, method)(*args, **kwargs)
        finally:
            await admin.close()
    return asyncio.run(go())


def txn_producer(bootstrap: str, tid: str, **config) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 2, "log_level": 0, **config})
    p.init_transactions(30)
    return p


def send(p: Producer, topic: str, *partitions: int) -> None:
    for i in partitions:
        p.produce(topic, value=b"v", partition=i)
    assert p.flush(30) == 0


def test_advertised_in_api_versions(brokers):
    b = brokers(1)
    versions = admin_call(b.bootstrap, "api_versions")
    assert versions[65] == (0, 0) and versions[66] == (0, 1)


def test_describe_and_list_follow_a_transaction(brokers):
    b = brokers(1, "--partitions", str(PARTITIONS))
    p = txn_producer(b.bootstrap, "adm-tx", **{"transaction.timeout.ms": 120_000})
    (empty,) = admin_call(b.bootstrap, "describe_transactions", ["adm-tx"])
    assert empty["code"] == 0 and empty["state"] == "Empty" and empty["partitions"] == []
    pid, epoch = empty["producer_id"], empty["producer_epoch"]

    p.begin_transaction()
    send(p, "adm", 0, 1)
    (open_,) = admin_call(b.bootstrap, "describe_transactions", ["adm-tx"])
    assert open_["state"] == "Ongoing" and (open_["producer_id"], open_["producer_epoch"]) == (pid, epoch)
    assert sorted((x["topic"], x["partition"]) for x in open_["partitions"]) == [("adm", 0), ("adm", 1)]
    assert open_["timeout_ms"] == 120_000 and open_["start_time_ms"] > 0

    rows, unknown = admin_call(b.bootstrap, "list_transactions")
    assert rows == [{"transactional_id": "adm-tx", "producer_id": pid, "state": "Ongoing"}] and unknown == []
    # Filters: by state (an unknown name is returned and filters nothing), by producer id, by duration (v1).
    assert admin_call(b.bootstrap, "list_transactions", ["CompleteCommit"])[0] == []
    assert admin_call(b.bootstrap, "list_transactions", ["Ongoing", "Bogus"]) == (rows, ["Bogus"])
    assert admin_call(b.bootstrap, "list_transactions", ["Bogus"]) == (rows, ["Bogus"])
    assert admin_call(b.bootstrap, "list_transactions", [], [pid + 1])[0] == []
    assert admin_call(b.bootstrap, "list_transactions", [], [pid])[0] == rows
    assert admin_call(b.bootstrap, "list_transactions", duration_ms=3_600_000)[0] == []
    assert admin_call(b.bootstrap, "list_transactions", duration_ms=0)[0] == rows

    p.commit_transaction(30)  # answered once decided; the completion follows
    wait_for(lambda: admin_call(b.bootstrap, "describe_transactions", ["adm-tx"])[0]["state"] == "CompleteCommit",
             10, what="the commit to complete")
    assert admin_call(b.bootstrap, "list_transactions", ["CompleteCommit"])[0][0]["state"] == "CompleteCommit"


def test_unknown_id_is_not_found_and_others_are_answered(brokers):
    b = brokers(1)
    txn_producer(b.bootstrap, "known-tx")
    rows = admin_call(b.bootstrap, "describe_transactions", ["nobody-tx", "known-tx"])
    assert [(r["transactional_id"], r["code"], r["error"]) for r in rows] == [
        ("nobody-tx", 105, "TRANSACTIONAL_ID_NOT_FOUND"), ("known-tx", 0, None)]


def test_kafka_python_admin_lists_and_describes(brokers):
    """Another tool: kafka-python's KafkaAdminClient (KIP-664 admin calls) reads both APIs."""
    b = brokers(1, "--partitions", str(PARTITIONS))
    p = txn_producer(b.bootstrap, "kp-tx")
    p.begin_transaction()
    send(p, "kp", 1)
    admin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=10_000)
    try:
        listed = admin.list_transactions()
        assert [(t.transactional_id, t.state.value) for t in listed[1]] == [("kp-tx", "Ongoing")]
        d = admin.describe_transactions(["kp-tx"])["kp-tx"]
        assert d.state.value == "Ongoing" and d.coordinator_id == 1
        assert {(tp.topic, tp.partition) for tp in d.topic_partitions} == {("kp", 1)}
        with pytest.raises(Exception) as e:
            admin.describe_transactions(["nobody-tx"])
        assert "TransactionalIdNotFound" in type(e.value).__name__
    finally:
        admin.close()
    p.abort_transaction(30)
    wait_for(lambda: admin_call(b.bootstrap, "describe_transactions", ["kp-tx"])[0]["state"] == "CompleteAbort",
             10, what="the abort to complete")



# ------------------------------------------------------------------ ACLs and errors, in process
# A BrokerServer object as a SASL broker has it (ACLs put in by hand, tests/broker/test_pid_binding.py's way) with
# the real TxnCoordinator over a stand-in quorum.
ALICE, BOB, MALLORY = "User:alice", "User:bob", "User:mallory"
ACLS = [a.Acl(ALICE, a.TRANSACTIONAL_ID, "alice-", a.PREFIXED, a.DESCRIBE, a.ALLOW),
        a.Acl(BOB, a.TRANSACTIONAL_ID, "bob-", a.PREFIXED, a.WRITE, a.ALLOW)]  # WRITE implies DESCRIBE


class FakeQuorum:
    """The quorum's answers the coordinator reads: each id's producer and transaction."""

    def __init__(self):
        self.ids: dict[str, tuple[int, int]] = {}
        self.txns: dict[str, dict] = {}
        self.down = False

    async def init_transactional_sequence(self, broker_id, broker_epoch, tid, timeout_ms, pid, epoch, request_id):
        self.ids[tid] = (7000 + len(self.ids), 0)
        return (*self.ids[tid], -1)

    async def txn(self, broker_id, broker_epoch, op, tid, *rest):
        assert op == "describe"
        if self.down:
            raise RequestTimedOutError("no quorum")
        if tid not in self.txns:
            raise InvalidTxnStateError(f"transactional id {tid!r} has no transaction")
        return self.txns[tid]

    async def describe_transactional(self, tid):
        if self.down:
            raise RequestTimedOutError("no quorum")
        return self.ids.get(tid, (-1, -1))

    async def list_transactions(self, broker_id, after="", limit=1000):
        """A page of every id (TransactionRequest list): its transaction, or Empty."""
        if self.down:
            raise RequestTimedOutError("no quorum")
        return [self.txns.get(tid) or {"transactional_id": tid, "producer_id": self.ids[tid][0],
                                       "producer_epoch": self.ids[tid][1], "state": "Empty", "partitions": [],
                                       "start_time_ms": -1, "timeout_ms": -1}
                for tid in sorted(t for t in self.ids if t > after)[:limit]]


@pytest.fixture
def server(tmp_path):
    cfg = BrokerConfig(broker_id=1, quorum=["127.0.0.1:1"], data_dir=str(tmp_path), listen="127.0.0.1:0")
    s = BrokerServer(cfg)
    s.counters["authorization_failures"] = 0
    s.acls = AclIndexCache(ACLS)
    quorum = FakeQuorum()
    s.txn = TxnCoordinator(1, quorum, s.storage, None, lambda: 1, None)
    yield s, quorum
    s._io.shutdown(wait=True)
    s.storage.close()


async def call(s: BrokerServer, principal: str, api_key: int, version: int, **fields):
    req = kafka.Request(api_key, version, 1, "test", kafka.request_entity(api_key, version, **fields))
    req.principal, req.host = principal, "127.0.0.1"
    return await s._handle(req)


def _setup(s: BrokerServer, quorum: FakeQuorum) -> None:
    async def go():
        for tid in ("alice-1", "bob-1", "carol-1"):
            await s.txn.init_producer_id(tid, 60_000, -1, -1)
    asyncio.run(go())
    pid, epoch = quorum.ids["alice-1"]
    quorum.txns["alice-1"] = {"transactional_id": "alice-1", "producer_id": pid, "producer_epoch": epoch,
                              "state": "Ongoing", "partitions": [[1, "t", 0]], "start_time_ms": 1_000,
                              "timeout_ms": 60_000, "sequence": 0}


def test_list_shows_only_the_ids_the_principal_may_describe(server):
    s, quorum = server
    _setup(s, quorum)

    def listed(principal):
        r = asyncio.run(call(s, principal, LIST_TRANSACTIONS, 0, state_filters=(), producer_id_filters=()))
        assert int(r.error_code) == 0
        return [(str(t.transactional_id), str(t.transaction_state)) for t in r.transaction_states]
    assert listed(ALICE) == [("alice-1", "Ongoing")]
    assert listed(BOB) == [("bob-1", "Empty")]
    assert listed(MALLORY) == []


def test_describe_refuses_an_id_the_principal_may_not_describe(server):
    s, quorum = server
    _setup(s, quorum)
    r = asyncio.run(call(s, ALICE, DESCRIBE_TRANSACTIONS, 0, transactional_ids=("alice-1", "bob-1", "alice-none")))
    assert [(str(t.transactional_id), int(t.error_code)) for t in r.transaction_states] == [
        ("alice-1", 0), ("bob-1", int(Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)),
        ("alice-none", Errors.TRANSACTIONAL_ID_NOT_FOUND)]
    first = r.transaction_states[0]
    assert (str(first.transaction_state), [(str(d.topic), list(d.partitions)) for d in first.topics]) == (
        "Ongoing", [("t", [0])])
    assert s.counters["authorization_failures"] == 1


def test_quorum_unreachable_is_coordinator_not_available(server):
    s, quorum = server
    _setup(s, quorum)
    quorum.down = True
    r = asyncio.run(call(s, ALICE, LIST_TRANSACTIONS, 1, state_filters=(), producer_id_filters=(), duration_filter=-1))
    assert int(r.error_code) == int(Errors.COORDINATOR_NOT_AVAILABLE) and r.transaction_states == ()
    r = asyncio.run(call(s, ALICE, DESCRIBE_TRANSACTIONS, 0, transactional_ids=("alice-1",)))
    assert int(r.transaction_states[0].error_code) == int(Errors.COORDINATOR_NOT_AVAILABLE)
