"""Consumer groups with real clients against a quorum and a broker process: confluent-kafka (librdkafka)
consumers share a topic's partitions by each assignment strategy, take over a closed, stalled or SIGKILLed
member's partitions, commit and read back offsets; an assign()-only consumer commits with no generation; the
committed offsets survive a SIGKILL of the broker.  kafka-python's consumer and both clients' admin calls:
test_consumer_groups_admin.py; requests built by hand: test_consumer_groups_bad_input.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.broker.conftest import metered_broker, start_metered
from tests.conftest import wait_for

PARTITIONS = 4
PER_PARTITION = 5
BROKER_FLAGS = ("--partitions", str(PARTITIONS), "--group-initial-rebalance-delay-ms", "0",
                "--group-min-session-timeout-ms", "500")


@pytest.fixture(scope="module")
def broker(module_quorum):
    yield from metered_broker(module_quorum, 1, *BROKER_FLAGS)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def make_topic(bootstrap: str, per_partition: int = PER_PARTITION) -> str:
    """A new topic (auto-created with PARTITIONS partitions) with ``per_partition`` records in each."""
    topic = unique("cg")
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failed: list = []
    for part in range(PARTITIONS):
        for i in range(per_partition):
            p.produce(topic, value=f"{part}-{i}".encode(), partition=part,
                      on_delivery=lambda err, msg: err and failed.append(err))
    assert p.flush(30) == 0 and not failed, failed
    return topic


def consumer(bootstrap: str, group: str, **extra) -> Consumer:
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 200}
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return Consumer(conf)


def parts(c: Consumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def settle(consumers: list[Consumer], want, timeout: float = 40.0, what: str = "the assignment",
           sink: list | None = None) -> list[set[int]]:
    """Poll every consumer in turn until ``want`` (of their assignments) holds; the assignments then.  The
    records polled meanwhile go to ``sink`` as (consumer's index, partition, offset)."""
    deadline = time.monotonic() + timeout
    while True:
        for i, c in enumerate(consumers):
            m = c.poll(0.05)
            if m is not None and not m.error() and sink is not None:
                assert m.partition() in parts(c)
                sink.append((i, m.partition(), m.offset()))
        got = [parts(c) for c in consumers]
        if want(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; assignments: {got}")


def split_evenly(got: list[set[int]]) -> bool:
    return all(len(s) == PARTITIONS // len(got) for s in got) and set().union(*got) == set(range(PARTITIONS))


def close_all(*consumers: Consumer) -> None:
    for c in consumers:
        try:
            c.close()
        except RuntimeError:
            pass  # already closed


# ------------------------------------------------------------ assignment strategies
EXPECTED = {"range": [{0, 1}, {2, 3}], "roundrobin": [{0, 2}, {1, 3}], "cooperative-sticky": None}


@pytest.mark.parametrize("strategy", list(EXPECTED))
def test_two_consumers_share_the_partitions_and_the_last_one_gets_them_all(broker, strategy):
    from confluent_kafka.admin import AdminClient
    topic, group = make_topic(broker.bootstrap), unique("g")
    a = consumer(broker.bootstrap, group, partition_assignment_strategy=strategy)
    b = consumer(broker.bootstrap, group, partition_assignment_strategy=strategy)
    try:
        a.subscribe([topic])
        b.subscribe([topic])
        polled: list[tuple[int, int, int]] = []
        got = settle([a, b], split_evenly, what=f"2 + 2 partitions ({strategy})", sink=polled)
        if EXPECTED[strategy] is not None:
            assert sorted(got, key=min) == EXPECTED[strategy]
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: its futures need it alive
        desc = admin.describe_consumer_groups([group])[group].result(20)
        assert desc.partition_assignor == strategy and len(desc.members) == 2
        assert str(desc.state).endswith("STABLE")
        # each consumer polls records of its own partitions only (checked as polled) and together every record
        # (a partition that moved in the first rebalance is read again from the start: nothing was committed)
        everything = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
        deadline = time.monotonic() + 20
        while {(p, o) for _, p, o in polled} != everything and time.monotonic() < deadline:
            settle([a, b], lambda g: True, sink=polled)
        assert {(p, o) for _, p, o in polled} == everything
        a.close()  # LeaveGroup: b is told at its next heartbeat
        got = settle([b], lambda g: g[0] == set(range(PARTITIONS)), what="the survivor to get all 4")
        assert got == [set(range(PARTITIONS))]
    finally:
        close_all(a, b)


def test_commit_and_committed(broker):
    topic, group = make_topic(broker.bootstrap), unique("g")
    c = consumer(broker.bootstrap, group)
    try:
        c.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 30
        while got < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is not None and not m.error():
                got += 1
                if m.partition() == 1 and m.offset() == 2:
                    c.commit(message=m, asynchronous=False)  # commits offset 3 of partition 1
        assert got == PARTITIONS * PER_PARTITION
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        assert [tp.offset for tp in c.committed(tps, timeout=10)] == [-1001, 3, -1001, -1001]
        c.commit(asynchronous=False)  # the positions: every partition's end
        after = c.committed(tps, timeout=10)
        assert [tp.offset for tp in after] == [PER_PARTITION] * PARTITIONS and all(tp.error is None for tp in after)
        c.commit(offsets=[TopicPartition(topic, 2, 1, metadata="checkpoint")], asynchronous=False)
        tp2 = c.committed([TopicPartition(topic, 2)], timeout=10)[0]
        assert (tp2.offset, tp2.metadata) == (1, "checkpoint")
    finally:
        c.close()
    # another member of the group starts where the commits say
    c2 = consumer(broker.bootstrap, group)
    try:
        c2.subscribe([topic])
        deadline = time.monotonic() + 30
        first = None
        while first is None and time.monotonic() < deadline:
            m = c2.poll(0.1)
            if m is not None and not m.error():
                first = (m.partition(), m.offset())
        assert first == (2, 1)  # only partition 2 has records left, from offset 1
    finally:
        c2.close()


def test_an_assign_only_consumer_with_a_group_id_commits_and_fetches(broker):
    topic, group = make_topic(broker.bootstrap), unique("g")
    c = consumer(broker.bootstrap, group)
    try:
        c.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 3, 0)])
        c.commit(offsets=[TopicPartition(topic, 0, 4), TopicPartition(topic, 3, 2)], asynchronous=False)
        got = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        assert [tp.offset for tp in got] == [4, -1001, -1001, 2]
        c.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
        assert c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 5
    finally:
        c.close()
    # the group has no members: a subscribing consumer resumes from those offsets
    c2 = consumer(broker.bootstrap, group)
    try:
        c2.subscribe([topic])
        firsts: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while len(firsts) < 3 and time.monotonic() < deadline:
            m = c2.poll(0.1)
            if m is not None and not m.error():
                firsts.setdefault(m.partition(), m.offset())
        assert firsts == {1: 0, 2: 0, 3: 2}
    finally:
        c2.close()


