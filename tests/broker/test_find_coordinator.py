"""FindCoordinator v0-v6 on the wire, against a real broker process and a real three-node quorum.

Requests are encoded with kio (one v4 request also by hand, byte by byte, so a kio writer bug cannot
hide on both sides) and sent over raw sockets; each answer is decoded with the kio schema of the
request's version and must be exactly that long (``strict``): an answer in another version's layout
fails.  Covered per version: transaction keys and group keys (this broker), batches (v4+, KIP-699: one entry per key, in order, each with its own error), share
keys (type 2, KIP-932: INVALID_REQUEST, as Kafka answers a broker without a share coordinator), and bad
input (unknown key type, empty batch, too many keys, over-long keys, an unreadable body): each is
answered, and the connection keeps serving.

One batch has one key type (the request's ``key_type``); "mixed" here is a batch of good and bad keys,
and group and transaction requests interleaved on one connection.

Real clients: kafka-python 3.0 negotiates FindCoordinator v6 with this broker (its transactional
producer, and its admin client's batched lookups); librdkafka (confluent-kafka 2.16) asks v0-v2 only,
so its transactional producer checks that advertising v6 changed nothing for it.
"""
from __future__ import annotations

import socket
import struct
import time

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader

from tests.broker.conftest import MeteredBroker, metered_broker
from tests.quorum.test_bad_input import framed, header_v2, raw_conn
from records.wire import kafka
from records.wire.errors import Errors

FIND_COORDINATOR = 10
GROUP, TRANSACTION, SHARE = 0, 1, 2
VERSIONS = range(0, 7)
BATCHED = [4, 5, 6]
SINGLE = [1, 2, 3]  # the versions with a key type and one key
MAX_KEYS, MAX_KEY_CHARS = 10_000, 32767  # broker.frontend's bounds


@pytest.fixture(scope="module")
def broker(module_quorum):
    yield from metered_broker(module_quorum, 1, "--partitions", "1")


# ------------------------------------------------------------------ helpers
def _recv(s: socket.socket, n: int, deadline: float) -> bytes:
    out = b""
    while len(out) < n:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = s.recv(n - len(out))
        assert chunk, f"connection closed after {len(out)} of {n} bytes"
        out += chunk
    return out


def read_answer(s: socket.socket, timeout: float = 10.0) -> bytes:
    """One response frame, size prefix removed (any size: a 10,000-key answer is over 1 MB)."""
    deadline = time.monotonic() + timeout
    (size,) = struct.unpack(">i", _recv(s, 4, deadline))
    return _recv(s, size, deadline)


def strict(frame: bytes, version: int):
    """(correlation id, body) of a FindCoordinator answer read with ``version``'s kio schema, which must
    account for every byte of it."""
    resp_cls = load_response_schema(FIND_COORDINATOR, version)
    header, off = entity_reader(resp_cls.__header_schema__)(frame, 0)
    body, size = entity_reader(resp_cls)(frame, off)
    assert off + size == len(frame), f"v{version} answer: {len(frame) - off - size} bytes past its layout"
    return int(header.correlation_id), body


def ask(s: socket.socket, version: int, corr: int = 7, **fields):
    """One FindCoordinator on an open connection; its decoded answer."""
    frame = kafka.encode_request(kafka.request_entity(FIND_COORDINATOR, version, **fields), corr)
    s.sendall(frame)
    got, body = strict(read_answer(s), version)
    assert got == corr
    return body


def find(b: MeteredBroker, version: int, **fields):
    with raw_conn(b.bootstrap) as s:
        return ask(s, version, **fields)


def single(version: int, key: str, key_type: int) -> dict:
    return {"key": key} if version == 0 else {"key": key, "key_type": key_type}


def entries(body) -> list[tuple[str, int, int, str, int, str | None]]:
    return [(c.key, int(c.error_code), int(c.node_id), c.host, int(c.port), c.error_message)
            for c in body.coordinators]


