"""Unit tests for records.schema and records.codec (no Raft, no network, no files)."""
from __future__ import annotations

import dataclasses

import msgpack
import pytest

import records
from records import (
    CLASSES,
    AclRecord,
    AllocateProducerIdsRecord,
    AlterAclsRequest,
    AlterAclsResponse,
    AlterClientQuotaRequest,
    AlterClientQuotaResponse,
    AuditEntry,
    AuditGap,
    BlockHistoryRequest,
    BlockHistoryResponse,
    BridgeReservationRecord,
    BrokerEpochCursorRecord,
    ClientQuotaRecord,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeTransactionalIdRequest,
    DescribeTransactionalIdResponse,
    FenceBrokerRecord,
    InitTransactionalProducerRequest,
    InitTransactionalProducerResponse,
    MigrationCommandRequest,
    MigrationCommandResponse,
    MigrationCursorRecord,
    MigrationStateRecord,
    ProducerIdCursorRecord,
    ProducerIdHistoryRecord,
    ProducerIdSeedRecord,
    RecordError,
    RegisterBrokerRecord,
    RemoveAclRecord,
    RemoveTransactionalIdRecord,
    SeedProducerIdsRequest,
    SeedProducerIdsResponse,
    TransactionalIdRecord,
    TransactionRequest,
    TransactionResponse,
    TransactionStateRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
    codec,
    decode,
    decode_batch,
    encode,
    encode_batch,
    from_json_dict,
    schema,
)
from records.schema import LONG_MAX, FieldSpec, RecordSpec, validate_spec

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

TS = 1700000000000
INCARNATION = "6f1c0a52-8a1e-4d0b-9a55-2b9f3e1d7c10"

