"""Benchmark of Kafka transactions (KIP-98) through the broker with librdkafka (confluent-kafka), and
an exactly-once check across quorum leader kills.

Run it (a Python with pidquorum, confluent-kafka and kafka-python)::

    pidctl bench transactions [--quick] [--duration 20] [--kill-every 5] [--restart-after 1]
                              [--out bench-results] [--json PATH] [-o table|json]
                              [--phases steady,leader_kill] [--keep]

(``python -m benchmarks.transactions`` takes the same options.)

One three-node ``LocalCluster`` and one broker process (``BrokerProcess``, ``--partitions 3``), on
free ports of 127.0.0.1, serve the whole run.  A "unit" is 10 messages of ~10 bytes, message i to
partition i % 3 of a 3-partition topic, from one producer, one unit at a time:

1. ``steady`` (no faults), ``--duration`` s (20; 5 quick) for each producer, in alternating rounds
   (transactional, idempotent, idempotent, transactional; each half the duration) so that a change
   in the machine's load falls on both alike:

   * transactional: ``Producer`` with ``transactional.id``; ``begin_transaction()``, 10
     ``produce()``, ``commit_transaction()``.  Transactions per second, and the latency of
     ``commit_transaction()`` (it flushes the 10 messages, then EndTxn: the quorum decides, the
     markers are written, the quorum records the completion) and of the whole unit;
   * idempotent: ``enable.idempotence=True``, the same 10 ``produce()`` then ``flush()``, the closest
     non-transactional equivalent of a commit.  Units per second, ``flush()`` latency.

   The ratio transactional / idempotent is printed.  Both topics are read back: every committed
   transaction (every flushed unit) exactly once.

2. ``leader_kill``: the transactional loop again, ``--duration`` s, while the quorum leader (found by
   DescribeState, ``benchmarks.common.kill_leaders``) is SIGKILLed every ``--kill-every`` s (5) and
   restarted ``--restart-after`` s (1) later, so the quorum is back to three nodes before the next
   kill.  A failed step is handled as librdkafka documents: a retriable ``commit_transaction()``
   error is retried; an abortable one is followed by ``abort_transaction()``; a fatal one (or an
   abort that fails) replaces the producer with a new one of the same ``transactional.id``
   (``init_transactions()`` fences the old one and completes or aborts its transaction).  Every
   transaction's outcome as the client saw it is recorded:

   * ``committed``: ``commit_transaction()`` returned;
   * ``aborted``: ``commit_transaction()`` (or an earlier step) raised and ``abort_transaction()``
     returned;
   * ``abandoned``: a step before ``commit_transaction()`` failed fatally (no commit was asked for:
     the new producer's ``init_transactions()`` aborts it);
   * ``unknown``: ``commit_transaction()`` raised and the transaction could not be aborted (its
     outcome is the quorum's; like Jepsen's ``info``, neither a success nor a failure).

   Then the exactly-once CHECK: every message carries "transaction:index"; once the last stable
   offset of every partition has reached its high watermark (no transaction left open), the topic is
   read back with kafka-python (``KafkaConsumer(isolation_level="read_committed")``, ``assign`` +
   ``seek_to_beginning``, no group) and must show every ``committed`` transaction exactly once and
   whole (``lost``: one of its 10 messages missing; ``duplicated``: a message seen more than once),
   nothing of an ``aborted`` or ``abandoned`` one (``aborted_visible``), and an ``unknown`` one
   either whole or not at all (``partial``).  Any of these non-zero prints a FAIL line, keeps the
   broker's and the nodes' logs under ``--out`` and makes the exit status 1.

Figures print as tables on stdout (progress on stderr); every figure, the parameters, the machine
(CPUs, load average) and the versions (librdkafka, confluent-kafka, kafka-python) go to ``--json``
(``OUT/transactions.json``); ``-o json`` prints the same JSON instead of the tables.  Exit status 1
if a phase failed or a check did not pass.  Latency percentiles are nearest-rank over sorted
samples.  The quorum nodes, the broker and this process share the machine's cores: compare figures
of the same run.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import shutil
import sys
import time
from collections import Counter

import confluent_kafka
import kafka
from confluent_kafka import KafkaError, KafkaException, Producer
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from .common import LeaderKill, kill_leaders, percentile, temp_cluster
from .harness import environment_info, log, run_phases, utc_now
from .processes import REPO, BrokerProcess, child_env
from .report import fmt_num, print_footer, report, table

PARTITIONS = 3
MESSAGES = 10                 # per transaction (per unit)
ROUNDS = "TIIT"               # steady phase: the order of the transactional and idempotent rounds
WARMUP_UNITS = 5              # per producer, not measured (topic creation, metadata, connections)
INIT_TIMEOUT_S = 30.0
COMMIT_TIMEOUT_S = 30.0       # per commit_transaction() / abort_transaction() call
STEP_DEADLINE_S = 120.0       # retries of one commit or abort, and of a producer's init_transactions()
FLUSH_TIMEOUT_S = 30.0
PRODUCER_CONF: dict = {}        # librdkafka's defaults (linger.ms 5, acks all, transaction.timeout.ms 60000)
SETTLE_TIMEOUT_S = 90.0       # until the last stable offsets reach the high watermarks (> transaction.timeout.ms)
READ_TIMEOUT_S = 60.0
KEPT_LINES = 300              # librdkafka log lines kept in the JSON
VALUE_RE = re.compile(rb"^(\d+):(\d+)$")

EXPECT_ABSENT = ("aborted", "abandoned")
VIOLATIONS = ("lost", "duplicated", "aborted_visible", "partial", "foreign")


# ------------------------------------------------------------------ helpers
def summarize_ms(seconds: list[float]) -> dict:
    """n, p50, p99, max, mean (ms) of values in seconds (nearest rank)."""
    s = sorted(x * 1000.0 for x in seconds)
    if not s:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None}
    return {"n": len(s), "p50_ms": percentile(s, 50), "p99_ms": percentile(s, 99), "max_ms": s[-1],
            "mean_ms": sum(s) / len(s)}


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


# ------------------------------------------------------------------ the producers
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
    error), one transaction of MESSAGES messages at a time; every transaction's outcome recorded."""

    def __init__(self, bootstrap: str, tid: str, topic: str, conf: dict, t0: float | None = None):
        self.bootstrap, self.tid, self.topic, self.conf = bootstrap, tid, topic, conf
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
            for i in range(MESSAGES):
                p.produce(self.topic, value=value(n, i), partition=i % PARTITIONS, on_delivery=self._on_delivery)
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
                "messages_per_s": committed * MESSAGES / self.measured_wall_s if self.measured_wall_s else None,
                "commit": summarize_ms(self.commit_s), "unit": summarize_ms(self.unit_s),
                "abort": summarize_ms(self.abort_s), "init_transactions": summarize_ms(self.init_s),
                "longest_gap_between_commits_ms": max(gaps) * 1000 if gaps else None,
                "producer_instances": self.instances, "commit_retries": self.commit_retries,
                "errors": dict(self.errors), "delivery_errors": dict(self.delivery_errors)}

    def failed_transactions(self) -> dict[int, dict]:
        return {n: r for n, r in self.outcomes.items() if r["outcome"] != "committed"}


