"""Kafka wire protocol for the quorum's client port, with kio's codecs.

Pure functions: bytes in, values out.  Framing (a 4-byte big-endian size) and
dispatch live in ``quorum.server`` / ``quorum.client``.

Besides the Kafka APIs, two pidquorum APIs carry msgpack bodies:
``DescribeState`` (``ADMIN_API_KEY``), the node's Raft status and state
summary, used by ``pidctl quorum status`` and ``pidctl blocks latest``; and
``InitTransactionalProducer`` (``TXN_API_KEY``), whose request and response
are the records of the same names (records/schema.py), with which a broker
applies InitProducerId to a transactional id in the quorum.
"""
from __future__ import annotations

import asyncio
import datetime
import functools
import io
import logging
import struct
from dataclasses import dataclass
from typing import Any, AsyncIterator

import msgpack
import kio.index
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.primitive import f64, i16, i32, i64, u16

from records import (
    AlterAclsRequest,
    AlterAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    AlterClientQuotaRequest,
    AlterClientQuotaResponse,
    DescribeTransactionalIdRequest,
    DescribeTransactionalIdResponse,
    InitTransactionalProducerRequest,
    InitTransactionalProducerResponse,
    MigrationCommandRequest,
    MigrationCommandResponse,
    RecordError,
    SeedProducerIdsRequest,
    SeedProducerIdsResponse,
)

# kio resolves a schema class by importing its module by name on every call (pkgutil.resolve_name): cached,
# it is a dict lookup (it was a tenth of the leader's time per request).
load_request_schema = functools.lru_cache(maxsize=None)(kio.index.load_request_schema)
load_response_schema = functools.lru_cache(maxsize=None)(kio.index.load_response_schema)

# The record RPCs: request record -> response record.
RPC_RESPONSES: dict[type, type] = {
    InitTransactionalProducerRequest: InitTransactionalProducerResponse,
    DescribeTransactionalIdRequest: DescribeTransactionalIdResponse,
    SeedProducerIdsRequest: SeedProducerIdsResponse,
    MigrationCommandRequest: MigrationCommandResponse,
    AlterAclsRequest: AlterAclsResponse,
    DescribeAclsRequest: DescribeAclsResponse,
    AlterClientQuotaRequest: AlterClientQuotaResponse,
}
from records.codec import from_obj, to_obj

from .errors import Errors
from .wirecheck import FrameBoundsError, check_request

log = logging.getLogger(__name__)

API_VERSIONS = 18
BROKER_REGISTRATION = 62
BROKER_HEARTBEAT = 63
ALLOCATE_PRODUCER_IDS = 67
DESCRIBE_CLIENT_QUOTAS = 48  # Kafka's own API: brokers poll the quota configuration with it
ADMIN_API_KEY = 10001  # pidquorum DescribeState (msgpack body); outside Kafka's key space
RECORD_API_KEY = 10002  # pidquorum RPCs whose request and response are records (records/schema.py), msgpack
TXN_API_KEY = RECORD_API_KEY  # the transactional-id RPCs travel on it
MSGPACK_APIS = {ADMIN_API_KEY: "DescribeState", RECORD_API_KEY: "pidquorum RPC"}

SUPPORTED: dict[int, tuple[int, int]] = {
    API_VERSIONS: (0, 3),
    BROKER_REGISTRATION: (0, 4),
    BROKER_HEARTBEAT: (0, 1),
    ALLOCATE_PRODUCER_IDS: (0, 0),
    DESCRIBE_CLIENT_QUOTAS: (0, 1),
}
API_NAMES = {API_VERSIONS: "ApiVersions", BROKER_REGISTRATION: "BrokerRegistration",
             BROKER_HEARTBEAT: "BrokerHeartbeat", ALLOCATE_PRODUCER_IDS: "AllocateProducerIds",
             DESCRIBE_CLIENT_QUOTAS: "DescribeClientQuotas",
             **MSGPACK_APIS}
DEFAULT_MAX_FRAME = 1024 * 1024
SIZE = struct.Struct(">i")


class FrameError(Exception):
    """The frame cannot be answered (no usable header, unknown API): close the connection."""