# One fixed instance per record type, and the exact bytes it must encode to.
# These literals guard the on-disk / on-the-wire format: if one changes, an old
# journal, snapshot or audit trail no longer reads the same.  Do not "fix" them
# by pasting new output; add a new record version instead.
GOLDEN = {
    "AllocateProducerIdsRecord": (
        AllocateProducerIdsRecord(broker_id=3, broker_epoch=17, producer_id_start=123000, producer_id_len=1000,
                                  timestamp_ms=TS),
        "930100950311ce0001e078cd03e8cf0000018bcfe56800",
    ),
    "RegisterBrokerRecord": (
        RegisterBrokerRecord(broker_id=3, incarnation_id=INCARNATION, broker_epoch=17, listener="10.0.0.3:9092",
                             timestamp_ms=TS),
        "9302009503d92436663163306135322d386131652d346430622d396135352d32623966336531643763313011"
        "ad31302e302e302e333a39303932cf0000018bcfe56800",
    ),
    "FenceBrokerRecord": (
        FenceBrokerRecord(broker_id=3, broker_epoch=17, timestamp_ms=TS + 1),
        "930300930311cf0000018bcfe56801",
    ),
    "UnfenceBrokerRecord": (
        UnfenceBrokerRecord(broker_id=3, broker_epoch=17, timestamp_ms=TS + 2),
        "930400930311cf0000018bcfe56802",
    ),
    "UnregisterBrokerRecord": (
        UnregisterBrokerRecord(broker_id=3, broker_epoch=17, timestamp_ms=TS + 3),
        "930500930311cf0000018bcfe56803",
    ),
    "ProducerIdCursorRecord": (
        ProducerIdCursorRecord(next_producer_id=124000),
        "93060091ce0001e460",
    ),
    "BrokerEpochCursorRecord": (
        BrokerEpochCursorRecord(last_broker_epoch=17),
        "9307009111",
    ),
    "TransactionalIdRecord": (
        TransactionalIdRecord(transactional_id="orders-tx-1", producer_id=5000, producer_epoch=3,
                              last_producer_id=5000, last_producer_epoch=2, timeout_ms=60000, state="Empty",
                              update_time_ms=TS, broker_id=3, init_request="3:17:1"),
        "9308019aab6f72646572732d74782d31cd138803cd138802cdea60a5456d707479cf0000018bcfe5680003a6333a31373a31",
    ),
    "RemoveTransactionalIdRecord": (
        RemoveTransactionalIdRecord(transactional_id="orders-tx-1", producer_id=5000, timestamp_ms=TS + 4),
        "93090093ab6f72646572732d74782d31cd1388cf0000018bcfe56804",
    ),
    "ProducerIdSeedRecord": (
        ProducerIdSeedRecord(next_producer_id=5000, origin="export:zk.json", zk_broker=35, zk_block_start=4000,
                             zk_block_end=4999, timestamp_ms=TS + 5),
        "930a0096cd1388ae6578706f72743a7a6b2e6a736f6e23cd0fa0cd1387cf0000018bcfe56805",
    ),
    "MigrationStateRecord": (
        MigrationStateRecord(mode="bridge", zk="127.0.0.1:2181/kafka", timestamp_ms=TS + 6),
        "930b0093a6627269646765b43132372e302e302e313a323138312f6b61666b61cf0000018bcfe56806",
    ),
    "BridgeReservationRecord": (
        BridgeReservationRecord(reserved_start=5000, reserved_end=5999, broker_id=3, zk_version=7, timestamp_ms=TS + 7),
        "930c0095cd1388cd176f0307cf0000018bcfe56807",
    ),
    "MigrationCursorRecord": (
        MigrationCursorRecord(mode="bridge", zk="127.0.0.1:2181/kafka", reserved_until=6000),
        "930d0093a6627269646765b43132372e302e302e313a323138312f6b61666b61cd1770",
    ),
    "AclRecord": (
        AclRecord(principal="User:broker", resource_type="Cluster", resource_name="kafka-cluster",
                  pattern_type="LITERAL", operation="CLUSTER_ACTION", permission="ALLOW", host="*", timestamp_ms=TS),
        "930e0098ab557365723a62726f6b6572a7436c7573746572ad6b61666b612d636c7573746572a74c49544552414cae434c5553"
        "5445525f414354494f4ea5414c4c4f57a12acf0000018bcfe56800",
    ),
    "RemoveAclRecord": (
        RemoveAclRecord(principal="User:alice", resource_type="TransactionalId", resource_name="orders-",
                        pattern_type="PREFIXED", operation="WRITE", permission="DENY", host="10.0.0.7",
                        timestamp_ms=TS),
        "930f0098aa557365723a616c696365af5472616e73616374696f6e616c4964a76f72646572732da85052454649584544a55752"
        "495445a444454e59a831302e302e302e37cf0000018bcfe56800",
    ),
    "ClientQuotaRecord": (
        ClientQuotaRecord(user="alice", key="producer_ids_rate", value=2.5, remove=False, timestamp_ms=TS + 8),
        # ... cb 4004000000000000: the value is always a msgpack float64 (2.5), never an int
        "93100095a5616c696365b170726f64756365725f6964735f72617465cb4004000000000000c2cf0000018bcfe56808",
    ),
    "TransactionStateRecord": (
        TransactionStateRecord(transactional_id="orders-tx-1", producer_id=5000, producer_epoch=2,
                               state="PrepareCommit", partitions='[[1,"orders",0],[1,"orders",3]]',
                               start_time_ms=TS, update_time_ms=TS + 9, broker_id=1, sequence=7),
        "93110199ab6f72646572732d74782d31cd138802ad50726570617265436f6d6d6974bf5b5b312c226f7264657273222c305d2c"
        "5b312c226f7264657273222c335d5dcf0000018bcfe56800cf0000018bcfe568090107",
    ),
    "ProducerIdHistoryRecord": (
        ProducerIdHistoryRecord(lowest_issued=5000, issued_before_seed=False, seeded=True),
        # [18, 0, [5000, false, true]]
        "93120093cd1388c2c3",
    ),
}

