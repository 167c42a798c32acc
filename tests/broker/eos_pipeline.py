"""A consume-transform-produce worker (exactly once) for tests/broker/test_eos_pipeline.py, run as its own
process (``python -m tests.broker.eos_pipeline``) so that it outlives the broker being killed and keeps
retrying through the restarts.

It reads the input topic in a consumer group (read_committed, no auto commit) and, per polled batch, in one
transaction: produces one output record per input record, to the same partition number of the output
topic, valued ``<input value>|<input partition>|<input offset>``, and commits the batch's offsets with
``send_offsets_to_transaction``.  Recovery follows each client's documented rules:

* confluent-kafka: a fatal error (fenced, ...) re-creates the producer (``init_transactions`` again); an
  error that needs an abort aborts; a retriable ``commit_transaction`` error is retried;
* kafka-python: any error of a transaction step aborts it; if the abort fails (fatal: fenced, or the
  producer's state is broken) the producer is closed and re-created;
* both: then the consumer is rewound to the group's committed offsets, or, if they cannot be read,
  re-created (it starts from them).

With ``--abort-every n`` it aborts its every n-th transaction itself, once the outputs are in the log
and the offsets sent, and rewinds: outputs that only read_uncommitted sees, and the rewind, in every run.

It prints one line per event to stdout: ``PROGRESS <records committed by this process>``, ``ABORTED
<records>`` (an abort of its choice), ``RECOVER <what> <error>``, and ``DONE`` once the group's committed
offsets reach the input's end offsets (then it exits 0); each ends with ``at <UTC time>``.
"""
from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import threading
import time


