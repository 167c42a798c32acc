"""quorum.migration.zk's LegacyAllocator, Kafka's ZooKeeper-mode allocation loop, against a real ZooKeeper:
sequential and concurrent allocation, unknown outcomes (a lost request or answer), server crashes."""
from __future__ import annotations

import threading
import time

import pytest

from quorum.migration.zk import (
    LONG_MAX, ZK_BLOCK_PATH, LegacyAllocator, ZkBlockError, ZkBlockMissing, ZkBlocksExhausted, connect,
    parse_block, read_block,
)
from tests.migration.zk_blocks import REFERENCE, assert_contiguous, doc, kafka_json, run_threads, set_block


# ------------------------------------------------------------------ legacy allocation
def test_legacy_allocator_sequential_blocks_contiguous(zk_client):
    alloc = LegacyAllocator(zk_client, broker_id=7)
    blocks = [alloc.allocate() for _ in range(5)]
    assert blocks == [(0, 1000), (1000, 1000), (2000, 1000), (3000, 1000), (4000, 1000)]
    data, stat = zk_client.get(ZK_BLOCK_PATH)
    assert data == kafka_json(7, 4000, 4999) and stat.version == 4
    assert (alloc.writes, alloc.retries, alloc.unknown_outcomes, alloc.allocated) == (5, 0, 0, 5)


def test_legacy_allocator_continues_after_existing_and_empty(zk_client):
    zk_client.create(ZK_BLOCK_PATH, b"")  # Kafka creates the node without data at first
    assert LegacyAllocator(zk_client, broker_id=1).allocate() == (0, 1000)
    zk_client.set(ZK_BLOCK_PATH, REFERENCE)
    alloc = LegacyAllocator(zk_client, broker_id=2, block_size=10)
    assert alloc.allocate() == (5000, 10)
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(2, 5000, 5009)


def test_legacy_allocator_exhaustion(zk_client):
    set_block(zk_client, kafka_json(3, LONG_MAX - 1999, LONG_MAX - 1000))
    alloc = LegacyAllocator(zk_client, broker_id=1)
    assert alloc.allocate() == (LONG_MAX - 999, 1000)  # the last block ends exactly at Long.MAX
    version = zk_client.get(ZK_BLOCK_PATH)[1].version
    with pytest.raises(ZkBlocksExhausted, match="exhausted"):
        alloc.allocate()
    assert zk_client.get(ZK_BLOCK_PATH)[1].version == version  # nothing written


def test_legacy_allocator_refuses_malformed_znode_and_writes_nothing(zk_client):
    zk_client.create(ZK_BLOCK_PATH, doc(version=2))
    with pytest.raises(ZkBlockError) as info:
        LegacyAllocator(zk_client, broker_id=1).allocate()
    assert info.value.field == "version"
    assert zk_client.get(ZK_BLOCK_PATH)[1].version == 0


def test_legacy_allocator_missing_chroot_is_an_error_not_a_loop(zookeeper):
    zk = connect(f"{zookeeper.hosts}/no-such-chroot-{time.monotonic_ns()}", timeout=10)
    try:
        began = time.monotonic()
        with pytest.raises(ZkBlockMissing):
            LegacyAllocator(zk, broker_id=1, timeout=20).allocate()
        assert time.monotonic() - began < 5
    finally:
        zk.stop(); zk.close()


def test_four_concurrent_allocators_disjoint_and_contiguous(zk_chroot):
    clients = [connect(zk_chroot, timeout=10) for _ in range(4)]
    allocators = [LegacyAllocator(zk, broker_id=i + 1) for i, zk in enumerate(clients)]
    results: dict[int, list[tuple[int, int]]] = {}
    errors = []
    barrier = threading.Barrier(4)

    def run(a: LegacyAllocator):
        try:
            barrier.wait()
            results[a.broker_id] = [a.allocate() for _ in range(50)]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(a,)) for a in allocators]
    try:
        run_threads(threads, errors)
        blocks = [b for bs in results.values() for b in bs]
        assert len(blocks) == 200 and all(len(bs) == 50 for bs in results.values())
        assert_contiguous(blocks)
        retries = sum(a.retries for a in allocators)
        assert sum(a.writes for a in allocators) == 200 + retries  # every lost race cost one write
        print(f"4x50 blocks, {retries} lost races retried")
        data, _ = clients[0].get(ZK_BLOCK_PATH)
        assert parse_block(data, "znode").block_end == 200 * 1000 - 1
    finally:
        for zk in clients:
            zk.stop(); zk.close()


