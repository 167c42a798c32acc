"""Kafka transactions (KIP-98, KIP-360, KIP-890 part 1) with unmodified clients, confluent-kafka (librdkafka)
and kafka-python, against real broker processes sharing a real three-node quorum.

Each test checks what a read_committed consumer sees (exactly the committed messages, in order) against
what a read_uncommitted one sees (everything appended), and where the last stable offset is.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition

from tests.broker.test_real_clients import consume_all
from tests.conftest import wait_for

PARTITIONS = 3


def txn_producer(bootstrap: str, tid: str, **config) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 2, "log_level": 3,
                  **config})
    p.init_transactions(30)
    return p


def send(p: Producer, topic: str, values) -> None:
    for v in values:
        p.produce(topic, key=str(v % PARTITIONS), value=str(v), partition=v % PARTITIONS)
    assert p.flush(30) == 0


def transaction(p: Producer, topic: str, values, commit: bool) -> bool:
    """One transaction sending ``values`` (as ``send``), committed or aborted; returns ``commit``."""
    p.begin_transaction()
    send(p, topic, values)
    if commit:
        p.commit_transaction(30)
    else:
        p.abort_transaction(30)
    return commit


def read(bootstrap: str, topic: str, committed: bool, timeout: float = 20.0, expect: int | None = None):
    """Every message of the topic a consumer with that isolation level sees: [(partition, offset, value)]."""
    return consume_all(bootstrap, topic, PARTITIONS, expect, timeout, committed)


def end_offsets(bootstrap: str, topic: str, committed: bool) -> dict[int, int]:
    """ListOffsets latest: the high watermark, or the last stable offset for read_committed."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      isolation_level="read_committed" if committed else "read_uncommitted")
    try:
        ends = c.end_offsets([KTopicPartition(topic, i) for i in range(PARTITIONS)])
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        c.close()


def values(got) -> list[int]:
    return sorted(v for _, _, v in got)


def assert_in_order(got) -> None:
    for part in range(PARTITIONS):
        rows = sorted((off, v) for p, off, v in got if p == part)
        assert [v for _, v in rows] == sorted(v for _, v in rows), f"partition {part} out of order"


# ------------------------------------------------------------------ commit and abort
def test_confluent_commit_and_abort(brokers):
    b = brokers(1, "--partitions", str(PARTITIONS))
    p = txn_producer(b.bootstrap, "cf-tx")
    committed = []
    for i in range(6):
        batch = list(range(i * 10, i * 10 + 10))
        if transaction(p, "cf", batch, commit=i % 2 == 0):
            committed += batch
    seen = read(b.bootstrap, "cf", committed=True, expect=len(committed))
    assert values(seen) == committed
    assert_in_order(seen)
    everything = read(b.bootstrap, "cf", committed=False, expect=60)
    assert values(everything) == list(range(60))
    assert end_offsets(b.bootstrap, "cf", True) == end_offsets(b.bootstrap, "cf", False)


def test_kafka_python_commit_and_abort(brokers):
    b = brokers(1, "--partitions", str(PARTITIONS))
    p = KafkaProducer(bootstrap_servers=b.bootstrap, transactional_id="kp-tx", acks="all", linger_ms=2)
    try:
        p.init_transactions()
        committed = []
        for i in range(4):
            p.begin_transaction()
            batch = list(range(i * 10, i * 10 + 10))
            for v in batch:
                p.send("kp", value=str(v).encode(), partition=v % PARTITIONS)
            # kafka-python's abort_transaction does not wait for the transaction's unsent batches: sent after
            # the abort, with the same epoch (transaction version 1, all the clients here speak), they are
            # taken into the next transaction once it adds their partition, as Kafka takes them (only
            # KIP-890 part 2's epoch bump per transaction tells them apart).  Flushed first, as its docs ask.
            p.flush()
            if i % 2:
                p.abort_transaction()
            else:
                p.commit_transaction()
                committed += batch
    finally:
        p.close(timeout=10)
    assert values(read(b.bootstrap, "kp", committed=True, expect=len(committed))) == committed
    assert values(read(b.bootstrap, "kp", committed=False, expect=40)) == list(range(40))