class IdempotentLoop(_UnitLoop):
    """One idempotent producer: MESSAGES produce() then flush(), one unit at a time."""

    def __init__(self, bootstrap: str, topic: str, conf: dict):
        self.topic = topic
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
        for i in range(MESSAGES):
            self.producer.produce(self.topic, value=value(n, i), partition=i % PARTITIONS,
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
                "messages_per_s": self.measured_units * MESSAGES / w if w else None,
                "flush": summarize_ms(self.flush_s), "unit": summarize_ms(self.unit_s), "errors": dict(self.errors)}


# ------------------------------------------------------------------ reading back
def _consumer(bootstrap: str, committed: bool) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                         auto_offset_reset="earliest",
                         isolation_level="read_committed" if committed else "read_uncommitted")


def end_offsets(bootstrap: str, topic: str, committed: bool) -> dict[int, int]:
    """ListOffsets latest: the high watermarks, or the last stable offsets for read_committed."""
    c = _consumer(bootstrap, committed)
    try:
        ends = c.end_offsets([KTopicPartition(topic, i) for i in range(PARTITIONS)])
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        c.close()


def settle(bootstrap: str, topic: str, timeout: float) -> dict:
    """Wait until every partition's last stable offset equals its high watermark (no transaction left open)."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    while True:
        hw, lso = end_offsets(bootstrap, topic, False), end_offsets(bootstrap, topic, True)
        if hw == lso or time.monotonic() > deadline:
            return {"settled": hw == lso, "seconds": time.perf_counter() - t0, "high_watermarks": hw,
                    "last_stable_offsets": lso}
        time.sleep(0.2)


def read_back(bootstrap: str, topic: str, committed: bool, timeout: float = READ_TIMEOUT_S) -> dict:
    """Every data record a consumer of that isolation level sees, up to the end offsets taken at the start
    (the last stable offsets for read_committed): ``records`` [(partition, offset, value bytes)]."""
    c = _consumer(bootstrap, committed)
    tps = [KTopicPartition(topic, i) for i in range(PARTITIONS)]
    records: list[tuple[int, int, bytes]] = []
    try:
        c.assign(tps)
        c.seek_to_beginning()
        ends = c.end_offsets(tps)
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                break
            for batch in c.poll(timeout_ms=500).values():
                records.extend((m.partition, m.offset, m.value) for m in batch)
        positions = {tp.partition: c.position(tp) for tp in tps}
    finally:
        c.close()
    ends_by = {tp.partition: off for tp, off in ends.items()}
    return {"records": records, "end_offsets": ends_by, "positions": positions,
            "complete": all(positions[p] >= e for p, e in ends_by.items())}


def exactly_once(records: list[tuple[int, int, bytes]], outcomes: dict[int, str]) -> dict:
    """What a read_committed consumer saw against what the producer was told (transaction -> outcome).

    ``lost``: committed transactions not seen whole; ``duplicated``: (transaction, index) pairs seen more
    than once; ``aborted_visible``: aborted or abandoned transactions with any message seen; ``partial``:
    transactions of unknown outcome seen in part; ``foreign``: records that are no message of ours."""
    seen: dict[int, Counter] = {}
    where: dict[int, list] = {}
    foreign = []
    for part, off, v in records:
        m = VALUE_RE.match(v or b"")
        if not m:
            foreign.append((part, off, (v or b"")[:40].decode(errors="replace")))
            continue
        txn, i = int(m.group(1)), int(m.group(2))
        seen.setdefault(txn, Counter())[i] += 1
        where.setdefault(txn, []).append((part, off, i))
    lost, aborted_visible, partial, dups = [], [], [], []
    unknown_committed, unknown_absent = [], []
    for txn, outcome in sorted(outcomes.items()):
        got = seen.get(txn, Counter())
        whole = all(got[i] >= 1 for i in range(MESSAGES))
        if outcome == "committed" and not whole:
            lost.append(txn)
        elif outcome in EXPECT_ABSENT and got:
            aborted_visible.append(txn)
        elif outcome == "unknown":
            if whole:
                unknown_committed.append(txn)
            elif got:
                partial.append(txn)
            else:
                unknown_absent.append(txn)
    for txn, got in seen.items():
        for i, k in got.items():
            if k > 1:
                dups.append((txn, i, k))
        if txn not in outcomes:
            foreign.append(("txn", txn, "transaction number never sent"))
    return {"records": len(records), "transactions_seen": len(seen),
            "committed": sum(1 for o in outcomes.values() if o == "committed"),
            "lost": len(lost), "duplicated": sum(k - 1 for _, _, k in dups), "aborted_visible": len(aborted_visible),
            "partial": len(partial), "foreign": len(foreign),
            "unknown_seen_committed": len(unknown_committed), "unknown_absent": len(unknown_absent),
            "examples": {"lost": [{"txn": t, "seen": sorted(where.get(t, []))} for t in lost[:20]],
                         "duplicated": [{"txn": t, "index": i, "times": k, "seen": sorted(where[t])}
                                        for t, i, k in dups[:20]],
                         "aborted_visible": [{"txn": t, "outcome": outcomes[t], "seen": sorted(where[t])}
                                             for t in aborted_visible[:20]],
                         "partial": [{"txn": t, "seen": sorted(where[t])} for t in partial[:20]],
                         "foreign": foreign[:20]}}


def check_topic(bootstrap: str, topic: str, outcomes: dict[int, str]) -> dict:
    """Settle, then read back read_committed (and read_uncommitted, for the aborted data kept in the log)."""
    s = settle(bootstrap, topic, SETTLE_TIMEOUT_S)
    t = time.perf_counter()
    committed = read_back(bootstrap, topic, True)
    out = exactly_once(committed["records"], outcomes)
    out["read_s"] = time.perf_counter() - t
    out["read_complete"] = committed["complete"]
    out["settle"] = s
    uncommitted = read_back(bootstrap, topic, False)
    out["read_uncommitted_records"] = len(uncommitted["records"])
    out["read_uncommitted_complete"] = uncommitted["complete"]
    return out


# ------------------------------------------------------------------ the run
class Rig:
    """The cluster and broker of the run (set up by the ``setup`` phase, taken down at the end)."""

    def __init__(self):
        self.stack = contextlib.ExitStack()
        self.lc = None
        self.broker: BrokerProcess | None = None
        self.directory: str | None = None

    def up(self, a) -> dict:
        t = time.perf_counter()
        self.lc, self.directory = self.stack.enter_context(
            temp_cluster("pidquorum-bench-transactions-", a.keep, "transactions", subdir="cluster", tail_lines=20))
        broker = BrokerProcess(self.directory, 1, self.lc.client_addresses(), "--partitions", str(PARTITIONS),
                               "--log-level", a.broker_log_level, new_session=True)
        self.stack.callback(broker.stop)
        broker.start()
        self.broker = broker
        return {"broker": broker.bootstrap, "nodes": [n.client_address for n in self.lc.nodes()],
                "setup_s": time.perf_counter() - t}

    def need(self) -> BrokerProcess:
        if self.broker is None:
            raise RuntimeError("no broker (the setup phase failed)")
        return self.broker

    def keep_logs(self, dest: str) -> list[str]:
        """Copy the broker's and the nodes' logs to ``dest`` (the run's evidence); the paths written."""
        os.makedirs(dest, exist_ok=True)
        out = []
        if self.broker is not None and os.path.exists(self.broker.log_path):
            out.append(shutil.copy(self.broker.log_path, os.path.join(dest, "broker-1.log")))
        if self.lc is not None:
            for n in self.lc.nodes():
                p = self.lc.log_path(n.node_id)
                if os.path.exists(p):
                    out.append(shutil.copy(p, os.path.join(dest, f"node-{n.node_id}.log")))
        return out

    def down(self) -> None:
        self.stack.close()


def phase_steady(a, rig: Rig) -> dict:
    bootstrap = rig.need().bootstrap
    conf = PRODUCER_CONF
    tx = TxnLoop(bootstrap, "bench-tx-steady", "tx-steady", conf)
    idem = IdempotentLoop(bootstrap, "idem-steady", conf)
    log(f"steady: warm-up ({WARMUP_UNITS} units each)")
    tx.warm_up()
    idem.warm_up()
    round_s = a.duration * 2 / len(ROUNDS)
    for k, which in enumerate(ROUNDS):
        log(f"steady: round {k + 1}/{len(ROUNDS)}: {'transactional' if which == 'T' else 'idempotent'}, "
            f"{round_s:g} s")
        (tx if which == "T" else idem).run_until(time.perf_counter() + round_s)
    tx.close()
    idem.producer.flush(FLUSH_TIMEOUT_S)
    t, i = tx.result(), idem.result()
    log("steady: reading both topics back")
    t["check"] = check_topic(bootstrap, tx.topic, {n: r["outcome"] for n, r in tx.outcomes.items()})
    i["check"] = check_topic(bootstrap, idem.topic, {n: "committed" for n in idem.flushed_units})
    ratio = {"per_s": (t["transactions_per_s"] / i["units_per_s"]) if t["transactions_per_s"] and i["units_per_s"]
             else None}
    for q in ("p50_ms", "p99_ms", "max_ms"):
        a_, b_ = t["commit"][q], i["flush"][q]
        ratio[f"latency_{q}"] = a_ / b_ if a_ is not None and b_ else None
    return {"duration_s": a.duration, "rounds": ROUNDS, "round_s": round_s, "transactional": t, "idempotent": i,
            "ratio_transactional_over_idempotent": ratio, "producer_conf": conf,
            "librdkafka_log": tx.lines.lines[-KEPT_LINES:]}


async def _kill_run(a, rig: Rig, loop: TxnLoop) -> list[dict]:
    rounds: list[dict] = []

    def on_round(k: LeaderKill) -> None:
        rounds.append({"round": k.round, "at_s": k.at_s, "late_s": k.late_s, "killed_node": k.killed_node,
                       "new_leader": k.new_leader, "new_leader_seen_after_s": k.new_leader_seen_after_s,
                       "restart_ready_s": k.restart_ready_s})
        log(k.summary())

    t_start = time.perf_counter()
    t_stop = t_start + a.duration
    loop.t0 = loop.lines.t0 = t_start
    await asyncio.gather(asyncio.to_thread(loop.run_until, t_stop),
                         kill_leaders(rig.lc, t_start, t_stop, a.kill_every, a.restart_after, 0.0, on_round))
    return rounds


def broker_lines(path: str, needles: list[str], limit: int = 200) -> list[str]:
    """Lines of the broker log holding one of ``needles`` or a WARNING / ERROR (the last ``limit``), but for
    the version probe of kafka-python's read-back consumers (ApiVersions v4 refused, v3 taken)."""
    out = []
    try:
        with open(path, errors="replace") as fh:
            for line in fh:
                if "ApiVersions v4 is not supported" in line:
                    continue
                if any(x in line for x in needles) or "WARNING" in line or "ERROR" in line or "Traceback" in line:
                    out.append(line.rstrip("\n")[:400])
    except FileNotFoundError:
        pass
    return out[-limit:]


def phase_leader_kill(a, rig: Rig) -> dict:
    broker = rig.need()
    tid, topic = "bench-tx-kills", "tx-kills"
    loop = TxnLoop(broker.bootstrap, tid, topic, PRODUCER_CONF)
    log(f"leader_kill: warm-up, then {a.duration:g} s of transactions, the leader SIGKILLed every "
        f"{a.kill_every:g} s and restarted {a.restart_after:g} s later")
    loop.warm_up()
    rounds = asyncio.run(_kill_run(a, rig, loop))
    loop.close()
    r = loop.result()
    log("leader_kill: waiting for the last stable offsets, then reading the topic back (read_committed)")
    r["check"] = check_topic(broker.bootstrap, topic, {n: x["outcome"] for n, x in loop.outcomes.items()})
    failed = loop.failed_transactions()
    r.update({"duration_s": a.duration, "kill_every_s": a.kill_every, "restart_after_s": a.restart_after,
              "kills": len(rounds), "rounds": rounds,
              "failed_transactions": {str(n): x for n, x in sorted(failed.items())},
              "librdkafka_log": loop.lines.lines[-KEPT_LINES:],
              "broker_log": broker_lines(broker.log_path, [tid, "transaction"]),
              "broker_anomalies": broker.anomalies()})
    return r


# ------------------------------------------------------------------ checks and output
def violations(check: dict) -> dict:
    return {k: check[k] for k in VIOLATIONS if check.get(k)}


def checks(res: dict) -> list[str]:
    out = []
    s = res["phases"].get("steady")
    if s:
        for label, key in (("transactional", "transactional"), ("idempotent", "idempotent")):
            x = s[key]
            if x["errors"] or x.get("delivery_errors"):
                out.append(f"steady {label}: errors {x['errors']} {x.get('delivery_errors') or ''}".rstrip())
            v = violations(x["check"])
            if v:
                out.append(f"FAIL steady {label}: exactly-once violated: {v}")
            if not x["check"]["settle"]["settled"] or not x["check"]["read_complete"]:
                out.append(f"steady {label}: topic not read to its end (settled {x['check']['settle']['settled']}, "
                           f"read complete {x['check']['read_complete']})")
    k = res["phases"].get("leader_kill")
    if k:
        c = k["check"]
        v = violations(c)
        if v:
            out.append(f"FAIL leader_kill: exactly-once violated for transactional.id {k['transactional_id']!r}: "
                       f"{v} (lost {c['lost']}, duplicated {c['duplicated']})")
        if not c["settle"]["settled"]:
            out.append(f"leader_kill: a transaction still open {SETTLE_TIMEOUT_S:.0f} s after the run (last stable "
                       f"offsets {c['settle']['last_stable_offsets']}, high watermarks "
                       f"{c['settle']['high_watermarks']})")
        if not c["read_complete"]:
            out.append("leader_kill: the topic was not read to its last stable offsets")
        if not k["kills"]:
            out.append(f"leader_kill: no leader was killed (a {k['duration_s']:g} s run with --kill-every "
                       f"{k['kill_every_s']:g} and --restart-after {k['restart_after_s']:g})")
        if not k["measured_committed"]:
            out.append("leader_kill: no transaction committed")
    return out


def _lat(s: dict) -> list[str]:
    return [fmt_num(s["p50_ms"], ".1f"), fmt_num(s["p99_ms"], ".1f"), fmt_num(s["max_ms"], ".1f")]


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _errs(d: dict) -> str:
    return "; ".join(f"{k} x{v}" for k, v in sorted(d.items())) or "0"


def print_results(res: dict) -> None:
    env, p = res["environment"], res["params"]
    print(f"Transactions benchmark ({'quick' if p['quick'] else 'full'} run; {env['cpu_count']} CPUs, "
          f"Python {env['python']}, confluent-kafka {env['confluent_kafka']} / librdkafka {env['librdkafka']}, "
          f"kafka-python {env['kafka_python']}, load avg at start {env['loadavg_start']})")
    s = res["phases"].get("steady")
    if s:
        t, i, r = s["transactional"], s["idempotent"], s["ratio_transactional_over_idempotent"]
        rows = [["units (transactions / flushes) per s", fmt_num(t["transactions_per_s"], ".1f"),
                 fmt_num(i["units_per_s"], ".1f"), _x(r["per_s"])],
                ["messages per s", fmt_num(t["messages_per_s"], ",.0f"), fmt_num(i["messages_per_s"], ",.0f"),
                 _x(r["per_s"])]]
        rows += [[f"commit_transaction() / flush() {q[:-3]} ms", fmt_num(t["commit"][q], ".2f"),
                  fmt_num(i["flush"][q], ".2f"), _x(r[f"latency_{q}"])] for q in ("p50_ms", "p99_ms", "max_ms")]
        rows += [
            ["whole unit p50 / p99 ms", " / ".join(fmt_num(t["unit"][q], ".2f") for q in ("p50_ms", "p99_ms")),
             " / ".join(fmt_num(i["unit"][q], ".2f") for q in ("p50_ms", "p99_ms")), "-"],
            ["units measured", t["measured_committed"], i["measured_units"], "-"],
            ["errors", _errs({**t["errors"], **t["delivery_errors"]}), _errs(i["errors"]), "-"],
            ["read back: lost / duplicated", f"{t['check']['lost']} / {t['check']['duplicated']}",
             f"{i['check']['lost']} / {i['check']['duplicated']}", "-"],
        ]
        print()
        print(table(f"1-2. one producer, {MESSAGES} messages per unit over {PARTITIONS} partitions, "
                    f"{s['duration_s']:g} s each (rounds {'-'.join(s['rounds'])} of {s['round_s']:g} s), no faults",
                    ["figure", "transactional", "idempotent", "tx / idem"], rows))
        print(f"  init_transactions(): {fmt_num(t['init_transactions']['p50_ms'], '.1f')} ms")
    k = res["phases"].get("leader_kill")
    if k:
        c = k["check"]
        o = k["outcomes"]
        rows = [
            ["leader SIGKILLs", k["kills"]],
            ["transactions committed (measured)", k["measured_committed"]],
            ["transactions failed: aborted / abandoned / unknown",
             f"{o.get('aborted', 0)} / {o.get('abandoned', 0)} / {o.get('unknown', 0)}"],
            ["commit retries (retriable errors)", k["commit_retries"]],
            ["producers created (same transactional.id)", k["producer_instances"]],
            ["transactions per s", fmt_num(k["transactions_per_s"], ".1f")],
            ["commit_transaction() p50 / p99 / max ms", " / ".join(_lat(k["commit"]))],
            ["longest gap between two commits ms", fmt_num(k["longest_gap_between_commits_ms"], ",.0f")],
            ["read_committed: records / transactions seen", f"{c['records']:,} / {c['transactions_seen']:,}"],
            ["unknown outcome: seen committed / absent", f"{c['unknown_seen_committed']} / {c['unknown_absent']}"],
            ["lost (committed, not seen whole)", c["lost"]],
            ["duplicated (messages seen twice)", c["duplicated"]],
            ["aborted/abandoned visible", c["aborted_visible"]],
            ["partial (unknown outcome, seen in part)", c["partial"]],
            ["foreign records", c["foreign"]],
        ]
        print()
        print(table(f"3. transactions with the quorum leader SIGKILLed every {k['kill_every_s']:g} s (restart after "
                    f"{k['restart_after_s']:g} s), {k['duration_s']:g} s, transactional.id {k['transactional_id']!r}",
                    ["figure", "value"], rows))
        for rd in k["rounds"]:
            print(f"  kill {rd['round']}: node {rd['killed_node']} at {rd['at_s']:.1f} s, new leader node "
                  f"{rd['new_leader']} seen after {rd['new_leader_seen_after_s'] * 1000:.0f} ms, restarted (ready in "
                  f"{rd['restart_ready_s'] * 1000:.0f} ms)")
        if k["errors"]:
            print(f"  client errors: {_errs(k['errors'])}")
        bad = violations(c)
        if bad:
            print(f"FAIL: exactly-once violated under leader kills (transactional.id {k['transactional_id']!r}): "
                  f"lost {c['lost']}, duplicated {c['duplicated']}, aborted visible {c['aborted_visible']}, "
                  f"partial {c['partial']}, foreign {c['foreign']}")
            for kind, ex in c["examples"].items():
                for e in ex[:5]:
                    print(f"  {kind}: {e}")
            if res.get("evidence"):
                print(f"  logs kept: {', '.join(res['evidence'])}")
        else:
            print(f"  exactly-once: OK (lost 0, duplicated 0; {c['committed']} committed transactions seen whole "
                  f"and once, none of {o.get('aborted', 0) + o.get('abandoned', 0)} aborted seen)")
    print()
    print_footer(res)


# ------------------------------------------------------------------ options
def parse_args(argv=None, prog: str | None = None):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds of each producer in the steady phase, and of the leader-kill run (20; quick 5)")
    ap.add_argument("--kill-every", type=float, default=5.0, help="seconds between leader kills")
    ap.add_argument("--restart-after", type=float, default=1.0, help="seconds from a kill to the node's restart")
    ap.add_argument("--phases", default="steady,leader_kill", help="comma-separated: steady, leader_kill")
    ap.add_argument("--out", default="bench-results", help="directory of the JSON (and of the logs of a failed run)")
    ap.add_argument("--json", default=None, help="where to write the results (default OUT/transactions.json)")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table",
                    help="print the tables, or the JSON (also written to --json)")
    ap.add_argument("--broker-log-level", default="INFO", help="the broker's --log-level (DEBUG logs every commit)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's and the broker's directory")
    ap.add_argument("--quick", action="store_true", help="5 s instead of 20 s")
    a = ap.parse_args(argv)
    if a.duration is None:
        a.duration = 5.0 if a.quick else 20.0
    if a.json is None:
        a.json = os.path.join(a.out, "transactions.json")
    a.phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    unknown = [x for x in a.phases if x not in PHASES]
    if unknown or not a.phases:
        ap.error(f"--phases: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(PHASES)}")
    if a.duration <= 0 or a.kill_every <= 0 or a.restart_after < 0:
        ap.error("--duration and --kill-every must be > 0, --restart-after >= 0")
    return a


