"""The quorum's client port: each request's RPC (``quorum.rpcs``) run here, proposed on the leader, or
forwarded once to the leader in an Envelope (KIP-590) and its answer relayed as it is.

A connection's requests are handled concurrently and answered in request order (``InOrder``); a
proposed request is answered from the tick that applied its entry (``EarlyAnswer``).  Accepting,
TLS, the SASL gate and what a peer may cost before it authenticates are ``quorum.network``'s; the
limits are in docs/deployment.md.  With no leader, or past the deadline, the answer is NOT_CONTROLLER
or REQUEST_TIMED_OUT, both retriable.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from quorum.client import api
from quorum.client.quorum import Connection, ConnectionFailed
from quorum.client.retry import FORWARD_POLICY
from quorum.security import acl as acls
from quorum.security.client import ClientSecurity
from quorum.security.credentials import NODE_USER, node_credential, node_password
from quorum.security.limits import ByteBudget, read_gated_frame
from quorum.security.sasl import SaslAuthenticator, api_versions_table, linger_close
from quorum.security.tls import server_context
from quorum.telemetry.logs import request_context
from records.wire import kafka
from records.wire.errors import (
    ClusterAuthorizationFailedError,
    Errors,
    InvalidRequestError,
    NotControllerError,
    PidQuorumError,
    RequestTimedOutError,
    UnsupportedVersionError,
    for_code,
)

from .network import Accepted, KafkaListener
from .rpcs import RPCS, SERVER_API, Rpc, envelope_peer, forward_envelope
from .proposer import Proposer
from .service import Service
from .stats import REQUEST_BUCKETS, Histogram

log = logging.getLogger(__name__)
FORWARD_CLIENT_ID = "pidquorum-forward"  # the client id of the connection a node forwards on


class _Refused(Exception):
    """The SASL gate closed the connection (its reason logged): answers written, then a lingering close."""


@dataclass(frozen=True)
class Relayed:
    """The leader's answer frame to a request this node forwarded, relayed as it is."""
    frame: bytes

    def ok(self, req: kafka.Request) -> bool:
        """Whether the answer carries no error (read only for the latency of answered requests)."""
        try:
            body = SERVER_API.parse_response(self.frame[4:], req.api_key, req.api_version)[1]
            return int(body["error_code"] if isinstance(body, dict) else body.error_code) == 0
        except Exception:  # noqa: BLE001 - an unreadable answer is relayed as it is, just not timed
            return False


