"""Exactly-once consume-transform-produce through broker kills, with confluent-kafka and with kafka-python.

A worker process (tests/broker/eos_pipeline.py) reads an input topic in a consumer group (read_committed)
and, per batch, in one transaction produces one output record per input record and commits the batch's
offsets with send_offsets_to_transaction (AddOffsetsToTxn + TxnOffsetCommit).  Meanwhile the broker -
which holds the partitions, the transaction coordinator and the group coordinator - is killed with SIGKILL
several times and restarted on the same port with its data.  The worker recovers as its client documents
(abort and rewind to the committed offsets, or a new producer) and goes on until the group has committed
the whole input.

A second variant runs two workers in the group (rebalances as one joins, dies and is replaced), through
a broker kill too.

Then, read with read_committed from the beginning, the output holds every input record's output exactly
once; the group's committed offsets are the input's end offsets; and for each input partition the
committed outputs that came from it are exactly its offsets 0 .. committed-1 (each output names its input
partition and offset).  Aborted outputs (seen only by read_uncommitted) are counted and printed.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

from benchmarks.processes import REPO, child_env, stop_process
from tests.conftest import cluster_harness, wait_for

PARTITIONS = 3
RECORDS = 3000
# What happens when: once the workers have committed that many records (together; each counts from its
# start).  ("start", name): a worker with transactional id <name> (a second one joins the group: a
# rebalance); ("broker", None): the broker is killed (SIGKILL) and restarted; ("kill", name): worker <name>
# is killed (SIGKILL) and a new one with its transactional id started (which aborts its open transaction);
# ("working", name, n): nothing, once worker <name> itself has committed n records (it has partitions).
ONE_WORKER = (("start", "a", 0), ("broker", None, 450), ("kill", "a", 1000), ("broker", None, 1450),
              ("broker", None, 2000))
TWO_WORKERS = (("start", "a", 0), ("start", "b", 300), ("working", "b", 50), ("broker", None, 1200),
               ("kill", "a", 1600), ("broker", None, 2200))
ABORT_EVERY = 5  # each worker aborts its every 5th transaction itself (and rewinds)
WORKER_DEADLINE_S = 80.0  # a worker gives up (exit 1) after this long
# A restarted broker registers once its killed incarnation's session has lapsed in the quorum: a short
# session (and heartbeats well inside it) makes that 3 s, not 9.
SESSION_MS = 3000
BROKER_FLAGS = ("--partitions", str(PARTITIONS), "--group-initial-rebalance-delay-ms", "0",
                "--broker-heartbeat-interval-ms", "300", "--pid-manager-backoff-max-s", "0.2")


@pytest.fixture
def cluster(tmp_path, request):
    """The quorum of the ``brokers`` fixture, with short broker sessions."""
    yield from cluster_harness(tmp_path, request, broker_session_timeout_ms=SESSION_MS)


def produce_input(bootstrap: str, topic: str) -> list[int]:
    """RECORDS unique values, idempotently, round-robin over the partitions; the end offsets."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 3})
    for i in range(RECORDS):
        p.produce(topic, key=b"k%d" % i, value=b"v%06d" % i, partition=i % PARTITIONS)
    assert p.flush(30) == 0
    ends = end_offsets(bootstrap, topic, committed=False)
    assert sum(ends) == RECORDS, ends
    return ends


