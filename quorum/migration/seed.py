"""Seeding the quorum from ZooKeeper's ``/latest_producer_id_block``.

The quorum's next block starts at ZooKeeper's ``block_end + 1`` (inclusive end; seeding the block's start
issued a block twice in Kafka, KAFKA-15552).  The seed is a replicated ``ProducerIdSeedRecord`` that never
moves the cursor back.  Only a fresh quorum may be seeded (one that issued IDs before any seed may have
issued some of ZooKeeper's 0..block_end): refused here from DescribeState before anything is sent, and by
the leader and replay (``quorum.managers.seed_overlap``).
"""
from __future__ import annotations

import os
from typing import Any

from quorum.client.quorum import QuorumClient
from quorum.managers import seed_overlap
from records.wire.errors import InvalidRequestError

from .zk import ZkBlock, ZkBlockError, ZkBlockMissing, ZkMigrationError, connect, parse_block, read_block

# An export is a few dozen bytes; anything much larger is not one.
MAX_EXPORT_BYTES = 64 * 1024


def read_export(path: str) -> tuple[ZkBlock | None, str]:
    """The block in a JSON export file, and its origin string; ZkBlockError names the field."""
    origin = f"export:{os.path.abspath(path)}"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_EXPORT_BYTES + 1)
    except OSError as e:
        raise ZkBlockError(origin, "file", e.strerror or str(e)) from None
    if len(data) > MAX_EXPORT_BYTES:
        raise ZkBlockError(origin, "file", f"larger than {MAX_EXPORT_BYTES} bytes: not an export of the znode")
    if not data.strip():
        raise ZkBlockError(origin, "data", "the file is empty (an export of an empty znode is not a block)")
    return parse_block(data, origin), origin


def read_live(zk_hosts: str, timeout: float) -> tuple[ZkBlock | None, str]:
    origin = f"zookeeper:{zk_hosts}"
    zk = connect(zk_hosts, timeout)
    try:
        block, _version = read_block(zk)
    finally:
        zk.stop()
        zk.close()
    return block, origin


def read_zk_block(*, export_file: str | None = None, zk_hosts: str | None = None, allow_empty: bool = False,
                  timeout: float = 10.0) -> tuple[ZkBlock | None, str]:
    """ZooKeeper's latest block from an export or a live ZooKeeper (None: nothing was ever allocated,
    accepted only with ``allow_empty``)."""
    if export_file is not None:
        block, origin = read_export(export_file)
    else:
        try:
            block, origin = read_live(zk_hosts, timeout)
        except ZkBlockMissing:
            if not allow_empty:
                raise
            return None, f"zookeeper:{zk_hosts}"
    if block is None and not allow_empty:
        raise ZkMigrationError(f"{origin}: the znode holds no block (empty data); use --allow-empty if there is "
                               "nothing to migrate")
    return block, origin


async def seed_from_block(client: QuorumClient, block: ZkBlock | None, origin: str, *,
                          dry_run: bool = False) -> dict[str, Any]:
    """Commit the seed (unless ``dry_run``); a JSON-able report with a one-line ``message``."""
    out: dict[str, Any] = {"origin": origin, "dry_run": dry_run,
                           "zk_block": None if block is None else {
                               "broker": block.broker, "block_start": block.block_start,
                               "block_end": block.block_end}}
    if block is None:
        out.update(changed=False, seed=None, message=f"{origin}: no ZooKeeper block: nothing to seed")
        return out
    seed = block.next_start
    out["seed"] = seed
    described = await _describe_any(client)
    current = None if described is None else int(described["state"]["next_producer_id"])
    overlap = None if described is None else _overlap(described, block.block_end)
    if overlap is not None:  # the leader refuses it too; this says so before anything is sent
        raise InvalidRequestError(overlap)
    if dry_run:
        changed = current is None or seed > current
        out.update(changed=False, would_change=changed, next_producer_id=current, message=(
            f"dry run: would seed the quorum at {seed} (ZooKeeper block [{block.block_start}, {block.block_end}] "
            f"of broker {block.broker})" if changed else
            f"dry run: nothing to do: the quorum's next ID {current} is already at or above {seed}"))
        return out
    changed, next_id = await client.seed(seed, origin, block.broker, block.block_start, block.block_end)
    out.update(changed=changed, next_producer_id=next_id, message=(
        f"seeded: the quorum's next block starts at {next_id} (ZooKeeper block [{block.block_start}, "
        f"{block.block_end}] of broker {block.broker}, from {origin})" if changed else
        f"nothing changed: the quorum's next ID {next_id} is already at or above {seed}"))
    return out


def _overlap(described: dict[str, Any], zk_block_end: int) -> str | None:
    """``seed_overlap`` from a node's DescribeState (its replicated state, as far as it has applied; the
    leader decides again when the seed is proposed); a node too old to say what it issued leaves the
    decision to the leader."""
    issued = described.get("producer_ids_issued")
    if not isinstance(issued, dict):
        return None
    latest = described["state"].get("latest_block")
    top = None if latest is None else latest["producer_id_start"] + latest["producer_id_len"] - 1
    return seed_overlap(issued.get("lowest"), bool(issued.get("before_seed")), top, zk_block_end)


async def _describe_any(client: QuorumClient) -> dict[str, Any] | None:
    """The leader's DescribeState, else that of the node that applied most (None: no node answered)."""
    answers = [d for d in (await client.describe_each()).values() if isinstance(d, dict)]
    if not answers:
        return None
    return max(answers, key=lambda d: ((d.get("raft") or {}).get("state") == "leader", d.get("applied_index", 0)))
