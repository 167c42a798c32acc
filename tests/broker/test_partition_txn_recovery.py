"""The partition side of Kafka transactions (KIP-98): reads up to the last stable offset with the
aborted-transaction index, and their survival across restarts and crashes; the bounds on open
transactions."""
from __future__ import annotations

import os
import random

import msgpack
import numpy as np
import pytest

from broker.partition import Partition
from broker.producer_state import (
    ABORTED,
    AbortedIndex,
    ProducerStateManager,
    install_snapshot,
    list_snapshots,
    read_snapshot,
    snapshot_path,
)
from broker.recordbatch import parse_header
from snapshots.storage.disk import CorruptFileError
from tests.broker.test_partition import DAY, TS, Clock, InlineExecutor, idem, plain
from tests.broker.producer_batches import _forge
from records.wire.errors import Errors
from tests.broker.txn_batches import batch_bases, crash_copy, offsets_and_values, txn
from tests.broker.txn_batches import d  # noqa: F401 (a fixture)


# ------------------------------------------------------------------ reads

def test_read_committed_stops_at_the_last_stable_offset(d):
    with Partition(d) as p:
        p.append(plain(b"a"))  # 0
        p.append(txn(7, 0, 0, n=2), transactional_ok=True)  # 1-2
        p.append(plain(b"b", b"c"))  # 3-4
        lso = p.last_stable_offset
        assert lso == 1
        assert batch_bases(p.read(0, 1 << 20, max_offset=lso)) == [0]
        assert p.read(1, 1 << 20, max_offset=lso) == b"" and p.read(5, 1 << 20, max_offset=lso) == b""
        assert batch_bases(p.read(0, 1 << 20)) == [0, 1, 3]  # read_uncommitted: everything
        with pytest.raises(Exception) as ei:
            p.read(6, 100, max_offset=lso)
        assert getattr(ei.value, "code", None) == Errors.OFFSET_OUT_OF_RANGE
        p.write_marker(7, 0, True)
        lso = p.last_stable_offset
        assert lso == 6
        got = p.read(0, 1 << 20, max_offset=lso)
        assert batch_bases(got) == [0, 1, 3, 5]
        assert offsets_and_values(got)[:4] == [(0, b"a"), (1, b"t7-0"), (2, b"t7-1"), (3, b"b")]
        assert batch_bases(p.read(2, 1 << 20, max_offset=3)) == [1]  # the batch holding the offset
        assert batch_bases(p.read(0, 1, max_offset=lso)) == [0]  # max_bytes still applies


def _brute(entries: list[tuple[int, int, int]], start: int, end: int) -> list[tuple[int, int]]:
    if end <= start:
        return []  # an empty fetch overlaps nothing
    hits = [(first, pid) for pid, first, last in entries if last >= start and first < end]
    return [(pid, first) for first, pid in sorted(hits)]


def test_aborted_transactions_overlap_rules(d):
    with Partition(d) as p:
        p.append(txn(1, 0, 0), transactional_ok=True)  # 0
        p.append(txn(2, 0, 0), transactional_ok=True)  # 1
        p.append(plain(b"x"))  # 2
        p.write_marker(2, 0, False)  # 3: aborts (2, 1..3)
        p.append(txn(3, 0, 0), transactional_ok=True)  # 4
        p.write_marker(1, 0, False)  # 5: aborts (1, 0..5)
        p.write_marker(3, 0, True)  # 6: commit, not listed
        p.append(txn(2, 0, 1), transactional_ok=True)  # 7
        p.write_marker(2, 0, False)  # 8: aborts (2, 7..8)
        entries = [(2, 1, 3), (1, 0, 5), (2, 7, 8)]
        assert p.aborted_transactions(0, 9) == [(1, 0), (2, 1), (2, 7)]  # by first offset
        assert p.aborted_transactions(4, 7) == [(1, 0)]  # (2, 1) ended at 3, before the fetch
        assert p.aborted_transactions(3, 4) == [(1, 0), (2, 1)]  # its marker is at the fetch offset
        assert p.aborted_transactions(0, 1) == [(1, 0)]  # (2, 1) starts at the upper bound
        assert p.aborted_transactions(6, 7) == []
        assert p.aborted_transactions(6, 8) == [(2, 7)]
        assert p.aborted_transactions(9, 20) == [] and p.aborted_transactions(5, 5) == []
        for start in range(10):
            for end in range(start, 11):
                assert p.aborted_transactions(start, end) == _brute(entries, start, end), (start, end)


