"""Unit tests for records.schema and records.codec (no Raft, no network, no files): golden bytes, round
trips, the record classes and JSON dicts.  Older versions, validate_spec, decode refusals and batches are
in test_records_decode."""
from __future__ import annotations

import dataclasses

import msgpack
import pytest

from records import (
    CLASSES,
    AllocateProducerIdsRecord,
    AuditEntry,
    BrokerEpochCursorRecord,
    ClientQuotaRecord,
    FenceBrokerRecord,
    ProducerIdCursorRecord,
    RecordError,
    RegisterBrokerRecord,
    decode,
    encode,
    from_json_dict,
    schema,
)
from records.schema import LONG_MAX
from tests.records.golden import (
    ALL_INSTANCES,
    GOLDEN,
    GOLDEN_PAYLOADS,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    TS,
    _ids,
)


# --------------------------------------------------------------------------
# Golden bytes
# --------------------------------------------------------------------------


def test_golden_covers_every_replicated_record_type():
    assert set(GOLDEN) == {s.name for s in schema.RECORDS}
    assert set(GOLDEN_PAYLOADS) == {s.name for s in schema.PAYLOADS}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_encoding_of_replicated_records(name):
    rec, expected = GOLDEN[name]
    assert type(rec).SPEC.name == name
    assert encode(rec).hex() == expected
    assert decode(bytes.fromhex(expected)) == rec


@pytest.mark.parametrize("name", sorted(GOLDEN_PAYLOADS))
def test_golden_encoding_of_payloads(name):
    rec, expected = GOLDEN_PAYLOADS[name]
    assert encode(rec).hex() == expected
    assert decode(bytes.fromhex(expected)) == rec


@pytest.mark.parametrize("old_hex, expected", [
    # TransactionStateRecord v0 (before transactions were numbered): sequence -1
    ("93110098ab6f72646572732d74782d31cd138802ad50726570617265436f6d6d6974bf5b5b312c226f7264657273222c305d2c"
     "5b312c226f7264657273222c335d5dcf0000018bcfe56800cf0000018bcfe5680901",
     dataclasses.replace(GOLDEN["TransactionStateRecord"][0], sequence=-1)),
    ("936700945aa666656e636564ffff", GOLDEN_PAYLOADS["InitTransactionalProducerResponse"][0]),
    ("93080099ab6f72646572732d74782d31cd138803cd138802cdea60a5456d707479cf0000018bcfe5680003",
     dataclasses.replace(GOLDEN["TransactionalIdRecord"][0], init_request="")),
    ("936600960311ab6f72646572732d74782d31cdea60cd138802",
     dataclasses.replace(GOLDEN_PAYLOADS["InitTransactionalProducerRequest"][0], request_id="")),
    ("937500990311a3616464ab6f72646572732d74782d31cd138802b05b5b332c226f7264657273222c305d5dff64",
     dataclasses.replace(GOLDEN_PAYLOADS["TransactionRequest"][0], sequence=-1)),
])
def test_version_0_of_the_transaction_records_still_decodes(old_hex, expected):
    assert decode(bytes.fromhex(old_hex)) == expected


def test_golden_type_ids_and_versions_are_stable():
    # The type id is the first element of every encoded record; pin them.
    assert {s.name: (s.type_id, s.version) for s in schema.RECORDS + schema.PAYLOADS} == {
        "AllocateProducerIdsRecord": (1, 0),
        "RegisterBrokerRecord": (2, 0),
        "FenceBrokerRecord": (3, 0),
        "UnfenceBrokerRecord": (4, 0),
        "UnregisterBrokerRecord": (5, 0),
        "ProducerIdCursorRecord": (6, 0),
        "BrokerEpochCursorRecord": (7, 0),
        "TransactionalIdRecord": (8, 1),
        "RemoveTransactionalIdRecord": (9, 0),
        "ProducerIdSeedRecord": (10, 0),
        "MigrationStateRecord": (11, 0),
        "BridgeReservationRecord": (12, 0),
        "MigrationCursorRecord": (13, 0),
        "AclRecord": (14, 0),
        "RemoveAclRecord": (15, 0),
        "ClientQuotaRecord": (16, 0),
        "AuditEntry": (100, 0),
        "AuditGap": (101, 0),
        "InitTransactionalProducerRequest": (102, 1),
        "InitTransactionalProducerResponse": (103, 1),
        "DescribeTransactionalIdRequest": (104, 0),
        "DescribeTransactionalIdResponse": (105, 0),
        "SeedProducerIdsRequest": (106, 0),
        "SeedProducerIdsResponse": (107, 0),
        "MigrationCommandRequest": (108, 0),
        "MigrationCommandResponse": (109, 0),
        "AlterAclsRequest": (110, 0),
        "AlterAclsResponse": (111, 0),
        "DescribeAclsRequest": (112, 0),
        "DescribeAclsResponse": (113, 0),
        "AlterClientQuotaRequest": (115, 0),
        "AlterClientQuotaResponse": (116, 0),
        "TransactionStateRecord": (17, 1),
        "ProducerIdHistoryRecord": (18, 0),
        "TransactionRequest": (117, 1),
        "TransactionResponse": (118, 0),
        "BlockHistoryRequest": (119, 0),
        "BlockHistoryResponse": (120, 0),
    }


