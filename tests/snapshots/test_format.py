"""Unit tests for snapshots.format: the snapshot file (no Raft, no network)."""
from __future__ import annotations

import os
import random
import struct
import zlib

import msgpack
import pytest

from quorum.managers import QuorumState
from records import (
    AllocateProducerIdsRecord,
    BrokerEpochCursorRecord,
    FenceBrokerRecord,
    ProducerIdCursorRecord,
    ProducerIdHistoryRecord,
    RegisterBrokerRecord,
    encode_batch,
)
from records.codec import to_obj
from records.schema import LONG_MAX
from snapshots import Snapshot, inspect_snapshot, read_snapshot, write_snapshot
from snapshots.format import FORMAT, MAGIC, decode_snapshot, encode_snapshot
from snapshots.storage.disk import CorruptFileError
from records.wire.errors import InvalidRequestError

TS = 1_700_000_000_000

RECORDS = [
    AllocateProducerIdsRecord(broker_id=1, broker_epoch=3, producer_id_start=5000, producer_id_len=1000,
                              timestamp_ms=TS),
    RegisterBrokerRecord(broker_id=1, incarnation_id="inc-1", broker_epoch=3, listener="h1:9092"),
    RegisterBrokerRecord(broker_id=2, incarnation_id="inc-2", broker_epoch=4, listener="h2:9092"),
    FenceBrokerRecord(broker_id=2, broker_epoch=4),
    BrokerEpochCursorRecord(last_broker_epoch=4),
]
LAST = (encode_batch(RECORDS[:1]), 42, 7)
PREV = (b"\x00\xffprev", 41, 6)
CLUSTER = ["127.0.0.1:7003", "127.0.0.1:7001", "127.0.0.1:7002"]


def make_snapshot(**over) -> Snapshot:
    kw = dict(records=list(RECORDS), last_entry=LAST, prev_entry=PREV, cluster=list(CLUSTER),
              meta={"node": "127.0.0.1:7001", "written_ms": TS})
    kw.update(over)
    return Snapshot(**kw)


@pytest.fixture
def snap_path(tmp_path) -> str:
    p = str(tmp_path / "raft.snapshot")
    write_snapshot(p, make_snapshot())
    return p


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def frame(body_obj) -> bytes:
    body = msgpack.packb(body_obj, use_bin_type=True)
    return MAGIC + struct.pack("<I", len(body)) + body + struct.pack("<I", zlib.crc32(body))


def good_body(**over) -> dict:
    body = {"format": FORMAT, "last_entry": list(LAST), "prev_entry": list(PREV), "cluster": sorted(CLUSTER),
            "records": [to_obj(r) for r in RECORDS], "meta": {}}
    body.update(over)
    return body


# --------------------------------------------------------------------------
# round trip
# --------------------------------------------------------------------------


def test_write_read_round_trip(tmp_path):
    path = str(tmp_path / "s")
    snap = make_snapshot()
    n = write_snapshot(path, snap)
    assert n == os.path.getsize(path) == len(encode_snapshot(snap))
    back = read_snapshot(path)
    assert back.records == RECORDS
    assert [type(r) for r in back.records] == [type(r) for r in RECORDS]
    assert back.last_entry == LAST
    assert back.prev_entry == PREV
    for entry in (back.last_entry, back.prev_entry):
        assert type(entry) is tuple and len(entry) == 3
        assert type(entry[0]) is bytes and type(entry[1]) is int and type(entry[2]) is int
    assert back.cluster == sorted(CLUSTER)
    assert back.meta == {"node": "127.0.0.1:7001", "written_ms": TS}
    assert back.last_index == 42


def test_round_trip_restores_the_state(tmp_path):
    state = QuorumState.from_records(RECORDS)
    path = str(tmp_path / "s")
    write_snapshot(path, make_snapshot(records=state.snapshot_records()))
    back = QuorumState.from_records(read_snapshot(path).records)
    assert back.summary() == state.summary()