@pytest.mark.parametrize("seed", range(3))
def test_aborted_transactions_match_a_scan_of_every_abort(d, seed):
    """Random interleavings of transactions: the bounded lookup gives what a scan of every abort gives."""
    rng = random.Random(seed)
    entries = []
    seqs: dict[int, int] = {}
    with Partition(d) as p:
        for _ in range(400):
            pid = rng.randrange(1, 9)
            ongoing = p.ongoing_transactions()
            if pid in ongoing and rng.random() < 0.3:
                commit = rng.random() < 0.5
                off = p.write_marker(pid, 0, commit).base_offset
                if not commit:
                    entries.append((pid, ongoing[pid][1], off))
            elif rng.random() < 0.2:
                p.append(plain(b"p"))
            else:
                n = rng.randrange(1, 3)
                assert p.append(txn(pid, 0, seqs.get(pid, 0), n=n), transactional_ok=True).ok
                seqs[pid] = seqs.get(pid, 0) + n
        end = p.log_end_offset
        assert len(entries) > 20
        for _ in range(300):
            a, b = sorted(rng.randrange(0, end + 2) for _ in range(2))
            assert p.aborted_transactions(a, b) == _brute(entries, a, b), (a, b)
        lso = p.last_stable_offset
        for a in range(0, lso, 7):
            assert p.aborted_transactions(a, lso) == _brute(entries, a, lso)


def test_aborted_index_grows_truncates_and_inserts_in_order():
    ix = AbortedIndex()
    for k in range(100):
        assert ix.add(k, 10 * k, 10 * k + 5, 10 * k + 6)
    assert len(ix) == 100 and not ix.add(3, 30, 35, 36)  # held already
    assert ix.truncate_before(500) == 50 and len(ix) == 50
    assert ix.collect(0, 10_000)[0] == (50, 500)
    for k in range(100, 300):  # grows past what the truncation freed
        ix.add(k, 10 * k, 10 * k + 5, 10 * k + 6)
    assert len(ix) == 250 and list(ix.entries()["last"]) == sorted(ix.entries()["last"])
    assert ix.add(1000, 2001, 2002, 2003)  # a replay's out-of-order insert keeps marker order
    assert list(ix.entries()["last"]) == sorted(ix.entries()["last"])
    assert (1000, 2001) in ix.collect(2001, 2003)
    assert ix.truncate_before(10**9) == 251 and len(ix) == 0 and ix.collect(0, 10**9) == []


# ------------------------------------------------------------------ restart and crash

def _txn_history(p: Partition) -> None:
    p.append(txn(1, 0, 0), transactional_ok=True)  # 0
    p.append(txn(2, 0, 0), transactional_ok=True)  # 1
    p.append(idem(5, 0, 0))  # 2
    p.write_marker(1, 0, False)  # 3
    p.append(txn(3, 0, 0), transactional_ok=True)  # 4
    p.write_marker(3, 0, True)  # 5
    p.append(txn(3, 0, 1), transactional_ok=True)  # 6
    p.append(txn(4, 0, 0), transactional_ok=True)  # 7
    p.write_marker(4, 1, False)  # 8: bumps producer 4's epoch


def _state_of(p: Partition) -> tuple:
    return (p.ongoing_transactions(), p.aborted_transactions(0, p.log_end_offset + 1), p.last_stable_offset,
            {pid: (e.epoch, e.last_seq) for pid, e in p.producers().items()})