def say(*words) -> None:
    """One event line, with the wall clock last (to line it up with the broker's log)."""
    print(*words, time.strftime("at %H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}",
          flush=True)


def output_value(value: bytes, partition: int, offset: int) -> bytes:
    """The transformed record: the input value with where it came from (the test checks both)."""
    return b"%s|%d|%d" % (value, partition, offset)


# A killed worker's member stays in the group until its session lapses: the group's next generation (the
# new worker's) waits for that.  Kafka's smallest session (group.min.session.timeout.ms) keeps it short.
SESSION_MS = 6000
HEARTBEAT_MS = 1000

# kafka-python 3.0.12 throws a group join away when the poll() that began it returned before it completed:
# the next poll() finds the join task done and starts another (kafka/coordinator/base.py, join_group_async:
# "if self._join_task is None or self._join_task.is_done").  The leader's every new JoinGroup rebalances
# the group again, so a join slower than the poll's timeout (the other member has to notice, by heartbeat)
# can repeat for minutes: 70 generations in 70 s seen with two members and 500 ms polls.  A poll long
# enough for a whole join avoids it (it returns as soon as records come).
KAFKA_PYTHON_POLL_MS = 5000

# librdkafka >= 2.10 re-bootstraps when every broker is down - here, each time the one broker is killed - and
# then decommissions the brokers it had learned.  A decommissioned broker can stay cached as the group
# coordinator, and send_offsets_to_transaction then waits forever, past its own timeout (librdkafka issue
# 5511, fix proposed in its pull request 5512).  With one broker at a fixed address there is nothing to
# re-bootstrap to, so the test turns it off.
NO_REBOOTSTRAP = {"metadata.recovery.strategy": "none"}


def debug(contexts: str) -> dict:
    """librdkafka's debug logging when EOS_PIPELINE_DEBUG is set (to study a failure): ``contexts``, or
    the contexts it names (e.g. ``eos,protocol``).  (kafka-python: its group coordinator's debug log.)"""
    asked = os.environ.get("EOS_PIPELINE_DEBUG", "")
    return {"debug": contexts if asked in ("", "1") else asked} if asked else {}


# ------------------------------------------------------------------ confluent-kafka
def run_confluent(a) -> int:
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

    def new_consumer():
        c = Consumer({"bootstrap.servers": a.bootstrap, "group.id": a.group, "isolation.level": "read_committed",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest",
                      "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
                      "max.poll.interval.ms": 60_000, **NO_REBOOTSTRAP, **debug("cgrp")})
        c.subscribe([a.input])
        return c

    def new_producer():
        while True:
            p = Producer({"bootstrap.servers": a.bootstrap, "transactional.id": a.txn_id,
                          "transaction.timeout.ms": 20_000, "linger.ms": 5,
                          **NO_REBOOTSTRAP, **debug("eos")})
            try:
                p.init_transactions(20)
                return p
            except KafkaException as e:
                say("RECOVER init_transactions", e.args[0])
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def rewind() -> None:
        """Back to the group's committed offsets, for the partitions assigned (an aborted batch again); if
        they cannot be read, a new consumer (it starts from them).  Never on without one or the other: the
        next commit would skip the aborted records."""
        nonlocal consumer
        try:
            assigned = consumer.assignment()
            got = consumer.committed(assigned, timeout=20) if assigned else []
            failed = next((tp.error for tp in got if tp.error is not None), None)
            if failed is not None:
                raise KafkaException(failed)
            for tp in got:  # no offset committed yet: the partition's start
                consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))
        except KafkaException as e:  # seek on a partition not fetching yet, committed() timed out...
            say("RECOVER rewind-by-new-consumer", e.args[0])
            consumer.close()
            consumer = new_consumer()

    def all_committed() -> bool:
        tps = [TopicPartition(a.input, p) for p in range(len(ends))]
        try:
            got = consumer.committed(tps, timeout=10)
        except KafkaException as e:
            say("RECOVER committed", e.args[0])
            return False
        return all(tp.error is None for tp in got) and [tp.offset for tp in got] == ends

    def commit(producer) -> None:
        """commit_transaction, again while it fails with a retriable error (KIP-98's rule)."""
        while True:
            try:
                producer.commit_transaction(20)
                return
            except KafkaException as e:
                err = e.args[0]
                if not err.retriable() or err.txn_requires_abort() or err.fatal() or time.monotonic() > deadline:
                    raise
                say("RECOVER commit-retry", err)

    def abort(producer) -> bool:
        """abort_transaction (again while retriable); False if the producer must be re-created."""
        while True:
            try:
                producer.abort_transaction(20)
                return True
            except KafkaException as e:
                err = e.args[0]
                say("RECOVER abort-failed", err)
                if err.fatal() or not err.retriable() or time.monotonic() > deadline:
                    return False

    ends = [int(x) for x in a.ends.split(",")]
    deadline = time.monotonic() + a.deadline_s
    consumer = new_consumer()
    producer = new_producer()
    done = transactions = 0
    while time.monotonic() < deadline:
        msgs = consumer.consume(a.batch, 0.5)
        for m in msgs:
            if m.error():
                say("RECOVER consume", m.error())
        msgs = [m for m in msgs if not m.error()]
        if not msgs:
            if all_committed():
                say("DONE")
                consumer.close()
                return 0
            continue
        try:
            producer.begin_transaction()
            offsets: dict[int, int] = {}
            for m in msgs:
                while True:
                    try:
                        producer.produce(a.output, key=m.key(), partition=m.partition(),
                                         value=output_value(m.value(), m.partition(), m.offset()))
                        break
                    except BufferError:
                        producer.poll(0.1)
                offsets[m.partition()] = m.offset() + 1
            producer.send_offsets_to_transaction([TopicPartition(a.input, p, o) for p, o in offsets.items()],
                                                 consumer.consumer_group_metadata(), 20)
            transactions += 1
            if a.abort_every and transactions % a.abort_every == 0:
                if producer.flush(20):  # the outputs in the log before the abort (read_uncommitted sees them)
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "flush before the abort"))
                if not abort(producer):
                    raise KafkaException(KafkaError(KafkaError._STATE, "the chosen abort failed"))
                say("ABORTED", len(msgs))
                rewind()
                continue
            commit(producer)
            done += len(msgs)
            say("PROGRESS", done)
        except KafkaException as e:
            err = e.args[0]
            if err.fatal() or err.code() == KafkaError._FENCED:
                say("RECOVER new-producer", err)
                producer = new_producer()
            elif not abort(producer):
                say("RECOVER new-producer-after-abort", err)
                producer = new_producer()
            else:
                say("RECOVER aborted", err)
            rewind()
    say("DEADLINE")
    return 1


