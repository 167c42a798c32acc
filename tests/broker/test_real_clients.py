"""Unmodified Kafka clients (confluent-kafka / librdkafka and kafka-python) against real
broker front-end processes sharing a real three-node quorum.

1. An idempotent producer through a broker that appends and then drops the
   connection before answering: the consumer reads every message exactly once,
   in order per partition; with deduplication off the same run duplicates.
2. Two brokers, one quorum: every producer gets a distinct PID, inside a block
   the quorum allocated to that broker.
3. kill -9 of the broker mid-stream and a restart on the same port: the
   producer carries on, the consumer sees no duplicate and no loss.
4. Two producers with the same transactional.id: the second fences the first.
"""
from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kio.index import load_request_schema

from quorum.trail import iter_blocks
from tests.conftest import wait_for
from tests.support.kafka_requests import request_once

N = 1000
PARTITIONS = 3


# ------------------------------------------------------------------ clients
def produce_confluent(bootstrap: str, topic: str, values, **config) -> list:
    """Send each value (key = value % 7); returns delivery errors.  Raises if anything is left unsent."""
    errors: list = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "batch.num.messages": 25, "message.timeout.ms": 60_000, "log_level": 3, **config})
    for i, v in enumerate(values):
        p.produce(topic, key=str(v % 7), value=str(v),
                  on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
        if i % 50 == 0:
            p.poll(0)
    left = p.flush(90)
    assert left == 0, f"{left} messages never delivered"
    return errors


def produce_kafka_python(bootstrap: str, topic: str, values) -> None:
    p = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=5,
                      batch_size=256, retries=100, request_timeout_ms=5000, reconnect_backoff_ms=50)
    try:
        futures = [p.send(topic, key=str(v % 7).encode(), value=str(v).encode()) for v in values]
        p.flush(90)
        for f in futures:
            f.get(timeout=1)
    finally:
        p.close(timeout=10)