GOLDEN_PAYLOADS = {
    "AuditEntry": (
        AuditEntry(raft_index=42, raft_term=7, position=1, accepted=False, error="boom",
                   record="AllocateProducerIdsRecord"),
        "936400962a0701c2a4626f6f6db9416c6c6f6361746550726f64756365724964735265636f7264",
    ),
    "AuditGap": (
        AuditGap(raft_index=41),
        "9365009129",
    ),
    "InitTransactionalProducerRequest": (
        InitTransactionalProducerRequest(broker_id=3, broker_epoch=17, transactional_id="orders-tx-1",
                                         transaction_timeout_ms=60000, producer_id=5000, producer_epoch=2,
                                         request_id="3:17:1"),
        "936601970311ab6f72646572732d74782d31cdea60cd138802a6333a31373a31",
    ),
    "InitTransactionalProducerResponse": (
        InitTransactionalProducerResponse(error_code=90, error_message="fenced", producer_id=-1, producer_epoch=-1),
        "936701955aa666656e636564ffffff",
    ),
    "DescribeTransactionalIdRequest": (
        DescribeTransactionalIdRequest(transactional_id="orders-tx-1"),
        "93680091ab6f72646572732d74782d31",
    ),
    "DescribeTransactionalIdResponse": (
        DescribeTransactionalIdResponse(error_code=0, error_message=None, producer_id=5000, producer_epoch=3,
                                        state="Empty"),
        "9369009500c0cd138803a5456d707479",
    ),
    "SeedProducerIdsRequest": (
        SeedProducerIdsRequest(next_producer_id=5000, origin="export:zk.json", zk_broker=35, zk_block_start=4000,
                               zk_block_end=4999),
        "936a0095cd1388ae6578706f72743a7a6b2e6a736f6e23cd0fa0cd1387",
    ),
    "SeedProducerIdsResponse": (
        SeedProducerIdsResponse(error_code=0, error_message=None, changed=True, next_producer_id=5000),
        "936b009400c0c3cd1388",
    ),
    "MigrationCommandRequest": (
        MigrationCommandRequest(action="bridge", zk="127.0.0.1:2181/kafka"),
        "936c0092a6627269646765b43132372e302e302e313a323138312f6b61666b61",
    ),
    "MigrationCommandResponse": (
        MigrationCommandResponse(error_code=0, error_message=None, mode="bridge", changed=True, next_producer_id=5000,
                                 message="ok"),
        "936d009600c0a6627269646765c3cd1388a26f6b",
    ),
    "AlterAclsRequest": (
        AlterAclsRequest(action="add", principal="User:alice", resource_type="TransactionalId", resource_name="*",
                         pattern_type="LITERAL", operation="WRITE", permission="ALLOW", host="*"),
        "936e0098a3616464aa557365723a616c696365af5472616e73616374696f6e616c4964a12aa74c49544552414ca557524954"
        "45a5414c4c4f57a12a",
    ),
    "AlterAclsResponse": (
        AlterAclsResponse(error_code=0, error_message=None, changed=True),
        "936f009300c0c3",
    ),
    "DescribeAclsRequest": (
        DescribeAclsRequest(principal="User:alice"),
        "93700091aa557365723a616c696365",
    ),
    "DescribeAclsResponse": (
        DescribeAclsResponse(error_code=31, error_message="denied", acls="[]", applied_index=42),
        "937100941fa664656e696564a25b5d2a",
    ),
    "AlterClientQuotaRequest": (
        AlterClientQuotaRequest(user=None, key="producer_ids_rate", value=0.5, remove=False, validate_only=True),
        "93730095c0b170726f64756365725f6964735f72617465cb3fe0000000000000c2c3",
    ),
    "AlterClientQuotaResponse": (
        AlterClientQuotaResponse(error_code=42, error_message="rate must be finite", changed=False),
        "937400932ab372617465206d7573742062652066696e697465c2",
    ),
    "TransactionRequest": (
        TransactionRequest(broker_id=3, broker_epoch=17, op="add", transactional_id="orders-tx-1", producer_id=5000,
                           producer_epoch=2, partitions='[[3,"orders",0]]', sequence=8),
        "9375019a0311a3616464ab6f72646572732d74782d31cd138802b05b5b332c226f7264657273222c305d5dff6408",
    ),
    "TransactionResponse": (
        TransactionResponse(error_code=51, error_message="busy"),
        "9376009433a462757379a0a25b5d",
    ),
    "BlockHistoryRequest": (
        BlockHistoryRequest(after_raft_index=42, after_position=1, cursor_offset=4096, limit=500, broker_id=3),
        "937700952a01cd1000cd01f403",
    ),
    "BlockHistoryResponse": (
        BlockHistoryResponse(error_code=0, node_id=2, applied_index=50, trail_index=49, blocks="[]", gaps="[[0,7]]",
                             next_raft_index=49, next_position=0, next_offset=8192, more=True),
        "9378009b00c0023231a25b5da75b5b302c375d5d3100cd2000c3",
    ),
}

