"""broker.producer_state's arrays against a plain model: random appends, expiry and snapshots must leave
both in the same state."""
from __future__ import annotations

import os
import random

import msgpack
import numpy as np
import pytest

from broker.log import PartitionLog, segment_name
from broker.producer_state import (
    MAX_CACHED_BATCHES,
    ROW,
    Action,
    BatchMetadata,
    ProducerEntry,
    ProducerStateManager,
    _bits_for,
    install_snapshot,
    read_snapshot,
)
from broker.recordbatch import BatchHeader, increment_sequence
from snapshots.storage.disk import CorruptFileError
from records.wire.errors import Errors
from tests.broker.producer_batches import DAY, NOW, _append, _forge, hdr, raw


# ------------------------------------------------------------------ the arrays against a plain model

WINDOW = 10_000


class Model:
    """The state as plain objects: what the arrays must hold (last batch always, older ones in the window)."""

    def __init__(self):
        self.entries: dict[int, ProducerEntry] = {}

    def update(self, h: BatchHeader, first: int, now: int) -> None:
        e = self.entries.get(h.producer_id)
        b = BatchMetadata(h.base_sequence, h.last_sequence, first, first + h.last_offset_delta, h.max_timestamp)
        if e is not None and e.epoch == h.producer_epoch and e.batches and now - e.last_update_ms < WINDOW:
            batches = (e.batches + [b])[-MAX_CACHED_BATCHES:]
        else:
            batches = [b]
        self.entries[h.producer_id] = ProducerEntry(h.producer_id, h.producer_epoch, batches, now)
        for o in self.entries.values():
            if now - o.last_update_ms >= WINDOW:
                del o.batches[:-1]

    def expire(self, now: int, ttl: int) -> int:
        gone = [p for p, e in self.entries.items() if now - e.last_update_ms >= ttl]
        for p in gone:
            del self.entries[p]
        return len(gone)

    def evict(self, n: int) -> list[tuple[int, int]]:
        oldest = sorted(self.entries.values(), key=lambda e: e.last_update_ms)[:n]
        for e in oldest:
            del self.entries[e.producer_id]
        return [(e.producer_id, e.epoch) for e in oldest]


