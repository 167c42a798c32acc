"""Fuzz inputs for the record codec: every spec in ``records.schema.RECORDS + PAYLOADS`` (valid values, wrong
values, structured corruptions of ``[type, version, fields]``), the quorum's msgpack API frames built from them,
and the record decoder properties."""
from __future__ import annotations

import struct
from typing import Any

import msgpack

from quorum.client import api as p
from records import schema as rschema
from records.codec import (
    CLASSES,
    Record,
    RecordError,
    check_value,
    decode,
    decode_batch,
    from_json_dict,
    from_obj,
    to_obj,
)
from tests.fuzz.sources import FuzzFinding


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


# ------------------------------------------------------------ the properties


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