def test_encoding_is_the_documented_array():
    rec, _ = GOLDEN["AllocateProducerIdsRecord"]
    assert msgpack.unpackb(encode(rec)) == [1, 0, [3, 17, 123000, 1000, TS]]


# --------------------------------------------------------------------------
# Round trips and record classes
# --------------------------------------------------------------------------


@pytest.mark.parametrize("rec", ALL_INSTANCES, ids=_ids(ALL_INSTANCES))
def test_round_trip_every_class(rec):
    data = encode(rec)
    back = decode(data)
    assert back == rec
    assert type(back) is type(rec)
    assert encode(back) == data


def test_every_spec_has_a_class_and_every_class_is_covered():
    assert set(CLASSES) == {s.type_id for s in schema.RECORDS + schema.PAYLOADS}
    for type_id, cls in CLASSES.items():
        assert cls.SPEC is schema.BY_TYPE_ID[type_id]
        assert cls.__name__ == cls.SPEC.name
        assert [f.name for f in dataclasses.fields(cls)] == [f.name for f in cls.SPEC.fields]
    assert {type(r) for r in ALL_INSTANCES} == set(CLASSES.values())


@pytest.mark.parametrize("rec", [
    AllocateProducerIdsRecord(broker_id=0, broker_epoch=0, producer_id_start=0, producer_id_len=1),
    AllocateProducerIdsRecord(broker_id=INT32_MAX, broker_epoch=INT64_MAX, producer_id_start=LONG_MAX - 1,
                              producer_id_len=1, timestamp_ms=INT64_MAX),
    AllocateProducerIdsRecord(broker_id=INT32_MIN, broker_epoch=INT64_MIN, producer_id_start=INT64_MIN,
                              producer_id_len=INT32_MIN, timestamp_ms=INT64_MIN),
    RegisterBrokerRecord(broker_id=1, incarnation_id="", broker_epoch=1),
    RegisterBrokerRecord(broker_id=1, incarnation_id="ünïcødé ☃", broker_epoch=1, listener="[::1]:9092"),
    AuditEntry(raft_index=1, position=0, accepted=True, record="X"),
    AuditEntry(raft_index=1, raft_term=2, position=0, accepted=True, error=None, record="X"),
    ProducerIdCursorRecord(next_producer_id=LONG_MAX),
])
def test_round_trip_extreme_values(rec):
    assert decode(encode(rec)) == rec


def test_defaults_apply_when_omitted():
    rec = AllocateProducerIdsRecord(broker_id=1, broker_epoch=2, producer_id_start=3, producer_id_len=4)
    assert rec.timestamp_ms == -1
    reg = RegisterBrokerRecord(broker_id=1, incarnation_id="i", broker_epoch=2)
    assert reg.listener == "" and reg.timestamp_ms == -1
    entry = AuditEntry(raft_index=1, position=0, accepted=True, record="X")
    assert entry.raft_term == -1 and entry.error is None


def test_required_fields_are_required_and_keyword_only():
    with pytest.raises(TypeError):
        AllocateProducerIdsRecord(broker_id=1, broker_epoch=2, producer_id_start=3)  # no len
    with pytest.raises(TypeError):
        BrokerEpochCursorRecord(5)  # positional


