"""The client port: Kafka framing, dispatch, forwarding to the leader, throttling.

Every connection reads frames (4-byte size, capped at ``max_frame_bytes``),
handles requests concurrently and writes responses back in request order.
Bad input never takes the node down: an unreadable or oversized frame or an
unknown API key closes that connection (with a log line); a readable header
with a bad body is answered with INVALID_REQUEST, an unsupported version with
UNSUPPORTED_VERSION.

Any node accepts a request.  The leader proposes it; a follower forwards it
to the leader's client port (once: a forwarded request is never forwarded
again) and relays the answer.  With no leader, or past the deadline, the
answer is NOT_CONTROLLER or REQUEST_TIMED_OUT, both retriable.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from client import api as p
from client.quorum import Connection, ConnectionFailed
from records import (
    AlterAclsRequest,
    AlterAclsResponse,
    AlterClientQuotaRequest,
    AlterClientQuotaResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeTransactionalIdRequest,
    DescribeTransactionalIdResponse,
    InitTransactionalProducerResponse,
    MigrationCommandRequest,
    MigrationCommandResponse,
    SeedProducerIdsRequest,
    SeedProducerIdsResponse,
)
from security import acl as a
from security.acl import Acl
from security.client import ClientSecurity
from security.credentials import NODE_USER, node_credential, node_password
from security.sasl import SaslAuthenticator, api_versions_table, linger_close
from security.tls import server_context
from telemetry.logs import request_context
from wire import kafka
from wire.errors import (
    ClusterAuthorizationFailedError,
    Errors,
    InvalidRequestError,
    NotControllerError,
    PidQuorumError,
    RequestTimedOutError,
    ThrottlingQuotaExceededError,
)

from . import membership
from .managers import TxnSettings
from .quotas import ClientQuotaManager, parse_user
from .service import Proposer, Service
from .stats import REQUEST_BUCKETS, Histogram

log = logging.getLogger(__name__)
FORWARD_CLIENT_ID = "pidquorum-forward"
BUCKET_PRUNE_AT = 1024  # throttle buckets kept before idle ones are pruned


class TokenBucket:
    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def take(self) -> int:
        """0 if a token was taken, else the milliseconds until one is available."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0
        return max(1, int((1 - self.tokens) / self.rate * 1000 + 0.999))


