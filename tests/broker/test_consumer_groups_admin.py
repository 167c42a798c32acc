"""Consumer groups through kafka-python (KafkaConsumer in a group, commit, committed) and both clients' admin
calls (list, describe, list offsets, delete: NON_EMPTY_GROUP while a member is in, GROUP_ID_NOT_FOUND once
gone), against a quorum and a broker process."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tests.broker.conftest import metered_broker
from tests.broker.test_consumer_groups import BROKER_FLAGS, PARTITIONS, PER_PARTITION, make_topic
from tests.conftest import wait_for


@pytest.fixture(scope="module")
def broker(module_quorum):
    yield from metered_broker(module_quorum, 1, *BROKER_FLAGS)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kp_consumer(bootstrap: str, group: str) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                         enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=200,
                         client_id=f"kp-{group}")


def kp_drain(c: KafkaConsumer, n: int, timeout: float = 30.0) -> list:
    """Poll until ``n`` records came (a group member gets its assignment on the way)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        for records in c.poll(timeout_ms=200).values():
            got.extend(records)
    assert len(got) == n, f"{len(got)} records of {n}"
    return got


# ------------------------------------------------------------ kafka-python
def test_kafka_python_consumer_group_commit_and_committed(broker):
    topic, group = make_topic(broker.bootstrap), unique("kp")
    c = kp_consumer(broker.bootstrap, group)
    try:
        c.subscribe([topic])
        records = kp_drain(c, PARTITIONS * PER_PARTITION)
        assert {(r.partition, r.offset) for r in records} == {(p, o) for p in range(PARTITIONS)
                                                              for o in range(PER_PARTITION)}
        assert c.assignment() == {TopicPartition(topic, p) for p in range(PARTITIONS)}
        assert c.committed(TopicPartition(topic, 0)) is None
        c.commit()
        assert [c.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)] == [PER_PARTITION] * PARTITIONS
        c.commit({TopicPartition(topic, 3): OffsetAndMetadata(2, "from-kafka-python", -1)})
        assert c.committed(TopicPartition(topic, 3)) == 2
        meta = c.committed(TopicPartition(topic, 3), metadata=True)
        assert (meta.offset, meta.metadata) == (2, "from-kafka-python")
    finally:
        c.close()
    c2 = kp_consumer(broker.bootstrap, group)
    try:
        c2.subscribe([topic])
        rest = kp_drain(c2, PER_PARTITION - 2)
        assert sorted((r.partition, r.offset) for r in rest) == [(3, o) for o in range(2, PER_PARTITION)]
    finally:
        c2.close()


def test_kafka_python_admin_lists_describes_fetches_and_deletes_groups(broker):
    topic, group = make_topic(broker.bootstrap), unique("kpadm")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="kp-admin")
    c = kp_consumer(broker.bootstrap, group)
    try:
        c.subscribe([topic])
        kp_drain(c, PARTITIONS * PER_PARTITION)
        c.commit({TopicPartition(topic, p): OffsetAndMetadata(p + 1, f"m{p}", -1) for p in range(PARTITIONS)})
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert group in listed and listed[group]["protocol_type"] == "consumer"
        desc = admin.describe_groups([group])[group]
        assert desc["error"] is None and desc["group_state"] == "Stable" and desc["protocol_type"] == "consumer"
        assert desc["protocol_data"] in ("range", "roundrobin", "sticky", "cooperative-sticky")
        (member,) = desc["members"]
        assert member["client_id"] == f"kp-{group}"
        offsets = admin.list_group_offsets({group: None})[group]
        assert {tp: (om.offset, om.metadata) for tp, om in offsets.items()} == {
            TopicPartition(topic, p): (p + 1, f"m{p}") for p in range(PARTITIONS)}
        some = admin.list_group_offsets({group: [TopicPartition(topic, 2)]})[group]
        assert {tp: om.offset for tp, om in some.items()} == {TopicPartition(topic, 2): 3}
        assert admin.delete_groups([group]) == {group: "NonEmptyGroupError"}
    finally:
        c.close()
    wait_for(lambda: admin.describe_groups([group])[group]["group_state"] == "Empty", 15, what="the group empty")
    assert admin.delete_groups([group]) == {group: "OK"}
    assert admin.delete_groups([group]) == {group: "GroupIdNotFoundError"}
    assert group not in {g["group_id"] for g in admin.list_groups()}
    assert admin.describe_groups([group])[group]["group_state"] == "Dead"
    assert admin.list_group_offsets({group: None})[group] == {}  # the offsets went with the group
    admin.close()


