"""Bad input against a real broker front-end process: every kind gets a clear error code
(or a closed connection for an unreadable frame, an unknown API or an unsupported version), a
log line, and the broker keeps serving every other client.  One quorum and one broker for the
whole module."""
from __future__ import annotations

import datetime
import socket
import struct

import pytest

from benchmarks.processes import BrokerProcess
from broker.api_table import RPCS as BROKER_RPCS
from broker.recordbatch import encode_batch
from quorum.client import api as p
from quorum.localcluster import LocalCluster
from tests.quorum.test_bad_input import framed, header_v1, header_v2, raw_conn, read_until_closed
from tests.support.kafka_requests import batch, entity, request_once
from records.wire import kafka
from records.wire.errors import Errors

PRODUCE, FETCH, LIST_OFFSETS, METADATA, INIT_PRODUCER_ID = 0, 1, 2, 3, 22


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    base = tmp_path_factory.mktemp("frontend-bad-input")
    lc = LocalCluster(str(base / "cluster"))
    lc.up(3)
    b = BrokerProcess(str(base), 1, lc.client_addresses(), "--partitions", "2")
    try:
        b.start()
        yield b
    finally:
        b.stop()
        lc.down(timeout=5)


def call(b: BrokerProcess, api_key: int, version: int, **fields):
    return request_once(b.bootstrap, "bad-input-test", kafka.request_entity(api_key, version, **fields))


def produce(b, records: bytes | None, topic: str = "bad", partition: int = 0, acks: int = -1, version: int = 9):
    pd = entity(PRODUCE, version, "PartitionProduceData", index=partition, records=records)
    td = entity(PRODUCE, version, "TopicProduceData", name=topic, partition_data=(pd,))
    resp = call(b, PRODUCE, version, transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=5),
                topic_data=(td,))
    r = resp.responses[0].partition_responses[0]
    return Errors(int(r.error_code)), int(r.base_offset), getattr(r, "error_message", None)


def init_pid(b, version: int = 4, tid=None, pid: int = -1, epoch: int = -1, timeout_ms: int = 60_000):
    fields = {"transactional_id": tid, "transaction_timeout": datetime.timedelta(milliseconds=timeout_ms)}
    if version >= 3:
        fields.update(producer_id=pid, producer_epoch=epoch)
    resp = call(b, INIT_PRODUCER_ID, version, **fields)
    return Errors(int(resp.error_code)), int(resp.producer_id), int(resp.producer_epoch)


def assert_serves(b: BrokerProcess) -> None:
    """A fresh client still gets answers: InitProducerId (a PID) and Metadata."""
    code, pid, epoch = init_pid(b)
    assert code == Errors.NONE and pid >= 0 and epoch == 0
    md = call(b, METADATA, 9, topics=None, allow_auto_topic_creation=False,
              include_cluster_authorized_operations=False, include_topic_authorized_operations=False)
    assert md.brokers[0].node_id == 1


def raw_answer(b: BrokerProcess, payload: bytes) -> bytes | None:
    """Send one frame; the response body (after the size), or None if the broker closed the connection."""
    with raw_conn(b.bootstrap) as s:
        s.sendall(framed(payload))
        s.shutdown(socket.SHUT_WR)
        data = read_until_closed(s)
    if not data:
        return None
    size = struct.unpack_from(">i", data)[0]
    assert len(data) == 4 + size
    return data[4:]


# ------------------------------------------------------------------ frames
@pytest.mark.parametrize("payload", [b"", b"\x00\x01", struct.pack(">hhi", 18, 0, 1)[:7]],
                         ids=["empty", "two-bytes", "seven-bytes"])
def test_truncated_header_closes_the_connection(broker, payload):
    assert raw_answer(broker, payload) is None
    assert_serves(broker)


@pytest.mark.parametrize("size", [-1, 2**31 - 1, 16 * 1024 * 1024 + 1])
def test_absurd_frame_size_closes_the_connection(broker, size):
    with raw_conn(broker.bootstrap) as s:
        s.sendall(struct.pack(">i", size) + b"\x00" * 16)
        assert read_until_closed(s) == b""
    assert_serves(broker)


def test_frame_cut_short_closes_the_connection(broker):
    with raw_conn(broker.bootstrap) as s:
        s.sendall(struct.pack(">i", 100) + header_v1(18, 0, 1))
        s.shutdown(socket.SHUT_WR)
        assert read_until_closed(s) == b""
    assert "truncated frame" in broker.tail(400)
    assert_serves(broker)


@pytest.mark.parametrize("api_key", [67, 62, 9999, -1, 10001])
def test_unknown_api_key_closes_the_connection(broker, api_key):
    assert raw_answer(broker, header_v1(api_key, 0, 5) + b"\x00" * 8) is None
    assert f"unknown API key {api_key}" in broker.tail(400)
    assert_serves(broker)


