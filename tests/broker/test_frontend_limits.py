"""Bounds of the broker front end: connection limits, the read-ahead byte bound (back-pressure),
Fetch long polls woken only by appends to their partitions, and a bounded DescribeProducers.

Units first (no network); then one quorum with two real broker processes: ``broker`` (a 2 MiB
read-ahead bound, describe_producers_limit 5) and ``tight`` (3 connections per address, 5 in all).
Counters are read from each broker's metrics endpoint."""
from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import threading

import pytest

from broker.frontend import AppendWaiters, ReadAhead
from quorum.telemetry.logs import Throttled
from tests.broker.conftest import MeteredBroker, metered_broker
from tests.broker.test_frontend_bad_input import batch, call, entity, init_pid, produce
from tests.broker.test_pid_manager import settle
from tests.conftest import wait_for
from tests.quorum.test_bad_input import corr_of, framed, header_v1, read_frame, read_until_closed
from tests.support.kafka_requests import request_once
from records.wire import kafka
from records.wire.errors import Errors

PRODUCE, FETCH, METADATA, API_VERSIONS, DESCRIBE_PRODUCERS = 0, 1, 3, 18, 61
MiB = 1024 * 1024
BUFFER = 2 * MiB  # the read-ahead bound of ``broker``
LIMIT = 5  # its describe_producers_limit


# ------------------------------------------------------------------ units
def test_read_ahead_holds_at_most_its_bytes_and_keeps_order():
    async def go():
        pauses = []
        ra = ReadAhead(100, lambda: pauses.append(1))
        for frame in (b"a" * 60, b"b" * 40):  # exactly the bound
            await ra.room(len(frame))
            await ra.put(frame)
        assert ra.held == 100 and not pauses
        blocked = asyncio.ensure_future(ra.room(10))
        await settle()
        assert not blocked.done() and pauses == [1]  # the reader waits: nothing more is read
        assert await ra.get() == b"a" * 60
        await settle()
        assert blocked.done() and ra.held == 50  # 40 held + the 10 it may now read
        await ra.put(b"c" * 10)
        await ra.put(None)
        assert [await ra.get() for _ in range(3)] == [b"b" * 40, b"c" * 10, None]
        assert ra.held == 0
    asyncio.run(go())


def test_read_ahead_always_lets_one_frame_through():
    async def go():
        ra = ReadAhead(100)
        await ra.room(5000)  # larger than the bound, but nothing is held: it passes
        await ra.put(b"x" * 5000)
        blocked = asyncio.ensure_future(ra.room(1))
        await settle()
        assert not blocked.done() and ra.pauses == 1
        await ra.get()
        await settle()
        assert blocked.done() and ra.held == 1
    asyncio.run(go())


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


