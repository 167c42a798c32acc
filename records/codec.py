"""Record classes and the msgpack codec, both derived from ``records.schema``.

On disk and on the wire a record is the msgpack array
``[type_id, version, [field values in schema order]]``.  A reader accepts any
version up to the one it knows (missing trailing fields take their defaults)
and refuses newer versions or unknown types with ``RecordError``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Iterable

import msgpack

from . import schema
from .schema import INT_RANGES, RecordSpec


class RecordError(ValueError):
    """A record is malformed, of an unknown type or version, or has a bad field."""


def check_value(spec: RecordSpec, f: schema.FieldSpec, value: Any) -> Any:
    where = f"{spec.name}.{f.name}"
    if f.type in INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{where}: expected {f.type}, got {type(value).__name__}")
        lo, hi = INT_RANGES[f.type]
        if not lo <= value <= hi:
            raise RecordError(f"{where}: {value} is out of range for {f.type}")
    elif f.type == "bool":
        if not isinstance(value, bool):
            raise RecordError(f"{where}: expected bool, got {type(value).__name__}")
    elif f.type == "string":
        if not isinstance(value, str):
            raise RecordError(f"{where}: expected string, got {type(value).__name__}")
    elif f.type == "nullable_string":
        if value is not None and not isinstance(value, str):
            raise RecordError(f"{where}: expected string or null, got {type(value).__name__}")
    elif f.type == "float64":
        # A float, never an int: msgpack encodes 1 and 1.0 differently, and the bytes must not depend on it.
        if not isinstance(value, float):
            raise RecordError(f"{where}: expected float64, got {type(value).__name__}")
    return value


class Record:
    """Base of the generated record classes (frozen dataclasses)."""

    __slots__ = ()
    SPEC: ClassVar[RecordSpec]

    def __post_init__(self) -> None:
        for f in self.SPEC.fields:
            check_value(self.SPEC, f, getattr(self, f.name))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in self.SPEC.fields}

    def to_json_dict(self) -> dict[str, Any]:
        """The record's own dict, tagged with its type (what ``-o json`` prints)."""
        return {"type": self.SPEC.name, **self.to_dict()}

    def replace(self, **changes: Any) -> "Record":
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def _make_class(spec: RecordSpec) -> type[Record]:
    fields = []
    for f in spec.fields:
        if f.required:
            fields.append((f.name, Any))
        else:
            fields.append((f.name, Any, dataclasses.field(default=f.default)))
    cls = dataclasses.make_dataclass(
        spec.name, fields, bases=(Record,), frozen=True, kw_only=True, slots=True
    )
    cls.__module__ = __name__
    cls.SPEC = spec
    cls.__doc__ = spec.doc
    return cls


CLASSES: dict[int, type[Record]] = {s.type_id: _make_class(s) for s in schema.RECORDS + schema.PAYLOADS}

AllocateProducerIdsRecord = CLASSES[schema.ALLOCATE_PRODUCER_IDS.type_id]
RegisterBrokerRecord = CLASSES[schema.REGISTER_BROKER.type_id]
FenceBrokerRecord = CLASSES[schema.FENCE_BROKER.type_id]
UnfenceBrokerRecord = CLASSES[schema.UNFENCE_BROKER.type_id]
UnregisterBrokerRecord = CLASSES[schema.UNREGISTER_BROKER.type_id]
ProducerIdCursorRecord = CLASSES[schema.PRODUCER_ID_CURSOR.type_id]
BrokerEpochCursorRecord = CLASSES[schema.BROKER_EPOCH_CURSOR.type_id]
AuditEntry = CLASSES[schema.AUDIT_ENTRY.type_id]
AuditGap = CLASSES[schema.AUDIT_GAP.type_id]
TransactionalIdRecord = CLASSES[schema.TRANSACTIONAL_ID.type_id]
RemoveTransactionalIdRecord = CLASSES[schema.REMOVE_TRANSACTIONAL_ID.type_id]
InitTransactionalProducerRequest = CLASSES[schema.INIT_TRANSACTIONAL_REQUEST.type_id]
InitTransactionalProducerResponse = CLASSES[schema.INIT_TRANSACTIONAL_RESPONSE.type_id]
DescribeTransactionalIdRequest = CLASSES[schema.DESCRIBE_TRANSACTIONAL_REQUEST.type_id]
DescribeTransactionalIdResponse = CLASSES[schema.DESCRIBE_TRANSACTIONAL_RESPONSE.type_id]
ProducerIdSeedRecord = CLASSES[schema.PRODUCER_ID_SEED.type_id]
ProducerIdHistoryRecord = CLASSES[schema.PRODUCER_ID_HISTORY.type_id]
SeedProducerIdsRequest = CLASSES[schema.SEED_REQUEST.type_id]
SeedProducerIdsResponse = CLASSES[schema.SEED_RESPONSE.type_id]
MigrationStateRecord = CLASSES[schema.MIGRATION_STATE.type_id]
BridgeReservationRecord = CLASSES[schema.BRIDGE_RESERVATION.type_id]
MigrationCursorRecord = CLASSES[schema.MIGRATION_CURSOR.type_id]
MigrationCommandRequest = CLASSES[schema.MIGRATION_REQUEST.type_id]
MigrationCommandResponse = CLASSES[schema.MIGRATION_RESPONSE.type_id]
AclRecord = CLASSES[schema.ACL.type_id]
RemoveAclRecord = CLASSES[schema.REMOVE_ACL.type_id]
AlterAclsRequest = CLASSES[schema.ALTER_ACLS_REQUEST.type_id]
AlterAclsResponse = CLASSES[schema.ALTER_ACLS_RESPONSE.type_id]
DescribeAclsRequest = CLASSES[schema.DESCRIBE_ACLS_REQUEST.type_id]
DescribeAclsResponse = CLASSES[schema.DESCRIBE_ACLS_RESPONSE.type_id]
ClientQuotaRecord = CLASSES[schema.CLIENT_QUOTA.type_id]
TransactionStateRecord = CLASSES[schema.TRANSACTION_STATE.type_id]
TransactionRequest = CLASSES[schema.TRANSACTION_REQUEST.type_id]
TransactionResponse = CLASSES[schema.TRANSACTION_RESPONSE.type_id]
AlterClientQuotaRequest = CLASSES[schema.ALTER_CLIENT_QUOTA_REQUEST.type_id]
AlterClientQuotaResponse = CLASSES[schema.ALTER_CLIENT_QUOTA_RESPONSE.type_id]
BlockHistoryRequest = CLASSES[schema.BLOCK_HISTORY_REQUEST.type_id]
BlockHistoryResponse = CLASSES[schema.BLOCK_HISTORY_RESPONSE.type_id]