# ------------------------------------------------------------------ kafka-python
def run_kafka_python(a) -> int:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata

    tps = [TopicPartition(a.input, p) for p in range(len(a.ends.split(",")))]
    ends = [int(x) for x in a.ends.split(",")]
    deadline = time.monotonic() + a.deadline_s

    def bounded(what: str, fn, timeout: float = 25.0) -> None:
        """``fn()`` (commit/abort_transaction, which wait without a timeout in this client) in a thread,
        waited for ``timeout`` seconds: KafkaError if it raised, TimeoutError if it is still waiting."""
        box: list = []

        def call():
            try:
                fn()
                box.append(None)
            except Exception as e:  # noqa: BLE001 - handed to the caller
                box.append(e)

        t = threading.Thread(target=call, name=what, daemon=True)
        t.start()
        t.join(timeout)
        if not box:
            raise TimeoutError(f"{what} still waiting after {timeout}s")
        if box[0] is not None:
            raise box[0]

    def new_producer():
        while True:
            p = KafkaProducer(bootstrap_servers=a.bootstrap, transactional_id=a.txn_id, linger_ms=5,
                              transaction_timeout_ms=20_000, max_block_ms=20_000, request_timeout_ms=10_000)
            try:
                p.init_transactions()
                return p
            except KafkaError as e:
                say("RECOVER init_transactions", repr(e))
                p.close(timeout=2)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def new_consumer():
        return KafkaConsumer(a.input, bootstrap_servers=a.bootstrap, group_id=a.group,
                             isolation_level="read_committed", enable_auto_commit=False,
                             auto_offset_reset="earliest", max_poll_records=a.batch,
                             session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS,
                             max_poll_interval_ms=60_000, request_timeout_ms=40_000)

    def committed(tp) -> int | None:
        return consumer.committed(tp, timeout_ms=10_000)

    def rewind() -> None:
        """Back to the group's committed offsets, for the partitions assigned (an aborted batch again); if
        they cannot be read, a new consumer (it starts from them).  Never on without one or the other: the
        next commit would skip the aborted records."""
        nonlocal consumer
        try:
            for tp in consumer.assignment():
                off = committed(tp)
                consumer.seek(tp, off if off is not None else 0)
        except KafkaError as e:
            say("RECOVER rewind-by-new-consumer", repr(e))
            consumer.close()
            consumer = new_consumer()

    consumer = new_consumer()

    def all_committed() -> bool:
        try:
            return [committed(tp) for tp in tps] == ends
        except KafkaError as e:
            say("RECOVER committed", repr(e))
            return False

    producer = new_producer()
    done = transactions = 0
    while time.monotonic() < deadline:
        try:
            polled = consumer.poll(timeout_ms=KAFKA_PYTHON_POLL_MS, max_records=a.batch)
        except KafkaError as e:
            say("RECOVER poll", repr(e))
            continue
        if not polled:
            if all_committed():
                say("DONE")
                consumer.close()
                producer.close(timeout=5)
                return 0
            continue
        try:
            producer.begin_transaction()
            offsets = {}
            for tp, records in polled.items():
                for r in records:
                    producer.send(a.output, key=r.key, partition=tp.partition,
                                  value=output_value(r.value, tp.partition, r.offset))
                offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, "", -1)
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            transactions += 1
            if a.abort_every and transactions % a.abort_every == 0:
                producer.flush(timeout=20)  # the outputs in the log before the abort (read_uncommitted sees them)
                bounded("abort_transaction", producer.abort_transaction)
                say("ABORTED", sum(len(r) for r in polled.values()))
                rewind()
                continue
            bounded("commit_transaction", producer.commit_transaction)
            done += sum(len(r) for r in polled.values())
            say("PROGRESS", done)
        except (KafkaError, TimeoutError) as e:
            try:
                bounded("abort_transaction", producer.abort_transaction)
                say("RECOVER aborted", repr(e))
            except (KafkaError, TimeoutError) as abort_error:
                say("RECOVER new-producer", repr(e), "abort:", repr(abort_error))
                producer.close(timeout=2)
                producer = new_producer()
            rewind()
    say("DEADLINE")
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", choices=("confluent", "kafka-python"), required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--txn-id", required=True)
    ap.add_argument("--ends", required=True, help="the input partitions' end offsets, comma separated")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--abort-every", type=int, default=0,
                    help="abort every n-th transaction on purpose (after its outputs and offsets were sent)")
    ap.add_argument("--deadline-s", type=float, default=90.0)
    a = ap.parse_args(argv)
    faulthandler.register(signal.SIGUSR1)  # the test asks for the threads' stacks when the worker is stuck
    if a.client == "kafka-python" and os.environ.get("EOS_PIPELINE_DEBUG"):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("kafka.coordinator").setLevel(logging.DEBUG)
    return (run_confluent if a.client == "confluent" else run_kafka_python)(a)


if __name__ == "__main__":
    sys.exit(main())
