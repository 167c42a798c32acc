"""Produce, Fetch, ListOffsets and DescribeProducers: the APIs that write and read partitions."""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from quorum import failpoints
from quorum.security import acl as acls
from records.wire import kafka
from records.wire.errors import Errors, PidQuorumError, UnknownTopicOrPartitionError

from .. import kafkaio as kio_
from ..api_keys import DESCRIBE_PRODUCERS, FETCH, LIST_OFFSETS, PRODUCE
from ..network import _DropConnection
from ..partition import Partition
from ..pid_binding import batch_producers
from ..quota import batch_producer_ids
from ..recordbatch import TRANSACTIONAL_BIT, parse_header
from .context import BrokerContext
from .transactions import coordinator

# The front end logs under one name, whichever of its modules writes the line (log settings name it).
log = logging.getLogger("broker.frontend")

READ_COMMITTED = 1
LATEST_TIMESTAMP, EARLIEST_TIMESTAMP = -1, -2


# ------------------------------------------------------------ Produce
def _partition(server: BrokerContext, topic: str, index: int, create: bool) -> Partition:
    """The partition; INVALID_TOPIC_EXCEPTION / UNKNOWN_TOPIC_OR_PARTITION errors carry their code."""
    if not create and server.storage.topic(topic) is None:
        raise UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
    return server.storage.partition(topic, index)


def _answerable_partition(server: BrokerContext, topic: str, index: int, r: dict, *, create: bool = False,
                          with_message: bool = False) -> Partition | None:
    """The partition, or None with its error code (and message, if ``with_message``) put in its answer ``r``."""
    try:
        return _partition(server, topic, index, create)
    except PidQuorumError as e:
        r["error_code"] = int(e.code)
        if with_message:
            r["error_message"] = e.message
        return None


