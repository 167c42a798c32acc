"""The Kafka-protocol front end: what unmodified Kafka clients talk to.

One broker, one listener, every partition led by this broker.  Served with
kio's codecs: ApiVersions 0-3, Metadata 0-12, InitProducerId 0-4, Produce
3-10, ListOffsets 1-7, Fetch 4-12, FindCoordinator 0-6, AddPartitionsToTxn 0-3,
AddOffsetsToTxn 0-3 (answered: no consumer groups), EndTxn 0-3,
DescribeProducers 0, DescribeTransactions 0, ListTransactions 0-1.

Producer IDs come from quorum-allocated blocks through the non-blocking
``ProducerIdManager``; transactional ids (KIP-360 epoch rules) and their
transactions are decided and stored by the quorum itself, so any broker can
coordinate any of them and a broker failover never loses or repeats an epoch
bump; the broker writes the markers (``TxnCoordinator``).  Fetch and
ListOffsets honour read_committed (the last stable offset, the aborted
transactions); a transactional batch is appended only to a partition of its
producer's ongoing transaction (KIP-890 part 1).

Requests on one connection are handled one at a time, in order, as Kafka
does (it mutes a connection while its request is processed): a client with
5 produce requests in flight sees them appended in the order it sent them.
Frames are read ahead while a request is being handled, up to
``max_connection_buffer_bytes`` per connection (``ReadAhead``): past that the
socket is not read until the handler catches up, so a client that sends
faster than it reads its answers fills its own TCP window, not the broker's
memory.  ``max_connections`` / ``max_connections_per_ip`` bound how many
connections are served; one over a limit is closed at once (counted; logged
at most every 10 s).  Before a client authenticates it is bounded as on the
quorum's client port (``security.limits``): TLS is started on the accepted
socket with ``tls_handshake_timeout_ms``; with SASL on, a connection not
authenticated ``authentication_timeout_ms`` after its accept is aborted however
it trickles, and a frame over ``max_unauthenticated_frame_bytes`` (64 KiB)
closes the connection before its body is read.  A long-polling Fetch waits for appends to the partitions
it reads only (``AppendWaiters``), not for every append.

Bad input never takes the broker down: an unreadable or oversized frame, an
unknown API key or a request at a version outside the advertised range closes
that connection, as Kafka does (an answer in another version's layout would be
misread).  An unknown key or an unsupported version is logged once per key
(and version) and process, then only counted: a client that does not
negotiate sends it again on every reconnect.  ApiVersions at an unsupported
version is answered UNSUPPORTED_VERSION with the supported ranges (v0), so the
client can pick a version (logged once per version: clients start so); a
readable header with a bad body is answered with INVALID_REQUEST, a bad record
batch with CORRUPT_MESSAGE / INVALID_RECORD for its partition.  Consumer groups
are not served: FindCoordinator for a group is answered
GROUP_AUTHORIZATION_FAILED, so a consumer with a group fails at once.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import functools
import inspect
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import failpoints
from client.quorum import QuorumClient, RetryPolicy
from security import acl as a
from security.limits import ConnectionLimits, TrimAfterClose
from security.sasl import SaslAuthenticator, api_versions_table
from security.tls import server_context
from telemetry.logs import FirstOfEach, Throttled
from wire import kafka
from wire.errors import (
    ClusterAuthorizationFailedError,
    CoordinatorLoadInProgressError,
    Errors,
    InvalidRequestError,
    PidQuorumError,
    TransactionalIdAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)

from . import kafkaio as kio_
from .acl_cache import AclCache
from .config import BrokerConfig
from .network import AppendWaiters, ReadAhead, _DropConnection, serve_connection
from .partition import Partition
from .pid_binding import PRINCIPAL, TRANSACTIONAL_ID, ProducerBindings, batch_producers
from .pid_manager import ProducerIdManager
from .quota import STATS_FILE, ProducerIdQuotaManager, QuotaConfigPoller, batch_producer_ids
from .recordbatch import TRANSACTIONAL_BIT, parse_header
from .storage import Storage
from .txn_coordinator import TxnCoordinator

log = logging.getLogger(__name__)

PRODUCE, FETCH, LIST_OFFSETS, METADATA, FIND_COORDINATOR, INIT_PRODUCER_ID = 0, 1, 2, 3, 10, 22
DESCRIBE_PRODUCERS = 61
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
# Kafka's transaction states (TransactionState.java): what ListTransactions' state filters may name.  The
# quorum's transactions are in the first six; Dead and PrepareEpochFence are states no id here is ever in.
TXN_STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead",
              "PrepareEpochFence")
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN = 24, 25, 26
READ_COMMITTED = 1
# What a consumer group's FindCoordinator and AddOffsetsToTxn get: this broker coordinates no groups.
GROUPS_NOT_SERVED = Errors.GROUP_AUTHORIZATION_FAILED
LATEST_TIMESTAMP, EARLIEST_TIMESTAMP = -1, -2
MAINTAIN_EVERY_S = 5.0


class BrokerServer:
    def __init__(self, cfg: BrokerConfig):
        self.cfg = cfg
        self.quorum = QuorumClient(list(cfg.quorum), RetryPolicy(timeout=cfg.quorum_timeout_s),
                                   client_id=f"broker-{cfg.broker_id}", security=cfg.quorum_security,
                                   prefer_leader=True)
        self.pids: ProducerIdManager | None = None  # created once the listener's port is known
        self.txn: TxnCoordinator | None = None  # with it
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
        self._peer_log = Throttled(log, 10.0)  # what unauthenticated peers cause: at most a line every 10 s
        self._trim = TrimAfterClose(log)
        self._binding_log = Throttled(log, 10.0)  # Produce refused by a producer-ID binding: at most every 10 s
        self._frame_log = FirstOfEach(log)  # unknown API keys, unsupported versions: once each
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
                         "unsupported_versions": 0, "groups_refused": 0, "producer_id_refused": 0,
                         "authentication_timeouts": 0, "tls_handshake_failures": 0}
        self.limits = ConnectionLimits(cfg.max_connections, cfg.max_connections_per_ip, self.counters, log)
        # With SASL on: the largest frame a connection may send before it has authenticated.
        self.unauthenticated_frame_bytes = min(cfg.max_unauthenticated_frame_bytes, cfg.max_frame_bytes)
        self.port: int | None = None
        self.quota_provider: Any = self.quotas  # stats() -> {principal: {rate, tokens, throttle_time_ms, ...}}
        self.api = kafka.ApiTable(SUPPORTED, NAMES, lambda key, version, code, message, throttle_ms:
                                  self._error_body(key, version, code), trailing_ok=True)
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
        return {"broker_id": self.cfg.broker_id, "listen": self.cfg.listen, "counters": counters,
                "connections": len(self._connections),
                "read_ahead_bytes": sum(r.held for r in self._connections.values()),
                "pid_manager": self.pids.stats() if self.pids is not None else None,
                "producer_state": self.storage.producer_stats(),
                "quota": self.quota_stats()}

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
        # TLS is started in serve_connection (start_tls), so the connection limits and the deadlines count from
        # the accept, not from the end of a handshake a peer can drag out.
        self._server = await asyncio.start_server(functools.partial(serve_connection, self), host, int(port))
        self.port = self._server.sockets[0].getsockname()[1]
        self.cfg.with_bound_port(self.port)
        adv_host, adv_port = self.cfg.advertised_address
        self.pids = ProducerIdManager(self.cfg.broker_id, self.quorum, listener=f"{adv_host}:{adv_port}",
                                      config=self.cfg.pid_manager,
                                      heartbeat_interval_ms=self.cfg.broker_heartbeat_interval_ms)
        loop = asyncio.get_running_loop()
        self.txn = TxnCoordinator(self.cfg.broker_id, self.quorum, self.storage,
                                  lambda fn, *args: loop.run_in_executor(self._io, fn, *args),
                                  lambda: self.pids.broker_epoch, self.pids.reregister,
                                  on_marker=lambda topic, partition: self._waiters.appended((topic, partition)))
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
        producer IDs a Produce may carry is ``_binding_refusal``'s (broker/pid_binding.py).  Topics are checked
        only where an RPC declares ``topic_acl`` (Produce: WRITE, PRODUCE_TOPIC_ACL; DescribeProducers:
        DESCRIBE), per topic by its handler (``_topic_allowed``)."""
        need = RPCS[req.api_key].acl(req.body)
        if need is None:
            return
        resource_type, name, operation = need
        if self.acls.authorize(req.principal, resource_type, name, operation, a.peer_host(peer)):
            return
        self.counters["authorization_failures"] += 1
        if resource_type == a.CLUSTER:
            raise ClusterAuthorizationFailedError(f"{req.principal} is not allowed {operation} on the cluster")
        raise TransactionalIdAuthorizationFailedError(
            f"{req.principal} is not allowed {operation} on transactional id {name[:200]!r}")

    def _topic_allowed(self, req: kafka.Request, topic: str) -> bool:
        """May ``req``'s principal do what ``req``'s RPC needs on ``topic`` (its ``topic_acl``)?  Always with
        SASL off.  A refusal is counted and logged."""
        operation = RPCS[req.api_key].topic_acl
        if self.acls is None or operation is None:
            return True
        if self.acls.authorize(req.principal, a.TOPIC, topic, operation, req.host):
            return True
        self.counters["authorization_failures"] += 1
        log.info("%s: %s is not allowed %s on topic %r (answered TOPIC_AUTHORIZATION_FAILED)",
                 NAMES[req.api_key], req.principal, operation, topic[:200])
        return False

    # ------------------------------------------------------------ dispatch
    async def _handle(self, req: kafka.Request) -> Any:
        body = RPCS[req.api_key].handle(self, req)
        return await body if inspect.isawaitable(body) else body

    def _api_versions(self, req: kafka.Request) -> Any:
        return kafka.api_versions_body(req.api_version, Errors.NONE, self.api_table)

    def _error_body(self, api_key: int, version: int, code: Errors, body: Any = None) -> Any:
        """A response carrying only ``code``, shaped like the request (per-partition errors)."""
        return RPCS[api_key].error(self.cfg, version, code, body)

    # ------------------------------------------------------------ Metadata
    def _topic_metadata(self, name: str | None, create: bool) -> dict:
        try:
            topic = self.storage.ensure_topic(name) if create else self.storage.topic(name)
        except PidQuorumError as e:
            # A null name (Metadata v10+, a topic asked for by id) is "" in the answer: v10-v11 cannot carry null.
            return {"error_code": int(e.code), "name": name or "", "topic_id": None, "partitions": []}
        except OSError as e:  # the disk refused this topic's files: its error (Kafka's, for a failed log directory)
            log.error("Metadata: topic %r: %s (answered KAFKA_STORAGE_ERROR)", (name or "")[:255], e)
            return {"error_code": int(Errors.KAFKA_STORAGE_ERROR), "name": name or "", "topic_id": None,
                    "partitions": []}
        if topic is None:
            return {"error_code": int(Errors.UNKNOWN_TOPIC_OR_PARTITION), "name": name or "", "topic_id": None,
                    "partitions": []}
        me = self.cfg.broker_id
        return {"error_code": 0, "name": name, "topic_id": topic.topic_id, "is_internal": False,
                "partitions": [{"error_code": 0, "partition_index": i, "leader_id": me, "leader_epoch": 0,
                                "replica_nodes": [me], "isr_nodes": [me], "offline_replicas": []}
                               for i in range(topic.partitions)],
                "topic_authorized_operations": -2147483648}

    def _metadata(self, req: kafka.Request) -> Any:
        b, v = req.body, req.api_version
        if b.topics is None or (v == 0 and not b.topics):
            names, create = [t.name for t in self.storage.topics()], False
        else:
            names = [t.name for t in b.topics]
            create = self.cfg.auto_create_topics and getattr(b, "allow_auto_topic_creation", True)
        host, port = self.cfg.advertised_address
        return kio_.response(METADATA, v, {
            "throttle_time": 0,
            "brokers": [{"node_id": self.cfg.broker_id, "host": host, "port": port, "rack": None}],
            "cluster_id": self.cfg.cluster_id,
            "controller_id": self.cfg.broker_id,
            "topics": [self._topic_metadata(n, create) for n in names],
            "cluster_authorized_operations": -2147483648,
        })

    # ------------------------------------------------------------ FindCoordinator
    def _find_coordinator(self, req: kafka.Request) -> Any:
        """Transactional ids (key type 1): this broker.  Consumer groups (key type 0): refused with
        GROUP_AUTHORIZATION_FAILED and, from v1, an error message saying why.  Share-group state (key
        type 2, v6, KIP-932): INVALID_REQUEST, as Kafka answers a broker without a share coordinator (and
        any version below 6).  Other key types: INVALID_REQUEST.

        Versions v0-v6, as Kafka 4.x serves them, each parsed and answered in its own layout:

        - v0: the request is a key only (always a group); the answer is error_code, node_id, host, port.
        - v1, v2: the request adds key_type; the answer adds throttle_time and error_message (v2 only
          changes when a throttled answer is sent).
        - v3: the first flexible version (compact strings, tagged fields, request header v2, response
          header v1); fields as v2.
        - v4 (KIP-699): batched.  The request is key_type and coordinator_keys; the answer has no
          top-level error, only ``coordinators``: one entry per key, in the request's order (a repeated
          key gets an entry each time), each with its key, node_id, host, port, error_code and
          error_message.  Every key is decided as a v0-v3 key would be, with the request's key type.
        - v5: v4's layout (it may carry TRANSACTION_ABORTABLE, KIP-890, which is never answered here).
        - v6: v4's layout; key type 2 may be asked.

        Bad input is answered, never a closed connection nor a traceback: an unknown key type gives
        every key INVALID_REQUEST (as Kafka does); a key over ``MAX_COORDINATOR_KEY_CHARS`` (no
        transactional id can be that long) gets INVALID_REQUEST, the others of its batch are answered;
        a batch of no keys is answered one INVALID_REQUEST entry with the key "" (Kafka answers an empty
        ``coordinators``, which tells the client nothing); a batch of more than ``MAX_COORDINATOR_KEYS``
        is not looked up: its first ``MAX_COORDINATOR_KEYS`` keys are answered INVALID_REQUEST saying
        so (each key's entry is larger than the key: answering every key of a 16 MB frame of empty keys
        would take gigabytes).  Each bad request is logged.

        Authorization: none (this broker has no ACL for FindCoordinator, for any key type; Kafka's
        DESCRIBE check on the group or transactional id is not made).  The ACLs are checked where the
        transactional id is used: InitProducerId, AddPartitionsToTxn, EndTxn, Produce.

        Consumer groups are not served (no JoinGroup, SyncGroup, Heartbeat, OffsetCommit,
        OffsetFetch).  Naming this broker as their coordinator made clients fail late or never: a
        client that does not negotiate versions (kafka-python pinned to an ``api_version``, Go
        clients) sends JoinGroup, the broker closes the connection (unknown API), and it reconnects
        and tries again for ever.  The code was chosen by what the clients do with it, tried with
        kafka-python 3.0 and confluent-kafka 2.16 (librdkafka):

        - GROUP_AUTHORIZATION_FAILED (30): kafka-python raises GroupAuthorizationFailedError (naming
          the group) from ``poll``, ``commit`` and ``committed`` at once, negotiated or pinned.
          librdkafka puts one consumer error carrying our message on the consumer's queue (the next
          ``poll`` returns it, not retriable) and keeps asking every second without repeating it;
          an assign()-only consumer still fetches.  Authorization failures are what clients surface
          instead of retrying (the Java consumer throws GroupAuthorizationException from poll and
          commitSync), and the meaning fits: nobody may use a group on this broker.
        - INVALID_GROUP_ID (24): the same in both clients (kafka-python's error does not name the
          group), but it tells users to change a group id when no id would work.
        - COORDINATOR_NOT_AVAILABLE (15), NOT_COORDINATOR (16): retriable; both clients retry for
          ever and ``poll`` returns nothing (kafka-python logs each NOT_COORDINATOR): the spin.

        Under any error code here, librdkafka's ``commit`` and ``committed`` wait for a coordinator
        until their timeout (``committed(timeout=)``; a synchronous commit about session.timeout.ms)
        and fail with _WAIT_COORD / _TIMED_OUT; the consumer error on the queue says why.  Refusals are
        counted, one per group key; the first and every 1000th is logged."""
        b, v = req.body, req.api_version
        key_type = int(getattr(b, "key_type", COORDINATOR_GROUP))  # v0 has no key type: a group
        host, port = self.cfg.advertised_address
        me = {"node_id": self.cfg.broker_id, "host": host, "port": port}
        if v < BATCHED_COORDINATOR_VERSION:
            code, why = self._coordinator_of(v, key_type, str(b.key))
            if code == Errors.INVALID_REQUEST:
                log.info("FindCoordinator v%d: %s (answered INVALID_REQUEST)", v, why)
            return kio_.response(FIND_COORDINATOR, v, {
                "throttle_time": 0, "error_code": int(code), "error_message": why,
                **(me if code == Errors.NONE else NO_COORDINATOR)})
        keys = b.coordinator_keys
        if not keys or len(keys) > MAX_COORDINATOR_KEYS:
            why = ("the request names no coordinator keys" if not keys else
                   f"{len(keys)} coordinator keys in one request, at most {MAX_COORDINATOR_KEYS}: none was looked "
                   f"up (the first {MAX_COORDINATOR_KEYS} are answered)")
            log.info("FindCoordinator v%d: %s (answered INVALID_REQUEST)", v, why)
            return _coordinator_entries(v, keys or ("",), Errors.INVALID_REQUEST, why)
        coordinators, invalid = [], None
        for key in keys:
            code, why = self._coordinator_of(v, key_type, key)
            if code == Errors.INVALID_REQUEST and invalid is None:
                invalid = why
            coordinators.append({"key": key, "error_code": int(code), "error_message": why,
                                 **(me if code == Errors.NONE else NO_COORDINATOR)})
        if invalid is not None:
            log.info("FindCoordinator v%d (%d keys): %s (answered INVALID_REQUEST)", v, len(keys), invalid)
        return kio_.response(FIND_COORDINATOR, v, {"throttle_time": 0, "coordinators": coordinators})

    def _coordinator_of(self, version: int, key_type: int, key: str) -> tuple[Errors, str | None]:
        """(NONE, None) when this broker coordinates ``key`` (of ``key_type``), else (error, why)."""
        if key_type not in (COORDINATOR_GROUP, COORDINATOR_TRANSACTION, COORDINATOR_SHARE):
            return Errors.INVALID_REQUEST, (f"unknown coordinator key type {key_type} "
                                            "(0: group, 1: transaction, 2: share)")
        if len(key) > MAX_COORDINATOR_KEY_CHARS:
            return Errors.INVALID_REQUEST, (f"a coordinator key of {len(key)} characters, at most "
                                            f"{MAX_COORDINATOR_KEY_CHARS}")
        if key_type == COORDINATOR_SHARE:
            if version < SHARE_COORDINATOR_VERSION:
                return Errors.INVALID_REQUEST, (f"coordinator key type 2 (share) needs FindCoordinator "
                                                f"v{SHARE_COORDINATOR_VERSION}")
            return Errors.INVALID_REQUEST, "share groups are not served by this broker (coordinator key type 2)"
        if key_type == COORDINATOR_GROUP:
            self.counters["groups_refused"] += 1
            why = f"consumer groups are not served by this broker (group {key[:200]!r})"
            if self.counters["groups_refused"] % 1000 == 1:
                log.info("FindCoordinator: %s; answered GROUP_AUTHORIZATION_FAILED (%d so far)", why,
                         self.counters["groups_refused"])
            return GROUPS_NOT_SERVED, why
        # Transactional state lives in the quorum: every broker coordinates every transactional id.
        return Errors.NONE, None

    # ------------------------------------------------------------ InitProducerId
    async def _init_producer_id(self, req: kafka.Request) -> Any:
        b, v = req.body, req.api_version
        self.counters["init_producer_id"] += 1
        expected_pid = int(getattr(b, "producer_id", -1))
        expected_epoch = int(getattr(b, "producer_epoch", -1))
        if (expected_pid == -1) != (expected_epoch == -1):
            raise InvalidRequestError("producer id and epoch must both be -1 or both be set")
        tid = b.transactional_id
        if self.pids is None:
            raise CoordinatorLoadInProgressError("the broker is starting")
        if tid is None:
            # Idempotent producer: a fresh ID from the block in hand, epoch 0, never waiting on the quorum.
            try:
                pid = self.pids.generate_producer_id()
            except CoordinatorLoadInProgressError:
                self.counters["load_in_progress"] += 1
                raise
            if self.bindings is not None:
                # On stable storage before the client learns the ID (group commit): it stays this principal's
                # across a restart, and nobody else may write with it (broker/pid_binding.py).
                await self.bindings.bind(pid, PRINCIPAL, req.principal)
            return self._init_response(v, pid, 0)
        if tid == "":
            raise InvalidRequestError("transactional id must not be empty")
        timeout_ms = kio_.ms(b.transaction_timeout)
        try:
            pid, epoch = await self._init_transactional(tid, timeout_ms, expected_pid, expected_epoch)
        except PidQuorumError as e:
            if e.code == Errors.PRODUCER_FENCED and v < 4:
                # PRODUCER_FENCED exists from InitProducerId v4 on; older clients know it by this name.
                log.info("InitProducerId v%d %r: %s (answered INVALID_PRODUCER_EPOCH)", v, tid, e.message)
                self._note_error(e.code)
                return self._init_error(v, Errors.INVALID_PRODUCER_EPOCH)
            raise
        if self.bindings is not None:
            await self.bindings.bind(pid, TRANSACTIONAL_ID, tid)
        return self._init_response(v, pid, epoch)

    async def _init_transactional(self, tid: str, timeout_ms: int, pid: int, epoch: int) -> tuple[int, int]:
        """The quorum's epoch rules; an open transaction of the id is aborted (and a prepared one completed)
        first, by the coordinator (``TxnCoordinator.init_producer_id``)."""
        return await self.txn.init_producer_id(tid, timeout_ms, pid, epoch)

    @staticmethod
    def _init_response(version: int, pid: int, epoch: int) -> Any:
        return kio_.response(INIT_PRODUCER_ID, version, {"throttle_time": 0, "error_code": 0, "producer_id": pid,
                                                         "producer_epoch": epoch})

    @staticmethod
    def _init_error(version: int, code: Errors) -> Any:
        return kio_.response(INIT_PRODUCER_ID, version, {"throttle_time": 0, "error_code": int(code),
                                                         "producer_id": -1, "producer_epoch": -1})

    # ------------------------------------------------------------ Produce
    def _partition(self, topic: str, index: int, create: bool) -> Partition:
        """The partition; INVALID_TOPIC_EXCEPTION / UNKNOWN_TOPIC_OR_PARTITION errors carry their code."""
        if not create and self.storage.topic(topic) is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        return self.storage.partition(topic, index)

    async def _produce(self, req: kafka.Request) -> Any:
        b, v = req.body, req.api_version
        acks = int(b.acks)
        self._produce_requests += 1
        loop = asyncio.get_running_loop()
        responses = []
        appended: list[tuple[str, int]] = []
        refused = self._check_producer_id_quota(req)
        bindings = self.bindings
        if bindings is not None:
            now_ms, checked = bindings.now_ms(), {}
        for t in b.topic_data:
            parts = []
            allowed = self._topic_allowed(req, str(t.name))
            for pd in t.partition_data:
                r = {"index": pd.index, "error_code": 0, "base_offset": -1, "log_append_time": None,
                     "log_start_offset": -1, "record_errors": [], "error_message": None}
                parts.append(r)
                if acks not in (0, 1, -1):
                    r["error_code"], r["error_message"] = int(Errors.INVALID_REQUIRED_ACKS), f"acks={acks}"
                    continue
                if not allowed:
                    r["error_code"] = int(Errors.TOPIC_AUTHORIZATION_FAILED)
                    r["error_message"] = f"{req.principal} is not allowed {RPCS[req.api_key].topic_acl} on this topic"
                    continue
                try:
                    part = self._partition(t.name, int(pd.index), create=self.cfg.auto_create_topics)
                except PidQuorumError as e:
                    r["error_code"], r["error_message"] = int(e.code), e.message
                    continue
                if pd.records is None:
                    r["error_code"], r["error_message"] = int(Errors.INVALID_RECORD), "no records"
                    continue
                if bindings is not None:
                    refusal = self._binding_refusal(req, pd.records, now_ms, checked)
                    if refusal is not None:
                        r["error_code"], r["error_message"] = int(refusal[0]), refusal[1]
                        continue
                throttled = max((refused.get(pid, 0) for pid in batch_producer_ids(pd.records)),
                                default=0) if refused else 0
                if throttled:
                    # KIP-936: a producer ID this principal has not produced with lately, over its
                    # producer_ids_rate: nothing is appended; retriable, with the throttle time.
                    self.counters["quota_throttled_batches"] += 1
                    r["error_code"] = int(Errors.THROTTLING_QUOTA_EXCEEDED)
                    r["error_message"] = (f"{req.principal} is over its producer_ids_rate for new producer IDs; "
                                          f"retry in {throttled} ms")
                    continue
                records = bytes(pd.records)
                token, code, why = await self._verify_transactional(req, t.name, int(pd.index), part, records)
                if code != Errors.NONE:
                    r["error_code"], r["error_message"] = int(code), why
                    self._note_error(code)
                    log.info("produce %s-%d: %s: %s", t.name, pd.index, code.name, why)
                    continue
                res = await loop.run_in_executor(self._io, functools.partial(part.append, records,
                                                                             transactional_ok=token))
                r["error_code"] = int(res.error)
                r["error_message"] = res.message or None
                r["base_offset"] = res.base_offset
                r["log_start_offset"] = res.log_start_offset
                if res.error == Errors.NONE:
                    if res.duplicate:
                        self.counters["duplicates"] += 1
                    else:
                        appended.append((t.name, int(pd.index)))
                        self.counters["produce_batches"] += 1
                else:
                    self._note_error(res.error)
                    log.info("produce %s-%d: %s: %s", t.name, pd.index, res.error.name, res.message)
            responses.append({"name": t.name, "partition_responses": parts})
        if appended:
            for key in appended:
                self._waiters.appended(key)
            if failpoints.hit("broker.produce.appended", self._produce_requests):
                raise _DropConnection()
        if acks == 0:
            return None
        throttle_ms = max(refused.values(), default=0) if refused else 0
        return kio_.response(PRODUCE, v, {"responses": responses, "throttle_time": throttle_ms})

    def _binding_refusal(self, req: kafka.Request, records: Any, now_ms: int,
                         checked: dict[tuple[int, bool], tuple[Errors, str] | None]) -> tuple[Errors, str] | None:
        """SASL on: None when every producer ID of the partition's batches is the principal's to use
        (``ProducerBindings.check``: handed to it, or its transactional id named), else the answer for
        the partition.  Each (producer ID, transactional) is checked once per request."""
        tid = req.body.transactional_id
        for key in batch_producers(records):
            if key in checked:
                out = checked[key]
            else:
                out = checked[key] = self.bindings.check(key[0], req.principal, tid, key[1], now_ms)
                if out is not None:
                    code, why = out
                    self.counters["producer_id_refused"] += 1
                    self.counters["authorization_failures"] += 1
                    self._binding_log(logging.INFO, "Produce from %s (transactional id %r): %s: %s", req.principal,
                                      None if tid is None else str(tid)[:200], code.name, why)
            if out is not None:
                return out
        return None

    def _check_producer_id_quota(self, req: kafka.Request) -> dict[int, int]:
        """KIP-936: {producer id: throttle ms} for the new producer IDs of this request over the
        principal's quota (empty: everything may go ahead).  Each producer ID is checked once."""
        pids: set[int] = set()
        for t in req.body.topic_data:
            for pd in t.partition_data:
                if pd.records is not None:
                    pids.update(batch_producer_ids(pd.records))
        now = time.monotonic()
        out = {}
        for pid in sorted(pids):
            wait_ms = self.quotas.check(req.principal, pid, now)
            if wait_ms:
                out[pid] = wait_ms
        if out:
            log.debug("%s: %d new producer ID(s) over the producer_ids_rate quota; throttled %d ms", req.principal,
                     len(out), max(out.values()))
        return out

    # ------------------------------------------------------------ Fetch
    async def _fetch(self, req: kafka.Request) -> Any:
        """Answered once min_bytes are there, at max_wait (at most 30 s), or at once with an error.
        While it waits, only an append to one of its partitions wakes it (``AppendWaiters``): it
        watches them before each read, so an append during the read is not missed."""
        b, v = req.body, req.api_version
        deadline = time.monotonic() + min(kio_.ms(b.max_wait), 30_000) / 1000
        min_bytes = max(int(b.min_bytes), 0)
        keys = frozenset((t.topic, int(pt.partition)) for t in b.topics for pt in t.partitions)
        while True:
            waiter = self._waiters.watch(keys)
            try:
                responses, total = await self._fetch_once(b)
                remaining = deadline - time.monotonic()
                if total >= max(min_bytes, 1) or remaining <= 0 or self._fetch_has_error(responses):
                    break
                self.counters["fetch_waits"] += 1
                await asyncio.wait((waiter,), timeout=remaining)
                if waiter.done():
                    self.counters["fetch_wakeups"] += 1
            finally:
                self._waiters.forget(waiter, keys)
        return kio_.response(FETCH, v, {"throttle_time": 0, "error_code": 0, "session_id": 0,
                                        "responses": responses})

    @staticmethod
    def _fetch_has_error(responses: list[dict]) -> bool:
        return any(pt["error_code"] for t in responses for pt in t["partitions"])

    async def _fetch_once(self, b: Any) -> tuple[list[dict], int]:
        loop = asyncio.get_running_loop()
        budget = int(b.max_bytes) if getattr(b, "max_bytes", None) is not None else 2**31 - 1
        committed = int(getattr(b, "isolation_level", 0)) == READ_COMMITTED
        total = 0
        responses = []
        for t in b.topics:
            parts = []
            for pt in t.partitions:
                r = {"partition_index": pt.partition, "error_code": 0, "high_watermark": -1,
                     "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                     "records": None}
                parts.append(r)
                try:
                    part = self._partition(t.topic, int(pt.partition), create=False)
                except PidQuorumError as e:
                    r["error_code"] = int(e.code)
                    continue
                r["high_watermark"] = part.high_watermark
                r["last_stable_offset"] = lso = part.last_stable_offset
                r["log_start_offset"] = part.log_start_offset
                limit = max(0, min(int(pt.partition_max_bytes), budget))
                if limit == 0 and total > 0:
                    r["records"] = b""
                    continue
                offset = int(pt.fetch_offset)
                try:
                    if committed:
                        data, lso, aborted = await loop.run_in_executor(self._io, _read_committed, part, offset,
                                                                        max(limit, 1))
                        r["last_stable_offset"] = lso
                        r["aborted_transactions"] = aborted
                    else:
                        data = await loop.run_in_executor(self._io, part.read, offset, max(limit, 1))
                except PidQuorumError as e:
                    r["error_code"] = int(e.code)
                    continue
                r["records"] = data
                total += len(data)
                budget -= len(data)
            responses.append({"topic": t.topic, "partitions": parts})
        return responses, total

    # ------------------------------------------------------------ ListOffsets
    async def _list_offsets(self, req: kafka.Request) -> Any:
        b, v = req.body, req.api_version
        topics = []
        for t in b.topics:
            parts = []
            for pt in t.partitions:
                r = {"partition_index": pt.partition_index, "error_code": 0, "timestamp": -1, "offset": -1,
                     "leader_epoch": 0}
                parts.append(r)
                try:
                    part = self._partition(t.name, int(pt.partition_index), create=False)
                except PidQuorumError as e:
                    r["error_code"] = int(e.code)
                    continue
                ts = int(pt.timestamp)
                if ts == LATEST_TIMESTAMP:
                    # read_committed consumers start from the last stable offset, as in Kafka.
                    committed = int(getattr(b, "isolation_level", 0)) == READ_COMMITTED
                    r["offset"] = part.last_stable_offset if committed else part.high_watermark
                elif ts == EARLIEST_TIMESTAMP:
                    r["offset"] = part.log_start_offset
                elif ts < 0:
                    r["error_code"] = int(Errors.INVALID_REQUEST)
                else:
                    found = part.offset_for_timestamp(ts)
                    if found is not None:
                        r["offset"], r["timestamp"] = found
            topics.append({"name": t.name, "partitions": parts})
        return kio_.response(LIST_OFFSETS, v, {"throttle_time": 0, "topics": topics})

    # ------------------------------------------------------------ DescribeProducers
    async def _describe_producers(self, req: kafka.Request) -> Any:
        """Kafka's DescribeProducers (KIP-664): the idempotence state of each partition's producers.

        Authorized per topic, as Kafka does: with SASL on, DESCRIBE on the topic (or an operation that
        implies it: READ, WRITE, ALTER, ALL); a refused topic's partitions get TOPIC_AUTHORIZATION_FAILED
        whether the topic exists or not, and the others are answered.

        Bounded: at most ``describe_producers_limit`` producers per partition, the lowest producer ids
        first, read in an I/O thread (a partition may hold a million producers).  A partition with more
        keeps error_code 0 and says so in its error_message ("1000 of 250000 producers shown, the
        lowest producer ids; describe_producers_limit").  Kafka's admin client (and
        ``kafka-transactions.sh describe-producers``) reads error_message only with an error, so its
        users get the first ``describe_producers_limit`` producers without the notice; a client that
        reads the message (or compares the count) can tell."""
        loop = asyncio.get_running_loop()
        limit = self.cfg.describe_producers_limit
        topics = []
        for t in req.body.topics:
            parts = []
            allowed = self._topic_allowed(req, str(t.name))
            for index in t.partition_indexes:
                r = {"partition_index": index, "error_code": 0, "error_message": None, "active_producers": []}
                parts.append(r)
                if not allowed:
                    r["error_code"] = int(Errors.TOPIC_AUTHORIZATION_FAILED)
                    r["error_message"] = f"{req.principal} is not allowed {RPCS[req.api_key].topic_acl} on this topic"
                    continue
                try:
                    part = self._partition(t.name, int(index), create=False)
                except PidQuorumError as e:
                    r["error_code"], r["error_message"] = int(e.code), e.message
                    continue
                rows, total = await loop.run_in_executor(self._io, part.describe_producers, limit)
                r["active_producers"] = [
                    {"producer_id": pid, "producer_epoch": epoch, "last_sequence": last_seq,
                     "last_timestamp": last_ts, "coordinator_epoch": -1, "current_txn_start_offset": txn_start}
                    for pid, epoch, last_seq, last_ts, txn_start in rows]
                if total > len(rows):
                    self.counters["describe_producers_truncated"] += 1
                    r["error_message"] = (f"{len(rows)} of {total} producers shown, the lowest producer ids; "
                                          f"describe_producers_limit")
            topics.append({"name": t.name, "partitions": parts})
        return kio_.response(DESCRIBE_PRODUCERS, req.api_version, {"throttle_time": 0, "topics": topics})

    # ------------------------------------------------------------ KIP-664: ListTransactions, DescribeTransactions
    def _may_describe(self, req: kafka.Request, tid: str) -> bool:
        """DESCRIBE on the transactional id (or an operation that implies it); always with SASL off."""
        if self.acls is None or self.acls.authorize(req.principal, a.TRANSACTIONAL_ID, tid, a.DESCRIBE, req.host):
            return True
        self.counters["authorization_failures"] += 1
        return False

    async def _list_transactions(self, req: kafka.Request) -> Any:
        """ListTransactions v0-1 (KIP-664): the transactions this broker coordinates (``TxnCoordinator
        .list_transactions``: every transactional id the quorum knows, read a page at a time from the quorum
        leader), as
        Kafka filters them: by state (a name Kafka does not know is returned in unknown_state_filters and
        filters nothing), by producer id, and from v1 by duration (running longer than duration_filter ms).
        Only ids the principal may DESCRIBE are listed (the others are left out, not refused).  The quorum
        unreachable: COORDINATOR_NOT_AVAILABLE for the whole answer (a partial list would look whole)."""
        b = req.body
        states = {str(x) for x in b.state_filters if str(x) in TXN_STATES}
        unknown = [str(x) for x in b.state_filters if str(x) not in TXN_STATES]
        pids = {int(x) for x in b.producer_id_filters}
        duration = int(getattr(b, "duration_filter", -1))
        try:
            txns = await self._coordinator().list_transactions(lambda tid: self._may_describe(req, tid))
        except PidQuorumError as e:
            log.info("ListTransactions: %s (answered %s)", e.message, _coordinator_code(e).name)
            return _list_transactions_error(self.cfg, req.api_version, _coordinator_code(e), b)
        now_ms = int(time.time() * 1000)
        rows = [{"transactional_id": t["transactional_id"], "producer_id": t["producer_id"],
                 "transaction_state": t["state"]} for t in txns
                if (not states or t["state"] in states) and (not pids or t["producer_id"] in pids)
                and (duration < 0 or now_ms - t["start_time_ms"] > duration)]
        return kio_.response(LIST_TRANSACTIONS, req.api_version, {
            "throttle_time": 0, "error_code": 0, "unknown_state_filters": unknown, "transaction_states": rows})

    async def _describe_transactions(self, req: kafka.Request) -> Any:
        """DescribeTransactions v0 (KIP-664): each id's transaction as the quorum leader has it (any id,
        not only those this broker has served: every broker coordinates every id).  Per id, as Kafka
        answers: TRANSACTIONAL_ID_AUTHORIZATION_FAILED without DESCRIBE on it, TRANSACTIONAL_ID_NOT_FOUND
        for an id the quorum does not know, COORDINATOR_NOT_AVAILABLE when the quorum cannot be read
        (COORDINATOR_LOAD_IN_PROGRESS while the broker starts)."""
        tids = [str(t) for t in req.body.transactional_ids]
        allowed = [t for t in tids if self._may_describe(req, t)]
        found = dict(zip(allowed, await self._coordinator().describe_each(allowed)))
        rows = []
        for tid in tids:
            row: dict[str, Any] = {"error_code": 0, "transactional_id": tid, "transaction_state": "",
                                   "transaction_timeout": 0, "transaction_start_time": _ms_time(-1),
                                   "producer_id": -1, "producer_epoch": -1, "topics": []}
            rows.append(row)
            txn = found.get(tid, Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            if isinstance(txn, Errors):
                row["error_code"] = int(txn)
            elif isinstance(txn, PidQuorumError):
                row["error_code"] = int(_coordinator_code(txn))
            elif txn is None:
                row["error_code"] = Errors.TRANSACTIONAL_ID_NOT_FOUND
            else:
                topics: dict[str, list[int]] = {}
                for _, topic, partition in txn["partitions"]:
                    topics.setdefault(topic, []).append(partition)
                row.update(transaction_state=txn["state"], transaction_timeout=max(0, txn["timeout_ms"]),
                           transaction_start_time=_ms_time(txn["start_time_ms"]), producer_id=txn["producer_id"],
                           producer_epoch=txn["producer_epoch"],
                           topics=[{"topic": t, "partitions": sorted(ps)} for t, ps in sorted(topics.items())])
        return kio_.response(DESCRIBE_TRANSACTIONS, req.api_version, {"throttle_time": 0, "transaction_states": rows})

    # ------------------------------------------------------------ transactions
    def _coordinator(self) -> TxnCoordinator:
        if self.txn is None:
            raise CoordinatorLoadInProgressError("the broker is starting")
        return self.txn

    async def _add_partitions_to_txn(self, req: kafka.Request) -> Any:
        """AddPartitionsToTxn v0-3: the partitions join the producer's transaction (one begins if none is
        open), decided by the quorum (``TxnCoordinator``).  A partition this broker does not have gets
        UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED, as Kafka answers; a fenced
        producer gets PRODUCER_FENCED (INVALID_PRODUCER_EPOCH before v3) on every partition."""
        b, v = req.body, req.api_version
        tid, pid, epoch = str(b.v3_and_below_transactional_id), int(b.v3_and_below_producer_id), \
            int(b.v3_and_below_producer_epoch)
        wanted: list[tuple[str, int]] = []
        unknown: set[tuple[str, int]] = set()
        for t in b.v3_and_below_topics:
            info = self.storage.topic(str(t.name))
            for i in t.partitions:
                key = (str(t.name), int(i))
                wanted.append(key)
                if info is None or not 0 <= key[1] < info.partitions:
                    unknown.add(key)
        if unknown:
            log.info("AddPartitionsToTxn %r: %d unknown partition(s), e.g. %s-%d", tid[:200], len(unknown),
                     *sorted(unknown)[0])
            return self._add_partitions_answer(v, b, lambda key: Errors.UNKNOWN_TOPIC_OR_PARTITION
                                               if key in unknown else Errors.OPERATION_NOT_ATTEMPTED)
        await self._coordinator().add_partitions(tid, pid, epoch, wanted)
        return self._add_partitions_answer(v, b, lambda key: Errors.NONE)

    @staticmethod
    def _add_partitions_answer(version: int, body: Any, code_of: Callable[[tuple[str, int]], Errors]) -> Any:
        topics = [{"name": t.name, "results_by_partition": [
            {"partition_index": i, "partition_error_code": int(code_of((str(t.name), int(i))))}
            for i in t.partitions]} for t in body.v3_and_below_topics]
        return kio_.response(ADD_PARTITIONS_TO_TXN, version, {"throttle_time": 0,
                                                              "results_by_topic_v3_and_below": topics})

    async def _end_txn(self, req: kafka.Request) -> Any:
        """EndTxn v0-3: commit or abort, decided in the quorum; answered once the markers are written (or,
        if they cannot be now, once the outcome is decided: the sweeper completes it)."""
        b = req.body
        await self._coordinator().end(str(b.transactional_id), int(b.producer_id), int(b.producer_epoch),
                                      bool(b.committed))
        return kio_.response(END_TXN, req.api_version, {"throttle_time": 0, "error_code": 0})

    def _add_offsets_to_txn(self, req: kafka.Request) -> Any:
        """AddOffsetsToTxn v0-3 (sendOffsetsToTransaction) needs a group coordinator, which this broker is
        not: answered with the error a group's FindCoordinator gets, and why."""
        log.info("AddOffsetsToTxn %r for group %r: consumer groups are not served (answered %s)",
                 str(req.body.transactional_id)[:200], str(req.body.group_id)[:200], GROUPS_NOT_SERVED.name)
        return kio_.response(ADD_OFFSETS_TO_TXN, req.api_version, {"throttle_time": 0,
                                                                   "error_code": int(GROUPS_NOT_SERVED)})

    async def _verify_transactional(self, req: kafka.Request, topic: str, index: int, part: Partition,
                                    records: bytes) -> tuple[int | None, Errors, str]:
        """KIP-890 part 1 for one partition's records: (token for ``Partition.append``, NONE, "") when they
        are not transactional or their partition is in the producer's ongoing transaction, else
        (None, error, why)."""
        try:
            h = parse_header(records)
        except Exception:  # noqa: BLE001 - malformed: the append says what is wrong
            return None, Errors.NONE, ""
        if not h.attributes & TRANSACTIONAL_BIT:
            return None, Errors.NONE, ""
        tid = req.body.transactional_id
        if tid is None:
            return None, Errors.INVALID_TXN_STATE, "a transactional batch needs the request's transactional id"
        if self.acls is not None and not self.acls.authorize(req.principal, a.TRANSACTIONAL_ID, str(tid), a.WRITE,
                                                             req.host):
            self.counters["authorization_failures"] += 1
            return None, Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, \
                f"{req.principal} is not allowed WRITE on transactional id {str(tid)[:200]!r}"
        token = part.expect_transaction(h.producer_id, h.producer_epoch)
        try:
            await self._coordinator().verify(str(tid), h.producer_id, h.producer_epoch, topic, index)
        except PidQuorumError as e:
            code = e.code
            if code == Errors.PRODUCER_FENCED:
                code = Errors.INVALID_PRODUCER_EPOCH  # what Produce answers a fenced producer
            elif code == Errors.CONCURRENT_TRANSACTIONS:
                code = Errors.INVALID_TXN_STATE  # a late batch of a transaction being ended
            return None, code, e.message
        if self.bindings is not None and self.bindings.owner(h.producer_id) is None:
            # The quorum says the id holds this producer ID (a producer from before a restart or an upgrade):
            # bound from now on, so a batch with it that does not name the id is refused here.
            self.bindings.learn(h.producer_id, str(tid))
        return token, Errors.NONE, ""


def _read_committed(part: Partition, offset: int, max_bytes: int) -> tuple[bytes, int, list[dict] | None]:
    """A read_committed Fetch of one partition (in an I/O thread): the batches below the last stable offset,
    that offset, and the aborted transactions the data holds (the client drops their batches)."""
    lso = part.last_stable_offset
    data = part.read(offset, max_bytes, max_offset=lso)
    if not data:
        return data, lso, None
    return data, lso, [{"producer_id": pid, "first_offset": first}
                       for pid, first in part.aborted_transactions(offset, lso)]


# ------------------------------------------------------------------ the table
def _cluster_acl(operation: str) -> tuple[str, str, str]:
    return a.CLUSTER, a.CLUSTER_NAME, operation


def _init_acl(b: Any) -> tuple[str, str, str]:
    if b.transactional_id is None:
        return _cluster_acl(a.IDEMPOTENT_WRITE)
    return a.TRANSACTIONAL_ID, str(b.transactional_id), a.WRITE


def _produce_acl(b: Any) -> tuple[str, str, str] | None:
    """WRITE on a transactional id the Produce names, whether its batches are transactional or not (as Kafka
    checks it); TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition otherwise."""
    if b.transactional_id is None:
        return None
    return a.TRANSACTIONAL_ID, str(b.transactional_id), a.WRITE


def _versions_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kafka.api_versions_body(version, code, SUPPORTED)


def _init_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kio_.response(INIT_PRODUCER_ID, version, {"throttle_time": 0, "error_code": int(code), "producer_id": -1,
                                                     "producer_epoch": -1})


# What Produce needs on each topic it writes to (``_topic_allowed``; TOPIC_AUTHORIZATION_FAILED for that topic's
# partitions), as in Kafka.  Producer IDs are also bound to their principal (broker/pid_binding.py).
PRODUCE_TOPIC_ACL: str | None = a.WRITE
# A producer-ID binding is kept this many producer_id_expiration_ms after its last use (7 days by default, Kafka's
# transactional.id.expiration.ms): an idempotent producer keeps its ID for life (KIP-360 clients bump the epoch
# themselves), so its binding must outlive the partitions' state of it (broker/pid_binding.py).
BINDING_LIFETIME_EXPIRATIONS = 7
MAX_BINDINGS_UNCAPPED = 2 ** 62  # max_producers_per_partition = none: producer-ID bindings are not capped either

# FindCoordinator (``BrokerServer._find_coordinator``): key types, the first batched version (KIP-699) and
# the first that may ask for a share-group key (KIP-932); the bounds of a request's keys.
COORDINATOR_GROUP, COORDINATOR_TRANSACTION, COORDINATOR_SHARE = 0, 1, 2
BATCHED_COORDINATOR_VERSION, SHARE_COORDINATOR_VERSION = 4, 6
MAX_COORDINATOR_KEYS = 10_000  # per request; Kafka has no bound but the frame's size
MAX_COORDINATOR_KEY_CHARS = 32767  # a Kafka string (v0-v2 cannot carry more); the quorum's bound on a transactional id
NO_COORDINATOR = {"node_id": -1, "host": "", "port": -1}


def _coordinator_entries(version: int, keys: Any, code: Errors, why: str) -> Any:
    """A batched (v4+) answer giving each of ``keys`` (at most ``MAX_COORDINATOR_KEYS`` of them) ``code``."""
    return kio_.response(FIND_COORDINATOR, version, {"throttle_time": 0, "coordinators": [
        {"key": key, "error_code": int(code), "error_message": why, **NO_COORDINATOR}
        for key in keys[:MAX_COORDINATOR_KEYS]]})


def _coordinator_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    """``code`` for the whole request; from v4 for each of its keys, or, when the body could not be read,
    for the key "" (an answer with no entry would not carry the code)."""
    if version >= BATCHED_COORDINATOR_VERSION:
        keys = getattr(body, "coordinator_keys", None) or ("",)
        return _coordinator_entries(version, keys, code, code.name)
    return kio_.response(FIND_COORDINATOR, version, {"throttle_time": 0, "error_code": int(code),
                                                     "error_message": code.name, **NO_COORDINATOR})


def _metadata_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None or body.topics is None else [
        {"error_code": int(code), "name": t.name or "", "topic_id": None, "partitions": []} for t in body.topics]
    return kio_.response(METADATA, version, {"throttle_time": 0, "brokers": [], "topics": topics,
                                             "cluster_id": cfg.cluster_id, "controller_id": -1})


def _produce_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [
        {"name": t.name, "partition_responses": [
            {"index": pd.index, "error_code": int(code), "base_offset": -1, "log_append_time": None,
             "log_start_offset": -1, "record_errors": [], "error_message": code.name}
            for pd in t.partition_data]} for t in body.topic_data]
    return kio_.response(PRODUCE, version, {"responses": topics, "throttle_time": 0})


def _fetch_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [
        {"topic": t.topic, "partitions": [
            {"partition_index": pt.partition, "error_code": int(code), "high_watermark": -1,
             "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
             "records": None} for pt in t.partitions]} for t in body.topics]
    return kio_.response(FETCH, version, {"throttle_time": 0, "error_code": int(code), "session_id": 0,
                                          "responses": topics})


def _add_partitions_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [
        {"name": t.name, "results_by_partition": [
            {"partition_index": i, "partition_error_code": int(code)} for i in t.partitions]}
        for t in body.v3_and_below_topics]
    return kio_.response(ADD_PARTITIONS_TO_TXN, version, {"throttle_time": 0,
                                                          "results_by_topic_v3_and_below": topics})


def _end_txn_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kio_.response(END_TXN, version, {"throttle_time": 0, "error_code": int(code)})


def _add_offsets_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kio_.response(ADD_OFFSETS_TO_TXN, version, {"throttle_time": 0, "error_code": int(code)})


def _describe_producers_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [
        {"name": t.name, "partitions": [
            {"partition_index": i, "error_code": int(code), "error_message": code.name, "active_producers": []}
            for i in t.partition_indexes]} for t in body.topics]
    return kio_.response(DESCRIBE_PRODUCERS, version, {"throttle_time": 0, "topics": topics})


def _ms_time(ms: int) -> datetime.datetime:
    """A Kafka timestamp field (kio's datetime_i64) of ``ms`` since the epoch (-1: none, as Kafka sends it)."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)


def _coordinator_code(e: PidQuorumError) -> Errors:
    """What an operator's read answers when the quorum could not be read: COORDINATOR_NOT_AVAILABLE (the
    client may retry), COORDINATOR_LOAD_IN_PROGRESS while the broker starts, else the error itself."""
    if e.code == Errors.COORDINATOR_LOAD_IN_PROGRESS or not e.retriable:
        return e.code
    return Errors.COORDINATOR_NOT_AVAILABLE


def _list_transactions_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kio_.response(LIST_TRANSACTIONS, version, {"throttle_time": 0, "error_code": int(code),
                                                      "unknown_state_filters": [], "transaction_states": []})


def _describe_transactions_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    rows = [] if body is None else [
        {"error_code": int(code), "transactional_id": str(t), "transaction_state": "", "transaction_timeout": 0,
         "transaction_start_time": _ms_time(-1), "producer_id": -1, "producer_epoch": -1, "topics": []}
        for t in body.transactional_ids]
    return kio_.response(DESCRIBE_TRANSACTIONS, version, {"throttle_time": 0, "transaction_states": rows})


def _list_offsets_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [
        {"name": t.name, "partitions": [
            {"partition_index": pt.partition_index, "error_code": int(code), "timestamp": -1, "offset": -1}
            for pt in t.partitions]} for t in body.topics]
    return kio_.response(LIST_OFFSETS, version, {"throttle_time": 0, "topics": topics})


@dataclass(frozen=True)
class BrokerRpc:
    """One API of the broker, declared once: its versions, its handler (a ``BrokerServer`` method, which
    returns the response body), its error answer (shaped like the request) and the ACL it needs
    ((resource type, name, operation) of the request, or None; or an operation on each of its topics)."""
    name: str
    versions: tuple[int, int]
    handle: Callable[[BrokerServer, kafka.Request], Any]
    error: Callable[[BrokerConfig, int, Errors, Any], Any]
    acl: Callable[[Any], tuple[str, str, str] | None] = lambda body: None
    # The operation each topic named in the request needs.  The answer is per partition, so the handler
    # checks it per topic (BrokerServer._topic_allowed) and answers a refused one TOPIC_AUTHORIZATION_FAILED.
    topic_acl: str | None = None


RPCS: dict[int, BrokerRpc] = {
    # topic_acl: PRODUCE_TOPIC_ACL (see there).
    PRODUCE: BrokerRpc("Produce", (3, 10), BrokerServer._produce, _produce_error, _produce_acl,
                       topic_acl=PRODUCE_TOPIC_ACL),
    FETCH: BrokerRpc("Fetch", (4, 12), BrokerServer._fetch, _fetch_error),
    LIST_OFFSETS: BrokerRpc("ListOffsets", (1, 7), BrokerServer._list_offsets, _list_offsets_error),
    METADATA: BrokerRpc("Metadata", (0, 12), BrokerServer._metadata, _metadata_error),
    FIND_COORDINATOR: BrokerRpc("FindCoordinator", (0, 6), BrokerServer._find_coordinator, _coordinator_error),
    kafka.API_VERSIONS: BrokerRpc("ApiVersions", (0, 3), BrokerServer._api_versions, _versions_error),
    INIT_PRODUCER_ID: BrokerRpc("InitProducerId", (0, 4), BrokerServer._init_producer_id, _init_error, _init_acl),
    DESCRIBE_PRODUCERS: BrokerRpc("DescribeProducers", (0, 0), BrokerServer._describe_producers,
                                  _describe_producers_error, topic_acl=a.DESCRIBE),
    # DESCRIBE on each transactional id, checked per id by the handlers (KIP-664).
    DESCRIBE_TRANSACTIONS: BrokerRpc("DescribeTransactions", (0, 0), BrokerServer._describe_transactions,
                                     _describe_transactions_error),
    LIST_TRANSACTIONS: BrokerRpc("ListTransactions", (0, 1), BrokerServer._list_transactions,
                                 _list_transactions_error),
    ADD_PARTITIONS_TO_TXN: BrokerRpc(
        "AddPartitionsToTxn", (0, 3), BrokerServer._add_partitions_to_txn, _add_partitions_error,
        lambda b: (a.TRANSACTIONAL_ID, str(b.v3_and_below_transactional_id), a.WRITE)),
    ADD_OFFSETS_TO_TXN: BrokerRpc("AddOffsetsToTxn", (0, 3), BrokerServer._add_offsets_to_txn, _add_offsets_error,
                                  lambda b: (a.TRANSACTIONAL_ID, str(b.transactional_id), a.WRITE)),
    END_TXN: BrokerRpc("EndTxn", (0, 3), BrokerServer._end_txn, _end_txn_error,
                       lambda b: (a.TRANSACTIONAL_ID, str(b.transactional_id), a.WRITE)),
}
SUPPORTED: dict[int, tuple[int, int]] = {k: r.versions for k, r in RPCS.items()}
NAMES: dict[int, str] = {k: r.name for k, r in RPCS.items()}
