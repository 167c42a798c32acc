"""The two Kafka client libraries of the transactions workload (``chaos.txn_workload``) behind one
interface (``Driver``): confluent-kafka (librdkafka) and kafka-python, each error classified as its client
documents it (retriable, abortable, fatal)."""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Protocol

LIBS = {"cf": "confluent-kafka", "kp": "kafka-python"}


def error_text(e: BaseException) -> str:
    """A short description of a client exception, with librdkafka's error name and class."""
    err = _kafka_error(e)
    if err is not None:
        kind = ("fatal" if err.fatal() else "abortable" if err.txn_requires_abort() else
                "retriable" if err.retriable() else "error")
        return f"{err.name()} ({kind}): {err.str()}"[:300]
    return f"{type(e).__name__}: {e}"[:300]


def _kafka_error(e: BaseException):
    try:
        from confluent_kafka import KafkaError, KafkaException
    except ImportError:  # pragma: no cover
        return None
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        return e.args[0]
    return None


class SendsFailed(Exception):
    """Sends of the transaction failed before its commit (delivery errors after the flush): abortable.

    The Java client's ``commitTransaction()`` fails when a send of the transaction failed, and librdkafka's
    too.  kafka-python 3.0 does not: a batch that expired (``delivery_timeout_ms``) fails its futures
    with KafkaTimeoutError without moving the transaction to an error state, and the commit then
    succeeds without those records (a lost write, found by a chaos run after a broker restart).  So the
    worker checks the delivery reports of a kafka-python transaction after its flush and aborts it
    if one failed (``TxnWorkloadConfig.check_sends``; off shows the library's own behaviour)."""


class StepTimeout(Exception):
    """A blocking kafka-python call did not return within its deadline (it may still complete)."""


