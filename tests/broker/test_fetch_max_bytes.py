"""Fetch's response limit (KIP-74) with librdkafka, against a real broker and quorum: only the first partition
with data may go over the request's max_bytes, by its first batch.  A response over the consumer's
receive.message.max.bytes is dropped by the client, which fetches the same thing again for ever (librdkafka's
own test 0082_fetch_max_bytes)."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer

from tests.broker.conftest import metered_broker

PARTITIONS, PER_PARTITION, SIZE = 3, 4, 900 * 1024


@pytest.fixture(scope="module")
def broker(module_quorum):
    yield from metered_broker(module_quorum, 1, "--partitions", str(PARTITIONS))


def test_a_consumer_with_a_small_fetch_limit_reads_batches_near_it(broker):
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for part in range(PARTITIONS):
        for _ in range(PER_PARTITION):
            p.produce("kip74", b"x" * SIZE, partition=part)
        assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kip74", "auto.offset.reset": "earliest",
                  "max.partition.fetch.bytes": 20_000_000, "fetch.max.bytes": 1_000_000,
                  "receive.message.max.bytes": 1_000_512, "log_level": 0})
    try:
        c.subscribe(["kip74"])
        got, deadline = 0, time.monotonic() + 30
        while got < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got += 1
        assert got == PARTITIONS * PER_PARTITION
    finally:
        c.close()