def test_open_transaction_holds_the_last_stable_offset(brokers):
    b = brokers(1, "--partitions", str(PARTITIONS))
    p = txn_producer(b.bootstrap, "lso-tx")
    p.begin_transaction()
    send(p, "lso", range(3))
    hw = end_offsets(b.bootstrap, "lso", False)
    lso = end_offsets(b.bootstrap, "lso", True)
    assert hw == {0: 1, 1: 1, 2: 1} and lso == {0: 0, 1: 0, 2: 0}
    assert read(b.bootstrap, "lso", committed=True, timeout=3) == []
    p.commit_transaction(30)
    assert values(read(b.bootstrap, "lso", committed=True, expect=3)) == [0, 1, 2]
    # the marker is an offset too: the LSO is past it
    assert end_offsets(b.bootstrap, "lso", True) == end_offsets(b.bootstrap, "lso", False) == {0: 2, 1: 2, 2: 2}


# ------------------------------------------------------------------ a producer that dies mid-transaction
_DYING_PRODUCER = """
import sys, time
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": "dying-tx", "transaction.timeout.ms": 3000,
              "log_level": 3})
p.init_transactions(30)
p.begin_transaction()
for v in range(5):
    p.produce("dying", value=str(v), partition=v % 3)
assert p.flush(30) == 0
print("sent", flush=True)
time.sleep(600)
"""