def test_records_are_frozen_and_replace_checks_values():
    rec = FenceBrokerRecord(broker_id=1, broker_epoch=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.broker_id = 5  # type: ignore[misc]
    changed = rec.replace(broker_epoch=9)
    assert changed.broker_epoch == 9 and rec.broker_epoch == 2
    with pytest.raises(RecordError):
        rec.replace(broker_epoch="9")


@pytest.mark.parametrize("cls,kwargs,fragment", [
    (FenceBrokerRecord, dict(broker_id="1", broker_epoch=1), "expected int32, got str"),
    (FenceBrokerRecord, dict(broker_id=True, broker_epoch=1), "expected int32, got bool"),
    (FenceBrokerRecord, dict(broker_id=1.0, broker_epoch=1), "expected int32, got float"),
    (FenceBrokerRecord, dict(broker_id=None, broker_epoch=1), "expected int32, got NoneType"),
    (FenceBrokerRecord, dict(broker_id=INT32_MAX + 1, broker_epoch=1), "out of range for int32"),
    (FenceBrokerRecord, dict(broker_id=INT32_MIN - 1, broker_epoch=1), "out of range for int32"),
    (FenceBrokerRecord, dict(broker_id=1, broker_epoch=INT64_MAX + 1), "out of range for int64"),
    (FenceBrokerRecord, dict(broker_id=1, broker_epoch=INT64_MIN - 1), "out of range for int64"),
    (RegisterBrokerRecord, dict(broker_id=1, incarnation_id=b"x", broker_epoch=1), "expected string, got bytes"),
    (RegisterBrokerRecord, dict(broker_id=1, incarnation_id=None, broker_epoch=1), "expected string, got NoneType"),
    (AuditEntry, dict(raft_index=1, position=0, accepted=1, record="X"), "expected bool, got int"),
    (AuditEntry, dict(raft_index=1, position=0, accepted=True, record="X", error=5),
     "expected string or null, got int"),
    (ClientQuotaRecord, dict(user="a", key="k", value=2), "expected float64, got int"),
    (ClientQuotaRecord, dict(user="a", key="k", value=True), "expected float64, got bool"),
    (ClientQuotaRecord, dict(user="a", key="k", value="2.5"), "expected float64, got str"),
])
def test_constructor_checks_field_types(cls, kwargs, fragment):
    with pytest.raises(RecordError) as ei:
        cls(**kwargs)
    assert fragment in str(ei.value)
    assert cls.SPEC.name in str(ei.value)


# --------------------------------------------------------------------------
# JSON dicts
# --------------------------------------------------------------------------


@pytest.mark.parametrize("rec", ALL_INSTANCES, ids=_ids(ALL_INSTANCES))
def test_json_dict_round_trip(rec):
    d = rec.to_json_dict()
    assert d["type"] == rec.SPEC.name
    assert list(d) == ["type"] + [f.name for f in rec.SPEC.fields]
    back = from_json_dict(d)
    assert back == rec and type(back) is type(rec)


def test_to_json_dict_content():
    rec, _ = GOLDEN["AllocateProducerIdsRecord"]
    assert rec.to_json_dict() == {"type": "AllocateProducerIdsRecord", "broker_id": 3, "broker_epoch": 17,
                                  "producer_id_start": 123000, "producer_id_len": 1000, "timestamp_ms": TS}
    assert rec.to_dict() == {k: v for k, v in rec.to_json_dict().items() if k != "type"}


def test_from_json_dict_fills_defaults():
    rec = from_json_dict({"type": "RegisterBrokerRecord", "broker_id": 1, "incarnation_id": "i", "broker_epoch": 2})
    assert rec == RegisterBrokerRecord(broker_id=1, incarnation_id="i", broker_epoch=2, listener="", timestamp_ms=-1)


@pytest.mark.parametrize("d,fragment", [
    ({}, "known 'type'"),
    ({"type": "Nope"}, "known 'type'"),
    ({"broker_id": 1}, "known 'type'"),
    ({"type": None}, "known 'type'"),
    ({"type": "FenceBrokerRecord", "broker_id": 1}, "missing fields ['broker_epoch']"),
    ({"type": "FenceBrokerRecord", "broker_id": 1, "broker_epoch": 2, "extra": 1}, "unknown fields ['extra']"),
    ({"type": "FenceBrokerRecord", "broker_id": "1", "broker_epoch": 2}, "expected int32, got str"),
    ({"type": "FenceBrokerRecord", "broker_id": 1, "broker_epoch": 2**63}, "out of range for int64"),
])
def test_from_json_dict_errors(d, fragment):
    with pytest.raises(RecordError) as ei:
        from_json_dict(d)
    assert fragment in str(ei.value)


@pytest.mark.parametrize("d", [None, [], "FenceBrokerRecord", 5])
def test_from_json_dict_refuses_non_dicts(d):
    with pytest.raises(RecordError):
        from_json_dict(d)


def test_from_json_dict_unhashable_type_is_a_record_error():
    with pytest.raises(RecordError):
        from_json_dict({"type": ["FenceBrokerRecord"], "broker_id": 1, "broker_epoch": 2})
