"""Bounds of the broker front end: Fetch long polls woken only by appends to their partitions, and a
bounded DescribeProducers.  Units first (no network); then a real broker process (one quorum for the
module).  Counters are read from the broker's metrics endpoint."""
from __future__ import annotations

import asyncio
import datetime
import socket

import pytest

from benchmarks.processes import BrokerProcess
from broker.frontend import AppendWaiters
from client.quorum import Connection
from quorum.localcluster import LocalCluster, free_ports
from telemetry.metrics import read_metrics
from tests.broker.test_frontend_bad_input import batch, call, entity, init_pid, produce
from tests.conftest import wait_for
from tests.quorum.test_bad_input import read_frame
from wire import kafka
from wire.errors import Errors

FETCH, METADATA, DESCRIBE_PRODUCERS = 1, 3, 61
MiB = 1024 * 1024
LIMIT = 5  # the describe_producers_limit of ``broker``


# ------------------------------------------------------------------ units
def test_append_waiters_wake_only_the_partitions_appended_to():
    async def go():
        w = AppendWaiters()
        a_keys, ab_keys = frozenset({("a", 0)}), frozenset({("a", 1), ("b", 0)})
        on_a, on_ab = w.watch(a_keys), w.watch(ab_keys)
        assert len(w) == 3
        assert w.appended(("c", 0)) == 0 and w.appended(("a", 1)) == 1
        assert on_ab.done() and not on_a.done()
        w.forget(on_ab, ab_keys)
        assert w.appended(("b", 0)) == 0 and len(w) == 1
        assert w.appended(("a", 0)) == 1 and on_a.done()
        w.forget(on_a, a_keys)
        assert len(w) == 0
    asyncio.run(go())


# ------------------------------------------------------------------ processes
class Broker:
    def __init__(self, proc: BrokerProcess, metrics_port: int):
        self.proc, self.metrics = proc, f"127.0.0.1:{metrics_port}"

    @property
    def bootstrap(self) -> str:
        return self.proc.bootstrap

    def counter(self, name: str) -> float:
        m = read_metrics(self.metrics)
        return m.get(f"pidquorum_broker_{name}_total", m.get(f"pidquorum_broker_{name}", 0))


@pytest.fixture(scope="module")
def quorum(tmp_path_factory):
    base = tmp_path_factory.mktemp("frontend-limits")
    lc = LocalCluster(str(base / "cluster"))
    lc.up(3)
    try:
        yield base, lc
    finally:
        lc.down(timeout=5)


def _start(quorum, broker_id: int, *flags: str):
    base, lc = quorum
    port = free_ports(1)[0]
    proc = BrokerProcess(str(base), broker_id, lc.client_addresses(), "--metrics-port", str(port), *flags)
    proc.start()
    return Broker(proc, port)


@pytest.fixture(scope="module")
def broker(quorum):
    b = _start(quorum, 1, "--describe-producers-limit", str(LIMIT))
    yield b
    b.proc.stop()


@pytest.fixture(autouse=True)
def _show_logs(request):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "broker" in request.fixturenames:
        print(f"----- broker log -----\n{request.getfixturevalue('broker').proc.tail(60)}")


def connect(b: Broker, source: str = "127.0.0.1") -> socket.socket:
    host, port = b.bootstrap.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    s.settimeout(10)
    return s


def fetch_frame(corr: int, topic: str, offset: int, max_wait_ms: int) -> bytes:
    fp = entity(FETCH, 4, "FetchPartition", partition=0, fetch_offset=offset, partition_max_bytes=MiB)
    ft = entity(FETCH, 4, "FetchTopic", topic=topic, partitions=(fp,))
    body = kafka.request_entity(FETCH, 4, replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                                min_bytes=1, max_bytes=MiB, isolation_level=0, topics=(ft,))
    return kafka.encode_request(body, corr, "limits-test")


def create_topic(b: Broker, topic: str) -> None:
    md = call(b, METADATA, 4, topics=(entity(METADATA, 4, "MetadataRequestTopic", name=topic),),
              allow_auto_topic_creation=True)
    assert int(md.topics[0].error_code) == 0




# ------------------------------------------------------------------ Fetch wake-ups
def test_a_long_poll_is_woken_by_its_topic_only(broker):
    for topic in ("poll-a", "poll-b"):
        create_topic(broker, topic)
    waits0, wakeups0 = broker.counter("fetch_waits"), broker.counter("fetch_wakeups")
    s = connect(broker)
    try:
        s.sendall(fetch_frame(7, "poll-a", 0, 30_000))
        wait_for(lambda: broker.counter("fetch_waits") == waits0 + 1, 10, what="the Fetch to wait")
        for _ in range(20):
            assert produce(broker.proc, batch(), topic="poll-b")[0] == Errors.NONE
        assert produce(broker.proc, batch(), topic="poll-a", partition=0)[0] == Errors.NONE
        corr, body = kafka.parse_response(read_frame(s, timeout=30), FETCH, 4)
    finally:
        s.close()
    assert corr == 7 and body.responses[0].partitions[0].records
    # 20 appends to poll-b woke nothing (each would have been a wake-up and a new wait); poll-a's did
    assert broker.counter("fetch_wakeups") == wakeups0 + 1
    assert broker.counter("fetch_waits") == waits0 + 1


# ------------------------------------------------------------------ DescribeProducers
def describe_producers(b, topics: dict[str, list[int]]):
    body = kafka.request_entity(DESCRIBE_PRODUCERS, 0, topics=tuple(
        entity(DESCRIBE_PRODUCERS, 0, "TopicRequest", name=name, partition_indexes=tuple(parts))
        for name, parts in topics.items()))

    async def go():
        conn = Connection(b.bootstrap, "limits-test")
        try:
            return await conn.call(body, 10.0)
        finally:
            conn.close()
    resp = asyncio.run(go())
    return {(t.name, int(p.partition_index)): p for t in resp.topics for p in t.partitions}


def test_describe_producers_is_cut_at_the_limit_and_says_so(broker):
    truncated0 = broker.counter("describe_producers_truncated")
    pids = []
    for _ in range(LIMIT + 3):
        _, pid, epoch = init_pid(broker.proc)
        pids.append(pid)
        assert produce(broker.proc, batch(pid, epoch, seq=0, n=2), topic="described")[0] == Errors.NONE
    _, pid, epoch = init_pid(broker.proc)
    assert produce(broker.proc, batch(pid, epoch, seq=0), topic="described-few")[0] == Errors.NONE
    got = describe_producers(broker.proc, {"described": [0], "described-few": [0], "described-none": [0]})
    cut = got[("described", 0)]
    assert int(cut.error_code) == 0
    assert cut.error_message == f"{LIMIT} of {LIMIT + 3} producers shown, the lowest producer ids; " \
                                "describe_producers_limit"
    assert [int(p.producer_id) for p in cut.active_producers] == sorted(pids)[:LIMIT]
    assert {(int(p.producer_epoch), int(p.last_sequence)) for p in cut.active_producers} == {(0, 1)}
    few = got[("described-few", 0)]
    assert int(few.error_code) == 0 and few.error_message is None
    assert [int(p.producer_id) for p in few.active_producers] == [pid]
    assert int(got[("described-none", 0)].error_code) == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert broker.counter("describe_producers_truncated") == truncated0 + 1