# ------------------------------------------------------------ members that stop
def test_a_consumer_that_stops_polling_loses_its_partitions_after_max_poll_interval(broker):
    topic, group = make_topic(broker.bootstrap), unique("g")
    slow = consumer(broker.bootstrap, group, session_timeout_ms=1000, max_poll_interval_ms=1500,
                    heartbeat_interval_ms=100)
    other = consumer(broker.bootstrap, group, session_timeout_ms=1000, max_poll_interval_ms=60_000,
                     heartbeat_interval_ms=100)
    try:
        slow.subscribe([topic])
        other.subscribe([topic])
        settle([slow, other], split_evenly)
        t0 = time.monotonic()
        got = settle([other], lambda g: g[0] == set(range(PARTITIONS)), what="the partitions of the stalled one")
        assert got == [set(range(PARTITIONS))]
        assert time.monotonic() - t0 >= 1.0  # not before the poll interval was over
    finally:
        close_all(slow, other)


CHILD = """
import sys
from confluent_kafka import Consumer
bootstrap, group, topic = sys.argv[1:4]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
              "enable.auto.commit": False, "session.timeout.ms": 1500, "heartbeat.interval.ms": 100})
def on_assign(consumer, partitions):
    print("assigned", sorted(p.partition for p in partitions), flush=True)
c.subscribe([topic], on_assign=on_assign)
while True:
    c.poll(0.1)
"""


def child_assignment(out) -> list[int] | None:
    """The partitions the child consumer printed last."""
    lines = [line for line in out.read_text().splitlines() if line.startswith("assigned [")]
    return None if not lines else [int(x) for x in lines[-1][len("assigned ["):-1].split(",") if x.strip()]


