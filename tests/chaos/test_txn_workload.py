"""The transactions workload without processes: how each client library's errors are handled (retry, abort,
new instance), the bounded wait on kafka-python's blocking calls, and the values a producer plans."""
from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import KafkaError, KafkaException
from kafka import errors as E

from chaos.history import HistoryWriter
from chaos.txn_workload import (
    ConfluentDriver,
    KafkaPythonDriver,
    StepTimeout,
    TxnWorker,
    TxnWorkloadConfig,
    _bounded,
    error_text,
)

CFG = TxnWorkloadConfig()
LOG = logging.Logger("test")


def _cf(code, **flags) -> KafkaException:
    return KafkaException(KafkaError(code, "reason", **flags))


@pytest.mark.parametrize("exc,kind", [
    (_cf(KafkaError._FENCED, fatal=True), "fatal"),
    (_cf(KafkaError._TIMED_OUT, retriable=True), "retriable"),
    (_cf(KafkaError.INVALID_PRODUCER_ID_MAPPING, txn_requires_abort=True), "abortable"),
    (_cf(KafkaError._STATE), "abortable"),              # neither: abort_transaction() is tried
    (BufferError("queue full"), "retriable"),
    (StepTimeout("flush"), "retriable"),
    (RuntimeError("anything else"), "fatal"),
])
def test_confluent_errors_are_classified_as_librdkafka_documents(exc, kind):
    assert ConfluentDriver("127.0.0.1:1", "t", CFG, LOG).classify(exc) == kind


@pytest.mark.parametrize("exc,kind", [
    (E.ProducerFencedError(), "fatal"),
    (E.InvalidProducerEpochError(), "fatal"),
    (E.OutOfOrderSequenceNumberError(), "fatal"),
    (E.TransactionalIdAuthorizationFailedError(), "fatal"),
    (E.InvalidTxnStateError(), "fatal"),
    (E.IllegalStateError("state"), "fatal"),
    (StepTimeout("commit"), "fatal"),                   # a commit still running is given up: new instance
    (E.KafkaTimeoutError(), "retriable"),
    (E.KafkaConnectionError(), "retriable"),
    (E.NotCoordinatorError(), "retriable"),
    (E.KafkaError("Cannot execute transactional method because we are in an error state"), "abortable"),
])
def test_kafka_python_errors_are_classified_as_its_docs_say(exc, kind):
    assert KafkaPythonDriver("127.0.0.1:1", "t", CFG, LOG).classify(exc) == kind


def test_error_text_names_librdkafka_errors_and_their_class():
    assert error_text(_cf(KafkaError._FENCED, fatal=True)).startswith("_FENCED (fatal)")
    assert error_text(E.ProducerFencedError()).startswith("ProducerFencedError")


def test_bounded_returns_raises_or_gives_up():
    assert _bounded(lambda: 7, 5, "x") == 7
    with pytest.raises(ValueError):
        _bounded(lambda: (_ for _ in ()).throw(ValueError("no")), 5, "x")
    release = threading.Event()
    try:
        with pytest.raises(StepTimeout):
            _bounded(lambda: release.wait(30), 0.05, "blocked")
    finally:
        release.set()


def test_a_producer_plans_unique_values_over_a_few_partitions(tmp_path):
    h = HistoryWriter(str(tmp_path / "h.jsonl"))
    w = TxnWorker("txn-cf-1", "cf", "127.0.0.1:1", "chaos-txn-cf-1", CFG, h, threading.Event(), 1, LOG)
    seen = set()
    for n in range(200):
        writes = w.plan(n)
        assert CFG.values_per_txn[0] <= len(writes) <= CFG.values_per_txn[1]
        parts = {p for _, p in writes}
        assert len(parts) <= CFG.partitions_per_txn[1] and parts <= set(range(CFG.partitions))
        for i, (v, _) in enumerate(writes):
            assert v == f"txn-cf-1:{n}:{i}" and v not in seen
            seen.add(v)
    a, b = (TxnWorker("txn-cf-1", "cf", "127.0.0.1:1", "chaos-txn-cf-1", CFG, h, threading.Event(), 1, LOG)
            for _ in range(2))
    assert [a.plan(n) for n in range(5)] == [b.plan(n) for n in range(5)]  # the seed fixes the plan
    h.close()
