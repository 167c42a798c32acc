"""Fuzzing running servers over loopback: garbage frames over many connections, then proof
that the server still serves and that the quorum's replicated state did not move.

Used by tests/fuzz/test_servers.py and tests/fuzz/campaign.py.

Which inputs are sent: every input the in-process decoder refuses (FrameError or
BadRequest: the garbage), raw byte streams (no framing at all), and decoded requests
that cannot change replicated state: ApiVersions, DescribeState, and on the quorum
AllocateProducerIds / BrokerHeartbeat naming no registered (broker id, epoch); on the
broker Metadata without topic creation, FindCoordinator, ListOffsets, DescribeProducers
and short Fetches.  A decoded request that legitimately changes state (a registration,
a record RPC, InitProducerId, Produce ...) is counted as "valid-skipped", not sent:
those are the servers' job, not garbage.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import struct
from collections import Counter
from typing import Any

from broker.kafkaio import ms as kafka_ms
from quorum.client import api as p
from quorum.trail import iter_blocks
from tests.fuzz import inputs as F
from records.wire import kafka

IO_TIMEOUT = 10.0

BROKER_READ_ONLY = {p.API_VERSIONS, 10, 2, 61}  # ApiVersions, FindCoordinator, ListOffsets, DescribeProducers
METADATA, FETCH = 3, 1


@dataclasses.dataclass
class Input:
    data: bytes  # what goes on the wire (size prefix included, or a raw stream)
    expect: str  # "answer" | "close" | "either" (raw streams)
    how: str


def classify(server: str, frame: bytes, registered: set[tuple[int, int]], registered_ids: set[int]) -> str:
    """'send' or 'valid-skipped' for a frame (no size prefix), from the in-process decoder."""
    outcome = F.check_request_decoder(server, frame)
    if not outcome.startswith("decoded:"):
        return "send"
    req = _parse(server, frame)
    k, b = req.api_key, req.body
    if k == p.API_VERSIONS:
        return "send"
    if server == "quorum":
        if k == p.ADMIN_API_KEY:
            return "send"
        if k in (p.ALLOCATE_PRODUCER_IDS, p.BROKER_HEARTBEAT):
            return "valid-skipped" if int(b.broker_id) in registered_ids else "send"
        return "valid-skipped"
    if k in BROKER_READ_ONLY:
        return "send"
    if k == METADATA:
        creates = b.topics and getattr(b, "allow_auto_topic_creation", True)
        return "valid-skipped" if creates else "send"
    if k == FETCH and kafka_ms(b.max_wait) <= 200:
        return "send"
    return "valid-skipped"


def _parse(server: str, frame: bytes) -> kafka.Request:
    return F.server_api(server).parse(frame)


def make_inputs(server: str, src, n: int, registered_ids: set[int]) -> tuple[list[Input], Counter]:
    """``n`` inputs to send, and counts of what was drawn (sent kinds and valid-skipped)."""
    out: list[Input] = []
    counts: Counter = Counter()
    while len(out) < n:
        if src.boolean(0.05):  # a raw stream: any bytes, maybe a plausible size first
            junk = src.binary(300)
            if src.boolean():
                junk = struct.pack(">i", len(junk)) + junk
            out.append(Input(junk, "either", "raw-stream"))
            counts["raw-stream"] += 1
            continue
        frame, how = F.fuzz_frame(server, src)
        if classify(server, frame, set(), registered_ids) == "valid-skipped":
            counts["valid-skipped"] += 1
            continue
        outcome = F.check_request_decoder(server, frame)
        expect = "close" if outcome == "frame-error" else "answer"
        out.append(Input(struct.pack(">i", len(frame)) + frame, expect, how))
        counts[outcome.split(":")[0]] += 1
    return out, counts


async def _read_frame(reader: asyncio.StreamReader, timeout: float) -> bytes | None:
    try:
        size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout))[0]
        return await asyncio.wait_for(reader.readexactly(size), timeout)
    except asyncio.IncompleteReadError:
        return None


async def blast(address: str, inputs: list[Input], connections: int = 8, timeout: float = IO_TIMEOUT) -> Counter:
    """Send ``inputs`` over ``connections`` concurrent connections, each input answered (or the
    connection closed) before the next is sent on it; a closed connection is replaced.

    Counts: "answered", "closed", and problems: "no-answer" (an input the decoder answers was
    met by a close), "answered-a-frame-error" and "stuck" (nothing within ``timeout``)."""
    host, port = address.rsplit(":", 1)
    queue: asyncio.Queue = asyncio.Queue()
    for i in inputs:
        queue.put_nowait(i)
    counts: Counter = Counter()

    async def worker() -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while not queue.empty():
            item: Input = queue.get_nowait()
            if conn is None:
                conn = await asyncio.open_connection(host, int(port))
            reader, writer = conn
            try:
                writer.write(item.data)
                if item.expect == "either":
                    writer.write_eof()
                await writer.drain()
                if item.expect == "either":
                    while await _read_frame(reader, timeout) is not None:
                        pass
                    counts["closed"] += 1
                    writer.close()
                    conn = None
                    continue
                answer = await _read_frame(reader, timeout)
            except asyncio.TimeoutError:
                counts["stuck"] += 1
                counts[f"stuck:{item.how}"] += 1
                conn[1].close()
                conn = None
                continue
            except (ConnectionError, OSError):
                answer = None
            if answer is None:
                counts["closed" if item.expect == "close" else "no-answer"] += 1
                if item.expect != "close":
                    counts[f"no-answer:{item.how}"] += 1
                conn[1].close()
                conn = None
            else:
                counts["answered" if item.expect == "answer" else "answered-a-frame-error"] += 1
        if conn is not None:
            conn[1].close()

    await asyncio.gather(*(worker() for _ in range(connections)))
    return counts


PROBLEMS = ("no-answer", "answered-a-frame-error", "stuck")


def problems(counts: Counter) -> dict[str, int]:
    return {k: v for k, v in counts.items() if k.split(":")[0] in PROBLEMS}


# ------------------------------------------------------------------ the quorum's state


def replicated_state(describe: dict) -> dict[str, Any]:
    """What must not move under garbage: the state summary (latest block, next ID, broker
    registrations and epochs, transactional ids, migration, quotas) and the Raft term.  Not a running
    broker's heartbeats: each one (every 2 s) commits a record that moves its ``last_heartbeat_ms`` and
    the commit index, garbage or not."""
    state = dict(describe["state"])
    state["brokers"] = [{k: v for k, v in b.items() if k != "last_heartbeat_ms"} for b in state.get("brokers", [])]
    return {"state": state, "term": describe["raft"]["term"]}


def audit_blocks(data_dir: str) -> list[dict]:
    """Accepted AllocateProducerIdsRecords in one node's audit trail."""
    return list(iter_blocks([os.path.join(data_dir, "audit.log")]))
