"""Bounds check of a Kafka request frame before kio's native reader sees it.

kio's Rust reader sizes arrays from the length on the wire before reading any
element: a 40-byte frame claiming 2**32 - 2 elements makes it allocate 32 GiB,
and where that fails Rust aborts the whole process (not an exception).  So
every frame is first walked here, in Python, against the same kio schema
classes, without building values: each length (array, string, bytes, tagged
field) must fit in the bytes that are left.  A frame that passes cannot make
the native reader allocate more than a small multiple of its own size.

Only the layout is checked (sizes, varint widths, nesting, and null only where
the schema allows it: kio reads a null non-nullable array or string as None,
which Kafka refuses); values (UTF-8, UUIDs, enums) are still checked by kio itself.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

_FIXED = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4,
          "uint64": 8, "float64": 8, "bool": 1, "uuid": 16, "error_code": 2, "timedelta_i32": 4,
          "timedelta_i64": 8, "datetime_i64": 8}
_STRINGS = {"string": "string", "bytes": "bytes", "records": "bytes"}
_MAX_DEPTH = 16


class FrameBoundsError(ValueError):
    """A length in the frame runs past its end, or a varint is malformed."""


class _Cursor:
    __slots__ = ("data", "pos", "end", "edits")

    def __init__(self, data: bytes | memoryview, pos: int, end: int | None = None,
                 edits: list | None = None) -> None:
        self.data, self.pos, self.end = data, pos, len(data) if end is None else end
        self.edits = edits  # (start, end, replacement) of tagged sections holding tags the schema does not know

    def left(self) -> int:
        return self.end - self.pos

    def skip(self, n: int, what: str) -> None:
        if n < 0:
            raise FrameBoundsError(f"{what}: negative length {n}")
        if n > self.end - self.pos:
            raise FrameBoundsError(f"{what}: length {n} but only {self.end - self.pos} bytes left at offset {self.pos}")
        self.pos += n

    def int_be(self, size: int, what: str) -> int:
        start = self.pos
        self.skip(size, what)
        return int.from_bytes(self.data[start:self.pos], "big", signed=True)

    def uvarint(self, what: str) -> int:
        value = shift = 0
        for _ in range(5):  # Kafka's unsigned varint is a 32-bit value
            if self.pos >= self.end:
                raise FrameBoundsError(f"{what}: varint runs past the end of the frame")
            b = self.data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                if value > 0xFFFFFFFF:
                    raise FrameBoundsError(f"{what}: varint {value} does not fit in 32 bits")
                return value
            shift += 7
        raise FrameBoundsError(f"{what}: varint longer than 5 bytes")


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # "fixed" | "string" | "bytes" | "entity"
    size: int = 0
    entity: Any = None
    array: bool = False
    nullable: bool = True  # may the field (an array: the array itself) be null (-1)?
    elem_nullable: bool = True  # arrays: may an element be null?


def _is_optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def unwrap_optional(hint: Any) -> Any:
    """``X`` for ``X | None`` (and ``Optional[X]``); any other hint unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


@functools.cache
def _plan(cls: type) -> tuple[tuple[_Field, ...], bool, dict[int, _Field]]:
    """The untagged fields of a kio entity in wire order, whether it is flexible, and its
    tagged fields by tag (kio parses a known tag's value too, so it is checked as well)."""
    hints = typing.get_type_hints(cls)
    out = []
    tagged: dict[int, _Field] = {}
    for f in dataclasses.fields(cls):
        nullable = _is_optional(hints[f.name])
        hint = unwrap_optional(hints[f.name])
        array = typing.get_origin(hint) is tuple
        elem_nullable = False
        if array:
            elem_nullable = _is_optional(typing.get_args(hint)[0])
            hint = unwrap_optional(typing.get_args(hint)[0])
        kafka_type = f.metadata.get("kafka_type")
        kw = dict(array=array, nullable=nullable, elem_nullable=elem_nullable)
        if kafka_type in _FIXED:
            field = _Field(f.name, "fixed", _FIXED[kafka_type], **kw)
        elif kafka_type in _STRINGS:
            field = _Field(f.name, _STRINGS[kafka_type], **kw)
        elif kafka_type is None and dataclasses.is_dataclass(hint):
            field = _Field(f.name, "entity", entity=hint, **kw)
        else:
            raise TypeError(f"{cls.__qualname__}.{f.name}: unknown kafka type {kafka_type!r}")
        if "tag" in f.metadata:
            tagged[int(f.metadata["tag"])] = field  # carried in the tagged-field section
        else:
            out.append(field)
    return tuple(out), bool(getattr(cls, "__flexible__", False)), tagged


