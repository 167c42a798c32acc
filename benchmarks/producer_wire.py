"""The Produce requests of the producers benchmark: batches of idle producers (one small batch each,
epoch 0), many of them per request over one connection; active producers, one request in flight each,
timed (p50/p99/max, the longest gap between answers, stall episodes); a broker restart timed until it
answers again; and the check that no batch was appended twice."""
from __future__ import annotations

import asyncio
import datetime
import math
import threading
import time

from kio.index import load_request_schema

from broker.recordbatch import encode_batch
from quorum.client.quorum import Connection, ConnectionFailed
from records.wire import kafka
from records.wire.errors import RequestTimedOutError

from .processes import BrokerProcess
from .report import code_name, summarize_ms

PRODUCE = 0
PRODUCE_VERSION = 9
TOPIC = "producers"

# Producer IDs (any non-negative int64 will do: the broker does not check where an ID came from).
IN_PROCESS_FIRST_PID = 1_000_000_000
IDLE_FIRST_PID = 10**12
ACTIVE_FIRST_PID = 2**62
BASELINE_ACTIVE_OFFSET, LOADED_ACTIVE_OFFSET, PROBE_OFFSET = 0, 1_000, 1_000_000


def idle_batch(pid: int, seq: int = 0) -> bytes:
    """One small batch of producer ``pid``, epoch 0: what an idle producer last sent."""
    return encode_batch([(None, b"idle")], producer_id=pid, producer_epoch=0, base_sequence=seq,
                        timestamp_ms=1_700_000_000_000)


def blobs(first_pid: int, n: int, per: int, seq: int = 0):
    """(first producer ID, records blob) of ``per`` batches each, one batch per producer ID."""
    for start in range(0, n, per):
        k = min(per, n - start)
        yield first_pid + start, b"".join(idle_batch(first_pid + start + i, seq) for i in range(k))


def longest_gap(times: list[float]) -> float | None:
    """The largest gap between consecutive times (None with fewer than two)."""
    return max((b - a for a, b in zip(times, times[1:])), default=None)


def stall_episodes(gaps: list[tuple[float, float]], threshold_s: float) -> list[tuple[float, float]]:
    """The (start, end) gaps longer than ``threshold_s``, overlapping ones merged (a broker stall holds up
    every producer at once: one episode, not one per producer), by start."""
    out: list[list[float]] = []
    for a, b in sorted(g for g in gaps if g[1] - g[0] > threshold_s):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


_PRODUCE_MODULE = __import__(load_request_schema(PRODUCE, PRODUCE_VERSION).__module__, fromlist=["TopicProduceData"])


def produce_body(records: bytes, acks: int = 1):
    pd = _PRODUCE_MODULE.PartitionProduceData(index=0, records=records)
    td = _PRODUCE_MODULE.TopicProduceData(name=TOPIC, partition_data=(pd,))
    return kafka.request_entity(PRODUCE, PRODUCE_VERSION, transactional_id=None, acks=acks,
                                timeout=datetime.timedelta(seconds=30), topic_data=(td,))


async def produce(conn: Connection, records: bytes, timeout: float = 60.0) -> tuple[int, int, str | None]:
    """(error code, base offset, error message) of one partition's answer."""
    resp = await conn.call(produce_body(records), timeout)
    r = resp.responses[0].partition_responses[0]
    return int(r.error_code), int(r.base_offset), r.error_message


async def create_idle(address: str, n: int, per: int, inflight: int = 4) -> dict:
    """n idle producers (IDs IDLE_FIRST_PID..): requests of ``per`` batches, ``inflight`` at a time on one
    connection.  Returns timing, error counts and the base offset of each request's first producer."""
    conn = Connection(address, "bench-producers-idle")
    it = iter(blobs(IDLE_FIRST_PID, n, per))
    errors: dict[str, int] = {}
    offsets: dict[int, int] = {}

    async def worker():
        for first, blob in it:
            code, base, msg = await produce(conn, blob)
            if code:
                errors[code_name(code)] = errors.get(code_name(code), 0) + 1
            else:
                offsets[first] = base

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(inflight)))
    finally:
        conn.close()
    elapsed = time.perf_counter() - t0
    return {"producers": n, "requests": math.ceil(n / per), "batches_per_request": per, "seconds": elapsed,
            "producers_per_s": n / elapsed, "errors": errors, "first_offsets": offsets}