@pytest.mark.parametrize("seed", range(6))
def test_the_arrays_hold_what_a_plain_model_holds(tmp_path, seed):
    rng = random.Random(seed)
    cap = rng.choice([None, 300])
    m = ProducerStateManager(retry_window_ms=WINDOW, max_producers=cap)
    model = Model()
    # ids in runs (as blocks are handed out), plus a few anywhere, so that probes collide and wrap
    ids = [rng.randrange(2**40) for _ in range(40)] + list(range(5000, 5000 + rng.randrange(200, 1500)))
    now, offset, evicted = NOW, 0, set()
    for step in range(6000):
        now += rng.randrange(1, 40)
        op = rng.random()
        if op < 0.9:
            pid = rng.choice(ids)
            e = model.entries.get(pid)
            epoch = e.epoch if e is not None and rng.random() < 0.9 else rng.randrange(0, 5)
            seq = increment_sequence(e.last_seq, 1) if e is not None and epoch == e.epoch else 0
            h = hdr(pid, epoch, seq, n=rng.randrange(1, 4))
            if e is not None and epoch < e.epoch:
                continue
            if cap is not None and e is None and len(model.entries) >= cap:
                evicted.update(model.evict(max(1, cap // 100)))
            m.update(h, offset, now)
            model.update(h, offset, now)
            offset += h.records_count
        elif op < 0.95:
            assert m.expire(now, 3_000) == model.expire(now, 3_000)
        elif op < 0.97:
            path = str(tmp_path / f"{step}.snapshot")
            m.write_snapshot(path, offset)
            m = ProducerStateManager(retry_window_ms=WINDOW, max_producers=cap)
            assert m.load_snapshot(path) == offset
        else:
            pid = rng.choice(ids)
            assert m.get(pid) == model.entries.get(pid)
        assert len(m) == len(model.entries)
    assert m.producers() == model.entries
    for pid, epoch in evicted:
        if pid not in model.entries:
            assert m.check(hdr(pid, epoch, 7)).error == Errors.UNKNOWN_PRODUCER_ID
            assert m.check(hdr(pid, epoch, 0)).error == Errors.UNKNOWN_PRODUCER_ID
            assert m.check(hdr(pid, epoch + 1, 0)).action is Action.APPEND


def test_evicted_producer_is_told_its_state_is_gone_and_may_start_again(tmp_path):
    m = ProducerStateManager(max_producers=100)
    for pid in range(100):
        m.update(hdr(pid, 0, 0), pid, NOW + pid)
    m.update(hdr(1000, 0, 0), 100, NOW + 500)  # one over the cap: the least recently used goes
    assert len(m) == 100 and m.get(0) is None and m.get(1) is not None
    d = m.check(hdr(0, 0, 1))
    assert d.error == Errors.UNKNOWN_PRODUCER_ID and "evicted" in d.message
    assert m.check(hdr(0, 0, 0)).error == Errors.UNKNOWN_PRODUCER_ID  # a retry of its first batch, too
    assert m.check(hdr(0, 1, 0)).action is Action.APPEND  # a bumped epoch is a new instance (KIP-360)
    assert m.check(hdr(5000, 0, 3)).action is Action.APPEND  # never seen: accepted at any sequence
    # the evicted ids outlive a restart
    path = str(tmp_path / "s.snapshot")
    m.write_snapshot(path, 101)
    r = ProducerStateManager(max_producers=100)
    r.load_snapshot(path)
    assert r.check(hdr(0, 0, 1)).error == Errors.UNKNOWN_PRODUCER_ID


def test_older_batches_are_dropped_once_no_retry_can_arrive():
    m = ProducerStateManager(retry_window_ms=WINDOW)
    for seq in range(5):
        m.update(hdr(1, 0, seq), seq, NOW + seq)
    assert len(m.get(1).batches) == 5 and m.check(hdr(1, 0, 0)).action is Action.DUPLICATE
    m.update(hdr(2, 0, 0), 5, NOW + 4 + WINDOW)  # any later append trims producers idle for the window
    assert [b.first_seq for b in m.get(1).batches] == [4]
    assert m.check(hdr(1, 0, 4)).action is Action.DUPLICATE  # the last batch is always kept
    assert m.check(hdr(1, 0, 0)).error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert m.stats()["producers_with_older_batches"] == 0


def test_expiry_that_is_not_due_costs_nothing_and_chunks_cover_every_row():
    m = ProducerStateManager()
    for pid in range(5000):
        m.update(hdr(pid, 0, 0), pid, NOW + (pid % 2) * DAY)
    assert not m.due_for_expiry(NOW + DAY - 1, DAY)
    assert m.expire(NOW + DAY - 1, DAY) == 0
    assert m.due_for_expiry(NOW + DAY, DAY)
    gone = sum(m.expire(NOW + DAY, DAY, start, start + 700) for start in range(0, m.row_count, 700))
    assert gone == 2500 and len(m) == 2500 and all(pid % 2 for pid in m.producers())
    assert not m.due_for_expiry(NOW + DAY, DAY)  # the pass's last chunk refreshed the oldest update time


def test_format_1_snapshots_are_still_read(tmp_path):
    path = str(tmp_path / "old.snapshot")
    _forge(path, {"format": 1, "offset": 9, "producers": [
        [7, 2, NOW, [[0, 0, 1, 1, 5], [1, 2, 2, 3, 6]]], [3, 0, NOW, []]]})
    offset, producers = read_snapshot(path)
    assert offset == 9 and sorted(producers) == [3, 7]
    assert [b.first_seq for b in producers[7].batches] == [0, 1] and producers[3].batches == []


def test_a_state_of_many_producers_is_a_few_dozen_bytes_each():
    m = ProducerStateManager()
    for pid in range(20_000):
        m.update(hdr(pid * 13, 0, 0), pid, NOW)
    assert m.memory_bytes() / len(m) < 120


def test_rows_whose_probes_run_past_the_end_of_the_table_wrap_to_its_start(tmp_path):
    """Producer ids that all hash to the last slots of the table: a load places them by wrapping."""
    bits = _bits_for(60)  # the table 60 producers get
    crowd = [pid for pid in range(200_000) if ((pid * 0x9E3779B97F4A7C15) % 2**64) >> (64 - bits) >= 2**bits - 2]
    crowd = crowd[:60]
    m = ProducerStateManager()
    for k, pid in enumerate(crowd):
        m.update(hdr(pid, 0, 0), k, NOW)
    path = str(tmp_path / "s.snapshot")
    m.write_snapshot(path, len(crowd))
    r = ProducerStateManager()
    r.load_snapshot(path)
    for k, pid in enumerate(crowd):
        assert r.get(pid).last_offset == k
    assert r.get(crowd[-1] + 1) is None


@pytest.mark.parametrize("change", ["older-without-row", "duplicate-row", "unsorted", "bad-layout", "short-rows"])
def test_well_checksummed_but_invalid_format_2_snapshot_is_refused(tmp_path, change):
    m = ProducerStateManager()
    for pid in (3, 9, 20):
        for seq in range(3):
            m.update(hdr(pid, 0, seq), pid * 10 + seq, NOW)
    path = str(tmp_path / "s.snapshot")
    m.write_snapshot(path, 1000)
    obj = msgpack.unpackb(open(path, "rb").read()[12:-4], raw=False)
    rows = np.frombuffer(obj["rows"], ROW).copy()
    if change == "older-without-row":
        obj["older"].append([5, [[0, 0, 1, 1, 0]]])
    elif change == "duplicate-row":
        rows[1] = rows[0]
    elif change == "unsorted":
        rows = rows[::-1].copy()
    elif change == "bad-layout":
        obj["row"] = "[('pid', '<i8')]"
    else:
        obj["count"] += 1
    obj["rows"] = rows.tobytes()
    _forge(path, obj)
    with pytest.raises(CorruptFileError):
        read_snapshot(path)


@pytest.mark.parametrize("seed", range(4))
def test_a_snapshot_copied_a_chunk_at_a_time_while_appends_go_on_recovers_the_state(tmp_path, seed):
    """Rows copied at different moments, producers appended, expired, evicted and the table rebuilt in
    between: loading the snapshot and replaying the log from the offset the copy started at gives the
    state at the log end (the last batch of every producer exactly; older batches all real ones)."""
    rng = random.Random(seed)
    m = ProducerStateManager(retry_window_ms=WINDOW, max_producers=rng.choice([None, 700]))
    log_: list[tuple[BatchHeader, int]] = []  # every batch appended, with its offset
    ids = list(range(1, 300)) + [rng.randrange(2**40) for _ in range(30)]
    now, offset = NOW, 0

    def append_some(k: int) -> None:
        nonlocal now, offset
        for _ in range(k):
            now += 1
            pid = rng.choice(ids)
            e = m.get(pid)
            if e is not None and rng.random() < 0.9:
                h = hdr(pid, e.epoch, increment_sequence(e.last_seq, 1))
            else:
                h = hdr(pid, (e.epoch + 1) if e is not None else 0, 0)
            m.update(h, offset, now)
            log_.append((h, offset))
            offset += 1

    append_some(800)
    m.expire(now, 300)  # holes: a rebuild now moves rows
    ids += list(range(1000, 1600))  # new producers while the copy goes on: the table grows (rows renumbered)
    c = m.snapshot_begin(offset)
    while not m.snapshot_step(c, rng.randrange(1, 30)):
        append_some(rng.randrange(0, 30))
        if rng.random() < 0.05:
            m.expire(now, rng.randrange(50, 400))
    snap = m.snapshot_finish(c, offset)
    assert c.restarts >= 1
    append_some(50)
    path = str(tmp_path / "s.snapshot")
    snap.write(path)
    r = ProducerStateManager(retry_window_ms=WINDOW)
    r.load_snapshot(path)
    for h, off in log_:
        if off >= snap.offset:
            r.replay(h, off, now)
    live, back = m.producers(), r.producers()
    for pid, e in live.items():
        got = back.get(pid)
        assert got is not None, pid
        assert (got.epoch, got.batches[-1]) == (e.epoch, e.batches[-1]), pid
        real = {(h.base_sequence, off) for h, o in log_ if h.producer_id == pid for off in [o]}
        assert {(b.first_seq, b.first_offset) for b in got.batches} <= real
    # producers expired or evicted meanwhile may come back from the snapshot; nobody else does
    assert set(back) - set(live) <= {h.producer_id for h, _ in log_}


def test_an_expiry_pass_in_chunks_keeps_the_oldest_update_exact_through_inserts_and_rebuilds():
    rng = random.Random(7)
    m = ProducerStateManager()
    for pid in range(3000):
        m.update(hdr(pid, 0, 0), pid, NOW + rng.randrange(0, DAY))
    m.expire(NOW + DAY // 2, DAY // 4)  # holes
    start, new = 0, 10_000
    while start < m.row_count:
        m.expire(NOW + DAY, DAY // 2, start, start + 200)
        start += 200
        if start <= 1000:  # new producers between the first chunks: the table grows, rows are renumbered
            for _ in range(1500):
                m.update(hdr(new, 0, 0), new, NOW + DAY + rng.randrange(0, 1000))
                new += 1
    m.compact()
    oldest = min(e.last_update_ms for e in m.producers().values())
    assert m.due_for_expiry(oldest + DAY // 2, DAY // 2)
    assert not m.due_for_expiry(oldest + DAY // 2 - 1, DAY // 2)


def test_snapshot_holding_batches_beyond_the_log_end_is_refused(tmp_path):
    """A snapshot copied while appends went on holds batches up to the log end at its finish: a log that
    ends before that lost acknowledged batches."""
    d = str(tmp_path / "p")
    with PartitionLog(d) as lg:
        m = ProducerStateManager()
        for seq in range(3):
            _append(lg, m, raw(1, 0, seq))
        c = m.snapshot_begin(1)  # the copy starts when the log ends at 1 and finishes at 3
        while not m.snapshot_step(c, 1):
            pass
        install_snapshot(d, m.snapshot_finish(c, lg.log_end_offset))
    with PartitionLog(d) as lg:
        assert ProducerStateManager.recover(d, lg, NOW).get(1).last_seq == 2
    with open(os.path.join(d, segment_name(0)), "r+b") as f:  # the log loses its last batch
        f.truncate(2 * len(raw(1, 0, 0)))
    with PartitionLog(d) as lg:
        with pytest.raises(CorruptFileError) as ei:
            ProducerStateManager.recover(d, lg, NOW)
    assert "missing" in str(ei.value)
