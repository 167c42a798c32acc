"""quorum.migration.zk's rollback placeholder (write_placeholder) and bridge-mode reservation (reserve_block)
against a real ZooKeeper, alone and racing legacy allocators."""
from __future__ import annotations

import threading

import pytest

from quorum.migration.zk import (
    LONG_MAX, ZK_BLOCK_PATH, LegacyAllocator, ZkBlock, ZkBlocksExhausted, ZkConflict, connect,
    describe_placeholder, reserve_block, write_placeholder,
)
from tests.migration.zk_blocks import REFERENCE, assert_contiguous, kafka_json, run_threads, set_block


# ------------------------------------------------------------------ rollback placeholder
def test_write_placeholder_creates_and_moves_forward_only(zk_client):
    r = write_placeholder(zk_client, 7000, 1000)
    assert r.written and r.version == 0
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(-1, 7000, 7999)
    assert "wrote placeholder block [7000, 7999]" in describe_placeholder(r, 7000, 1000)

    # Legacy allocation resumes above it.
    assert LegacyAllocator(zk_client, broker_id=3).allocate() == (8000, 1000)

    # Below or equal to what is there: left alone, and said so.
    for start, length in [(3000, 1000), (7500, 500), (8000, 1000)]:
        r = write_placeholder(zk_client, start, length)
        assert not r.written and r.block == ZkBlock(1, 3, 8000, 8999) and r.version == 1
        assert "left /latest_producer_id_block as it is" in describe_placeholder(r, start, length)
    assert zk_client.get(ZK_BLOCK_PATH)[1].version == 1

    # Above: written (the end moves forward even if the start overlaps).
    r = write_placeholder(zk_client, 8500, 1000)
    assert r.written and zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(-1, 8500, 9499)


def test_write_placeholder_over_empty_node_and_bad_input(zk_client):
    zk_client.create(ZK_BLOCK_PATH, b"")
    assert write_placeholder(zk_client, 0, 1000).written
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(-1, 0, 999)
    with pytest.raises(ValueError):
        write_placeholder(zk_client, -1, 1000)
    with pytest.raises(ValueError):
        write_placeholder(zk_client, 10, 0)
    with pytest.raises(ZkBlocksExhausted):
        write_placeholder(zk_client, LONG_MAX, 2)


def test_write_placeholder_unknown_outcome(zk_client, lossy):
    proxy, zk = lossy
    set_block(zk_client, REFERENCE)
    proxy.arm(b"block_start", forward=True)
    r = write_placeholder(zk, 6000, 1000)
    assert proxy.cut.is_set()
    assert r.written and r.version == 1  # claimed by re-reading, not reported as "left alone"
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(-1, 6000, 6999)


# ------------------------------------------------------------------ bridge-mode reservation
def test_reserve_block_semantics(zk_client):
    # Absent znode: the range starts at min_start.
    assert reserve_block(zk_client, 0, 1000, broker_id=101) == (0, 0)
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(101, 0, 999)
    # Above the znode's block: max(min_start, block_end + 1).
    assert reserve_block(zk_client, 500, 1000, broker_id=101) == (1000, 1)
    assert reserve_block(zk_client, 10_000, 1000, broker_id=102) == (10_000, 2)
    assert zk_client.get(ZK_BLOCK_PATH)[0] == kafka_json(102, 10_000, 10_999)
    # A legacy broker continues above the reservation.
    assert LegacyAllocator(zk_client, broker_id=1).allocate() == (11_000, 1000)
    assert reserve_block(zk_client, 0, 1000, broker_id=101) == (12_000, 4)


def test_reserve_block_expected_version(zk_client):
    set_block(zk_client, REFERENCE)
    with pytest.raises(ZkConflict) as info:
        reserve_block(zk_client, 0, 1000, expected_version=3, broker_id=101)
    assert (info.value.expected_version, info.value.actual_version) == (3, 0)
    assert zk_client.get(ZK_BLOCK_PATH)[1].version == 0  # nothing written
    assert reserve_block(zk_client, 0, 1000, expected_version=0, broker_id=101) == (5000, 1)
    with pytest.raises(ZkConflict):
        reserve_block(zk_client, 0, 1000, expected_version=0, broker_id=101)
    # -1: only if the znode is absent.
    zk_client.delete(ZK_BLOCK_PATH)
    assert reserve_block(zk_client, 42, 10, expected_version=-1, broker_id=101) == (42, 0)
    with pytest.raises(ZkConflict):
        reserve_block(zk_client, 42, 10, expected_version=-1, broker_id=101)


def test_reserve_block_bad_input_and_exhaustion(zk_client):
    with pytest.raises(ValueError):
        reserve_block(zk_client, -5, 1000, broker_id=1)
    with pytest.raises(ValueError):
        reserve_block(zk_client, 0, 0, broker_id=1)
    with pytest.raises(ValueError):
        reserve_block(zk_client, 0, 1000, broker_id=-2)
    set_block(zk_client, kafka_json(1, 0, LONG_MAX - 500))
    with pytest.raises(ZkBlocksExhausted):
        reserve_block(zk_client, 0, 1000, broker_id=1)
    assert zk_client.get(ZK_BLOCK_PATH)[1].version == 0


def test_reserve_block_races_legacy_allocators(zk_chroot):
    """Reservations interleaved with two legacy allocators: one disjoint, contiguous sequence."""
    clients = [connect(zk_chroot, timeout=10) for _ in range(3)]
    legacy = [LegacyAllocator(clients[i], broker_id=i + 1) for i in range(2)]
    got: list[tuple[int, int]] = []
    lock = threading.Lock()
    errors = []

    def legacy_run(a):
        try:
            for _ in range(30):
                b = a.allocate()
                with lock:
                    got.append(b)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def bridge_run():
        try:
            for _ in range(30):
                start, _ = reserve_block(clients[2], 0, 1000, broker_id=100)
                with lock:
                    got.append((start, 1000))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=legacy_run, args=(a,)) for a in legacy] + [threading.Thread(target=bridge_run)]
    try:
        run_threads(threads, errors)
        assert len(got) == 90
        assert_contiguous(got)
    finally:
        for zk in clients:
            zk.stop(); zk.close()
