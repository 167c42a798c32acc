"""Inputs and decoder properties shared by the fuzz tests (tests/fuzz) and the campaign (``tests/fuzz/campaign.py``).

Everything is derived from the servers' own tables, so an API, version or
record type added later is fuzzed without touching this file:

* Kafka requests: every (API key, version) in ``quorum.client.api.SUPPORTED`` and
  ``broker.frontend.SUPPORTED``, built from kio's request schemas (field types
  from kio's ``kafka_type`` metadata; nested entities, arrays, nullables and
  tagged fields included).
* msgpack APIs: DescribeState maps and every record RPC request class in
  ``quorum.client.api.RPC_RESPONSES``.
* Records: every spec in ``records.schema.RECORDS + PAYLOADS``.

Values are drawn from a *source*: ``RandomSource`` (a seeded ``random.Random``,
for the campaign and the seeded mutation tests) or ``HypothesisSource`` (a
hypothesis ``data`` object, so hypothesis shrinks failures).

``corrupt_frame`` applies structured corruptions (truncation, lengths made
huge or negative, bad varints and tagged fields, other versions and API keys,
spliced bodies, flipped bytes).  The ``check_*`` functions are the decoder
properties: they return an outcome name, and any exception they let through
is a finding.
"""
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

import msgpack
from kio.index import load_request_schema
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from quorum.client import api as p
from quorum.rpcs import RPCS, SERVER_API
from records import schema as rschema
from records.codec import CLASSES, Record, RecordError, decode, decode_batch, from_json_dict, from_obj, to_obj
from records.wire import kafka
from records.wire.bounds import unwrap_optional
from records.wire.errors import Errors

# ------------------------------------------------------- hypothesis settings

SCALE_ENV = "PIDQUORUM_FUZZ_SCALE"  # multiplies every example count (default 1)
PROFILE_ENV = "PIDQUORUM_HYPOTHESIS_PROFILE"  # "pidquorum-ci" (default) or "pidquorum-explore"


def load_hypothesis_profile() -> None:
    """Reproducible by default (derandomized, no example database): the same inputs on every
    run and in CI.  ``PIDQUORUM_HYPOTHESIS_PROFILE=pidquorum-explore`` draws new ones each run."""
    import os

    from hypothesis import HealthCheck, settings

    common = dict(deadline=None, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.function_scoped_fixture])
    settings.register_profile("pidquorum-ci", derandomize=True, database=None, **common)
    settings.register_profile("pidquorum-explore", derandomize=False, **common)
    settings.load_profile(os.environ.get(PROFILE_ENV, "pidquorum-ci"))


def examples(n: int) -> int:
    import os

    return max(1, int(n * float(os.environ.get(SCALE_ENV, "1"))))


# ------------------------------------------------------------ memory bound

HEADROOM = 2 * 1024**3  # address space a decoder may take beyond what the process has in use


