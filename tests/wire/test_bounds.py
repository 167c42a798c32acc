"""The pre-parse bounds check agrees with kio on valid frames and stops every
length that would make kio's native reader allocate more than the frame holds.

The fuzz test runs kio's native reader in this process on every mutated frame
that passes the check: an abort there would kill the test run.
"""
from __future__ import annotations

import datetime
import io
import random
import struct
import uuid

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.primitive import i16, i32, i64, u16

from broker.frontend import NAMES, SUPPORTED
from broker.recordbatch import encode_batch
from quorum.client import api as p
from records.wire import kafka
from records.wire.bounds import FrameBoundsError, check_request
from records.wire.errors import Errors

_UUIDS = random.Random(62)


def _uuid() -> uuid.UUID:
    """Fixed UUIDs: the frames, and so the fuzz test's inputs, are the same on every run."""
    return uuid.UUID(int=_UUIDS.getrandbits(128))


def frame(api_key: int, version: int, body, client_id: str | None = "test") -> bytes:
    cls = load_request_schema(api_key, version)
    hdr_cls = cls.__header_schema__
    buf = io.BytesIO()
    kwargs = dict(request_api_key=i16(api_key), request_api_version=i16(version), correlation_id=i32(7))
    if "client_id" in hdr_cls.__dataclass_fields__:
        kwargs["client_id"] = client_id
    entity_writer(hdr_cls)(buf, hdr_cls(**kwargs))
    entity_writer(cls)(buf, body)
    return buf.getvalue()


def registration(version: int, listeners: int = 2, features: int = 1):
    cls = load_request_schema(p.BROKER_REGISTRATION, version)
    mod = __import__(cls.__module__, fromlist=["Listener", "Feature"])
    kw = dict(broker_id=i32(3), cluster_id="pq-cluster", incarnation_id=_uuid(),
              listeners=tuple(mod.Listener(name=f"L{i}", host="127.0.0.1", port=u16(9092 + i),
                                           security_protocol=i16(0)) for i in range(listeners)),
              features=tuple(mod.Feature(name=f"f{i}", min_supported_version=i16(0),
                                         max_supported_version=i16(3)) for i in range(features)),
              rack=None)
    fields = cls.__dataclass_fields__
    if "is_migrating_zk_broker" in fields:
        kw["is_migrating_zk_broker"] = False
    if "log_dirs" in fields:
        kw["log_dirs"] = (_uuid(), _uuid())
    if "previous_broker_epoch" in fields:
        kw["previous_broker_epoch"] = i64(-1)
    return cls(**kw)


def valid_frames() -> list[tuple[str, int, int, bytes]]:
    out = []
    for v in range(0, 5):
        out.append((f"BrokerRegistration v{v}", p.BROKER_REGISTRATION, v, frame(p.BROKER_REGISTRATION, v, registration(v))))
    out.append(("BrokerRegistration v4 empty arrays", p.BROKER_REGISTRATION, 4,
                frame(p.BROKER_REGISTRATION, 4, registration(4, 0, 0))))
    for v in (0, 1):
        cls = load_request_schema(p.BROKER_HEARTBEAT, v)
        kw = dict(broker_id=i32(3), broker_epoch=i64(11), current_metadata_offset=i64(5),
                  want_fence=False, want_shut_down=False)
        if v == 1:
            kw["offline_log_dirs"] = (_uuid(),)  # a tagged field
        out.append((f"BrokerHeartbeat v{v}", p.BROKER_HEARTBEAT, v, frame(p.BROKER_HEARTBEAT, v, cls(**kw))))
    for v in range(0, 4):
        cls = load_request_schema(p.API_VERSIONS, v)
        kw = {}
        if v >= 3:
            kw = dict(client_software_name="librdkafka", client_software_version="2.6.0")
        out.append((f"ApiVersions v{v}", p.API_VERSIONS, v, frame(p.API_VERSIONS, v, cls(**kw), client_id=None)))
    cls = load_request_schema(p.ALLOCATE_PRODUCER_IDS, 0)
    out.append(("AllocateProducerIds v0", p.ALLOCATE_PRODUCER_IDS, 0,
                frame(p.ALLOCATE_PRODUCER_IDS, 0, cls(broker_id=i32(1), broker_epoch=i64(2)))))
    return out


