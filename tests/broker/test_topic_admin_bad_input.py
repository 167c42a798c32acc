"""Topic administration's bad input, sent as raw Kafka requests to a real broker process: every bad topic or
resource gets its own error code and message, the good ones of the same request are served, and the broker
keeps serving (no traceback in its log)."""
from __future__ import annotations

import datetime
import uuid

import pytest

from benchmarks.processes import BrokerProcess
from records.wire import kafka
from records.wire.errors import Errors
from tests.support.kafka_requests import entity, request_once

CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS, CREATE_PARTITIONS, METADATA = 19, 20, 32, 37, 3
TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR = 36, 37, 38
INVALID_REPLICA_ASSIGNMENT, INVALID_CONFIG, POLICY_VIOLATION, UNKNOWN_TOPIC_ID = 39, 40, 44, 100
T = datetime.timedelta(seconds=10)


@pytest.fixture(scope="module")
def broker(module_quorum):
    base, lc = module_quorum
    b = BrokerProcess(str(base), 1, lc.client_addresses(), "--partitions", "2", "--max-topics", "20")
    b.start()
    try:
        yield b
    finally:
        assert "Traceback" not in b.tail(100_000)
        b.stop()


def call(b: BrokerProcess, api_key: int, version: int, **fields):
    return request_once(b.bootstrap, "topic-admin-test", kafka.request_entity(api_key, version, **fields))


def topic(name, n=1, rf=-1, assignments=(), configs=(), version=7):
    return entity(CREATE_TOPICS, version, "CreatableTopic", name=name, num_partitions=n, replication_factor=rf,
                  assignments=tuple(entity(CREATE_TOPICS, version, "CreatableReplicaAssignment", partition_index=i,
                                           broker_ids=tuple(ids)) for i, ids in assignments),
                  configs=tuple(entity(CREATE_TOPICS, version, "CreatableTopicConfig", name=k, value=v)
                                for k, v in configs))


def create(b, *topics, validate_only=False, version=7):
    resp = call(b, CREATE_TOPICS, version, topics=topics, timeout=T, validate_only=validate_only)
    return {t.name: t for t in resp.topics}


def codes(results) -> dict:
    return {k: int(v.error_code) for k, v in results.items()}


def u() -> str:
    return uuid.uuid4().hex[:8]