def test_producer_killed_mid_transaction_is_aborted_after_its_timeout(brokers):
    b = brokers(1, "--partitions", str(PARTITIONS))
    proc = subprocess.Popen([sys.executable, "-c", _DYING_PRODUCER, b.bootstrap], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "sent"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert end_offsets(b.bootstrap, "dying", True) == {0: 0, 1: 0, 2: 0}
    # The coordinator aborts it once the 3 s timeout is past: abort markers, and the LSO moves on.
    wait_for(lambda: end_offsets(b.bootstrap, "dying", True) == end_offsets(b.bootstrap, "dying", False),
             timeout=30, what="the LSO to reach the high watermark")
    assert read(b.bootstrap, "dying", committed=True, timeout=3) == []
    assert values(read(b.bootstrap, "dying", committed=False, expect=5)) == list(range(5))
    # A new instance with the same id goes on.
    p = txn_producer(b.bootstrap, "dying-tx")
    p.begin_transaction()
    send(p, "dying", [100])
    p.commit_transaction(30)
    assert values(read(b.bootstrap, "dying", committed=True, expect=1)) == [100]


# ------------------------------------------------------------------ coordinator crash
def test_coordinator_killed_between_end_txn_and_markers_completes_after_restart(brokers):
    b = brokers(1, "--partitions", str(PARTITIONS), faults=("broker.txn.prepared=crash",))
    p = txn_producer(b.bootstrap, "crash-tx", **{"transaction.timeout.ms": 60_000})
    p.begin_transaction()
    send(p, "crash", range(9))
    try:  # the broker dies with the commit decided and no marker written: EndTxn was answered by then, or not
        p.commit_transaction(5)
    except KafkaException:
        pass
    b.proc.wait(timeout=10)
    assert "failpoint: crashing" in b.tail(200)
    b.faults = ()
    b.start()
    # The restarted broker finds the prepared commit in the quorum and writes its markers.
    wait_for(lambda: end_offsets(b.bootstrap, "crash", True) == end_offsets(b.bootstrap, "crash", False),
             timeout=30, what="the prepared commit to complete")
    assert values(read(b.bootstrap, "crash", committed=True, expect=9)) == list(range(9))


# ------------------------------------------------------------------ fencing
def test_second_instance_fences_the_first_mid_transaction(brokers):
    b = brokers(1, "--partitions", str(PARTITIONS))
    first = txn_producer(b.bootstrap, "fence-tx")
    first.begin_transaction()
    send(first, "fence", range(5))  # appended, in the first one's open transaction
    second = txn_producer(b.bootstrap, "fence-tx")  # aborts it (markers with a bumped epoch), then fences
    with pytest.raises(KafkaException) as ei:  # the late batch is fenced (fatal), or the commit is
        first.produce("fence", value="late", partition=0)
        first.flush(10)
        first.commit_transaction(30)
    err = ei.value.args[0]
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
    second.begin_transaction()
    send(second, "fence", range(100, 103))
    second.commit_transaction(30)
    assert values(read(b.bootstrap, "fence", committed=True, expect=3)) == [100, 101, 102]


def test_instance_on_another_broker_takes_the_id_over_mid_transaction(brokers):
    """The id moves to another broker: a second instance calls InitProducerId on broker 2 while the first has
    a transaction open on broker 1.  Broker 2 decides the abort (bumped epoch) in the quorum; broker 1, which
    holds the partitions, writes the abort markers; broker 2 then answers with the bumped epoch, and the
    first instance is fenced."""
    b1 = brokers(1, "--partitions", str(PARTITIONS))
    b2 = brokers(2, "--partitions", str(PARTITIONS))
    first = txn_producer(b1.bootstrap, "move-tx")
    first.begin_transaction()
    send(first, "move", range(6))
    second = txn_producer(b2.bootstrap, "move-tx")  # waits (CONCURRENT_TRANSACTIONS) for broker 1's markers
    assert end_offsets(b1.bootstrap, "move", True) == end_offsets(b1.bootstrap, "move", False)
    with pytest.raises(KafkaException) as ei:
        first.produce("move", value="late", partition=0)
        first.flush(10)
        first.commit_transaction(30)
    err = ei.value.args[0]
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
    assert read(b1.bootstrap, "move", committed=True, timeout=3) == []
    assert values(read(b1.bootstrap, "move", committed=False, expect=6)) == list(range(6))
    second.begin_transaction()
    send(second, "move", range(100, 103))
    second.commit_transaction(30)
    assert values(read(b2.bootstrap, "move", committed=True, expect=3)) == [100, 101, 102]


def test_prepared_commit_is_completed_when_the_id_moves_to_another_broker(brokers):
    """Broker 1 dies with a commit decided and no marker written.  A new instance of the id on broker 2 is
    held (CONCURRENT_TRANSACTIONS) rather than given an epoch over an undecided partition: the outcome stays a
    commit, completed by broker 1's markers once it is back, and then broker 2 answers."""
    b1 = brokers(1, "--partitions", str(PARTITIONS), faults=("broker.txn.prepared=crash",))
    b2 = brokers(2, "--partitions", str(PARTITIONS))
    p = txn_producer(b1.bootstrap, "moved-commit-tx", **{"transaction.timeout.ms": 60_000})
    p.begin_transaction()
    send(p, "movedc", range(9))
    try:  # answered once decided (before the markers), or not if the crash came first
        p.commit_transaction(5)
    except KafkaException:
        pass
    b1.proc.wait(timeout=10)
    second = Producer({"bootstrap.servers": b2.bootstrap, "transactional.id": "moved-commit-tx", "linger.ms": 2,
                       "log_level": 3})
    with pytest.raises(KafkaException) as ei:  # broker 1's partitions are down: the id cannot move yet
        second.init_transactions(5)
    assert ei.value.args[0].retriable(), ei.value
    assert "CONCURRENT_TRANSACTIONS" in b2.tail(50)
    b1.faults = ()
    b1.start()
    second.init_transactions(30)  # librdkafka's way after a timed-out init: call it again
    assert values(read(b1.bootstrap, "movedc", committed=True, expect=9)) == list(range(9))
    second.begin_transaction()
    send(second, "movedc", [100])
    second.commit_transaction(30)
    assert values(read(b2.bootstrap, "movedc", committed=True, expect=1)) == [100]


# ------------------------------------------------------------------ KIP-360
def test_abortable_error_abort_and_bump_with_librdkafka(brokers):
    """The transaction runs past its timeout; the coordinator aborts it with a bumped epoch; the producer's
    commit fails with an abortable error, it aborts, and goes on with the next transaction (KIP-360)."""
    b = brokers(1, "--partitions", str(PARTITIONS))
    p = txn_producer(b.bootstrap, "kip360-tx", **{"transaction.timeout.ms": 2000})
    p.begin_transaction()
    send(p, "kip360", range(3))
    wait_for(lambda: "past its timeout" in b.tail(400), timeout=30, what="the coordinator to abort on timeout")
    with pytest.raises(KafkaException) as ei:
        p.commit_transaction(30)
    err = ei.value.args[0]
    assert err.txn_requires_abort() and not err.fatal(), err
    p.abort_transaction(30)
    p.begin_transaction()
    send(p, "kip360", range(10, 13))
    p.commit_transaction(30)
    assert values(read(b.bootstrap, "kip360", committed=True, expect=3)) == [10, 11, 12]


# ------------------------------------------------------------------ KIP-890 part 1 and groups
def test_send_offsets_to_transaction_commits_the_offsets_with_the_transaction(brokers):
    """AddOffsetsToTxn and TxnOffsetCommit: the group's offsets are pending while the transaction is open
    (the previous ones are what OffsetFetch answers, UNSTABLE_OFFSET_COMMIT with require_stable), dropped
    by an abort and committed by a commit, and still there after a restart of the broker."""
    b = brokers(1, "--partitions", str(PARTITIONS))
    p = txn_producer(b.bootstrap, "offsets-tx")
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g-offsets", "log_level": 0,
                  "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
    stable = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g-offsets", "log_level": 0,
                       "isolation.level": "read_committed"})  # OffsetFetch with require_stable
    tps = [TopicPartition("offsets", i) for i in range(PARTITIONS)]

    def committed(consumer: Consumer = c) -> list[int]:
        return [t.offset for t in consumer.committed(tps, timeout=10)]
    try:
        transaction(p, "offsets", [0, 1, 2], commit=True)  # the topic and its partitions exist
        p.begin_transaction()
        send(p, "offsets", [3])
        p.send_offsets_to_transaction([TopicPartition("offsets", 0, 7)], c.consumer_group_metadata(), 10)
        assert committed()[0] < 0  # pending: not visible
        with pytest.raises(KafkaException, match="Timed out"):  # UNSTABLE_OFFSET_COMMIT, retried until the end
            stable.committed(tps, timeout=2)
        p.abort_transaction(30)
        assert committed(stable)[0] < 0  # stable again once the transaction ended
        assert committed()[0] < 0  # dropped
        p.begin_transaction()
        send(p, "offsets", [4])
        p.send_offsets_to_transaction([TopicPartition("offsets", 0, 11), TopicPartition("offsets", 2, 5)],
                                      c.consumer_group_metadata(), 10)
        p.commit_transaction(30)  # answered once decided; the offsets are committed by the marker, just after
        wait_for(lambda: committed() == [11, -1001, 5], 10, what="the commit marker to commit the offsets")
        assert committed(stable) == [11, -1001, 5]
    finally:
        c.close()
        stable.close()
    b.kill()
    b.start()
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g-offsets", "log_level": 0})
    try:
        assert committed(c) == [11, -1001, 5]
    finally:
        c.close()


