"""The table of the broker's Kafka APIs (``RPCS``), declared once each: versions, handler, error answer and
ACLs, with the error bodies (a response carrying only an error code, shaped like the request).
``SUPPORTED`` and ``NAMES`` are derived from it."""
from __future__ import annotations

from typing import Any

from quorum.security import acl as acls
from records.wire import kafka
from records.wire.errors import Errors

from . import api_keys
from . import kafkaio as kio_
from .config import BrokerConfig
from .handlers import groups, metadata, partitions, producer_ids, topics, transactions
from .handlers.rpc import BrokerRpc
from .handlers.metadata import BATCHED_COORDINATOR_VERSION, NO_COORDINATOR, _coordinator_entries
from .handlers.transactions import _ms_time

# What Produce needs on each topic it writes to (``_topic_allowed``; TOPIC_AUTHORIZATION_FAILED for that topic's
# partitions), as in Kafka.  Producer IDs are also bound to their principal (broker/pid_binding.py).
PRODUCE_TOPIC_ACL: str | None = acls.WRITE


def _cluster_acl(operation: str) -> tuple[str, str, str]:
    return acls.CLUSTER, acls.CLUSTER_NAME, operation


def _init_acl(b: Any) -> tuple[str, str, str]:
    if b.transactional_id is None:
        return _cluster_acl(acls.IDEMPOTENT_WRITE)
    return acls.TRANSACTIONAL_ID, str(b.transactional_id), acls.WRITE


def _produce_acl(b: Any) -> tuple[str, str, str] | None:
    """WRITE on a transactional id the Produce names, whether its batches are transactional or not (as Kafka
    checks it); TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every partition otherwise."""
    if b.transactional_id is None:
        return None
    return acls.TRANSACTIONAL_ID, str(b.transactional_id), acls.WRITE


def _versions_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kafka.api_versions_body(version, code, SUPPORTED)


def _init_producer_id_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kio_.response(api_keys.INIT_PRODUCER_ID, version, {"throttle_time": 0, "error_code": int(code),
                                                              "producer_id": -1, "producer_epoch": -1})


def _coordinator_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    """``code`` for the whole request; from v4 for each of its keys, or, when the body could not be read,
    for the key "" (an answer with no entry would not carry the code)."""
    if version >= BATCHED_COORDINATOR_VERSION:
        keys = getattr(body, "coordinator_keys", None) or ("",)
        return _coordinator_entries(version, keys, code, code.name)
    return kio_.response(api_keys.FIND_COORDINATOR, version, {"throttle_time": 0, "error_code": int(code),
                                                              "error_message": code.name, **NO_COORDINATOR})


def _metadata_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None or body.topics is None else [
        {"error_code": int(code), "name": t.name or "", "topic_id": None, "partitions": []} for t in body.topics]
    return kio_.response(api_keys.METADATA, version, {"throttle_time": 0, "brokers": [], "topics": topics,
                                                      "cluster_id": cfg.cluster_id, "controller_id": -1})


def _produce_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [
        {"name": t.name, "partition_responses": [
            {"index": pd.index, "error_code": int(code), "base_offset": -1, "log_append_time": None,
             "log_start_offset": -1, "record_errors": [], "error_message": code.name}
            for pd in t.partition_data]} for t in body.topic_data]
    return kio_.response(api_keys.PRODUCE, version, {"responses": topics, "throttle_time": 0})


def _fetch_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [
        {"topic": t.topic, "partitions": [
            {"partition_index": pt.partition, "error_code": int(code), "high_watermark": -1,
             "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
             "records": b""} for pt in t.partitions]} for t in body.topics]  # empty, never null (as Kafka)
    return kio_.response(api_keys.FETCH, version, {"throttle_time": 0, "error_code": int(code), "session_id": 0,
                                                   "responses": topics})


def _add_partitions_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [
        {"name": t.name, "results_by_partition": [
            {"partition_index": i, "partition_error_code": int(code)} for i in t.partitions]}
        for t in body.v3_and_below_topics]
    return kio_.response(api_keys.ADD_PARTITIONS_TO_TXN, version, {"throttle_time": 0,
                                                                   "results_by_topic_v3_and_below": topics})


def _end_txn_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kio_.response(api_keys.END_TXN, version, {"throttle_time": 0, "error_code": int(code)})


def _add_offsets_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kio_.response(api_keys.ADD_OFFSETS_TO_TXN, version, {"throttle_time": 0, "error_code": int(code)})