class QuorumServer:
    def __init__(self, service: Service):
        self.service = service
        self.cfg = service.cfg
        self.proposer = Proposer(service)
        self._buckets: dict[int, TokenBucket] = {}
        self._bucket_limit = BUCKET_PRUNE_AT
        self._forward_conns: dict[str, Connection] = {}
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task] = []
        self.counters = {"requests": 0, "forwarded": 0, "throttled": 0, "bad_frames": 0, "bad_requests": 0}
        self.allocate_latency = Histogram(REQUEST_BUCKETS)  # AllocateProducerIds answered OK by this node
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
        self.api_table = api_versions_table(p.SUPPORTED, self.sasl)
        protocol = ("SASL_" if self.sasl else "") + ("SSL" if self.ssl else "PLAINTEXT")
        self.forward_security = None if protocol == "PLAINTEXT" else ClientSecurity(
            protocol=protocol, mechanism="PLAIN" if "PLAIN" in cfg.sasl_mechanisms else cfg.sasl_mechanisms[0],
            username=NODE_USER, password=node_password(cfg.secret), cafile=cfg.tls_cafile,
            certfile=cfg.tls_certfile, keyfile=cfg.tls_keyfile)

    def status(self) -> dict[str, Any]:
        """Everything DescribeState answers; the metrics endpoint reads the same dict."""
        return {**self.service.describe(), "server": dict(self.counters),
                "proposer": {"batches": self.proposer.batches, "records": self.proposer.proposed_records,
                             "reserve_served": self.proposer.reserve.served},
                "allocate_latency": self.allocate_latency.snapshot()}

    async def start(self) -> None:
        host, port = (self.cfg.client_bind or self.cfg.client_address).rsplit(":", 1)
        self._server = await asyncio.start_server(self._connection, host, int(port), ssl=self.ssl)
        self._tasks.append(asyncio.get_running_loop().create_task(self.proposer.run()))
        log.info("client port listening on %s:%s", host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in self._tasks:
            t.cancel()
        for c in self._forward_conns.values():
            c.close()
        if self.service.zookeeper is not None:
            self.service.zookeeper.reset()

    def _write_rollback_placeholder(self, zk_hosts: str, start: int, length: int) -> str:
        """Rollback: the placeholder block (broker -1) at the quorum's next ID; raises a retriable error if
        ZooKeeper cannot be written (the mode is already rolled back: run the rollback again)."""
        if self.service.zookeeper is None:
            raise RequestTimedOutError("rolled back, but this node was started without a ZooKeeper hook to write "
                                       "the placeholder; run the rollback again on a node started with pidctl node "
                                       "start")
        try:
            return self.service.zookeeper.write_placeholder(zk_hosts, start, length)
        except Exception as e:  # noqa: BLE001 - report, the operator reruns the (idempotent) rollback
            raise RequestTimedOutError(f"rolled back, but writing the placeholder to ZooKeeper ({zk_hosts}) "
                                       f"failed: {type(e).__name__}: {e}; run the rollback again") from None

    # ------------------------------------------------------------ connections
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        responses: asyncio.Queue = asyncio.Queue()
        writer_task = asyncio.get_running_loop().create_task(self._write_responses(responses, writer))
        session = self.sasl.session(peer) if self.sasl is not None else None
        refused = False
        try:
            async for frame in kafka.iter_frames(reader, self.cfg.max_frame_bytes, peer, self.counters):
                if session is not None:
                    verdict = await session.on_frame(frame)
                    if verdict.kind == "reply":
                        responses.put_nowait(verdict.data)
                    if verdict.kind == "close" or verdict.close:
                        log.warning("client %s: %s; closing", peer, verdict.reason)
                        refused = True
                        break
                    if verdict.kind == "reply":
                        continue
                try:
                    req = p.QUORUM_API.parse(frame)
                except kafka.FrameError as e:
                    self.counters["bad_frames"] += 1
                    log.warning("client %s: %s; closing", peer, e)
                    break
                except kafka.BadRequest as e:
                    self.counters["bad_requests"] += 1
                    log.warning("client %s: %s (answered %s)", peer, e.message, e.code.name)
                    responses.put_nowait(p.QUORUM_API.error_response(e))
                    continue
                if session is not None:
                    req.principal = session.principal
                self.counters["requests"] += 1
                responses.put_nowait(asyncio.get_running_loop().create_task(self._dispatch(req, peer)))
        except (ConnectionError, OSError) as e:
            log.info("client %s: %s", peer, e)
        except asyncio.CancelledError:
            writer_task.cancel()  # the node is shutting down: end quietly (not a logged task failure)
        finally:
            responses.put_nowait(None)
            try:
                await writer_task
                if refused:
                    await linger_close(reader, writer)
            except (ConnectionError, OSError, asyncio.CancelledError):
                pass
            writer.close()

    @staticmethod
    async def _write_responses(responses: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        while True:
            item = await responses.get()
            if item is None:
                return
            data = item if isinstance(item, bytes) else await item
            writer.write(data)
            await writer.drain()

    async def _dispatch(self, req: kafka.Request, peer: Any) -> bytes:
        request_context(req.client_id, req.correlation_id)  # this task's log lines carry it
        try:
            if self.sasl is not None:
                self._authorize(req, peer)
            body = await self._handle(req)
        except PidQuorumError as e:
            if e.code not in (Errors.NOT_CONTROLLER,):
                log.info("client %s: %s v%d -> %s: %s", peer, p.API_NAMES.get(req.api_key), req.api_version,
                         e.code.name, e.message)
            body = p.QUORUM_API.error(req.api_key, req.api_version, e.code, throttle_ms=e.throttle_ms)
            if req.api_key == p.ADMIN_API_KEY:
                body["error_message"] = e.message  # admin actions (membership) say why they were refused
            if req.api_key == p.RECORD_API_KEY:
                cls = p.RPC_RESPONSES.get(type(req.body), InitTransactionalProducerResponse)
                body = cls(error_code=int(e.code), error_message=e.message)
        except Exception:  # noqa: BLE001 - request boundary: log, answer, keep serving
            log.exception("client %s: %s v%d failed", peer, p.API_NAMES.get(req.api_key), req.api_version)
            body = p.QUORUM_API.error(req.api_key, req.api_version, Errors.UNKNOWN_SERVER_ERROR)
        return p.QUORUM_API.encode(req.api_key, req.api_version, req.correlation_id, body)

    # --------------------------------------------------------- authorization
    def _authorize(self, req: kafka.Request, peer: Any) -> None:
        """ACLs on the cluster resource (SASL on): CLUSTER_ACTION for what brokers do, ALTER for
        administration, DESCRIBE to read; else CLUSTER_AUTHORIZATION_FAILED.  A forwarded request was
        checked by the node that forwarded it (as the node principal, a super user here)."""

        b = req.body
        if req.api_key == p.API_VERSIONS:
            return
        if req.api_key in (p.BROKER_REGISTRATION, p.BROKER_HEARTBEAT, p.ALLOCATE_PRODUCER_IDS):
            ops = (a.CLUSTER_ACTION,)
        elif req.api_key == p.ADMIN_API_KEY:
            ops = (a.ALTER,) if b.get("action") is not None else (a.DESCRIBE, a.CLUSTER_ACTION)
        elif isinstance(b, DescribeAclsRequest) or req.api_key == p.DESCRIBE_CLIENT_QUOTAS:
            ops = (a.DESCRIBE, a.CLUSTER_ACTION)  # brokers poll both
        elif isinstance(b, (AlterAclsRequest, AlterClientQuotaRequest, SeedProducerIdsRequest,
                            MigrationCommandRequest)):
            ops = (a.ALTER,)
        else:  # the brokers' transactional-id RPCs
            ops = (a.CLUSTER_ACTION,)
        if req.principal in self.super_users:
            return
        with self.service.lock:
            index = self.service.state.acls.index()  # immutable once built: safe to use after the lock
        host = a.peer_host(peer)
        if any(index.authorize(req.principal, a.CLUSTER, a.CLUSTER_NAME, op, (), host) for op in ops):
            return
        what = p.API_NAMES.get(req.api_key, str(req.api_key))
        if req.api_key == p.RECORD_API_KEY:
            what += " " + type(b).SPEC.name
        raise ClusterAuthorizationFailedError(
            f"{req.principal} is not allowed {' or '.join(ops)} on the cluster ({what})")

    # --------------------------------------------------------------- handlers
    async def _handle(self, req: kafka.Request) -> Any:
        b = req.body
        if req.api_key == p.API_VERSIONS:
            return kafka.api_versions_body(req.api_version, Errors.NONE, self.api_table)
        if req.api_key == p.RECORD_API_KEY and isinstance(b, DescribeAclsRequest):
            # This node's applied entries (no trip to the leader): at most its replication lag behind.
            with self.service.lock:
                acls = self.service.state.acls.acls()
                applied = self.service.applied_index
            rows = [x.to_dict() for x in acls if not b.principal or x.principal == b.principal]
            return DescribeAclsResponse(error_code=0, acls=json.dumps(rows), applied_index=applied)
        if req.api_key == p.RECORD_API_KEY and isinstance(b, AlterAclsRequest):
            acl = Acl(principal=b.principal, resource_type=b.resource_type, resource_name=b.resource_name,
                      pattern_type=b.pattern_type, operation=b.operation, permission=b.permission, host=b.host)
            result = await self._route(req, "alter_acl", {"action": b.action, "acl": acl})
            return AlterAclsResponse(error_code=0, changed=result) if isinstance(result, bool) else result
        if req.api_key == p.ADMIN_API_KEY:
            action = b.get("action")
            if action in membership.ACTIONS:
                return {"error_code": 0, **await membership.handle(self.service, action, b)}
            if action == "snapshot":
                self.service.raft.force_snapshot()
            elif action is not None:
                raise InvalidRequestError(f"unknown DescribeState action {action!r}")
            return {"error_code": 0, **self.status()}
        if req.api_key == p.BROKER_REGISTRATION:
            if b.incarnation_id is None:
                raise InvalidRequestError("incarnation id is required")
            args = {"broker_id": int(b.broker_id), "incarnation_id": str(b.incarnation_id),
                    "listener": p.listener_address(b)}
            result = await self._route(req, "register", args)
            return result if not isinstance(result, int) else p.registration_response(req.api_version, result)
        if req.api_key == p.BROKER_HEARTBEAT:
            args = {"broker_id": int(b.broker_id), "broker_epoch": int(b.broker_epoch),
                    "want_fence": bool(b.want_fence), "want_shut_down": bool(b.want_shut_down)}
            result = await self._route(req, "heartbeat", args)
            if isinstance(result, dict):
                return p.heartbeat_response(req.api_version, result["is_fenced"], result["should_shut_down"])
            return result
        if req.api_key == p.RECORD_API_KEY and isinstance(b, MigrationCommandRequest):
            result = await self._route(req, "migrate", {"action": b.action, "zk": b.zk})
            if not isinstance(result, tuple):
                return result  # relayed from the leader, which did everything below
            changed, mode = result
            with self.service.lock:
                next_id = self.service.state.producer_ids.next_producer_id
                zk = self.service.state.migration.zk
            message = f"migration mode {mode}" + ("" if changed else " (unchanged)")
            if b.action == "rollback":
                # Committed first (the quorum now issues nothing), so the cursor is final: the placeholder
                # at it puts ZooKeeper-mode allocation above every ID the quorum ever issued.
                message = await asyncio.get_running_loop().run_in_executor(
                    None, self._write_rollback_placeholder, zk, next_id, self.cfg.block_size)
            return MigrationCommandResponse(error_code=0, mode=mode, changed=changed, next_producer_id=next_id,
                                            message=message)
        if req.api_key == p.RECORD_API_KEY and isinstance(b, AlterClientQuotaRequest):
            if b.validate_only:
                with self.service.lock:
                    scratch = ClientQuotaManager()
                    scratch.quotas = {u: dict(v) for u, v in self.service.state.quotas.quotas.items()}
                _, changed = scratch.generate_alter(b.user, b.key, b.value, b.remove, 0)
                return AlterClientQuotaResponse(error_code=0, changed=changed)
            args = {"user": b.user, "key": b.key, "value": b.value, "remove": b.remove}
            result = await self._route(req, "alter_quota", args)
            return AlterClientQuotaResponse(error_code=0, changed=result) if isinstance(result, bool) else result
        if req.api_key == p.DESCRIBE_CLIENT_QUOTAS:
            return self._describe_client_quotas(req)
        if req.api_key == p.RECORD_API_KEY and isinstance(b, SeedProducerIdsRequest):
            args = {"next_producer_id": b.next_producer_id, "origin": b.origin, "zk_broker": b.zk_broker,
                    "zk_block_start": b.zk_block_start, "zk_block_end": b.zk_block_end}
            result = await self._route(req, "seed", args)
            if isinstance(result, tuple):
                return SeedProducerIdsResponse(error_code=0, changed=result[0], next_producer_id=result[1])
            return result
        if req.api_key == p.TXN_API_KEY and isinstance(b, DescribeTransactionalIdRequest):
            # A linearizable read: through the leader's proposer, behind a (record-less) log entry.
            cur = await self._route(req, "read_txn", {"transactional_id": b.transactional_id})
            if isinstance(cur, DescribeTransactionalIdResponse):
                return cur  # relayed from the leader
            if cur is None:
                return DescribeTransactionalIdResponse(error_code=0)
            return DescribeTransactionalIdResponse(error_code=0, producer_id=cur.producer_id,
                                                   producer_epoch=cur.producer_epoch, state=cur.state)
        if req.api_key == p.TXN_API_KEY:
            args = {"broker_id": b.broker_id, "broker_epoch": b.broker_epoch,
                    "transactional_id": b.transactional_id, "timeout_ms": b.transaction_timeout_ms,
                    "producer_id": b.producer_id, "producer_epoch": b.producer_epoch,
                    "settings": TxnSettings(self.cfg.transactional_id_expiration_ms,
                                            self.cfg.transaction_max_timeout_ms)}
            result = await self._route(req, "init_txn", args)
            if isinstance(result, tuple):
                return InitTransactionalProducerResponse(error_code=0, producer_id=result[0],
                                                         producer_epoch=result[1])
            return result
        if req.api_key == p.ALLOCATE_PRODUCER_IDS:
            args = {"broker_id": int(b.broker_id), "broker_epoch": int(b.broker_epoch)}
            t0 = time.monotonic()
            result = await self._route(req, "allocate", args)
            if isinstance(result, tuple) or int(result.error_code) == 0:
                self.allocate_latency.observe(time.monotonic() - t0)
            return p.allocate_response(*result) if isinstance(result, tuple) else result
        raise InvalidRequestError(f"API {req.api_key} has no handler")  # pragma: no cover

    def _describe_client_quotas(self, req: kafka.Request) -> Any:
        """DescribeClientQuotas from this node's applied state (no log entry: brokers poll it).

        Served only while this node follows (or is) a leader, so a node cut off from the
        quorum stops answering within an election timeout instead of serving old quotas.
        Filters: user entity, exact name / default / any (Kafka's match types 0, 1, 2).
        """
        _, leader, _ = self.service.raft.role()
        if not leader:
            raise NotControllerError("no leader known: the quota configuration may be stale")
        wanted: list[tuple[int, str | None]] = []
        for c in req.body.components:
            if c.entity_type != "user":
                raise InvalidRequestError(f"quotas are per user; entity type {c.entity_type!r} is not supported")
            match_type = int(c.match_type)
            if match_type not in (0, 1, 2):
                raise InvalidRequestError(f"unknown match type {match_type}")
            wanted.append((match_type, parse_user(c.match) if match_type == 0 else None))
        with self.service.lock:
            entries = self.service.state.quotas.entries()

        def keep(user: str | None) -> bool:
            for match_type, name in wanted:
                if match_type == 0 and user != name or match_type == 1 and user is not None:
                    return False
                if match_type == 2 and user is None:
                    return False  # "any" names a specific user, not the default (as in Kafka)
            return True
        return p.client_quotas_response(req.api_version, [e for e in entries if keep(e["user"])])

    async def _route(self, req: kafka.Request, kind: str, args: dict) -> Any:
        """Propose on the leader, or forward to it.  Returns the op's response, or a
        forwarded response body to relay as is."""
        timeout = self.cfg.request_timeout_ms / 1000
        deadline = time.monotonic() + timeout
        forwarded = req.client_id == FORWARD_CLIENT_ID
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOutError(f"no leader committed the request within {timeout:.2f}s")
            is_leader, leader, _ = self.service.raft.role()
            if is_leader:
                if kind == "allocate":
                    self._throttle(args["broker_id"])
                return await self.proposer.submit(kind, args, remaining)
            if forwarded:
                raise NotControllerError("not the leader (forwarded request)")
            target = (self.cfg.client_address_of(leader) or self.service.raft.peer_client_address(leader)
                      if leader else None)  # a member added after this config was written: from its hello
            if target is not None:
                try:
                    body = await self._forward(target, req, remaining)
                    if Errors.of(int(body.error_code)) != Errors.NOT_CONTROLLER:
                        return body
                except (ConnectionFailed, RequestTimedOutError) as e:
                    log.debug("forward to %s failed: %s", target, e)
            await asyncio.sleep(min(0.02, max(remaining, 0)))

    async def _forward(self, address: str, req: kafka.Request, timeout: float) -> Any:
        conn = self._forward_conns.get(address)
        if conn is None:
            conn = self._forward_conns[address] = Connection(address, FORWARD_CLIENT_ID, self.forward_security)
        self.counters["forwarded"] += 1
        return await conn.call(req.body, timeout)

    def _prune_buckets(self) -> None:
        """Forget buckets that have refilled to their burst (a new bucket is the same), so requests
        naming ever new broker ids (garbage) cannot grow the table without bound."""
        now = time.monotonic()
        self._buckets = {b: t for b, t in self._buckets.items() if t.tokens + (now - t.stamp) * t.rate < t.burst}
        self._bucket_limit = max(BUCKET_PRUNE_AT, 2 * len(self._buckets))

    def _throttle(self, broker_id: int) -> None:
        rate = self.cfg.allocate_rate_per_broker
        if rate <= 0:
            return
        bucket = self._buckets.get(broker_id)
        if bucket is None:
            if len(self._buckets) >= self._bucket_limit:
                self._prune_buckets()
            bucket = self._buckets[broker_id] = TokenBucket(rate, self.cfg.allocate_burst)
        wait_ms = bucket.take()
        if wait_ms:
            self.counters["throttled"] += 1
            raise ThrottlingQuotaExceededError(
                f"broker {broker_id} is over {rate:g} AllocateProducerIds/s; retry in {wait_ms} ms", wait_ms)
