"""Property tests of the record decoder (records.codec: decode, decode_batch, from_obj, and
the JSON form) for every record and payload type in records.schema, so types added later
are covered: valid records decode to themselves; a wrong type or out-of-range value in any
field, unknown type ids, bad versions, wrong field counts, truncated msgpack and huge ints
are RecordError; nothing decoded ever holds a value its schema does not allow."""
from __future__ import annotations

import random
import tracemalloc

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from records import schema as rschema
from records.codec import CLASSES, RecordError, check_value, decode, decode_batch, encode, encode_batch, from_obj, to_obj
from tests.fuzz import inputs as F

pytestmark = pytest.mark.usefixtures("memory_bound")
SPECS = rschema.RECORDS + rschema.PAYLOADS
MUST_FAIL = {"wrong-field", "unknown-type", "bad-version", "field-count", "shape"}


@settings(max_examples=F.examples(1500))
@given(data=st.data())
def test_record_objects(data):
    obj, how = F.record_obj(F.HypothesisSource(data))
    outcome = F.check_record_obj(obj)
    if how == "valid":
        assert outcome == "ok"
    elif how in MUST_FAIL:
        assert outcome == "error"


@settings(max_examples=F.examples(500))
@given(data=st.data(), cut=st.integers(0, 10_000))
def test_encoded_records_and_batches_truncated_or_extended(data, cut):
    src = F.HypothesisSource(data)
    recs = [F.valid_record(src.choice(list(SPECS)), src) for _ in range(src.integer(1, 3))]
    one, batch = encode(recs[0]), encode_batch([r for r in recs if r.SPEC in rschema.RECORDS] or recs[:1])
    assert decode(one) == recs[0]
    for blob in (one, batch):
        cut_at = cut % len(blob)
        F.check_record_decoder(blob[:cut_at])  # RecordError, never another exception
        with pytest.raises(RecordError):
            decode(blob[:cut_at]) if blob is one else decode_batch(blob[:cut_at])
        F.check_record_decoder(blob + src.binary(4))


@settings(max_examples=F.examples(500))
@given(blob=st.binary(max_size=300))
def test_any_bytes(blob):
    F.check_record_decoder(blob)


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_field_refuses_every_wrong_value(spec):
    """Exhaustive, not sampled: each field of each type, each wrong value of its type."""
    base = to_obj(F.valid_record(spec, F.RandomSource(random.Random(spec.type_id))))
    for i, f in enumerate(spec.fields):
        lo_hi = rschema.INT_RANGES.get(f.type)
        wrong = [True, False, 1.0, "1", b"\x01", None, [1], {"a": 1}, 2**64 - 1, -(2**63)]
        if lo_hi:
            wrong += [lo_hi[0] - 1, lo_hi[1] + 1]
        for value in wrong:
            try:
                check_value(spec, f, value)
                continue  # a valid value for this field
            except RecordError:
                pass
            obj = [base[0], base[1], list(base[2])]
            obj[2][i] = value
            with pytest.raises(RecordError, match=f"{spec.name}.{f.name}"):
                from_obj(obj)
            if type(value) is not int or -(2**63) <= value <= 2**64 - 1:  # what msgpack can carry
                with pytest.raises(RecordError):
                    decode(msgpack.packb(obj, use_bin_type=True))


def test_unknown_type_ids_and_versions():
    known = set(CLASSES)
    for tid in [0, -1, max(known) + 1, 2**64 - 1, -(2**63), True, 1.0, "1", None, [1]]:
        if type(tid) is int and tid in known:
            continue
        with pytest.raises(RecordError, match="unknown record type"):
            from_obj([tid, 0, []])
    for spec in SPECS:
        for v in [spec.version + 1, -1, 2**64 - 1, True, 0.0, "0", None]:
            with pytest.raises(RecordError, match="unsupported version"):
                from_obj([spec.type_id, v, []])


def test_huge_containers_claimed_by_a_few_bytes_are_refused_without_allocating():
    """msgpack headers claiming 2**32 - 1 elements or bytes, in a 5..9-byte input."""
    tracemalloc.start()
    try:
        for blob in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
                     b"\x93\x01\x00\xdd\xff\xff\xff\xff", b"\x92\x01\xdd\xff\xff\xff\xff"):
            tracemalloc.reset_peak()
            assert F.check_record_decoder(blob) == "error/error"
            assert tracemalloc.get_traced_memory()[1] < 1024 * 1024
    finally:
        tracemalloc.stop()


def test_seeded_record_objects():
    """20,000 seeded inputs (``RandomSource(random.Random(7101))``), every type and corruption."""
    src = F.RandomSource(random.Random(7101))
    seen = set()
    for _ in range(F.examples(20_000)):
        obj, how = F.record_obj(src)
        outcome = F.check_record_obj(obj)
        assert outcome == "ok" if how == "valid" else how not in MUST_FAIL or outcome == "error", (how, obj)
        if how == "valid":
            seen.add(obj[0])
    assert seen == set(CLASSES)
