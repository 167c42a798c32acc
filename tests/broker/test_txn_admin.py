"""ListTransactions (66) and DescribeTransactions (65), KIP-664, against a real broker process and quorum:
on the wire (``client.broker_admin``, kio's schemas) and through another tool, kafka-python's admin client
(``list_transactions`` / ``describe_transactions``, as kafka-transactions.sh sends them)."""
from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Producer
from kafka.admin import KafkaAdminClient

from client.broker_admin import BrokerAdmin, BrokerRefused
from tests.conftest import wait_for

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
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 2, "log_level": 3, **config})
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

    p.commit_transaction(30)
    (done,) = admin_call(b.bootstrap, "describe_transactions", ["adm-tx"])
    assert done["state"] == "CompleteCommit"
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