# ------------------------------------------------------------------ unknown outcomes
@pytest.mark.parametrize("forward", [True, False], ids=["write-applied-answer-lost", "write-lost"])
def test_unknown_outcome_is_reread_never_assumed(zk_client, lossy, forward):
    proxy, zk = lossy
    alloc = LegacyAllocator(zk, broker_id=5, timeout=30)
    assert alloc.allocate() == (0, 1000)
    proxy.arm(b"block_start", forward=forward)
    assert alloc.allocate() == (1000, 1000)  # exactly once, whatever happened to the write
    assert proxy.cut.is_set()
    assert alloc.unknown_outcomes == 1
    # Applied: re-read finds our bytes at our version + 1 and claims them (no second write).
    # Lost: re-read finds the znode unchanged and writes the same block again.
    assert alloc.writes == (2 if forward else 3)
    data, stat = zk_client.get(ZK_BLOCK_PATH)
    assert data == kafka_json(5, 1000, 1999) and stat.version == 1
    assert alloc.allocate() == (2000, 1000)  # the next one follows: no block lost or doubled


@pytest.mark.parametrize("forward", [True, False], ids=["write-applied-answer-lost", "write-lost"])
def test_unknown_outcome_with_another_writer_in_between(zk_client, lossy, forward):
    """While our client is cut off after an unknown-outcome write, another broker allocates.

    If our write was lost, the other broker gets the very range we tried to write: assuming
    success would issue it twice. If it was applied, the other broker builds on it and our
    block is skipped (wasted, never issued). Either way: no overlap.
    """
    proxy, zk = lossy
    ours = LegacyAllocator(zk, broker_id=5, timeout=30)
    other = LegacyAllocator(zk_client, broker_id=6)
    got = [ours.allocate()]
    proxy.arm(b"block_start", forward=forward, hold=True)
    result: list = []
    t = threading.Thread(target=lambda: result.append(ours.allocate()))
    t.start()
    try:
        assert proxy.cut.wait(10)
        theirs = other.allocate()
    finally:
        proxy.release()
    t.join(30)
    assert not t.is_alive() and len(result) == 1
    got.append(result[0])
    assert ours.unknown_outcomes == 1
    if forward:
        assert theirs == (2000, 1000)  # ours landed at 1000 first
        assert got == [(0, 1000), (3000, 1000)]  # [1000, 1999] was written but never returned: wasted
    else:
        assert theirs == (1000, 1000)  # the range our lost write named
        assert got == [(0, 1000), (2000, 1000)]
    everything = got + [theirs]
    for i, (s1, l1) in enumerate(everything):
        for s2, l2 in everything[i + 1:]:
            assert s1 + l1 <= s2 or s2 + l2 <= s1, f"overlap: {everything}"


def test_allocation_across_zookeeper_crashes(zookeeper, zk_chroot):
    """The ZooKeeper server is SIGKILLed right after the allocator sends a write (twice), then
    restarted on the same port and data: the write may have been applied or not, answered or
    not. Every block is returned once and the sequence stays contiguous."""
    zk = connect(zk_chroot, timeout=10)
    alloc = LegacyAllocator(zk, broker_id=9, timeout=60, op_timeout=3)
    writing = threading.Event()
    real_set_async = zk.set_async

    def set_async(*args, **kwargs):
        result = real_set_async(*args, **kwargs)
        writing.set()  # the request is on its way: the main thread kills the server now
        return result

    zk.set_async = set_async
    blocks: list[tuple[int, int]] = []
    errors = []
    stop = threading.Event()

    def run():
        try:
            while not stop.is_set():
                blocks.append(alloc.allocate())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def progress(n: int, within: float = 30.0) -> bool:
        target, deadline = len(blocks) + n, time.monotonic() + within
        while len(blocks) < target and time.monotonic() < deadline and not errors:
            time.sleep(0.02)
        return len(blocks) >= target

    t = threading.Thread(target=run)
    t.start()
    try:
        assert progress(5)
        for _ in range(2):
            writing.clear()
            assert writing.wait(10)
            zookeeper.stop(kill=True)
            time.sleep(0.5)
            zookeeper.start()
            assert progress(10), "no progress after the restart"
    finally:
        zookeeper.ensure_running()
        stop.set()
        t.join(60)
    try:
        assert not errors, errors
        assert_contiguous(blocks)
        # A single writer: every applied write was returned, none skipped.
        block, _ = read_block(zk)
        assert block.block_end == max(s + n for s, n in blocks) - 1
        print(f"{len(blocks)} blocks across 2 crashes; writes {alloc.writes}, "
              f"unknown outcomes {alloc.unknown_outcomes}, retries {alloc.retries}")
    finally:
        zk.stop(); zk.close()
