"""The transactions workload without processes: how each client library's errors are handled (retry, abort,
new instance), the bounded wait on kafka-python's blocking calls, and the values a producer plans."""
from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import KafkaError, KafkaException
from kafka import errors as E

from chaos.history import HistoryWriter, read_history
from chaos.txn_drivers import ConfluentDriver, KafkaPythonDriver, StepTimeout, _bounded, error_text
from chaos.txn_workload import TxnWorker, TxnWorkloadConfig

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


# ------------------------------------------------------------------ the worker's error handling, on a fake client
class FakeClient:
    """A client library that fails as scripted: ``script[step]`` is a list of exceptions (None: the call works)
    taken one per call; ``send_errors``: every send's delivery report is that error."""

    def __init__(self, real, script: dict, send_errors: str | None = None):
        self.real, self.lib, self.script, self.send_errors = real, real.lib, script, send_errors
        self.calls: list[str] = []
        self.offset = 0

    def _step(self, name):
        self.calls.append(name)
        todo = self.script.get(name, [])
        e = todo.pop(0) if todo else None
        if e is not None:
            raise e

    def create(self):
        return object()

    def init(self, h, timeout):
        self._step("init")

    def begin(self, h):
        self._step("begin")

    def send(self, h, topic, value, partition, acks):
        self.offset += 1
        if self.send_errors:
            acks.error(value, self.send_errors)
        else:
            acks.ok(value, partition, self.offset)

    def flush(self, h, timeout):
        self._step("flush")

    def commit(self, h, timeout):
        self._step("commit")

    def abort(self, h, timeout):
        self._step("abort")

    def classify(self, e):
        return self.real.classify(e)

    def is_fatal(self, h):
        return False

    def close(self, h):
        self.calls.append("close")


def _worker(tmp_path, lib: str, script: dict, send_errors: str | None = None, **cfg):
    h = HistoryWriter(str(tmp_path / f"h-{lib}.jsonl"))
    c = TxnWorkloadConfig(**{"step_deadline_s": 5.0, **cfg})
    w = TxnWorker(f"txn-{lib}-1", lib, "127.0.0.1:1", f"chaos-txn-{lib}-1", c, h, threading.Event(), 1, LOG)
    w.driver = FakeClient(w.driver, script, send_errors)
    w.ensure_producer()
    w.run_one()

    def ops():  # every line is flushed as written
        return [op for op in read_history(h.path) if op.f in ("txn", "commit", "abort")]
    return w, ops


def _outcome(ops):
    last = ops()[-1]
    assert last.f == "txn" and last.type != "invoke"
    return last.type, last.value["outcome"], [(op.f, op.type) for op in ops() if op.f != "txn"]


def test_a_retriable_commit_error_is_retried(tmp_path):
    w, ops = _worker(tmp_path, "cf", {"commit": [_cf(KafkaError._TIMED_OUT, retriable=True)]})
    assert _outcome(ops) == ("ok", "committed", [("commit", "invoke"), ("commit", "info"), ("commit", "invoke"),
                                                  ("commit", "ok")])


def test_an_abortable_commit_error_is_aborted(tmp_path):
    w, ops = _worker(tmp_path, "cf", {"commit": [_cf(KafkaError.INVALID_PRODUCER_ID_MAPPING, txn_requires_abort=True)]})
    assert _outcome(ops) == ("fail", "aborted", [("commit", "invoke"), ("commit", "info"), ("abort", "invoke"),
                                                  ("abort", "ok")])
    assert w.producer is not None


def test_a_fatal_commit_error_is_unknown_and_replaces_the_instance(tmp_path):
    w, ops = _worker(tmp_path, "cf", {"commit": [_cf(KafkaError._FENCED, fatal=True)]})
    assert _outcome(ops) == ("info", "unknown", [("commit", "invoke"), ("commit", "info")])
    assert w.producer is None
    w.ensure_producer()
    assert w.instance == 2


def test_a_failed_abort_leaves_the_outcome_unknown(tmp_path):
    w, ops = _worker(tmp_path, "cf", {"commit": [_cf(KafkaError._TIMED_OUT, txn_requires_abort=True)],
                                      "abort": [_cf(KafkaError._STATE, fatal=True)]})
    assert _outcome(ops)[:2] == ("info", "unknown") and w.producer is None


def test_a_fatal_error_before_the_commit_abandons_the_transaction(tmp_path):
    w, ops = _worker(tmp_path, "kp", {"begin": [E.ProducerFencedError()]})
    assert _outcome(ops) == ("fail", "abandoned", [])
    assert w.producer is None


def test_kafka_python_sends_that_failed_abort_the_transaction(tmp_path):
    w, ops = _worker(tmp_path, "kp", {}, send_errors="KafkaTimeoutError")
    typ, outcome, calls = _outcome(ops)
    assert (typ, outcome) == ("fail", "aborted") and ("commit", "invoke") not in calls
    assert "sends failed before the commit" in ops()[-1].value["errors"][0]
    assert "commit" not in w.driver.calls


def test_without_the_send_check_kafka_python_commits_without_the_failed_sends(tmp_path):
    # kafka-python's own behaviour (the lost write a chaos run found): the commit goes through.
    w, ops = _worker(tmp_path, "kp", {}, send_errors="KafkaTimeoutError", check_sends=False)
    typ, outcome, _ = _outcome(ops)
    assert (typ, outcome) == ("ok", "committed")
    assert ops()[-1].value["offsets"] == {} and len(ops()[-1].value["delivery_errors"]) >= 2
