"""Fuzz inputs for the file decoders: a valid file of each kind made by the project's own writer, byte-level
mutations of it and sealed garbage, and the file-decoder property."""
from __future__ import annotations

import json
import os
import struct
import zlib
from typing import Any

import msgpack

from chaos.history import HistoryError, read_final, read_history
from quorum.journal import MAGIC as JOURNAL_MAGIC
from quorum.journal import META_MAGIC, DurableJournal, encode_entry
from quorum.managers import InvariantViolation, QuorumState
from quorum.trail import AuditWriter, _frame, read_audit, read_checkpoint
from records import AuditEntry, AuditGap
from records import schema as rschema
from records.codec import Record, to_obj
from snapshots.format import MAGIC as SNAPSHOT_MAGIC
from snapshots.format import Snapshot, encode_snapshot, read_snapshot
from snapshots.storage.disk import CorruptFileError, Disk
from tests.fuzz.record_inputs import check_record_values, random_value, record_obj, valid_record
from tests.fuzz.sources import FuzzFinding


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
    if kind == "snapshot":
        idx = src.integer(1, 2**40)
        return encode_snapshot(Snapshot(records=_replicated_records(src), last_entry=(src.binary(6), idx, 3),
                                        prev_entry=(b"", idx - 1, 3), cluster=["127.0.0.1:1", "127.0.0.1:2"],
                                        meta={"written_by": "fuzz"}))
    if kind == "journal":
        first = src.integer(1, 1000)
        return JOURNAL_MAGIC + b"".join(encode_entry(src.binary(20), first + i, 1 + i // 3)
                                        for i in range(src.integer(0, 5)))
    if kind == "meta":
        body = msgpack.packb({"term": src.integer(0, 100), "voted_for": src.choice([None, "127.0.0.1:1"]),
                              "commit_index": src.integer(0, 100)}, use_bin_type=True)
        return META_MAGIC + body + struct.pack("<I", zlib.crc32(body))
    if kind == "audit":
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
            return SNAPSHOT_MAGIC + struct.pack("<I", len(raw)) + raw + struct.pack("<I", zlib.crc32(raw))
        if kind == "meta":
            return META_MAGIC + raw + struct.pack("<I", zlib.crc32(raw))
        return struct.pack("<II", len(raw), zlib.crc32(raw)) + raw
    if kind == "journal":
        return JOURNAL_MAGIC + b"".join(
            encode_entry(src.binary(8), src.integer(0, 2**64 - 1), src.integer(0, 2**64 - 1))
            for _ in range(src.integer(1, 3)))
    if kind == "audit":
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
    if kind == "snapshot":
        snap = read_snapshot(path)
        for r in snap.records:
            check_record_values(r, b"")
        try:  # what the node does next with it: replay the records (refusal stops the node, naming the file)
            QuorumState.from_records(snap.records)
        except InvariantViolation:
            pass
        return (snap.records, snap.last_entry, snap.prev_entry, snap.cluster, snap.meta)
    if kind in ("journal", "meta"):
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
        audit = path[:-len(".checkpoint")]
        got = read_checkpoint(audit)
        if got is not None and not (type(got[0]) is int and type(got[1]) is int and min(got) >= 0):
            raise FuzzFinding("file:checkpoint", b"", f"accepted {got!r}")
        return got
    if kind == "history":
        return [op.to_dict() for op in read_history(path)]
    if kind == "final":
        return read_final(path)
    raise ValueError(kind)