def is_me(b: MeteredBroker, node_id: int, host: str, port: int) -> bool:
    return node_id == 1 and port == b.proc.port and host in ("127.0.0.1", "localhost")


# ------------------------------------------------------------------ versions
def test_api_versions_advertises_v0_to_v6(broker):
    with raw_conn(broker.bootstrap) as s:
        s.sendall(kafka.encode_request(kafka.request_entity(kafka.API_VERSIONS, 0), 1))
        _, body = kafka.parse_response(read_answer(s), kafka.API_VERSIONS, 0)
    ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
    assert ranges[FIND_COORDINATOR] == (0, 6)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_group_key_is_coordinated_by_this_broker(broker, version):
    if version < 4:
        body = find(broker, version, **single(version, "orders-group", GROUP))
        assert int(body.error_code) == 0
        assert is_me(broker, int(body.node_id), body.host, int(body.port))
    else:
        body = find(broker, version, key_type=GROUP, coordinator_keys=("g-a", "g-b", "g-a"))
        got = entries(body)
        assert [e[0] for e in got] == ["g-a", "g-b", "g-a"]  # one entry per key, in order
        for key, code, node, host, port, message in got:
            assert code == 0 and is_me(broker, node, host, port), (key, code, message)


@pytest.mark.parametrize("version", [v for v in VERSIONS if v >= 1])
def test_transaction_keys_are_coordinated_by_this_broker(broker, version):
    if version < 4:
        body = find(broker, version, key="payments-tx", key_type=TRANSACTION)
        assert int(body.error_code) == 0 and body.error_message is None
        assert is_me(broker, int(body.node_id), body.host, int(body.port)), body
        return
    keys = ("tx-1", "tx-2", "tx-1", "", "tx-" + "é" * 300)
    got = entries(find(broker, version, key_type=TRANSACTION, coordinator_keys=keys))
    assert [e[0] for e in got] == list(keys)
    for key, code, node, host, port, message in got:
        assert code == 0 and message is None and is_me(broker, node, host, port), (key, code, node, host, port)


def test_v4_request_built_by_hand_byte_by_byte(broker):
    """The v4 layout without kio's writer: header v2 (client id an int16 string, then tagged fields), then
    key_type int8, coordinator_keys a compact array of compact strings (lengths as unsigned varints
    plus one), tagged fields."""
    keys = [b"hand-1", b"hand-2"]
    body = bytes([TRANSACTION, len(keys) + 1]) + b"".join(bytes([len(k) + 1]) + k for k in keys) + b"\x00"
    with raw_conn(broker.bootstrap) as s:
        s.sendall(framed(header_v2(FIND_COORDINATOR, 4, 0x4B4B) + body))
        frame = read_answer(s)
    corr, answer = strict(frame, 4)
    assert corr == 0x4B4B
    assert [(e[0], e[1]) for e in entries(answer)] == [("hand-1", 0), ("hand-2", 0)]
    # Response header v1 (correlation id, tagged fields), throttle_time_ms int32, then the compact array.
    assert frame[:4] == struct.pack(">i", 0x4B4B) and frame[4] == 0 and frame[5:9] == b"\x00\x00\x00\x00"
    assert frame[9] == len(keys) + 1


# ------------------------------------------------------------------ batches of good and bad keys
@pytest.mark.parametrize("version", BATCHED)
def test_an_over_long_key_is_refused_and_the_rest_of_its_batch_answered(broker, version):
    long_key = "x" * (MAX_KEY_CHARS + 1)
    got = entries(find(broker, version, key_type=TRANSACTION,
                       coordinator_keys=("ok-1", long_key, "x" * MAX_KEY_CHARS, "ok-2")))
    assert [e[0] for e in got] == ["ok-1", long_key, "x" * MAX_KEY_CHARS, "ok-2"]
    assert [e[1] for e in got] == [0, Errors.INVALID_REQUEST, 0, 0]
    assert f"{MAX_KEY_CHARS + 1} characters" in got[1][5] and got[1][2:5] == (-1, "", -1)