def encode_uvarint(n: int) -> bytes:
    """``n`` (>= 0) as an unsigned varint (protobuf's, Kafka's compact lengths and record fields)."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tagged(cur: _Cursor, where: str, known: dict[int, _Field] | None = None, depth: int = 0) -> None:
    section = cur.pos
    count = cur.uvarint(f"{where} tagged field count")
    if count > cur.left():
        raise FrameBoundsError(f"{where}: {count} tagged fields but only {cur.left()} bytes left")
    kept: list[tuple[int, int]] = []  # (start, end) of the entries of known tags
    for _ in range(count):
        entry = cur.pos
        tag = cur.uvarint(f"{where} tag")
        size = cur.uvarint(f"{where} tagged field size")
        start = cur.pos
        cur.skip(size, f"{where} tagged field")
        field = (known or {}).get(tag)
        if field is not None:
            kept.append((entry, cur.pos))
            # kio decodes a known tag's value: its lengths must fit inside the tagged field.
            # Unknown tags nested in a known one are not removed (its size would change): kio refuses them.
            _field(_Cursor(cur.data, start, start + size), field, True, f"{where}.{field.name}", depth)
    if len(kept) != count and cur.edits is not None:
        # Tags this version's schema does not know: skipped, as Kafka does (KIP-482: a newer client may send
        # fields an older broker ignores); kio's reader would refuse the whole request.
        cur.edits.append((section, cur.pos, encode_uvarint(len(kept)) + b"".join(bytes(cur.data[a:b]) for a, b in kept)))


def _length(cur: _Cursor, flexible: bool, kind: str, where: str) -> int:
    """A length prefix; -1 for null."""
    if flexible:
        return cur.uvarint(f"{where} length") - 1
    return cur.int_be(2 if kind == "string" else 4, f"{where} length")


def _value(cur: _Cursor, f: _Field, flexible: bool, where: str, depth: int, nullable: bool) -> None:
    if f.kind == "fixed":
        cur.skip(f.size, where)
    elif f.kind in ("string", "bytes"):
        n = _length(cur, flexible, f.kind, where)
        if n < -1:
            raise FrameBoundsError(f"{where}: invalid length {n}")
        if n == -1 and not nullable:
            raise FrameBoundsError(f"{where}: null, but the field is not nullable")
        if n > 0:
            cur.skip(n, where)
    else:
        _entity(cur, f.entity, where, depth + 1)


def _field(cur: _Cursor, f: _Field, flexible: bool, name: str, depth: int) -> None:
    if not f.array:
        _value(cur, f, flexible, name, depth, f.nullable)
        return
    n = cur.uvarint(f"{name} length") - 1 if flexible else cur.int_be(4, f"{name} length")
    if n < -1:
        raise FrameBoundsError(f"{name}: invalid array length {n}")
    if n == -1 and not f.nullable:
        # kio would read it as None; Kafka refuses a null non-nullable field (INVALID_REQUEST)
        raise FrameBoundsError(f"{name}: null array, but the field is not nullable")
    # Every element takes at least one byte: this bounds what the native reader allocates.
    if n > cur.left():
        raise FrameBoundsError(f"{name}: array of {n} elements but only {cur.left()} bytes left")
    for i in range(max(n, 0)):
        _value(cur, f, flexible, f"{name}[{i}]", depth, f.elem_nullable)


def _entity(cur: _Cursor, cls: type, where: str, depth: int = 0) -> None:
    if depth > _MAX_DEPTH:
        raise FrameBoundsError(f"{where}: nested too deep")
    fields, flexible, tagged = _plan(cls)
    for f in fields:
        _field(cur, f, flexible, f"{where}.{f.name}", depth)
    if flexible:
        _tagged(cur, where, tagged, depth)


def without_unknown_tags(frame: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    """``frame`` with the tagged sections ``check_request`` listed in ``edits`` rewritten without their unknown
    tags (sections never overlap: those inside a tagged field are not listed)."""
    out, pos = bytearray(), 0
    for start, end, replacement in sorted(edits):
        out += frame[pos:start]
        out += replacement
        pos = end
    out += frame[pos:]
    return bytes(out)


def check_request(frame: bytes | memoryview, header_cls: type, body_cls: type,
                  edits: list[tuple[int, int, bytes]] | None = None) -> int:
    """Raise FrameBoundsError unless every length in the request frame fits in it.

    Returns the offset where the body ends (the frame's length, for a well-formed one).  With ``edits`` (a
    list), the tagged sections that hold tags the schema does not know are added to it
    (``without_unknown_tags`` removes them).

    The header is checked by hand: in every header version the client id is a
    legacy (int16-prefixed) string, even when the header is flexible.
    """
    cur = _Cursor(frame, 0, edits=edits)
    cur.skip(8, "request header")
    names = {f.name for f in dataclasses.fields(header_cls)}
    if "client_id" in names:
        n = cur.int_be(2, "client_id length")
        if n < -1:
            raise FrameBoundsError(f"client_id: invalid length {n}")
        if n > 0:
            cur.skip(n, "client_id")
    if getattr(header_cls, "__flexible__", False):
        _tagged(cur, "request header")
    _entity(cur, body_cls, body_cls.__name__)
    return cur.pos
