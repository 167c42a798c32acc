"""The per-partition producer cap against a real broker process and unmodified clients.

A broker capped at 20 producers per partition: a long-lived idempotent producer is evicted by 30
newer ones.  It is not silently exposed to duplicates: its next batch is answered
UNKNOWN_PRODUCER_ID (its state is gone), the client bumps its epoch as KIP-360 says and starts
again at sequence 0, and a consumer reads every message once, in order.

What the application sees differs by client: librdkafka retries the refused batch under the new
epoch (nothing to do); kafka-python fails the batches in flight at that moment with
UnknownProducerIdError (its documented KIP-360 behaviour) and sends the rest under the new epoch,
so the application resends those few, as it would after any failed delivery.
"""
from __future__ import annotations

import pytest
from confluent_kafka import Producer
from kafka import KafkaProducer
from kafka.errors import KafkaError

from tests.broker.test_frontend_bad_input import batch, produce
from tests.broker.test_real_clients import consume_all, describe_producers
from records.wire.errors import Errors

CAP = 20


def fill(b, topic: str, first_pid: int, n: int) -> None:
    """``n`` other producers, one batch each, over the raw wire."""
    for pid in range(first_pid, first_pid + n):
        code, _, _ = produce(b, batch(pid, 0, 0, value=str(pid).encode()), topic=topic)
        assert code == Errors.NONE


def evictions(b) -> int:
    return b.tail(1_000_000).count("UNKNOWN_PRODUCER_ID")


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_an_evicted_producer_is_told_bumps_its_epoch_and_loses_nothing(brokers, client):
    b = brokers(1, "--max-producers-per-partition", str(CAP))
    topic = f"capped-{client}"
    failed: list[tuple[int, str]] = []
    if client == "confluent":
        p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True, "linger.ms": 0,
                      "message.timeout.ms": 60_000, "log_level": 3})

        def send(values):
            for v in values:
                p.produce(topic, value=str(v), on_delivery=lambda err, msg: failed.append(
                    (int(msg.value()), err.name())) if err else None)
            assert p.flush(60) == 0
    else:
        p = KafkaProducer(bootstrap_servers=b.bootstrap, enable_idempotence=True, acks="all", linger_ms=0,
                          retries=100, request_timeout_ms=5000)

        def send(values):
            futures = [(v, p.send(topic, value=str(v).encode())) for v in values]
            p.flush(60)
            for v, f in futures:
                try:
                    f.get(timeout=1)
                except KafkaError as e:
                    failed.append((v, type(e).__name__))
    try:
        send(range(10))
        assert failed == []
        [(pid, epoch)] = describe_producers(b.bootstrap, topic, 1)[0]
        fill(b, topic, 10**9, CAP + 10)  # newer producers push the client's state out
        assert pid not in {p_ for p_, _ in describe_producers(b.bootstrap, topic, 1)[0]}
        send(range(10, 20))
        if client == "confluent":
            assert failed == []  # retried under the new epoch by the client itself
        else:
            assert failed and {name for _, name in failed} == {"UnknownProducerIdError"}
            assert {v for v, _ in failed} <= set(range(10, 20))  # the batches in flight at the bump
            resend = [v for v, _ in failed]
            failed.clear()
            send(resend)  # what an application does with a failed delivery
            assert failed == []
    finally:
        if client == "confluent":
            p.flush(10)
        else:
            p.close(timeout=10)
    assert evictions(b) >= 1  # the broker said so, it did not take the batch at a sequence it cannot check
    # it writes under a new identity: a bumped epoch, or a new producer id (Kafka's answer to an
    # InitProducerId bump without a transactional id)
    mine = [(p_, e) for p_, e in describe_producers(b.bootstrap, topic, 1)[0] if p_ < 10**9]
    assert len(mine) == 1 and mine[0] != (pid, epoch) and (mine[0][0] != pid or mine[0][1] > epoch)
    got = consume_all(b.bootstrap, topic, 1, expect=20 + CAP + 10)
    values = [v for _, _, v in got if v < 10**9]
    assert sorted(values) == list(range(20))
    if client == "confluent":
        assert values == list(range(20))  # and in order