EXPECTED = ({2: (0, 1), 3: (0, 6)}, [(1, 0), (4, 7)], 1,
            {1: (0, 0), 2: (0, 0), 3: (0, 1), 4: (1, -1), 5: (0, 0)})


def test_transactions_survive_a_clean_restart_from_the_snapshot(d):
    with Partition(d) as p:
        _txn_history(p)
        assert _state_of(p) == EXPECTED
    with Partition(d) as q:
        assert q.state.recovery_stats["replayed_batches"] == 0
        assert _state_of(q) == EXPECTED
        assert q.append(txn(4, 0, 1), transactional_ok=True).error == Errors.INVALID_PRODUCER_EPOCH
        assert q.append(idem(2, 0, 1)).error == Errors.INVALID_TXN_STATE
        assert q.write_marker(2, 0, True).ok and q.last_stable_offset == 6


def test_transactions_survive_a_crash_from_the_log(d, tmp_path):
    p = Partition(d)
    _txn_history(p)
    crashed = crash_copy(p, tmp_path)
    assert list_snapshots(crashed) == []
    with Partition(crashed) as q:
        assert q.state.recovery_stats["replayed_batches"] == 9
        assert _state_of(q) == EXPECTED
    p.close()


def test_transactions_survive_a_crash_from_snapshot_and_log(d, tmp_path):
    p = Partition(d, snapshot_every=4, snapshot_executor=InlineExecutor())
    _txn_history(p)
    assert [o for o, _ in list_snapshots(d)] == [4, 8]
    p.append(txn(4, 1, 0), transactional_ok=True)  # 9, after the last snapshot
    p.write_marker(2, 0, False)  # 10
    crashed = crash_copy(p, tmp_path)
    with Partition(crashed) as q:
        assert q.state.recovery_stats == {"snapshot_offset": 8, "replayed_batches": 3, "producers": 5}
        assert _state_of(q) == _state_of(p)
        assert q.ongoing_transactions() == {3: (0, 6), 4: (1, 9)}
        assert q.aborted_transactions(0, 20) == [(1, 0), (2, 1), (4, 7)]
    p.close()


@pytest.mark.parametrize("seed", range(4))
def test_a_snapshot_copied_a_chunk_at_a_time_while_transactions_go_on(d, tmp_path, seed):
    """The snapshot is labelled with the log end at the copy's start and holds the transactions as of its
    finish; recovery replays from the label: nothing is doubled or lost."""
    rng = random.Random(seed)
    pids = list(range(1, 40))
    seqs = {pid: 0 for pid in pids}
    epochs = {pid: 0 for pid in pids}

    def step(p: Partition) -> None:
        pid = rng.choice(pids)
        ongoing = p.ongoing_transactions()
        if pid in ongoing and rng.random() < 0.35:
            bump = rng.random() < 0.2
            epoch = epochs[pid] + bump
            assert p.write_marker(pid, epoch, rng.random() < 0.5).ok
            if bump:
                epochs[pid], seqs[pid] = epoch, 0
        elif pid not in ongoing and rng.random() < 0.15:
            assert p.append(idem(pid, epochs[pid], seqs[pid])).ok
            seqs[pid] += 1
        else:
            assert p.append(txn(pid, epochs[pid], seqs[pid]), transactional_ok=True).ok
            seqs[pid] += 1

    p = Partition(d, snapshot_every=10**9)
    for _ in range(150):
        step(p)
    c = p.state.snapshot_begin(p.log_end_offset)
    while not p.state.snapshot_step(c, 1):
        for _ in range(rng.randrange(0, 4)):
            step(p)
    snap = p.state.snapshot_finish(c, p.log_end_offset)
    assert snap.end > snap.offset
    install_snapshot(p.log.directory, snap)
    for _ in range(rng.randrange(0, 30)):
        step(p)
    crashed = crash_copy(p, tmp_path)
    with Partition(crashed) as q:
        assert q.state.recovery_stats["snapshot_offset"] == snap.offset
        assert _state_of(q) == _state_of(p)
    p.close()


