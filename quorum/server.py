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
import logging
import time
from typing import Any

from records import (
    DescribeTransactionalIdRequest,
    DescribeTransactionalIdResponse,
    InitTransactionalProducerResponse,
    MigrationCommandRequest,
    MigrationCommandResponse,
    SeedProducerIdsRequest,
    SeedProducerIdsResponse,
)

from . import protocol as p
from .client import Connection, ConnectionFailed
from .errors import (
    Errors,
    InvalidRequestError,
    NotControllerError,
    PidQuorumError,
    RequestTimedOutError,
    ThrottlingQuotaExceededError,
)
from .managers import TxnSettings
from .service import Proposer, Service

log = logging.getLogger(__name__)
FORWARD_CLIENT_ID = "pidquorum-forward"


def _write_rollback_placeholder(zk_hosts: str, start: int, length: int) -> str:
    """Rollback: the placeholder block (broker -1) at the quorum's next ID; raises a retriable error if
    ZooKeeper cannot be written (the mode is already rolled back: run the rollback again)."""
    from migration.zk import connect, describe_placeholder, write_placeholder

    try:
        zk = connect(zk_hosts, timeout=5.0)
        try:
            result = write_placeholder(zk, start, length, timeout=10.0, op_timeout=3.0)
        finally:
            zk.stop()
            zk.close()
    except Exception as e:  # noqa: BLE001 - report, the operator reruns the (idempotent) rollback
        raise RequestTimedOutError(f"rolled back, but writing the placeholder to ZooKeeper ({zk_hosts}) failed: "
                                   f"{type(e).__name__}: {e}; run the rollback again") from None
    return describe_placeholder(result, start, length)


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
        self._forward_conns: dict[str, Connection] = {}
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task] = []
        self.counters = {"requests": 0, "forwarded": 0, "throttled": 0, "bad_frames": 0, "bad_requests": 0}

    async def start(self) -> None:
        host, port = (self.cfg.client_bind or self.cfg.client_address).rsplit(":", 1)
        self._server = await asyncio.start_server(self._connection, host, int(port))
        self._tasks.append(asyncio.get_running_loop().create_task(self.proposer.run()))
        log.info("client port listening on %s:%s", host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in self._tasks:
            t.cancel()
        for c in self._forward_conns.values():
            c.close()
        self.proposer._zk_reset()

    # ------------------------------------------------------------ connections
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        responses: asyncio.Queue = asyncio.Queue()
        writer_task = asyncio.get_running_loop().create_task(self._write_responses(responses, writer))
        try:
            async for frame in p.iter_frames(reader, self.cfg.max_frame_bytes, peer, self.counters):
                try:
                    req = p.parse_request(frame)
                except p.FrameError as e:
                    self.counters["bad_frames"] += 1
                    log.warning("client %s: %s; closing", peer, e)
                    break
                except p.BadRequest as e:
                    self.counters["bad_requests"] += 1
                    log.warning("client %s: %s (answered %s)", peer, e.message, e.code.name)
                    responses.put_nowait(p.error_response(e))
                    continue
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

    async def _dispatch(self, req: p.Request, peer: Any) -> bytes:
        try:
            body = await self._handle(req)
        except PidQuorumError as e:
            if e.code not in (Errors.NOT_CONTROLLER,):
                log.info("client %s: %s v%d -> %s: %s", peer, p.API_NAMES.get(req.api_key), req.api_version,
                         e.code.name, e.message)
            body = p.error_body(req.api_key, req.api_version, e.code, e.throttle_ms)
            if req.api_key == p.RECORD_API_KEY:
                cls = p.RPC_RESPONSES.get(type(req.body), InitTransactionalProducerResponse)
                body = cls(error_code=int(e.code), error_message=e.message)
        except Exception:  # noqa: BLE001 - request boundary: log, answer, keep serving
            log.exception("client %s: %s v%d failed", peer, p.API_NAMES.get(req.api_key), req.api_version)
            body = p.error_body(req.api_key, req.api_version, Errors.UNKNOWN_SERVER_ERROR)
        return p.encode_response(req.api_key, req.api_version, req.correlation_id, body)

    # --------------------------------------------------------------- handlers
    async def _handle(self, req: p.Request) -> Any:
        b = req.body
        if req.api_key == p.API_VERSIONS:
            return p.api_versions_body(req.api_version)
        if req.api_key == p.ADMIN_API_KEY:
            action = b.get("action")
            if action == "snapshot":
                self.service.raft.force_snapshot()
            elif action is not None:
                raise InvalidRequestError(f"unknown DescribeState action {action!r}")
            return {"error_code": 0, **self.service.describe(), "server": dict(self.counters),
                    "proposer": {"batches": self.proposer.batches, "records": self.proposer.proposed_records,
                                 "reserve_served": self.proposer.reserve_served}}
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
                    None, _write_rollback_placeholder, zk, next_id, self.cfg.block_size)
            return MigrationCommandResponse(error_code=0, mode=mode, changed=changed, next_producer_id=next_id,
                                            message=message)
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
            result = await self._route(req, "allocate", args)
            return p.allocate_response(*result) if isinstance(result, tuple) else result
        raise InvalidRequestError(f"API {req.api_key} has no handler")  # pragma: no cover

    async def _route(self, req: p.Request, kind: str, args: dict) -> Any:
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
            target = self.cfg.client_address_of(leader) if leader else None
            if target is not None:
                try:
                    body = await self._forward(target, req, remaining)
                    if Errors.of(int(body.error_code)) != Errors.NOT_CONTROLLER:
                        return body
                except (ConnectionFailed, RequestTimedOutError) as e:
                    log.debug("forward to %s failed: %s", target, e)
            await asyncio.sleep(min(0.02, max(remaining, 0)))

    async def _forward(self, address: str, req: p.Request, timeout: float) -> Any:
        conn = self._forward_conns.get(address)
        if conn is None:
            conn = self._forward_conns[address] = Connection(address, FORWARD_CLIENT_ID)
        self.counters["forwarded"] += 1
        return await conn.call(req.body, timeout)

    def _throttle(self, broker_id: int) -> None:
        rate = self.cfg.allocate_rate_per_broker
        if rate <= 0:
            return
        bucket = self._buckets.get(broker_id)
        if bucket is None:
            bucket = self._buckets[broker_id] = TokenBucket(rate, self.cfg.allocate_burst)
        wait_ms = bucket.take()
        if wait_ms:
            self.counters["throttled"] += 1
            raise ThrottlingQuotaExceededError(
                f"broker {broker_id} is over {rate:g} AllocateProducerIds/s; retry in {wait_ms} ms", wait_ms)
