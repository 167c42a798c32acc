"""The producers of the transactions benchmark (confluent-kafka, librdkafka's defaults), run unit by unit
(a unit: ``messages`` messages, message i to partition i % ``partitions``; MESSAGES and PARTITIONS unless
the phase says otherwise): a transactional producer whose every transaction's outcome is recorded
(committed, aborted, abandoned, unknown), replaced by a new one of the same transactional.id after a fatal
error, and an idempotent producer flushing each unit."""
from __future__ import annotations

import logging
import time
from collections import Counter

from confluent_kafka import KafkaError, KafkaException, Producer

from .report import summarize_ms

PARTITIONS = 3                # per transaction (per unit), unless a phase says otherwise
MESSAGES = 10                 # per transaction (per unit), unless a phase says otherwise
ROUNDS = "TIIT"               # the order of the transactional and idempotent rounds of a comparison
WARMUP_UNITS = 5              # per producer, not measured (topic creation, metadata, connections)
INIT_TIMEOUT_S = 30.0
COMMIT_TIMEOUT_S = 30.0       # per commit_transaction() / abort_transaction() call
STEP_DEADLINE_S = 120.0       # retries of one commit or abort, and of a producer's init_transactions()
FLUSH_TIMEOUT_S = 30.0


def _latency(seconds) -> dict:
    """n, p50, p99, max, mean in ms (this benchmark's JSON has no min)."""
    return summarize_ms(seconds, with_min=False)


def error_name(e: BaseException) -> str:
    err = e.args[0] if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError) else None
    if err is None:
        return f"{type(e).__name__}: {e}"
    kind = "fatal" if err.fatal() else "abortable" if err.txn_requires_abort() else \
        "retriable" if err.retriable() else "error"
    return f"{err.name()} ({kind}): {err.str()}"


def kafka_error(e: KafkaException) -> KafkaError | None:
    return e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None


def value(txn: int, index: int) -> bytes:
    return f"{txn}:{index}".encode()


class _Lines(logging.Handler):
    """librdkafka's log lines (handed over on poll()), with the time from the phase's start."""

    def __init__(self, t0: float):
        super().__init__(logging.DEBUG)
        self.t0 = t0
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{time.perf_counter() - self.t0:8.3f}s {record.levelname} {record.getMessage()}")


class _UnitLoop:
    """A producer loop run unit by unit (``run_one``): warm-up units, then measured ones until a deadline."""
    measured_wall_s: float

    def run_one(self, measured: bool) -> None:  # pragma: no cover - each loop has its own
        raise NotImplementedError

    def warm_up(self) -> None:
        for _ in range(WARMUP_UNITS):
            self.run_one(measured=False)

    def run_until(self, t_stop: float) -> None:
        t = time.perf_counter()
        while time.perf_counter() < t_stop:
            self.run_one(measured=True)
        self.measured_wall_s += time.perf_counter() - t


