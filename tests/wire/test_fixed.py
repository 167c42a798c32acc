"""The fixed-layout path (records.wire.fixed) gives kio's bytes and kio's values, and leaves kio every frame it
does not read whole: random values, every prefix, every one-byte change and tagged fields."""
from __future__ import annotations

import dataclasses
import datetime
import io
import random

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from quorum.rpcs import SERVER_API
from records.wire import fixed
from records.wire.kafka import SIZE, encode_request, load_request_schema, load_response_schema

RANGES = {"int8": 7, "int16": 15, "int32": 31, "int64": 63}


def _fixed_classes(load):
    out = []
    for key, (lo, hi) in sorted(SERVER_API.versions.items()):
        for version in range(lo, hi + 1):
            cls = load(key, version)
            if fixed.layout(cls) is not None and dataclasses.fields(cls):
                out.append(cls)
    return out


REQUESTS = _fixed_classes(load_request_schema)
RESPONSES = _fixed_classes(load_response_schema)


def test_the_steady_state_messages_have_a_fixed_layout():
    names = {(c.__name__, c.__version__) for c in REQUESTS + RESPONSES}
    assert {("AllocateProducerIdsRequest", 0), ("AllocateProducerIdsResponse", 0), ("BrokerHeartbeatRequest", 0),
            ("BrokerHeartbeatResponse", 1), ("BrokerRegistrationResponse", 4)} <= names
    assert fixed.layout(load_request_schema(62, 0)) is None  # BrokerRegistration: strings and arrays


def _value(kind: str, rng: random.Random):
    if kind in RANGES:
        bits = RANGES[kind]
        return rng.choice([0, 1, -1, 2 ** bits - 1, -2 ** bits, rng.randrange(-2 ** bits, 2 ** bits)])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "error_code":
        return rng.choice(list(ErrorCode))
    if kind == "timedelta_i32":
        return datetime.timedelta(milliseconds=rng.choice([0, 1, 2 ** 31 - 1, rng.randrange(0, 2 ** 31)]))
    raise AssertionError(kind)


def _entity(cls, rng: random.Random):
    return cls(**{f.name: _value(f.metadata["kafka_type"], rng) for f in dataclasses.fields(cls)})


def _kio_request(body, correlation_id: int, client_id: str | None) -> bytes:
    buf = io.BytesIO()
    header_cls = type(body).__header_schema__
    entity_writer(header_cls)(buf, header_cls(request_api_key=body.__api_key__, request_api_version=body.__version__,
                                              correlation_id=correlation_id, client_id=client_id))
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


def _kio_response(body, correlation_id: int) -> bytes:
    buf = io.BytesIO()
    header_cls = type(body).__header_schema__
    entity_writer(header_cls)(buf, header_cls(correlation_id=correlation_id))
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


def _kio_read_request(frame: bytes, cls):
    header, off = entity_reader(cls.__header_schema__)(frame, 0)
    body, size = entity_reader(cls)(frame, off)
    return header.correlation_id, header.client_id, body, len(frame) - off - size


def _samples(cls, rng: random.Random, n: int = 300):
    """``n`` (body, correlation id) of random values, the extremes of each field's range among them."""
    for _ in range(n):
        yield _entity(cls, rng), rng.randrange(-2 ** 31, 2 ** 31)


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: f"{c.__name__}-v{c.__version__}")
def test_requests_are_kios_bytes_and_read_back_as_kio_reads_them(cls):
    rng = random.Random(cls.__name__)
    for body, correlation_id in _samples(cls, rng):
        client_id = rng.choice(["pidquorum", "", "brøker-7", "x" * 300])
        frame = fixed.write_request(body, correlation_id, client_id)
        assert frame == _kio_request(body, correlation_id, client_id)
        assert encode_request(body, correlation_id, client_id) == SIZE.pack(len(frame)) + frame
        assert fixed.read_request(frame, cls) == (correlation_id, client_id, body)
        parsed = SERVER_API.parse(frame)
        assert (parsed.correlation_id, parsed.client_id, parsed.body, parsed.trailing) == (correlation_id, client_id,
                                                                                         body, 0)
    # a null client id, which only kio writes
    frame = _kio_request(_entity(cls, rng), 5, None)
    assert fixed.read_request(frame, cls) == _kio_read_request(frame, cls)[:3]


@pytest.mark.parametrize("cls", RESPONSES, ids=lambda c: f"{c.__name__}-v{c.__version__}")
def test_responses_are_kios_bytes(cls):
    for body, correlation_id in _samples(cls, random.Random(cls.__name__)):
        frame = fixed.write_response(cls, correlation_id, body)
        assert frame == _kio_response(body, correlation_id)
        assert SERVER_API.encode(cls.__api_key__, cls.__version__, correlation_id, body) == SIZE.pack(len(frame)) + frame


@pytest.mark.parametrize("cls", REQUESTS, ids=lambda c: f"{c.__name__}-v{c.__version__}")
def test_a_frame_read_whole_is_read_as_kio_reads_it_and_any_other_is_left_to_kio(cls):
    """Every prefix, every one-byte change, bytes appended: the fast path either gives kio's reading of
    the whole frame or none (kio then answers it as before: an error, or trailing bytes)."""
    rng = random.Random(1)
    frame = fixed.write_request(_entity(cls, rng), 77, "client")
    candidates = [frame[:n] for n in range(len(frame))] + [frame + b"\x00", frame + b"\x01\x02"]
    for i in range(len(frame)):
        for b in (0, 1, 2, 0x7F, 0x80, 0xFF):
            candidates.append(frame[:i] + bytes([b]) + frame[i + 1:])
    taken = 0
    for data in candidates:
        fast = fixed.read_request(data, cls)
        if fast is None:
            continue
        taken += 1
        correlation_id, client_id, body, left = _kio_read_request(data, cls)
        assert fast == (correlation_id, client_id, body) and left == 0, data.hex()
    assert taken > len(frame)  # value bytes changed are still read on the fast path


def test_tagged_fields_and_bad_values_go_to_kio():
    cls = load_request_schema(67, 0)
    frame = bytearray(fixed.write_request(cls(broker_id=1, broker_epoch=2), 3, "c"))
    with_tag = bytes(frame[:-1]) + bytes([1, 0, 1, 9])  # one unknown tagged field in the body
    assert fixed.read_request(with_tag, cls) is None
    head = bytes(frame[:11]) + bytes([1, 0, 0]) + bytes(frame[12:])  # the header: one empty tagged field
    assert fixed.read_request(head, cls) is None
    bad_utf8 = bytes(frame[:10]) + b"\xff" + bytes(frame[11:])
    assert fixed.read_request(bad_utf8, cls) is None
    # out of range or of another type: kio writes it (and refuses it as before)
    assert fixed.write_request(cls(broker_id=2 ** 31, broker_epoch=0), 1, "c") is None
    assert fixed.write_request(cls(broker_id=True, broker_epoch=0), 1, "c") is None
    resp = load_response_schema(67, 0)
    assert fixed.write_response(resp, 1, resp(throttle_time=datetime.timedelta(0), error_code=0, producer_id_start=1,
                                              producer_id_len=1)) is None
    heartbeat = load_request_schema(63, 0)
    frame = fixed.write_request(heartbeat(broker_id=1, broker_epoch=2, current_metadata_offset=3, want_fence=False,
                                          want_shut_down=True), 1, "c")
    assert fixed.read_request(frame[:-2] + b"\x02" + frame[-1:], heartbeat) is None  # a bool byte of 2
