"""Bridge mode with a real ZooKeeper and a real quorum: a mixed fleet (ZooKeeper-mode brokers and
quorum brokers) draws from one sequence, through a leader kill; rollback puts ZooKeeper-mode
allocation above everything the quorum issued; finalize stops writing the znode."""
from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import pytest

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.migration.zk import LegacyAllocator, connect, read_block
from quorum.localcluster import LocalCluster
from quorum.managers import BRIDGE, FINALIZED, ROLLED_BACK, QuorumState
from quorum.trail import iter_blocks
from records import AllocateProducerIdsRecord, BridgeReservationRecord, MigrationStateRecord
from tests.conftest import run
from tests.migration.conftest import pidctl, three_node_quorum
from records.wire.errors import PidQuorumError

NOW = 1_700_000_000_000


@pytest.fixture
def quorum(tmp_path):
    yield from three_node_quorum(tmp_path / "cluster")


def client(lc: LocalCluster, timeout: float = 15.0) -> QuorumClient:
    return QuorumClient(lc.client_addresses(), RetryPolicy(timeout=timeout, attempt_timeout=1.0), client_id="bridge")


def seed_znode(zk_client, start: int, end: int, broker: int = 35) -> None:
    zk_client.create("/latest_producer_id_block", json.dumps(
        {"version": 1, "broker": broker, "block_start": str(start), "block_end": str(end)}).encode())


def assert_disjoint(blocks: list[tuple[int, int, str]]) -> None:
    ordered = sorted(blocks)
    for (s1, n1, who1), (s2, n2, who2) in zip(ordered, ordered[1:]):
        assert s1 + n1 <= s2, f"overlap: [{s1}, {s1 + n1}) of {who1} and [{s2}, {s2 + n2}) of {who2}"


# ------------------------------------------------------------------ unit: the replicated mode
def test_mode_transitions_and_the_reservation_guard():
    s = QuorumState()
    m = s.migration
    with pytest.raises(PidQuorumError, match="cannot finalize"):
        m.generate_command("finalize", "", 0, NOW)
    with pytest.raises(PidQuorumError, match="--zk"):
        m.generate_command("bridge", "", 0, NOW)
    s.apply_batch(m.generate_command("bridge", "zk:1/x", 0, NOW).records)
    assert m.mode == BRIDGE
    # an allocation not covered by a reservation is refused at replay
    (out,) = s.apply_batch([AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=0,
                                                      producer_id_len=1000)])
    assert not out.accepted and "reservation" in out.error
    outs = s.apply_batch([BridgeReservationRecord(reserved_start=5000, reserved_end=5999, broker_id=1),
                          AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=5000,
                                                    producer_id_len=1000)])
    assert all(o.accepted for o in outs) and s.producer_ids.next_producer_id == 6000
    s.apply_batch(m.generate_command("finalize", "", 6000, NOW).records)
    assert m.mode == FINALIZED
    s.apply_batch(m.generate_command("rollback", "", 6000, NOW).records)
    assert m.mode == ROLLED_BACK
    (out,) = s.apply_batch([AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=6000,
                                                      producer_id_len=1000)])
    assert not out.accepted
    back = QuorumState.from_records(s.snapshot_records())
    assert (back.migration.mode, back.migration.zk, back.producer_ids.next_producer_id) == (ROLLED_BACK, "zk:1/x",
                                                                                            6000)
    assert m.generate_command("rollback", "", 6000, NOW).records == []  # again: unchanged
    assert isinstance(m.generate_command("bridge", "zk:1/x", 6000, NOW).records[0], MigrationStateRecord)


