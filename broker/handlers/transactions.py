"""The transaction APIs: AddPartitionsToTxn, AddOffsetsToTxn and EndTxn, and the operators' reads
(KIP-664) ListTransactions and DescribeTransactions."""
from __future__ import annotations

import datetime
import logging
import time
from typing import Any, Callable

from quorum.security import acl as acls
from records.wire import kafka
from records.wire.errors import CoordinatorLoadInProgressError, Errors, PidQuorumError

from .. import kafkaio as kio_
from ..api_keys import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    LIST_TRANSACTIONS,
)
from ..groups.state import OFFSETS_TOPIC, shard_of
from ..txn_coordinator import TxnCoordinator
from .context import BrokerContext

# The front end logs under one name, whichever of its modules writes the line (log settings name it).
log = logging.getLogger("broker.frontend")

# Kafka's transaction states (TransactionState.java): what ListTransactions' state filters may name.  The
# quorum's transactions are in the first six; Dead and PrepareEpochFence are states no id here is ever in.
TXN_STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead",
              "PrepareEpochFence")


def _ms_time(ms: int) -> datetime.datetime:
    """A Kafka timestamp field (kio's datetime_i64) of ``ms`` since the epoch (-1: none, as Kafka sends it)."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)


def _coordinator_code(e: PidQuorumError) -> Errors:
    """What an operator's read answers when the quorum could not be read: COORDINATOR_NOT_AVAILABLE (the
    client may retry), COORDINATOR_LOAD_IN_PROGRESS while the broker starts, else the error itself."""
    if e.code == Errors.COORDINATOR_LOAD_IN_PROGRESS or not e.retriable:
        return e.code
    return Errors.COORDINATOR_NOT_AVAILABLE


# ------------------------------------------------------------ transactions
def coordinator(server: BrokerContext) -> TxnCoordinator:
    if server.txn is None:
        raise CoordinatorLoadInProgressError("the broker is starting")
    return server.txn


async def add_partitions_to_txn(server: BrokerContext, req: kafka.Request) -> Any:
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
        info = server.storage.topic(str(t.name))
        for i in t.partitions:
            key = (str(t.name), int(i))
            wanted.append(key)
            if info is None or not 0 <= key[1] < info.partitions:
                unknown.add(key)
    if unknown:
        log.info("AddPartitionsToTxn %r: %d unknown partition(s), e.g. %s-%d", tid[:200], len(unknown),
                 *sorted(unknown)[0])
        return _add_partitions_answer(v, b, lambda key: Errors.UNKNOWN_TOPIC_OR_PARTITION
                                           if key in unknown else Errors.OPERATION_NOT_ATTEMPTED)
    await coordinator(server).add_partitions(tid, pid, epoch, wanted)
    return _add_partitions_answer(v, b, lambda key: Errors.NONE)


def _add_partitions_answer(version: int, body: Any, code_of: Callable[[tuple[str, int]], Errors]) -> Any:
    topics = [{"name": t.name, "results_by_partition": [
        {"partition_index": i, "partition_error_code": int(code_of((str(t.name), int(i))))}
        for i in t.partitions]} for t in body.v3_and_below_topics]
    return kio_.response(ADD_PARTITIONS_TO_TXN, version, {"throttle_time": 0,
                                                          "results_by_topic_v3_and_below": topics})


async def end_txn(server: BrokerContext, req: kafka.Request) -> Any:
    """EndTxn v0-3: commit or abort, decided in the quorum; answered once the markers are written (or,
    if they cannot be now, once the outcome is decided: the sweeper completes it)."""
    b = req.body
    await coordinator(server).end(str(b.transactional_id), int(b.producer_id), int(b.producer_epoch),
                                  bool(b.committed))
    return kio_.response(END_TXN, req.api_version, {"throttle_time": 0, "error_code": 0})


async def add_offsets_to_txn(server: BrokerContext, req: kafka.Request) -> Any:
    """AddOffsetsToTxn v0-3 (sendOffsetsToTransaction's first step): the group's offsets shard,
    "__consumer_offsets"-<shard> as Kafka names it, joins the producer's transaction like a partition, so
    that the transaction's marker commits or drops the offsets TxnOffsetCommit then writes (docs/
    consumer-groups.md).  An empty group id is INVALID_GROUP_ID; a fenced producer PRODUCER_FENCED
    (INVALID_PRODUCER_EPOCH before v3)."""
    b, v = req.body, req.api_version
    if not b.group_id:
        return kio_.response(ADD_OFFSETS_TO_TXN, v, {"throttle_time": 0, "error_code": int(Errors.INVALID_GROUP_ID)})
    if server.acls is not None and not server.acls.authorize(req.principal, acls.GROUP, str(b.group_id), acls.READ,
                                                             req.host):
        server.counters["authorization_failures"] += 1  # WRITE on the transactional id is the table's check
        log.info("AddOffsetsToTxn: %s may not READ group %r", req.principal, str(b.group_id)[:200])
        return kio_.response(ADD_OFFSETS_TO_TXN, v, {"throttle_time": 0,
                                                     "error_code": int(Errors.GROUP_AUTHORIZATION_FAILED)})
    try:
        await coordinator(server).add_partitions(str(b.transactional_id), int(b.producer_id), int(b.producer_epoch),
                                                 [(OFFSETS_TOPIC, shard_of(str(b.group_id)))])
    except PidQuorumError as e:
        code = Errors.INVALID_PRODUCER_EPOCH if e.code == Errors.PRODUCER_FENCED and v < 3 else e.code
        log.info("AddOffsetsToTxn %r for group %r: %s", str(b.transactional_id)[:200], str(b.group_id)[:200],
                 e.message)
        return kio_.response(ADD_OFFSETS_TO_TXN, v, {"throttle_time": 0, "error_code": int(code)})
    return kio_.response(ADD_OFFSETS_TO_TXN, v, {"throttle_time": 0, "error_code": 0})


# ------------------------------------------------------------ KIP-664: ListTransactions, DescribeTransactions
def _may_describe(server: BrokerContext, req: kafka.Request, tid: str) -> bool:
    """DESCRIBE on the transactional id (or an operation that implies it); always with SASL off."""
    if server.acls is None or server.acls.authorize(req.principal, acls.TRANSACTIONAL_ID, tid, acls.DESCRIBE, req.host):
        return True
    server.counters["authorization_failures"] += 1
    return False


async def list_transactions(server: BrokerContext, req: kafka.Request) -> Any:
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
        txns = await coordinator(server).list_transactions(lambda tid: _may_describe(server, req, tid))
    except PidQuorumError as e:
        log.info("ListTransactions: %s (answered %s)", e.message, _coordinator_code(e).name)
        return server._error_body(LIST_TRANSACTIONS, req.api_version, _coordinator_code(e), b)
    now_ms = int(time.time() * 1000)
    rows = [{"transactional_id": t["transactional_id"], "producer_id": t["producer_id"],
             "transaction_state": t["state"]} for t in txns
            if (not states or t["state"] in states) and (not pids or t["producer_id"] in pids)
            and (duration < 0 or now_ms - t["start_time_ms"] > duration)]
    return kio_.response(LIST_TRANSACTIONS, req.api_version, {
        "throttle_time": 0, "error_code": 0, "unknown_state_filters": unknown, "transaction_states": rows})


async def describe_transactions(server: BrokerContext, req: kafka.Request) -> Any:
    """DescribeTransactions v0 (KIP-664): each id's transaction as the quorum leader has it (any id,
    not only those this broker has served: every broker coordinates every id).  Per id, as Kafka
    answers: TRANSACTIONAL_ID_AUTHORIZATION_FAILED without DESCRIBE on it, TRANSACTIONAL_ID_NOT_FOUND
    for an id the quorum does not know, COORDINATOR_NOT_AVAILABLE when the quorum cannot be read
    (COORDINATOR_LOAD_IN_PROGRESS while the broker starts)."""
    tids = [str(t) for t in req.body.transactional_ids]
    allowed = [t for t in tids if _may_describe(server, req, t)]
    found = dict(zip(allowed, await coordinator(server).describe_each(allowed)))
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