VALID = valid_frames()


def broker_frames() -> list[tuple[str, int, int, bytes]]:
    """Requests real clients send to the broker front end, built with kio (deeper nesting)."""
    def mod(key, v):
        return __import__(load_request_schema(key, v).__module__, fromlist=["x"])
    out = []
    for v in (3, 9, 10):
        m = mod(0, v)
        pd = m.PartitionProduceData(index=i32(0), records=encode_batch([(b"k", b"v"), (None, b"w")], producer_id=5,
                                                                        producer_epoch=0, base_sequence=0))
        body = load_request_schema(0, v)(transactional_id=None, acks=i16(-1),
                                         timeout=datetime.timedelta(seconds=5),
                                         topic_data=(m.TopicProduceData(name="t", partition_data=(pd,)),))
        out.append((f"Produce v{v}", 0, v, frame(0, v, body)))
    for v in (4, 12):
        m = mod(1, v)
        part = m.FetchPartition(partition=i32(0), fetch_offset=i64(3), partition_max_bytes=i32(1 << 20))
        kw = dict(replica_id=i32(-1), max_wait=datetime.timedelta(milliseconds=500), min_bytes=i32(1),
                  max_bytes=i32(1 << 20), isolation_level=0, topics=(m.FetchTopic(topic="t", partitions=(part,)),))
        if v >= 7:
            kw["forgotten_topics_data"] = ()
        out.append((f"Fetch v{v}", 1, v, frame(1, v, load_request_schema(1, v)(**kw))))
    for v in (0, 12):
        m = mod(3, v)
        topic_cls = getattr(m, "MetadataRequestTopic")
        kw = dict(topics=(topic_cls(name="t"),) if v == 0 else (topic_cls(name="t", topic_id=None),))
        if v >= 4:
            kw.update(allow_auto_topic_creation=True, include_topic_authorized_operations=False)
        out.append((f"Metadata v{v}", 3, v, frame(3, v, load_request_schema(3, v)(**kw))))
    body = load_request_schema(22, 4)(transactional_id="tx", transaction_timeout=datetime.timedelta(seconds=60),
                                      producer_id=i64(7), producer_epoch=i16(2))
    out.append(("InitProducerId v4", 22, 4, frame(22, 4, body)))
    return out


BROKER = broker_frames()


@pytest.mark.parametrize("name,key,version,data", VALID, ids=[v[0] for v in VALID])
def test_valid_frames_pass_and_end_where_kio_ends(name, key, version, data):
    cls = load_request_schema(key, version)
    end = check_request(data, cls.__header_schema__, cls)
    _, hdr_size = entity_reader(cls.__header_schema__)(data, 0)
    _, body_size = entity_reader(cls)(data, hdr_size)
    assert end == hdr_size + body_size == len(data)
    assert p.QUORUM_API.parse(data).body is not None


@pytest.mark.parametrize("name,key,version,data", VALID, ids=[v[0] for v in VALID])
def test_every_truncation_is_refused(name, key, version, data):
    cls = load_request_schema(key, version)
    for cut in range(8, len(data)):
        with pytest.raises(FrameBoundsError):
            check_request(data[:cut], cls.__header_schema__, cls)


def test_huge_compact_array_length_is_refused_before_kio():
    data = bytearray(frame(p.BROKER_REGISTRATION, 4, registration(4, 0, 0)))
    cls = load_request_schema(p.BROKER_REGISTRATION, 4)
    # listeners length byte follows broker_id, cluster_id and incarnation_id
    hdr_end = entity_reader(cls.__header_schema__)(bytes(data), 0)[1]
    at = hdr_end + 4 + 1 + len("pq-cluster") + 16
    assert data[at] == 1  # compact length of an empty array
    bad = bytes(data[:at]) + bytes.fromhex("ffffffff0f") + bytes(data[at + 1:])
    with pytest.raises(FrameBoundsError, match=r"listeners: array of 4294967294 elements"):
        check_request(bad, cls.__header_schema__, cls)
    with pytest.raises(kafka.BadRequest) as ei:
        p.QUORUM_API.parse(bad)
    assert ei.value.code == Errors.INVALID_REQUEST


