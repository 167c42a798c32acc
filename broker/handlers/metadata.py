"""ApiVersions, Metadata and FindCoordinator: what a client asks before it produces."""
from __future__ import annotations

import logging
from typing import Any

from records.wire import kafka
from records.wire.errors import Errors, PidQuorumError

from .. import kafkaio as kio_
from ..api_keys import FIND_COORDINATOR, METADATA
from ..storage import RESERVED_TOPICS
from .context import BrokerContext

# The front end logs under one name, whichever of its modules writes the line (log settings name it).
log = logging.getLogger("broker.frontend")

# FindCoordinator (``find_coordinator``): key types, the first batched version (KIP-699) and
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


def api_versions(server: BrokerContext, req: kafka.Request) -> Any:
    return kafka.api_versions_body(req.api_version, Errors.NONE, server.api_table)


# ------------------------------------------------------------ Metadata
def _topic_metadata(server: BrokerContext, name: str | None, create: bool) -> dict:
    try:
        topic = server.storage.ensure_topic(name) if create else server.storage.topic(name)
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
    me = server.cfg.broker_id
    return {"error_code": 0, "name": name, "topic_id": topic.topic_id, "is_internal": name in RESERVED_TOPICS,
            "partitions": [{"error_code": 0, "partition_index": i, "leader_id": me, "leader_epoch": 0,
                            "replica_nodes": [me], "isr_nodes": [me], "offline_replicas": []}
                           for i in range(topic.partitions)],
            "topic_authorized_operations": -2147483648}


def metadata(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    if b.topics is None or (v == 0 and not b.topics):
        names, create = [t.name for t in server.storage.topics()], False
    else:
        names = [t.name for t in b.topics]
        create = server.cfg.auto_create_topics and getattr(b, "allow_auto_topic_creation", True)
    host, port = server.cfg.advertised_address
    return kio_.response(METADATA, v, {
        "throttle_time": 0,
        "brokers": [{"node_id": server.cfg.broker_id, "host": host, "port": port, "rack": None}],
        "cluster_id": server.cfg.cluster_id,
        "controller_id": server.cfg.broker_id,
        "topics": [_topic_metadata(server, n, create) for n in names],
        "cluster_authorized_operations": -2147483648,
    })


# ------------------------------------------------------------ FindCoordinator
def find_coordinator(server: BrokerContext, req: kafka.Request) -> Any:
    """Transactional ids (key type 1) and consumer groups (key type 0): this broker.  Share-group state (key
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

    Consumer groups (key type 0) are coordinated by the broker a client asks (``broker.groups``): each
    broker keeps the groups and offsets of the clients that use it, next to the partitions those
    offsets point into (docs/consumer-groups.md)."""
    b, v = req.body, req.api_version
    key_type = int(getattr(b, "key_type", COORDINATOR_GROUP))  # v0 has no key type: a group
    host, port = server.cfg.advertised_address
    me = {"node_id": server.cfg.broker_id, "host": host, "port": port}
    if v < BATCHED_COORDINATOR_VERSION:
        code, why = _coordinator_of(server, v, key_type, str(b.key))
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
        code, why = _coordinator_of(server, v, key_type, key)
        if code == Errors.INVALID_REQUEST and invalid is None:
            invalid = why
        coordinators.append({"key": key, "error_code": int(code), "error_message": why,
                             **(me if code == Errors.NONE else NO_COORDINATOR)})
    if invalid is not None:
        log.info("FindCoordinator v%d (%d keys): %s (answered INVALID_REQUEST)", v, len(keys), invalid)
    return kio_.response(FIND_COORDINATOR, v, {"throttle_time": 0, "coordinators": coordinators})


def _coordinator_of(server: BrokerContext, version: int, key_type: int, key: str) -> tuple[Errors, str | None]:
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
    # Transactional state lives in the quorum: every broker coordinates every transactional id.  A group
    # lives on the broker its clients use.
    return Errors.NONE, None