async def active_run(address: str, first_pid: int, producers: int, seconds: float, stall_s: float) -> dict:
    """``producers`` active producers, one connection and one request in flight each, for ``seconds``;
    gaps longer than ``stall_s`` are stall episodes."""
    lat: list[float] = []
    gaps: list[float] = []
    intervals: list[tuple[float, float]] = []  # between two answers to one producer
    errors: dict[str, int] = {}
    start = time.perf_counter()
    stop = start + seconds

    async def one(k: int) -> None:
        conn = Connection(address, f"bench-producers-active-{k}")
        answers: list[float] = []
        seq = 0
        try:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                try:
                    code, _, _ = await produce(conn, idle_batch(first_pid + k, seq), timeout=30.0)
                except (RequestTimedOutError, ConnectionFailed) as e:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                    continue
                t1 = time.perf_counter()
                lat.append(t1 - t0)
                answers.append(t1)
                if code:
                    errors[code_name(code)] = errors.get(code_name(code), 0) + 1
                else:
                    seq += 1
        finally:
            conn.close()
        g = longest_gap(answers)
        if g is not None:
            gaps.append(g)
        intervals.extend(zip(answers, answers[1:]))

    await asyncio.gather(*(one(k) for k in range(producers)))
    s = summarize_ms(lat, with_min=False, with_mean=False)
    episodes = stall_episodes(intervals, stall_s)
    return {**s, "producers": producers, "seconds": seconds, "requests_per_s": len(lat) / seconds,
            "longest_stall_ms": max(gaps) * 1000 if gaps else None, "errors": errors,
            "stall_episodes_over_target": len(episodes),
            "stall_episodes": [{"at_s": a - start, "ms": (b - a) * 1000} for a, b in episodes[:50]]}


async def probe_until_answered(address: str, deadline: float, gave_up=lambda: False) -> float | None:
    """Keep trying one Produce (a new producer ID) every 10 ms until answered (perf_counter time of the
    answer), the deadline passes or ``gave_up()`` (None)."""
    while time.perf_counter() < deadline and not gave_up():
        conn = Connection(address, "bench-producers-probe")
        try:
            code, _, _ = await produce(conn, idle_batch(ACTIVE_FIRST_PID + PROBE_OFFSET), timeout=30.0)
            if code == 0:
                return time.perf_counter()
        except (ConnectionFailed, RequestTimedOutError):
            pass
        finally:
            conn.close()
        await asyncio.sleep(0.01)
    return None


async def restart(broker: BrokerProcess, timeout: float) -> dict:
    """SIGTERM, then start again: the stop, the ready file, the first Produce answered (all from the start)."""
    t = time.perf_counter()
    broker.stop(timeout)
    stop_s = time.perf_counter() - t
    exit_code = broker.proc.returncode
    t0 = time.perf_counter()
    ready: dict = {}

    def start():
        try:
            broker.start(timeout)
            ready["t"] = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            ready["error"] = e

    th = threading.Thread(target=start, daemon=True)
    th.start()
    answered = await probe_until_answered(broker.bootstrap, t0 + timeout, lambda: "error" in ready)
    await asyncio.to_thread(th.join, timeout + 15)
    if "error" in ready:
        raise ready["error"]
    return {"stop_s": stop_s, "stop_exit_code": exit_code, "ready_file_s": ready["t"] - t0 if "t" in ready else None,
            "first_produce_answered_s": None if answered is None else answered - t0}


async def duplicate_check(address: str, first_offsets: dict[int, int]) -> dict:
    """A retry of the first idle producer's batch: a duplicate answered at its original offset."""
    pid, offset = min(first_offsets.items())
    conn = Connection(address, "bench-producers-dup")
    try:
        code, base, msg = await produce(conn, idle_batch(pid))
    finally:
        conn.close()
    return {"producer_id": pid, "original_offset": offset, "error": code_name(code), "base_offset": base,
            "message": msg, "state_survived": code == 0 and base == offset}