def test_an_over_long_key_at_v3(broker):
    body = find(broker, 3, key="y" * 100_000, key_type=TRANSACTION)
    assert int(body.error_code) == Errors.INVALID_REQUEST and "100000 characters" in body.error_message
    assert int(body.node_id) == -1


def test_group_and_transaction_requests_interleaved_on_one_connection(broker):
    with raw_conn(broker.bootstrap) as s:
        for i, version in enumerate([6, 2, 4, 0, 5, 3, 1]):
            if version >= 4:
                group = ask(s, version, corr=2 * i, key_type=GROUP, coordinator_keys=("g",))
                txn = ask(s, version, corr=2 * i + 1, key_type=TRANSACTION, coordinator_keys=("t",))
                assert entries(group)[0][1] == 0 and entries(txn)[0][1] == 0
            else:
                group = ask(s, version, corr=2 * i, **single(version, "g", GROUP))
                assert int(group.error_code) == 0 and int(group.node_id) == 1
                if version >= 1:
                    assert int(ask(s, version, corr=2 * i + 1, key="t", key_type=TRANSACTION).error_code) == 0


# ------------------------------------------------------------------ bad input: answered, connection kept
@pytest.mark.parametrize("version", SINGLE + BATCHED)
@pytest.mark.parametrize("key_type", [3, -1, 127])
def test_an_unknown_key_type_is_invalid_request_for_every_key(broker, version, key_type):
    with raw_conn(broker.bootstrap) as s:
        if version < 4:
            body = ask(s, version, key="k", key_type=key_type)
            assert int(body.error_code) == Errors.INVALID_REQUEST and int(body.node_id) == -1
            assert f"unknown coordinator key type {key_type}" in body.error_message
        else:
            got = entries(ask(s, version, key_type=key_type, coordinator_keys=("k1", "k2")))
            assert [(e[0], e[1]) for e in got] == [("k1", Errors.INVALID_REQUEST), ("k2", Errors.INVALID_REQUEST)]
            assert all(f"unknown coordinator key type {key_type}" in e[5] for e in got)
        assert int(ask(s, 1, corr=8, key="still-open", key_type=TRANSACTION).error_code) == 0


@pytest.mark.parametrize("version", SINGLE + BATCHED)
def test_a_share_key_is_invalid_request(broker, version):
    """Key type 2 (KIP-932's share-group state, asked by brokers): Kafka answers INVALID_REQUEST below v6
    and, at v6, on a broker without a share coordinator; this broker has none."""
    if version < 4:
        body = find(broker, version, key="sg:topic-id:0", key_type=SHARE)
        assert int(body.error_code) == Errors.INVALID_REQUEST and "needs FindCoordinator v6" in body.error_message
        return
    got = entries(find(broker, version, key_type=SHARE, coordinator_keys=("sg:a:0", "sg:a:1")))
    assert [(e[0], e[1], e[2]) for e in got] == [("sg:a:0", Errors.INVALID_REQUEST, -1),
                                                 ("sg:a:1", Errors.INVALID_REQUEST, -1)]
    said = "share groups are not served" if version == 6 else "needs FindCoordinator v6"
    assert all(said in e[5] for e in got), got


@pytest.mark.parametrize("version", BATCHED)
@pytest.mark.parametrize("key_type", [GROUP, TRANSACTION])
def test_an_empty_batch_is_answered_invalid_request(broker, version, key_type):
    with raw_conn(broker.bootstrap) as s:
        got = entries(ask(s, version, key_type=key_type, coordinator_keys=()))
        assert got == [("", Errors.INVALID_REQUEST, -1, "", -1, "the request names no coordinator keys")]
        assert entries(ask(s, version, corr=8, key_type=TRANSACTION, coordinator_keys=("t",)))[0][1] == 0


