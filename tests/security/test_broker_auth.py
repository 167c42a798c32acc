"""Real Kafka clients (confluent-kafka / librdkafka and kafka-python) against a real broker process
that requires SASL (inside TLS, and without), backed by a SASL_SSL quorum holding the ACLs.

Users: alice has IDEMPOTENT_WRITE on the cluster, WRITE on transactional ids prefixed "alice-" and WRITE on
topics prefixed "secured" (Produce needs it, as in Kafka); bob authenticates but has no ACL; the broker's own
user has CLUSTER_ACTION on the quorum.
"""
from __future__ import annotations

import socket
import struct
import threading

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from kafka import KafkaProducer
from kafka import errors as kerrors

from benchmarks.processes import BrokerProcess, BrokerStartError
from quorum.client import api as p
from quorum.security.acl import IDEMPOTENT_WRITE, PREFIXED, TOPIC, TRANSACTIONAL_ID, WRITE
from tests.conftest import wait_for
from tests.security.conftest import BROKER_ACL, PASSWORDS, allow, read_partition
from records.wire import kafka

ACLS = [BROKER_ACL,
        allow("alice", IDEMPOTENT_WRITE),
        allow("alice", WRITE, TRANSACTIONAL_ID, "alice-", PREFIXED),
        allow("alice", WRITE, TOPIC, "secured", PREFIXED)]


@pytest.fixture(scope="module")
def secure_brokers(secure_quorum, tmp_path_factory):
    sq = secure_quorum
    sq.grant(ACLS)
    base = str(tmp_path_factory.mktemp("brokers"))
    common = sq.broker_flags()
    tls = BrokerProcess(base, 1, sq.addresses, *common, "--tls-certfile", sq.pki.certfile,
                        "--tls-keyfile", sq.pki.keyfile)
    plain = BrokerProcess(base, 2, sq.addresses, *common)
    started = []
    try:
        for b in (tls, plain):
            b.start()
            started.append(b)
        yield {"tls": tls, "plain": plain, "pki": sq.pki}
    finally:
        for b in started:
            b.stop()


def confluent_config(brokers, user, password=None, mechanism="PLAIN", tls=True, **extra):
    b = brokers["tls" if tls else "plain"]
    cfg = {"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
           "sasl.mechanism": mechanism, "sasl.username": user,
           "sasl.password": PASSWORDS.get(user, "") if password is None else password,
           "log_level": 0, "message.timeout.ms": 20000, **extra}
    if tls:
        cfg["ssl.ca.location"] = brokers["pki"].cafile
    return cfg


def first_error(cfg, action, timeout=20.0):
    """Run ``action(producer)`` and return the first error librdkafka reports (error_cb or delivery)."""
    errors: list[KafkaError] = []
    got = threading.Event()

    def on_error(err):
        errors.append(err)
        got.set()
    producer = Producer({**cfg, "error_cb": on_error})

    def poll():
        try:
            producer.poll(0.05)
        except KafkaException as e:  # a fatal error is raised from poll()
            on_error(e.args[0])
        return got.is_set()
    try:
        action(producer, on_error)
        wait_for(poll, timeout, what="an error from librdkafka")
        return errors[0]
    finally:
        producer.purge()
        producer.flush(0)


