"""A node's audit trail a page at a time (quorum.trail.read_block_page, what BlockHistoryRequest answers) and
several nodes' histories merged (merge_histories): no Raft, no network."""
from __future__ import annotations

import os

import pytest

from quorum.trail import AuditWriter, iter_blocks, merge_histories, read_block_page
from snapshots.storage.disk import CorruptFileError

from .file_damage import flip
from .test_trail import alloc, frame_offsets, ok, reg, refused


def write_trail(path: str, gap_at: int | None = None) -> AuditWriter:
    """Raft entries 1..40: a registration, then one or two blocks an entry (broker 1 or 2), a refused
    block, other records between; with ``gap_at``, a snapshot installed there instead of entries 15..gap_at."""
    w = AuditWriter(path)
    start = 0
    for index in range(1, 41):
        if index == 1:
            outcomes = [ok(reg(1)), ok(reg(2, 2))]
        elif index % 7 == 0:
            outcomes = [refused(alloc(start)), ok(reg(3, index))]
        elif index % 5 == 0:
            outcomes = [ok(alloc(start, broker_id=1)), ok(alloc(start + 100, broker_id=2, epoch=2))]
            start += 200
        else:
            outcomes = [ok(alloc(start, broker_id=1 + index % 2, epoch=1 + index % 2))]
            start += 100
        if gap_at is not None and 15 <= index <= gap_at:
            if index == gap_at:
                w.gap(index)  # the node had none of 15..gap_at: the snapshot holds their state
            continue
        w.append(index, 2, outcomes)
    w.sync()
    return w


LAST = 40  # the trails' last Raft index


def pages(path: str, limit: int, broker_id: int | None = None, max_bytes: int = 1 << 20, hint=None):
    w_last, end = LAST, os.path.getsize(path)
    out, cursor = [], (-1, -1, -1)
    while True:
        offset = cursor[2] if hint is None else hint(cursor)
        page = read_block_page(path, end, w_last, cursor[:2], offset, limit, broker_id, max_bytes)
        out.append(page)
        assert page.cursor >= cursor  # every page moves on
        assert len(page.blocks) <= limit
        cursor = page.cursor
        if not page.more:
            return out
        assert len(out) < 1000


def blocks_of(ps) -> list[dict]:
    return [b for p in ps for b in p.blocks]


def test_pages_give_the_blocks_iter_blocks_reads(tmp_path):
    path = str(tmp_path / "audit.log")
    write_trail(path)
    whole = list(iter_blocks([path]))
    assert len(whole) > 30
    assert blocks_of(pages(path, 10_000)) == whole
    ps = pages(path, 3)
    assert len(ps) >= len(whole) // 3 and all(len(p.blocks) == 3 for p in ps[:-1])
    assert blocks_of(ps) == whole
    assert blocks_of(pages(path, 4, broker_id=2)) == [b for b in whole if b["broker_id"] == 2]
    assert blocks_of(pages(path, 4, broker_id=9)) == []


def test_a_page_reads_a_bounded_part_of_the_trail(tmp_path):
    path = str(tmp_path / "audit.log")
    write_trail(path)
    ps = pages(path, 1000, max_bytes=300)  # a few lines a page, however many blocks were asked for
    assert len(ps) > 10
    assert blocks_of(ps) == list(iter_blocks([path]))


def test_a_wrong_or_missing_cursor_offset_is_found_again(tmp_path):
    """The offset is a hint: another node's, a stale one, or none, and the page still starts after the cursor."""
    path = str(tmp_path / "audit.log")
    write_trail(path)
    whole = list(iter_blocks([path]))
    offsets = frame_offsets(path)
    for hint in (lambda c: -1, lambda c: 3, lambda c: 10**9, lambda c: offsets[-1], lambda c: offsets[2]):
        assert blocks_of(pages(path, 5, hint=hint)) == whole
    last, end = LAST, os.path.getsize(path)
    after = (whole[10]["raft_index"], 0)
    page = read_block_page(path, end, last, after, -1, 2)
    assert page.blocks == whole[11:13]


def test_only_what_was_written_up_to_the_last_index_is_read(tmp_path):
    path = str(tmp_path / "audit.log")
    w = write_trail(path)
    last, end = w.extent()
    assert (last, end) == (LAST, os.path.getsize(path))
    page = read_block_page(path, end, 20, limit=10_000)
    assert page.blocks == [b for b in iter_blocks([path]) if b["raft_index"] <= 20] and not page.more
    offsets = frame_offsets(path)
    cut = read_block_page(path, offsets[-1] + 5, last, limit=10_000)  # a line being written: not read
    assert cut.blocks == list(iter_blocks([path]))[:-1] and not cut.more


def test_gaps_are_reported_and_merged_histories_say_what_no_trail_holds(tmp_path):
    full, gapped = str(tmp_path / "n1.log"), str(tmp_path / "n2.log")
    write_trail(full)
    write_trail(gapped, gap_at=22)
    gp = pages(gapped, 4)
    assert [g for p in gp for g in p.gaps] == [[14, 22]]
    fp = pages(full, 4)
    assert [g for p in fp for g in p.gaps] == []
    whole = list(iter_blocks([full, gapped]))
    blocks, missing = merge_histories([(blocks_of(fp), [], fp[-1].cursor[0]), (blocks_of(gp), [(14, 22)], 40)])
    assert blocks == whole and missing == []
    blocks, missing = merge_histories([(blocks_of(gp), [(14, 22)], 40)])
    assert blocks == list(iter_blocks([gapped])) and missing == [(14, 22)]
    # a node behind the others: what only it lacks is held by another
    assert merge_histories([(blocks_of(gp), [(14, 22)], 40), (blocks_of(fp)[:5], [], 25)])[1] == []
    assert merge_histories([(blocks_of(gp), [(14, 22)], 40), (blocks_of(fp), [], 20)])[1] == [(20, 22)]
    assert merge_histories([]) == ([], [])


def test_a_damaged_line_is_an_error_not_a_short_history(tmp_path):
    path = str(tmp_path / "audit.log")
    write_trail(path)
    offsets = frame_offsets(path)
    flip(path, offsets[5] + 12, 0x01)
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        read_block_page(path, os.path.getsize(path), LAST, limit=10_000)