def end_offsets(bootstrap: str, topic: str, committed: bool) -> list[int]:
    """ListOffsets latest per partition: the high watermark, or the last stable offset for read_committed."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      isolation_level="read_committed" if committed else "read_uncommitted")
    try:
        ends = c.end_offsets([KTopicPartition(topic, i) for i in range(PARTITIONS)])
        return [ends[KTopicPartition(topic, i)] for i in range(PARTITIONS)]
    finally:
        c.close()


def read_to_end(bootstrap: str, topic: str, committed: bool) -> list[bytes]:
    """Every value a consumer of that isolation level reads from the beginning to the end offsets."""
    ends = end_offsets(bootstrap, topic, committed)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "eos-reader", "enable.auto.commit": False,
                  "isolation.level": "read_committed" if committed else "read_uncommitted", "log_level": 3})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        got: list[bytes] = []

        def at_end() -> bool:
            for m in c.consume(500, 0.2):
                assert not m.error(), m.error()
                got.append(m.value())
            pos = c.position([TopicPartition(topic, p) for p in range(PARTITIONS)])
            return all(tp.offset >= ends[tp.partition] for tp in pos)

        wait_for(at_end, 30, interval=0, what=f"reading {topic} to {ends}")
        return got
    finally:
        c.close()


def committed_offsets(bootstrap: str, group: str, topic: str) -> list[int]:
    """OffsetFetch of the group (require_stable, as a read_committed consumer asks): per partition."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                  "log_level": 3})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=20)
        return [tp.offset for tp in got]
    finally:
        c.close()


def describe_group(bootstrap: str, group: str) -> str:
    """DescribeGroups and OffsetFetch, for a failure's report: state, members, assignments, offsets."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    try:
        g = admin.describe_consumer_groups([group], request_timeout=10)[group].result(10)
        members = [(m.member_id, m.client_id, sorted(tp.partition for tp in m.assignment.topic_partitions))
                   for m in g.members]
        offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
        return (f"state {g.state}, members {members}, "
                f"offsets {[(tp.partition, tp.offset) for tp in offsets.topic_partitions]}")
    except Exception as e:  # noqa: BLE001 - a report, on the way to the test's own failure
        return f"(not described: {e!r})"
    finally:
        del admin


class Worker:
    """A worker process, its stdout in its own file; ``progress`` is the records it has committed so far."""

    def __init__(self, client: str, bootstrap: str, ends: list[int], name: str, log_path: str):
        self.name, self.log_path = name, log_path
        cmd = [sys.executable, "-m", "tests.broker.eos_pipeline", "--client", client, "--bootstrap", bootstrap,
               "--input", "in", "--output", "out", "--group", "ctp", "--txn-id", f"ctp-{client}-{name}",
               "--ends", ",".join(map(str, ends)), "--deadline-s", str(WORKER_DEADLINE_S),
               "--abort-every", str(ABORT_EVERY)]
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=REPO, env=child_env())

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def progress(self) -> int:
        found = re.findall(r"^PROGRESS (\d+) at ", self.log(), re.M)
        return int(found[-1]) if found else 0

    def chosen_aborts(self) -> int:
        """Records of the transactions it aborted on purpose (their outputs were in the log)."""
        return sum(int(n) for n in re.findall(r"^ABORTED (\d+) at ", self.log(), re.M))

    def events(self) -> Counter:
        return Counter(line.split()[1] for line in self.log().splitlines() if line.startswith("RECOVER "))

    def dump_stacks(self) -> None:
        """A stuck worker's threads' stacks into its log (faulthandler on SIGUSR1), to see where it waits."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGUSR1)
            try:
                wait_for(lambda: "most recent call first" in self.log(), 5, what="the worker's stacks")
            except AssertionError:
                pass

    def exited(self) -> bool:
        if self.proc.poll() is None:
            return False
        assert self.proc.returncode == 0, f"worker exited with {self.proc.returncode}:\n{self.log()[-4000:]}"
        return True


