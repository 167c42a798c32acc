"""The edges of the broker's Kafka protocol surface, against real broker processes and a real quorum:

- FindCoordinator names this broker for consumer groups and transactional ids: kafka-python
  (negotiated, or pinned to an old api_version) and confluent-kafka consumers in a group read, commit
  and read their commits back; consumers without a group still read.
- A request at a version outside the advertised range closes the connection, as Kafka does (no
  answer in another version's layout); ApiVersions is answered UNSUPPORTED_VERSION with the ranges.
- Topic names of 240 to 249 characters work (produce, consume, restart); 250 is refused for that
  topic only.
- An unknown API key is logged once per key, then only counted; the connection is closed.

Client scenarios run in subprocesses with deadlines: a client that spins is killed and reported.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import pytest

from benchmarks.processes import child_env
from broker.config import BrokerConfig
from broker.frontend import BrokerServer
from quorum.client import api as p
from tests.broker.conftest import MeteredBroker, metered_broker, start_metered
from tests.broker.test_frontend_bad_input import call
from tests.broker.test_real_clients import consume_all, produce_confluent, produce_kafka_python
from tests.conftest import wait_for
from tests.quorum.test_bad_input import framed, header_v1, raw_conn, read_frame, read_until_closed
from records.wire import kafka
from records.wire.errors import Errors

PRODUCE, FETCH, LIST_OFFSETS, METADATA, FIND_COORDINATOR = 0, 1, 2, 3, 10
ADD_PARTITIONS_TO_TXN, DESCRIBE_PRODUCERS = 24, 61
NAMES = {PRODUCE: "Produce", FETCH: "Fetch", LIST_OFFSETS: "ListOffsets", METADATA: "Metadata",
         ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn", DESCRIBE_PRODUCERS: "DescribeProducers"}
CLIENT_DEADLINE = 30.0  # seconds a client subprocess may take, start-up and imports included


@pytest.fixture(scope="module")
def broker(module_quorum):
    yield from metered_broker(module_quorum, 1, "--partitions", "2")


def advertised(b: MeteredBroker) -> dict[int, tuple[int, int]]:
    body = call(b.proc, kafka.API_VERSIONS, 0)
    assert int(body.error_code) == 0
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}


def api_versions_on(s: socket.socket, corr: int) -> None:
    """ApiVersions v0 on an open connection is answered (the broker serves that connection)."""
    s.sendall(kafka.encode_request(kafka.request_entity(kafka.API_VERSIONS, 0), corr))
    got, body = p.QUORUM_API.parse_response(read_frame(s), kafka.API_VERSIONS, 0)
    assert got == corr and int(body.error_code) == 0


def closed_without_answer(b: MeteredBroker, payload: bytes) -> None:
    with raw_conn(b.bootstrap) as s:
        s.sendall(framed(payload))
        assert read_until_closed(s) == b"", "answered instead of closing the connection"


# ------------------------------------------------------------------ versions
UNSUPPORTED = [(PRODUCE, 11), (PRODUCE, 2), (FETCH, 3), (LIST_OFFSETS, 0), (LIST_OFFSETS, 8), (METADATA, 13),
               (ADD_PARTITIONS_TO_TXN, 4), (DESCRIBE_PRODUCERS, 1)]


@pytest.mark.parametrize("api_key,version", UNSUPPORTED, ids=[f"{k}v{v}" for k, v in UNSUPPORTED])
def test_a_request_at_an_unsupported_version_closes_the_connection(broker, api_key, version):
    lo, hi = advertised(broker)[api_key]
    assert not lo <= version <= hi, f"v{version} is advertised now (v{lo}-v{hi}): pick another version"
    before = broker.counter("unsupported_versions")
    with raw_conn(broker.bootstrap) as other:
        api_versions_on(other, 1)
        for _ in range(2):  # twice, on two connections
            closed_without_answer(broker, header_v1(api_key, version, 31) + b"\x00" * 16)
            api_versions_on(other, 2)  # the other connection is served throughout
    wait_for(lambda: broker.counter("unsupported_versions") >= before + 2, 5, what="unsupported_versions counted")
    said = f": {NAMES[api_key]} v{version} is not supported"
    lines = [line for line in broker.log().splitlines() if said in line]
    assert len(lines) == 1, lines  # logged once per (API, version)
    assert "closing the connection" in lines[0]


def test_every_api_one_version_past_either_end_closes_the_connection(broker):
    for api_key, (lo, hi) in advertised(broker).items():
        if api_key == kafka.API_VERSIONS:
            continue
        for version in (lo - 1, hi + 1):
            closed_without_answer(broker, header_v1(api_key, version, 7) + b"\x00" * 16)
    with raw_conn(broker.bootstrap) as s:
        api_versions_on(s, 3)


@pytest.mark.parametrize("version", [4, 99])
def test_api_versions_at_an_unsupported_version_is_answered_with_the_ranges(broker, version):
    """As Kafka does (KIP-511), so the client can pick versions; logged once per version (every client
    that negotiates starts so, on every connection)."""
    for _ in range(2):
        with raw_conn(broker.bootstrap) as s:
            s.sendall(framed(header_v1(kafka.API_VERSIONS, version, 0x5150) + b"\x00" * 3))
            corr, body = p.QUORUM_API.parse_response(read_frame(s), kafka.API_VERSIONS, 0)
            assert corr == 0x5150 and int(body.error_code) == Errors.UNSUPPORTED_VERSION
            ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
            assert ranges == advertised(broker) and ranges[PRODUCE] == (3, 10)
            api_versions_on(s, 9)  # the connection stays open: the client downgrades on it
    lines = [line for line in broker.log().splitlines() if f": ApiVersions v{version} is not supported" in line]
    assert len(lines) == 1 and "answered UNSUPPORTED_VERSION" in lines[0], lines


# ------------------------------------------------------------------ unknown API keys
def test_an_unknown_api_key_is_logged_once_and_counted(broker):
    before = broker.counter("bad_frames")
    with raw_conn(broker.bootstrap) as other:
        for corr in (1, 2):
            closed_without_answer(broker, header_v1(4242, 0, corr) + b"\x00" * 8)
            api_versions_on(other, corr)
    wait_for(lambda: broker.counter("bad_frames") >= before + 2, 5, what="bad_frames counted")
    lines = [line for line in broker.log().splitlines() if "unknown API key 4242" in line]
    assert len(lines) == 1, lines
    assert "closing the connection" in lines[0]


# ------------------------------------------------------------------ consumer groups
def run_client(script: str, *args: str) -> dict:
    """Run ``script`` (Python) in a subprocess with ``args``; the JSON object its last line prints.
    A client still running at CLIENT_DEADLINE is killed: it was spinning."""
    try:
        r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                           timeout=CLIENT_DEADLINE, env=child_env(), cwd=os.getcwd())
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the client was still running after {CLIENT_DEADLINE:.0f}s (spinning); "
                             f"its output:\n{e.stdout}\n{e.stderr}") from None
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


KAFKA_PYTHON_GROUP = """
import json, sys, time
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
bootstrap, topic, how, pinned, want = sys.argv[1:6]
extra = {"api_version": (2, 0, 0)} if pinned == "pinned" else {}
c = KafkaConsumer(bootstrap_servers=bootstrap, group_id="surface-group-" + how + pinned, enable_auto_commit=False,
                  auto_offset_reset="earliest", **extra)