def _produce(producer, on_error):
    producer.produce("secured", value=b"x", on_delivery=lambda err, msg: on_error(err) if err else None)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_confluent_right_password_over_tls(secure_brokers, mechanism):
    delivered = []
    producer = Producer({**confluent_config(secure_brokers, "alice", mechanism=mechanism),
                         "enable.idempotence": True})
    for i in range(20):
        producer.produce("secured", value=str(i).encode(), on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(30) == 0
    assert delivered == [None] * 20
    # a transactional id alice may write (prefix "alice-"): InitProducerId succeeds
    tx = Producer({**confluent_config(secure_brokers, "alice", mechanism=mechanism),
                   "transactional.id": f"alice-{mechanism}"})
    tx.init_transactions(20)


def test_confluent_refusals(secure_brokers):
    for user, password in (("alice", "wrong"), ("mallory", "x")):
        err = first_error(confluent_config(secure_brokers, user, password), _produce)
        assert err.code() == KafkaError._AUTHENTICATION, err
        assert "Invalid username or password" in err.str(), err.str()
    # authenticated, but no IDEMPOTENT_WRITE: InitProducerId -> CLUSTER_AUTHORIZATION_FAILED (fatal in librdkafka)
    err = first_error({**confluent_config(secure_brokers, "bob"), "enable.idempotence": True}, _produce)
    assert err.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, err
    # a transactional id outside alice's prefix: TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    tx = Producer({**confluent_config(secure_brokers, "alice"), "transactional.id": "bob-tx"})
    with pytest.raises(KafkaException) as e:
        tx.init_transactions(20)
    assert e.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, e.value


def kafka_python_producer(brokers, user, password=None, tls=False, **extra):
    b = brokers["tls" if tls else "plain"]
    kw = dict(bootstrap_servers=b.bootstrap, security_protocol="SASL_SSL" if tls else "SASL_PLAINTEXT",
              sasl_mechanism="PLAIN", sasl_plain_username=user,
              sasl_plain_password=PASSWORDS.get(user, "") if password is None else password,
              request_timeout_ms=5000, reconnect_backoff_max_ms=200, **{"max_block_ms": 10000, **extra})
    if tls:
        kw["ssl_cafile"] = brokers["pki"].cafile
    return KafkaProducer(**kw)


@pytest.mark.parametrize("tls", [False, True])
def test_kafka_python_right_password(secure_brokers, tls):
    producer = kafka_python_producer(secure_brokers, "alice", tls=tls, enable_idempotence=True, acks="all")
    try:
        meta = [producer.send("secured-kp", value=str(i).encode()) for i in range(10)]
        producer.flush(20)
        offsets = [m.get(timeout=10).offset for m in meta]
        assert offsets == sorted(offsets) and len(set(offsets)) == 10
    finally:
        producer.close(timeout=5)


def test_kafka_python_refusals(secure_brokers, caplog):
    # kafka-python 3.0 logs the broker's SASL_AUTHENTICATION_FAILED and retries bootstrap until bootstrap_timeout_ms
    # (6 s: on a loaded machine 2 s did not always see one SASL round trip)
    for user, password in (("alice", "wrong"), ("mallory", "alice-pw")):
        caplog.clear()
        with pytest.raises((kerrors.SaslAuthenticationFailedError, kerrors.KafkaTimeoutError)):
            kafka_python_producer(secure_brokers, user, password, bootstrap_timeout_ms=6000).close(timeout=1)
        assert any("SaslAuthenticationFailedError" in r.getMessage()
                   and "Invalid username or password" in r.getMessage() for r in caplog.records)
    producer = kafka_python_producer(secure_brokers, "bob", enable_idempotence=True, acks="all")
    try:
        # kafka-python wraps it: "Unexpected error in InitProducerIdResponse: [Error 31] ClusterAuthorization..."
        with pytest.raises(kerrors.KafkaError, match="ClusterAuthorizationFailed"):
            producer.send("secured-kp", value=b"x").get(timeout=20)
    finally:
        producer.close(timeout=5)


def kafka_python_read(brokers, user, topic, expect):
    """Every value of partition 0 of ``topic``, read as ``user`` (Fetch needs authentication only)."""
    return read_partition(brokers["plain"].bootstrap, user, topic, expect)


def test_produce_needs_write_on_the_topic(secure_brokers):
    """Produce needs WRITE on each topic it writes to (as in Kafka): without it the topic's partitions are answered
    TOPIC_AUTHORIZATION_FAILED and nothing is written; alice's prefixed ACL ("secured") lets her write."""
    def send(user, topic, value, **extra):
        producer = kafka_python_producer(secure_brokers, user, acks="all", **extra)
        try:
            return producer.send(topic, value=value, partition=0).get(timeout=20)
        finally:
            producer.close(timeout=5)
    # alice may produce (IDEMPOTENT_WRITE) but not to this topic: the topic ACL is what refuses her
    with pytest.raises(kerrors.TopicAuthorizationFailedError):
        send("alice", "unsecured-w", b"alice-refused", enable_idempotence=True)
    # bob has no ACL: a plain (non-idempotent) producer needs nothing but WRITE on the topic, which he lacks
    with pytest.raises(kerrors.TopicAuthorizationFailedError):
        send("bob", "secured-w", b"bob-refused", enable_idempotence=False)
    # alice's prefixed WRITE covers "secured-w"
    assert send("alice", "secured-w", b"alice-0", enable_idempotence=True).offset == 0
    assert send("alice", "secured-w", b"alice-1", enable_idempotence=False).offset == 1
    # nothing refused was written (read back, as alice and as bob: Fetch needs authentication only)
    assert kafka_python_read(secure_brokers, "alice", "secured-w", 2) == [b"alice-0", b"alice-1"]
    assert kafka_python_read(secure_brokers, "bob", "secured-w", 2) == [b"alice-0", b"alice-1"]
    assert kafka_python_read(secure_brokers, "alice", "unsecured-w", 0) == []
    log = secure_brokers["plain"].tail(400)
    assert "User:alice is not allowed WRITE on topic 'unsecured-w'" in log
    assert "User:bob is not allowed WRITE on topic 'secured-w'" in log


def test_broker_closes_unauthenticated_requests_and_keeps_serving(secure_brokers):
    b = secure_brokers["plain"]
    host, port = b.bootstrap.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    body = kafka.request_entity(3, 1, topics=None)  # Metadata v1, before any SASL
    s.sendall(kafka.encode_request(body, 1, "raw"))
    assert s.recv(4) == b""  # closed, no answer
    s.close()
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(kafka.encode_request(kafka.request_entity(17, 1, mechanism="OAUTHBEARER"), 2, "raw"))
    size = struct.unpack(">i", s.recv(4))[0]
    data = b""
    while len(data) < size:
        data += s.recv(size - len(data))
    resp = p.QUORUM_API.parse_response(data, 17, 1)[1]
    assert int(resp.error_code) == 33 and list(resp.mechanisms) == ["PLAIN", "SCRAM-SHA-256"]
    assert s.recv(4) == b""
    s.close()
    test_kafka_python_right_password(secure_brokers, tls=False)  # still serving


def test_broker_refuses_to_start_without_cluster_action_or_with_a_corrupt_file(secure_quorum, tmp_path):
    sq = secure_quorum
    quorum_as_bob = ["--quorum-security-protocol", "SASL_SSL", "--quorum-sasl-username", "bob",
                     "--quorum-tls-cafile", sq.pki.cafile]
    bob = {"PIDQUORUM_BROKER_SASL_PASSWORD": PASSWORDS["bob"]}  # the password from the environment
    b = BrokerProcess(str(tmp_path), 5, sq.addresses, "--sasl-credentials-file", sq.users_file, *quorum_as_bob,
                      env=bob)
    with pytest.raises(BrokerStartError, match="exited with 69") as e:
        b.start(timeout=30)
    assert "CLUSTER_AUTHORIZATION_FAILED" in str(e.value) and "not allowed" in str(e.value)
    bad = tmp_path / "users.json"
    bad.write_text('{"format": "pidquorum-credentials", "version": 1, "users": {"x": 1}}')
    b = BrokerProcess(str(tmp_path), 6, sq.addresses, "--sasl-credentials-file", str(bad), *quorum_as_bob, env=bob)
    with pytest.raises(BrokerStartError, match="exited with 78") as e:
        b.start(timeout=30)
    assert str(bad) in str(e.value) and "entry must be an object" in str(e.value)