def run_pipeline(b, tmp_path, client: str, script) -> list[Worker]:
    """The workers through ``script`` (see ONE_WORKER), until every live one has seen the whole input
    committed; every worker started, in order."""
    ends = produce_input(b.bootstrap, "in")
    workers: list[Worker] = []
    live: dict[str, Worker] = {}

    def start(name: str) -> None:
        live[name] = Worker(client, b.bootstrap, ends, name, str(tmp_path / f"worker-{len(workers) + 1}.log"))
        workers.append(live[name])

    def progress() -> int:
        return sum(w.progress() for w in workers)

    try:
        for i, (what, name, at) in enumerate(script):
            done = (lambda: live[name].progress()) if what == "working" else progress
            wait_for(lambda: done() >= at or any(w.exited() for w in live.values()), 30,
                     what=f"the workers' progress to reach {at} before {what} {name or ''}")
            assert all(w.proc.poll() is None for w in live.values()), f"a worker finished before step {i + 1}"
            if what == "start":
                start(name)
            elif what == "working":
                pass
            elif what == "broker":
                b.kill()  # SIGKILL: partitions, transaction and group coordinator all die mid-flight
                b.start()  # same port, same data directory
            else:
                os.kill(live[name].proc.pid, signal.SIGKILL)  # mid-transaction, most likely
                live[name].proc.wait(10)
                start(name)
        wait_for(lambda: all(w.exited() for w in live.values()), WORKER_DEADLINE_S + 10, interval=0.1,
                 what="the workers to commit the whole input")
        # Each transactional id did some of the work (a worker that joins late may find its partitions done).
        assert {w.name for w in workers if w.progress() > 0} == {w.name for w in workers}
        return workers
    except BaseException:
        for n, w in enumerate(workers, 1):
            w.dump_stacks()
            print(f"----- worker {n} ({w.name}) log -----\n{w.log()[-8000:]}")
        print(f"----- the group as the broker describes it -----\n{describe_group(b.bootstrap, 'ctp')}")
        raise
    finally:
        for w in workers:
            stop_process(w.proc)


def check_exactly_once(b, workers: list[Worker]) -> int:
    """The output and the group's offsets after the workers: the aborted outputs' count."""
    ends = end_offsets(b.bootstrap, "in", committed=False)
    assert all("DONE" in w.log() for w in workers if w.proc.returncode == 0)
    # Every transaction has ended: the output's last stable offset is its high watermark.
    wait_for(lambda: end_offsets(b.bootstrap, "out", True) == end_offsets(b.bootstrap, "out", False), 30,
             what="no transaction open on the output")
    committed = read_to_end(b.bootstrap, "out", committed=True)
    everything = read_to_end(b.bootstrap, "out", committed=False)
    outputs = Counter(v.split(b"|")[0] for v in committed)
    duplicates = {v: n for v, n in outputs.items() if n > 1}
    missing = {b"v%06d" % i for i in range(RECORDS)} - set(outputs)
    assert not duplicates, f"{len(duplicates)} inputs output more than once, e.g. {list(duplicates.items())[:5]}"
    assert not missing, f"{len(missing)} inputs never output, e.g. {sorted(missing)[:5]}"
    assert len(committed) == RECORDS

    # The group's offsets are the input's ends, and each partition's committed outputs are its offsets
    # 0 .. committed-1, from that partition, with the value that was there.
    offsets = committed_offsets(b.bootstrap, "ctp", "in")
    assert offsets == ends
    by_partition: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for v in committed:
        value, part, off = v.split(b"|")
        by_partition[int(part)].append(int(off))
        assert value == b"v%06d" % (int(off) * PARTITIONS + int(part)), v  # input i is at i // 3 of i % 3
    for p in range(PARTITIONS):
        assert sorted(by_partition[p]) == list(range(offsets[p])), f"input partition {p}"

    # The aborted outputs are there for read_uncommitted: at least those of the aborts the workers chose.
    aborted = len(everything) - len(committed)
    chosen = sum(w.chosen_aborts() for w in workers)
    assert chosen > 0 and aborted >= chosen, (aborted, chosen)
    return aborted


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
@pytest.mark.parametrize("script", [ONE_WORKER, TWO_WORKERS], ids=["one-worker", "two-workers"])
def test_consume_transform_produce_is_exactly_once_through_kills(brokers, tmp_path, client, script):
    t0 = time.monotonic()
    b = brokers(1, *BROKER_FLAGS)
    workers = run_pipeline(b, tmp_path, client, script)
    aborted = check_exactly_once(b, workers)
    assert b.anomalies() == {}  # no request the broker failed to serve (a traceback, UNKNOWN_SERVER_ERROR)
    print(f"{client}: {RECORDS} records through {script} in {time.monotonic() - t0:.1f}s; {aborted} aborted "
          f"outputs; recoveries {[(w.name, dict(w.events())) for w in workers]}")
