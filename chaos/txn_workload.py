"""The transactions workload of ``pidctl chaos run --workload transactions``: real Kafka clients
against a real broker, every operation in the history (``chaos.history``).  Transactional and idempotent
producers of both client libraries (``chaos.txn_drivers``), a read_committed poller and an LSO sampler,
each a thread with one outstanding operation at a time; docs/simulation.md ("The transactions workload
of chaos runs") lists the processes, the ops and what each outcome means.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .history import FAIL, INFO, INVOKE, OK, HistoryWriter, Op, now_ns
from .txn_drivers import DRIVERS, LIBS, Acks, Driver, SendsFailed, error_text
from .txn_read import RawBroker, ReadError

log = logging.getLogger(__name__)

TXN, COMMIT, ABORT, INIT, WRITE, POLL, LSO = "txn", "commit", "abort", "init", "write", "poll", "lso"
COMMITTED, ABORTED, ABANDONED, UNKNOWN = "committed", "aborted", "abandoned", "unknown"
READER_RC, READER_LSO = "reader-rc", "reader-lso"


@dataclass
class TxnWorkloadConfig:
    topic: str = "chaos-txn"
    partitions: int = 4
    txn_producers: int = 2                  # per client library
    idempotent_producers: int = 1           # per client library
    values_per_txn: tuple[int, int] = (2, 6)
    partitions_per_txn: tuple[int, int] = (2, 3)
    think_ms: tuple[int, int] = (0, 20)     # pause between two transactions of a producer
    idem_think_ms: tuple[int, int] = (20, 60)  # between two batches of an idempotent producer
    transaction_timeout_ms: int = 20_000
    commit_timeout_s: float = 10.0          # one commit_transaction() / abort_transaction() / init call
    step_deadline_s: float = 60.0           # retries of one step; a producer's replacement
    sample_interval_s: float = 0.15         # reader-lso
    poll_ms: int = 100                      # reader-rc
    check_sends: bool = True                # kafka-python: abort a transaction whose sends failed (see SendsFailed)


class WorkerGaveUp(Exception):
    """A producer could not be (re)created within the step deadline."""


# --------------------------------------------------------------------------
# Producers
# --------------------------------------------------------------------------

class _Worker(threading.Thread):
    def __init__(self, name: str, lib_key: str, bootstrap: str, tid: str | None, cfg: TxnWorkloadConfig,
                 history: HistoryWriter, stop: threading.Event, seed: int, logger: logging.Logger):
        super().__init__(name=name, daemon=True)
        self.process = name
        self.driver: Driver = DRIVERS[lib_key](bootstrap, tid, cfg, logger)
        self.lib = self.driver.lib
        self.tid = tid
        self.cfg = cfg
        self.history = history
        self.stop_event = stop
        self.rng = random.Random(f"{seed}/{name}")
        self.producer: Any = None
        self.instance = 0
        self._instances = 0
        self.lock = threading.Lock()   # the instance count and the adopted instance (the fencer's)
        self.error: str | None = None
        self.units = 0
        self.errors: dict[str, int] = {}

    def _note_error(self, where: str, e: BaseException) -> str:
        text = error_text(e)
        key = f"{where}: {text.split(':')[0]}"
        self.errors[key] = self.errors.get(key, 0) + 1
        return text

    def _op(self, type_: str, f: str, value: Any, error: str | None = None, t: int | None = None) -> Op:
        return self.history.append(Op(self.process, type_, f, value, now_ns() if t is None else t,
                                      None if type_ in (INVOKE, OK) else (error or "unknown")))

    def plan(self, n: int) -> list[list]:
        c = self.cfg
        k = self.rng.randint(*c.values_per_txn)
        parts = self.rng.sample(range(c.partitions), min(c.partitions, self.rng.randint(*c.partitions_per_txn)))
        return [[f"{self.process}:{n}:{i}", parts[i % len(parts)]] for i in range(k)]

    def _number(self) -> int:
        with self.lock:
            self._instances += 1
            return self._instances

    def _init(self, h: Any, deadline: float, note: bool = True) -> None:
        """init_transactions(), called again while its error is retriable, until ``deadline``."""
        while True:
            try:
                self.driver.init(h, self.cfg.commit_timeout_s)
                return
            except Exception as e:  # noqa: BLE001 - classified
                if self.driver.classify(e) != "retriable" or time.monotonic() > deadline:
                    raise
                if note:
                    self._note_error("init_transactions", e)
                time.sleep(0.1)

    def _new_instance(self, deadline: float) -> tuple[int, Any]:
        """A new instance, initialized (transactional); WorkerGaveUp after ``deadline``."""
        while True:
            k = self._number()
            self._op(INVOKE, INIT, {"instance": k})
            h = None
            try:
                try:
                    h = self.driver.create()
                except Exception as e:  # noqa: BLE001 - a bad configuration is not retried
                    if self.driver.classify(e) != "retriable":
                        self._op(FAIL, INIT, {"instance": k}, error_text(e))
                        raise WorkerGaveUp(f"{self.process}: cannot create a producer: {error_text(e)}") from None
                    raise
                if self.tid is not None:
                    self._init(h, deadline)
                self._op(OK, INIT, {"instance": k})
                return k, h
            except WorkerGaveUp:
                raise
            except Exception as e:  # noqa: BLE001 - a new instance, until the deadline
                text = self._note_error("new instance", e)
                self._op(FAIL, INIT, {"instance": k}, text)
                if h is not None:
                    self.driver.close(h)
                if time.monotonic() > deadline:
                    raise WorkerGaveUp(f"{self.process}: no producer within {self.cfg.step_deadline_s:.0f} s: "
                                       f"{text}") from None
                time.sleep(0.2)

    def _take_adopted(self) -> tuple[int, Any] | None:
        with self.lock:
            adopted = getattr(self, "adopted", None)
            self.adopted = None
        return adopted

    def ensure_producer(self) -> None:
        if self.producer is not None:
            return
        adopted = self._take_adopted()
        if adopted is not None:
            self.instance, self.producer = adopted
            return
        self.instance, self.producer = self._new_instance(time.monotonic() + self.cfg.step_deadline_s)

    def drop_producer(self) -> None:
        if self.producer is not None:
            self.driver.close(self.producer)
        self.producer = None

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self.ensure_producer()
                self.run_one()
                self.units += 1
                lo, hi = self.think_ms
                if hi > 0:
                    self.stop_event.wait(self.rng.uniform(lo, hi) / 1000)
        except Exception as e:  # noqa: BLE001 - kept for the run's report
            self.error = f"{type(e).__name__}: {e}"
            log.exception("%s stopped", self.process)
        finally:
            self.drop_producer()
            adopted = getattr(self, "adopted", None)
            if adopted is not None:
                self.driver.close(adopted[1])

    def run_one(self) -> None:  # pragma: no cover - each worker has its own
        raise NotImplementedError


class TxnWorker(_Worker):
    """A transactional producer; see the module doc."""

    adopted: tuple[int, Any] | None = None

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.think_ms = self.cfg.think_ms
        self.outcomes: dict[str, int] = {}

    def fence(self) -> dict:
        """Another instance with this worker's transactional id, initialized (which must fence the worker's
        own), while the worker goes on; the worker adopts it after its current transaction (or at once
        when its own instance fails).  Called from the nemesis' thread."""
        k = self._number()
        fenced = self.instance
        t0 = now_ns()
        h = None
        try:
            h = self.driver.create()
            self._init(h, time.monotonic() + self.cfg.step_deadline_s, note=False)
        except Exception as e:  # noqa: BLE001 - reported as the fault's outcome
            if h is not None:
                self.driver.close(h)
            return {"process": self.process, "tid": self.tid, "instance": k, "failed": error_text(e)}
        t1 = now_ns()
        with self.lock:
            old, self.adopted = self.adopted, (k, h)
        if old is not None:
            self.driver.close(old[1])
        return {"process": self.process, "tid": self.tid, "instance": k, "fenced_instance": fenced,
                "init_invoked_ns": t0, "init_returned_ns": t1}

    def _adopt_if_fenced(self) -> None:
        adopted = self._take_adopted()
        if adopted is None:
            return
        if adopted[0] > self.instance:
            self.drop_producer()
            self.instance, self.producer = adopted
        else:  # the worker made a newer instance of its own since: that one fenced the adopted one
            self.driver.close(adopted[1])

    def run_one(self) -> None:
        c = self.cfg
        n = self.units
        txn = f"{self.process}:{n}"
        writes = self.plan(n)
        p, inst = self.producer, self.instance
        self._op(INVOKE, TXN, {"txn": txn, "lib": self.lib, "instance": inst, "values": writes})
        acks = Acks()
        rec: dict[str, Any] = {"txn": txn, "lib": self.lib, "instance": inst, "values": writes,
                               "commit_asked_ns": None, "errors": []}
        stage = "begin_transaction"
        outcome = None
        error = None
        try:
            self.driver.begin(p)
            stage = "produce"
            for v, part in writes:
                self.driver.send(p, c.topic, v, part, acks)
            if self.driver.lib == LIBS["kp"]:
                stage = "flush"  # kafka-python: flushed first, as its docs ask (abort does not wait for sends)
                self.driver.flush(p, c.step_deadline_s)
                if c.check_sends:
                    with acks.lock:
                        failed = {v: acks.errors[v] for v, _ in writes if v in acks.errors}
                    if failed:
                        raise SendsFailed(f"{len(failed)} of {len(writes)} sends failed before the commit: "
                                          + ", ".join(f"{v}: {e}" for v, e in sorted(failed.items())[:3]))
            stage = "commit_transaction"

            def asked(t: int) -> None:
                if rec["commit_asked_ns"] is None:
                    rec["commit_asked_ns"] = t
            self._end_call(COMMIT, "commit_transaction", lambda: self.driver.commit(p, c.commit_timeout_s),
                           inst, txn, rec, asked)
            outcome = COMMITTED
        except Exception as e:  # noqa: BLE001 - the documented handling
            text = error_text(e)
            if stage != "commit_transaction":
                self._note_error(stage, e)
                rec["errors"].append(f"{stage}: {text}")
            error = text
            kind = self.driver.classify(e)
            if kind != "fatal" and not self.driver.is_fatal(p):
                outcome = self._abort(p, inst, txn, rec)
            if outcome is None:
                self.drop_producer()
                rec["replaced_producer"] = True
                outcome = UNKNOWN if rec["commit_asked_ns"] is not None else ABANDONED
        with acks.lock:
            rec["offsets"] = {v: list(po) for v, po in acks.offsets.items()}
            rec["delivery_errors"] = dict(acks.errors)
        rec["outcome"] = outcome
        rec["ended_ns"] = now_ns()
        type_ = OK if outcome == COMMITTED else FAIL if outcome in (ABORTED, ABANDONED) else INFO
        self._op(type_, TXN, rec, error if type_ != OK else None)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if self.producer is not None:
            self._adopt_if_fenced()

    def _abort(self, p: Any, inst: int, txn: str, rec: dict) -> str | None:
        """abort_transaction(), retried while retriable; ABORTED, or None if it failed."""
        try:
            self._end_call(ABORT, "abort_transaction", lambda: self.driver.abort(p, self.cfg.commit_timeout_s),
                           inst, txn, rec)
        except Exception:  # noqa: BLE001 - recorded by _end_call; the caller replaces the instance
            return None
        return ABORTED

    def _end_call(self, f: str, name: str, call: Callable[[], None], inst: int, txn: str, rec: dict,
                  invoked: Callable[[int], None] | None = None) -> None:
        """``call()`` (``commit_transaction()`` or ``abort_transaction()``, op ``f``) with its invoke and
        completion ops, called again while it fails with a retriable error within the step deadline; the
        last error is raised.  ``invoked(t)`` is told each invoke's time."""
        deadline = time.monotonic() + self.cfg.step_deadline_s
        while True:
            t = now_ns()
            if invoked is not None:
                invoked(t)
            self._op(INVOKE, f, {"txn": txn, "instance": inst}, t=t)
            try:
                call()
            except Exception as e:  # noqa: BLE001 - classified
                text = self._note_error(name, e)
                self._op(INFO, f, {"txn": txn, "instance": inst}, text)
                rec["errors"].append(f"{name}: {text}")
                if self.driver.classify(e) == "retriable" and time.monotonic() < deadline:
                    continue
                raise
            self._op(OK, f, {"txn": txn, "instance": inst})
            return