# ------------------------------------------------------------------ versions
def test_newer_api_versions_is_answered_in_v0_with_the_ranges(broker):
    data = raw_answer(broker, header_v2(18, 4, 77) + b"\x00\x00\x00")
    corr, body = p.QUORUM_API.parse_response(data, 18, 0)
    assert corr == 77 and int(body.error_code) == Errors.UNSUPPORTED_VERSION
    ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
    assert ranges[0] == (3, 10) and ranges[1] == (4, 12) and ranges[22] == (0, 4) and ranges[3] == (0, 12)


@pytest.mark.parametrize("api_key,version", [(PRODUCE, 2), (PRODUCE, 11), (FETCH, 3), (FETCH, 13),
                                             (INIT_PRODUCER_ID, 5), (LIST_OFFSETS, 0)])
def test_unsupported_version_closes_the_connection(broker, api_key, version):
    """As Kafka does: no answer in another version's layout (which the client would misread)."""
    header = header_v2(api_key, version, 31) if version >= 9 else header_v1(api_key, version, 31)
    assert raw_answer(broker, header + b"\x00" * 12) is None
    assert "is not supported" in broker.tail(400)
    assert_serves(broker)


# ------------------------------------------------------------------ malformed bodies
def test_malformed_produce_body_is_invalid_request(broker):
    data = raw_answer(broker, header_v1(PRODUCE, 3, 41) + b"\xff\xff\x00")
    corr, body = p.QUORUM_API.parse_response(data, PRODUCE, 3)
    assert corr == 41
    assert_serves(broker)


def test_huge_array_length_in_produce_is_refused_not_allocated(broker):
    # Produce v9 (flexible): transactional id null (0), acks -1, timeout, topic_data compact length 2**32-2
    body = b"\x00" + struct.pack(">hi", -1, 1000) + bytes.fromhex("ffffffff0f")
    data = raw_answer(broker, header_v2(PRODUCE, 9, 42) + body)
    assert data is not None
    assert "array of 4294967294 elements" in broker.tail(400)
    assert_serves(broker)


# ------------------------------------------------------------------ record batches
def test_bad_crc_is_corrupt_message_and_nothing_is_written(broker):
    good = bytearray(batch())
    good[-1] ^= 0xFF  # a record byte, covered by the CRC
    code, offset, _ = produce(broker, bytes(good), topic="crc")
    assert code == Errors.CORRUPT_MESSAGE and offset == -1
    assert produce(broker, batch(), topic="crc")[:2] == (Errors.NONE, 0)  # offset 0: nothing was appended


@pytest.mark.parametrize("magic,code", [(1, Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT), (0, Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT),
                                        (7, Errors.CORRUPT_MESSAGE)])
def test_wrong_magic(broker, magic, code):
    b = bytearray(batch())
    b[16] = magic  # baseOffset 8, batchLength 4, partitionLeaderEpoch 4, then magic
    assert produce(broker, bytes(b), topic="magic")[0] == code


@pytest.mark.parametrize("length", [5, 2**31 - 1, -3])
def test_absurd_batch_length_is_corrupt_message(broker, length):
    b = bytearray(batch())
    b[8:12] = struct.pack(">i", length)
    assert produce(broker, bytes(b), topic="length")[0] == Errors.CORRUPT_MESSAGE


def test_negative_sequence_with_a_producer_id_is_invalid_record(broker):
    _, pid, epoch = init_pid(broker)
    assert produce(broker, batch(pid, epoch, seq=-5), topic="seq")[0] == Errors.INVALID_RECORD


def test_null_records_and_bad_acks_and_bad_topics(broker):
    assert produce(broker, None, topic="nulls")[0] == Errors.INVALID_RECORD
    assert produce(broker, batch(), topic="acks", acks=5)[0] == Errors.INVALID_REQUIRED_ACKS
    assert produce(broker, batch(), topic="bad topic!")[0] == Errors.INVALID_TOPIC_EXCEPTION
    assert produce(broker, batch(), topic="parts", partition=7)[0] == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert produce(broker, batch(), topic="parts", partition=-1)[0] == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert_serves(broker)


# ------------------------------------------------------------------ idempotence rules
def test_duplicate_out_of_order_and_stale_epoch(broker):
    _, pid, _ = init_pid(broker)
    first = batch(pid, 0, seq=0, n=3)
    assert produce(broker, first, topic="idem") == (Errors.NONE, 0, None)
    assert produce(broker, batch(pid, 0, seq=3, n=2), topic="idem")[:2] == (Errors.NONE, 3)
    # the first batch again: a duplicate, answered with its original offset, nothing appended
    assert produce(broker, first, topic="idem")[:2] == (Errors.NONE, 0)
    # a gap in the sequence
    assert produce(broker, batch(pid, 0, seq=9), topic="idem")[0] == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    # a new epoch must start at 0; then the old epoch is fenced
    assert produce(broker, batch(pid, 1, seq=4), topic="idem")[0] == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce(broker, batch(pid, 1, seq=0), topic="idem")[:2] == (Errors.NONE, 5)
    assert produce(broker, batch(pid, 0, seq=5), topic="idem")[0] == Errors.INVALID_PRODUCER_EPOCH
    assert produce(broker, batch(pid, 1, seq=1), topic="idem")[:2] == (Errors.NONE, 6)