class BadRequest(Exception):
    """The header is readable but the request is not: answer with ``code``."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int, code: Errors, message: str):
        super().__init__(message)
        self.api_key, self.api_version, self.correlation_id = api_key, api_version, correlation_id
        self.code = code
        self.message = message


@dataclass
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # a kio entity, or a dict for the admin API
    raw: bytes  # the whole frame, without the size prefix (for forwarding)
    trailing: int = 0  # bytes after the body (accepted only where trailing_ok)
    # Who sent it: "User:<name>" once the connection has authenticated (SASL),
    # else "User:ANONYMOUS". Set by the server per connection, read by ACLs and quotas.
    principal: str = "User:ANONYMOUS"


def _ms(ms: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=max(0, int(ms)))


async def read_frame(reader: Any, max_bytes: int) -> bytes | None:
    """The next size-prefixed frame from an ``asyncio.StreamReader``; None at a clean end of stream.

    Raises FrameError for a size outside 1..max_bytes (nothing more is read) or a
    stream that ends inside a frame.
    """
    try:
        size = SIZE.unpack(await reader.readexactly(4))[0]
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise FrameError(f"truncated frame size ({len(e.partial)} of 4 bytes)") from None
        return None
    if size <= 0 or size > max_bytes:
        raise FrameError(f"frame of {size} bytes is outside 1..{max_bytes}")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as e:
        raise FrameError(f"truncated frame ({len(e.partial)} of {size} bytes)") from None


async def iter_frames(reader: Any, max_bytes: int, peer: Any, counters: dict) -> AsyncIterator[bytes]:
    """Frames from a client until its stream ends, or a bad frame (counted in
    ``counters["bad_frames"]`` and logged) ends the connection."""
    while True:
        try:
            frame = await read_frame(reader, max_bytes)
        except FrameError as e:
            counters["bad_frames"] += 1
            log.warning("client %s: %s; closing", peer, e)
            return
        if frame is None:
            return
        yield frame


def parse_request(frame: bytes, supported: dict[int, tuple[int, int]] | None = None,
                  names: dict[int, str] | None = None, trailing_ok: bool = False) -> Request:
    """Parse one request frame (size prefix removed).

    ``supported`` (API key -> version range) and ``names`` default to the
    quorum's client port; the broker front end passes its own.  The msgpack
    APIs are served only where ``supported`` is the quorum's.

    Bytes after the body are INVALID_REQUEST unless ``trailing_ok``: Kafka
    brokers ignore them, and librdkafka 2.16 relies on it (its all-topics
    Metadata v12 leaves 3 bytes of a 4-byte array-count placeholder behind).
    ``Request.trailing`` says how many there were.
    """
    quorum_port = supported is None
    supported = SUPPORTED if supported is None else supported
    names = API_NAMES if names is None else names
    if len(frame) < 8:
        raise FrameError(f"truncated request header ({len(frame)} bytes)")
    api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame)
    if quorum_port and api_key in MSGPACK_APIS:
        return _parse_msgpack(frame, api_key, api_version, correlation_id)
    if api_key not in supported:
        raise FrameError(f"unknown API key {api_key}")
    lo, hi = supported[api_key]
    name = names.get(api_key, f"API {api_key}")
    if not lo <= api_version <= hi:
        raise BadRequest(api_key, api_version, correlation_id, Errors.UNSUPPORTED_VERSION,
                         f"{name} v{api_version} is not supported (supported: v{lo}-v{hi})")
    req_cls = load_request_schema(api_key, api_version)
    try:
        check_request(frame, req_cls.__header_schema__, req_cls)
    except FrameBoundsError as e:
        raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                         f"malformed {name} v{api_version} request: {e}") from None
    try:
        header, off = entity_reader(req_cls.__header_schema__)(frame, 0)
    except (SerialError, ValueError, UnicodeDecodeError, KeyError) as e:  # kio: KeyError for unknown tags
        raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                         f"unreadable {name} v{api_version} header: {type(e).__name__}: {e}") from None
    try:
        body, size = entity_reader(req_cls)(frame, off)  # kio readers return (value, bytes read)
        off += size
    except (SerialError, ValueError, UnicodeDecodeError, TypeError, KeyError) as e:
        raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                         f"malformed {name} v{api_version} body: {type(e).__name__}: {e}") from None
    if off != len(frame) and not trailing_ok:
        raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                         f"{len(frame) - off} unexpected bytes after the {name} body")
    return Request(api_key, api_version, correlation_id, header.client_id, body, frame, len(frame) - off)


def _parse_msgpack(frame: bytes, api_key: int, api_version: int, correlation_id: int) -> Request:
    name = MSGPACK_APIS[api_key]
    try:
        header, off = entity_reader(RequestHeaderV1)(frame, 0)
    except (SerialError, ValueError, UnicodeDecodeError) as e:
        raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                         f"unreadable {name} v{api_version} header: {type(e).__name__}: {e}") from None
    if api_version != 0:
        raise BadRequest(api_key, api_version, correlation_id, Errors.UNSUPPORTED_VERSION,
                         f"{name} v{api_version} is not supported (supported: v0-v0)")
    try:
        body = msgpack.unpackb(frame[off:], raw=False)
    except (ValueError, msgpack.ExtraData) as e:
        raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                         f"malformed {name} body: {e}") from None
    if api_key == TXN_API_KEY:
        try:
            body = decode_payload(body, tuple(RPC_RESPONSES))
        except RecordError as e:
            raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                             f"malformed {name} body: {e}") from None
    elif not isinstance(body, dict):
        raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST, f"{name} body must be a map")
    return Request(api_key, api_version, correlation_id, header.client_id, body, frame)


def decode_payload(obj: Any, cls: type | tuple[type, ...]) -> Any:
    """A msgpack-decoded ``[type, version, fields]`` payload of one of the expected record classes."""
    rec = from_obj(obj)
    if not isinstance(rec, cls):
        names = " or ".join(c.SPEC.name for c in (cls if isinstance(cls, tuple) else (cls,)))
        raise RecordError(f"expected {names}, got {type(rec).SPEC.name}")
    return rec


# ----------------------------------------------------------------- responses


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
    """A whole response frame, size prefix included."""
    buf = io.BytesIO()
    if api_key in MSGPACK_APIS:
        entity_writer(ResponseHeaderV0)(buf, ResponseHeaderV0(correlation_id=i32(correlation_id)))
        buf.write(msgpack.packb(body if isinstance(body, dict) else to_obj(body), use_bin_type=True))
    else:
        resp_cls = load_response_schema(api_key, api_version)
        entity_writer(resp_cls.__header_schema__)(buf, resp_cls.__header_schema__(correlation_id=i32(correlation_id)))
        entity_writer(resp_cls)(buf, body)
    data = buf.getvalue()
    return SIZE.pack(len(data)) + data


def api_versions_body(version: int, code: Errors = Errors.NONE,
                      supported: dict[int, tuple[int, int]] | None = None) -> Any:
    resp_cls = load_response_schema(API_VERSIONS, version)
    module = __import__(resp_cls.__module__, fromlist=["ApiVersion"])
    entry_cls = getattr(module, "ApiVersion", None) or getattr(module, "ApiVersionsResponseKey")
    keys = tuple(entry_cls(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                 for k, (lo, hi) in sorted((SUPPORTED if supported is None else supported).items()))
    kwargs: dict[str, Any] = {"error_code": ErrorCode(int(code)), "api_keys": keys}
    if version >= 1:
        kwargs["throttle_time"] = _ms(0)
    return resp_cls(**kwargs)


def error_body(api_key: int, api_version: int, code: Errors, throttle_ms: int = 0) -> Any:
    """The response body that carries only an error, for any supported API and version."""
    if api_key == ADMIN_API_KEY:
        return {"error_code": int(code)}
    if api_key == TXN_API_KEY:
        return InitTransactionalProducerResponse(error_code=int(code), error_message=code.name)
    if api_key == API_VERSIONS:
        return api_versions_body(api_version, code)
    resp_cls = load_response_schema(api_key, api_version)
    err = ErrorCode(int(code))
    if api_key == ALLOCATE_PRODUCER_IDS:
        return resp_cls(throttle_time=_ms(throttle_ms), error_code=err, producer_id_start=i64(-1),
                        producer_id_len=i32(0))
    if api_key == BROKER_REGISTRATION:
        return resp_cls(throttle_time=_ms(throttle_ms), error_code=err, broker_epoch=i64(-1))
    if api_key == BROKER_HEARTBEAT:
        return resp_cls(throttle_time=_ms(throttle_ms), error_code=err, is_caught_up=False, is_fenced=True,
                        should_shut_down=False)
    if api_key == DESCRIBE_CLIENT_QUOTAS:
        return resp_cls(throttle_time=_ms(throttle_ms), error_code=err, error_message=code.name, entries=None)
    raise ValueError(f"no error body for API {api_key}")  # pragma: no cover


def error_response(bad: BadRequest, supported: dict[int, tuple[int, int]] | None = None,
                   make_body: Any = None) -> bytes:
    """Answer a bad request.  An unsupported version is answered in the nearest supported
    version's layout (ApiVersions: v0, as Kafka does, with the supported ranges).

    ``supported`` and ``make_body(api_key, version, code)`` default to the quorum port's.
    """
    api_key, version = bad.api_key, bad.api_version
    table = SUPPORTED if supported is None else supported
    if api_key in MSGPACK_APIS and supported is None:
        version = 0
    else:
        lo, hi = table[api_key]
        if api_key == API_VERSIONS and not lo <= version <= hi:
            version = 0
        version = min(max(version, lo), hi)
    if api_key == API_VERSIONS:
        body = api_versions_body(version, bad.code, table)
    elif api_key == TXN_API_KEY and supported is None:
        body = InitTransactionalProducerResponse(error_code=int(bad.code), error_message=bad.message)
    else:
        body = (make_body or error_body)(api_key, version, bad.code)
    return encode_response(api_key, version, bad.correlation_id, body)


def allocate_response(start: int, length: int, throttle_ms: int = 0) -> Any:
    resp_cls = load_response_schema(ALLOCATE_PRODUCER_IDS, 0)
    return resp_cls(throttle_time=_ms(throttle_ms), error_code=ErrorCode.none, producer_id_start=i64(start),
                    producer_id_len=i32(length))


def client_quotas_response(version: int, entries: list[dict]) -> Any:
    """DescribeClientQuotas: one entry per user (entity_name None: the default), its quota values."""
    resp_cls = load_response_schema(DESCRIBE_CLIENT_QUOTAS, version)
    module = __import__(resp_cls.__module__, fromlist=["EntryData"])
    return resp_cls(throttle_time=_ms(0), error_code=ErrorCode.none, error_message=None, entries=tuple(
        module.EntryData(entity=(module.EntityData(entity_type="user", entity_name=e["user"]),),
                         values=tuple(module.ValueData(key=k, value=f64(v)) for k, v in e["values"].items()))
        for e in entries))


def registration_response(version: int, epoch: int) -> Any:
    resp_cls = load_response_schema(BROKER_REGISTRATION, version)
    return resp_cls(throttle_time=_ms(0), error_code=ErrorCode.none, broker_epoch=i64(epoch))


def heartbeat_response(version: int, is_fenced: bool, should_shut_down: bool) -> Any:
    resp_cls = load_response_schema(BROKER_HEARTBEAT, version)
    return resp_cls(throttle_time=_ms(0), error_code=ErrorCode.none, is_caught_up=True, is_fenced=is_fenced,
                    should_shut_down=should_shut_down)


# ------------------------------------------------------------------ requests


def encode_request(body: Any, correlation_id: int, client_id: str = "pidquorum") -> bytes:
    """A whole request frame for a kio request entity, size prefix included."""
    buf = io.BytesIO()
    header_cls = type(body).__header_schema__
    entity_writer(header_cls)(buf, header_cls(request_api_key=i16(body.__api_key__),
                                              request_api_version=i16(body.__version__),
                                              correlation_id=i32(correlation_id), client_id=client_id))
    entity_writer(type(body))(buf, body)
    data = buf.getvalue()
    return SIZE.pack(len(data)) + data


def msgpack_api_of(body: Any) -> int:
    """The msgpack API a request body belongs to: a dict is DescribeState, a record its own API."""
    if isinstance(body, dict):
        return ADMIN_API_KEY
    if type(body) in RPC_RESPONSES:
        return RECORD_API_KEY
    raise TypeError(f"not a pidquorum msgpack request: {type(body).__name__}")


def encode_admin_request(body: Any, correlation_id: int, client_id: str = "pidquorum") -> bytes:
    """A msgpack API request frame: DescribeState (a dict) or InitTransactionalProducer (its record)."""
    buf = io.BytesIO()
    entity_writer(RequestHeaderV1)(buf, RequestHeaderV1(request_api_key=i16(msgpack_api_of(body)),
                                                        request_api_version=i16(0),
                                                        correlation_id=i32(correlation_id), client_id=client_id))
    buf.write(msgpack.packb(body if isinstance(body, dict) else to_obj(body), use_bin_type=True))
    data = buf.getvalue()
    return SIZE.pack(len(data)) + data


def parse_response(frame: bytes, api_key: int, api_version: int) -> tuple[int, Any]:
    """(correlation id, body) of a response frame (size prefix removed)."""
    if api_key in MSGPACK_APIS:
        header, off = entity_reader(ResponseHeaderV0)(frame, 0)
        obj = msgpack.unpackb(frame[off:], raw=False)
        if api_key == TXN_API_KEY:
            obj = decode_payload(obj, tuple(RPC_RESPONSES.values()))
        return header.correlation_id, obj
    resp_cls = load_response_schema(api_key, api_version)
    header, off = entity_reader(resp_cls.__header_schema__)(frame, 0)
    body, _ = entity_reader(resp_cls)(frame, off)
    return header.correlation_id, body


def request_entity(api_key: int, api_version: int, **fields: Any) -> Any:
    return load_request_schema(api_key, api_version)(**fields)


def listeners(address: str) -> tuple:
    """BrokerRegistration listeners for one "host:port" ("" gives none)."""
    if not address:
        return ()
    host, _, port = address.rpartition(":")
    from kio.schema.broker_registration.v0.request import Listener

    return (Listener(name="PLAINTEXT", host=host, port=u16(int(port)), security_protocol=i16(0)),)


def listener_address(body: Any) -> str:
    for lst in getattr(body, "listeners", ()):
        return f"{lst.host}:{lst.port}"
    return ""
