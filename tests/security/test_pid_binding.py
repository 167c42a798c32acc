"""Producer IDs bound to the principal they were handed to, against real broker processes that require
SASL (SASL_PLAINTEXT), backed by the module's SASL_SSL quorum (broker/pid_binding.py).

alice is the victim and uses real clients (confluent-kafka for producing, kafka-python for reading back);
bob, authenticated with IDEMPOTENT_WRITE and transactional ids of his own, attacks with raw Produce
requests carrying alice's producer ID.  Both may write the topics (WRITE on topics prefixed "pb-", which Produce
needs, as in Kafka), so what refuses bob is the binding, not a missing topic ACL.  Every attack is answered with
an authorization error and writes nothing; alice's records are all there, once."""
from __future__ import annotations

import datetime
import json
import threading

import pytest
from confluent_kafka import KafkaError, Producer

from benchmarks.processes import BrokerProcess
from broker.recordbatch import encode_batch
from quorum.security.acl import IDEMPOTENT_WRITE, PREFIXED, TOPIC, TRANSACTIONAL_ID, WRITE
from tests.conftest import wait_for
from tests.security.conftest import BROKER_ACL, PASSWORDS, allow, call, init_producer_id, read_partition
from tests.support.kafka_requests import entity
from records.wire import kafka
from records.wire.errors import Errors

PRODUCE = 0
ACLS = [BROKER_ACL,
        allow("alice", IDEMPOTENT_WRITE),
        allow("alice", WRITE, TRANSACTIONAL_ID, "pb-alice-", PREFIXED),
        allow("bob", IDEMPOTENT_WRITE),
        allow("bob", WRITE, TRANSACTIONAL_ID, "pb-bob-", PREFIXED),
        # Produce needs WRITE on the topic; the attacker has it too, so the binding is what refuses him
        allow("alice", WRITE, TOPIC, "pb-", PREFIXED),
        allow("bob", WRITE, TOPIC, "pb-", PREFIXED)]
AUTHZ = (Errors.CLUSTER_AUTHORIZATION_FAILED, Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)


def start_broker(sq, base: str, broker_id: int, *extra: str) -> BrokerProcess:
    return BrokerProcess(base, broker_id, sq.addresses, "--partitions", "1", *sq.broker_flags(), *extra).start()


@pytest.fixture(scope="module")
def granted(secure_quorum):
    secure_quorum.grant(ACLS)
    return secure_quorum


@pytest.fixture
def broker(granted, tmp_path):
    b = start_broker(granted, str(tmp_path), 11)
    try:
        yield b
    finally:
        b.stop()


# ------------------------------------------------------------------ clients
def raw_produce(b: BrokerProcess, user: str, topic: str, pid: int, epoch: int, seq: int, value: bytes = b"attack",
                tid: str | None = None, transactional: bool = False) -> tuple[Errors, int, str | None]:
    records = encode_batch([(None, value)], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                           transactional=transactional)
    pd = entity(PRODUCE, 9, "PartitionProduceData", index=0, records=records)
    td = entity(PRODUCE, 9, "TopicProduceData", name=topic, partition_data=(pd,))
    r = call(b, user, kafka.request_entity(PRODUCE, 9, transactional_id=tid, acks=-1,
                                           timeout=datetime.timedelta(seconds=5), topic_data=(td,)))
    p = r.responses[0].partition_responses[0]
    return Errors(int(p.error_code)), int(p.base_offset), p.error_message


