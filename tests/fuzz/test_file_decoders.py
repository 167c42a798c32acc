"""Property tests of the file decoders: the snapshot (snapshots/format.py), the Raft journal
and its meta file (quorum/journal.py), the audit trail and its checkpoint (quorum/trail.py),
and a chaos run's history and final-state files (chaos/history.py).

Inputs: valid files written by the project's own writers, byte-level mutations of them,
"sealed garbage" (framing and checksum right around a body of any value, so the checks
behind the checksum are reached) and random bytes.  Property: the documented error naming
the file (CorruptFileError, HistoryError), or content that is valid -- and for a mutation
of a checksummed file, the original content or a torn tail cut from it; never another
exception, never garbage accepted.
"""
from __future__ import annotations

import logging
import random
import struct
import tempfile
import zlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum.trail import AuditWriter, _frame, read_audit, read_checkpoint
from records import AllocateProducerIdsRecord, AuditEntry, AuditGap
from records.codec import to_obj
from snapshots.storage.disk import CorruptFileError
from tests.fuzz import inputs as F

pytestmark = pytest.mark.usefixtures("memory_bound")


@pytest.fixture(scope="module")
def workdir():
    logging.disable(logging.WARNING)  # torn tails and unusable checkpoints are logged by design
    with tempfile.TemporaryDirectory() as d:
        yield d
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("kind", F.FILE_KINDS)
@settings(max_examples=F.examples(150))
@given(data=st.data())
def test_file_decoder(kind, data, workdir):
    blob, original, _how = F.file_input(kind, F.HypothesisSource(data))
    F.check_file_decoder(kind, blob, original, workdir)


@pytest.mark.parametrize("kind", F.FILE_KINDS)
def test_seeded_files(kind, workdir):
    """600 seeded inputs per kind (``RandomSource(random.Random(7200 + kind index))``)."""
    src = F.RandomSource(random.Random(7200 + F.FILE_KINDS.index(kind)))
    outcomes = {F.check_file_decoder(kind, *F.file_input(kind, src)[:2], workdir) for _ in range(F.examples(600))}
    # (an unusable checkpoint is documented to read as None: a cache, the audit file is scanned)
    outcomes.discard("accepted-head-frames-lost")  # a known limit of the journal and audit formats
    assert outcomes == ({"accepted"} if kind == "checkpoint" else {"refused", "accepted"})


# ------------------------------------------------------------ regressions (found by this fuzzer)


def _audit_file(path, *frames: bytes) -> str:
    with open(path, "wb") as f:
        f.write(b"".join(frames))
    return str(path)


def _good_line() -> bytes:
    rec = AllocateProducerIdsRecord(broker_id=1, broker_epoch=2, producer_id_start=0, producer_id_len=10)
    entry = AuditEntry(raft_index=1, raft_term=1, position=0, accepted=True, record=rec.SPEC.name)
    return _frame([to_obj(entry), to_obj(rec)])


@pytest.mark.parametrize("body,match", [
    ({"a": 1}, "expected \\[entry, record\\], got dict"),  # was KeyError: 0
    ([to_obj(AllocateProducerIdsRecord(broker_id=1, broker_epoch=2, producer_id_start=0, producer_id_len=1)),
      None], "starts with a AllocateProducerIdsRecord, not an AuditEntry"),  # was accepted
    ([to_obj(AuditEntry(raft_index=1, position=0, accepted=True, record="AllocateProducerIdsRecord")), None],
     "has no record"),  # was accepted
    ([to_obj(AuditEntry(raft_index=1, position=0, accepted=True, record="AllocateProducerIdsRecord")),
      to_obj(AuditGap(raft_index=3))], "says AllocateProducerIdsRecord but holds a AuditGap"),  # was accepted
    ([to_obj(AuditGap(raft_index=3)), to_obj(AuditGap(raft_index=3))], "gap line at raft index 3 carries a record"),
    ([to_obj(AuditEntry(raft_index=1, position=0, accepted=True, record="AuditGap")), to_obj(AuditGap(raft_index=3))],
     "holds a AuditGap, which is not a replicated record"),
])
def test_checksum_valid_audit_lines_of_the_wrong_shape_are_corrupt(tmp_path, body, match):
    path = _audit_file(tmp_path / "audit.log", _good_line(), _frame(body), _good_line())
    with pytest.raises(CorruptFileError, match=match) as ei:
        read_audit(path)
    assert ei.value.path == path
    with pytest.raises(CorruptFileError):  # a node refuses to start on it (was AttributeError for a wrong entry)
        AuditWriter(path)


def test_entry_naming_another_record_is_corrupt(tmp_path):
    rec = AllocateProducerIdsRecord(broker_id=1, broker_epoch=2, producer_id_start=0, producer_id_len=10)
    entry = AuditEntry(raft_index=1, position=0, accepted=True, record="RegisterBrokerRecord")
    path = _audit_file(tmp_path / "audit.log", _frame([to_obj(entry), to_obj(rec)]))
    with pytest.raises(CorruptFileError, match="says RegisterBrokerRecord but holds a AllocateProducerIdsRecord"):
        read_audit(path)


@pytest.mark.parametrize("length", [float("inf"), float("nan"), 1.5, True, "12", None])
def test_checkpoint_with_non_integer_values_is_unusable_not_a_crash(tmp_path, length, caplog):
    """inf raised OverflowError (not caught), and 1.5 or True were taken as 1."""
    audit = _audit_file(tmp_path / "audit.log", _good_line())
    body = msgpack.packb({"length": length, "last_index": 1}, use_bin_type=True)
    with open(audit + ".checkpoint", "wb") as f:
        f.write(struct.pack("<II", len(body), zlib.crc32(body)) + body)
    with caplog.at_level(logging.WARNING):
        assert read_checkpoint(audit) is None
    assert "unusable" in caplog.text and "not integers" in caplog.text
    w = AuditWriter(audit)  # falls back to scanning the file
    assert w.last_index == 1
    w.close()
