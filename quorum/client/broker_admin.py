"""A small Kafka admin client for one broker: the reads and the fencing ``pidctl txn`` needs (KIP-664).

One connection to the broker asked (TLS and SASL as pidctl's global options say, ``quorum.security.client``), one
request at a time; each method sends one Kafka request and returns plain dicts, the way the broker
answered them (per-entry error codes included, as ``code`` and its ``error`` name).  A broker
that cannot be reached or does not answer within the deadline raises ``BrokerUnavailable``; an answer
that refuses the whole request raises ``BrokerRefused`` with Kafka's code.
"""
import asyncio
import dataclasses
import datetime
from collections import defaultdict
from typing import Any, ClassVar

from kio.schema.describe_producers.v0.request import TopicRequest
from kio.schema.describe_transactions.v0 import response as describe_txn
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32, i32Timedelta, i64

from quorum.security.client import authenticate
from records.wire import kafka
from records.wire.errors import Errors, PidQuorumError

from .connection import os_reason  # the same few words for an OSError as the quorum client

API_VERSIONS, METADATA, INIT_PRODUCER_ID, DESCRIBE_PRODUCERS = 18, 3, 22, 61
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66


def error_name(code: int) -> str:
    named = Errors.of(code)
    return named.name if int(named) == code else f"error {code}"


class BrokerAdminError(Exception):
    def __init__(self, message: str, code: int = -1):
        super().__init__(message)
        self.message, self.code = message, code


class BrokerUnavailable(BrokerAdminError):
    """The broker could not be reached, closed the connection, or did not answer in time."""


class BrokerRefused(BrokerAdminError):
    """The broker answered the request with an error (``code``, Kafka's)."""


# (This module has no ``from __future__ import annotations``: kio reads these classes' field types.)
# DescribeTransactionsResponse v0 as kio has it, but with the start time read as the int64 it is on the wire:
# Kafka sends -1 for a transaction not begun (state Empty), which kio's timestamp reader refuses.
class _DescribeTransactionsV0:
    """What kio reads of an entity of DescribeTransactions v0 besides its fields."""
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = True
    __api_key__: ClassVar[i16] = i16(DESCRIBE_TRANSACTIONS)
    __header_schema__: ClassVar[type] = describe_txn.ResponseHeader


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _TransactionState(_DescribeTransactionsV0):
    __type__: ClassVar = EntityType.nested
    error_code: ErrorCode = dataclasses.field(metadata={"kafka_type": "error_code"})
    transactional_id: str = dataclasses.field(metadata={"kafka_type": "string"})
    transaction_state: str = dataclasses.field(metadata={"kafka_type": "string"})
    transaction_timeout: i32Timedelta = dataclasses.field(metadata={"kafka_type": "timedelta_i32"})
    transaction_start_time: i64 = dataclasses.field(metadata={"kafka_type": "int64"})
    producer_id: i64 = dataclasses.field(metadata={"kafka_type": "int64"})
    producer_epoch: i16 = dataclasses.field(metadata={"kafka_type": "int16"})
    topics: tuple[describe_txn.TopicData, ...]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _DescribeTransactionsResponse(_DescribeTransactionsV0):
    __type__: ClassVar = EntityType.response
    throttle_time: i32Timedelta = dataclasses.field(metadata={"kafka_type": "timedelta_i32"})
    transaction_states: tuple[_TransactionState, ...]


_RESPONSES = {(DESCRIBE_TRANSACTIONS, 0): _DescribeTransactionsResponse}


def _parse(frame: bytes, api_key: int, version: int) -> tuple[int, Any]:
    cls = _RESPONSES.get((api_key, version))
    if cls is None:
        return kafka.parse_response(frame, api_key, version)
    header, off = entity_reader(cls.__header_schema__)(frame, 0)
    return header.correlation_id, entity_reader(cls)(frame, off)[0]


def _ms(value: Any) -> int:
    """Milliseconds of a kio duration or timestamp field (an int already for our own int64 fields)."""
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


