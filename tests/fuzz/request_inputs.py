"""Fuzz inputs for the servers' request decoders: every (API key, version) in ``quorum.client.api.SUPPORTED`` and
``broker.frontend.SUPPORTED`` built from kio's request schemas (nested entities, arrays, nullables and tagged
fields included), structured corruptions of those frames, and the request-decoder property."""
from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
import types
import typing
import uuid
from typing import Any, Callable

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from broker.frontend import NAMES, SUPPORTED, BrokerConfig, BrokerServer
from broker.recordbatch import encode_batch
from quorum.client import api as p
from quorum.rpcs import RPCS, SERVER_API
from records.wire import kafka
from records.wire.bounds import FrameBoundsError, _Cursor, _tagged, unwrap_optional
from records.wire.errors import Errors
from tests.fuzz.record_inputs import msgpack_request
from tests.fuzz.sources import FuzzFinding


# --------------------------------------------------------- kio entity values

_INTS = {"int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1),
         "int64": (-(2**63), 2**63 - 1), "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1),
         "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1)}
MAX_ARRAY = 3


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, str | None, bool, bool], ...]:
    """(name, element hint, kafka_type, is_array, nullable) per field of a kio entity."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        nullable = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
        hint = unwrap_optional(hint)
        array = typing.get_origin(hint) is tuple
        if array:
            elem = typing.get_args(hint)[0]
            hint = unwrap_optional(elem)
        out.append((f.name, hint, f.metadata.get("kafka_type"), array, nullable))
    return tuple(out)


def _scalar(src, hint: Any, kafka_type: str | None, depth: int) -> Any:
    if kafka_type is None:
        return build_entity(hint, src, depth + 1)
    if kafka_type in _INTS:
        return hint(src.integer(*_INTS[kafka_type])) if hint is not int else src.integer(*_INTS[kafka_type])
    if kafka_type == "bool":
        return src.boolean()
    if kafka_type == "string":
        return src.text(12)
    if kafka_type == "bytes":
        return src.binary(24)
    if kafka_type == "records":
        return _records(src)
    if kafka_type == "uuid":
        return uuid.UUID(int=src.integer(1, 2**128 - 1))  # kio reads the zero UUID as null
    if kafka_type == "timedelta_i32":
        return datetime.timedelta(milliseconds=src.integer(-(2**31), 2**31 - 1))
    if kafka_type == "timedelta_i64":
        return datetime.timedelta(milliseconds=src.integer(-(2**40), 2**40))
    if kafka_type == "float64":
        return float(src.integer(-(2**20), 2**20))
    if kafka_type == "error_code":
        return src.choice(list(ErrorCode))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(src.integer(0, 2**33) / 1000, datetime.timezone.utc)
    raise TypeError(f"no generator for kafka type {kafka_type!r}")


def _records(src) -> bytes:
    """A record-batch field: a real v2 batch (maybe with bad counters), or raw bytes."""
    if src.boolean(0.6):
        n = src.integer(1, 3)
        return encode_batch([(None if src.boolean() else src.binary(4), src.binary(8)) for _ in range(n)],
                            producer_id=src.integer(-1, 2**63 - 1), producer_epoch=src.integer(-1, 2**15 - 1),
                            base_sequence=src.integer(-1, 2**31 - 1))
    return src.binary(64)


def build_entity(cls: type, src, depth: int = 0) -> Any:
    """A valid instance of kio entity ``cls`` with every field drawn from ``src``."""
    kwargs: dict[str, Any] = {}
    for name, hint, kafka_type, array, nullable in _fields(cls):
        if nullable and src.boolean(0.15):
            kwargs[name] = None
            continue
        if array:
            n = src.integer(0, MAX_ARRAY if depth < 3 else 0)
            kwargs[name] = tuple(_scalar(src, hint, kafka_type, depth) for _ in range(n))
        else:
            kwargs[name] = _scalar(src, hint, kafka_type, depth)
    return cls(**kwargs)


def encode_frame(api_key: int, version: int, body: Any, correlation_id: int = 7,
                 client_id: str | None = "fuzz") -> bytes:
    """A request frame (no size prefix) with the header kio's schema calls for."""
    hdr_cls = type(body).__header_schema__
    buf = io.BytesIO()
    kw = dict(request_api_key=i16(api_key), request_api_version=i16(version), correlation_id=i32(correlation_id))
    if "client_id" in hdr_cls.__dataclass_fields__:
        kw["client_id"] = client_id
    entity_writer(hdr_cls)(buf, hdr_cls(**kw))
    entity_writer(type(body))(buf, body)
    return buf.getvalue()


def header_size(api_key: int, version: int, frame: bytes) -> int:
    """Where the body starts in a frame built by ``encode_frame`` (8 if unknown)."""
    try:
        cls = load_request_schema(api_key, version)
    except Exception:  # noqa: BLE001 - not a kio API (msgpack APIs, bogus keys)
        return min(len(frame), 8)
    cur = _Cursor(frame, 8)
    try:
        n = cur.int_be(2, "client_id")
        if n > 0:
            cur.skip(n, "client_id")
        if getattr(cls.__header_schema__, "__flexible__", False):
            _tagged(cur, "header")
    except FrameBoundsError:
        return min(len(frame), 8)
    return cur.pos