tp = TopicPartition(topic, 0)
t0 = time.monotonic()
out = {"error": None, "values": []}
try:
    if how == "subscribe":
        c.subscribe([topic])
        while len(out["values"]) < int(want):
            for records in c.poll(timeout_ms=500).values():
                out["values"] += [r.value.decode() for r in records]
        c.commit()
    else:
        c.assign([tp])
        c.commit({tp: OffsetAndMetadata(1, "", -1)})
    out["committed"] = c.committed(tp)
except Exception as e:
    out.update(error=type(e).__name__, text=str(e))
out["seconds"] = time.monotonic() - t0
c.close()
print(json.dumps(out))
"""

CONFLUENT_GROUP = """
import json, sys, time
from confluent_kafka import Consumer, KafkaException, TopicPartition
bootstrap, topic, how, want = sys.argv[1:5]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "surface-group-" + how, "enable.auto.commit": False,
              "auto.offset.reset": "earliest", "log_level": 0})
t0 = time.monotonic()
out = {"error": None, "values": []}
try:
    if how == "subscribe":
        c.subscribe([topic])
    else:
        c.assign([TopicPartition(topic, 0, 0)])
    while out["error"] is None and len(out["values"]) < int(want):
        m = c.poll(0.2)
        if m is None:
            continue
        if m.error():
            out.update(error=m.error().name(), text=m.error().str())
        else:
            out["values"].append(m.value().decode())
    c.commit(asynchronous=False)
    out["committed"] = sum(t.offset for t in c.committed(c.assignment(), timeout=10))