class Alice:
    """A confluent-kafka producer authenticated as alice; its producer ID and epoch from librdkafka's
    statistics (``eos``), delivery reports collected."""

    def __init__(self, b: BrokerProcess, **extra):
        self.eos: dict = {}
        self.errors: list = []  # delivery failures and fatal errors (not a broker's restart: those are transient)
        self.delivered: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()
        self.p = Producer({"bootstrap.servers": b.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                           "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": PASSWORDS["alice"],
                           "statistics.interval.ms": 100, "stats_cb": self._stats, "error_cb": self._error,
                           "log_level": 0, "message.timeout.ms": 30000, "acks": "all", **extra})

    def _stats(self, raw: str) -> None:
        eos = json.loads(raw).get("eos") or {}
        with self._lock:
            self.eos = eos

    def _error(self, err) -> None:
        if err.fatal():
            self.errors.append(err)

    def pid(self, timeout: float = 20.0) -> tuple[int, int]:
        def assigned():
            self.p.poll(0.05)
            with self._lock:
                return self.eos.get("idemp_state") in ("Assigned", "Ready") and self.eos.get("producer_id", -1) >= 0
        wait_for(assigned, timeout, what="librdkafka to get its producer ID")
        with self._lock:
            return int(self.eos["producer_id"]), int(self.eos["producer_epoch"])

    def send(self, topic: str, *values: bytes) -> None:
        for v in values:
            self.p.produce(topic, value=v, on_delivery=self._report)
        assert self.p.flush(30) == 0

    def _report(self, err, msg) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.delivered.append((msg.offset(), msg.value()))


def read_back(b: BrokerProcess, topic: str, expect: int, committed: bool = False) -> list[bytes]:
    return read_partition(b.bootstrap, "alice", topic, expect, committed)


# ------------------------------------------------------------------ the report's probe
def test_the_victims_first_batch_is_written_the_attacker_is_refused(broker):
    alice = Alice(broker, **{"enable.idempotence": True})
    pid, epoch = alice.pid()
    # bob sends alice's first batch (and a fence) before she does
    code, offset, why = raw_produce(broker, "bob", "pb-probe", pid, epoch, 0)
    assert code == Errors.CLUSTER_AUTHORIZATION_FAILED and offset == -1, (code, why)
    assert f"producer id {pid}" in why and "User:bob" in why
    code, _, why = raw_produce(broker, "bob", "pb-probe", pid, epoch + 1, 0)
    assert code == Errors.CLUSTER_AUTHORIZATION_FAILED, (code, why)
    # an ID not handed out yet cannot be claimed ahead of its owner either
    code, _, why = raw_produce(broker, "bob", "pb-probe", pid + 1000, 0, 0)
    assert code == Errors.CLUSTER_AUTHORIZATION_FAILED and "bound to no principal" in why
    alice.send("pb-probe", b"victim-0", b"victim-1")
    assert alice.errors == [] and alice.delivered == [(0, b"victim-0"), (1, b"victim-1")]
    assert alice.pid() == (pid, epoch)  # neither fenced nor bumped
    assert read_back(broker, "pb-probe", 2) == [b"victim-0", b"victim-1"]
    assert "producer id" in broker.tail(400) and "CLUSTER_AUTHORIZATION_FAILED" in broker.tail(400)


def test_a_transactional_producers_id_and_transactional_id_are_alices_alone(broker):
    alice = Alice(broker, **{"transactional.id": "pb-alice-tx"})
    alice.p.init_transactions(30)
    pid, epoch = alice.pid()
    bob_pid = init_producer_id(broker, "bob")
    attempts = [
        # alice's producer ID in a non-transactional batch, no transactional id named
        dict(pid=pid, epoch=epoch, seq=0),
        # ... in a transactional batch naming bob's own transactional id (bob may write it)
        dict(pid=pid, epoch=epoch, seq=0, tid="pb-bob-tx", transactional=True),
        # ... naming alice's transactional id (bob may not write it), with a higher epoch
        dict(pid=pid, epoch=epoch + 1, seq=0, tid="pb-alice-tx", transactional=True),
        # bob's own producer ID, non-transactional, in a Produce naming alice's transactional id
        dict(pid=bob_pid, epoch=0, seq=0, tid="pb-alice-tx"),
    ]
    for attempt in attempts:
        code, _, why = raw_produce(broker, "bob", "pb-tx", **attempt)
        assert code == Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, (attempt, code, why)
    alice.p.begin_transaction()
    alice.send("pb-tx", b"tx-0", b"tx-1")
    alice.p.commit_transaction(30)
    assert alice.errors == [] and alice.pid() == (pid, epoch)
    assert read_back(broker, "pb-tx", 2, committed=True) == [b"tx-0", b"tx-1"]