# ------------------------------------------------------------------ targets


@dataclasses.dataclass(frozen=True)
class Api:
    server: str  # "quorum" | "broker"
    api_key: int
    version: int

    @property
    def name(self) -> str:
        names = p.API_NAMES if self.server == "quorum" else broker_tables()[1]
        return f"{self.server}:{names.get(self.api_key, self.api_key)}v{self.version}"


@functools.cache
def broker_tables() -> tuple[dict, dict]:
    return SUPPORTED, NAMES


def server_api(server: str) -> kafka.ApiTable:
    """The API table ``server`` parses and answers with: the quorum's, or the broker's (its own error bodies)."""
    if server == "quorum":
        return SERVER_API
    supported, names = broker_tables()
    error_body = _broker_error_body()
    return kafka.ApiTable(supported, names, lambda key, version, code, message, throttle_ms:
                          error_body(key, version, code), trailing_ok=True)


def kafka_apis(server: str) -> list[Api]:
    """Every (API key, version) a server's table parses (the quorum's: Envelope too), msgpack APIs excluded."""
    table = SERVER_API.versions if server == "quorum" else broker_tables()[0]
    return [Api(server, k, v) for k, (lo, hi) in sorted(table.items()) for v in range(lo, hi + 1)]


def valid_request(api: Api, src) -> tuple[bytes, Any]:
    """(frame, body) of a valid request of ``api``."""
    body = build_entity(load_request_schema(api.api_key, api.version), src)
    client_id = None if src.boolean(0.1) else src.text(10)
    return encode_frame(api.api_key, api.version, body, src.integer(-(2**31), 2**31 - 1), client_id), body


# -------------------------------------------------------------- corruptions

HUGE_VARINTS = [bytes.fromhex("ffffffff0f"), bytes.fromhex("ffffffff7f"), bytes.fromhex("ffffffffff01"),
                bytes.fromhex("80808080"), bytes.fromhex("feffffff07"), bytes.fromhex("8080808010")]
HUGE_FIXED = [struct.pack(">h", 0x7FFF), struct.pack(">h", -2), struct.pack(">i", 0x7FFFFFFF),
              struct.pack(">i", -2), struct.pack(">i", -1), struct.pack(">i", 1 << 24)]
CORRUPTIONS = ("truncate", "flip", "huge-varint", "huge-fixed", "version", "api-key", "trailing",
               "tagged", "splice", "random-body", "duplicate", "delete", "header")


def corrupt_frame(frame: bytes, src, body_start: int, others: Callable[[], bytes] | None = None) -> tuple[bytes, str]:
    """``frame`` with one or more structured corruptions; returns (frame, what was done)."""
    buf = bytearray(frame)
    done = []
    for _ in range(src.integer(1, 3)):
        how = src.choice(CORRUPTIONS)
        done.append(how)
        n = len(buf)
        start = min(body_start, n)
        if how == "truncate":
            del buf[src.integer(0, max(n - 1, 0)):]
        elif how == "flip" and n:
            for _ in range(src.integer(1, 4)):
                buf[src.integer(0, n - 1)] = src.choice([0x00, 0x01, 0x7F, 0x80, 0xFF, src.integer(0, 255)])
        elif how in ("huge-varint", "huge-fixed"):
            blob = src.choice(HUGE_VARINTS if how == "huge-varint" else HUGE_FIXED)
            at = src.integer(start, n)
            if src.boolean():
                buf[at:at + len(blob)] = blob  # overwrite
            else:
                buf[at:at + 1] = blob  # replace one (length) byte
        elif how == "version" and n >= 4:
            buf[2:4] = struct.pack(">h", src.choice([-1, 0, 1, 2, 3, 4, 5, 9, 12, 13, 0x7FFF, -(2**15),
                                                     src.integer(-(2**15), 2**15 - 1)]))
        elif how == "api-key" and n >= 2:
            keys = list(p.SUPPORTED) + list(broker_tables()[0]) + [p.ADMIN_API_KEY, p.RECORD_API_KEY, -1, 0x7FFF,
                                                                   src.integer(-(2**15), 2**15 - 1)]
            buf[0:2] = struct.pack(">h", src.choice(keys))
        elif how == "trailing":
            buf += src.choice([b"\x00", b"\x01", b"\xff" * 5, src.binary(16)])
        elif how == "tagged":
            # a tagged-field section: N fields of (tag, size, data), with sizes that may lie
            count = src.choice([1, 2, 0x7F, 2**31])
            sec = _uvarint(count)
            for _ in range(min(count, 3)):
                data = src.binary(6)
                size = src.choice([len(data), len(data) + 1, 0x7FFFFFFF, 0])
                sec += _uvarint(src.choice([0, 1, 2, 3, 0x7FFF, 2**31 - 1])) + _uvarint(size) + data
            if buf and buf[-1] == 0 and src.boolean():
                buf[-1:] = sec  # the body's own (empty) tagged-field section
            else:
                at = src.integer(start, n)
                buf[at:at] = sec
        elif how == "splice" and others is not None:
            other = others()
            buf[start:] = other[src.integer(0, len(other)):]
        elif how == "random-body":
            buf[start:] = src.binary(48)
        elif how == "duplicate" and n > start:
            a = src.integer(start, n - 1)
            b = src.integer(a, n)
            buf[b:b] = buf[a:b] * src.integer(1, 4)
        elif how == "delete" and n > start:
            a = src.integer(start, n - 1)
            del buf[a:a + src.integer(1, 8)]
        elif how == "header" and n >= 8:
            buf[8:start] = src.choice([b"", b"\xff\xff", b"\x7f\xff", b"\x00\x05ab", src.binary(6)])
    return bytes(buf), "+".join(done)