def _describe_producers_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [
        {"name": t.name, "partitions": [
            {"partition_index": i, "error_code": int(code), "error_message": code.name, "active_producers": []}
            for i in t.partition_indexes]} for t in body.topics]
    return kio_.response(api_keys.DESCRIBE_PRODUCERS, version, {"throttle_time": 0, "topics": topics})


def _list_transactions_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    return kio_.response(api_keys.LIST_TRANSACTIONS, version, {"throttle_time": 0, "error_code": int(code),
                                                               "unknown_state_filters": [], "transaction_states": []})


def _describe_transactions_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    rows = [] if body is None else [
        {"error_code": int(code), "transactional_id": str(t), "transaction_state": "", "transaction_timeout": 0,
         "transaction_start_time": _ms_time(-1), "producer_id": -1, "producer_epoch": -1, "topics": []}
        for t in body.transactional_ids]
    return kio_.response(api_keys.DESCRIBE_TRANSACTIONS, version, {"throttle_time": 0, "transaction_states": rows})


def _list_offsets_error(cfg: BrokerConfig, version: int, code: Errors, body: Any) -> Any:
    topics = [] if body is None else [
        {"name": t.name, "partitions": [
            {"partition_index": pt.partition_index, "error_code": int(code), "timestamp": -1, "offset": -1}
            for pt in t.partitions]} for t in body.topics]
    return kio_.response(api_keys.LIST_OFFSETS, version, {"throttle_time": 0, "topics": topics})


RPCS: dict[int, BrokerRpc] = {
    # topic_acl: PRODUCE_TOPIC_ACL (see there).
    api_keys.PRODUCE: BrokerRpc("Produce", (3, 10), partitions.produce, _produce_error, _produce_acl,
                                topic_acl=PRODUCE_TOPIC_ACL),
    api_keys.FETCH: BrokerRpc("Fetch", (4, 12), partitions.fetch, _fetch_error),
    api_keys.LIST_OFFSETS: BrokerRpc("ListOffsets", (1, 7), partitions.list_offsets, _list_offsets_error),
    api_keys.METADATA: BrokerRpc("Metadata", (0, 12), metadata.metadata, _metadata_error),
    api_keys.FIND_COORDINATOR: BrokerRpc("FindCoordinator", (0, 6), metadata.find_coordinator, _coordinator_error),
    kafka.API_VERSIONS: BrokerRpc("ApiVersions", (0, 3), metadata.api_versions, _versions_error),
    api_keys.INIT_PRODUCER_ID: BrokerRpc("InitProducerId", (0, 4), producer_ids.init_producer_id,
                                         _init_producer_id_error, _init_acl),
    api_keys.DESCRIBE_PRODUCERS: BrokerRpc("DescribeProducers", (0, 0), partitions.describe_producers,
                                           _describe_producers_error, topic_acl=acls.DESCRIBE),
    # DESCRIBE on each transactional id, checked per id by the handlers (KIP-664).
    api_keys.DESCRIBE_TRANSACTIONS: BrokerRpc("DescribeTransactions", (0, 0), transactions.describe_transactions,
                                              _describe_transactions_error),
    api_keys.LIST_TRANSACTIONS: BrokerRpc("ListTransactions", (0, 1), transactions.list_transactions,
                                          _list_transactions_error),
    api_keys.ADD_PARTITIONS_TO_TXN: BrokerRpc(
        "AddPartitionsToTxn", (0, 3), transactions.add_partitions_to_txn, _add_partitions_error,
        lambda b: (acls.TRANSACTIONAL_ID, str(b.v3_and_below_transactional_id), acls.WRITE)),
    api_keys.ADD_OFFSETS_TO_TXN: BrokerRpc(
        "AddOffsetsToTxn", (0, 3), transactions.add_offsets_to_txn, _add_offsets_error,
        lambda b: (acls.TRANSACTIONAL_ID, str(b.transactional_id), acls.WRITE)),
    api_keys.END_TXN: BrokerRpc("EndTxn", (0, 3), transactions.end_txn, _end_txn_error,
                                lambda b: (acls.TRANSACTIONAL_ID, str(b.transactional_id), acls.WRITE)),
    **topics.RPCS,  # topic administration
    **groups.RPCS,  # consumer groups and their offsets
}
SUPPORTED: dict[int, tuple[int, int]] = {k: r.versions for k, r in RPCS.items()}
NAMES: dict[int, str] = {k: r.name for k, r in RPCS.items()}
