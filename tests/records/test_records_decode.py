"""Unit tests for records.codec and records.schema (no Raft, no network, no files): older versions decode
with defaults, validate_spec, what decode refuses, and batches."""
from __future__ import annotations

import msgpack
import pytest

import records
from records import (
    BrokerEpochCursorRecord,
    RecordError,
    codec,
    decode,
    decode_batch,
    encode,
    encode_batch,
    schema,
)
from records.schema import FieldSpec, RecordSpec, validate_spec
from tests.records.golden import GOLDEN, TS


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