class InOrder:
    """A connection's answers, written in the order of its requests as soon as each can be.

    Requests are handled concurrently (``put_task``); an answer is written by whoever completes the
    head of the line: the request's own task when it finishes first in line (no further task wakes up
    to write it, a pass of the event loop saved on every request), else the task ahead of it.  An
    answer known before its task ends is put in its place at once (``fill``: the leader's tick that
    applied the request's entry, ``QuorumServer._answer``); what the task returns then is dropped.
    """

    def __init__(self, writer: asyncio.StreamWriter):
        self._writer = writer
        self._line: collections.deque[list] = collections.deque()  # [answer bytes or None while pending]
        self._tasks: set[asyncio.Task] = set()

    def put(self, data: bytes) -> None:
        self._line.append([data])
        self._flush()

    def slot(self) -> list:
        """The next answer's place in line, empty until ``fill`` or its task fills it."""
        slot: list = [None]
        self._line.append(slot)
        return slot

    def fill(self, slot: list, data: bytes) -> None:
        """``slot``'s answer, written now if every answer before it was; a slot is filled once."""
        if slot[0] is None:
            slot[0] = data
            self._flush()

    def put_task(self, answer: Awaitable[bytes], slot: list | None = None) -> None:
        """The answer ``answer`` returns, in ``slot`` (``slot()``; a new place in line if none)."""
        if slot is None:
            slot = self.slot()
        task = asyncio.get_running_loop().create_task(self._fill(slot, answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _fill(self, slot: list, answer: Awaitable[bytes]) -> None:
        try:
            data = await answer
        except Exception:  # noqa: BLE001 - a handler bug (they answer every error): no frame to put in its place
            log.exception("a request handler failed without an answer; closing the connection")
            self._writer.close()
            return
        self.fill(slot, data)

    def _flush(self) -> None:
        line = self._line
        while line and line[0][0] is not None:
            data = line.popleft()[0]
            if not self._writer.is_closing():
                self._writer.write(data)

    async def room(self) -> None:
        """Wait while the answers not yet taken by the client are over the transport's limit."""
        await self._writer.drain()

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def finish(self) -> None:
        """Every request read so far answered (those that can be), then what is left written out."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._writer.drain()


class EarlyAnswer:
    """How a proposed request is answered from the tick that applied its entry (``Proposer.enqueue``):
    ``prepare(value)`` encodes the answer while the entry is on its way to the followers (the leader waits
    for them then), and the call, at apply, writes it.  A value other than the prepared one is encoded
    then."""

    __slots__ = ("answer", "prepare")

    def __init__(self, answer: Callable[[Any], None], prepare: Callable[[Any], None]):
        self.answer, self.prepare = answer, prepare

    def __call__(self, value: Any) -> None:
        self.answer(value)


class QuorumServer(KafkaListener):
    def __init__(self, service: Service):
        self.service = service
        self.cfg = service.cfg
        self.proposer = Proposer(service)
        self.producer_ids = self.proposer.producer_ids
        self._forward_conns: dict[str, Connection] = {}
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task] = []
        self.counters = {"requests": 0, "forwarded": 0, "bad_frames": 0, "bad_requests": 0,
                         "unsupported_versions": 0, "connections_refused": 0, "connections_refused_per_ip": 0,
                         "authentication_timeouts": 0, "tls_handshake_failures": 0, "read_pauses": 0}
        self.api = SERVER_API
        self.listen(log)
        # Per RPC, the latency of the requests this node answered OK (AllocateProducerIds': the allocation
        # latency metric)
        self.latency: collections.defaultdict[str, Histogram] = collections.defaultdict(
            lambda: Histogram(REQUEST_BUCKETS))
        self._setup_security()

    def _setup_security(self) -> None:
        """SASL (and with it ACLs) and TLS on the client port, from the config; off: exactly as before."""

        cfg = self.cfg
        self.sasl = None
        self.super_users: frozenset[str] = frozenset()
        if cfg.sasl_credentials_file:
            self.sasl = SaslAuthenticator(cfg.sasl_credentials_file, tuple(cfg.sasl_mechanisms),
                                          internal_users={NODE_USER: node_credential(cfg.secret)},
                                          counters=self.counters)
            self.super_users = frozenset(cfg.super_users) | {f"User:{NODE_USER}"}
        self.ssl = (server_context(cfg.tls_certfile, cfg.tls_keyfile, cfg.tls_cafile, cfg.tls_client_auth)
                    if cfg.tls_certfile else None)
        self.api_table = api_versions_table(api.SUPPORTED, self.sasl)
        self.unauthenticated_frame_bytes = min(cfg.max_unauthenticated_frame_bytes, cfg.max_frame_bytes)
        protocol = ("SASL_" if self.sasl else "") + ("SSL" if self.ssl else "PLAINTEXT")
        self.forward_security = None if protocol == "PLAINTEXT" else ClientSecurity(
            protocol=protocol, mechanism="PLAIN" if "PLAIN" in cfg.sasl_mechanisms else cfg.sasl_mechanisms[0],
            username=NODE_USER, password=node_password(cfg.secret), cafile=cfg.tls_cafile,
            certfile=cfg.tls_certfile, keyfile=cfg.tls_keyfile)

    def status(self) -> dict[str, Any]:
        """Everything DescribeState answers; the metrics endpoint reads the same dict."""
        return {**self.service.describe(),
                "server": {**self.counters, "throttled": self.producer_ids.rate_limit.throttled,
                           "connections": self.limits.open},
                "proposer": {"batches": self.proposer.batches, "records": self.proposer.proposed_records,
                             "reserve_served": self.producer_ids.reserve.served},
                "allocate_latency": self.latency[RPCS.of(api.ALLOCATE_PRODUCER_IDS, None).name].snapshot()}

    async def start(self) -> None:
        host, port = (self.cfg.client_bind or self.cfg.client_address).rsplit(":", 1)
        # TLS is started in _connection (start_tls), so the connection limits and the authentication
        # deadline count from the accept, not from the end of a handshake a peer can drag out.
        self._server = await asyncio.start_server(self.accept, host, int(port))
        self._tasks.append(asyncio.get_running_loop().create_task(self.proposer.run()))
        log.info("client port listening on %s:%s", host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._trim.cancel()
        for t in self._tasks:
            t.cancel()
        for c in self._forward_conns.values():
            c.close()
        if self.service.zookeeper is not None:
            self.service.zookeeper.reset()

    # ------------------------------------------------------------ connections
    async def serve(self, conn: Accepted) -> None:
        responses = InOrder(conn.writer)
        refused = cancelled = False
        try:
            await self._serve(conn.reader, responses, conn.session, conn.peer, lambda: conn.gate.expired)
        except _Refused:
            refused = True
        except asyncio.CancelledError:
            cancelled = True
            responses.cancel()  # the node is shutting down
            raise
        finally:
            if not cancelled and not conn.gate.expired:
                try:
                    await responses.finish()
                    if refused:
                        await linger_close(conn.reader, conn.writer)
                except (ConnectionError, OSError, asyncio.CancelledError):
                    pass

    async def _serve(self, reader: asyncio.StreamReader, responses: InOrder, session: Any, peer: Any,
                     expired: Callable[[], bool]) -> None:
        """Read, handle and answer ``reader``'s frames until the stream ends or a bad frame closes it;
        raises ``_Refused`` when the SASL gate closes the connection.  ``expired``: whether the
        authentication deadline closed it (what it was reading then is not a bad frame)."""
        budget = ByteBudget(self.cfg.max_connection_buffer_bytes, self._count_read_pause)
        while True:
            frame = await read_gated_frame(reader, session is None or session.authenticated, self.cfg.max_frame_bytes,
                                           self.unauthenticated_frame_bytes, budget.room, expired, self.counters, log,
                                           self._peer_log, peer)
            if frame is None:
                return
            size = len(frame)
            held = True  # the frame's bytes in the budget until it is answered
            try:
                if session is not None:
                    verdict = await session.on_frame(frame)
                    if verdict.kind == "reply":
                        responses.put(verdict.data)
                    if verdict.kind == "close" or verdict.close:
                        log.warning("client %s: %s; closing", peer, verdict.reason)
                        raise _Refused
                    if verdict.kind == "reply":
                        continue
                try:
                    req = self.parse(frame, peer)
                except kafka.FrameError:
                    return
                if isinstance(req, bytes):  # the error answer to a bad body
                    responses.put(req)
                    continue
                del frame  # the request holds what it needs; the budget counts the frame until the answer
                if session is not None:
                    req.principal = session.principal
                self.counters["requests"] += 1
                slot = responses.slot()
                responses.put_task(self._dispatch(req, peer, functools.partial(responses.fill, slot), budget, size),
                                   slot)
                held = False
            finally:
                if held:
                    budget.release(size)
            await responses.room()  # a client that does not read its answers is not read either

    def _count_read_pause(self) -> None:
        self.counters["read_pauses"] += 1

    async def _dispatch(self, req: kafka.Request, peer: Any, early: Callable[[bytes], None], budget: ByteBudget,
                        size: int) -> bytes:
        request_context(req.client_id, req.correlation_id)  # this task's log lines carry it
        try:
            return await self._answer(req, peer, early=early)
        finally:
            budget.release(size)

    async def _answer(self, req: kafka.Request, peer: Any, relay_not_controller: bool = True,
                      early: Callable[[bytes], None] | None = None) -> bytes:
        """The whole answer frame to ``req``: its RPC's response, an error answer, or the answer the
        leader gave to the frame this node forwarded.  ``relay_not_controller=False`` (a forwarded
        request): NOT_CONTROLLER is raised instead, for the forwarding node to try the new leader.

        ``early``: where the answer may be put before this returns.  A request the leader proposes is
        answered from the tick that applied its entry (``Proposal.on_value``), as soon as its value is
        known: this task then resumes, a pass of the event loop later, only to end.  Errors, and values
        an RPC's ``after`` step still changes, are answered as before, when the task ends."""
        rpc = RPCS.of(req.api_key, req.body)
        t0 = time.monotonic()
        answered: list[bytes] = []
        prepared: list = []  # (value, its frame), encoded while the entry was on its way (EarlyAnswer.prepare)

        def encode(value: Any) -> bytes:
            return SERVER_API.encode(req.api_key, req.api_version, req.correlation_id,
                                     rpc.respond(req.api_version, value))

        def frame(value: Any) -> bytes:
            data = prepared[1] if prepared and prepared[0] is value else encode(value)
            self.latency[rpc.name].observe(time.monotonic() - t0)
            return data

        def prepare(value: Any) -> None:
            try:
                prepared[:] = (value, encode(value))
            except Exception:  # noqa: BLE001 - not prepared: frame() meets the same error, where it is handled
                prepared.clear()

        def answer_now(value: Any) -> None:  # in the tick: never raises
            try:
                data = frame(value)
            except Exception:  # noqa: BLE001 - left to the task: it meets the same error below, logs and answers it
                return
            answered.append(data)
            try:
                early(data)
            except Exception:  # noqa: BLE001 - the connection's own end handles a broken transport
                log.exception("client %s: writing the answer to %s failed", peer, rpc.name)

        try:
            if self.sasl is not None:
                self._authorize(rpc, req, peer)
            result = await self._run(rpc, req, peer, EarlyAnswer(answer_now, prepare) if early is not None else None)
            if answered:
                return answered[0]
            if isinstance(result, Relayed):
                if result.ok(req):
                    self.latency[rpc.name].observe(time.monotonic() - t0)
                return result.frame
            return frame(result)
        except PidQuorumError as e:
            if e.code == Errors.NOT_CONTROLLER and not relay_not_controller:
                raise
            if e.code not in (Errors.NOT_CONTROLLER,):
                log.info("client %s: %s v%d -> %s: %s", peer, rpc.name, req.api_version, e.code.name, e.message)
            body = rpc.error(req.api_version, e.code, e.message, e.throttle_ms)
        except Exception:  # noqa: BLE001 - request boundary: log, answer, keep serving
            log.exception("client %s: %s v%d failed", peer, rpc.name, req.api_version)
            body = rpc.error(req.api_version, Errors.UNKNOWN_SERVER_ERROR, Errors.UNKNOWN_SERVER_ERROR.name, 0)
        return SERVER_API.encode(req.api_key, req.api_version, req.correlation_id, body)

    async def answer_forwarded(self, envelope: Any) -> bytes:
        """The raw answer frame (size prefix removed) to the request inside a follower's Envelope."""
        try:
            req = SERVER_API.parse(bytes(envelope.request_data))
        except kafka.UnsupportedVersion as e:
            # As Kafka does (EnvelopeUtils): a request it cannot parse inside a well-formed Envelope is
            # UNSUPPORTED_VERSION, told apart from a malformed Envelope (INVALID_REQUEST).
            raise UnsupportedVersionError(f"forwarded request: {e}") from None
        except kafka.FrameError as e:
            raise InvalidRequestError(f"forwarded request: {e}") from None
        except kafka.BadRequest as e:
            return SERVER_API.error_response(e)[4:]
        if req.api_key == api.ENVELOPE:
            raise InvalidRequestError("an Envelope inside an Envelope")
        req.forwarded = True
        if envelope.request_principal:
            req.principal = bytes(envelope.request_principal).decode("utf-8", "replace")
        peer = envelope_peer(bytes(envelope.client_host_address))
        request_context(req.client_id, req.correlation_id)
        return (await self._answer(req, peer, relay_not_controller=False))[4:]

    # --------------------------------------------------------- authorization
    def _authorize(self, rpc: Rpc, req: kafka.Request, peer: Any) -> None:
        """ACLs on the cluster resource (SASL on): any one of the RPC's operations (``quorum.rpcs``)
        allows it, else CLUSTER_AUTHORIZATION_FAILED.  Super users (the nodes among them) may do
        anything; an RPC that names no operation is theirs alone (Envelope), except ApiVersions."""
        if req.api_key == api.API_VERSIONS or req.principal in self.super_users:
            return
        ops = rpc.acl(req.body)
        if ops:
            with self.service.lock:
                index = self.service.state.acls.index()  # immutable once built: safe to use after the lock
            host = acls.peer_host(peer)
            if any(index.authorize(req.principal, acls.CLUSTER, acls.CLUSTER_NAME, op, (), host) for op in ops):
                return
        raise ClusterAuthorizationFailedError(
            f"{req.principal} is not allowed {' or '.join(ops) or 'to forward requests'} on the cluster "
            f"({rpc.name})")

    # --------------------------------------------------------------- handlers
    async def _run(self, rpc: Rpc, req: kafka.Request, peer: Any,
                   on_value: Callable[[Any], None] | None = None) -> Any:
        """The RPC's domain value: served here, or proposed on the leader (``on_value``: see
        ``Proposer.enqueue``); or the leader's answer to the forwarded frame (``Relayed``)."""
        if not rpc.needs_leader(req.body):
            assert rpc.serve is not None
            return await rpc.serve(self, req)
        timeout = self.cfg.request_timeout_ms / 1000
        backoff = FORWARD_POLICY.start(timeout)
        while True:
            if backoff.expired:
                raise RequestTimedOutError(f"no leader committed the request within {timeout:.2f}s")
            remaining = backoff.remaining()
            is_leader, leader, _ = self.service.raft.role()
            if is_leader and (rpc.generate is None or rpc.reads_on_leader(req.body)):
                return await rpc.serve(self, req)  # a leader read (Rpc.leader_read)
            if is_leader:
                return await self._propose(rpc, req, remaining, on_value)
            if req.forwarded:
                raise NotControllerError("not the leader (forwarded request)")
            target = (self.cfg.client_address_of(leader) or self.service.raft.peer_client_address(leader)
                      if leader else None)  # a member added after this config was written: from its hello
            if target is not None:
                try:
                    return await self._forward(target, req, peer, remaining)
                except NotControllerError as e:
                    log.debug("forward to %s: %s", target, e.message)
                except (ConnectionFailed, RequestTimedOutError) as e:
                    log.debug("forward to %s failed: %s", target, e)
            await backoff.sleep()

    async def _propose(self, rpc: Rpc, req: kafka.Request, timeout: float,
                       on_value: Callable[[Any], None] | None = None) -> Any:
        return await self.proposer.submit(rpc, req.body, timeout, on_value)

    async def _forward(self, address: str, req: kafka.Request, peer: Any, timeout: float) -> "Relayed":
        """Send ``req``'s frame, as it arrived, to the leader; its answer frame, as it is."""
        conn = self._forward_conns.get(address)
        if conn is None:
            conn = self._forward_conns[address] = Connection(address, FORWARD_CLIENT_ID, self.forward_security)
        self.counters["forwarded"] += 1
        resp = await conn.call(forward_envelope(req, peer), timeout)
        code = Errors.of(int(resp.error_code))
        if code != Errors.NONE:
            raise for_code(code, f"{address}: {code.name} (forwarded {RPCS.of(req.api_key, req.body).name})")
        data = bytes(resp.response_data or b"")
        return Relayed(kafka.SIZE.pack(len(data)) + data)