def test_format_2_snapshots_still_load_with_no_transactions(d):
    with Partition(d) as p:
        p.append(idem(1, 0, 0))
        p.append(idem(1, 0, 1))
    (offset, path), = list_snapshots(d)
    obj = msgpack.unpackb(open(path, "rb").read()[12:-4], raw=False)
    for k in ("ongoing", "aborted", "aborted_row", "aborted_count"):
        del obj[k]
    obj["format"] = 2
    _forge(path, obj)
    assert read_snapshot(path)[1][1].last_seq == 1
    with Partition(d) as q:
        assert q.state.recovery_stats["replayed_batches"] == 0
        assert q.append(idem(1, 0, 1)).duplicate
        assert q.ongoing_transactions() == {} and q.last_stable_offset == 2
        assert q.append(txn(1, 0, 2), transactional_ok=True).ok and q.last_stable_offset == 2
    with Partition(d) as q:  # written as format 3 on close
        assert q.ongoing_transactions() == {1: (0, 2)}


@pytest.mark.parametrize("change", ["ongoing-past-end", "ongoing-unsorted", "ongoing-twice", "aborted-past-end",
                                    "aborted-unsorted", "aborted-first-after-last", "aborted-count",
                                    "aborted-layout", "ongoing-not-list", "marker-row-past-end"])
def test_a_snapshot_with_transactions_out_of_range_is_refused(tmp_path, change):
    m = ProducerStateManager()
    path = str(tmp_path / "s.snapshot")
    m.update(parse_header(txn(1, 0, 0)), 0, TS)
    m.update(parse_header(txn(2, 0, 0)), 1, TS)
    m.end_transaction(1, 0, False, 2, TS)
    m.update(parse_header(txn(3, 0, 0)), 3, TS)
    m.end_transaction(3, 1, False, 4, TS)  # a marker row for producer 3
    m.update(parse_header(txn(4, 0, 0)), 5, TS)
    m.write_snapshot(path, 6)
    obj = msgpack.unpackb(open(path, "rb").read()[12:-4], raw=False)
    assert obj["format"] == 3 and obj["ongoing"] == [[2, 0, 1], [4, 0, 5]] and obj["aborted_count"] == 2
    aborted = np.frombuffer(obj["aborted"], ABORTED).copy()
    if change == "ongoing-past-end":
        obj["ongoing"][1][2] = 6
    elif change == "ongoing-unsorted":
        obj["ongoing"].reverse()
    elif change == "ongoing-twice":
        obj["ongoing"][1][0] = 2
    elif change == "aborted-past-end":
        aborted["last"][1] = 6
    elif change == "aborted-unsorted":
        aborted = aborted[::-1].copy()
    elif change == "aborted-first-after-last":
        aborted["first"][0] = 2
    elif change == "aborted-count":
        obj["aborted_count"] = 3
    elif change == "aborted-layout":
        obj["aborted_row"] = "[('last', '<i8')]"
    elif change == "ongoing-not-list":
        obj["ongoing"] = {"2": 1}
    else:
        obj["end"] = obj["offset"] = 4  # producer 3's marker row (offset 4) and others lie past it
        obj["ongoing"], obj["aborted_count"], aborted = [], 0, aborted[:0]
    obj["aborted"] = aborted.tobytes()
    _forge(path, obj)
    with pytest.raises(CorruptFileError):
        read_snapshot(path)


def test_a_log_that_lost_a_marker_the_snapshot_holds_is_refused(d):
    with Partition(d) as p:
        p.append(txn(1, 0, 0), transactional_ok=True)
        p.append(txn(2, 0, 0), transactional_ok=True)
        p.write_marker(1, 0, False)
    seg = os.path.join(d, "00000000000000000000.log")
    with open(seg, "r+b") as f:  # the log loses its last batch (the marker); the snapshot holds it
        f.truncate(2 * len(txn(1, 0, 0)))
    with pytest.raises(CorruptFileError) as ei:
        Partition(d)
    assert "missing" in str(ei.value)


