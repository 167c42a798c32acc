"""DescribeProducers against a real broker process that requires SASL: DESCRIBE on the topic (Kafka's
rule; WRITE implies it), checked per topic, TOPIC_AUTHORIZATION_FAILED for the partitions of the others,
whether they exist or not.

alice: IDEMPOTENT_WRITE on the cluster and WRITE on topics prefixed "seen-" (to produce) and DESCRIBE on them;
admin: IDEMPOTENT_WRITE and WRITE on the topics "written" and "hidden" (to produce there: a WRITE of alice's would
imply DESCRIBE); bob: WRITE on the topic "written", added with ``pidctl acl add --topic`` while the broker runs."""
from __future__ import annotations

import datetime
import json

import pytest

from benchmarks.processes import BrokerProcess
from quorum.security.acl import ALLOW, DESCRIBE, IDEMPOTENT_WRITE, LITERAL, PREFIXED, TOPIC, WRITE
from tests.conftest import wait_for
from tests.security.conftest import BROKER_ACL, PASSWORDS, allow, call, init_producer_id
from tests.security.test_quorum_auth import pidctl
from tests.support.kafka_requests import batch, entity
from records.wire import kafka
from records.wire.errors import Errors

PRODUCE, DESCRIBE_PRODUCERS = 0, 61
ACLS = [BROKER_ACL,
        allow("alice", IDEMPOTENT_WRITE),
        allow("alice", DESCRIBE, TOPIC, "seen-", PREFIXED),
        # Produce needs WRITE on the topic (as in Kafka)
        allow("alice", WRITE, TOPIC, "seen-", PREFIXED),
        allow("admin", IDEMPOTENT_WRITE),
        allow("admin", WRITE, TOPIC, "written"),
        allow("admin", WRITE, TOPIC, "hidden")]


@pytest.fixture(scope="module")
def secure_broker(secure_quorum, tmp_path_factory):
    sq = secure_quorum
    sq.grant(ACLS)
    b = BrokerProcess(str(tmp_path_factory.mktemp("brokers")), 7, sq.addresses, *sq.broker_flags(password_file=False),
                      env={"PIDQUORUM_BROKER_SASL_PASSWORD": PASSWORDS["broker"]})  # never a flag's value
    b.start()
    try:
        yield b
    finally:
        b.stop()


def produce_as(b: BrokerProcess, user: str, topic: str) -> int:
    pid = init_producer_id(b, user)
    pd = entity(PRODUCE, 9, "PartitionProduceData", index=0, records=batch(pid, 0, seq=0))
    td = entity(PRODUCE, 9, "TopicProduceData", name=topic, partition_data=(pd,))
    resp = call(b, user, kafka.request_entity(PRODUCE, 9, transactional_id=None, acks=-1,
                                              timeout=datetime.timedelta(seconds=5), topic_data=(td,)))
    assert int(resp.responses[0].partition_responses[0].error_code) == 0
    return pid


def describe(b: BrokerProcess, user: str, *topics: str) -> dict[str, tuple[Errors, list[int]]]:
    body = kafka.request_entity(DESCRIBE_PRODUCERS, 0, topics=tuple(
        entity(DESCRIBE_PRODUCERS, 0, "TopicRequest", name=t, partition_indexes=(0,)) for t in topics))
    resp = call(b, user, body)
    return {t.name: (Errors(int(t.partitions[0].error_code)),
                     [int(p.producer_id) for p in t.partitions[0].active_producers]) for t in resp.topics}


def test_describe_producers_needs_describe_on_each_topic(secure_broker, secure_quorum):
    b = secure_broker
    pids = {t: produce_as(b, user, t)
            for user, t in (("alice", "seen-1"), ("admin", "written"), ("admin", "hidden"))}
    denied = Errors.TOPIC_AUTHORIZATION_FAILED
    assert describe(b, "alice", "seen-1", "written", "hidden", "no-such-topic") == {
        "seen-1": (Errors.NONE, [pids["seen-1"]]), "written": (denied, []), "hidden": (denied, []),
        "no-such-topic": (denied, [])}  # refused before looking: no hint whether it exists
    assert describe(b, "bob", "written", "seen-1") == {"written": (denied, []), "seen-1": (denied, [])}
    # WRITE on the topic implies DESCRIBE (Kafka's implied operations); added through pidctl
    code, out = pidctl(secure_quorum, "acl", "add", "--principal", "User:bob", "--operation", "WRITE",
                       "--topic", "written", "-o", "json")
    assert code == 0, out
    assert json.loads(out)["acl"] == {"principal": "User:bob", "resource_type": TOPIC, "resource_name": "written",
                                      "pattern_type": LITERAL, "operation": WRITE, "permission": ALLOW, "host": "*"}
    wait_for(lambda: describe(b, "bob", "written")["written"][0] == Errors.NONE, 15,
             what="the broker to read bob's new ACL")
    assert describe(b, "bob", "written", "seen-1") == {"written": (Errors.NONE, [pids["written"]]),
                                                      "seen-1": (denied, [])}
    assert "not allowed DESCRIBE on topic 'hidden'" in b.tail(400)
