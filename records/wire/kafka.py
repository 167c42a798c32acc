"""Kafka request and response frames, with kio's codecs: bytes in, values out.

Every server (the quorum's client port, the broker, the SASL gate in front of
both) declares the APIs it serves as an ``ApiTable``; parsing, error answers and
encoding read only that table, so nothing here knows which server it serves.

A table may also carry ``MsgpackApi`` extensions: API keys outside Kafka's space
whose requests use header v1 and whose bodies are msgpack (the quorum's
DescribeState and record RPCs).
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import io
import logging
import struct
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

import kio.index
import msgpack
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.primitive import i16, i32

from . import fixed
from .bounds import FrameBoundsError, check_request, without_unknown_tags
from .errors import Errors

log = logging.getLogger(__name__)

# kio resolves a schema class by importing its module by name on every call (pkgutil.resolve_name): cached,
# it is a dict lookup (it was a tenth of the leader's time per request).
load_request_schema = functools.lru_cache(maxsize=None)(kio.index.load_request_schema)
load_response_schema = functools.lru_cache(maxsize=None)(kio.index.load_response_schema)

API_VERSIONS = 18  # every server answers it
DEFAULT_MAX_FRAME = 1024 * 1024
SIZE = struct.Struct(">i")


class FrameError(Exception):
    """The frame cannot be answered (no usable header, unknown API, unsupported version): close the
    connection.

    ``counter``: the server counter it goes to.  ``kind``: None, or what a server logs once per process
    (``quorum.telemetry.logs.FirstOfEach``), since a client sends the same request again on every reconnect."""
    counter = "bad_frames"
    kind: tuple | None = None


class UnknownApi(FrameError):
    """An API key the table does not serve.  Kafka closes the connection: the body's layout is unknown,
    and so is the layout of any answer the client could read."""

    def __init__(self, api_key: int):
        super().__init__(f"unknown API key {api_key}")
        self.api_key = api_key
        self.kind = ("unknown API key", api_key)


class UnsupportedVersion(FrameError):
    """A Kafka API at a version outside the table's range (ApiVersions excepted: it is answered).

    Kafka closes the connection (``SocketServer`` parses the header, finds the version not enabled and
    closes): an answer in another version's layout would be read by the client as that version's answer
    (an empty success where the layout has no top-level error code), and a client that negotiated with
    ApiVersions never sends one."""
    counter = "unsupported_versions"

    def __init__(self, api_key: int, api_version: int, name: str, lo: int, hi: int):
        super().__init__(f"{name} v{api_version} is not supported (supported: v{lo}-v{hi})")
        self.api_key, self.api_version = api_key, api_version
        self.kind = ("unsupported version", api_key, api_version)


class BadRequest(Exception):
    """The header is readable but the request is not: answer with ``code``.

    ``kind``: None, or what a server logs once per process, as for ``FrameError`` (ApiVersions at a
    newer version than the server's: every client that negotiates sends it on every connection)."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int, code: Errors, message: str,
                 kind: tuple | None = None):
        super().__init__(message)
        self.api_key, self.api_version, self.correlation_id = api_key, api_version, correlation_id
        self.code = code
        self.message = message
        self.kind = kind


@dataclass
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # a kio entity, or what a MsgpackApi decoded
    trailing: int = 0  # bytes after the body (accepted only where the table's trailing_ok)
    # Who sent it: "User:<name>" once the connection has authenticated (SASL),
    # else "User:ANONYMOUS". Set by the server per connection, read by ACLs and quotas.
    principal: str = "User:ANONYMOUS"
    host: str | None = None  # the client's address, set with the principal: ACL entries may name a host
    raw: bytes = b""  # the frame as it arrived (size prefix removed): what a follower forwards to the leader
    forwarded: bool = False  # it came from another node (inside an Envelope): never forwarded again


def ms(value: int) -> datetime.timedelta:
    """A Kafka duration field (throttle time ...) from milliseconds; negative is 0."""
    return datetime.timedelta(milliseconds=max(0, int(value)))