def vm_size() -> int:
    """The address space this process has in use (VmSize), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover


# ------------------------------------------------------------------ sources


class RandomSource:
    """Draws from a seeded ``random.Random``, biased towards edge values."""

    def __init__(self, rng):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        r = self.rng.random()
        if r < 0.25:
            edges = [v for v in (lo, hi, 0, 1, -1, lo + 1, hi - 1) if lo <= v <= hi]
            return self.rng.choice(edges)
        if r < 0.6:
            small = max(lo, -300), min(hi, 300)
            if small[0] <= small[1]:
                return self.rng.randint(*small)
        return self.rng.randint(lo, hi)

    def boolean(self, p_true: float = 0.5) -> bool:
        return self.rng.random() < p_true

    def choice(self, seq):
        return seq[self.rng.randrange(len(seq))]

    def binary(self, max_len: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_len))

    def text(self, max_len: int) -> str:
        n = self.rng.randint(0, max_len)
        alphabet = "abcXYZ019-_.:/ é€😀\x00"
        return "".join(self.rng.choice(alphabet) for _ in range(n))


class HypothesisSource:
    """Draws through a hypothesis ``data`` object (``st.data()``), so failures shrink."""

    def __init__(self, data):
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def boolean(self, p_true: float = 0.5) -> bool:
        return self.data.draw(self.st.booleans())

    def choice(self, seq):
        return self.data.draw(self.st.sampled_from(list(seq)))

    def binary(self, max_len: int) -> bytes:
        return self.data.draw(self.st.binary(max_size=max_len))

    def text(self, max_len: int) -> str:
        return self.data.draw(self.st.text(max_size=max_len))


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
        from kio.schema.errors import ErrorCode

        return src.choice(list(ErrorCode))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(src.integer(0, 2**33) / 1000, datetime.timezone.utc)
    raise TypeError(f"no generator for kafka type {kafka_type!r}")


def _records(src) -> bytes:
    """A record-batch field: a real v2 batch (maybe with bad counters), or raw bytes."""
    if src.boolean(0.6):
        from broker.recordbatch import encode_batch

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
    from records.wire.bounds import FrameBoundsError, _Cursor, _tagged

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
    from broker.frontend import NAMES, SUPPORTED

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


# msgpack APIs (quorum only)
RPC_REQUESTS: tuple[type, ...] = tuple(p.RPC_RESPONSES)


def random_value(src, depth: int = 0) -> Any:
    """Any msgpack value (for wrong-typed fields and garbage bodies)."""
    kind = src.integer(0, 9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return src.boolean()
    if kind == 2:
        return src.integer(-(2**63), 2**64 - 1)
    if kind == 3:
        return float(src.integer(-(2**53), 2**53)) / 7
    if kind == 4:
        return src.text(10)
    if kind == 5:
        return src.binary(10)
    if kind == 6:
        return src.choice([float("inf"), float("-inf"), float("nan"), 2**64 - 1, -(2**63), 2**63])
    if kind in (7, 8):
        return [random_value(src, depth + 1) for _ in range(src.integer(0, 3))]
    return {src.text(6): random_value(src, depth + 1) for _ in range(src.integer(0, 3))}


def valid_field_value(src, f: rschema.FieldSpec) -> Any:
    if f.type in rschema.INT_RANGES:
        return src.integer(*rschema.INT_RANGES[f.type])
    if f.type == "bool":
        return src.boolean()
    if f.type == "string":
        return src.text(16)
    if f.type == "nullable_string":
        return None if src.boolean(0.3) else src.text(16)
    if f.type == "float64":
        return src.choice([0.0, -0.0, 0.5, float("inf"), float("nan"), 1e308]) if src.boolean(0.2) \
            else float(src.integer(-(2**53), 2**53)) / 8
    raise TypeError(f"no generator for record field type {f.type!r}")  # pragma: no cover


def valid_record(spec: rschema.RecordSpec, src) -> Record:
    return CLASSES[spec.type_id](**{f.name: valid_field_value(src, f) for f in spec.fields})


def wrong_value(src, f: rschema.FieldSpec) -> Any:
    """A value of the wrong type, or out of range, for field ``f``."""
    if f.type in rschema.INT_RANGES:
        lo, hi = rschema.INT_RANGES[f.type]
        ints = [v for v in (lo - 1, hi + 1, 2**64 - 1, -(2**63), 2**63)
                if not lo <= v <= hi and -(2**63) <= v <= 2**64 - 1]  # msgpack holds -2**63..2**64-1
        return src.choice(ints + [True, False, 1.0, "1", b"\x01", None, [1], {"a": 1}])
    if f.type == "bool":
        return src.choice([0, 1, "true", None, b"", [], 1.0])
    if f.type == "string":
        return src.choice([None, 1, b"bytes", [], {"a": "b"}, True, 2.5])
    if f.type == "float64":  # an int is refused too: 1 and 1.0 are different msgpack bytes
        return src.choice([None, 1, 0, 2**63, True, "1.5", b"\x01", [], {"a": 1.0}])
    return src.choice([1, b"bytes", [], {"a": "b"}, True, 2.5])  # nullable_string


def record_obj(src, specs: tuple[rschema.RecordSpec, ...] | None = None) -> tuple[Any, str]:
    """A ``[type, version, fields]`` object: valid, or with one structured corruption.

    Returns (object, what was done) -- "valid" when it must decode."""
    specs = specs or rschema.RECORDS + rschema.PAYLOADS
    spec = src.choice(list(specs))
    rec = valid_record(spec, src)
    obj = to_obj(rec)
    how = src.integer(0, 9)
    if how <= 2:
        return obj, "valid"
    if how == 3:  # one field of the wrong type or out of range
        i = src.integer(0, len(spec.fields) - 1)
        obj[2][i] = wrong_value(src, spec.fields[i])
        return obj, "wrong-field"
    if how == 4:  # unknown type id (or not an int)
        known = set(CLASSES)
        tid = src.choice([0, -1, 2**31, 2**64 - 1, max(known) + 1, 99, 130, True, "1", None, 1.0])
        if tid in known and not isinstance(tid, bool):
            tid = max(known) + 1
        return [tid, obj[1], obj[2]], "unknown-type"
    if how == 5:  # unknown or non-int version
        return [obj[0], src.choice([spec.version + 1, -1, 2**64 - 1, True, "0", None, 0.0]), obj[2]], "bad-version"
    if how == 6:  # too many / too few fields
        fields = list(obj[2])
        if src.boolean() and fields:
            fields.pop()
        else:
            fields.append(random_value(src))
        return [obj[0], obj[1], fields], "field-count"
    if how == 7:  # not an array of three
        return src.choice([obj[:2], obj + [1], {"type": obj[0]}, obj[0], None, "x", [obj]]), "shape"
    if how == 8:
        return random_value(src), "garbage"
    # an older version with its fields: still valid (missing fields take their defaults)
    if spec.version > 0:
        v = src.integer(0, spec.version - 1)
        return [obj[0], v, obj[2][:len(spec.fields_at(v))]], "valid"
    return obj, "valid"


def msgpack_request(src) -> tuple[bytes, str]:
    """A frame for one of the quorum's msgpack APIs: valid or with a structured corruption of its body."""
    admin = src.boolean(0.3)
    if admin:
        body: Any = src.choice([{}, {"action": None}, {"action": src.text(8)}, {"x": random_value(src)}])
        how = "admin"
        if src.boolean(0.4):
            body, how = random_value(src), "admin-garbage"
        api_key = p.ADMIN_API_KEY
    else:
        body, how = record_obj(src, tuple(c.SPEC for c in RPC_REQUESTS))
        api_key = p.RECORD_API_KEY
    hdr = struct.pack(">hhi", api_key, 0, src.integer(-(2**31), 2**31 - 1))
    client = src.text(8).encode()
    hdr += struct.pack(">h", len(client)) + client
    packed = msgpack.packb(body, use_bin_type=True)
    if src.boolean(0.2):  # truncated or extended msgpack
        packed = packed[:src.integer(0, len(packed))] if src.boolean() else packed + src.binary(4)
        how += "+bytes"
    return hdr + packed, how


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