class BrokerAdmin:
    def __init__(self, address: str, timeout: float, security: Any = None, client_id: str = "pidctl"):
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--broker {address!r} is not HOST:PORT")
        self.address, self.timeout, self.security, self.client_id = address, timeout, security, client_id
        self._host, self._port = host, int(port)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation = 0

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def _connect(self) -> None:
        sec = self.security
        if sec is None or sec.protocol == "PLAINTEXT":
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
            return
        ctx = sec.ssl_context()
        self._reader, self._writer = await asyncio.open_connection(self._host, self._port, ssl=ctx,
                                                                   server_hostname=self._host if ctx else None)
        if sec.sasl:
            await authenticate(self._reader, self._writer, sec, self.client_id, self.address)

    async def _exchange(self, body: Any) -> Any:
        if self._writer is None:
            await self._connect()
        assert self._reader is not None and self._writer is not None
        self._correlation += 1
        self._writer.write(kafka.encode_request(body, self._correlation, self.client_id))
        await self._writer.drain()
        size = kafka.SIZE.unpack(await self._reader.readexactly(4))[0]
        corr, answer = _parse(await self._reader.readexactly(size), body.__api_key__, body.__version__)
        if corr != self._correlation:
            raise ConnectionError(f"answer {corr} to request {self._correlation}")
        return answer

    async def _call(self, api_key: int, version: int, **fields: Any) -> Any:
        body = kafka.request_entity(api_key, version, **fields)
        try:
            return await asyncio.wait_for(self._exchange(body), self.timeout)
        except asyncio.TimeoutError:
            await self.close()
            raise BrokerUnavailable(f"broker {self.address}: no answer within {self.timeout:g}s") from None
        except (OSError, asyncio.IncompleteReadError, kafka.FrameError) as e:
            await self.close()
            why = ("closed the connection before answering" if isinstance(e, asyncio.IncompleteReadError)
                   else str(e) or type(e).__name__ if isinstance(e, kafka.FrameError) else os_reason(e))
            raise BrokerUnavailable(f"broker {self.address}: {why}") from None
        except PidQuorumError as e:  # SASL refused us
            await self.close()
            raise BrokerRefused(f"broker {self.address}: {e.message}", int(e.code)) from None

    async def api_versions(self) -> dict[int, tuple[int, int]]:
        r = await self._call(API_VERSIONS, 3, client_software_name="pidctl", client_software_version="1")
        if int(r.error_code) != 0:
            raise BrokerRefused(f"ApiVersions: {error_name(int(r.error_code))}", int(r.error_code))
        return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in r.api_keys}

    async def topics(self) -> dict[str, int]:
        """Every topic of the broker and its partition count (Metadata)."""
        r = await self._call(METADATA, 9, topics=None, allow_auto_topic_creation=False,
                             include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
        return {str(t.name): len(t.partitions) for t in r.topics if int(t.error_code) == 0}

    async def list_transactions(self, states: list[str] = (), producer_ids: list[int] = (),
                                duration_ms: int = -1) -> tuple[list[dict], list[str]]:
        """ListTransactions: ([{transactional_id, producer_id, state}], the state filters it did not know)."""
        fields: dict[str, Any] = {"state_filters": tuple(states), "producer_id_filters": tuple(producer_ids)}
        version = 0
        if duration_ms >= 0:
            fields["duration_filter"], version = duration_ms, 1
        r = await self._call(LIST_TRANSACTIONS, version, **fields)
        code = int(r.error_code)
        if code != 0:
            raise BrokerRefused(f"ListTransactions: {error_name(code)}", code)
        rows = [{"transactional_id": str(t.transactional_id), "producer_id": int(t.producer_id),
                 "state": str(t.transaction_state)} for t in r.transaction_states]
        return rows, [str(s) for s in r.unknown_state_filters]

    async def describe_transactions(self, transactional_ids: list[str]) -> list[dict]:
        """DescribeTransactions: one dict per id, in order, with ``code`` / ``error`` (0 / None: found)."""
        r = await self._call(DESCRIBE_TRANSACTIONS, 0, transactional_ids=tuple(transactional_ids))
        out = []
        for t in r.transaction_states:
            code = int(t.error_code)
            out.append({
                "transactional_id": str(t.transactional_id), "code": code,
                "error": error_name(code) if code else None, "state": str(t.transaction_state),
                "producer_id": int(t.producer_id), "producer_epoch": int(t.producer_epoch),
                "timeout_ms": _ms(t.transaction_timeout), "start_time_ms": _ms(t.transaction_start_time),
                "partitions": [{"topic": str(d.topic), "partition": int(p)} for d in t.topics for p in d.partitions],
            })
        return out

    async def describe_producers(self, partitions: list[tuple[str, int]]) -> list[dict]:
        """DescribeProducers: one dict per partition asked, with ``code`` / ``error`` and its producers."""
        by_topic: dict[str, list[int]] = defaultdict(list)
        for topic, partition in partitions:
            by_topic[topic].append(partition)
        if not by_topic:
            return []
        r = await self._call(DESCRIBE_PRODUCERS, 0, topics=tuple(
            TopicRequest(name=t, partition_indexes=tuple(ps)) for t, ps in by_topic.items()))
        out = []
        for t in r.topics:
            for p in t.partitions:
                code = int(p.error_code)
                out.append({
                    "topic": str(t.name), "partition": int(p.partition_index), "code": code,
                    "error": error_name(code) if code else None, "message": p.error_message,
                    "producers": [{"producer_id": int(a.producer_id), "producer_epoch": int(a.producer_epoch),
                                   "last_sequence": int(a.last_sequence), "last_timestamp_ms": int(a.last_timestamp),
                                   "coordinator_epoch": int(a.coordinator_epoch),
                                   "current_txn_start_offset": int(a.current_txn_start_offset)}
                                  for a in p.active_producers]})
        return out

    async def init_producer_id(self, transactional_id: str, timeout_ms: int, producer_id: int,
                               producer_epoch: int) -> tuple[int, int]:
        """InitProducerId v4 for ``transactional_id`` expecting its producer to be (producer_id, epoch)
        (KIP-360): the broker aborts the id's open transaction and bumps the epoch, or refuses with
        PRODUCER_FENCED when the id's producer is another one.  (producer id, epoch) after it."""
        r = await self._call(INIT_PRODUCER_ID, 4, transactional_id=transactional_id,
                             transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
                             producer_id=producer_id, producer_epoch=producer_epoch)
        code = int(r.error_code)
        if code != 0:
            raise BrokerRefused(f"InitProducerId for transactional id {transactional_id!r}: {error_name(code)}", code)
        return int(r.producer_id), int(r.producer_epoch)


# ------------------------------------------------------------------ the operator's procedures (pidctl txn)
OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")
RETRY_BACKOFF_S = 0.2


async def _partitions(admin: BrokerAdmin, topic: str | None, partition: int | None) -> list[tuple[str, int]]:
    if topic is not None and partition is not None:
        return [(topic, partition)]
    topics = await admin.topics()
    if topic is not None:
        if topic not in topics:
            raise BrokerRefused(f"broker {admin.address} has no topic {topic!r}", int(Errors.UNKNOWN_TOPIC_OR_PARTITION))
        topics = {topic: topics[topic]}
    return [(t, p) for t, n in sorted(topics.items()) for p in range(n)]


async def open_transactions(admin: BrokerAdmin, partitions: list[tuple[str, int]]) -> list[dict]:
    """Every open transaction on ``partitions`` (DescribeProducers: a producer with a current transaction start
    offset), as {topic, partition, producer_id, producer_epoch, start_offset, last_timestamp_ms}.  A partition
    the broker refuses raises BrokerRefused naming it."""
    out = []
    for r in await admin.describe_producers(partitions):
        if r["code"]:
            raise BrokerRefused(f"DescribeProducers {r['topic']}-{r['partition']}: {r['error']}"
                                f"{': ' + r['message'] if r['message'] and r['message'] != r['error'] else ''}",
                                r["code"])
        out += [{"topic": r["topic"], "partition": r["partition"], "producer_id": p["producer_id"],
                 "producer_epoch": p["producer_epoch"], "start_offset": p["current_txn_start_offset"],
                 "last_timestamp_ms": p["last_timestamp_ms"]}
                for p in r["producers"] if p["current_txn_start_offset"] >= 0]
    return out


async def _ids_of(admin: BrokerAdmin, producer_ids: set[int]) -> dict[int, dict]:
    """The coordinator's transaction of each producer id it lists (ListTransactions, DescribeTransactions)."""
    if not producer_ids:
        return {}
    rows, _ = await admin.list_transactions(producer_ids=sorted(producer_ids))
    described = await admin.describe_transactions(sorted({r["transactional_id"] for r in rows})) if rows else []
    return {d["producer_id"]: d for d in described if d["code"] == 0}


async def find_hanging(admin: BrokerAdmin, max_timeout_ms: int, now_ms: int, topic: str | None = None,
                       partition: int | None = None) -> list[dict]:
    """kafka-transactions.sh find-hanging for one broker: the open transactions of its partitions whose producer
    last wrote more than ``max_timeout_ms`` ago, each with what the coordinator says of it (``reason``): it
    does not know the producer, its transaction of the producer is another one (another epoch, ended, without
    this partition), or it is open past its own timeout (the coordinator has not aborted it).  A transaction
    the coordinator has open within its timeout is reported too once it is older than ``max_timeout_ms``
    (Kafka's default, 15 minutes, is transaction.max.timeout.ms: no transaction may live that long)."""
    found = [t for t in await open_transactions(admin, await _partitions(admin, topic, partition))
             if now_ms - t["last_timestamp_ms"] > max_timeout_ms]
    coordinator = await _ids_of(admin, {t["producer_id"] for t in found})
    for t in found:
        d = coordinator.get(t["producer_id"])
        t["open_ms"] = now_ms - t["last_timestamp_ms"]
        t["transactional_id"] = d["transactional_id"] if d else None
        t["coordinator_state"] = d["state"] if d else None
        if d is None:
            t["reason"] = ("no transactional id this broker's coordinator lists has this producer (unknown to it, "
                           "or idle since the broker restarted)")
        elif (d["state"] not in OPEN_STATES or d["producer_epoch"] not in (t["producer_epoch"], t["producer_epoch"] + 1)
              or {"topic": t["topic"], "partition": t["partition"]} not in d["partitions"]):
            t["reason"] = (f"the coordinator's transaction of {d['transactional_id']!r} is {d['state']} at epoch "
                           f"{d['producer_epoch']}, without this partition's")
        elif now_ms - d["start_time_ms"] > d["timeout_ms"]:
            t["reason"] = f"open past its timeout of {d['timeout_ms']} ms: the coordinator has not aborted it"
        else:
            t["reason"] = (f"open {t['open_ms'] // 1000} s, over the threshold; the coordinator aborts it at its "
                           f"timeout of {d['timeout_ms']} ms")
    return found


async def _init(admin: BrokerAdmin, tid: str, timeout_ms: int, pid: int, epoch: int, deadline: float) -> tuple[int, int]:
    """InitProducerId expecting (pid, epoch), retried while the coordinator completes the id's transaction."""
    while True:
        try:
            return await admin.init_producer_id(tid, timeout_ms, pid, epoch)
        except BrokerRefused as e:
            retriable = e.code in (int(Errors.CONCURRENT_TRANSACTIONS), int(Errors.COORDINATOR_LOAD_IN_PROGRESS),
                                   int(Errors.COORDINATOR_NOT_AVAILABLE), int(Errors.NOT_COORDINATOR))
            if not retriable or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(RETRY_BACKOFF_S)


async def abort_transaction(admin: BrokerAdmin, *, transactional_id: str | None = None, topic: str | None = None,
                            partition: int | None = None, start_offset: int | None = None,
                            producer_id: int | None = None, producer_epoch: int | None = None) -> dict:
    """End an open transaction as aborted and fence the producer that began it (docs/transactions.md).

    The transaction is named by its transactional id, or found on a partition (its open transaction, the one
    starting at ``start_offset``, or the one of ``producer_id``), and must be Ongoing at the coordinator with
    that producer (and that partition).  Then, through the coordinator, never by a marker written past it:

    1. InitProducerId expecting (producer id, epoch): the quorum aborts the open transaction with the epoch
       bumped (its markers are written by the coordinator, fencing the epoch on each partition) — or refuses
       with PRODUCER_FENCED when the id's producer is no longer that one (the transaction moved on: nothing is
       applied);
    2. InitProducerId expecting the bumped pair: the epoch is bumped once more, so the old producer cannot claim
       the first bump as its own retry (KIP-360) and gets PRODUCER_FENCED from now on.

    Returns the transaction before, the fenced and the new (producer id, epoch), and its state after.
    BrokerRefused for anything that refuses it, naming why."""
    deadline = asyncio.get_running_loop().time() + admin.timeout
    where = None
    if transactional_id is None:
        if topic is None or partition is None:
            raise ValueError("give --transactional-id, or --topic and --partition")
        where = {"topic": topic, "partition": partition}
        opened = await open_transactions(admin, [(topic, partition)])
        picked = [t for t in opened if (start_offset is None or t["start_offset"] == start_offset)
                  and (producer_id is None or t["producer_id"] == producer_id)
                  and (producer_epoch is None or t["producer_epoch"] == producer_epoch)]
        if not picked:
            raise BrokerRefused(f"{topic}-{partition} has no open transaction"
                                f"{'' if start_offset is None else f' starting at offset {start_offset}'}"
                                f"{'' if producer_id is None else f' of producer {producer_id}'}",
                                int(Errors.INVALID_TXN_STATE))
        if len(picked) > 1:
            raise BrokerRefused(f"{topic}-{partition} has {len(picked)} open transactions (start offsets "
                                f"{', '.join(str(t['start_offset']) for t in picked)}): give --start-offset",
                                int(Errors.INVALID_REQUEST))
        producer_id, producer_epoch = picked[0]["producer_id"], picked[0]["producer_epoch"]
        known = await _ids_of(admin, {producer_id})
        if producer_id not in known:
            raise BrokerRefused(f"the coordinator of broker {admin.address} knows no transactional id with producer "
                                f"{producer_id}: it cannot be fenced from here (see docs/transactions.md)",
                                int(Errors.INVALID_PRODUCER_ID_MAPPING))
        transactional_id = known[producer_id]["transactional_id"]
    (before,) = await admin.describe_transactions([transactional_id])
    if before["code"]:
        raise BrokerRefused(f"transactional id {transactional_id!r}: {before['error']}", before["code"])
    if before["state"] != "Ongoing":
        raise BrokerRefused(f"transactional id {transactional_id!r} is {before['state']}: no open transaction to "
                            f"abort", int(Errors.INVALID_TXN_STATE))
    mismatch = [f"{name} {want} (the coordinator has {before[key]})" for name, key, want in
                (("producer", "producer_id", producer_id), ("epoch", "producer_epoch", producer_epoch))
                if want is not None and before[key] != want]
    if where is not None and where not in before["partitions"]:
        mismatch.append(f"partition {where['topic']}-{where['partition']} (not in its transaction)")
    if mismatch:
        raise BrokerRefused(f"transactional id {transactional_id!r}: its open transaction is not the one named: "
                            f"{'; '.join(mismatch)}", int(Errors.PRODUCER_FENCED))
    pid, epoch = before["producer_id"], before["producer_epoch"]
    try:
        bumped = await _init(admin, transactional_id, before["timeout_ms"] or 60_000, pid, epoch, deadline)
    except BrokerRefused as e:
        if e.code == int(Errors.PRODUCER_FENCED):
            raise BrokerRefused(f"transactional id {transactional_id!r}: its producer is no longer {pid} epoch "
                                f"{epoch} (the transaction moved on); nothing was aborted", e.code) from None
        raise
    # The aborted transaction's state: CompleteAbort once its markers are written (PrepareAbort: decided, the
    # coordinator's sweeper writes them).  Read before the second bump, after which the id is Empty.
    (after,) = await admin.describe_transactions([transactional_id])
    try:
        fenced = await _init(admin, transactional_id, before["timeout_ms"] or 60_000, *bumped, deadline)
    except BrokerRefused as e:
        if e.code != int(Errors.PRODUCER_FENCED):
            raise
        fenced = bumped  # a new instance bumped it meanwhile: the old producer is fenced by that
    return {"transactional_id": transactional_id, "aborted": before, "fenced_producer_id": pid,
            "fenced_producer_epoch": epoch, "producer_id": fenced[0], "producer_epoch": fenced[1],
            "state": after["state"] if after["code"] == 0 else after["error"]}