# ------------------------------------------------------------------ two brokers, one quorum
def test_a_thousand_transactions_on_two_brokers_sharing_the_quorum_exactly_once(brokers):
    """Two brokers, each holding its own partitions and coordinating its own producer's transactions, with the
    transactions' state in the one quorum (each broker's sweeper sees the other's and leaves them alone).
    500 transactions through each, every 5th aborted: read_committed sees each committed one exactly once,
    whole, in order, and nothing of an aborted one."""
    b1 = brokers(1, "--partitions", str(PARTITIONS))
    b2 = brokers(2, "--partitions", str(PARTITIONS))
    per_broker = 500
    outcome: dict[int, tuple[list[int], list[int]]] = {}

    def run(b) -> None:
        p = txn_producer(b.bootstrap, f"two-{b.broker_id}")
        committed, aborted = [], []
        for n in range(per_broker):
            batch = [n * PARTITIONS + i for i in range(PARTITIONS)]
            if transaction(p, "both", batch, commit=n % 5 != 4):  # every 5th aborted
                committed += batch
            else:
                aborted += batch
        outcome[b.broker_id] = (committed, aborted)

    threads = [threading.Thread(target=run, args=(b,)) for b in (b1, b2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert set(outcome) == {1, 2}, "a producer did not finish"
    for b in (b1, b2):
        committed, aborted = outcome[b.broker_id]
        seen = read(b.bootstrap, "both", committed=True, expect=len(committed))
        got = [v for _, _, v in seen]
        assert len(got) == len(set(got)), f"broker {b.broker_id}: {len(got) - len(set(got))} duplicates"
        assert sorted(got) == sorted(committed), f"broker {b.broker_id}: lost or aborted values seen"
        assert_in_order(seen)
        assert len(committed) + len(aborted) == per_broker * PARTITIONS