class FuzzFinding(AssertionError):
    """A decoder broke its contract on one input (the input is kept for reproduction)."""

    def __init__(self, target: str, data: bytes, problem: str):
        super().__init__(f"{target}: {problem} (input {data[:200].hex()}{'...' if len(data) > 200 else ''})")
        self.target, self.data, self.problem = target, data, problem


@functools.cache
def _broker_error_body() -> Callable:
    """The broker's own ``_error_body`` (it reads only ``cfg.cluster_id``), without starting a broker."""
    from broker.frontend import BrokerConfig, BrokerServer

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


def check_record_decoder(data: bytes) -> str:
    """``records.decode`` and ``decode_batch``: a record / batch, or RecordError."""
    out = []
    for fn in (decode, decode_batch):
        try:
            rec = fn(data)
        except RecordError:
            out.append("error")
            continue
        except Exception as err:  # noqa: BLE001 - that is the finding
            raise FuzzFinding(f"records.{fn.__name__}", data, f"raised {type(err).__name__}: {err}") from err
        for r in (rec if isinstance(rec, list) else [rec]):
            check_record_values(r, data)
        out.append("ok")
    return "/".join(out)


def check_record_obj(obj: Any) -> str:
    """``from_obj`` on a decoded msgpack object: a valid record, or RecordError."""
    data = msgpack.packb(obj, use_bin_type=True) if _packable(obj) else repr(obj).encode()
    try:
        rec = from_obj(obj)
    except RecordError:
        return "error"
    except Exception as err:  # noqa: BLE001 - that is the finding
        raise FuzzFinding("records.from_obj", data, f"raised {type(err).__name__}: {err}") from err
    check_record_values(rec, data)
    try:  # the JSON form decodes back to the same record
        if from_json_dict(rec.to_json_dict()) != rec:
            raise FuzzFinding("records.from_json_dict", data, "JSON round trip changed the record")
    except RecordError as err:
        raise FuzzFinding("records.from_json_dict", data, f"refused a valid record's JSON: {err}") from err
    return "ok"