def test_a_seeded_quorum_stays_seeded_through_a_snapshot_file(tmp_path):
    # Seeded while fresh, then issued above the seed: the file carries that (ProducerIdHistoryRecord), so the
    # restored node accepts the same seed again and knows the quorum issued nothing before it.
    state = QuorumState.from_records(RECORDS[1:])
    res = state.producer_ids.generate_seed(5000, "export:zk.json", 35, 4000, 4999, TS)
    assert all(o.accepted for o in state.apply_batch(res.records))
    state.apply_batch([AllocateProducerIdsRecord(broker_id=1, broker_epoch=3, producer_id_start=5000,
                                                 producer_id_len=1000)])
    path = str(tmp_path / "s")
    write_snapshot(path, make_snapshot(records=state.snapshot_records()))
    records = read_snapshot(path).records
    assert ProducerIdHistoryRecord(lowest_issued=5000, issued_before_seed=False, seeded=True) in records
    back = QuorumState.from_records(records)
    assert back.producer_ids.history() == {"lowest": 5000, "before_seed": False, "seeded": True}
    assert back.producer_ids.generate_seed(5000, "export:zk.json", 35, 4000, 4999, TS).response == (False, 6000)


def test_a_snapshot_written_before_the_history_record_is_read_conservatively(tmp_path):
    # RECORDS is such a snapshot: the latest block [5000, 6000) and no word of the blocks before it.
    path = str(tmp_path / "s")
    write_snapshot(path, make_snapshot())
    back = QuorumState.from_records(read_snapshot(path).records)
    assert back.producer_ids.history() == {"lowest": 0, "before_seed": True, "seeded": False}
    with pytest.raises(InvalidRequestError, match=r"issued producer IDs 0\.\.5999, which overlap ZooKeeper's "
                                                  r"range 0\.\.9999"):
        back.producer_ids.generate_seed(10_000, "export:zk.json", 35, 9000, 9999, TS)


def test_round_trip_edge_values(tmp_path):
    path = str(tmp_path / "s")
    snap = Snapshot(records=[], last_entry=(b"", 0, 0), prev_entry=(b"", LONG_MAX, LONG_MAX), cluster=[])
    write_snapshot(path, snap)
    back = read_snapshot(path)
    assert back.records == [] and back.cluster == [] and back.meta == {}
    assert back.last_entry == (b"", 0, 0)
    assert back.prev_entry == (b"", LONG_MAX, LONG_MAX)


def test_write_replaces_existing_file(snap_path):
    write_snapshot(snap_path, make_snapshot(records=[ProducerIdCursorRecord(next_producer_id=9)]))
    assert read_snapshot(snap_path).records == [ProducerIdCursorRecord(next_producer_id=9)]


def test_encoding_is_deterministic():
    assert encode_snapshot(make_snapshot()) == encode_snapshot(make_snapshot(cluster=sorted(CLUSTER)))


def test_layout(snap_path):
    data = read_bytes(snap_path)
    assert data.startswith(MAGIC) and MAGIC == b"PQSNAP\x00\x01"
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    body = data[len(MAGIC) + 4:len(MAGIC) + 4 + length]
    assert len(data) == len(MAGIC) + 4 + length + 4
    assert struct.unpack("<I", data[-4:])[0] == zlib.crc32(body)
    assert msgpack.unpackb(body)["format"] == FORMAT == 1


def test_inspect_snapshot(snap_path):
    out = inspect_snapshot(snap_path)
    assert out == {
        "file": snap_path,
        "size_bytes": os.path.getsize(snap_path),
        "last_index": 42,
        "last_term": 7,
        "cluster": sorted(CLUSTER),
        "meta": {"node": "127.0.0.1:7001", "written_ms": TS},
        "records": [r.to_json_dict() for r in RECORDS],
    }
    assert out["records"][0]["type"] == "AllocateProducerIdsRecord"
    assert out["records"][3] == {"type": "FenceBrokerRecord", "broker_id": 2, "broker_epoch": 4, "timestamp_ms": -1}


def test_inspect_snapshot_refuses_corrupt_file(snap_path):
    write_bytes(snap_path, read_bytes(snap_path)[:-1])
    with pytest.raises(CorruptFileError):
        inspect_snapshot(snap_path)


# --------------------------------------------------------------------------
# damaged files
# --------------------------------------------------------------------------


