"""Reading a topic of the transactions workload: what the checker is given.

* ``RawBroker``: a plain Kafka-protocol connection (a blocking socket, kio's codecs through
  ``records.wire.kafka``) for two requests no client library exposes as raw as the checker needs them:
  ListOffsets latest with a chosen isolation level (read_committed: the last stable offset,
  LSO; read_uncommitted: the high watermark, HW), and a read_uncommitted Fetch that returns
  every batch as stored, control batches (commit and abort markers) included, each with its
  producer ID and epoch.
* ``read_all``: every record of every partition from the beginning, with kafka-python's
  ``KafkaConsumer`` (``assign`` + ``seek_to_beginning``, no group: the broker serves none), in
  read_committed or read_uncommitted, up to the end offsets taken when the read starts.
* ``settle``: wait until no transaction is open (LSO == HW on every partition).
* ``dump_log``: every batch of every partition through ``RawBroker.fetch``.

Everything here is blocking (the caller runs it in a thread), bounded by deadlines, and binds
nothing: it connects to the broker's bootstrap address only.
"""
from __future__ import annotations

import datetime
import socket
import struct
import time
from typing import Any

from broker.recordbatch import BatchError, check_framing, control_record_type, iter_records
from records.wire import kafka

FETCH, LIST_OFFSETS, METADATA = 1, 2, 3
FETCH_VERSION, LIST_OFFSETS_VERSION = 4, 2   # the first versions with an isolation level
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
LATEST = -1
CONTROL_TYPES = {0: "abort", 1: "commit"}


class ReadError(Exception):
    """The broker did not answer, or answered an error, within the deadline."""


def _entity(api_key: int, version: int, cls_name: str, **fields: Any) -> Any:
    cls = kafka.load_request_schema(api_key, version)
    mod = __import__(cls.__module__, fromlist=[cls_name])
    return getattr(mod, cls_name)(**fields)


class RawBroker:
    """One connection to a broker (reconnected after any error); ``timeout`` bounds each call."""

    def __init__(self, bootstrap: str, timeout: float = 2.0, client_id: str = "chaos-txn-raw"):
        host, port = bootstrap.rsplit(":", 1)
        self.address = (host, int(port))
        self.timeout = timeout
        self.client_id = client_id
        self._sock: socket.socket | None = None
        self._corr = 0

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def __enter__(self) -> "RawBroker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _recv(self, n: int) -> bytes:
        assert self._sock is not None
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            buf += chunk
        return bytes(buf)

    def call(self, body: Any) -> Any:
        try:
            if self._sock is None:
                self._sock = socket.create_connection(self.address, timeout=self.timeout)
            self._sock.settimeout(self.timeout)
            self._corr = (self._corr + 1) & 0x7FFFFFFF
            self._sock.sendall(kafka.encode_request(body, self._corr, self.client_id))
            size = struct.unpack(">i", self._recv(4))[0]
            corr, resp = kafka.parse_response(self._recv(size), body.__api_key__, body.__version__)
            if corr != self._corr:
                raise ConnectionError(f"correlation id {corr}, expected {self._corr}")
            return resp
        except (OSError, ConnectionError, ValueError, struct.error) as e:
            self.close()
            raise ReadError(f"{self.address[0]}:{self.address[1]}: {type(e).__name__}: {e}") from None

    def create_topic(self, topic: str) -> int:
        """Metadata for ``topic`` with auto-creation allowed (the broker creates it with its default
        partition count): the number of partitions it has."""
        body = kafka.request_entity(METADATA, 4, topics=(_entity(METADATA, 4, "MetadataRequestTopic", name=topic),),
                                    allow_auto_topic_creation=True)
        t = self.call(body).topics[0]
        if int(t.error_code):
            raise ReadError(f"Metadata {topic}: error {int(t.error_code)}")
        return len(t.partitions)

    def list_offsets(self, topic: str, partitions: int, committed: bool) -> dict[int, int]:
        """ListOffsets latest: {partition: LSO} (read_committed) or {partition: HW}."""
        v = LIST_OFFSETS_VERSION
        parts = tuple(_entity(LIST_OFFSETS, v, "ListOffsetsPartition", partition_index=p, timestamp=LATEST)
                      for p in range(partitions))
        body = kafka.request_entity(LIST_OFFSETS, v, replica_id=-1,
                                    isolation_level=READ_COMMITTED if committed else READ_UNCOMMITTED,
                                    topics=(_entity(LIST_OFFSETS, v, "ListOffsetsTopic", name=topic,
                                                    partitions=parts),))
        out = {}
        for t in self.call(body).topics:
            for pt in t.partitions:
                if int(pt.error_code):
                    raise ReadError(f"ListOffsets {topic}/{int(pt.partition_index)}: error {int(pt.error_code)}")
                out[int(pt.partition_index)] = int(pt.offset)
        return out

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20) -> tuple[bytes, int]:
        """A read_uncommitted Fetch of one partition from ``offset``: (records, high watermark)."""
        v = FETCH_VERSION
        fp = _entity(FETCH, v, "FetchPartition", partition=partition, fetch_offset=offset,
                     partition_max_bytes=max_bytes)
        body = kafka.request_entity(FETCH, v, replica_id=-1, max_wait=datetime.timedelta(milliseconds=0),
                                    min_bytes=0, max_bytes=max_bytes, isolation_level=READ_UNCOMMITTED,
                                    topics=(_entity(FETCH, v, "FetchTopic", topic=topic, partitions=(fp,)),))
        pt = self.call(body).responses[0].partitions[0]
        if int(pt.error_code):
            raise ReadError(f"Fetch {topic}/{partition} at {offset}: error {int(pt.error_code)}")
        return bytes(pt.records or b""), int(pt.high_watermark)