def check_record_values(rec: Any, data: bytes) -> None:
    """A decoded record holds only values its schema allows (no garbage accepted silently)."""
    from records.codec import check_value

    if not isinstance(rec, Record):
        raise FuzzFinding("records", data, f"decoded a {type(rec).__name__}, not a Record")
    for f in rec.SPEC.fields:
        try:
            check_value(rec.SPEC, f, getattr(rec, f.name))
        except RecordError as err:
            raise FuzzFinding("records", data, f"decoded a bad value: {err}") from err


def _packable(obj: Any) -> bool:
    try:
        msgpack.packb(obj, use_bin_type=True)
        return True
    except (TypeError, ValueError, OverflowError):
        return False


# ------------------------------------------------------------ file decoders
#
# Each file kind: a valid file made by the project's own writer, byte-level
# mutations of it, and "sealed garbage" (a body of any msgpack value that
# passes the framing and checksum, so the checks behind them are reached).
# Property: the documented error naming the file, or values that are valid
# (and, for a mutation that the checksum must catch, the original ones).

FILE_KINDS = ("snapshot", "journal", "meta", "audit", "checkpoint", "history", "final")


def mutate_bytes(data: bytes, src) -> bytes:
    buf = bytearray(data)
    for _ in range(src.integer(1, 3)):
        how = src.integer(0, 5)
        n = len(buf)
        if how == 0 and n:
            del buf[src.integer(0, n - 1):]  # truncate
        elif how == 1 and n:
            buf[src.integer(0, n - 1)] ^= 1 << src.integer(0, 7)  # flip a bit
        elif how == 2 and n:
            buf[src.integer(0, n - 1)] = src.choice([0, 0xFF, 0x7F, 0x80, src.integer(0, 255)])
        elif how == 3:
            at = src.integer(0, n)
            buf[at:at] = src.binary(8)  # insert
        elif how == 4 and n:
            a = src.integer(0, n - 1)
            del buf[a:a + src.integer(1, 16)]  # delete
        else:
            buf += src.binary(12)  # append
    return bytes(buf)


def _replicated_records(src, n_max: int = 4) -> list[Record]:
    return [valid_record(src.choice(list(rschema.RECORDS)), src) for _ in range(src.integer(0, n_max))]