finally:
    out["seconds"] = time.monotonic() - t0
    c.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def group_topic(broker):
    assert produce_confluent(broker.bootstrap, "grouped", range(6)) == []
    return "grouped"


def find_coordinator(b: MeteredBroker, version: int, key: str, key_type: int | None = None):
    fields = {"key": key} if key_type is None else {"key": key, "key_type": key_type}
    return call(b.proc, FIND_COORDINATOR, version, **fields)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_find_coordinator_names_this_broker_for_groups_and_transactions(broker, version):
    group = find_coordinator(broker, version, "some-group", None if version == 0 else 0)
    assert int(group.error_code) == 0 and int(group.node_id) == 1 and int(group.port) == broker.proc.port
    if version >= 1:
        txn = find_coordinator(broker, version, "some-transactional-id", 1)
        assert int(txn.error_code) == 0 and int(txn.node_id) == 1 and int(txn.port) == broker.proc.port
        assert int(find_coordinator(broker, version, "x", 2).error_code) == Errors.INVALID_REQUEST


@pytest.mark.parametrize("how,pinned", [("subscribe", "negotiated"), ("subscribe", "pinned"),
                                        ("commit", "negotiated")])
def test_kafka_python_consumer_in_a_group_reads_and_commits(broker, group_topic, how, pinned):
    """Negotiated, or pinned to api_version (2, 0) as many deployments do (the client then uses the
    group APIs' old versions)."""
    out = run_client(KAFKA_PYTHON_GROUP, broker.bootstrap, group_topic, how, pinned, "6")
    assert out["error"] is None, out
    if how == "subscribe":
        assert sorted(out["values"]) == [str(i) for i in range(6)]
        on_zero = sum(1 for part, _, _ in consume_all(broker.bootstrap, group_topic, 2, 6) if part == 0)
        assert out["committed"] == on_zero, out  # partition 0's end: all of it was read and committed
    else:
        assert out["committed"] == 1, out


def test_confluent_consumer_in_a_group_reads_and_commits(broker, group_topic):
    out = run_client(CONFLUENT_GROUP, broker.bootstrap, group_topic, "subscribe", "6")
    assert out["error"] is None and sorted(out["values"]) == [str(i) for i in range(6)], out
    assert out["committed"] == 6, out


def test_consumers_that_use_no_group_still_read(broker, group_topic):
    """kafka-python without a group_id (assign + poll) is untouched; confluent-kafka, which always has
    a group.id, reads what it assigned itself and commits it (a commit of generation -1)."""
    got = consume_all(broker.bootstrap, group_topic, 2, 6)
    assert sorted(v for _, _, v in got) == list(range(6))
    on_zero = sum(1 for part, _, _ in got if part == 0)
    out = run_client(CONFLUENT_GROUP, broker.bootstrap, group_topic, "assign", str(on_zero))
    assert out["error"] is None and len(out["values"]) == on_zero and out["committed"] == on_zero, out


