"""Topic administration with real clients against a real broker process and quorum: confluent-kafka's
AdminClient and kafka-python's KafkaAdminClient create, grow, describe and delete topics; the created and
grown topics are produced to and consumed; a restart keeps topics, partitions and configs, and a deleted
topic stays deleted; a topic's own retention.ms applies to it alone."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.admin import NewPartitions as KNewPartitions
from kafka.admin import NewTopic as KNewTopic
from kafka.errors import InvalidPartitionsError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

from benchmarks.processes import BrokerProcess
from tests.conftest import wait_for

OLD_TS = int(time.time() * 1000) - 3600_000  # an hour ago: past a retention.ms of a minute


@pytest.fixture(scope="module")
def broker(module_quorum):
    """One broker that creates no topic on first use (a deleted topic stays deleted), small default segments."""
    base, lc = module_quorum
    b = BrokerProcess(str(base), 1, lc.client_addresses(), "--no-auto-create-topics", "--segment-bytes", "1048576")
    b.start()
    try:
        yield b
    finally:
        b.stop()


def admin(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 3})


def results(futures: dict, timeout: float = 15) -> dict:
    """{key: None or the KafkaError's name} of an AdminClient call's futures."""
    out = {}
    for k, f in futures.items():
        try:
            f.result(timeout)
            out[k] = None
        except KafkaException as e:
            out[k] = e.args[0].name()
    return out


def produce(b: BrokerProcess, topic: str, partitions: range, n: int = 3, ts: int | None = None,
            value: bytes = b"v") -> None:
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "log_level": 3})
    failed = []
    for part in partitions:
        for i in range(n):
            kw = {"timestamp": ts} if ts is not None else {}
            p.produce(topic, value + b"%d-%d" % (part, i), partition=part,
                      on_delivery=lambda err, msg: err and failed.append(err), **kw)
            if ts is not None:
                p.flush(30)  # a batch each: segments of a few batches roll, so retention has sealed ones to delete
    assert p.flush(30) == 0 and not failed, failed


def consume(b: BrokerProcess, topic: str, partitions: range, expect: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "unused", "enable.auto.commit": False,
                  "log_level": 3})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in partitions])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < expect and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
        return got
    finally:
        c.close()


def test_confluent_admin_create_validate_grow_describe_delete(broker):
    a = admin(broker)
    name = f"conf-{uuid.uuid4().hex[:8]}"
    assert results(a.create_topics([NewTopic(name + "-v", 3, 1)], validate_only=True)) == {name + "-v": None}
    assert results(a.create_topics([
        NewTopic(name, 2, 1, config={"retention.ms": "120000", "cleanup.policy": "delete"}),
        NewTopic(name + "-rf", 1, 3), NewTopic(name + "-cc", 1, 1, config={"cleanup.policy": "compact"}),
        NewTopic(name + "-bad", 1, 1, config={"retention.ms": "-5"}),
        NewTopic(name + "-unk", 1, 1, config={"no.such": "1"}),
        NewTopic("__consumer_offsets", 1, 1)])) == {
        name: None, name + "-rf": "INVALID_REPLICATION_FACTOR", name + "-cc": "INVALID_CONFIG",
        name + "-bad": "INVALID_CONFIG", name + "-unk": "INVALID_CONFIG", "__consumer_offsets": "TOPIC_EXCEPTION"}
    topics = a.list_topics(timeout=10).topics
    assert name in topics and len(topics[name].partitions) == 2
    assert name + "-v" not in topics and name + "-rf" not in topics  # validate_only and refusals: nothing made
    assert results(a.create_topics([NewTopic(name, 2, 1)])) == {name: "TOPIC_ALREADY_EXISTS"}

    produce(broker, name, range(2))
    assert results(a.create_partitions([NewPartitions(name, 4)])) == {name: None}
    assert results(a.create_partitions([NewPartitions(name, 3), NewPartitions("nope", 5)])) == {
        name: "INVALID_PARTITIONS", "nope": "UNKNOWN_TOPIC_OR_PART"}
    wait_for(lambda: len(a.list_topics(name, timeout=10).topics[name].partitions) == 4, 15, what="4 partitions")
    produce(broker, name, range(2, 4))
    assert len(consume(broker, name, range(4), 12)) == 12

    res = ConfigResource("topic", name)
    configs = a.describe_configs([res])[res].result(15)
    assert configs["retention.ms"].value == "120000" and configs["retention.ms"].source == 1  # DYNAMIC_TOPIC_CONFIG
    assert configs["segment.bytes"].value == "1048576" and configs["segment.bytes"].source == 4  # the broker's flag
    assert configs["cleanup.policy"].value == "delete" and not configs["retention.ms"].is_read_only
    bres = ConfigResource("broker", "1")
    bconf = a.describe_configs([bres])[bres].result(15)
    assert bconf["broker.id"].value == "1" and bconf["auto.create.topics.enable"].value == "false"
    assert bconf["log.segment.bytes"].value == "1048576" and bconf["log.retention.ms"].value == str(7 * 86400_000)
    missing = ConfigResource("topic", "nope")
    with pytest.raises(KafkaException, match="UNKNOWN_TOPIC_OR_PART"):
        a.describe_configs([missing])[missing].result(15)

    assert results(a.delete_topics([name, "nope"])) == {name: None, "nope": "UNKNOWN_TOPIC_OR_PART"}
    wait_for(lambda: name not in a.list_topics(timeout=10).topics, 15, what="the topic gone")
    assert results(a.create_topics([NewTopic(name, 1, 1)])) == {name: None}  # again: new and empty
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused", "log_level": 3})
    try:
        assert c.get_watermark_offsets(TopicPartition(name, 0), timeout=10) == (0, 0)
    finally:
        c.close()


def test_kafka_python_admin_create_grow_describe_delete(broker):
    name = f"kp-{uuid.uuid4().hex[:8]}"
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        a.create_topics([KNewTopic(name, 1, 1, topic_configs={"retention.bytes": "1000000"})])
        with pytest.raises(TopicAlreadyExistsError):
            a.create_topics([KNewTopic(name, 1, 1)])
        a.create_partitions({name: KNewPartitions(3)})
        with pytest.raises(InvalidPartitionsError):
            a.create_partitions({name: KNewPartitions(2)})
        got = a.describe_configs([KConfigResource(ConfigResourceType.TOPIC, name)], config_filter="all")
        configs = got["topic"][name]
        assert configs["retention.bytes"]["value"] == "1000000"
        assert configs["retention.bytes"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert configs["retention.ms"]["config_source"] == "DEFAULT_CONFIG"
        produce(broker, name, range(3), n=2)
        assert len(consume(broker, name, range(3), 6)) == 6
        a.delete_topics([name])
        with pytest.raises(UnknownTopicOrPartitionError):
            a.delete_topics([name])
    finally:
        a.close()


def test_a_restart_keeps_topics_partitions_configs_and_deletions(broker):
    a = admin(broker)
    kept, gone = f"kept-{uuid.uuid4().hex[:8]}", f"gone-{uuid.uuid4().hex[:8]}"
    assert results(a.create_topics([NewTopic(kept, 1, 1, config={"retention.ms": "86400000"}),
                                    NewTopic(gone, 2, 1)])) == {kept: None, gone: None}
    assert results(a.create_partitions([NewPartitions(kept, 3)])) == {kept: None}
    produce(broker, kept, range(3), n=2)
    produce(broker, gone, range(2), n=2)
    assert results(a.delete_topics([gone])) == {gone: None}
    broker.stop()
    broker.start()
    a = admin(broker)
    topics = a.list_topics(timeout=10).topics
    assert gone not in topics and len(topics[kept].partitions) == 3
    res = ConfigResource("topic", kept)
    assert a.describe_configs([res])[res].result(15)["retention.ms"].value == "86400000"
    assert len(consume(broker, kept, range(3), 6)) == 6
    assert results(a.create_topics([NewTopic(gone, 1, 1)])) == {gone: None}
    assert consume(broker, gone, range(1), 1) == []


def test_a_topic_s_own_retention_applies_to_it_alone(broker):
    """retention.ms of a minute on one topic: its old segments go at the next maintenance pass (every few
    seconds); a topic of the broker's retention (7 days) keeps the same records."""
    a = admin(broker)
    short, long_ = f"short-{uuid.uuid4().hex[:8]}", f"long-{uuid.uuid4().hex[:8]}"
    assert results(a.create_topics([NewTopic(short, 1, 1, config={"retention.ms": "60000", "segment.bytes": "1024"}),
                                    NewTopic(long_, 1, 1, config={"segment.bytes": "1024"})])) == {
        short: None, long_: None}
    for t in (short, long_):
        produce(broker, t, range(1), n=20, ts=OLD_TS, value=b"x" * 200)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused", "log_level": 3})
    try:
        def low(t: str) -> int:
            return c.get_watermark_offsets(TopicPartition(t, 0), timeout=10, cached=False)[0]
        wait_for(lambda: low(short) > 0, 30, what="the short-retention topic's old segments deleted")
        assert low(long_) == 0 and c.get_watermark_offsets(TopicPartition(long_, 0), timeout=10)[1] == 20
    finally:
        c.close()