# ------------------------------------------------------------------ the mixed fleet
def test_mixed_fleet_in_bridge_mode_through_a_leader_kill_all_blocks_disjoint(quorum, zk_chroot, zk_client):
    seed_znode(zk_client, 4000, 4999)
    r = pidctl(quorum, "migrate", "bridge", "--zk", zk_chroot)
    assert r.returncode == 0, r.stderr
    duration, stop = 20.0, threading.Event()
    blocks: list[tuple[int, int, str]] = []
    lock = threading.Lock()
    errors: list[str] = []

    def legacy(broker_id: int) -> None:
        zk = connect(zk_chroot, 10)
        try:
            alloc = LegacyAllocator(zk, broker_id)
            while not stop.is_set():
                start, length = alloc.allocate()
                with lock:
                    blocks.append((start, length, f"zk-broker-{broker_id}"))
                time.sleep(0.02)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"legacy {broker_id}: {e!r}")
        finally:
            zk.stop()
            zk.close()

    async def quorum_broker(broker_id: int) -> None:
        c = client(quorum)
        try:
            epoch = await c.register_broker(broker_id)
            while not stop.is_set():
                try:
                    b = await c.allocate(broker_id, epoch)
                except PidQuorumError:  # a timeout around the kill: outcome unknown, never counted
                    continue
                with lock:
                    blocks.append((b.start, b.length, f"quorum-broker-{broker_id}"))
                await asyncio.sleep(0.02)
        finally:
            await c.close()

    async def fleet() -> None:
        threads = [threading.Thread(target=legacy, args=(bid,)) for bid in (101, 102)]
        for t in threads:
            t.start()
        tasks = [asyncio.create_task(quorum_broker(bid)) for bid in (1, 2)]
        t0 = time.monotonic()
        await asyncio.sleep(duration / 3)
        leader = await _leader(quorum)
        quorum.kill(leader)
        await asyncio.sleep(1.0)
        quorum.start(leader)
        await asyncio.sleep(max(0.0, duration - (time.monotonic() - t0)))
        stop.set()
        await asyncio.gather(*tasks)
        for t in threads:
            await asyncio.get_running_loop().run_in_executor(None, t.join, 30)

    run(fleet())
    assert not errors, errors
    by_source = {who: sum(1 for *_, w in blocks if w == who) for who in {w for *_, w in blocks}}
    assert set(by_source) == {"zk-broker-101", "zk-broker-102", "quorum-broker-1", "quorum-broker-2"}, by_source
    assert all(n >= 20 for n in by_source.values()), by_source
    assert all(s >= 5000 for s, _, _ in blocks)  # above the block ZooKeeper held before the migration
    assert_disjoint(blocks)
    # What the quorum committed (every node's audit trail) is disjoint from every legacy block too.
    committed = [(b["producer_id_start"], b["producer_id_len"], f"committed-{b['broker_id']}")
                 for b in iter_blocks([os.path.join(quorum.data_dir(n.node_id), "audit.log") for n in quorum.nodes()])]
    legacy_blocks = [b for b in blocks if b[2].startswith("zk-")]
    assert_disjoint(committed + legacy_blocks)
    print(f"mixed fleet blocks: {by_source}, committed by the quorum: {len(committed)}")


async def _leader(lc: LocalCluster) -> int:
    c = client(lc, 5)
    try:
        address, _ = await c.find_leader(20)
    finally:
        await c.close()
    return next(n.node_id for n in lc.nodes() if n.client_address == address)


# ------------------------------------------------------------------ finalize and rollback
def test_finalize_stops_writing_the_znode_and_rollback_puts_zookeeper_above_everything(quorum, zk_chroot,
                                                                                        zk_client):
    seed_znode(zk_client, 4000, 4999)
    assert pidctl(quorum, "migrate", "bridge", "--zk", zk_chroot).returncode == 0

    async def allocate(n: int) -> list:
        c = client(quorum)
        try:
            epoch = await c.register_broker(1)
            return [await c.allocate(1, epoch) for _ in range(n)]
        finally:
            await c.close()

    bridged = run(allocate(3))
    assert bridged[0].start == 5000
    block, version = read_block(zk_client)
    assert block.block_end == bridged[-1].next_id - 1  # every quorum block was reserved in the znode
    r = pidctl(quorum, "migrate", "finalize", "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["mode"] == FINALIZED
    after = run(allocate(2))
    assert read_block(zk_client)[1] == version  # finalized: the znode is no longer written
    r = pidctl(quorum, "migrate", "rollback", "-o", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["mode"] == ROLLED_BACK and "placeholder" in out["message"]
    top = after[-1].next_id
    block, _ = read_block(zk_client)
    assert (block.broker, block.block_start) == (-1, top)
    # ZooKeeper-mode brokers continue above everything the quorum issued ...
    zk = connect(zk_chroot, 10)
    try:
        start, _ = LegacyAllocator(zk, 7).allocate()
    finally:
        zk.stop()
        zk.close()
    assert start >= top + 1000
    # ... and the quorum issues nothing any more (AllocateProducerIds has no message field: the
    # node's log says why).
    with pytest.raises(PidQuorumError, match="UNKNOWN_SERVER_ERROR"):
        run(allocate(1))
    logs = "".join(open(quorum.log_path(n.node_id)).read() for n in quorum.nodes())
    assert "allocated by ZooKeeper again (the migration was rolled back)" in logs
    r = pidctl(quorum, "migrate", "status", "-o", "json")
    assert json.loads(r.stdout)["mode"] == ROLLED_BACK
    # A second rollback is harmless: the znode is already above the placeholder.
    r = pidctl(quorum, "migrate", "rollback")
    assert r.returncode == 0 and "left" in r.stdout