def _uvarint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def fuzz_frame(server: str, src) -> tuple[bytes, str]:
    """One input for a server's request decoder: a valid frame, a corrupted one, or a msgpack API frame."""
    apis = kafka_apis(server)
    if server == "quorum" and src.boolean(0.2):
        frame, how = msgpack_request(src)
        if src.boolean(0.3):
            frame, more = corrupt_frame(frame, src, 8)
            how += "|" + more
        return frame, "msgpack:" + how
    api = src.choice(apis)
    frame, _ = valid_request(api, src)
    if src.boolean(0.15):
        return frame, f"{api.name}:valid"

    def others() -> bytes:
        return valid_request(src.choice(apis), src)[0]
    frame, how = corrupt_frame(frame, src, header_size(api.api_key, api.version, frame), others)
    return frame, f"{api.name}:{how}"

# ------------------------------------------------------------ the properties

@functools.cache
def _broker_error_body() -> Callable:
    """The broker's own ``_error_body`` (it reads only ``cfg.cluster_id``), without starting a broker."""
    holder = types.SimpleNamespace(cfg=BrokerConfig(broker_id=1, quorum=["127.0.0.1:1"]))
    return functools.partial(BrokerServer._error_body, holder)


def check_request_decoder(server: str, frame: bytes) -> str:
    """The request-decoder property for one frame on ``server``.

    The frame is decoded exactly as that server does (``parse_request`` with its
    table, names and trailing-bytes rule), and then the answer the server would
    send is built and encoded: for a refused request the error response, for a
    decoded one the error body it falls back on if its handler fails.  Returns
    "frame-error" (connection closed), "bad-request:<code>" or "decoded:<api>";
    raises FuzzFinding for anything else.
    """
    api = server_api(server)
    try:
        req = api.parse(frame)
    except kafka.FrameError:
        return "frame-error"
    except kafka.BadRequest as e:
        if e.code not in (Errors.INVALID_REQUEST, Errors.UNSUPPORTED_VERSION):
            raise FuzzFinding(server, frame, f"BadRequest with code {e.code.name}") from None
        try:
            answer = api.error_response(e)
        except Exception as err:  # noqa: BLE001 - that is the finding
            raise FuzzFinding(server, frame, f"error_response failed: {type(err).__name__}: {err}") from err
        _check_answer(server, frame, answer, e.correlation_id)
        return f"bad-request:{e.code.name}"
    except Exception as err:  # noqa: BLE001 - that is the finding
        raise FuzzFinding(server, frame, f"parse_request raised {type(err).__name__}: {err}") from err
    if req.api_key not in api.versions and req.api_key not in api.msgpack:
        raise FuzzFinding(server, frame, f"decoded API {req.api_key}, which the server does not support")
    try:
        if server != "quorum":
            body = _broker_error_body()(req.api_key, req.api_version, Errors.UNKNOWN_SERVER_ERROR, req.body)
        else:
            body = RPCS.error_body(req.api_key, req.api_version, Errors.UNKNOWN_SERVER_ERROR, "x", body=req.body)
        answer = api.encode(req.api_key, req.api_version, req.correlation_id, body)
    except Exception as err:  # noqa: BLE001 - that is the finding
        raise FuzzFinding(server, frame, f"the error answer to a decoded {req.api_key} v{req.api_version} "
                                         f"request failed: {type(err).__name__}: {err}") from err
    _check_answer(server, frame, answer, req.correlation_id)
    return f"decoded:{req.api_key}"


def _check_answer(server: str, frame: bytes, answer: bytes, correlation_id: int) -> None:
    size = struct.unpack_from(">i", answer)[0]
    if size != len(answer) - 4 or struct.unpack_from(">i", answer, 4)[0] != correlation_id:
        raise FuzzFinding(server, frame, "the answer is not one frame carrying the request's correlation id")