ALL_INSTANCES = [rec for rec, _ in GOLDEN.values()] + [rec for rec, _ in GOLDEN_PAYLOADS.values()]


def _ids(recs):
    return [r.SPEC.name for r in recs]


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
# Older versions decode with defaults (compatibility rule)
# --------------------------------------------------------------------------


def test_hand_built_v0_payload_decodes():
    data = msgpack.packb([1, 0, [3, 17, 123000, 1000, TS]], use_bin_type=True)
    assert decode(data) == GOLDEN["AllocateProducerIdsRecord"][0]
    data = msgpack.packb([7, 0, [17]], use_bin_type=True)
    assert decode(data) == BrokerEpochCursorRecord(last_broker_epoch=17)


WIDGET_V1 = RecordSpec(
    name="Widget",
    type_id=9999,
    version=1,
    doc="synthetic",
    fields=(
        FieldSpec("a", "int32", "first"),
        FieldSpec("b", "string", "second"),
        FieldSpec("c", "int64", "added in v1", default=42, since=1),
        FieldSpec("d", "nullable_string", "added in v1", default=None, since=1),
    ),
)


@pytest.fixture
def widget(monkeypatch):
    validate_spec(WIDGET_V1)
    cls = codec._make_class(WIDGET_V1)
    monkeypatch.setitem(codec.CLASSES, WIDGET_V1.type_id, cls)
    return cls


def test_v0_payload_decodes_into_v1_class_with_defaults(widget):
    data = msgpack.packb([9999, 0, [7, "seven"]], use_bin_type=True)
    rec = decode(data)
    assert type(rec) is widget
    assert rec == widget(a=7, b="seven", c=42, d=None)
    assert (rec.c, rec.d) == (42, None)
    # Re-encoding writes the current version, with the defaults spelled out.
    assert msgpack.unpackb(encode(rec)) == [9999, 1, [7, "seven", 42, None]]


def test_v1_payload_decodes_all_fields(widget):
    rec = decode(msgpack.packb([9999, 1, [7, "seven", 8, "x"]], use_bin_type=True))
    assert rec == widget(a=7, b="seven", c=8, d="x")
    assert decode(encode(rec)) == rec


def test_v1_class_refuses_wrong_counts_and_newer_versions(widget):
    with pytest.raises(RecordError, match="v0: expected 2 fields, got 4"):
        decode(msgpack.packb([9999, 0, [7, "seven", 8, "x"]]))
    with pytest.raises(RecordError, match="v1: expected 4 fields, got 2"):
        decode(msgpack.packb([9999, 1, [7, "seven"]]))
    with pytest.raises(RecordError, match="unsupported version 2"):
        decode(msgpack.packb([9999, 2, [7, "seven", 8, "x", 9]]))


def test_v0_payload_with_bad_value_still_refused(widget):
    with pytest.raises(RecordError, match="Widget.b"):
        decode(msgpack.packb([9999, 0, [7, 8]]))


def test_fields_at():
    assert [f.name for f in WIDGET_V1.fields_at(0)] == ["a", "b"]
    assert [f.name for f in WIDGET_V1.fields_at(1)] == ["a", "b", "c", "d"]


# --------------------------------------------------------------------------
# validate_spec
# --------------------------------------------------------------------------


def _spec(*fields, version=1):
    return RecordSpec(name="S", type_id=5000, version=version, doc="", fields=tuple(fields))


def test_validate_spec_accepts_the_real_schema_and_a_good_spec():
    for s in schema.RECORDS + schema.PAYLOADS:
        validate_spec(s)
    validate_spec(WIDGET_V1)


def test_validate_spec_rejects_field_added_after_v0_without_default():
    with pytest.raises(ValueError, match="needs a default"):
        validate_spec(_spec(FieldSpec("a", "int32", ""), FieldSpec("b", "int32", "", since=1)))


def test_validate_spec_rejects_unknown_type():
    with pytest.raises(ValueError, match="unknown type 'float'"):
        validate_spec(_spec(FieldSpec("a", "float", "")))
    with pytest.raises(ValueError, match="unknown type"):
        validate_spec(_spec(FieldSpec("a", "int", "")))