async def produce(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    acks = int(b.acks)
    server._produce_requests += 1
    loop = asyncio.get_running_loop()
    responses = []
    appended: list[tuple[str, int]] = []
    refused = _check_producer_id_quota(server, req)
    bindings = server.bindings
    if bindings is not None:
        now_ms, checked = bindings.now_ms(), {}
    for t in b.topic_data:
        parts = []
        allowed = server._topic_allowed(req, str(t.name))
        for pd in t.partition_data:
            r = {"index": pd.index, "error_code": 0, "base_offset": -1, "log_append_time": None,
                 "log_start_offset": -1, "record_errors": [], "error_message": None}
            parts.append(r)
            if acks not in (0, 1, -1):
                r["error_code"], r["error_message"] = int(Errors.INVALID_REQUIRED_ACKS), f"acks={acks}"
                continue
            if not allowed:
                r["error_code"] = int(Errors.TOPIC_AUTHORIZATION_FAILED)
                r["error_message"] = f"{req.principal} is not allowed {server._topic_acl(req)} on this topic"
                continue
            part = _answerable_partition(server, t.name, int(pd.index), r, create=server.cfg.auto_create_topics,
                                         with_message=True)
            if part is None:
                continue
            if pd.records is None:
                r["error_code"], r["error_message"] = int(Errors.INVALID_RECORD), "no records"
                continue
            if bindings is not None:
                refusal = _binding_refusal(server, req, pd.records, now_ms, checked)
                if refusal is not None:
                    r["error_code"], r["error_message"] = int(refusal[0]), refusal[1]
                    continue
            throttled = max((refused.get(pid, 0) for pid in batch_producer_ids(pd.records)),
                            default=0) if refused else 0
            if throttled:
                # KIP-936: a producer ID this principal has not produced with lately, over its
                # producer_ids_rate: nothing is appended; retriable, with the throttle time.
                server.counters["quota_throttled_batches"] += 1
                r["error_code"] = int(Errors.THROTTLING_QUOTA_EXCEEDED)
                r["error_message"] = (f"{req.principal} is over its producer_ids_rate for new producer IDs; "
                                      f"retry in {throttled} ms")
                continue
            records = bytes(pd.records)
            token, code, why = await _verify_transactional(server, req, t.name, int(pd.index), part, records)
            if code != Errors.NONE:
                r["error_code"], r["error_message"] = int(code), why
                server._note_error(code)
                log.info("produce %s-%d: %s: %s", t.name, pd.index, code.name, why)
                continue
            try:
                res = await loop.run_in_executor(server._io, functools.partial(part.append, records,
                                                                             transactional_ok=token))
            except PidQuorumError as e:  # the topic was deleted meanwhile (PartitionClosedError)
                r["error_code"], r["error_message"] = int(e.code), e.message
                continue
            r["error_code"] = int(res.error)
            r["error_message"] = res.message or None
            r["base_offset"] = res.base_offset
            r["log_start_offset"] = res.log_start_offset
            if res.error == Errors.NONE:
                if res.duplicate:
                    server.counters["duplicates"] += 1
                else:
                    appended.append((t.name, int(pd.index)))
                    server.counters["produce_batches"] += 1
            else:
                server._note_error(res.error)
                log.info("produce %s-%d: %s: %s", t.name, pd.index, res.error.name, res.message)
        responses.append({"name": t.name, "partition_responses": parts})
    if appended:
        for key in appended:
            server._waiters.appended(key)
        if failpoints.hit("broker.produce.appended", server._produce_requests):
            raise _DropConnection()
    if acks == 0:
        return None
    throttle_ms = max(refused.values(), default=0) if refused else 0
    return kio_.response(PRODUCE, v, {"responses": responses, "throttle_time": throttle_ms})


def _binding_refusal(server: BrokerContext, req: kafka.Request, records: Any, now_ms: int,
                     checked: dict[tuple[int, bool], tuple[Errors, str] | None]) -> tuple[Errors, str] | None:
    """SASL on: None when every producer ID of the partition's batches is the principal's to use
    (``ProducerBindings.check``: handed to it, or its transactional id named), else the answer for
    the partition.  Each (producer ID, transactional) is checked once per request."""
    tid = req.body.transactional_id
    for key in batch_producers(records):
        if key in checked:
            out = checked[key]
        else:
            out = checked[key] = server.bindings.check(key[0], req.principal, tid, key[1], now_ms)
            if out is not None:
                code, why = out
                server.counters["producer_id_refused"] += 1
                server.counters["authorization_failures"] += 1
                server._binding_log(logging.INFO, "Produce from %s (transactional id %r): %s: %s", req.principal,
                                  None if tid is None else str(tid)[:200], code.name, why)
        if out is not None:
            return out
    return None


def _check_producer_id_quota(server: BrokerContext, req: kafka.Request) -> dict[int, int]:
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
        wait_ms = server.quotas.check(req.principal, pid, now)
        if wait_ms:
            out[pid] = wait_ms
    if out:
        log.debug("%s: %d new producer ID(s) over the producer_ids_rate quota; throttled %d ms", req.principal,
                 len(out), max(out.values()))
    return out


async def _verify_transactional(server: BrokerContext, req: kafka.Request, topic: str, index: int, part: Partition,
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
    if server.acls is not None and not server.acls.authorize(req.principal, acls.TRANSACTIONAL_ID, str(tid), acls.WRITE,
                                                         req.host):
        server.counters["authorization_failures"] += 1
        return None, Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, \
            f"{req.principal} is not allowed WRITE on transactional id {str(tid)[:200]!r}"
    token = part.expect_transaction(h.producer_id, h.producer_epoch)
    try:
        await coordinator(server).verify(str(tid), h.producer_id, h.producer_epoch, topic, index)
    except PidQuorumError as e:
        code = e.code
        if code == Errors.PRODUCER_FENCED:
            code = Errors.INVALID_PRODUCER_EPOCH  # what Produce answers a fenced producer
        elif code == Errors.CONCURRENT_TRANSACTIONS:
            code = Errors.INVALID_TXN_STATE  # a late batch of a transaction being ended
        return None, code, e.message
    if server.bindings is not None and server.bindings.owner(h.producer_id) is None:
        # The quorum says the id holds this producer ID (a producer from before a restart or an upgrade):
        # bound from now on, so a batch with it that does not name the id is refused here.
        server.bindings.learn(h.producer_id, str(tid))
    return token, Errors.NONE, ""


# ------------------------------------------------------------ Fetch
async def fetch(server: BrokerContext, req: kafka.Request) -> Any:
    """Answered once min_bytes are there, at max_wait (at most 30 s), or at once with an error.
    While it waits, only an append to one of its partitions wakes it (``AppendWaiters``): it
    watches them before each read, so an append during the read is not missed."""
    b, v = req.body, req.api_version
    deadline = time.monotonic() + min(kio_.ms(b.max_wait), 30_000) / 1000
    min_bytes = max(int(b.min_bytes), 0)
    keys = frozenset((t.topic, int(pt.partition)) for t in b.topics for pt in t.partitions)
    while True:
        waiter = server._waiters.watch(keys)
        try:
            responses, total = await _fetch_once(server, b)
            remaining = deadline - time.monotonic()
            if total >= max(min_bytes, 1) or remaining <= 0 or _fetch_has_error(responses):
                break
            server.counters["fetch_waits"] += 1
            await asyncio.wait((waiter,), timeout=remaining)
            if waiter.done():
                server.counters["fetch_wakeups"] += 1
        finally:
            server._waiters.forget(waiter, keys)
    return kio_.response(FETCH, v, {"throttle_time": 0, "error_code": 0, "session_id": 0,
                                    "responses": responses})


def _fetch_has_error(responses: list[dict]) -> bool:
    return any(pt["error_code"] for t in responses for pt in t["partitions"])


async def _fetch_once(server: BrokerContext, b: Any) -> tuple[list[dict], int]:
    loop = asyncio.get_running_loop()
    budget = int(b.max_bytes) if getattr(b, "max_bytes", None) is not None else 2**31 - 1
    committed = int(getattr(b, "isolation_level", 0)) == READ_COMMITTED
    total = 0
    responses = []
    for t in b.topics:
        parts = []
        for pt in t.partitions:
            # records: empty, never null, even with an error (as Kafka: librdkafka drops a whole response
            # that has a null one, so a consumer never resets an out-of-range offset)
            r = {"partition_index": pt.partition, "error_code": 0, "high_watermark": -1,
                 "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                 "records": b""}
            parts.append(r)
            part = _answerable_partition(server, t.topic, int(pt.partition), r)
            if part is None:
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
                    data, lso, aborted = await loop.run_in_executor(server._io, _read_committed, part, offset,
                                                                    max(limit, 1))
                    r["last_stable_offset"] = lso
                    r["aborted_transactions"] = aborted
                else:
                    data = await loop.run_in_executor(server._io, part.read, offset, max(limit, 1))
            except PidQuorumError as e:
                r["error_code"] = int(e.code)
                continue
            if len(data) > limit and total > 0:
                # KIP-74: only the first partition with data may go over the request's (or its own) limit, by
                # its first batch; a later one whose first batch does not fit gives nothing this time.  A
                # client rejects a response over its receive.message.max.bytes and fetches it again, for ever.
                data = b""
                if committed:
                    r["aborted_transactions"] = []
            r["records"] = data
            total += len(data)
            budget -= len(data)
        responses.append({"topic": t.topic, "partitions": parts})
    return responses, total


# ------------------------------------------------------------ ListOffsets
async def list_offsets(server: BrokerContext, req: kafka.Request) -> Any:
    b, v = req.body, req.api_version
    topics = []
    for t in b.topics:
        parts = []
        for pt in t.partitions:
            r = {"partition_index": pt.partition_index, "error_code": 0, "timestamp": -1, "offset": -1,
                 "leader_epoch": 0}
            parts.append(r)
            part = _answerable_partition(server, t.name, int(pt.partition_index), r)
            if part is None:
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
async def describe_producers(server: BrokerContext, req: kafka.Request) -> Any:
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
    limit = server.cfg.describe_producers_limit
    topics = []
    for t in req.body.topics:
        parts = []
        allowed = server._topic_allowed(req, str(t.name))
        for index in t.partition_indexes:
            r = {"partition_index": index, "error_code": 0, "error_message": None, "active_producers": []}
            parts.append(r)
            if not allowed:
                r["error_code"] = int(Errors.TOPIC_AUTHORIZATION_FAILED)
                r["error_message"] = f"{req.principal} is not allowed {server._topic_acl(req)} on this topic"
                continue
            part = _answerable_partition(server, t.name, int(index), r, with_message=True)
            if part is None:
                continue
            rows, total = await loop.run_in_executor(server._io, part.describe_producers, limit)
            r["active_producers"] = [
                {"producer_id": pid, "producer_epoch": epoch, "last_sequence": last_seq,
                 "last_timestamp": last_ts, "coordinator_epoch": -1, "current_txn_start_offset": txn_start}
                for pid, epoch, last_seq, last_ts, txn_start in rows]
            if total > len(rows):
                server.counters["describe_producers_truncated"] += 1
                r["error_message"] = (f"{len(rows)} of {total} producers shown, the lowest producer ids; "
                                      f"describe_producers_limit")
        topics.append({"name": t.name, "partitions": parts})
    return kio_.response(DESCRIBE_PRODUCERS, req.api_version, {"throttle_time": 0, "topics": topics})


def _read_committed(part: Partition, offset: int, max_bytes: int) -> tuple[bytes, int, list[dict] | None]:
    """A read_committed Fetch of one partition (in an I/O thread): the batches below the last stable offset,
    that offset, and the aborted transactions the data holds (the client drops their batches)."""
    lso = part.last_stable_offset
    data = part.read(offset, max_bytes, max_offset=lso)
    if not data:
        return data, lso, None
    return data, lso, [{"producer_id": pid, "first_offset": first}
                       for pid, first in part.aborted_transactions(offset, lso)]