def to_obj(record: Record) -> list:
    spec = record.SPEC
    return [spec.type_id, spec.version, [getattr(record, f.name) for f in spec.fields]]


def from_obj(obj: Any) -> Record:
    if not isinstance(obj, (list, tuple)) or len(obj) != 3:
        raise RecordError(f"a record is [type, version, fields], got {type(obj).__name__}")
    type_id, version, values = obj
    if isinstance(type_id, bool) or not isinstance(type_id, int) or type_id not in CLASSES:
        raise RecordError(f"unknown record type {type_id!r}")
    cls = CLASSES[type_id]
    spec = cls.SPEC
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= spec.version:
        raise RecordError(f"{spec.name}: unsupported version {version!r} (this build reads 0..{spec.version})")
    if not isinstance(values, (list, tuple)):
        raise RecordError(f"{spec.name}: fields must be an array")
    known = spec.fields_at(version)
    if len(values) != len(known):
        raise RecordError(f"{spec.name} v{version}: expected {len(known)} fields, got {len(values)}")
    kwargs = {f.name: v for f, v in zip(known, values)}
    for f in spec.fields[len(known):]:
        kwargs[f.name] = f.default
    try:
        return cls(**kwargs)
    except TypeError as e:  # pragma: no cover - make_dataclass signature mismatch
        raise RecordError(f"{spec.name}: {e}") from None


def encode(record: Record) -> bytes:
    return msgpack.packb(to_obj(record), use_bin_type=True)


def decode(data: bytes) -> Record:
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as e:
        raise RecordError(f"not a msgpack record: {e}") from None
    return from_obj(obj)


# A Raft log entry carries a batch of records: [ENTRY_FORMAT, [record, ...]].
ENTRY_FORMAT = 1


def encode_batch(records: Iterable[Record]) -> bytes:
    return msgpack.packb([ENTRY_FORMAT, [to_obj(r) for r in records]], use_bin_type=True)


def decode_batch(data: bytes) -> list[Record]:
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as e:
        raise RecordError(f"not a msgpack record batch: {e}") from None
    if not isinstance(obj, list) or len(obj) != 2 or not isinstance(obj[1], list):
        raise RecordError("not a record batch: expected [format, [record, ...]]")
    fmt = obj[0]
    # An int, not a bool or float: True == 1 and 1.0 == 1 in Python, but they are not format 1.
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt != ENTRY_FORMAT:
        raise RecordError(f"unsupported record batch format {fmt!r} (this build reads format {ENTRY_FORMAT})")
    return [from_obj(o) for o in obj[1]]


def from_json_dict(d: dict[str, Any]) -> Record:
    """Inverse of ``Record.to_json_dict`` (used by tools reading JSON exports)."""
    if not isinstance(d, dict) or not isinstance(d.get("type"), str) or d["type"] not in schema.BY_NAME:
        raise RecordError("JSON record needs a known 'type'")
    spec = schema.BY_NAME[d["type"]]
    unknown = set(d) - {"type"} - {f.name for f in spec.fields}
    if unknown:
        raise RecordError(f"{spec.name}: unknown fields {sorted(unknown)}")
    kwargs = {f.name: d[f.name] for f in spec.fields if f.name in d}
    missing = [f.name for f in spec.fields if f.required and f.name not in kwargs]
    if missing:
        raise RecordError(f"{spec.name}: missing fields {missing}")
    return CLASSES[spec.type_id](**kwargs)