def consume_all(bootstrap: str, topic: str, partitions: int, expect: int | None, timeout: float = 30.0,
                committed: bool = False):
    """Every message of the topic: [(partition, offset, int value)], reading until ``expect`` arrived (None:
    at once) and then one more idle second (so duplicates beyond ``expect`` are seen too), ``timeout`` at the
    most; ``committed``: as a read_committed consumer."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      consumer_timeout_ms=1000,
                      isolation_level="read_committed" if committed else "read_uncommitted")
    try:
        c.assign([KTopicPartition(topic, i) for i in range(partitions)])
        c.seek_to_beginning()
        got: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = len(got)
            got.extend((m.partition, m.offset, int(m.value)) for m in c)  # stops after 1 s idle
            if len(got) == before and (expect is None or len(got) >= expect):
                break
        return got
    finally:
        c.close()


def describe_producers(bootstrap: str, topic: str, partitions: int) -> dict[int, list[tuple[int, int]]]:
    """DescribeProducers (API 61) on one broker: {partition: [(producer id, epoch)]}."""
    req_cls = load_request_schema(61, 0)
    topic_cls = __import__(req_cls.__module__, fromlist=["TopicRequest"]).TopicRequest
    body = req_cls(topics=(topic_cls(name=topic, partition_indexes=tuple(range(partitions))),))
    resp = request_once(bootstrap, "test-describe", body)
    out = {}
    for t in resp.topics:
        for pt in t.partitions:
            assert int(pt.error_code) == 0, pt
            out[int(pt.partition_index)] = [(int(a.producer_id), int(a.producer_epoch)) for a in pt.active_producers]
    return out


def assert_exactly_once_in_order(got, n: int) -> None:
    values = [v for _, _, v in got]
    dupes = len(values) - len(set(values))
    assert dupes == 0, f"{dupes} duplicate messages"
    assert sorted(values) == list(range(n)), f"{n - len(set(values))} messages missing"
    per_partition: dict[int, list[tuple[int, int]]] = {}
    for part, off, v in got:
        per_partition.setdefault(part, []).append((off, v))
    for part, rows in per_partition.items():
        rows.sort()
        vals = [v for _, v in rows]
        assert vals == sorted(vals), f"partition {part}: out of order"


DROP_EVERY_5 = "broker.produce.appended=drop-every:5"  # append every 5th produce request, then drop the connection


def fault_drops(broker) -> int:
    return broker.tail(100_000).count("fault injection: dropping")


# ------------------------------------------------------------------ 1
@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_retried_batches_after_dropped_connections_are_written_once(brokers, client):
    b = brokers(1, "--partitions", str(PARTITIONS), faults=(DROP_EVERY_5,))
    if client == "confluent":
        assert produce_confluent(b.bootstrap, "numbers", range(N)) == []
    else:
        produce_kafka_python(b.bootstrap, "numbers", range(N))
    assert fault_drops(b) >= 3, "the fault injection did not fire: the test would prove nothing"
    got = consume_all(b.bootstrap, "numbers", PARTITIONS, N)
    assert_exactly_once_in_order(got, N)


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_without_dedup_the_same_run_writes_duplicates(brokers, client):
    """The control: the faults above do make clients retry appended batches."""
    b = brokers(1, "--partitions", str(PARTITIONS), "--no-dedup", faults=(DROP_EVERY_5,))
    if client == "confluent":
        produce_confluent(b.bootstrap, "numbers", range(N))
    else:
        produce_kafka_python(b.bootstrap, "numbers", range(N))
    got = consume_all(b.bootstrap, "numbers", PARTITIONS, N)
    values = [v for _, _, v in got]
    assert set(values) == set(range(N))
    assert len(values) > N, "no duplicates without dedup: the retries did not happen"


# ------------------------------------------------------------------ 2
def test_producers_on_two_brokers_get_distinct_pids_from_quorum_blocks(brokers, cluster):
    b1, b2 = brokers(1), brokers(2)
    per_broker = 3
    for b in (b1, b2):
        for i in range(per_broker):
            assert produce_confluent(b.bootstrap, "pids", range(i * 10, i * 10 + 10)) == []
            produce_kafka_python(b.bootstrap, "pids", range(i * 10, i * 10 + 10))
    seen: dict[int, list[int]] = {}
    for b in (b1, b2):
        pids = [pid for producers in describe_producers(b.bootstrap, "pids", 1).values() for pid, _ in producers]
        assert len(pids) == 2 * per_broker, pids
        seen[b.broker_id] = pids
    everything = seen[1] + seen[2]
    assert len(set(everything)) == len(everything), f"a PID was issued twice: {seen}"

    # Every PID lies in a block the quorum allocated to the broker that handed it out.
    audits = [f"{cluster.lc.data_dir(n.node_id)}/audit.log" for n in cluster.lc.nodes()]
    blocks = list(iter_blocks(audits))
    for broker_id, pids in seen.items():
        mine = [(blk["producer_id_start"], blk["producer_id_start"] + blk["producer_id_len"])
                for blk in blocks if blk["broker_id"] == broker_id]
        for pid in pids:
            assert any(s <= pid < e for s, e in mine), f"PID {pid} is in no block of broker {broker_id}"


# ------------------------------------------------------------------ 3
def test_broker_killed_and_restarted_mid_stream_no_duplicates_no_loss(brokers):
    b = brokers(1, "--partitions", str(PARTITIONS))
    delivered: list[int] = []
    errors: list = []
    lock = threading.Lock()
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                  "batch.num.messages": 25, "message.timeout.ms": 120_000, "reconnect.backoff.ms": 50,
                  "reconnect.backoff.max.ms": 500, "log_level": 3})

    def on_delivery(err, msg):
        with lock:
            (errors if err is not None else delivered).append(err if err is not None else int(msg.value()))

    def send():
        for v in range(N):
            p.produce("restart", key=str(v % 7), value=str(v), on_delivery=on_delivery)
            p.poll(0)
            time.sleep(0.002)  # a stream, not one burst: the kill lands mid-way
        p.flush(120)

    t = threading.Thread(target=send)
    t.start()
    wait_for(lambda: len(delivered) >= N // 4, timeout=60, what="a quarter of the messages delivered")
    b.kill()
    killed_at = len(delivered)
    b.start()
    t.join(timeout=150)
    assert not t.is_alive()
    assert errors == []
    assert sorted(delivered) == list(range(N))
    assert killed_at < N, "the kill came after the end of the stream"
    got = consume_all(b.bootstrap, "restart", PARTITIONS, N)
    assert_exactly_once_in_order(got, N)


# ------------------------------------------------------------------ 4
def test_second_transactional_producer_fences_the_first(brokers):
    b = brokers(1)
    conf = {"bootstrap.servers": b.bootstrap, "transactional.id": "orders-tx", "log_level": 3}
    first = Producer(conf)
    first.init_transactions(30)
    second = Producer(conf)
    second.init_transactions(30)  # bumps the epoch in the quorum: the first is now fenced
    first.begin_transaction()
    first.produce("tx-topic", value=b"from the fenced producer")
    with pytest.raises(KafkaException) as ei:
        first.commit_transaction(30)
    err = ei.value.args[0]
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
    assert err.fatal()


# ------------------------------------------------------------------ metadata
def test_both_clients_list_all_topics(brokers):
    """librdkafka's all-topics Metadata v12 carries 3 stray bytes; Kafka ignores them, so must we."""
    b = brokers(1, "--partitions", "2")
    assert produce_confluent(b.bootstrap, "listed", range(3)) == []
    md = Producer({"bootstrap.servers": b.bootstrap, "log_level": 3}).list_topics(timeout=10)
    assert "listed" in md.topics and len(md.topics["listed"].partitions) == 2
    assert md.brokers[1].port == b.port
    c = KafkaConsumer(bootstrap_servers=b.bootstrap)
    try:
        assert "listed" in c.topics()
        assert c.partitions_for_topic("listed") == {0, 1}
    finally:
        c.close()