def parse_batches(data: bytes) -> list[dict]:
    """The batches of a Fetch answer's records: offsets, producer, control type, the records' values
    (text; None for a null value).  A partial batch at the end (Fetch may cut one) is left out."""
    out = []
    pos = 0
    while pos + 61 <= len(data):
        try:
            h = check_framing(data, pos)
        except (BatchError, struct.error):
            break  # a batch cut by max_bytes
        batch = data[pos:pos + h.size]
        pos += h.size
        b = {"base_offset": h.base_offset, "last_offset": h.last_offset, "producer_id": h.producer_id,
             "producer_epoch": h.producer_epoch, "transactional": h.is_transactional, "control": h.is_control}
        if h.is_control:
            t = control_record_type(batch)
            b["control_type"] = CONTROL_TYPES.get(t, str(t))
        else:
            b["records"] = [[r.offset, None if r.value is None else r.value.decode("utf-8", "replace")]
                            for r in iter_records(batch)]
        out.append(b)
    return out


def dump_log(raw: RawBroker, topic: str, partitions: int, ends: dict[int, int], deadline: float) -> dict:
    """Every batch below ``ends[p]`` (the HW) of every partition: {"batches": {p: [...]}, "complete"}."""
    out: dict[str, list[dict]] = {}
    complete = True
    for p in range(partitions):
        batches: list[dict] = []
        offset = 0
        while offset < ends[p]:
            if time.monotonic() > deadline:
                complete = False
                break
            try:
                data, _ = raw.fetch(topic, p, offset)
            except ReadError:
                time.sleep(0.2)
                continue
            got = parse_batches(data)
            if not got:
                time.sleep(0.05)
                continue
            batches.extend(got)
            offset = got[-1]["last_offset"] + 1
        out[str(p)] = batches
    return {"batches": out, "complete": complete}


def settle(raw: RawBroker, topic: str, partitions: int, timeout: float) -> dict:
    """Wait until the LSO equals the HW on every partition (no transaction open), or ``timeout``."""
    t0 = time.monotonic()
    lso: dict[int, int] = {}
    hw: dict[int, int] = {}
    while True:
        try:
            lso = raw.list_offsets(topic, partitions, committed=True)
            hw = raw.list_offsets(topic, partitions, committed=False)
            if lso == hw:
                return {"settled": True, "seconds": time.monotonic() - t0, "lso": _skeys(lso), "hw": _skeys(hw)}
        except ReadError:
            pass
        if time.monotonic() - t0 > timeout:
            return {"settled": False, "seconds": time.monotonic() - t0, "lso": _skeys(lso), "hw": _skeys(hw)}
        time.sleep(0.2)


def _skeys(d: dict[int, int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(d.items())}


def read_all(bootstrap: str, topic: str, partitions: int, committed: bool, timeout: float) -> dict:
    """Every data record a kafka-python consumer of that isolation level sees, from the beginning up to
    the end offsets it finds when it starts (the LSOs for read_committed): ``records`` [[p, offset, value]],
    ``end_offsets``, ``positions`` and ``complete`` (every position reached its end offset)."""
    from kafka import KafkaConsumer  # heavy: imported when used
    from kafka import TopicPartition as KTopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                      auto_offset_reset="earliest", client_id=f"chaos-read-{'rc' if committed else 'ru'}",
                      isolation_level="read_committed" if committed else "read_uncommitted")
    tps = [KTopicPartition(topic, p) for p in range(partitions)]
    records: list[list] = []
    try:
        c.assign(tps)
        c.seek_to_beginning()
        ends = c.end_offsets(tps)
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for batch in c.poll(timeout_ms=500).values():
                records.extend([m.partition, m.offset, None if m.value is None else m.value.decode("utf-8", "replace")]
                               for m in batch)
        positions = {str(tp.partition): c.position(tp) for tp in tps}
    finally:
        c.close()
    end_by = {str(tp.partition): off for tp, off in ends.items()}
    return {"records": records, "end_offsets": end_by, "positions": positions,
            "complete": all(positions[p] >= e for p, e in end_by.items())}