def test_create_topics_answers_each_topic(broker):
    x = u()
    got = create(broker, topic(f"ok-{x}", 3, 1, configs=[("retention.ms", "1000")]),
                 topic(f"dup-{x}"), topic(f"dup-{x}"), topic(""), topic("a/b"), topic("x" * 300),
                 topic(f"zero-{x}", 0), topic(f"neg-{x}", -5), topic(f"huge-{x}", 2**31 - 1),
                 topic(f"rf0-{x}", 1, 0), topic(f"rfneg-{x}", 1, -2), topic(f"rf3-{x}", 1, 3),
                 topic(f"asg-{x}", -1, assignments=[(0, [1]), (1, [1])]),
                 topic(f"asg-other-{x}", -1, assignments=[(0, [2])]),
                 topic(f"asg-two-{x}", -1, assignments=[(0, [1, 1])]),
                 topic(f"asg-gap-{x}", -1, assignments=[(0, [1]), (2, [1])]),
                 topic(f"asg-and-n-{x}", 2, assignments=[(0, [1])]),
                 topic(f"cfg-null-{x}", configs=[("retention.ms", None)]),
                 topic(f"cfg-abc-{x}", configs=[("retention.ms", "abc")]),
                 topic(f"cfg-unknown-{x}", configs=[("compression.typo", "zstd")]),
                 topic(f"cfg-kept-{x}", configs=[("compression.type", "zstd"), ("delete.retention.ms", "900")]),
                 topic(f"cfg-badkept-{x}", configs=[("compression.type", "brotli")]),
                 topic(f"cfg-isr-{x}", configs=[("min.insync.replicas", "2")]),
                 topic(f"cfg-compact-{x}", configs=[("cleanup.policy", "compact")]),
                 topic("__transaction_state"))
    assert codes(got) == {
        f"ok-{x}": 0, f"dup-{x}": int(Errors.INVALID_REQUEST), "": int(Errors.INVALID_TOPIC_EXCEPTION),
        "a/b": int(Errors.INVALID_TOPIC_EXCEPTION), "x" * 300: int(Errors.INVALID_TOPIC_EXCEPTION),
        f"zero-{x}": INVALID_PARTITIONS, f"neg-{x}": INVALID_PARTITIONS, f"huge-{x}": INVALID_PARTITIONS,
        f"rf0-{x}": INVALID_REPLICATION_FACTOR, f"rfneg-{x}": INVALID_REPLICATION_FACTOR,
        f"rf3-{x}": INVALID_REPLICATION_FACTOR, f"asg-{x}": 0, f"asg-other-{x}": INVALID_REPLICA_ASSIGNMENT,
        f"asg-two-{x}": INVALID_REPLICA_ASSIGNMENT, f"asg-gap-{x}": INVALID_REPLICA_ASSIGNMENT,
        f"asg-and-n-{x}": int(Errors.INVALID_REQUEST), f"cfg-null-{x}": INVALID_CONFIG,
        f"cfg-abc-{x}": INVALID_CONFIG, f"cfg-unknown-{x}": INVALID_CONFIG, f"cfg-compact-{x}": INVALID_CONFIG,
        f"cfg-kept-{x}": 0, f"cfg-badkept-{x}": INVALID_CONFIG, f"cfg-isr-{x}": INVALID_CONFIG,
        "__transaction_state": int(Errors.INVALID_TOPIC_EXCEPTION)}
    assert all(r.error_message for r in got.values() if int(r.error_code))
    assert "internal" in got["__transaction_state"].error_message
    assert "compaction is not served" in got[f"cfg-compact-{x}"].error_message
    ok = got[f"ok-{x}"]  # v5+: partitions, replication factor, the topic's configs; v7: its id
    assert (ok.num_partitions, ok.replication_factor, ok.topic_id is not None) == (3, 1, True)
    assert {c.name: (c.value, int(c.config_source)) for c in ok.configs}["retention.ms"] == ("1000", 1)
    assert got[f"asg-{x}"].num_partitions == 2
    again = create(broker, topic(f"ok-{x}", 3), validate_only=True)
    assert codes(again) == {f"ok-{x}": TOPIC_ALREADY_EXISTS}


@pytest.mark.parametrize("version", [2, 4, 5, 7])
def test_create_topics_versions_and_validate_only(broker, version):
    name = f"v{version}-{u()}"
    got = create(broker, topic(name, -1, version=version), validate_only=True, version=version)
    assert codes(got) == {name: 0}
    md = call(broker, METADATA, 9, topics=(entity(METADATA, 9, "MetadataRequestTopic", name=name),),
              allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
              include_topic_authorized_operations=False)
    assert int(md.topics[0].error_code) == int(Errors.UNKNOWN_TOPIC_OR_PARTITION)  # validate_only made nothing
    if version >= 5:
        assert got[name].num_partitions == 2  # -1: the broker's --partitions
    assert codes(create(broker, topic(name, -1, version=version), version=version)) == {name: 0}


def test_max_topics_is_a_policy_violation(broker):
    names = [f"many-{i}-{u()}" for i in range(25)]
    got = create(broker, *(topic(n) for n in names))
    assert set(codes(got).values()) <= {0, POLICY_VIOLATION} and POLICY_VIOLATION in codes(got).values()
    refused = next(r for r in got.values() if int(r.error_code))
    assert "max_topics" in refused.error_message
    deleted = call(broker, DELETE_TOPICS, 6, timeout=T, topics=tuple(
        entity(DELETE_TOPICS, 6, "DeleteTopicState", name=n, topic_id=None) for n, r in got.items()
        if not int(r.error_code)))
    assert {int(r.error_code) for r in deleted.responses} == {0}