class TxnLoop(_UnitLoop):
    """One transactional producer (replaced by a new one of the same transactional.id after a fatal
    error), one transaction of ``messages`` messages over ``partitions`` partitions at a time; every
    transaction's outcome recorded."""

    def __init__(self, bootstrap: str, tid: str, topic: str, conf: dict, t0: float | None = None,
                 partitions: int = PARTITIONS, messages: int = MESSAGES):
        self.bootstrap, self.tid, self.topic, self.conf = bootstrap, tid, topic, conf
        self.partitions, self.messages = partitions, messages
        self.t0 = time.perf_counter() if t0 is None else t0
        self.lines = _Lines(self.t0)
        self.logger = logging.Logger(f"rdkafka-{tid}")  # not registered: goes with this loop
        self.logger.addHandler(self.lines)
        self.producer: Producer | None = None
        self.next_txn = 0
        self.instances = 0
        self.init_s: list[float] = []
        self.outcomes: dict[int, dict] = {}  # transaction number -> {"outcome", "at_s", ...}
        self.commit_s: list[float] = []      # measured transactions only
        self.unit_s: list[float] = []
        self.abort_s: list[float] = []
        self.commit_times: list[float] = []  # perf_counter() of each commit that returned (measured)
        self.measured_wall_s = 0.0
        self.errors: Counter = Counter()
        self.commit_retries = 0
        self.delivery_errors: Counter = Counter()

    # -------------------------------------------------------- producer life
    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self.delivery_errors[err.name()] += 1

    def new_producer(self) -> None:
        """A producer with the transactional id, init_transactions() retried until STEP_DEADLINE_S."""
        self.producer = None  # the old one, if any, is destroyed (it is fenced by the new one's init)
        deadline = time.monotonic() + STEP_DEADLINE_S
        while True:
            self.instances += 1
            p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.tid,
                          "logger": self.logger, **self.conf})
            t = time.perf_counter()
            while True:
                try:
                    p.init_transactions(INIT_TIMEOUT_S)
                    self.init_s.append(time.perf_counter() - t)
                    self.producer = p
                    return
                except KafkaException as e:
                    err = kafka_error(e)
                    self.errors[f"init_transactions: {error_name(e)}"] += 1
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"init_transactions() of {self.tid!r} failing for "
                                           f"{STEP_DEADLINE_S:.0f} s: {error_name(e)}") from None
                    if err is not None and err.retriable() and not err.fatal():
                        time.sleep(0.1)
                        continue
                    break  # fatal: a new producer
            time.sleep(0.1)

    # -------------------------------------------------------- one transaction
    def run_one(self, measured: bool) -> str:
        """One transaction; its outcome ("committed", "aborted", "abandoned", "unknown")."""
        if self.producer is None:
            self.new_producer()
        p = self.producer
        n = self.next_txn
        self.next_txn += 1
        rec: dict = {"at_s": time.perf_counter() - self.t0, "instance": self.instances}
        self.outcomes[n] = rec
        t_unit = time.perf_counter()
        stage = "begin_transaction"
        try:
            p.begin_transaction()
            stage = "produce"
            for i in range(self.messages):
                p.produce(self.topic, value=value(n, i), partition=i % self.partitions,
                          on_delivery=self._on_delivery)
            stage = "commit_transaction"
            t_commit = time.perf_counter()
            self._commit(p, rec)
            now = time.perf_counter()
            rec["outcome"] = "committed"
            if measured:
                self.commit_s.append(now - t_commit)
                self.unit_s.append(now - t_unit)
                self.commit_times.append(now)
        except KafkaException as e:
            rec.update(stage=stage, error=error_name(e))
            self.errors[f"{stage}: {error_name(e)}"] += 1
            rec["outcome"] = self._after_failure(p, e, stage, rec)
        finally:
            p.poll(0)  # delivery reports and log lines
        return rec["outcome"]

    def _commit(self, p: Producer, rec: dict) -> None:
        """commit_transaction(), retried while its error is retriable (librdkafka: the outcome is not known
        yet; the call may be repeated), until STEP_DEADLINE_S."""
        deadline = time.monotonic() + STEP_DEADLINE_S
        while True:
            try:
                p.commit_transaction(COMMIT_TIMEOUT_S)
                return
            except KafkaException as e:
                err = kafka_error(e)
                if (err is None or not err.retriable() or err.fatal() or err.txn_requires_abort()
                        or time.monotonic() > deadline):
                    raise
                self.commit_retries += 1
                rec.setdefault("commit_retries", []).append(error_name(e))

    def _after_failure(self, p: Producer, e: KafkaException, stage: str, rec: dict) -> str:
        err = kafka_error(e)
        if err is not None and not err.fatal():
            # Abortable (or a plain error outside the commit): abort_transaction(), retried while retriable.
            deadline = time.monotonic() + STEP_DEADLINE_S
            t = time.perf_counter()
            while True:
                try:
                    p.abort_transaction(COMMIT_TIMEOUT_S)
                    self.abort_s.append(time.perf_counter() - t)
                    return "aborted"
                except KafkaException as e2:
                    err2 = kafka_error(e2)
                    rec.setdefault("abort_errors", []).append(error_name(e2))
                    self.errors[f"abort_transaction: {error_name(e2)}"] += 1
                    if err2 is not None and err2.retriable() and not err2.fatal() and time.monotonic() < deadline:
                        continue
                    break
        # Fatal, or the abort failed: a new producer of the same id (its init_transactions() fences this one
        # and completes or aborts what it left).
        self.producer = None
        rec["replaced_producer"] = True
        return "unknown" if stage == "commit_transaction" else "abandoned"

    # -------------------------------------------------------- loops
    def warm_up(self) -> None:
        if self.producer is None:
            self.new_producer()
        super().warm_up()

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(FLUSH_TIMEOUT_S)
            self.producer.poll(0)
        self.producer = None

    def result(self) -> dict:
        by = Counter(r["outcome"] for r in self.outcomes.values())
        committed = len(self.commit_s)
        gaps = [b - a for a, b in zip(self.commit_times, self.commit_times[1:])]
        return {"transactional_id": self.tid, "topic": self.topic, "transactions": len(self.outcomes),
                "outcomes": dict(by), "measured_committed": committed, "measured_wall_s": self.measured_wall_s,
                "transactions_per_s": committed / self.measured_wall_s if self.measured_wall_s else None,
                "messages_per_s": committed * self.messages / self.measured_wall_s if self.measured_wall_s else None,
                "commit": _latency(self.commit_s), "unit": _latency(self.unit_s),
                "abort": _latency(self.abort_s), "init_transactions": _latency(self.init_s),
                "longest_gap_between_commits_ms": max(gaps) * 1000 if gaps else None,
                "producer_instances": self.instances, "commit_retries": self.commit_retries,
                "errors": dict(self.errors), "delivery_errors": dict(self.delivery_errors)}

    def failed_transactions(self) -> dict[int, dict]:
        return {n: r for n, r in self.outcomes.items() if r["outcome"] != "committed"}