def test_a_sigkilled_consumer_is_removed_after_its_session_timeout(broker, tmp_path):
    topic, group = make_topic(broker.bootstrap), unique("g")
    out = tmp_path / "child.out"
    survivor = consumer(broker.bootstrap, group, session_timeout_ms=1500, heartbeat_interval_ms=100)
    expired_before = broker.counter("group_members_expired")
    with open(out, "w") as f:
        child = subprocess.Popen([sys.executable, "-c", CHILD, broker.bootstrap, group, topic], stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: child_assignment(out) is not None, 30, what="the child consumer to join")
        survivor.subscribe([topic])
        settle([survivor], lambda g: len(g[0]) == 2, what="the survivor's half")
        wait_for(lambda: child_assignment(out) is not None and len(child_assignment(out)) == 2, 30,
                 what="the child's 2 partitions")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        t0 = time.monotonic()
        settle([survivor], lambda g: g[0] == set(range(PARTITIONS)), what="the killed member's partitions")
        assert time.monotonic() - t0 >= 1.0  # it left no LeaveGroup: its session had to end
        wait_for(lambda: broker.counter("group_members_expired") > expired_before, 10,
                 what="the broker to count the expired member")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        survivor.close()


# ------------------------------------------------------------ durability
def test_committed_offsets_survive_a_sigkill_of_the_broker(module_quorum):
    b = start_metered(module_quorum, 2, *BROKER_FLAGS)
    try:
        topic, group = make_topic(b.bootstrap), unique("g")
        c = consumer(b.bootstrap, group)
        c.subscribe([topic])
        settle([c], lambda g: g[0] == set(range(PARTITIONS)))
        committed = [TopicPartition(topic, p, p + 1) for p in range(PARTITIONS)]
        c.commit(offsets=committed, asynchronous=False)
        c.close()
        b.proc.kill()  # SIGKILL: nothing flushed at exit
        b.proc.start()  # the same port and data directory
        c2 = consumer(b.bootstrap, group)
        try:
            got = c2.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=20)
            assert [tp.offset for tp in got] == [1, 2, 3, 4]
            c2.subscribe([topic])
            firsts: dict[int, int] = {}
            deadline = time.monotonic() + 30
            while len(firsts) < PARTITIONS and time.monotonic() < deadline:
                m = c2.poll(0.1)
                if m is not None and not m.error():
                    firsts.setdefault(m.partition(), m.offset())
            assert firsts == {p: p + 1 for p in range(PARTITIONS)}
        finally:
            c2.close()
    finally:
        b.proc.stop()


def test_a_consumer_keeps_its_generation_through_a_sigkill_of_the_broker(module_quorum):
    """The group's last generation is durable: after the restart the member's heartbeats are accepted (no
    rebalance, no expiry) and the group is Stable with the same member."""
    from confluent_kafka.admin import AdminClient
    b = start_metered(module_quorum, 3, *BROKER_FLAGS)
    try:
        topic, group = make_topic(b.bootstrap), unique("g")
        c = consumer(b.bootstrap, group, session_timeout_ms=1500, heartbeat_interval_ms=100)
        try:
            c.subscribe([topic])
            settle([c], lambda g: g[0] == set(range(PARTITIONS)))
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            before = admin.describe_consumer_groups([group])[group].result(20)
            b.proc.kill()
            b.proc.start()
            deadline = time.monotonic() + 4  # more than two session timeouts of heartbeats to the new process
            while time.monotonic() < deadline:
                c.poll(0.1)
            assert parts(c) == set(range(PARTITIONS))
            assert b.counter("group_rebalances") == 0 and b.counter("group_members_expired") == 0
            admin = AdminClient({"bootstrap.servers": b.bootstrap})  # the old one's connection backs off for long
            after = admin.describe_consumer_groups([group])[group].result(20)
            assert str(after.state).endswith("STABLE") and after.partition_assignor == before.partition_assignor
            assert [m.member_id for m in after.members] == [m.member_id for m in before.members]
        finally:
            c.close()
    finally:
        b.proc.stop()


# ------------------------------------------------------------ offsets in a transaction (KIP-98, KIP-447)
def test_offsets_sent_to_a_transaction_are_committed_by_its_commit_only(broker):
    topic, group = make_topic(broker.bootstrap), unique("g")
    c = consumer(broker.bootstrap, group, isolation_level="read_committed")
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": unique("tid")})
    try:
        c.subscribe([topic])
        settle([c], lambda g: g[0] == set(range(PARTITIONS)))
        tps = [TopicPartition(topic, q) for q in range(PARTITIONS)]
        p.init_transactions(20)
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 3)], c.consumer_group_metadata(), 20)
        p.abort_transaction(20)
        assert [tp.offset for tp in c.committed(tps, timeout=10)] == [-1001] * PARTITIONS  # dropped
        p.begin_transaction()
        p.produce(topic, value=b"out", partition=2)
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 2)],
                                      c.consumer_group_metadata(), 20)
        p.commit_transaction(20)
        assert [tp.offset for tp in c.committed(tps, timeout=10)] == [4, 2, -1001, -1001]
    finally:
        c.close()