def test_kafka_python_list_group_offsets_of_several_groups_in_one_call(broker):
    topic = make_topic(broker.bootstrap)
    groups = [unique("kpmulti") for _ in range(3)]
    for i, g in enumerate(groups):
        c = kp_consumer(broker.bootstrap, g)
        try:
            c.assign([TopicPartition(topic, 0)])
            c.commit({TopicPartition(topic, 0): OffsetAndMetadata(i + 1, "", -1)})
        finally:
            c.close()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        got = admin.list_group_offsets(groups)
        assert {g: {tp.partition: om.offset for tp, om in got[g].items()} for g in groups} == {
            g: {0: i + 1} for i, g in enumerate(groups)}
    finally:
        admin.close()


# ------------------------------------------------------------ confluent-kafka's AdminClient
def test_confluent_admin_lists_describes_fetches_and_deletes_groups(broker):
    from confluent_kafka import Consumer
    topic, group = make_topic(broker.bootstrap), unique("ckadm")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "client.id": "ck-member", "partition.assignment.strategy": "roundrobin"})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(c.assignment()) < PARTITIONS and time.monotonic() < deadline:
            c.poll(0.1)
        c.commit(offsets=[CTopicPartition(topic, p, 10 * (p + 1)) for p in range(PARTITIONS)], asynchronous=False)
        listing = {g.group_id: g for g in admin.list_consumer_groups().result(20).valid}
        assert group in listing and not listing[group].is_simple_consumer_group
        assert str(listing[group].state).endswith("STABLE")
        desc = admin.describe_consumer_groups([group])[group].result(20)
        assert desc.group_id == group and desc.partition_assignor == "roundrobin" and desc.coordinator.id == 1
        (m,) = desc.members
        assert m.client_id == "ck-member"
        assert sorted(tp.partition for tp in m.assignment.topic_partitions) == list(range(PARTITIONS))
        res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(20)
        assert sorted((tp.topic, tp.partition, tp.offset) for tp in res.topic_partitions) == [
            (topic, p, 10 * (p + 1)) for p in range(PARTITIONS)]
        with pytest.raises(KafkaException) as e:
            admin.delete_consumer_groups([group])[group].result(20)
        assert e.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    finally:
        c.close()
    wait_for(lambda: str(admin.describe_consumer_groups([group])[group].result(20).state).endswith("EMPTY"), 15,
             what="the group empty")
    assert admin.delete_consumer_groups([group])[group].result(20) is None
    with pytest.raises(KafkaException) as e:
        admin.delete_consumer_groups([group])[group].result(20)
    assert e.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(20).valid}
    res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(20)
    assert res.topic_partitions == []


def test_confluent_admin_lists_groups_by_state(broker):
    from confluent_kafka import Consumer, ConsumerGroupState
    topic, active, idle = make_topic(broker.bootstrap), unique("ckstate"), unique("ckstate")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assign_only = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": idle})
    assign_only.assign([CTopicPartition(topic, 1)])
    assign_only.commit(offsets=[CTopicPartition(topic, 1, 3)], asynchronous=False)  # an Empty group with offsets
    assign_only.close()
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": active, "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(c.assignment()) < PARTITIONS and time.monotonic() < deadline:
            c.poll(0.1)
        stable = {g.group_id for g in admin.list_consumer_groups(
            states={ConsumerGroupState.STABLE}).result(20).valid}
        empty = {g.group_id for g in admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(20).valid}
        assert active in stable and active not in empty
        assert idle in empty and idle not in stable
    finally:
        c.close()