def test_too_many_keys_are_not_looked_up(broker):
    keys = tuple(f"k{i}" for i in range(MAX_KEYS + 1))
    with raw_conn(broker.bootstrap) as s:
        got = entries(ask(s, 6, key_type=GROUP, coordinator_keys=keys))
        assert len(got) == MAX_KEYS and [e[0] for e in got] == list(keys[:MAX_KEYS])
        assert {e[1] for e in got} == {Errors.INVALID_REQUEST}
        assert f"{MAX_KEYS + 1} coordinator keys in one request, at most {MAX_KEYS}" in got[0][5]
        # At the bound, every key is looked up.
        got = entries(ask(s, 6, corr=8, key_type=TRANSACTION, coordinator_keys=keys[:MAX_KEYS]))
        assert len(got) == MAX_KEYS and {e[1] for e in got} == {0}


@pytest.mark.parametrize("version", [3] + BATCHED)
def test_an_unreadable_body_is_answered_in_its_versions_layout(broker, version):
    """A flexible body cut short (a compact array of 5 keys holding 1): INVALID_REQUEST, from v4 as an
    entry for the key "" (no key could be read), and the connection keeps serving."""
    body = bytes([TRANSACTION]) if version >= 4 else b"\x02k"  # v3: key "k", then no key type
    body += b"\x06\x02a" if version >= 4 else b""
    with raw_conn(broker.bootstrap) as s:
        s.sendall(framed(header_v2(FIND_COORDINATOR, version, 0x1234) + body))
        corr, answer = strict(read_answer(s), version)
        assert corr == 0x1234
        if version >= 4:
            assert entries(answer) == [("", Errors.INVALID_REQUEST, -1, "", -1, "INVALID_REQUEST")]
        else:
            assert int(answer.error_code) == Errors.INVALID_REQUEST and int(answer.node_id) == -1
        assert int(ask(s, 2, corr=9, key="t", key_type=TRANSACTION).error_code) == 0
    assert "Traceback" not in broker.log()


# ------------------------------------------------------------------ real clients
def test_kafka_python_negotiates_v6_and_its_transactional_producer_commits(broker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.protocol.metadata import FindCoordinatorRequest

    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="fc-kp-tx", acks="all", linger_ms=2,
                      request_timeout_ms=10_000)
    try:
        assert p._sender._client._manager.broker_version_data.api_version(FindCoordinatorRequest) == 6
        p.init_transactions()
        p.begin_transaction()
        for i in range(3):
            p.send("fc-topic", value=str(i).encode(), partition=0)
        p.commit_transaction()
    finally:
        p.close(timeout=10)
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed",
                      enable_auto_commit=False, auto_offset_reset="earliest", consumer_timeout_ms=1500)
    try:
        c.assign([TopicPartition("fc-topic", 0)])
        assert [m.value for m in c] == [b"0", b"1", b"2"]
    finally:
        c.close()


def test_kafka_python_admin_batched_lookups(broker):
    """The admin client looks coordinators up in one v4+ request for many keys (KIP-699)."""
    from kafka import KafkaAdminClient
    from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    try:
        assert admin._manager.broker_version_data.api_version(FindCoordinatorRequest) == 6
        ids = admin._manager.run(admin._find_coordinator_ids, ["adm-tx-1", "adm-tx-2", "adm-tx-3"],
                                 CoordinatorType.TRANSACTION)
        assert ids == {"adm-tx-1": 1, "adm-tx-2": 1, "adm-tx-3": 1}
        groups = admin._manager.run(admin._find_coordinator_ids, ["adm-group-1", "adm-group-2"],
                                    CoordinatorType.GROUP)
        assert groups == {"adm-group-1": 1, "adm-group-2": 1}
    finally:
        admin.close()


def test_librdkafka_transactional_producer_still_commits(broker):
    """librdkafka asks FindCoordinator v0-v2 whatever the broker advertises (v2 here)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "fc-rdk-tx", "linger.ms": 2,
                  "log_level": 3})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce("fc-rdk-topic", value=str(i), partition=0)
    p.commit_transaction(30)