@dataclass(frozen=True)
class MsgpackApi:
    """A non-Kafka API: request header v1, response header v0, msgpack bodies (version 0 only).

    ``decode_request``/``decode_response`` turn the unpacked msgpack object into the
    body (ValueError for a malformed one); ``encode`` the other way round;
    ``error_body(code, message)`` is the body that carries only an error (a server's; a client's
    table has none).
    """
    name: str
    decode_request: Callable[[Any], Any]
    decode_response: Callable[[Any], Any]
    encode: Callable[[Any], Any]
    error_body: Callable[[Errors, str], Any] | None = None

    def with_error_body(self, error_body: Callable[[Errors, str], Any]) -> "MsgpackApi":
        return dataclasses.replace(self, error_body=error_body)


ErrorBody = Callable[[int, int, Errors, str, int], Any]  # (api key, version, code, message, throttle ms) -> body


@dataclass(frozen=True)
class ApiTable:
    """The APIs one server answers: versions, names, the body of an error answer, extensions.

    ``internal`` keys are parsed but not listed in ApiVersions (what only other nodes send)."""
    versions: Mapping[int, tuple[int, int]]
    names: Mapping[int, str]
    error_body: ErrorBody | None  # a client's table (parsing answers only) has none
    msgpack: Mapping[int, MsgpackApi] = field(default_factory=dict)
    internal: frozenset[int] = frozenset()
    # Bytes after a body: INVALID_REQUEST unless trailing_ok.  Kafka brokers ignore them,
    # and librdkafka 2.16 relies on it (its all-topics Metadata v12 leaves 3 bytes of a
    # 4-byte array-count placeholder behind).
    trailing_ok: bool = False

    def name(self, api_key: int) -> str:
        return self.names.get(api_key) or (self.msgpack[api_key].name if api_key in self.msgpack
                                            else f"API {api_key}")

    def parse(self, frame: bytes) -> Request:
        """One request frame (size prefix removed); FrameError or BadRequest if it cannot be served.

        FrameError (close the connection, as Kafka does): no readable header, an unknown API key
        (``UnknownApi``), a Kafka API other than ApiVersions at a version outside its range
        (``UnsupportedVersion``).  BadRequest (answer it): ApiVersions at any other version, a bad header
        or body of a supported version, a MsgpackApi at a version other than 0 (its answer is a
        self-describing msgpack body, which any version of the client can read)."""
        if len(frame) < 8:
            raise FrameError(f"truncated request header ({len(frame)} bytes)")
        api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame)
        if api_key in self.msgpack:
            return self._parse_msgpack(frame, api_key, api_version, correlation_id)
        if api_key not in self.versions:
            raise UnknownApi(api_key)
        lo, hi = self.versions[api_key]
        name = self.name(api_key)
        if not lo <= api_version <= hi:
            if api_key != API_VERSIONS:
                raise UnsupportedVersion(api_key, api_version, name, lo, hi)
            # As Kafka does (KIP-511): answered UNSUPPORTED_VERSION with the ranges, in v0, so the client
            # can pick a version both sides serve.
            raise BadRequest(api_key, api_version, correlation_id, Errors.UNSUPPORTED_VERSION,
                             f"{name} v{api_version} is not supported (supported: v{lo}-v{hi})",
                             kind=("unsupported version", api_key, api_version))
        req_cls = load_request_schema(api_key, api_version)
        fast = fixed.read_request(frame, req_cls)
        if fast is not None:
            return Request(api_key, api_version, correlation_id, fast[1], fast[2], 0, raw=frame)
        raw = frame
        edits: list = []
        try:
            check_request(frame, req_cls.__header_schema__, req_cls, edits)
        except FrameBoundsError as e:
            raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                             f"malformed {name} v{api_version} request: {e}") from None
        if edits:  # tagged fields this version does not know: skipped, as Kafka does (KIP-482)
            frame = without_unknown_tags(bytes(frame), edits)
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
        if off != len(frame) and not self.trailing_ok:
            raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                             f"{len(frame) - off} unexpected bytes after the {name} body")
        return Request(api_key, api_version, correlation_id, header.client_id, body, len(frame) - off, raw=raw)

    def _parse_msgpack(self, frame: bytes, api_key: int, api_version: int, correlation_id: int) -> Request:
        api = self.msgpack[api_key]
        try:
            header, off = entity_reader(RequestHeaderV1)(frame, 0)
        except (SerialError, ValueError, UnicodeDecodeError) as e:
            raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                             f"unreadable {api.name} v{api_version} header: {type(e).__name__}: {e}") from None
        if api_version != 0:
            raise BadRequest(api_key, api_version, correlation_id, Errors.UNSUPPORTED_VERSION,
                             f"{api.name} v{api_version} is not supported (supported: v0-v0)")
        try:
            body = api.decode_request(msgpack.unpackb(frame[off:], raw=False))
        except (ValueError, msgpack.ExtraData) as e:
            raise BadRequest(api_key, api_version, correlation_id, Errors.INVALID_REQUEST,
                             f"malformed {api.name} body: {e}") from None
        return Request(api_key, api_version, correlation_id, header.client_id, body, raw=frame)

    def encode(self, api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
        """A whole response frame, size prefix included."""
        buf = io.BytesIO()
        if api_key in self.msgpack:
            entity_writer(ResponseHeaderV0)(buf, ResponseHeaderV0(correlation_id=i32(correlation_id)))
            buf.write(msgpack.packb(self.msgpack[api_key].encode(body), use_bin_type=True))
        else:
            resp_cls = load_response_schema(api_key, api_version)
            data = fixed.write_response(resp_cls, correlation_id, body)
            if data is not None:
                return SIZE.pack(len(data)) + data
            entity_writer(resp_cls.__header_schema__)(buf,
                                                      resp_cls.__header_schema__(correlation_id=i32(correlation_id)))
            entity_writer(resp_cls)(buf, body)
        data = buf.getvalue()
        return SIZE.pack(len(data)) + data

    def error(self, api_key: int, api_version: int, code: Errors, message: str = "", throttle_ms: int = 0) -> Any:
        """The response body that carries only ``code``, for any API and version of the table."""
        if api_key in self.msgpack:
            return self.msgpack[api_key].error_body(code, message or code.name)
        if api_key == API_VERSIONS:
            return api_versions_body(api_version, code,
                                     {k: v for k, v in self.versions.items() if k not in self.internal})
        return self.error_body(api_key, api_version, code, message, throttle_ms)

    def error_response(self, bad: BadRequest) -> bytes:
        """Answer a bad request, in its own version's layout; ApiVersions at a version outside its range
        in v0, as Kafka does, with the supported ranges (``parse`` raises BadRequest for no other
        unsupported version of a Kafka API)."""
        api_key, version = bad.api_key, bad.api_version
        if api_key in self.msgpack:
            version = 0
        else:
            lo, hi = self.versions[api_key]
            if not lo <= version <= hi:
                if api_key != API_VERSIONS:
                    raise ValueError(f"{self.name(api_key)} v{version} is outside v{lo}-v{hi}: no layout to answer in")
                version = 0
        return self.encode(api_key, version, bad.correlation_id, self.error(api_key, version, bad.code, bad.message))

    def parse_response(self, frame: bytes, api_key: int, api_version: int) -> tuple[int, Any]:
        """(correlation id, body) of a response frame (size prefix removed)."""
        if api_key in self.msgpack:
            header, off = entity_reader(ResponseHeaderV0)(frame, 0)
            return header.correlation_id, self.msgpack[api_key].decode_response(msgpack.unpackb(frame[off:],
                                                                                                raw=False))
        return parse_response(frame, api_key, api_version)


async def read_frame(reader: Any, max_bytes: int,
                     room: Callable[[int], Awaitable[None]] | None = None) -> bytes | None:
    """The next size-prefixed frame from an ``asyncio.StreamReader``; None at a clean end of stream.

    Raises FrameError for a size outside 1..max_bytes (nothing more is read) or a
    stream that ends inside a frame.  ``room``: awaited with the frame's size before
    its body is read, by a caller that bounds the bytes it holds (while it waits,
    nothing more is read from the stream).
    """
    try:
        size = SIZE.unpack(await reader.readexactly(4))[0]
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise FrameError(f"truncated frame size ({len(e.partial)} of 4 bytes)") from None
        return None
    if size <= 0 or size > max_bytes:
        raise FrameError(f"frame of {size} bytes is outside 1..{max_bytes}")
    if room is not None:
        await room(size)
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as e:
        raise FrameError(f"truncated frame ({len(e.partial)} of {size} bytes)") from None


async def iter_frames(reader: Any, max_bytes: int, peer: Any, counters: dict,
                      room: Callable[[int], Awaitable[None]] | None = None) -> AsyncIterator[bytes]:
    """Frames from a client until its stream ends, or a bad frame (counted in
    ``counters["bad_frames"]`` and logged) ends the connection (``room``: see ``read_frame``)."""
    while True:
        try:
            frame = await read_frame(reader, max_bytes, room)
        except FrameError as e:
            counters["bad_frames"] += 1
            log.warning("client %s: %s; closing", peer, e)
            return
        if frame is None:
            return
        yield frame


def api_versions_body(version: int, code: Errors, advertised: Mapping[int, tuple[int, int]]) -> Any:
    """An ApiVersions response body listing ``advertised`` (API key -> version range)."""
    resp_cls = load_response_schema(API_VERSIONS, version)
    module = __import__(resp_cls.__module__, fromlist=["ApiVersion"])
    entry_cls = getattr(module, "ApiVersion", None) or getattr(module, "ApiVersionsResponseKey")
    keys = tuple(entry_cls(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
                 for k, (lo, hi) in sorted(advertised.items()))
    kwargs: dict[str, Any] = {"error_code": ErrorCode(int(code)), "api_keys": keys}
    if version >= 1:
        kwargs["throttle_time"] = ms(0)
    return resp_cls(**kwargs)


def encode_request(body: Any, correlation_id: int, client_id: str = "pidquorum") -> bytes:
    """A whole request frame for a kio request entity, size prefix included."""
    data = fixed.write_request(body, correlation_id, client_id)
    if data is not None:
        return SIZE.pack(len(data)) + data
    buf = io.BytesIO()
    header_cls = type(body).__header_schema__
    entity_writer(header_cls)(buf, header_cls(request_api_key=i16(body.__api_key__),
                                              request_api_version=i16(body.__version__),
                                              correlation_id=i32(correlation_id), client_id=client_id))
    entity_writer(type(body))(buf, body)
    data = buf.getvalue()
    return SIZE.pack(len(data)) + data


def encode_msgpack_request(api_key: int, obj: Any, correlation_id: int, client_id: str = "pidquorum") -> bytes:
    """A request frame of a MsgpackApi: header v1, then ``obj`` (already encoded for msgpack)."""
    buf = io.BytesIO()
    entity_writer(RequestHeaderV1)(buf, RequestHeaderV1(request_api_key=i16(api_key), request_api_version=i16(0),
                                                        correlation_id=i32(correlation_id), client_id=client_id))
    buf.write(msgpack.packb(obj, use_bin_type=True))
    data = buf.getvalue()
    return SIZE.pack(len(data)) + data


def parse_response(frame: bytes, api_key: int, api_version: int) -> tuple[int, Any]:
    """(correlation id, body) of a Kafka API's response frame (size prefix removed)."""
    resp_cls = load_response_schema(api_key, api_version)
    header, off = entity_reader(resp_cls.__header_schema__)(frame, 0)
    body, _ = entity_reader(resp_cls)(frame, off)
    return header.correlation_id, body


def request_entity(api_key: int, api_version: int, **fields: Any) -> Any:
    return load_request_schema(api_key, api_version)(**fields)


__all__ = ["API_VERSIONS", "ApiTable", "BadRequest", "DEFAULT_MAX_FRAME", "FrameError", "MsgpackApi", "Request",
           "SIZE", "UnknownApi", "UnsupportedVersion", "api_versions_body", "encode_msgpack_request",
           "encode_request", "iter_frames", "ms", "parse_response", "read_frame", "request_entity"]