def _bounded(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """``fn()`` in a daemon thread, waited for ``timeout`` s; StepTimeout if it is still running."""
    box: dict[str, Any] = {}

    def go():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
    t = threading.Thread(target=go, name=f"bounded-{what}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise StepTimeout(f"{what} still running after {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("result")



class Acks:
    """Delivery reports of one transaction or batch: value -> (partition, offset) or error name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.offsets: dict[str, tuple[int, int]] = {}
        self.errors: dict[str, str] = {}

    def ok(self, value: str, partition: int, offset: int) -> None:
        with self.lock:
            self.offsets[value] = (partition, offset)
            self.errors.pop(value, None)

    def error(self, value: str, err: str) -> None:
        with self.lock:
            if value not in self.offsets:
                self.errors[value] = err


class DriverSettings(Protocol):
    """What a driver reads of the workload's config (``TxnWorkloadConfig``)."""

    transaction_timeout_ms: int
    commit_timeout_s: float
    step_deadline_s: float


class Driver:
    """What a worker needs of a client library.  ``classify`` says how to handle an exception:
    ``retriable`` (call again), ``abortable`` (abort the transaction), ``fatal`` (new instance)."""

    lib = ""

    def __init__(self, bootstrap: str, tid: str | None, cfg: DriverSettings, logger: logging.Logger):
        self.bootstrap, self.tid, self.cfg, self.logger = bootstrap, tid, cfg, logger

    def create(self) -> Any: ...
    def init(self, h: Any, timeout: float) -> None: ...
    def begin(self, h: Any) -> None: ...
    def send(self, h: Any, topic: str, value: str, partition: int, acks: Acks) -> None: ...
    def flush(self, h: Any, timeout: float) -> None: ...
    def commit(self, h: Any, timeout: float) -> None: ...
    def abort(self, h: Any, timeout: float) -> None: ...
    def classify(self, e: BaseException) -> str: ...
    def is_fatal(self, h: Any) -> bool: return False
    def close(self, h: Any) -> None: ...


class ConfluentDriver(Driver):
    lib = LIBS["cf"]

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.fatal_seen: set[int] = set()

    def create(self):
        from confluent_kafka import Producer  # heavy: imported when used
        conf = {"bootstrap.servers": self.bootstrap, "linger.ms": 2, "logger": self.logger}
        if self.tid is not None:  # message.timeout.ms follows transaction.timeout.ms
            conf.update({"transactional.id": self.tid, "transaction.timeout.ms": self.cfg.transaction_timeout_ms})
        else:
            conf.update({"enable.idempotence": True, "message.timeout.ms": int(self.cfg.step_deadline_s * 1000)})
        holder: dict[str, Any] = {}

        def on_error(err):
            if err.fatal() and "p" in holder:
                self.fatal_seen.add(id(holder["p"]))
        conf["error_cb"] = on_error
        p = Producer(conf)
        holder["p"] = p
        return p

    def init(self, h, timeout):
        h.init_transactions(timeout)

    def begin(self, h):
        h.begin_transaction()

    def send(self, h, topic, value, partition, acks):
        def cb(err, msg, v=value):
            if err is None:
                acks.ok(v, msg.partition(), msg.offset())
            else:
                acks.error(v, err.name())
        h.produce(topic, value=value.encode(), partition=partition, on_delivery=cb)
        h.poll(0)

    def flush(self, h, timeout):
        left = h.flush(timeout)
        if left:
            raise StepTimeout(f"flush: {left} message(s) still queued after {timeout:.0f} s")

    def commit(self, h, timeout):
        h.commit_transaction(timeout)

    def abort(self, h, timeout):
        h.abort_transaction(timeout)

    def classify(self, e):
        err = _kafka_error(e)
        if err is None:
            return "retriable" if isinstance(e, (StepTimeout, BufferError)) else "fatal"
        if err.fatal():
            return "fatal"
        if err.txn_requires_abort():
            return "abortable"
        if err.retriable():
            return "retriable"
        return "abortable"

    def is_fatal(self, h):
        return id(h) in self.fatal_seen

    def close(self, h):
        try:
            h.poll(0)
        except Exception:  # noqa: BLE001 - a fenced or fatal instance: dropped all the same
            pass


class KafkaPythonDriver(Driver):
    lib = LIBS["kp"]

    def create(self):
        from kafka import KafkaProducer  # heavy: imported when used
        conf: dict[str, Any] = dict(bootstrap_servers=self.bootstrap, acks="all", linger_ms=2,
                                    max_block_ms=int(self.cfg.commit_timeout_s * 1000), request_timeout_ms=10_000,
                                    delivery_timeout_ms=int(self.cfg.step_deadline_s * 1000),
                                    enable_idempotence=True, client_id=self.tid or "chaos-idem-kp")
        if self.tid is not None:
            conf.update(transactional_id=self.tid, transaction_timeout_ms=self.cfg.transaction_timeout_ms)
        return KafkaProducer(**conf)

    def init(self, h, timeout):
        h.init_transactions()  # bounded by max_block_ms (KafkaTimeoutError: retriable)

    def begin(self, h):
        h.begin_transaction()

    def send(self, h, topic, value, partition, acks):
        fut = h.send(topic, value=value.encode(), partition=partition)
        fut.add_callback(lambda md, v=value: acks.ok(v, md.partition, md.offset))
        fut.add_errback(lambda exc, v=value: acks.error(v, type(exc).__name__))

    def flush(self, h, timeout):
        h.flush(timeout)

    def commit(self, h, timeout):
        _bounded(h.commit_transaction, self.cfg.step_deadline_s, "commit_transaction")

    def abort(self, h, timeout):
        _bounded(h.abort_transaction, self.cfg.step_deadline_s, "abort_transaction")

    def classify(self, e):
        from kafka.errors import (  # heavy: imported when used
            AuthorizationError,
            IllegalStateError,
            InvalidProducerEpochError,
            InvalidTxnStateError,
            KafkaConnectionError,
            OutOfOrderSequenceNumberError,
            ProducerFencedError,
            RetriableError,
            TransactionCoordinatorFencedError,
            UnsupportedVersionError,
        )
        if isinstance(e, SendsFailed):
            return "abortable"
        fatal = (ProducerFencedError, InvalidProducerEpochError, OutOfOrderSequenceNumberError, AuthorizationError,
                 UnsupportedVersionError, InvalidTxnStateError, TransactionCoordinatorFencedError, IllegalStateError,
                 StepTimeout)
        if isinstance(e, fatal):
            return "fatal"
        if isinstance(e, (RetriableError, KafkaConnectionError)):
            return "retriable"
        return "abortable"

    def is_fatal(self, h):
        tm = getattr(h, "_transaction_manager", None)
        try:
            return bool(tm is not None and tm.has_fatal_error())
        except Exception:  # noqa: BLE001 - an internal of kafka-python that moved: not known fatal
            return False

    def close(self, h):
        def go():
            try:
                h.close(timeout=0)
            except Exception:  # noqa: BLE001 - closing a fenced or failed instance
                pass
        threading.Thread(target=go, name="close-kafka-python", daemon=True).start()


DRIVERS = {"cf": ConfluentDriver, "kp": KafkaPythonDriver}
