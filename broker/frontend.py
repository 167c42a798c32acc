"""The Kafka-protocol broker that unmodified clients talk to: ``BrokerServer`` starts and stops it,
dispatches each request by API key and authorizes it.

Its parts: ``network`` (a connection's frames, one request at a time, in order), ``handlers`` (one
module per group of APIs), ``api_table`` (each API's versions, handler, error answer and ACLs),
``pid_manager`` (producer-ID blocks from the quorum, never waited on), ``txn_coordinator`` (the
transaction markers; the transactions themselves are decided by the quorum).  What it serves and how
it answers bad input: README.md ("Using it") and docs/brokers.md.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import os
import time
from typing import Any

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.security import acl as acls
from quorum.security.sasl import SaslAuthenticator, api_versions_table
from quorum.security.tls import server_context
from quorum.network import Accepted, KafkaListener
from quorum.telemetry.logs import Throttled
from records.wire import kafka
from records.wire.errors import (
    ClusterAuthorizationFailedError,
    CoordinatorLoadInProgressError,
    Errors,
    PidQuorumError,
    TransactionalIdAuthorizationFailedError,
)

from . import kafkaio as kio_
from .acl_cache import AclCache
from .api_keys import (  # noqa: F401 - re-exported: importers name them from here
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    DESCRIBE_PRODUCERS,
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    FETCH,
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
    LIST_OFFSETS,
    LIST_TRANSACTIONS,
    METADATA,
    PRODUCE,
)
from .api_table import NAMES, PRODUCE_TOPIC_ACL, RPCS, SUPPORTED  # noqa: F401 - re-exported
from .handlers.rpc import BrokerRpc  # noqa: F401 - re-exported
from .config import BrokerConfig
from .groups.coordinator import GroupCoordinator
from .groups.store import GroupStore
from .handlers import metadata
from .handlers.metadata import (  # noqa: F401 - re-exported
    BATCHED_COORDINATOR_VERSION,
    COORDINATOR_GROUP,
    COORDINATOR_SHARE,
    COORDINATOR_TRANSACTION,
    MAX_COORDINATOR_KEY_CHARS,
    MAX_COORDINATOR_KEYS,
    NO_COORDINATOR,
    SHARE_COORDINATOR_VERSION,
)
from .handlers.partitions import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, READ_COMMITTED  # noqa: F401 - re-exported
from .handlers.transactions import TXN_STATES  # noqa: F401 - re-exported
from .network import AppendWaiters, ReadAhead, _DropConnection, serve_connection
from .pid_binding import ProducerBindings
from .pid_manager import ProducerIdManager
from .quota import STATS_FILE, ProducerIdQuotaManager, QuotaConfigPoller
from .storage import Storage
from .txn_coordinator import TxnCoordinator

log = logging.getLogger(__name__)

MAINTAIN_EVERY_S = 5.0
# A producer-ID binding is kept this many producer_id_expiration_ms after its last use (7 days by default, Kafka's
# transactional.id.expiration.ms): an idempotent producer keeps its ID for life (KIP-360 clients bump the epoch
# themselves), so its binding must outlive the partitions' state of it (broker/pid_binding.py).
BINDING_LIFETIME_EXPIRATIONS = 7
MAX_BINDINGS_UNCAPPED = 2 ** 62  # max_producers_per_partition = none: producer-ID bindings are not capped either


class BrokerServer(KafkaListener):
    def __init__(self, cfg: BrokerConfig):
        self.cfg = cfg
        self.quorum = QuorumClient(list(cfg.quorum), RetryPolicy(timeout=cfg.quorum_timeout_s),
                                   client_id=f"broker-{cfg.broker_id}", security=cfg.quorum_security,
                                   prefer_leader=True)
        self.pids: ProducerIdManager | None = None  # created once the listener's port is known
        self.txn: TxnCoordinator | None = None  # with it
        self.groups: GroupCoordinator | None = None  # consumer groups: loaded from their file at start
        # SASL on: who each producer ID was handed to (broker/pid_binding.py); None without authentication.
        self.bindings: ProducerBindings | None = None
        self._txn_task: asyncio.Task | None = None
        self.storage = Storage(cfg.data_dir, default_partitions=cfg.default_partitions,
                               auto_create=cfg.auto_create_topics, dedup=cfg.dedup, segment_bytes=cfg.segment_bytes,
                               producer_id_expiration_ms=cfg.producer_id_expiration_ms,
                               max_producers=cfg.max_producers_per_partition,
                               retry_window_ms=cfg.idempotence_retry_window_ms,
                               snapshot_every=cfg.producer_snapshot_every,
                               retention_ms=cfg.retention_ms, retention_bytes=cfg.retention_bytes,
                               max_open_segments=cfg.max_open_segments, max_topics=cfg.max_topics)
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=cfg.io_threads, thread_name_prefix="broker-io")
        self._server: asyncio.AbstractServer | None = None
        self._waiters = AppendWaiters()
        self._produce_requests = 0
        self._connections: dict[asyncio.Task, ReadAhead] = {}
        self._binding_log = Throttled(log, 10.0)  # Produce refused by a producer-ID binding: at most every 10 s
        self.quotas = ProducerIdQuotaManager(cfg.quota_window)
        self.quota_poller = QuotaConfigPoller(self.quotas, self.quorum, cfg.quota_refresh_s,
                                              stats_path=os.path.join(cfg.data_dir, STATS_FILE))
        self._quota_task: asyncio.Task | None = None
        self._maintain_task: asyncio.Task | None = None
        self._muted_until: dict[Any, float] = {}  # peer -> monotonic time its next request may be handled
        self.counters = {"requests": 0, "bad_frames": 0, "bad_requests": 0, "produce_batches": 0,
                         "duplicates": 0, "dropped_by_fault_injection": 0, "init_producer_id": 0,
                         "load_in_progress": 0, "trailing_bytes": 0, "fenced_producers": 0,
                         "quota_throttled_batches": 0, "connections_refused": 0,
                         "connections_refused_per_ip": 0, "read_pauses": 0, "fetch_waits": 0,
                         "fetch_wakeups": 0, "describe_producers_truncated": 0, "evicted_producers_refused": 0,
                         "unsupported_versions": 0, "producer_id_refused": 0,
                         "authentication_timeouts": 0, "tls_handshake_failures": 0}
        # With SASL on: the largest frame a connection may send before it has authenticated.
        self.unauthenticated_frame_bytes = min(cfg.max_unauthenticated_frame_bytes, cfg.max_frame_bytes)
        self.port: int | None = None
        self.quota_provider: Any = self.quotas  # stats() -> {principal: {rate, tokens, throttle_time_ms, ...}}
        self.api = kafka.ApiTable(SUPPORTED, NAMES, lambda key, version, code, message, throttle_ms:
                                  self._error_body(key, version, code), trailing_ok=True)
        self.listen(log)
        self._setup_security()

    def _setup_security(self) -> None:
        cfg = self.cfg
        self.sasl = self.acls = None
        if cfg.sasl_credentials_file:
            self.counters["authorization_failures"] = 0
            self.sasl = SaslAuthenticator(cfg.sasl_credentials_file, tuple(cfg.sasl_mechanisms),
                                          counters=self.counters)
            self.acls = AclCache(self.quorum, cfg.acl_refresh_s, tuple(cfg.super_users))
        self.ssl = (server_context(cfg.tls_certfile, cfg.tls_keyfile, cfg.tls_cafile, cfg.tls_client_auth)
                    if cfg.tls_certfile else None)
        self.api_table = api_versions_table(SUPPORTED, self.sasl)

    def quota_stats(self) -> dict[str, dict]:
        """Per-principal producer-ID quota figures of the quota provider ({} when there is none)."""
        return self.quota_provider.stats() if self.quota_provider is not None else {}

    def status(self) -> dict[str, Any]:
        """The broker's figures: what its metrics endpoint and ``pidctl broker status`` show."""
        counters = dict(self.counters)
        if self.txn is not None:
            counters.update(self.txn.counters)
        if self.bindings is not None:
            counters.update(self.bindings.stats())
        if self.groups is not None:
            counters.update(self.groups.stats())
        return {"broker_id": self.cfg.broker_id, "listen": self.cfg.listen, "counters": counters,
                "connections": len(self._connections),
                "read_ahead_bytes": sum(r.held for r in self._connections.values()),
                "pid_manager": self.pids.stats() if self.pids is not None else None,
                "producer_state": self.storage.producer_stats(),
                "quota": self.quota_stats(),
                "txn_steps": {k: {"count": n, "seconds": sec} for k, (n, sec) in self.txn.step_times.items()}
                if self.txn is not None else {}}

    def _partition_exists(self, topic: str, partition: int) -> bool:
        info = self.storage.topic(topic)
        return info is not None and 0 <= partition < info.partitions

    async def _verify_txn(self, tid: str, pid: int, epoch: int, topic: str, partition: int) -> None:
        if self.txn is None:
            raise CoordinatorLoadInProgressError("the broker is starting")
        await self.txn.verify(tid, pid, epoch, topic, partition)

    def _note_error(self, code: Errors) -> None:
        if code in (Errors.PRODUCER_FENCED, Errors.INVALID_PRODUCER_EPOCH):
            self.counters["fenced_producers"] += 1
        elif code == Errors.UNKNOWN_PRODUCER_ID:  # only a producer the cap evicted is answered that
            self.counters["evicted_producers_refused"] += 1

    # --------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        if self.acls is not None:
            await self.acls.start()  # no first copy of the ACLs: do not serve (raises the quorum's answer)
        if self.sasl is not None:
            # Before the listener: no Produce is served unchecked.  Loads (or creates) the durable record.
            self.bindings = ProducerBindings(
                self.cfg.data_dir, self.cfg.producer_id_expiration_ms * BINDING_LIFETIME_EXPIRATIONS,
                self.cfg.max_producers_per_partition or MAX_BINDINGS_UNCAPPED,
                lambda fn, *args: asyncio.get_running_loop().run_in_executor(self._io, fn, *args))
            self.bindings.open()
            self.bindings.start()
        host, port = self.cfg.listen.rsplit(":", 1)
        self._server = await asyncio.start_server(self.accept, host, int(port))
        self.port = self._server.sockets[0].getsockname()[1]
        self.cfg.with_bound_port(self.port)
        adv_host, adv_port = self.cfg.advertised_address
        self.pids = ProducerIdManager(self.cfg.broker_id, self.quorum, listener=f"{adv_host}:{adv_port}",
                                      config=self.cfg.pid_manager,
                                      heartbeat_interval_ms=self.cfg.broker_heartbeat_interval_ms)
        loop = asyncio.get_running_loop()
        run_io = functools.partial(loop.run_in_executor, self._io)
        groups = GroupCoordinator(GroupStore(self.cfg.data_dir, run_io), self.cfg.group_settings,
                                  self._partition_exists, self._verify_txn)
        await run_io(groups.load)
        groups.start()
        self.txn = TxnCoordinator(self.cfg.broker_id, self.quorum, self.storage, run_io,
                                  lambda: self.pids.broker_epoch, self.pids.reregister,
                                  on_marker=lambda topic, partition: self._waiters.appended((topic, partition)),
                                  offsets_marker=groups.write_marker)
        self.groups = groups
        # Clients that connect before the first block is in hand get COORDINATOR_LOAD_IN_PROGRESS (retriable).
        await self.pids.start()
        self._txn_task = loop.create_task(self.txn.run())  # completes what a crash left prepared, too
        # Quotas in force from the first produce when the quorum answers now; else from the first poll that works.
        await self.quota_poller.refresh()
        self._quota_task = asyncio.get_running_loop().create_task(self.quota_poller.run())
        self._maintain_task = asyncio.get_running_loop().create_task(self._maintain())
        log.info("broker %d listening on %s:%d (epoch %s, data %s)", self.cfg.broker_id, host, self.port,
                 self.pids.broker_epoch, self.cfg.data_dir)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._trim.cancel()
        for t in list(self._connections):
            t.cancel()
        if self._quota_task is not None:
            self._quota_task.cancel()
        if self._maintain_task is not None:
            self._maintain_task.cancel()
        if self._txn_task is not None:
            self._txn_task.cancel()
        if self.pids is not None:
            await self.pids.close()
        if self.groups is not None:
            await self.groups.close()
        if self.acls is not None:
            await self.acls.close()
        if self.bindings is not None:
            await self.bindings.close()
        await self.quorum.close()
        self._io.shutdown(wait=True)
        self.storage.close()

    async def _maintain(self) -> None:
        """Expiry and retention of partitions nobody writes to (``Storage.maintain``), every few seconds,
        in an I/O thread."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(MAINTAIN_EVERY_S)
            try:
                await loop.run_in_executor(self._io, self.storage.maintain)
            except Exception:  # noqa: BLE001 - keep maintaining; the partitions report their own errors
                log.exception("partition maintenance failed")
            if self.bindings is not None:
                await self.bindings.maintain()  # on the loop (the table is the loop's), in chunks

    # ------------------------------------------------------------ connections (broker/network.py)
    async def serve(self, conn: Accepted) -> None:
        await serve_connection(self, conn)

    def _count_read_pause(self) -> None:
        self.counters["read_pauses"] += 1

    # ------------------------------------------------------------ answering a request
    async def _answer_request(self, req: kafka.Request, peer: Any) -> bytes | None:
        if req.trailing:
            self.counters["trailing_bytes"] += 1
            log.debug("client %s: %s v%d: %d bytes after the body, ignored (as Kafka does)", peer,
                      NAMES.get(req.api_key), req.api_version, req.trailing)
        try:
            if self.acls is not None:
                self._authorize(req, peer)
            body = await self._handle(req)
        except _DropConnection:
            raise
        except PidQuorumError as e:
            log.info("client %s: %s v%d -> %s: %s", peer, NAMES.get(req.api_key), req.api_version, e.code.name,
                     e.message)
            self._note_error(e.code)
            body = self._error_body(req.api_key, req.api_version, e.code, req.body)
        except Exception:  # noqa: BLE001 - request boundary: log, answer, keep serving
            log.exception("client %s: %s v%d failed", peer, NAMES.get(req.api_key), req.api_version)
            body = self._error_body(req.api_key, req.api_version, Errors.UNKNOWN_SERVER_ERROR, req.body)
        if body is None:  # acks=0 produce: no response at all
            return None
        throttle_ms = kio_.ms(getattr(body, "throttle_time", None))
        if throttle_ms > 0:
            self._muted_until[peer] = time.monotonic() + throttle_ms / 1000
        try:
            return self.api.encode(req.api_key, req.api_version, req.correlation_id, body)
        except Exception:  # noqa: BLE001 - an answer the client's version cannot carry: answer the error instead
            log.exception("client %s: %s v%d: the answer cannot be encoded", peer, NAMES.get(req.api_key),
                          req.api_version)
            body = self._error_body(req.api_key, req.api_version, Errors.UNKNOWN_SERVER_ERROR, req.body)
            return self.api.encode(req.api_key, req.api_version, req.correlation_id, body)

    # ------------------------------------------------------------ authorization
    def _authorize(self, req: kafka.Request, peer: Any) -> None:
        """ACLs (SASL on), as each RPC of the table (``RPCS``) asks: InitProducerId needs
        IDEMPOTENT_WRITE on the cluster without a transactional id (else CLUSTER_AUTHORIZATION_FAILED)
        and WRITE on the transactional id with one, as do AddPartitionsToTxn, EndTxn and a Produce that
        names one, transactional batches or not (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED).  Which
        producer IDs a Produce may carry is ``handlers.partitions._binding_refusal``'s
        (broker/pid_binding.py).  Topics are checked only where an RPC declares ``topic_acl`` (Produce:
        WRITE, PRODUCE_TOPIC_ACL; DescribeProducers: DESCRIBE), per topic by its handler
        (``_topic_allowed``)."""
        need = RPCS[req.api_key].acl(req.body)
        if need is None:
            return
        resource_type, name, operation = need
        if self.acls.authorize(req.principal, resource_type, name, operation, acls.peer_host(peer)):
            return
        self.counters["authorization_failures"] += 1
        if resource_type == acls.CLUSTER:
            raise ClusterAuthorizationFailedError(f"{req.principal} is not allowed {operation} on the cluster")
        raise TransactionalIdAuthorizationFailedError(
            f"{req.principal} is not allowed {operation} on transactional id {name[:200]!r}")

    def _topic_allowed(self, req: kafka.Request, topic: str) -> bool:
        """May ``req``'s principal do what ``req``'s RPC needs on ``topic`` (its ``topic_acl``)?  Always with
        SASL off.  A refusal is counted and logged."""
        operation = RPCS[req.api_key].topic_acl
        if self.acls is None or operation is None:
            return True
        if self.acls.authorize(req.principal, acls.TOPIC, topic, operation, req.host):
            return True
        self.counters["authorization_failures"] += 1
        log.info("%s: %s is not allowed %s on topic %r (answered TOPIC_AUTHORIZATION_FAILED)",
                 NAMES[req.api_key], req.principal, operation, topic[:200])
        return False

    # ------------------------------------------------------------ dispatch
    async def _handle(self, req: kafka.Request) -> Any:
        body = RPCS[req.api_key].handle(self, req)
        return await body if inspect.isawaitable(body) else body

    def _topic_acl(self, req: kafka.Request) -> str | None:
        """The operation ``req``'s RPC needs on each topic it names (``BrokerRpc.topic_acl``)."""
        return RPCS[req.api_key].topic_acl

    def _error_body(self, api_key: int, version: int, code: Errors, body: Any = None) -> Any:
        """A response carrying only ``code``, shaped like the request (per-partition errors)."""
        return RPCS[api_key].error(self.cfg, version, code, body)

    # A method too: callers outside the dispatch (tests) answer a Metadata request directly.
    _metadata = metadata.metadata