PHASES = {"steady": phase_steady, "leader_kill": phase_leader_kill}


def main(argv=None, prog: str | None = None) -> int:
    a = parse_args(argv, prog)
    os.environ.update({"PYTHONPATH": child_env()["PYTHONPATH"]})  # the quorum nodes inherit os.environ
    res = {"params": {**{k: v for k, v in vars(a).items()}, "argv": sys.argv, "messages_per_unit": MESSAGES,
                      "partitions": PARTITIONS, "warmup_units": WARMUP_UNITS, "commit_timeout_s": COMMIT_TIMEOUT_S,
                      "percentiles": "nearest rank over sorted samples"},
           "environment": environment_info(
               confluent_kafka=getattr(confluent_kafka, "__version__", None) or confluent_kafka.version()[0],
               librdkafka=confluent_kafka.libversion()[0],
               kafka_python=kafka.__version__, repo=REPO),
           "started_at": utc_now(), "phases": {}, "errors": [], "failed_checks": []}
    rig = Rig()

    def all_checks(r: dict) -> list[str]:
        found = checks(r)
        if any(c.startswith("FAIL") for c in found):
            r["evidence"] = rig.keep_logs(os.path.join(a.out, "transactions-logs"))
        return found

    try:
        run_phases(res, [("setup", rig.up), *((n, lambda a_, fn=PHASES[n]: fn(a_, rig)) for n in a.phases)], a,
                   a.json, checks=all_checks, phase_seconds=True)
    finally:
        rig.down()
    return report(res, a.output, print_results)


if __name__ == "__main__":
    sys.exit(main())