@pytest.mark.parametrize("tail,match", [
    (bytes.fromhex("ffffffff7f"), "does not fit in 32 bits"),
    (bytes.fromhex("ffffffffff01"), "longer than 5 bytes"),
    (bytes.fromhex("80"), "runs past the end"),
    (bytes.fromhex("ffffff0f"), "tagged fields but only"),
    (bytes.fromhex("01" "00" "ffffff0f"), "tagged field: length"),
])
def test_bad_tagged_fields_are_refused(tail, match):
    data = frame(p.ALLOCATE_PRODUCER_IDS, 0, load_request_schema(p.ALLOCATE_PRODUCER_IDS, 0)(
        broker_id=i32(1), broker_epoch=i64(2)))
    cls = load_request_schema(p.ALLOCATE_PRODUCER_IDS, 0)
    assert data[-1] == 0  # no tagged fields
    with pytest.raises(FrameBoundsError, match=match):
        check_request(data[:-1] + tail, cls.__header_schema__, cls)


def test_legacy_lengths_are_checked():
    data = frame(p.API_VERSIONS, 0, load_request_schema(p.API_VERSIONS, 0)(), client_id="abc")
    cls = load_request_schema(p.API_VERSIONS, 0)
    for length, match in ((-2, "invalid length"), (4, "length 4 but only 3")):
        bad = data[:8] + struct.pack(">h", length) + data[10:]
        with pytest.raises(FrameBoundsError, match=match):
            check_request(bad, cls.__header_schema__, cls)


def test_tagged_field_content_is_bounded_too():
    """kio decodes a known tagged field's value: a huge array length inside a 17-byte tagged
    field (BrokerHeartbeat v1 offline_log_dirs) made it allocate 96 GB and abort."""
    cls = load_request_schema(p.BROKER_HEARTBEAT, 1)
    body = load_request_schema(p.BROKER_HEARTBEAT, 1)(
        broker_id=i32(3), broker_epoch=i64(11), current_metadata_offset=i64(5), want_fence=False,
        want_shut_down=False, offline_log_dirs=(_uuid(),))
    data = bytearray(frame(p.BROKER_HEARTBEAT, 1, body))
    at = len(data) - 16 - 1  # the array length byte, before the one UUID that ends the frame
    assert data[at] == 2
    bad = bytes(data[:at]) + bytes.fromhex("ffffffff0f") + bytes(data[at + 1:])
    bad = bad[:at - 1] + bytes([bad[at - 1] + 4]) + bad[at:]  # tagged-field size grows by the 4 extra bytes
    with pytest.raises(FrameBoundsError, match="offline_log_dirs: array of"):
        check_request(bad, cls.__header_schema__, cls)


@pytest.mark.parametrize("name,key,version,data", BROKER, ids=[v[0] for v in BROKER])
def test_broker_frames_pass_and_end_where_kio_ends(name, key, version, data):
    cls = load_request_schema(key, version)
    assert check_request(data, cls.__header_schema__, cls) == len(data)


def _fuzz(frames, api, seed: int, rounds: int) -> tuple[int, int]:
    rng = random.Random(seed)
    passed = refused = 0
    for _ in range(rounds):
        name, key, version, data = frames[rng.randrange(len(frames))]
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(8, len(buf))
            buf[pos] = rng.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        try:
            api.parse(bytes(buf))
            passed += 1
        except kafka.BadRequest:
            refused += 1
        except (SerialError, kafka.FrameError) as e:  # pragma: no cover - would be a gap in parse_request
            pytest.fail(f"{name}: unexpected {type(e).__name__}: {e}")
    return passed, refused


def test_fuzzed_broker_frames_never_crash_the_native_reader():
    passed, refused = _fuzz(BROKER, kafka.ApiTable(SUPPORTED, NAMES, None), seed=936, rounds=20_000)
    assert passed and refused


def test_fuzzed_frames_never_crash_the_native_reader():
    """Mutate valid frames; whatever passes the check goes through kio in-process."""
    passed, refused = _fuzz(VALID, p.QUORUM_API, seed=20261121, rounds=20_000)
    assert passed and refused