class IdempotentLoop(_UnitLoop):
    """One idempotent producer: ``messages`` produce() over ``partitions`` partitions then flush(), one
    unit at a time."""

    def __init__(self, bootstrap: str, topic: str, conf: dict, partitions: int = PARTITIONS,
                 messages: int = MESSAGES):
        self.topic = topic
        self.partitions, self.messages = partitions, messages
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **conf})
        self.next_unit = 0
        self.flush_s: list[float] = []
        self.unit_s: list[float] = []
        self.measured_wall_s = 0.0
        self.measured_units = 0
        self.flushed_units: set[int] = set()
        self.errors: Counter = Counter()

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self.errors[f"delivery: {err.name()}"] += 1

    def run_one(self, measured: bool) -> None:
        n = self.next_unit
        self.next_unit += 1
        t_unit = time.perf_counter()
        for i in range(self.messages):
            self.producer.produce(self.topic, value=value(n, i), partition=i % self.partitions,
                                  on_delivery=self._on_delivery)
        t = time.perf_counter()
        left = self.producer.flush(FLUSH_TIMEOUT_S)
        now = time.perf_counter()
        if left:
            self.errors["flush: messages left after the timeout"] += left
            return
        self.flushed_units.add(n)
        if measured:
            self.flush_s.append(now - t)
            self.unit_s.append(now - t_unit)
            self.measured_units += 1

    def result(self) -> dict:
        w = self.measured_wall_s
        return {"topic": self.topic, "units": self.next_unit, "measured_units": self.measured_units,
                "measured_wall_s": w, "units_per_s": self.measured_units / w if w else None,
                "messages_per_s": self.measured_units * self.messages / w if w else None,
                "flush": _latency(self.flush_s), "unit": _latency(self.unit_s), "errors": dict(self.errors)}


def alternate(tx: TxnLoop, idem: IdempotentLoop, seconds: float, label: str, log) -> float:
    """ROUNDS in turn, ``seconds`` per producer in all (``seconds * 2 / len(ROUNDS)`` a round), so that
    both meet the same broker state; the round length."""
    round_s = seconds * 2 / len(ROUNDS)
    for k, which in enumerate(ROUNDS):
        log(f"{label}: round {k + 1}/{len(ROUNDS)}: {'transactional' if which == 'T' else 'idempotent'}, "
            f"{round_s:g} s")
        (tx if which == "T" else idem).run_until(time.perf_counter() + round_s)
    return round_s


def over_idempotent(t: dict, i: dict) -> dict:
    """Transactional over idempotent: units per s, and commit over flush latency (p50, p99, max)."""
    ratio = {"per_s": (t["transactions_per_s"] / i["units_per_s"]) if t["transactions_per_s"] and i["units_per_s"]
             else None}
    for q in ("p50_ms", "p99_ms", "max_ms"):
        a, b = t["commit"][q], i["flush"][q]
        ratio[f"latency_{q}"] = a / b if a is not None and b else None
    return ratio
