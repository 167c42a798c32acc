"""One ``struct`` call for the Kafka messages whose every field has a fixed width.

AllocateProducerIds (both ways), BrokerHeartbeat v0's request and the answers to BrokerRegistration and
BrokerHeartbeat are such messages: a broker's whole steady-state traffic with the quorum.  kio reads and
writes them field by field, through its entity readers and phantom-type checks: about 50 us of CPU per
AllocateProducerIds round trip here (the client's request and the leader's parse, answer and encoding), on
the commit path of every block.

The layouts come from kio's schema (each field's ``kafka_type``), never written by hand, and kio stays the
reference for everything else.  The fast path takes only a frame it reads whole and exactly as kio does: the
header's tagged fields empty, the body's too, no byte left over, every value one kio accepts.  Anything else
(a tagged field, another length, a bool byte other than 0 or 1, an unknown error code, a client id that is not
UTF-8) returns None, and the caller gives the frame to kio as before, with kio's errors.  Tests compare both
paths on random values and on every prefix and mutation of a frame.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import struct
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

_CODES = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H", "uint32": "I", "uint64": "Q",
          "float64": "d", "bool": "B", "error_code": "h", "timedelta_i32": "i", "timedelta_i64": "q"}
_HEAD = struct.Struct(">hhih")  # api key, api version, correlation id, client id's length (-1: null)
_CORRELATION = struct.Struct(">i")


def _bool(value: int) -> bool:
    if value > 1:
        raise ValueError(f"bool byte {value}")
    return value == 1


def _milliseconds(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def _to_milliseconds(value: datetime.timedelta) -> int:
    return round(value.total_seconds() * 1000)


# kind -> (what makes kio's value of the unpacked one: ValueError leaves the frame to kio,
#          the type kio's value has, what makes the packed one of it); integers need neither
_VALUES = {"bool": (_bool, bool, int), "error_code": (ErrorCode, ErrorCode, lambda e: e.value),
           "timedelta_i32": (_milliseconds, datetime.timedelta, _to_milliseconds),
           "timedelta_i64": (_milliseconds, datetime.timedelta, _to_milliseconds),
           "float64": (None, float, None)}


@dataclass(frozen=True)
class Layout:
    """The fixed layout of one kio entity's body (its tagged-fields count, 0, included if flexible)."""
    cls: type
    names: tuple[str, ...]
    values: tuple  # per field: its ``_VALUES`` entry, or None for an integer
    body: struct.Struct
    flexible: bool

    def read(self, data: bytes, offset: int) -> Any | None:
        """The entity in ``data[offset:]``, which must be exactly its size; None if kio must read it."""
        if len(data) - offset != self.body.size:
            return None
        values = self.body.unpack_from(data, offset)
        if self.flexible:
            if values[-1] != 0:
                return None  # tagged fields: kio's
            values = values[:-1]
        try:
            values = [v if k is None or k[0] is None else k[0](v) for k, v in zip(self.values, values)]
        except ValueError:
            return None  # a bool byte other than 0 or 1, an error code kio does not know
        return self.cls(**dict(zip(self.names, values)))

    def write(self, entity: Any) -> bytes | None:
        """``entity``'s body bytes; None if kio must write it (a value out of range or of another type)."""
        values = []
        for name, kind in zip(self.names, self.values):
            value = getattr(entity, name)
            if kind is None:
                if not isinstance(value, int) or isinstance(value, bool):
                    return None
            else:
                if not isinstance(value, kind[1]):
                    return None
                if kind[2] is not None:
                    value = kind[2](value)
            values.append(value)
        if self.flexible:
            values.append(0)
        try:
            return self.body.pack(*values)
        except struct.error:
            return None


@functools.lru_cache(maxsize=None)
def layout(cls: type) -> Layout | None:
    """``cls``'s fixed layout, or None if a field has no fixed width (a string, an array, a tagged field)."""
    fields = dataclasses.fields(cls)
    kinds = tuple(f.metadata.get("kafka_type") for f in fields)
    if any(k not in _CODES or f.metadata.get("tag") is not None for k, f in zip(kinds, fields)):
        return None
    flexible = bool(getattr(cls, "__flexible__", False))
    fmt = ">" + "".join(_CODES[k] for k in kinds) + ("B" if flexible else "")
    return Layout(cls, tuple(f.name for f in fields), tuple(_VALUES.get(k) for k in kinds), struct.Struct(fmt),
                  flexible)


def _header_flexible(cls: type) -> bool:
    return bool(getattr(cls.__header_schema__, "__flexible__", False))


def read_request(frame: bytes, req_cls: type) -> tuple[int, str | None, Any] | None:
    """(correlation id, client id, body) of a request frame (size prefix removed) whose API and version
    are ``req_cls``'s (the caller checked them); None if kio must read it."""
    body = layout(req_cls)
    if body is None or len(frame) < _HEAD.size:
        return None
    _key, _version, correlation_id, n = _HEAD.unpack_from(frame)
    offset = _HEAD.size
    if n == -1:
        client_id = None
    elif n < 0 or offset + n > len(frame):
        return None
    else:
        try:
            client_id = frame[offset:offset + n].decode("utf-8")
        except UnicodeDecodeError:
            return None
        offset += n
    if _header_flexible(req_cls):
        if offset >= len(frame) or frame[offset] != 0:
            return None  # the header's tagged fields: kio's
        offset += 1
    entity = body.read(frame, offset)
    return None if entity is None else (correlation_id, client_id, entity)


def write_request(body: Any, correlation_id: int, client_id: str) -> bytes | None:
    """A request frame's bytes (size prefix removed) for a fixed-layout kio request; None if not one."""
    cls = type(body)
    fixed = layout(cls)
    if fixed is None or client_id is None:
        return None
    data = fixed.write(body)
    if data is None:
        return None
    name = client_id.encode("utf-8")
    if len(name) > 0x7FFF:
        return None
    try:
        head = _HEAD.pack(cls.__api_key__, cls.__version__, correlation_id, len(name))
    except struct.error:
        return None
    return head + name + (b"\x00" if _header_flexible(cls) else b"") + data


def write_response(resp_cls: type, correlation_id: int, body: Any) -> bytes | None:
    """A response frame's bytes (size prefix removed); None if kio must write it."""
    fixed = layout(resp_cls)
    if fixed is None or type(body) is not resp_cls:
        return None
    data = fixed.write(body)
    if data is None:
        return None
    try:
        head = _CORRELATION.pack(correlation_id)
    except struct.error:
        return None
    return head + (b"\x00" if _header_flexible(resp_cls) else b"") + data


__all__ = ["Layout", "layout", "read_request", "write_request", "write_response"]