# ------------------------------------------------------------------ InitProducerId
def test_init_producer_id_rules(broker):
    # idempotent: fresh, distinct ids with epoch 0, every version
    seen = set()
    for v in range(5):
        code, pid, epoch = init_pid(broker, version=v)
        assert code == Errors.NONE and epoch == 0 and pid not in seen
        seen.add(pid)
    assert init_pid(broker, pid=5, epoch=-1)[0] == Errors.INVALID_REQUEST
    assert init_pid(broker, pid=-1, epoch=0)[0] == Errors.INVALID_REQUEST
    assert init_pid(broker, tid="")[0] == Errors.INVALID_REQUEST
    assert init_pid(broker, tid="t-timeout", timeout_ms=0)[0] == Errors.INVALID_TRANSACTION_TIMEOUT
    # transactional: bump on a new instance, fenced old instance (v4: PRODUCER_FENCED, v3: INVALID_PRODUCER_EPOCH)
    code, pid, epoch = init_pid(broker, tid="t-rules")
    assert (code, epoch) == (Errors.NONE, 0)
    assert init_pid(broker, tid="t-rules")[1:] == (pid, 1)
    assert init_pid(broker, version=4, tid="t-rules", pid=pid, epoch=0)[0] == Errors.PRODUCER_FENCED
    assert init_pid(broker, version=3, tid="t-rules", pid=pid, epoch=0)[0] == Errors.INVALID_PRODUCER_EPOCH
    # the current instance bumps; its retry gets the same answer
    assert init_pid(broker, tid="t-rules", pid=pid, epoch=1)[1:] == (pid, 2)
    assert init_pid(broker, tid="t-rules", pid=pid, epoch=1)[1:] == (pid, 2)
    assert_serves(broker)


# ------------------------------------------------------------------ Fetch / ListOffsets
def test_fetch_and_list_offsets_errors(broker):
    assert produce(broker, batch(n=2), topic="reads")[0] == Errors.NONE
    fp = entity(FETCH, 4, "FetchPartition", partition=0, fetch_offset=99, partition_max_bytes=1 << 20)
    ft = entity(FETCH, 4, "FetchTopic", topic="reads", partitions=(fp,))
    missing = entity(FETCH, 4, "FetchTopic", topic="no-such-topic", partitions=(
        entity(FETCH, 4, "FetchPartition", partition=0, fetch_offset=0, partition_max_bytes=1 << 20),))
    resp = call(broker, FETCH, 4, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1,
                max_bytes=1 << 20, isolation_level=0, topics=(ft, missing))
    codes = [int(t.partitions[0].error_code) for t in resp.responses]
    assert codes == [Errors.OFFSET_OUT_OF_RANGE, Errors.UNKNOWN_TOPIC_OR_PARTITION]
    # records empty, not null, beside an error (librdkafka drops a whole response with a null one)
    assert [t.partitions[0].records for t in resp.responses] == [b"", b""]
    # so is the answer that refuses a whole Fetch
    request = kafka.request_entity(FETCH, 4, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1,
                                   max_bytes=1 << 20, isolation_level=0, topics=(ft, missing))
    refused = BROKER_RPCS[FETCH].error(None, 4, Errors.CLUSTER_AUTHORIZATION_FAILED, request)
    assert [pt.records for t in refused.responses for pt in t.partitions] == [b"", b""]
    lp = entity(LIST_OFFSETS, 1, "ListOffsetsPartition", partition_index=0, timestamp=-1)
    lt = entity(LIST_OFFSETS, 1, "ListOffsetsTopic", name="reads", partitions=(lp,))
    resp = call(broker, LIST_OFFSETS, 1, replica_id=-1, topics=(lt,))
    assert int(resp.topics[0].partitions[0].offset) == 2
    assert_serves(broker)


def test_transactional_batch_without_a_transaction_is_refused(broker):
    """KIP-890 part 1: a raw client's transactional batch (attributes 0x10) with no AddPartitionsToTxn
    is refused, not appended and shown to read_committed consumers."""
    txn = encode_batch([(None, b"t")], producer_id=4242, producer_epoch=0, base_sequence=0, transactional=True)
    code, offset, message = produce(broker, txn, topic="txn-raw")
    assert code == Errors.INVALID_TXN_STATE and offset == -1 and "transaction" in (message or "")
    code, offset, _ = produce(broker, batch(), topic="txn-raw")
    assert code == Errors.NONE and offset == 0  # nothing of the refused batch is in the log
    assert_serves(broker)