def test_delete_topics_answers_each_entry(broker):
    name = f"del-{u()}"
    tid = create(broker, topic(name, 2))[name].topic_id
    other = f"del2-{u()}"
    create(broker, topic(other))

    def st(n=None, i=None):
        return entity(DELETE_TOPICS, 6, "DeleteTopicState", name=n, topic_id=i)
    resp = call(broker, DELETE_TOPICS, 6, timeout=T, topics=(
        st(i=tid), st("nope"), st(i=uuid.uuid4()), st(other, tid), st(), st("x/y"), st("d1"), st("d1")))
    got = [(r.name, int(r.error_code)) for r in resp.responses]
    assert got == [(name, 0), ("nope", int(Errors.UNKNOWN_TOPIC_OR_PARTITION)), (None, UNKNOWN_TOPIC_ID),
                   (other, int(Errors.INVALID_REQUEST)), (None, int(Errors.INVALID_REQUEST)),
                   ("x/y", int(Errors.INVALID_TOPIC_EXCEPTION)), ("d1", int(Errors.INVALID_REQUEST))]
    resp = call(broker, DELETE_TOPICS, 1, timeout=T, topic_names=(other, name))
    assert [(r.name, int(r.error_code)) for r in resp.responses] == [
        (other, 0), (name, int(Errors.UNKNOWN_TOPIC_OR_PARTITION))]


def test_create_partitions_answers_each_topic(broker):
    name = f"grow-{u()}"
    create(broker, topic(name, 1))

    def cp(n, count, assignments=None):
        return entity(CREATE_PARTITIONS, 3, "CreatePartitionsTopic", name=n, count=count, assignments=None if
                      assignments is None else tuple(entity(CREATE_PARTITIONS, 3, "CreatePartitionsAssignment",
                                                            broker_ids=tuple(a)) for a in assignments))
    resp = call(broker, CREATE_PARTITIONS, 3, timeout=T, validate_only=False, topics=(
        cp(name, 3, [[1], [1]]), cp("nope", 2), cp("d", 2), cp("d", 3)))
    assert [(r.name, int(r.error_code)) for r in resp.results] == [
        (name, 0), ("nope", int(Errors.UNKNOWN_TOPIC_OR_PARTITION)), ("d", int(Errors.INVALID_REQUEST))]
    bad = [cp(name, 2), cp(name, -1), cp(name, 2**31 - 1), cp(name, 5, [[2], [1]]), cp(name, 5, [[1]])]
    expect = [INVALID_PARTITIONS, INVALID_PARTITIONS, INVALID_PARTITIONS, INVALID_REPLICA_ASSIGNMENT,
              INVALID_REPLICA_ASSIGNMENT]
    for t, code in zip(bad, expect):
        r = call(broker, CREATE_PARTITIONS, 3, timeout=T, validate_only=False, topics=(t,)).results[0]
        assert (int(r.error_code), bool(r.error_message)) == (code, True), r
    r = call(broker, CREATE_PARTITIONS, 0, timeout=T, validate_only=True, topics=(cp(name, 9),)).results[0]
    assert int(r.error_code) == 0
    desc = describe(broker, (2, name, None))[0]
    assert int(desc.error_code) == 0
    md = call(broker, METADATA, 9, topics=(entity(METADATA, 9, "MetadataRequestTopic", name=name),),
              allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
              include_topic_authorized_operations=False)
    assert len(md.topics[0].partitions) == 3  # validate_only grew nothing


def describe(b, *resources, version=4, synonyms=False, docs=False):
    res = tuple(entity(DESCRIBE_CONFIGS, version, "DescribeConfigsResource", resource_type=t, resource_name=n,
                       configuration_keys=k) for t, n, k in resources)
    fields = {"include_documentation": docs} if version >= 3 else {}
    return call(b, DESCRIBE_CONFIGS, version, resources=res, include_synonyms=synonyms, **fields).results


