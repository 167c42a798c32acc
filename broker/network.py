"""The broker's side of a connection (``quorum.network.KafkaListener`` accepts it): requests handled one
at a time, in order, as Kafka does (it mutes a connection while a request is processed), with frames
read ahead up to ``max_connection_buffer_bytes`` (``ReadAhead``); and the long-polling Fetches waiting
for an append to the partitions they read (``AppendWaiters``).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Callable, Protocol

from quorum.security import acl as acls
from quorum.network import Accepted
from quorum.security.limits import read_gated_frame
from quorum.security.sasl import linger_close
from quorum.telemetry.logs import end_request_context, request_context
from records.wire import kafka

# The front end logs under one name, whichever of its modules writes the line (log settings name it).
log = logging.getLogger("broker.frontend")


class Listening(Protocol):
    """What the connection layer uses of the broker (``broker.frontend.BrokerServer``)."""

    cfg: Any
    counters: dict[str, int]
    unauthenticated_frame_bytes: int
    _connections: dict[asyncio.Task, "ReadAhead"]
    _muted_until: dict[Any, float]  # peer -> monotonic time its next request may be handled
    _peer_log: Any

    def parse(self, frame: bytes, peer: Any) -> kafka.Request | bytes: ...

    def _count_read_pause(self) -> None: ...

    async def _answer_request(self, req: kafka.Request, peer: Any) -> bytes | None: ...


class _DropConnection(Exception):
    """Fault injection: close the connection instead of answering."""


class ReadAhead:
    """Frames read from one connection and not yet taken by its handler, bounded by bytes.

    The reader calls ``room(size)`` once a frame's size is known, before its body is read: it
    waits while the bytes held plus this frame would pass ``max_bytes``, unless nothing is held,
    so one frame of any size the listener accepts (``max_frame_bytes``) always gets through and
    what one connection holds unread is at most ``max(max_bytes, one frame)``.  While it waits
    nothing is read from the socket: the client's sends stall on TCP flow control.  Kafka holds
    one request per connection (it mutes the channel until the answer is sent); this reads a
    few ahead so pipelined requests do not wait a round trip, in order (FIFO).  ``None`` is the
    end of the stream."""

    def __init__(self, max_bytes: int, on_pause: Callable[[], None] | None = None):
        self.max_bytes = max_bytes
        self.held = 0  # bytes of frames read or being read, not yet taken
        self.pauses = 0  # times the reader waited for room
        self._on_pause = on_pause
        self._frames: deque[bytes | None] = deque()
        self._changed = asyncio.Condition()

    def _fits(self, size: int) -> bool:
        return self.held == 0 or self.held + size <= self.max_bytes

    async def room(self, size: int) -> None:
        async with self._changed:
            if not self._fits(size):
                self.pauses += 1
                if self._on_pause is not None:
                    self._on_pause()
                await self._changed.wait_for(lambda: self._fits(size))
            self.held += size

    async def put(self, frame: bytes | None) -> None:
        """A frame whose room was taken (or None: the end)."""
        async with self._changed:
            self._frames.append(frame)
            self._changed.notify_all()

    async def get(self) -> bytes | None:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._frames))
            frame = self._frames.popleft()
            if frame is not None:
                self.held -= len(frame)
                self._changed.notify_all()
            return frame


class AppendWaiters:
    """Long-polling Fetches waiting for an append, by the partitions they read.

    A Fetch ``watch``es the (topic, partition) keys of its request and gets a future; an
    append to a partition resolves the futures of that partition only (``appended``), so a
    produce wakes the Fetches that read what it appended and no other.  The Fetch ``forget``s
    its future when it stops waiting.  Event-loop only."""

    def __init__(self) -> None:
        self._by_partition: dict[tuple[str, int], set[asyncio.Future]] = {}

    def watch(self, keys: frozenset[tuple[str, int]]) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        for key in keys:
            self._by_partition.setdefault(key, set()).add(fut)
        return fut

    def forget(self, fut: asyncio.Future, keys: frozenset[tuple[str, int]]) -> None:
        for key in keys:
            waiting = self._by_partition.get(key)
            if waiting is not None:
                waiting.discard(fut)
                if not waiting:
                    del self._by_partition[key]

    def appended(self, key: tuple[str, int]) -> int:
        """Wake the Fetches waiting on ``key``; how many were woken."""
        woken = 0
        for fut in self._by_partition.pop(key, ()):
            if not fut.done():
                fut.set_result(key)
                woken += 1
        return woken

    def __len__(self) -> int:
        """Partitions with a Fetch waiting on them."""
        return len(self._by_partition)


# ------------------------------------------------------------ connections
async def serve_connection(server: Listening, conn: Accepted) -> None:
    """The broker's side of a connection ``quorum.network.KafkaListener`` accepted: frames read ahead,
    handled one at a time in order, the SASL exchange first when SASL is on."""
    reader, writer, peer, session, gate = conn.reader, conn.writer, conn.peer, conn.session, conn.gate
    task = asyncio.current_task()
    assert task is not None
    frames = ReadAhead(server.cfg.max_connection_buffer_bytes, server._count_read_pause)
    server._connections[task] = frames
    handled = asyncio.Event()  # before authentication: the handler is done with the frame it was given
    read_task = asyncio.get_running_loop().create_task(
        read_frames(server, reader, frames, peer, session, lambda: gate.expired, handled))
    try:
        while True:
            handled.set()
            item = await frames.get()
            if item is None:
                break
            if session is not None:
                verdict = await session.on_frame(item)
                if verdict.kind == "reply":
                    writer.write(verdict.data)
                    await writer.drain()
                if verdict.kind == "close" or verdict.close:
                    log.warning("client %s: %s; closing", peer, verdict.reason)
                    read_task.cancel()
                    await asyncio.wait([read_task])  # one reader at a time
                    await linger_close(reader, writer)
                    break
                if verdict.kind == "reply":
                    continue
            data = await answer_frame(server, item, peer, conn.principal)
            if data is not None:
                writer.write(data)
                await writer.drain()
    except kafka.FrameError:
        pass  # counted and logged by KafkaListener.parse
    except _DropConnection:
        server.counters["dropped_by_fault_injection"] += 1
        log.info("client %s: fault injection: dropping the connection before answering", peer)
    finally:
        read_task.cancel()
        server._muted_until.pop(peer, None)
        server._connections.pop(task, None)


async def read_frames(server: Listening, reader: asyncio.StreamReader, frames: ReadAhead, peer: Any,
                      session: Any, expired: Callable[[], bool], handled: asyncio.Event) -> None:
    """Read ``reader``'s frames into ``frames`` until the stream ends or a bad frame closes it.  Before
    SASL authentication a frame may be at most ``unauthenticated_frame_bytes`` and the next one is not
    read until the handler is done with it (as Kafka's authenticator); ``expired``: whether the
    authentication deadline closed the connection (what it was reading then is not a bad frame)."""
    try:
        while True:
            authenticated = session is None or session.authenticated
            frame = await read_gated_frame(reader, authenticated, server.cfg.max_frame_bytes,
                                           server.unauthenticated_frame_bytes, frames.room, expired, server.counters,
                                           log, server._peer_log, peer)
            if frame is None:
                return
            if not authenticated:
                handled.clear()
            await frames.put(frame)
            if not authenticated:
                await handled.wait()
    except (ConnectionError, OSError) as e:
        if not expired():
            log.info("client %s: %s", peer, e)
    finally:
        await frames.put(None)


async def answer_frame(server: Listening, frame: bytes, peer: Any, principal: str | None = None) -> bytes | None:
    muted_until = server._muted_until.pop(peer, None)
    if muted_until is not None and muted_until > time.monotonic():
        # The last response told the client to back off; as Kafka does (KIP-219), the
        # connection's next request waits too, so a client that ignores it gains nothing.
        await asyncio.sleep(muted_until - time.monotonic())
    req = server.parse(frame, peer)  # raises kafka.FrameError: the connection closes
    if isinstance(req, bytes):  # the error answer to a bad body
        return req
    server.counters["requests"] += 1
    if principal is not None:
        req.principal = principal
    req.host = acls.peer_host(peer)
    token = request_context(req.client_id, req.correlation_id)
    try:
        return await server._answer_request(req, peer)
    finally:
        end_request_context(token)