def test_the_binding_survives_a_restart_and_a_crash(granted, tmp_path):
    b = start_broker(granted, str(tmp_path), 12)
    try:
        alice = Alice(b, **{"enable.idempotence": True})
        pid, epoch = alice.pid()
        alice.send("pb-restart", b"before")
        b.stop()  # a clean stop: the file rewritten
        b.start()
        assert raw_produce(b, "bob", "pb-restart", pid, epoch, 1)[0] == Errors.CLUSTER_AUTHORIZATION_FAILED
        alice.send("pb-restart", b"after a restart")  # the same librdkafka producer, reconnected
        assert alice.pid() == (pid, epoch) and alice.errors == []
        # a crash right after InitProducerId was answered: the binding was on disk before the answer
        raw_pid = init_producer_id(b, "alice")
        b.kill()
        b.start()
        code, _, why = raw_produce(b, "bob", "pb-restart", raw_pid, 0, 0)
        assert code == Errors.CLUSTER_AUTHORIZATION_FAILED and str(raw_pid) in why
        assert raw_produce(b, "alice", "pb-restart", raw_pid, 0, 0, b"raw after a crash")[0] == Errors.NONE
        assert read_back(b, "pb-restart", 3) == [b"before", b"after a restart", b"raw after a crash"]
    finally:
        b.stop()


def test_expired_state_the_owner_goes_on_a_forgotten_binding_needs_a_new_producer(granted, tmp_path):
    """producer_id_expiration_ms 1.5 s: the partition forgets alice's idle producer, her binding (7 x as long)
    still says whose the ID is: alice's next message goes, bob's batch is refused.  Once the binding is
    forgotten too, each of alice's messages fails with CLUSTER_AUTHORIZATION_FAILED (a permanent delivery error
    in librdkafka), and a new producer works."""
    b = start_broker(granted, str(tmp_path), 13, "--producer-id-expiration-ms", "1500")
    try:
        alice = Alice(b, **{"enable.idempotence": True})
        pid, epoch = alice.pid()
        alice.send("pb-expiry", b"first")
        wait_for(lambda: "expired 1 idle producers" in b.tail(400), 30, what="the partition to expire alice's state")
        assert raw_produce(b, "bob", "pb-expiry", pid, epoch, 1)[0] == Errors.CLUSTER_AUTHORIZATION_FAILED
        alice.send("pb-expiry", b"second")
        assert alice.errors == [] and [v for _, v in alice.delivered] == [b"first", b"second"]
        assert alice.pid()[0] == pid
        wait_for(lambda: "forgotten; 0 left" in b.tail(400), 60, what="the broker to forget alice's binding")
        assert raw_produce(b, "bob", "pb-expiry", pid, epoch, 2)[0] == Errors.CLUSTER_AUTHORIZATION_FAILED
        for value in (b"third", b"fourth"):  # each fails, permanently (not retried, not written)
            alice.p.produce("pb-expiry", value=value, on_delivery=alice._report)
            assert alice.p.flush(30) == 0
        assert [e.code() for e in alice.errors] == [KafkaError.CLUSTER_AUTHORIZATION_FAILED] * 2
        assert "bound to no principal" in b.tail(400)
        again = Alice(b, **{"enable.idempotence": True})  # what the application does: a new producer
        again.send("pb-expiry", b"fifth")
        assert again.errors == [] and again.pid()[0] != pid
        assert read_back(b, "pb-expiry", 3) == [b"first", b"second", b"fifth"]
    finally:
        b.stop()