def valid_file(kind: str, src) -> bytes:
    """A valid file of ``kind``, written by the project's own encoder."""
    import json
    import zlib

    if kind == "snapshot":
        from snapshots.format import Snapshot, encode_snapshot

        idx = src.integer(1, 2**40)
        return encode_snapshot(Snapshot(records=_replicated_records(src), last_entry=(src.binary(6), idx, 3),
                                        prev_entry=(b"", idx - 1, 3), cluster=["127.0.0.1:1", "127.0.0.1:2"],
                                        meta={"written_by": "fuzz"}))
    if kind == "journal":
        from quorum.journal import MAGIC, encode_entry

        first = src.integer(1, 1000)
        return MAGIC + b"".join(encode_entry(src.binary(20), first + i, 1 + i // 3) for i in range(src.integer(0, 5)))
    if kind == "meta":
        from quorum.journal import META_MAGIC

        body = msgpack.packb({"term": src.integer(0, 100), "voted_for": src.choice([None, "127.0.0.1:1"]),
                              "commit_index": src.integer(0, 100)}, use_bin_type=True)
        return META_MAGIC + body + struct.pack("<I", zlib.crc32(body))
    if kind == "audit":
        from quorum.trail import _frame
        from records import AuditEntry, AuditGap

        out = b""
        for i in range(src.integer(0, 4)):
            if src.boolean(0.2):
                out += _frame([to_obj(AuditGap(raft_index=i + 1)), None])
                continue
            rec = valid_record(src.choice(list(rschema.RECORDS)), src)
            entry = AuditEntry(raft_index=i + 1, raft_term=1, position=0, accepted=src.boolean(0.8),
                               error=None, record=rec.SPEC.name)
            out += _frame([to_obj(entry), to_obj(rec)])
        return out
    if kind == "checkpoint":
        body = msgpack.packb({"length": src.integer(0, 2**40), "last_index": src.integer(0, 2**40)},
                             use_bin_type=True)
        return struct.pack("<II", len(body), zlib.crc32(body)) + body
    if kind == "history":
        lines = []
        for i in range(0, 2 * src.integer(1, 3), 2):
            lines.append({"index": i, "time_ns": 10 * i, "process": "pidmgr-1", "type": "invoke", "f": "allocate",
                          "value": None, "error": None})
            lines.append({"index": i + 1, "time_ns": 10 * i + 5, "process": "pidmgr-1", "type": "ok",
                          "f": "allocate", "value": {"broker_id": 1, "broker_epoch": 2, "start": 1000 * i,
                                                     "length": 1000}, "error": None})
        return "".join(json.dumps(x) + "\n" for x in lines).encode()
    if kind == "final":
        return json.dumps({"converged": True, "missing_nodes": [],
                           "nodes": {"1": {"next_producer_id": 10, "commit_index": 5, "last_applied": 5}},
                           "audit_blocks": [{"raft_index": 3, "broker_id": 1, "broker_epoch": 2,
                                             "producer_id_start": 0, "producer_id_len": 10}]}).encode()
    raise ValueError(kind)


def sealed_garbage(kind: str, src) -> bytes:
    """A file of ``kind`` whose framing and checksum are right around a body of any value."""
    import json
    import zlib

    value = random_value(src)
    if kind in ("snapshot", "meta", "checkpoint"):
        body_map: Any = value
        if kind == "snapshot" and src.boolean(0.7):
            # a map with the right keys, one of them wrong
            good = msgpack.unpackb(valid_file("snapshot", src)[12:-4], raw=False)
            good[src.choice(list(good))] = value if src.boolean(0.6) else record_obj(src)[0]
            body_map = good
        elif kind == "snapshot" and src.boolean():
            body_map = {"format": 1, "last_entry": [b"", 1, 1], "prev_entry": [b"", 0, 1], "cluster": [], "meta": {},
                        "records": [record_obj(src)[0] for _ in range(src.integer(1, 3))]}
        elif kind == "checkpoint" and src.boolean(0.7):
            body_map = {"length": value, "last_index": random_value(src)} if src.boolean() else \
                {"length": src.integer(0, 9), "last_index": value}
        elif kind == "meta" and src.boolean(0.7):
            body_map = {src.choice(["term", "commit_index", "voted_for"]): value}
        raw = msgpack.packb(body_map, use_bin_type=True)
        if kind == "snapshot":
            from snapshots.format import MAGIC

            return MAGIC + struct.pack("<I", len(raw)) + raw + struct.pack("<I", zlib.crc32(raw))
        if kind == "meta":
            from quorum.journal import META_MAGIC

            return META_MAGIC + raw + struct.pack("<I", zlib.crc32(raw))
        return struct.pack("<II", len(raw), zlib.crc32(raw)) + raw
    if kind == "journal":
        from quorum.journal import MAGIC, encode_entry

        return MAGIC + b"".join(encode_entry(src.binary(8), src.integer(0, 2**64 - 1), src.integer(0, 2**64 - 1))
                                for _ in range(src.integer(1, 3)))
    if kind == "audit":
        from quorum.trail import _frame

        shape = src.integer(0, 3)
        if shape == 0:
            obj = value
        elif shape == 1:
            obj = [record_obj(src)[0], record_obj(src)[0]]
        elif shape == 2:
            obj = [record_obj(src, (rschema.AUDIT_ENTRY, rschema.AUDIT_GAP))[0], random_value(src)]
        else:
            obj = {src.text(3): value}
        return _frame(obj)
    if kind in ("history", "final"):
        def jsonable(v):
            if isinstance(v, bytes):
                return v.hex()
            if isinstance(v, float) and v != v:
                return None
            if isinstance(v, list):
                return [jsonable(x) for x in v]
            if isinstance(v, dict):
                return {k: jsonable(x) for k, x in v.items()}
            return v
        if kind == "final":
            good = json.loads(valid_file("final", src))
            good[src.choice(list(good))] = jsonable(value)
            return json.dumps(good).encode()
        lines = [json.loads(x) for x in valid_file("history", src).splitlines()]
        line = src.choice(lines)
        line[src.choice(list(line))] = jsonable(value)
        return "".join(json.dumps(x) + "\n" for x in lines).encode()
    raise ValueError(kind)


def file_input(kind: str, src) -> tuple[bytes, bytes | None, str]:
    """(file bytes, the valid original if the bytes are a mutation of one, what was done)."""
    r = src.integer(0, 9)
    if r == 0:
        return valid_file(kind, src), None, "valid"
    if r <= 5:
        good = valid_file(kind, src)
        # JSON files carry no checksum: a mutation may well be another valid file
        return mutate_bytes(good, src), None if kind in ("history", "final") else good, "mutated"
    if r <= 8:
        return sealed_garbage(kind, src), None, "sealed-garbage"
    return src.binary(64), None, "random"


def check_file_decoder(kind: str, data: bytes, original: bytes | None, workdir: str) -> str:
    """The file-decoder property: "refused" (the documented error, naming the file) or "accepted"
    (valid values; for a byte mutation, what the original held, or a torn tail cut from it)."""
    import os

    from chaos.history import HistoryError
    from snapshots.storage.disk import CorruptFileError

    path = os.path.join(workdir, {"journal": "raft.journal", "meta": "raft.journal.meta",
                                  "checkpoint": "audit.log.checkpoint", "audit": "audit.log"}.get(kind, kind))
    for leftover in ("raft.journal", "raft.journal.meta", "audit.log", "audit.log.checkpoint"):
        try:
            os.remove(os.path.join(workdir, leftover))
        except FileNotFoundError:
            pass
    with open(path, "wb") as f:
        f.write(data)
    documented = HistoryError if kind in ("history", "final") else CorruptFileError
    try:
        got = _read_file(kind, path, workdir)
    except documented as e:
        # a meta file whose commit index the journal does not reach is refused naming the journal
        named = {path, os.path.join(workdir, "raft.journal")} if kind == "meta" else {path}
        if os.fspath(e.path) not in named:
            raise FuzzFinding(f"file:{kind}", data, f"the error names {e.path!r}, not the file {path!r}") from None
        return "refused"
    except Exception as err:  # noqa: BLE001 - that is the finding
        raise FuzzFinding(f"file:{kind}", data, f"raised {type(err).__name__}: {err}") from err
    if original is not None:
        with open(path, "wb") as f:
            f.write(original)
        want = _read_file(kind, path, workdir)
        if not _prefix_of(kind, got, want):
            if kind in ("journal", "audit") and _run_of(got, want):
                # Known limit of both formats: frames are independent, with no sequence anchor at the
                # start, so a damage that removes exactly the first whole frame(s) is not detectable.
                return "accepted-head-frames-lost"
            raise FuzzFinding(f"file:{kind}", data, f"a damaged file was accepted with other content: {got!r}")
    return "accepted"


def _run_of(got: Any, want: Any) -> bool:
    """Is ``got`` a contiguous run of ``want``'s items (whole frames, none changed)?"""
    got, want = list(got), list(want)
    return any(want[i:i + len(got)] == got for i in range(1, len(want) - len(got) + 1))


def _prefix_of(kind: str, got: Any, want: Any) -> bool:
    if kind in ("journal", "audit", "history"):  # a torn tail may be cut off, nothing else may change
        return _same(list(got), list(want)[:len(got)])
    if kind == "checkpoint":
        return got is None or _same(got, want)  # an unusable checkpoint is documented to read as None
    return _same(got, want)


def _same(got: Any, want: Any) -> bool:
    """Equal content; a float field holding NaN (a record the generator made) equals itself here."""
    return got == want or repr(got) == repr(want)


def _read_file(kind: str, path: str, workdir: str) -> Any:
    """Read ``path`` as the product does; returns comparable, validated content."""
    import os

    if kind == "snapshot":
        from quorum.managers import InvariantViolation, QuorumState
        from snapshots.format import read_snapshot

        snap = read_snapshot(path)
        for r in snap.records:
            check_record_values(r, b"")
        try:  # what the node does next with it: replay the records (refusal stops the node, naming the file)
            QuorumState.from_records(snap.records)
        except InvariantViolation:
            pass
        return (snap.records, snap.last_entry, snap.prev_entry, snap.cluster, snap.meta)
    if kind in ("journal", "meta"):
        from quorum.journal import DurableJournal
        from snapshots.storage.disk import Disk

        j = DurableJournal(os.path.join(workdir, "raft.journal"), Disk())
        try:
            entries = list(j.entries)
            meta = (j.getCurrentTerm(), j.getVotedForNodeId(), j.getRaftCommitIndex(), j.meta_log_end(),
                    j.recovery_target())
        finally:
            j._file.close()
        for (cmd, idx, term) in entries:
            if not (isinstance(cmd, bytes) and type(idx) is int and type(term) is int):
                raise FuzzFinding("file:journal", b"", f"accepted a bad entry {(cmd, idx, term)!r}")
        return entries if kind == "journal" else meta
    if kind == "audit":
        from quorum.trail import AuditWriter, read_audit
        from records import AuditEntry, AuditGap

        lines, _ = read_audit(path)
        for ln in lines:
            if not isinstance(ln.entry, (AuditEntry, AuditGap)):
                raise FuzzFinding("file:audit", b"", f"accepted a line whose entry is a {type(ln.entry).__name__}")
            if isinstance(ln.entry, AuditEntry) and (ln.record is None or type(ln.record).SPEC not in rschema.RECORDS):
                raise FuzzFinding("file:audit", b"", f"accepted an entry for {type(ln.record).__name__}")
            ln.to_json_dict()
        AuditWriter(path)._f.close()  # what a node does at start (without the fsync of a close)
        return [(ln.entry, ln.record) for ln in lines]
    if kind == "checkpoint":
        from quorum.trail import read_checkpoint

        audit = path[:-len(".checkpoint")]
        got = read_checkpoint(audit)
        if got is not None and not (type(got[0]) is int and type(got[1]) is int and min(got) >= 0):
            raise FuzzFinding("file:checkpoint", b"", f"accepted {got!r}")
        return got
    if kind == "history":
        from chaos.history import read_history

        return [op.to_dict() for op in read_history(path)]
    if kind == "final":
        from chaos.history import read_final

        return read_final(path)
    raise ValueError(kind)