def test_describe_configs_resources(broker):
    name = f"desc-{u()}"
    create(broker, topic(name, 1, configs=[("retention.bytes", "5000")]))
    got = describe(broker, (2, name, None), (2, name, ("retention.bytes", "no.such")), (2, "nope", None),
                   (2, "", None), (4, "1", ("broker.id", "num.partitions")), (4, "", ("broker.id",)),
                   (4, "7", None), (4, "abc", None), (99, "x", None), (2, name, ()), synonyms=True, docs=True)
    assert [int(r.error_code) for r in got] == [
        0, 0, int(Errors.UNKNOWN_TOPIC_OR_PARTITION), int(Errors.INVALID_TOPIC_EXCEPTION), 0, 0,
        int(Errors.INVALID_REQUEST), int(Errors.INVALID_REQUEST), int(Errors.INVALID_REQUEST), 0]
    assert all(r.error_message for r in got if int(r.error_code))
    full = {c.name: c for c in got[0].configs}
    assert {"cleanup.policy", "max.message.bytes", "retention.bytes", "retention.ms", "segment.bytes",
            "compression.type", "delete.retention.ms", "min.insync.replicas"} <= set(full)
    assert "not applied" in full["compression.type"].documentation and full["compression.type"].value == "producer"
    rb = full["retention.bytes"]
    assert (rb.value, int(rb.config_source), rb.read_only, int(rb.config_type)) == ("5000", 1, False, 5)
    assert [(s.name, s.value, int(s.source)) for s in rb.synonyms] == [
        ("retention.bytes", "5000", 1), ("log.retention.bytes", "-1", 5)]
    assert rb.documentation and int(full["retention.ms"].config_source) == 5
    assert [c.name for c in got[1].configs] == ["retention.bytes"]
    assert {c.name: c.value for c in got[4].configs} == {"broker.id": "1", "num.partitions": "2"}
    assert all(c.read_only for c in got[4].configs) and got[9].configs == ()
    v1 = describe(broker, (2, name, None), version=1)
    assert {c.name: c.value for c in v1[0].configs}["retention.bytes"] == "5000"


def test_the_broker_still_serves(broker):
    name = f"after-{u()}"
    assert codes(create(broker, topic(name, 1))) == {name: 0}


def test_every_version_is_answered(broker):
    """Each version of each API served, a request that succeeds: create, grow, describe, delete."""
    for v in range(2, 8):
        name = f"ver{v}-{u()}"
        assert codes(create(broker, topic(name, 1, version=v), version=v)) == {name: 0}
        cv = (v - 2) % 4  # CreatePartitions v0-v3
        r = call(broker, CREATE_PARTITIONS, cv, timeout=T, validate_only=False, topics=(
            entity(CREATE_PARTITIONS, cv, "CreatePartitionsTopic", name=name, count=2, assignments=None),)).results
        assert int(r[0].error_code) == 0
        dv = 1 + (v - 2) % 4  # DescribeConfigs v1-v4
        assert [int(x.error_code) for x in describe(broker, (2, name, None), (4, "1", None), version=dv)] == [0, 0]
        tv = v - 1  # DeleteTopics v1-v6
        if tv >= 6:
            resp = call(broker, DELETE_TOPICS, tv, timeout=T,
                        topics=(entity(DELETE_TOPICS, tv, "DeleteTopicState", name=name, topic_id=None),))
        else:
            resp = call(broker, DELETE_TOPICS, tv, timeout=T, topic_names=(name,))
        assert [(r.name, int(r.error_code)) for r in resp.responses] == [(name, 0)]


def test_new_partitions_per_request_are_bounded(broker):
    """At most 10,000 new partitions per request, all topics together (Kafka's bound): past it POLICY_VIOLATION,
    the topics before it are created."""
    x = u()
    got = create(broker, topic(f"big1-{x}", 6000), topic(f"big2-{x}", 6000), topic(f"small-{x}", 1),
                 validate_only=True)
    assert codes(got) == {f"big1-{x}": 0, f"big2-{x}": POLICY_VIOLATION, f"small-{x}": 0}
    assert "at most 10000" in got[f"big2-{x}"].error_message