def test_a_snapshot_file_round_trips_the_transactions(tmp_path):
    m = ProducerStateManager()
    m.update(parse_header(txn(1, 0, 0)), 0, TS)
    m.update(parse_header(txn(2, 0, 0)), 1, TS)
    m.end_transaction(1, 0, False, 2, TS)
    path = snapshot_path(str(tmp_path), 3)
    m.write_snapshot(path, 3)
    r = ProducerStateManager()
    assert r.load_snapshot(path) == 3
    assert r.ongoing() == {2: (0, 1)} and r.aborted_transactions(0, 3) == [(1, 0)]
    assert r.first_unstable_offset() == 1


# ------------------------------------------------------------------ bounds

def test_expiry_keeps_a_producer_with_an_ongoing_transaction(d):
    clock = Clock()
    with Partition(d, clock_ms=clock, producer_id_expiration_ms=DAY) as p:
        p.append(txn(1, 0, 0), transactional_ok=True)
        p.append(idem(2, 0, 0))
        clock.t += 2 * DAY
        p.maintain()
        assert sorted(p.producers()) == [1] and p.ongoing_transactions() == {1: (0, 0)}
        p.write_marker(1, 0, True)
        clock.t += 2 * DAY
        p.maintain()
        assert p.producers() == {}
    with Partition(d, clock_ms=clock, producer_id_expiration_ms=DAY) as p:
        p.append(txn(3, 0, 0), transactional_ok=True)
    clock.t += 2 * DAY
    with Partition(d, clock_ms=clock, producer_id_expiration_ms=DAY) as p:  # the expiry at open too
        assert sorted(p.producers()) == [3]


def test_the_producer_cap_does_not_evict_a_producer_with_an_ongoing_transaction(d):
    clock = Clock()
    with Partition(d, clock_ms=clock, max_producers=100) as p:
        p.append(txn(1, 0, 0), transactional_ok=True)  # the least recently used of all
        for pid in range(2, 400):
            clock.t += 1
            assert p.append(idem(pid, 0, 0)).ok
        assert p.producer_stats()["evictions"] == 299 and len(p.producers()) == 100
        assert 1 in p.producers() and p.ongoing_transactions() == {1: (0, 0)}
        assert p.append(idem(1, 0, 1)).error == Errors.INVALID_TXN_STATE  # its state is all there
        assert p.append(txn(1, 0, 1), transactional_ok=True).ok


def test_retention_drops_aborted_transactions_below_the_log_start(d):
    one = len(txn(1, 0, 0))
    with Partition(d, segment_bytes=3 * one) as p:
        for k in range(6):
            p.append(txn(1, 0, k), transactional_ok=True)
            p.write_marker(1, 0, False)
        assert len(p.aborted_transactions(0, 100)) == 6
        p.delete_records_before(6)
        assert p.aborted_transactions(0, 100) == [(1, 6), (1, 8), (1, 10)]
        assert p.producer_stats()["aborted_transactions"] == 3
        p.append(txn(1, 0, 6), transactional_ok=True)
    with Partition(d, segment_bytes=3 * one) as q:
        assert q.aborted_transactions(0, 100) == [(1, 6), (1, 8), (1, 10)]
        assert q.ongoing_transactions() == {1: (0, 12)}


def test_the_last_stable_offset_is_not_below_the_log_start(d):
    with Partition(d) as p:
        p.append(txn(1, 0, 0), transactional_ok=True)
        p.append(plain(b"a", b"b"))
        p.delete_records_before(2)
        assert p.last_stable_offset == 2  # as Kafka: the transaction stays open, its start is gone
        assert p.read(2, 100, max_offset=p.last_stable_offset) == b""
