"""Topic administration's ACLs on a broker process that requires SASL, against a SASL_SSL quorum: CreateTopics
needs CREATE on the cluster or on the topic, DeleteTopics DELETE on the topic, CreatePartitions ALTER on the
topic, DescribeConfigs DESCRIBE_CONFIGS on the topic (on the cluster for the broker's own configs).  A refused
topic gets TOPIC_AUTHORIZATION_FAILED (CLUSTER_AUTHORIZATION_FAILED for a broker resource), the others are
answered.

alice: every topic operation on topics prefixed "a-"; bob: CREATE and DESCRIBE_CONFIGS on the cluster;
admin: a super user of the broker."""
from __future__ import annotations

import datetime

import pytest

from benchmarks.processes import BrokerProcess
from quorum.security.acl import ALTER, CREATE, DELETE, DESCRIBE_CONFIGS, PREFIXED, TOPIC
from records.wire import kafka
from records.wire.errors import Errors
from tests.security import conftest as security
from tests.security.conftest import BROKER_ACL, PASSWORDS, allow, call
from tests.support.kafka_requests import entity

CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS_API, CREATE_PARTITIONS = 19, 20, 32, 37
T = datetime.timedelta(seconds=10)
secure_quorum = security.secure_quorum  # the SASL_SSL quorum fixture of tests/security
DENIED = int(Errors.TOPIC_AUTHORIZATION_FAILED)
ACLS = [BROKER_ACL, *(allow("alice", op, TOPIC, "a-", PREFIXED) for op in (CREATE, DELETE, ALTER, DESCRIBE_CONFIGS)),
        allow("bob", CREATE), allow("bob", DESCRIBE_CONFIGS)]


@pytest.fixture(scope="module")
def secure_broker(secure_quorum, tmp_path_factory):
    secure_quorum.grant(ACLS)
    b = BrokerProcess(str(tmp_path_factory.mktemp("brokers")), 7, secure_quorum.addresses,
                      *secure_quorum.broker_flags(password_file=False), "--super-user", "User:admin",
                      env={"PIDQUORUM_BROKER_SASL_PASSWORD": PASSWORDS["broker"]})
    b.start()
    try:
        yield b
    finally:
        b.stop()


def create(b, user: str, *names: str) -> dict[str, int]:
    topics = tuple(entity(CREATE_TOPICS, 7, "CreatableTopic", name=n, num_partitions=1, replication_factor=-1,
                          assignments=(), configs=()) for n in names)
    resp = call(b, user, kafka.request_entity(CREATE_TOPICS, 7, topics=topics, timeout=T, validate_only=False))
    return {t.name: int(t.error_code) for t in resp.topics}


def grow(b, user: str, *names: str) -> dict[str, int]:
    topics = tuple(entity(CREATE_PARTITIONS, 3, "CreatePartitionsTopic", name=n, count=2, assignments=None)
                   for n in names)
    resp = call(b, user, kafka.request_entity(CREATE_PARTITIONS, 3, topics=topics, timeout=T, validate_only=False))
    return {t.name: int(t.error_code) for t in resp.results}


def describe(b, user: str, *resources: tuple[int, str]) -> list[int]:
    res = tuple(entity(DESCRIBE_CONFIGS_API, 4, "DescribeConfigsResource", resource_type=t, resource_name=n,
                       configuration_keys=None) for t, n in resources)
    resp = call(b, user, kafka.request_entity(DESCRIBE_CONFIGS_API, 4, resources=res, include_synonyms=False,
                                              include_documentation=False))
    return [int(r.error_code) for r in resp.results]


def delete(b, user: str, *names: str) -> dict[str, int]:
    resp = call(b, user, kafka.request_entity(DELETE_TOPICS, 6, timeout=T, topics=tuple(
        entity(DELETE_TOPICS, 6, "DeleteTopicState", name=n, topic_id=None) for n in names)))
    return {t.name: int(t.error_code) for t in resp.responses}


def test_topic_administration_is_authorized_per_topic(secure_broker):
    b = secure_broker
    assert create(b, "alice", "a-1", "b-1") == {"a-1": 0, "b-1": DENIED}
    assert create(b, "bob", "b-2") == {"b-2": 0}  # CREATE on the cluster: any topic
    assert create(b, "admin", "b-3") == {"b-3": 0}  # a super user
    assert grow(b, "alice", "a-1", "b-2", "b-nope") == {"a-1": 0, "b-2": DENIED, "b-nope": DENIED}
    assert grow(b, "bob", "b-2") == {"b-2": DENIED}
    topic, broker = 2, 4
    assert describe(b, "alice", (topic, "a-1"), (topic, "b-2"), (broker, "7")) == [
        0, DENIED, int(Errors.CLUSTER_AUTHORIZATION_FAILED)]
    # DESCRIBE_CONFIGS on the cluster: the broker's configs, not a topic's (as Kafka)
    assert describe(b, "bob", (topic, "b-2"), (broker, "7")) == [DENIED, 0]
    assert delete(b, "bob", "b-2") == {"b-2": DENIED}
    assert delete(b, "alice", "a-1", "b-2") == {"a-1": 0, "b-2": DENIED}
    assert delete(b, "admin", "b-2", "b-3") == {"b-2": 0, "b-3": 0}