# ------------------------------------------------------------------ long topic names
def long_name(n: int) -> str:
    return (f"long-{n}." + "abcdefghij-._0123456789" * 20)[:n]


def metadata(b: MeteredBroker, names: list[str]) -> dict[str, int]:
    """Metadata v9 for ``names`` (auto-creation allowed): {name: error code}."""
    topic_cls = __import__(kafka.load_request_schema(METADATA, 9).__module__, fromlist=["MetadataRequestTopic"])
    body = call(b.proc, METADATA, 9, topics=tuple(topic_cls.MetadataRequestTopic(name=n) for n in names),
                allow_auto_topic_creation=True, include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False)
    return {t.name: int(t.error_code) for t in body.topics}


def test_topic_names_of_240_to_249_characters_produce_consume_and_survive_a_restart(module_quorum):
    b = start_metered(module_quorum, 2, "--partitions", "2")
    proc = b.proc
    names = [long_name(n) for n in (240, 245, 246, 249)]
    try:
        for i, name in enumerate(names):
            assert produce_confluent(b.bootstrap, name, range(i * 10, i * 10 + 10)) == []
        for i, name in enumerate(names):
            got = consume_all(b.bootstrap, name, 2, 10)
            assert sorted(v for _, _, v in got) == list(range(i * 10, i * 10 + 10)), name
        proc.stop()
        proc.start()
        assert metadata(b, names) == {name: 0 for name in names}
        for i, name in enumerate(names):
            produce_kafka_python(b.bootstrap, name, range(100 + i, 101 + i))
            got = consume_all(b.bootstrap, name, 2, 11)
            assert sorted(v for _, _, v in got) == [*range(i * 10, i * 10 + 10), 100 + i], name
        assert "File name too long" not in proc.tail(100_000)
    finally:
        proc.stop()


def test_a_250_character_name_is_refused_and_the_other_topics_are_answered(broker):
    too_long, longest = "x" * 250, long_name(249)
    assert metadata(broker, ["md-first", too_long, longest, "md-last"]) == {
        "md-first": 0, too_long: Errors.INVALID_TOPIC_EXCEPTION, longest: 0, "md-last": 0}


def test_a_disk_error_on_one_topic_is_that_topics_error(tmp_path):
    """Metadata with a topic whose files the disk refuses: KAFKA_STORAGE_ERROR for it, the others answered
    (it was UNKNOWN_SERVER_ERROR for the whole request).  A broker object, no process: the disk error is
    injected into its storage."""
    cfg = BrokerConfig(broker_id=1, quorum=["127.0.0.1:1"], data_dir=str(tmp_path), listen="127.0.0.1:0")
    server = BrokerServer(cfg)
    try:
        real = server.storage.ensure_topic

        def refuse(name, partitions=None):
            if name == "on-a-bad-disk":
                raise OSError(errno.EIO, "Input/output error")
            return real(name, partitions)

        server.storage.ensure_topic = refuse
        topic_cls = __import__(kafka.load_request_schema(METADATA, 9).__module__, fromlist=["MetadataRequestTopic"])
        body = kafka.request_entity(METADATA, 9, topics=tuple(
            topic_cls.MetadataRequestTopic(name=n) for n in ("before", "on-a-bad-disk", "after")),
            allow_auto_topic_creation=True, include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False)
        resp = server._metadata(kafka.Request(METADATA, 9, 1, "test", body))
        assert {t.name: int(t.error_code) for t in resp.topics} == {
            "before": 0, "on-a-bad-disk": Errors.KAFKA_STORAGE_ERROR, "after": 0}
    finally:
        server._io.shutdown()
        server.storage.close()