class IdempotentWorker(_Worker):
    """An idempotent producer: batches of values, each sent and flushed; see the module doc."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.think_ms = self.cfg.idem_think_ms
        self.acked = 0
        self.unacked = 0

    def run_one(self) -> None:
        c = self.cfg
        n = self.units
        writes = self.plan(n)
        p, inst = self.producer, self.instance
        self._op(INVOKE, WRITE, {"batch": f"{self.process}:{n}", "lib": self.lib, "instance": inst,
                                 "values": writes})
        acks = Acks()
        error = None
        fatal = False
        try:
            for v, part in writes:
                self.driver.send(p, c.topic, v, part, acks)
            self.driver.flush(p, c.step_deadline_s)
        except Exception as e:  # noqa: BLE001 - the values not acknowledged are unknown
            error = self._note_error("send", e)
            fatal = self.driver.classify(e) == "fatal"
        with acks.lock:
            acked = [[v, part, acks.offsets[v][1]] for v, part in writes if v in acks.offsets]
            unacked = [[v, part, acks.errors.get(v, error or "no delivery report")] for v, part in writes
                       if v not in acks.offsets]
        self.acked += len(acked)
        self.unacked += len(unacked)
        value = {"batch": f"{self.process}:{n}", "lib": self.lib, "instance": inst, "acked": acked,
                 "unacked": unacked}
        if unacked:
            self._op(INFO, WRITE, value, error or unacked[0][2])
        else:
            self._op(OK, WRITE, value)
        if fatal or self.driver.is_fatal(p):
            self.drop_producer()  # a new instance (a new producer ID) for the next batch


# --------------------------------------------------------------------------
# Readers during the run
# --------------------------------------------------------------------------

class _Reader(threading.Thread):
    """A reader of the topic during the run (a daemon thread named after its process), until ``stop``."""

    process = ""

    def __init__(self, bootstrap: str, cfg: TxnWorkloadConfig, history: HistoryWriter, stop: threading.Event):
        super().__init__(name=self.process, daemon=True)
        self.bootstrap, self.cfg, self.history, self.stop_event = bootstrap, cfg, history, stop


class PollReader(_Reader):
    """``reader-rc``: a read_committed KafkaConsumer over every partition from the beginning."""

    process = READER_RC
    polls = records = 0  # what the thread read (set on the instance as it goes)
    error: str | None = None

    def run(self) -> None:
        from kafka import KafkaConsumer  # heavy: imported when used
        from kafka import TopicPartition as KTopicPartition
        c = None
        try:
            c = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, group_id=None,
                              auto_offset_reset="earliest", isolation_level="read_committed",
                              client_id=READER_RC, request_timeout_ms=10_000)
            c.assign([KTopicPartition(self.cfg.topic, p) for p in range(self.cfg.partitions)])
            c.seek_to_beginning()
            while not self.stop_event.is_set():
                self.history.append(Op(READER_RC, INVOKE, POLL, None, now_ns()))
                try:
                    got = c.poll(timeout_ms=self.cfg.poll_ms)
                except Exception as e:  # noqa: BLE001 - recorded; the consumer goes on
                    self.history.append(Op(READER_RC, INFO, POLL, None, now_ns(), error_text(e)))
                    time.sleep(0.2)
                    continue
                recs = [[m.partition, m.offset, None if m.value is None else m.value.decode("utf-8", "replace")]
                        for batch in got.values() for m in batch]
                self.history.append(Op(READER_RC, OK, POLL, {"records": recs}, now_ns()))
                self.polls += 1
                self.records += len(recs)
        except Exception as e:  # noqa: BLE001 - kept for the report
            self.error = f"{type(e).__name__}: {e}"
            log.exception("reader-rc stopped")
        finally:
            if c is not None:
                c.close()


class LsoSampler(_Reader):
    """``reader-lso``: ListOffsets read_committed (LSO), then read_uncommitted (HW), every interval."""

    process = READER_LSO
    samples = failed = 0

    def run(self) -> None:
        with RawBroker(self.bootstrap, timeout=2.0, client_id=READER_LSO) as raw:
            while not self.stop_event.is_set():
                t = time.monotonic()
                self.history.append(Op(READER_LSO, INVOKE, LSO, None, now_ns()))
                try:
                    lso = raw.list_offsets(self.cfg.topic, self.cfg.partitions, committed=True)
                    hw = raw.list_offsets(self.cfg.topic, self.cfg.partitions, committed=False)
                except ReadError as e:
                    self.history.append(Op(READER_LSO, FAIL, LSO, None, now_ns(), str(e)[:300]))
                    self.failed += 1
                else:
                    self.history.append(Op(READER_LSO, OK, LSO, {"lso": {str(k): v for k, v in lso.items()},
                                                                 "hw": {str(k): v for k, v in hw.items()}}, now_ns()))
                    self.samples += 1
                self.stop_event.wait(max(0.0, self.cfg.sample_interval_s - (time.monotonic() - t)))