def test_validate_spec_rejects_duplicate_field():
    with pytest.raises(ValueError, match="duplicate"):
        validate_spec(_spec(FieldSpec("a", "int32", ""), FieldSpec("a", "int64", "")))


def test_validate_spec_rejects_out_of_order_since():
    with pytest.raises(ValueError, match="appended in version order"):
        validate_spec(_spec(FieldSpec("a", "int32", ""), FieldSpec("b", "int32", "", default=0, since=1),
                            FieldSpec("c", "int32", "", default=0, since=0)))


def test_validate_spec_rejects_since_above_version():
    with pytest.raises(ValueError, match="since 2 > record version 1"):
        validate_spec(_spec(FieldSpec("a", "int32", ""), FieldSpec("b", "int32", "", default=0, since=2)))


def test_schema_type_ids_and_names_are_unique():
    specs = schema.RECORDS + schema.PAYLOADS
    assert len({s.type_id for s in specs}) == len(specs)
    assert len({s.name for s in specs}) == len(specs)


# --------------------------------------------------------------------------
# decode refusals
# --------------------------------------------------------------------------


def _packed(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@pytest.mark.parametrize("obj,fragment", [
    ([0, 0, []], "unknown record type 0"),
    ([99, 0, [1]], "unknown record type 99"),
    ([-1, 0, [1]], "unknown record type -1"),
    ([99, 0, [1]], "unknown record type 99"),
    (["AllocateProducerIdsRecord", 0, [1]], "unknown record type"),
    ([True, 0, [1]], "unknown record type True"),
    ([1.0, 0, [1]], "unknown record type 1.0"),
    ([7.0, 0, [1]], "unknown record type 7.0"),
    ([None, 0, [1]], "unknown record type None"),
])
def test_decode_refuses_unknown_type_ids(obj, fragment):
    with pytest.raises(RecordError) as ei:
        decode(_packed(obj))
    assert fragment in str(ei.value)


@pytest.mark.parametrize("version", [1, 2, 255, -1, True, False, "0", None, 0.0])
def test_decode_refuses_newer_or_bad_versions(version):
    with pytest.raises(RecordError, match="unsupported version"):
        decode(_packed([7, version, [17]]))


@pytest.mark.parametrize("values", [[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6]])
def test_decode_refuses_wrong_field_counts(values):
    with pytest.raises(RecordError, match="expected 5 fields"):
        decode(_packed([1, 0, values]))


def test_decode_refuses_fields_that_are_not_an_array():
    with pytest.raises(RecordError, match="fields must be an array"):
        decode(_packed([7, 0, {"last_broker_epoch": 1}]))
    with pytest.raises(RecordError, match="fields must be an array"):
        decode(_packed([7, 0, 17]))


@pytest.mark.parametrize("values,fragment", [
    (["3", 17, 0, 1, TS], "broker_id: expected int32, got str"),
    ([True, 17, 0, 1, TS], "broker_id: expected int32, got bool"),
    ([3, False, 0, 1, TS], "broker_epoch: expected int64, got bool"),
    ([3, 17, 0.5, 1, TS], "producer_id_start: expected int64, got float"),
    ([3, 17, None, 1, TS], "producer_id_start: expected int64, got NoneType"),
    ([2**31, 17, 0, 1, TS], "2147483648 is out of range for int32"),
    ([-(2**31) - 1, 17, 0, 1, TS], "out of range for int32"),
    ([3, 17, 0, 2**31, TS], "producer_id_len: 2147483648 is out of range for int32"),
    ([3, 17, 2**63, 1, TS], "out of range for int64"),
    ([3, 17, 0, 1, 2**64 - 1], "timestamp_ms: 18446744073709551615 is out of range for int64"),
    ([3, 17, b"\x00", 1, TS], "expected int64, got bytes"),
])
def test_decode_refuses_wrong_types_and_ranges(values, fragment):
    with pytest.raises(RecordError) as ei:
        decode(_packed([1, 0, values]))
    assert fragment in str(ei.value)


def test_decode_refuses_wrong_string_types():
    with pytest.raises(RecordError, match="incarnation_id: expected string, got bytes"):
        decode(_packed([2, 0, [1, b"raw", 1, "", TS]]))
    with pytest.raises(RecordError, match="incarnation_id: expected string, got int"):
        decode(_packed([2, 0, [1, 5, 1, "", TS]]))
    with pytest.raises(RecordError, match="accepted: expected bool, got int"):
        decode(_packed([100, 0, [1, 1, 0, 1, None, "X"]]))
    with pytest.raises(RecordError, match="error: expected string or null, got int"):
        decode(_packed([100, 0, [1, 1, 0, True, 3, "X"]]))
    with pytest.raises(RecordError, match="value: expected float64, got int"):
        decode(_packed([16, 0, [None, "producer_ids_rate", 2, False, TS]]))


@pytest.mark.parametrize("data", [
    b"",
    b"\xc1",                       # never-used msgpack byte
    b"\x93\x01",                   # truncated array
    b"\x91" * 5000,                # nesting too deep
    bytes.fromhex("930100950311ce0001e078cd03e8cf0000018bcfe568"),  # golden cut short
    b"\x81\x01\x02",               # map with a non-string key
    b"garbage!",
])
def test_decode_refuses_garbage_bytes(data):
    with pytest.raises(RecordError):
        decode(data)


@pytest.mark.parametrize("obj", [
    None, 5, "x", b"x", {"a": 1}, [], [1, 0], [1, 0, [], 4], msgpack.ExtType(1, b"\x00"),
])
def test_decode_refuses_values_that_are_not_records(obj):
    with pytest.raises(RecordError, match="a record is"):
        decode(_packed(obj))


def test_decode_refuses_trailing_data():
    good = encode(GOLDEN["BrokerEpochCursorRecord"][0])
    with pytest.raises(RecordError, match="not a msgpack record"):
        decode(good + b"\x00")
    with pytest.raises(RecordError):
        decode(good + good)


def test_record_error_is_a_value_error():
    assert issubclass(RecordError, ValueError)
    assert records.RecordError is codec.RecordError


# --------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------


def test_batch_round_trip():
    batch = [rec for rec, _ in GOLDEN.values()]
    data = encode_batch(batch)
    assert decode_batch(data) == batch
    assert msgpack.unpackb(data)[0] == codec.ENTRY_FORMAT == 1
    assert decode_batch(encode_batch([])) == []
    assert decode_batch(encode_batch(iter(batch[:2]))) == batch[:2]


def test_batch_golden_bytes():
    batch = [GOLDEN["ProducerIdCursorRecord"][0], GOLDEN["BrokerEpochCursorRecord"][0]]
    assert encode_batch(batch).hex() == "9201" + "92" + "93060091ce0001e460" + "9307009111"


@pytest.mark.parametrize("data", [
    b"",
    b"\xc1",
    _packed([1, [[7, 0, [1]]]]) + b"\x00",       # trailing data
    _packed([2, [[7, 0, [1]]]]),                  # unknown format
    _packed([0, []]),
    _packed([1]),
    _packed([1, [], []]),
    _packed([7, 0, [1]]),                         # a bare record, not a batch
    _packed({"format": 1, "records": []}),
    _packed([1, {"a": 1}]),
    _packed(None),
])
def test_decode_batch_refuses_bad_batches(data):
    with pytest.raises(RecordError):
        decode_batch(data)


@pytest.mark.parametrize("marker", [True, 1.0, "1", None, [1]], ids=["true", "float", "str", "nil", "list"])
def test_decode_batch_format_marker_must_be_the_int_1(marker):
    """True == 1 and 1.0 == 1 in Python; on the wire they are not format 1."""
    data = _packed([marker, [[7, 0, [1]]]])
    assert msgpack.unpackb(data)[0] == marker
    with pytest.raises(RecordError, match="unsupported record batch format") as ei:
        decode_batch(data)
    assert repr(marker) in str(ei.value)


def test_decode_batch_refuses_a_bad_record_inside():
    good = [7, 0, [1]]
    with pytest.raises(RecordError, match="unknown record type 77"):
        decode_batch(_packed([1, [good, [77, 0, [1]]]]))
    with pytest.raises(RecordError, match="unsupported version 1"):
        decode_batch(_packed([1, [good, [7, 1, [1]]]]))
    with pytest.raises(RecordError, match="out of range for int64"):
        decode_batch(_packed([1, [good, [7, 0, [2**64 - 1]]]]))


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