def test_throttled_log_says_how_many_lines_it_left_out(caplog):
    now = [100.0]
    say = Throttled(logging.getLogger("test.throttled"), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.throttled"):
        assert say(logging.WARNING, "refused %s", "c1")
        assert not any(say(logging.WARNING, "refused %s", f"c{i}") for i in range(2, 1002))
        now[0] += 10.0
        assert say(logging.WARNING, "refused %s", "c1002")
    assert [r.getMessage() for r in caplog.records] == [
        "refused c1", "refused c1002 (1000 more like it not logged in the last 10 s)"]


# ------------------------------------------------------------------ processes
@pytest.fixture(scope="module")
def broker(module_quorum):
    yield from metered_broker(module_quorum, 1, "--max-connection-buffer-bytes", str(BUFFER),
                              "--describe-producers-limit", str(LIMIT))


@pytest.fixture(scope="module")
def tight(module_quorum):
    yield from metered_broker(module_quorum, 2, "--max-connections", "5", "--max-connections-per-ip", "3")


@pytest.fixture(autouse=True)
def _show_logs(request):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for name in ("broker", "tight"):
            if name in request.fixturenames:
                print(f"----- {name} log -----\n{request.getfixturevalue(name).proc.tail(60)}")


def connect(b: MeteredBroker, source: str = "127.0.0.1") -> socket.socket:
    host, port = b.bootstrap.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    s.settimeout(10)
    return s


def api_versions_frame(corr: int, padding: int = 0) -> bytes:
    """ApiVersions v0, with ``padding`` bytes after the body (accepted and ignored, as Kafka does)."""
    return framed(header_v1(API_VERSIONS, 0, corr) + b"\0" * padding)


def served(s: socket.socket, corr: int = 1) -> bool:
    """The connection is answered (ApiVersions) rather than closed."""
    try:
        s.sendall(api_versions_frame(corr))
        return corr_of(read_frame(s)) == corr
    except (ConnectionError, AssertionError):
        return False


def fetch_frame(corr: int, topic: str, offset: int, max_wait_ms: int) -> bytes:
    fp = entity(FETCH, 4, "FetchPartition", partition=0, fetch_offset=offset, partition_max_bytes=MiB)
    ft = entity(FETCH, 4, "FetchTopic", topic=topic, partitions=(fp,))
    body = kafka.request_entity(FETCH, 4, replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                                min_bytes=1, max_bytes=MiB, isolation_level=0, topics=(ft,))
    return kafka.encode_request(body, corr, "limits-test")


def create_topic(b: MeteredBroker, topic: str) -> None:
    md = call(b, METADATA, 4, topics=(entity(METADATA, 4, "MetadataRequestTopic", name=topic),),
              allow_auto_topic_creation=True)
    assert int(md.topics[0].error_code) == 0


# ------------------------------------------------------------------ connection limits
def test_connections_over_the_limits_are_closed_and_the_rest_are_served(tight):
    refused0 = tight.counter("connections_refused")
    kept = [connect(tight) for _ in range(3)]
    try:
        assert all(served(s) for s in kept)
        over = connect(tight)  # a 4th from 127.0.0.1: max_connections_per_ip
        assert read_until_closed(over) == b""
        over.close()
        others = [connect(tight, "127.0.0.2") for _ in range(2)]  # another address: up to max_connections
        kept += others
        assert all(served(s) for s in others)
        over = connect(tight, "127.0.0.3")  # a 6th in all: max_connections
        assert read_until_closed(over) == b""
        over.close()
        assert tight.counter("connections_refused") == refused0 + 2
        assert all(served(s, 2) for s in kept)  # the admitted ones go on being served
        kept.pop(0).close()  # a slot frees up when a connection ends
        wait_for(lambda: tight.counter("connections") == 4, 10, what="the closed connection to be released")
        again = connect(tight)
        kept.append(again)
        assert served(again)
    finally:
        for s in kept:
            s.close()
    tight.idle()


def test_a_connection_flood_is_refused_with_few_log_lines(tight):
    refused0 = tight.counter("connections_refused")
    lines0 = tight.proc.tail(100_000).count("refused,")
    kept = [connect(tight) for _ in range(3)]
    flood = []
    try:
        for _ in range(150):
            flood.append(connect(tight))
        wait_for(lambda: tight.counter("connections_refused") >= refused0 + 150, 30, what="150 refusals")
        for s in flood:
            assert read_until_closed(s) == b""
        assert all(served(s) for s in kept)
    finally:
        for s in kept + flood:
            s.close()
    lines = tight.proc.tail(100_000).count("refused,") - lines0
    assert lines <= 3, lines  # one line per 10 s at most, saying how many it left out
    tight.idle()
    code, pid, _ = init_pid(tight.proc)
    assert code == Errors.NONE and pid >= 0


# ------------------------------------------------------------------ read-ahead and order
def test_pipelined_produce_requests_are_answered_in_order(broker):
    _, pid, epoch = init_pid(broker.proc)
    s = connect(broker)
    try:
        frames = b""
        for i in range(5):
            pd = entity(PRODUCE, 9, "PartitionProduceData", index=0, records=batch(pid, epoch, seq=i))
            td = entity(PRODUCE, 9, "TopicProduceData", name="pipelined", partition_data=(pd,))
            body = kafka.request_entity(PRODUCE, 9, transactional_id=None, acks=-1,
                                        timeout=datetime.timedelta(seconds=5), topic_data=(td,))
            frames += kafka.encode_request(body, 100 + i, "limits-test")
        s.sendall(frames)  # all five in flight before the first answer is read
        answers = [kafka.parse_response(read_frame(s), PRODUCE, 9) for _ in range(5)]
    finally:
        s.close()
    assert [corr for corr, _ in answers] == [100, 101, 102, 103, 104]
    parts = [body.responses[0].partition_responses[0] for _, body in answers]
    assert [int(p.error_code) for p in parts] == [0] * 5
    assert [int(p.base_offset) for p in parts] == sorted(int(p.base_offset) for p in parts)
    broker.idle()


def test_a_client_that_does_not_read_is_not_read_either(broker):
    """A long poll keeps the connection's handler busy while the client sends 100 frames of 1 MiB:
    the broker holds at most BUFFER of them and stops reading the socket; once the Fetch is answered
    it reads on, and every request is answered, in order."""
    create_topic(broker, "held")
    waits0, pauses0 = broker.counter("fetch_waits"), broker.counter("read_pauses")
    s = connect(broker)
    sender = None
    try:
        s.sendall(fetch_frame(1, "held", 0, 30_000))
        wait_for(lambda: broker.counter("fetch_waits") > waits0, 10, what="the Fetch to wait")
        rss0 = broker.rss()
        n, size = 100, MiB
        sent = [0]
        out = s.dup()  # its own timeout; the same connection
        out.settimeout(60)

        def send_all():
            try:
                for i in range(n):
                    data = api_versions_frame(2 + i, size)
                    out.sendall(data)
                    sent[0] += len(data)
            finally:
                out.close()
        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        wait_for(lambda: broker.counter("read_pauses") > pauses0, 30, what="the broker to stop reading")
        held = broker.counter("read_ahead_bytes")
        grown = broker.rss() - rss0
        print(f"broker paused: {held / MiB:.2f} MiB read ahead, RSS +{grown / MiB:.1f} MiB, "
              f"client sent {sent[0] / MiB:.1f} of {n * size / MiB:.0f} MiB so far")
        assert 0 < held <= BUFFER
        assert grown < 32 * MiB  # unbounded, the queue alone held 64 frames: 64 MiB
        assert sender.is_alive()  # the client's sends are stalled: TCP flow control
        assert produce(broker.proc, batch(), topic="held")[0] == Errors.NONE  # answers the Fetch
        corr, body = kafka.parse_response(read_frame(s, timeout=30), FETCH, 4)
        assert corr == 1 and int(body.responses[0].partitions[0].error_code) == 0
        assert body.responses[0].partitions[0].records
        corrs = [corr_of(read_frame(s, timeout=30)) for _ in range(n)]
        assert corrs == list(range(2, 2 + n))
        sender.join(30)
        assert not sender.is_alive() and sent[0] > n * size
    finally:
        s.close()
        if sender is not None:
            sender.join(30)
    broker.idle()


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
    broker.idle()


# ------------------------------------------------------------------ DescribeProducers
def describe_producers(b, topics: dict[str, list[int]]):
    body = kafka.request_entity(DESCRIBE_PRODUCERS, 0, topics=tuple(
        entity(DESCRIBE_PRODUCERS, 0, "TopicRequest", name=name, partition_indexes=tuple(parts))
        for name, parts in topics.items()))
    resp = request_once(b.bootstrap, "limits-test", body)
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
    broker.idle()