def _assert_refused(path: str, fragment: str) -> CorruptFileError:
    with pytest.raises(CorruptFileError) as ei:
        read_snapshot(path)
    assert ei.value.path == path
    assert path in str(ei.value)
    assert fragment in str(ei.value)
    return ei.value


@pytest.mark.parametrize("keep_fraction", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_truncated_file_is_refused(snap_path, keep_fraction):
    data = read_bytes(snap_path)
    cut = max(int(len(data) * keep_fraction), 1) if keep_fraction else 0
    write_bytes(snap_path, data[:cut])
    _assert_refused(snap_path, "truncated")


def test_truncated_by_one_byte_is_refused(snap_path):
    write_bytes(snap_path, read_bytes(snap_path)[:-1])
    _assert_refused(snap_path, "truncated or padded")


def test_empty_file_is_refused(snap_path):
    write_bytes(snap_path, b"")
    _assert_refused(snap_path, "truncated snapshot (0 bytes)")


def test_missing_file_is_refused(tmp_path):
    path = str(tmp_path / "nope")
    _assert_refused(path, "cannot read")


@pytest.mark.parametrize("where", ["body_start", "body_middle", "body_end", "crc"])
def test_flipped_byte_is_refused_by_checksum(snap_path, where):
    data = bytearray(read_bytes(snap_path))
    header = len(MAGIC) + 4
    offset = {"body_start": header, "body_middle": (header + len(data) - 4) // 2,
              "body_end": len(data) - 5, "crc": len(data) - 2}[where]
    data[offset] ^= 0x01
    write_bytes(snap_path, bytes(data))
    _assert_refused(snap_path, "checksum mismatch")


def test_every_single_bit_flip_is_refused(snap_path):
    data = read_bytes(snap_path)
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x10
        with pytest.raises(CorruptFileError):
            decode_snapshot(snap_path, bytes(damaged))


@pytest.mark.parametrize("magic", [b"XQSNAP\x00\x01", b"PQSNAP\x00\x02", b"PQJRNL\x00\x01", b"\x00" * 8])
def test_bad_magic_is_refused(snap_path, magic):
    data = read_bytes(snap_path)
    write_bytes(snap_path, magic + data[len(MAGIC):])
    _assert_refused(snap_path, "bad magic")


@pytest.mark.parametrize("extra", [b"\x00", b"garbage", b"\x00" * 4096])
def test_extra_trailing_bytes_are_refused(snap_path, extra):
    write_bytes(snap_path, read_bytes(snap_path) + extra)
    _assert_refused(snap_path, "truncated or padded")


def test_two_snapshots_concatenated_are_refused(snap_path):
    data = read_bytes(snap_path)
    write_bytes(snap_path, data + data)
    _assert_refused(snap_path, "truncated or padded")


# A checksum-valid body with bad content: only a writer bug could produce these.
@pytest.mark.parametrize("body,fragment", [
    (good_body(format=2), "unsupported snapshot format 2"),
    ({k: v for k, v in good_body().items() if k != "format"}, "unsupported snapshot format"),
    ([1, 2, 3], "unsupported snapshot format"),
    (good_body(records=[[6, 0, ["x"]]]), "bad record"),
    (good_body(records=[[999, 0, []]]), "bad record"),
    (good_body(records=[[6, 1, [1]]]), "bad record"),
    (good_body(records=5), "bad record"),
    ({k: v for k, v in good_body().items() if k != "records"}, "bad record"),
    (good_body(last_entry=[b"x", 1]), "last_entry is not a (bytes, index, term) entry"),
    (good_body(last_entry=["x", 1, 1]), "last_entry is not a (bytes, index, term) entry"),
    (good_body(last_entry=[b"x", True, 1]), "last_entry is not"),
    (good_body(prev_entry=[b"x", 1, 1.5]), "prev_entry is not"),
    (good_body(prev_entry=None), "prev_entry is not"),
    (good_body(format=True), "unsupported snapshot format True"),
    (good_body(format=1.0), "unsupported snapshot format 1.0"),
    (1, "a body of type int, not a map"),
    (good_body(cluster=5), "cluster is not an array of addresses"),
    (good_body(cluster="127.0.0.1:7001"), "cluster is not an array of addresses"),
    (good_body(cluster=["127.0.0.1:7001", 7002]), "cluster is not an array of addresses"),
    ({k: v for k, v in good_body().items() if k != "cluster"}, "cluster is not an array of addresses"),
    (good_body(meta=[1, 2]), "meta is of type list, not a map"),
    (good_body(meta=[["a", 1]]), "meta is of type list, not a map"),
    ({k: v for k, v in good_body().items() if k != "meta"}, "meta is of type NoneType, not a map"),
])
def test_checksum_valid_but_malformed_body_is_refused(tmp_path, body, fragment):
    path = str(tmp_path / "s")
    write_bytes(path, frame(body))
    _assert_refused(path, fragment)


def test_checksum_valid_but_undecodable_body_is_refused(tmp_path):
    path = str(tmp_path / "s")
    for body in (b"\xc1", b"\x81\xa1a", msgpack.packb({"format": 1}) + b"\x00", b"\xa3\xff\xfe\xfd",
                 msgpack.packb({1: 2})):
        write_bytes(path, MAGIC + struct.pack("<I", len(body)) + body + struct.pack("<I", zlib.crc32(body)))
        with pytest.raises(CorruptFileError):
            read_snapshot(path)


def test_garbage_only_raises_corrupt_file_error(tmp_path):
    """Random files, checksum-valid random bodies, and good bodies with one field replaced by
    a value of another kind: CorruptFileError or a snapshot, never a bare ValueError, TypeError..."""
    path = str(tmp_path / "s")
    rng = random.Random(0x5A4B)
    values = [None, True, 1, 1.0, -1, 2**64 - 1, "x", b"x", [], [1, "a"], {}, {"a": 1}, [[1, 2]], [b"x", 1, 1]]
    cases = [rng.randbytes(rng.randrange(0, 64)) for _ in range(500)]
    cases += [MAGIC + struct.pack("<I", len(b)) + b + struct.pack("<I", zlib.crc32(b))
              for b in (rng.randbytes(rng.randrange(0, 48)) for _ in range(1000))]
    cases += [frame(good_body(**{key: value})) for key in good_body() for value in values]
    for data in cases:
        write_bytes(path, data)
        try:
            read_snapshot(path)
        except CorruptFileError as e:
            assert e.path == path


def test_hand_framed_good_body_reads(tmp_path):
    path = str(tmp_path / "s")
    write_bytes(path, frame(good_body()))
    assert read_snapshot(path).records == RECORDS


# --------------------------------------------------------------------------
# size does not grow with history
# --------------------------------------------------------------------------


def _snapshot_size(tmp_path, n_allocations: int) -> tuple[int, QuorumState, str]:
    state = QuorumState()
    state.replay(RegisterBrokerRecord(broker_id=1, incarnation_id="inc-1", broker_epoch=1, listener="h1:9092",
                                      timestamp_ms=TS))
    state.replay(RegisterBrokerRecord(broker_id=2, incarnation_id="inc-2", broker_epoch=2, listener="h2:9092",
                                      timestamp_ms=TS))
    state.replay(FenceBrokerRecord(broker_id=2, broker_epoch=2, timestamp_ms=TS))
    for i in range(n_allocations):
        state.replay(AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=i * 1000,
                                               producer_id_len=1000, timestamp_ms=TS))
    # Same entries for both sizes, so only the state can make a difference.
    last_cmd = encode_batch([state.producer_ids.latest])
    path = str(tmp_path / f"snap-{n_allocations}")
    size = write_snapshot(path, Snapshot(records=state.snapshot_records(), last_entry=(last_cmd, 10**6, 3),
                                         prev_entry=(last_cmd, 10**6 - 1, 3), cluster=list(CLUSTER)))
    assert size == os.path.getsize(path)
    return size, state, path


def test_snapshot_size_does_not_grow_with_allocations(tmp_path):
    small, _, _ = _snapshot_size(tmp_path, 10)
    large, state, path = _snapshot_size(tmp_path, 100_000)
    assert state.producer_ids.next_producer_id == 100_000_000
    # Only msgpack integer widths may differ (9000 vs 99_999_000 as block start,
    # in the record and in the two entry commands).
    assert 0 <= large - small <= 8
    assert large < 1024
    back = QuorumState.from_records(read_snapshot(path).records)
    assert back.summary() == state.summary()
