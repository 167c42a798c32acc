"""AlterConfigs and IncrementalAlterConfigs of topics against a real broker process and quorum: confluent-kafka's
and kafka-python's admin clients change a topic's configs; the change is durable (a restart keeps it) and
reaches the partitions (a shorter retention.ms deletes old segments); bad changes are refused per resource,
as raw requests."""
from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka.admin import ConfigResource as KConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from benchmarks.processes import BrokerProcess
from records.wire import kafka
from records.wire.errors import Errors
from tests.broker.test_topic_admin_clients import admin, produce, results
from tests.conftest import wait_for
from tests.support.kafka_requests import entity, request_once

ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 33, 44
INVALID_CONFIG = 40
OLD_TS = int(time.time() * 1000) - 3600_000


@pytest.fixture(scope="module")
def broker(module_quorum):
    base, lc = module_quorum
    b = BrokerProcess(str(base), 1, lc.client_addresses(), "--no-auto-create-topics")
    b.start()
    try:
        yield b
    finally:
        assert "Traceback" not in b.tail(100_000)
        b.stop()


def topic_configs(a, name: str) -> dict[str, tuple[str, int]]:
    res = ConfigResource("topic", name)
    return {n: (e.value, e.source) for n, e in a.describe_configs([res])[res].result(15).items()}


def test_confluent_incremental_alter_is_durable_and_applies(broker):
    a = admin(broker)
    name = f"alter-{uuid.uuid4().hex[:8]}"
    assert results(a.create_topics([NewTopic(name, 1, 1, config={"segment.bytes": "1024",
                                                                 "retention.bytes": "100000000"})])) == {name: None}
    produce(broker, name, range(1), n=20, ts=OLD_TS, value=b"x" * 200)
    res = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.bytes", None, incremental_operation=AlterConfigOpType.DELETE)])
    assert results(a.incremental_alter_configs([res])) == {res: None}
    got = topic_configs(a, name)
    assert got["retention.ms"] == ("60000", 1) and got["retention.bytes"] == ("-1", 5)
    assert got["segment.bytes"] == ("1024", 1)  # untouched by an incremental change
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused", "log_level": 3})
    try:
        wait_for(lambda: c.get_watermark_offsets(TopicPartition(name, 0), timeout=10, cached=False)[0] > 0, 30,
                 what="old segments deleted under the new retention.ms")
    finally:
        c.close()
    bad = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)])
    assert results(a.incremental_alter_configs([bad])) == {bad: "INVALID_CONFIG"}
    broker.stop()
    broker.start()
    assert topic_configs(admin(broker), name)["retention.ms"] == ("60000", 1)


def test_kafka_python_alter_configs(broker):
    a0 = admin(broker)
    name = f"kpalter-{uuid.uuid4().hex[:8]}"
    assert results(a0.create_topics([NewTopic(name, 1, 1, config={"segment.bytes": "4096"})])) == {name: None}
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        a.alter_configs([KConfigResource(ConfigResourceType.TOPIC, name, configs={"retention.ms": "3600000"})],
                        incremental=False)
    finally:
        a.close()
    got = topic_configs(a0, name)
    # kafka-python sends the topic's other own values along (it reads them first), so none is reset
    assert got["retention.ms"] == ("3600000", 1) and got["segment.bytes"] == ("4096", 1)


def alter(b, incremental: bool, *resources, validate_only=False):
    api, v = (INCREMENTAL_ALTER_CONFIGS, 1) if incremental else (ALTER_CONFIGS, 2)
    res = tuple(entity(api, v, "AlterConfigsResource", resource_type=t, resource_name=n, configs=tuple(
        entity(api, v, "AlterableConfig", name=c[0], value=c[-1], **({"config_operation": c[1]} if incremental
                                                                       else {})) for c in cs))
        for t, n, cs in resources)
    resp = request_once(b.bootstrap, "alter-test", kafka.request_entity(api, v, resources=res,
                                                                        validate_only=validate_only))
    return [(int(r.error_code), r.error_message) for r in resp.responses]


def test_bad_alters_are_refused_per_resource(broker):
    a = admin(broker)
    name = f"badalter-{uuid.uuid4().hex[:8]}"
    assert results(a.create_topics([NewTopic(name, 1, 1)])) == {name: None}
    got = alter(broker, True, (2, name, [("retention.ms", 0, "5000")]), (2, "nope", [("retention.ms", 0, "1")]),
                (2, name + "x", []), (4, "1", [("log.retention.ms", 0, "1")]), (9, "x", []),
                (2, "", [("retention.ms", 0, "1")]))
    assert [c for c, _ in got] == [0, int(Errors.UNKNOWN_TOPIC_OR_PARTITION), int(Errors.UNKNOWN_TOPIC_OR_PARTITION),
                                   int(Errors.INVALID_REQUEST), int(Errors.INVALID_REQUEST),
                                   int(Errors.INVALID_TOPIC_EXCEPTION)]
    assert all(m for c, m in got if c)
    for cs, code in [([("retention.ms", 0, "abc")], INVALID_CONFIG), ([("retention.ms", 0, None)], INVALID_CONFIG),
                     ([("no.such", 0, "1")], INVALID_CONFIG), ([("retention.ms", 2, "1")], INVALID_CONFIG),
                     ([("retention.ms", 7, "1")], int(Errors.INVALID_REQUEST)),
                     ([("cleanup.policy", 3, "delete")], INVALID_CONFIG),
                     ([("retention.ms", 0, "1"), ("retention.ms", 0, "2")], int(Errors.INVALID_REQUEST))]:
        assert alter(broker, True, (2, name, cs))[0][0] == code, cs
    assert alter(broker, False, (2, name, [("retention.ms", "-5")]), (2, name, []))[0][0] == int(
        Errors.INVALID_REQUEST)  # the same resource twice
    assert alter(broker, False, (2, name, [("segment.bytes", "2048")]), validate_only=True) == [(0, None)]
    assert topic_configs(a, name)["retention.ms"] == ("5000", 1)  # validate_only changed nothing
    assert topic_configs(a, name)["segment.bytes"][1] != 1
    assert alter(broker, False, (2, name, [("segment.bytes", "2048")])) == [(0, None)]
    got = topic_configs(a, name)
    assert got["segment.bytes"] == ("2048", 1) and got["retention.ms"][1] != 1
