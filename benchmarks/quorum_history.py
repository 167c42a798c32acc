"""Phase 4 of the quorum benchmark: a large history filled by concurrent allocations, then the whole
cluster restarted: snapshot size, restart time, and whether the nodes agree afterwards."""
from __future__ import annotations

import array
import asyncio
import os
import time
from collections import Counter

from quorum.client.quorum import QuorumClient
from quorum.localcluster import LocalCluster
from quorum.raft import RaftConfig

from .common import describe_all
from .harness import log
from .quorum_cluster import (
    DESCRIBE_POLICY,
    RESTART_POLICY,
    THROUGHPUT_POLICY,
    Bench,
    check_disjoint,
    count_snapshot_lines,
    file_size,
    find_leader_address,
    journal_size,
    leader_first,
    snapshot_contents,
    wait_converged,
)

async def fill(lc: LocalCluster, target: int, n_tasks: int, cap_s: float) -> dict:
    leader_id, leader_addr = await find_leader_address(lc)
    addrs = leader_first(lc, leader_addr)
    # Every history registers the same brokers (a snapshot holds the live registrations: sizes then
    # compare like with like); at most ``target`` of them allocate.
    n_brokers = max(1, n_tasks)
    n_tasks = max(1, min(n_tasks, target))
    clients = [QuorumClient(list(addrs), THROUGHPUT_POLICY, client_id=f"bench-fill-{i}") for i in range(n_brokers)]
    starts: array.array = array.array("q")
    lengths: array.array = array.array("q")
    errors = Counter()
    claimed = 0
    try:
        epochs = await asyncio.gather(*(c.register_broker(i + 1) for i, c in enumerate(clients)))
        t0 = time.perf_counter()
        deadline = t0 + cap_s
        stop = False

        async def worker(i: int) -> None:
            nonlocal claimed
            c, epoch = clients[i], epochs[i]
            while not stop and claimed < target and time.perf_counter() < deadline:
                claimed += 1
                try:
                    b = await c.allocate(i + 1, epoch)
                except Exception as e:  # noqa: BLE001
                    claimed -= 1
                    errors[type(e).__name__] += 1
                    continue
                starts.append(b.start)
                lengths.append(b.length)

        async def progress() -> None:
            last_n, last_t = 0, t0
            while True:
                await asyncio.sleep(10)
                now = time.perf_counter()
                n = len(starts)
                log(f"  fill: {n:,}/{target:,} in {now - t0:.0f}s ({(n - last_n) / (now - last_t):,.0f}/s now)")
                last_n, last_t = n, now

        prog = asyncio.get_running_loop().create_task(progress())
        try:
            await asyncio.gather(*(worker(i) for i in range(n_tasks)))
        finally:
            stop = True
            prog.cancel()
        elapsed = time.perf_counter() - t0
    finally:
        for c in clients:
            await c.close()
    reached = len(starts)
    return {"target": target, "reached": reached, "complete": reached >= target, "fill_s": elapsed,
            "fill_rate_per_s": reached / elapsed if elapsed > 0 else None, "fill_clients": n_tasks,
            "registered_brokers": n_brokers,
            "cap_s": cap_s, "errors": dict(errors), "leader_node_id": leader_id, "epoch_broker_1": epochs[0],
            "_starts": starts, "_lengths": lengths,
            "projected_full_fill_s": (target / (reached / elapsed)) if reached and elapsed > 0 else None}


async def snapshot_all(lc: LocalCluster, timeout: float = 60.0) -> dict:
    """Ask every node to write a snapshot now (DescribeState action "snapshot") and wait until each has."""
    c = QuorumClient(lc.client_addresses(), DESCRIBE_POLICY, client_id="bench-snapshot")
    try:
        before = {n.node_id: (await c.describe(n.client_address))["snapshot"]["mtime_ns"] for n in lc.nodes()}
        for n in lc.nodes():
            await c.describe(n.client_address, action="snapshot")
        t0 = time.perf_counter()
        pending = set(before)
        while pending:
            for n in lc.nodes():
                if n.node_id in pending and (await c.describe(n.client_address))["snapshot"]["mtime_ns"] != before[n.node_id]:
                    pending.discard(n.node_id)
            if pending and time.perf_counter() - t0 > timeout:
                return {"ok": False, "missing": sorted(pending)}
            await asyncio.sleep(0.05)
        return {"ok": True, "seconds": time.perf_counter() - t0}
    finally:
        await c.close()


async def history_row(bench: Bench, target: int, snapshot_before_stop: bool = False) -> dict:
    """Fill a fresh cluster with ``target`` allocations, stop it, measure files, restart it.

    ``snapshot_before_stop``: every node writes a snapshot first, so that snapshot sizes compare
    like with like (without it a short history has no snapshot yet, and the journal tail left to
    replay is wherever the last automatic compaction happened to leave it, 0 to
    ``compaction_min_entries`` entries)."""
    a = bench.args
    log(f"phase 4: history {target:,} allocations ({a.fill_clients} tasks, cap {a.fill_cap:.0f}s)")
    with bench.cluster(f"hist-{target}") as lc:
        f = await fill(lc, target, a.fill_clients, a.fill_cap)
        starts, lengths = f.pop("_starts"), f.pop("_lengths")
        dis = check_disjoint(starts, lengths)
        max_end = dis["max_end"]
        del starts, lengths
        conv = await wait_converged(lc, max(a.catchup_timeout, 60))
        forced = await snapshot_all(lc) if snapshot_before_stop else None
        if forced is not None and not forced["ok"]:
            bench.failures.append(f"history {target}: nodes {forced['missing']} wrote no snapshot when asked")
        before = await describe_all(lc, DESCRIBE_POLICY)
        lc.down(timeout=30)
        files = {}
        snaps = {str(n.node_id): count_snapshot_lines(lc.log_path(n.node_id)) for n in lc.nodes()}
        for n in lc.nodes():
            dd = lc.data_dir(n.node_id)
            files[n.node_id] = {"raft.snapshot": file_size(os.path.join(dd, "raft.snapshot")),
                                "raft.journal": journal_size(os.path.join(dd, "raft.journal")),
                                "raft.journal.meta": file_size(os.path.join(dd, "raft.journal.meta")),
                                "audit.log": file_size(os.path.join(dd, "audit.log")),
                                "snapshot_contents": snapshot_contents(os.path.join(dd, "raft.snapshot"))}
        t0 = time.perf_counter()
        lc.up(3, timeout=600)
        t_up = time.perf_counter()
        c = QuorumClient(lc.client_addresses(), RESTART_POLICY, client_id="bench-restart")
        try:
            b = await c.allocate(1, f["epoch_broker_1"])
        finally:
            await c.close()
        t_first = time.perf_counter()
        after = await describe_all(lc, DESCRIBE_POLICY)
    next_before = max((d["state"]["next_producer_id"] for d in before.values()), default=None)
    above_all = max_end is None or b.start >= max_end
    above_cursor = next_before is None or b.start >= next_before
    if not (above_all and above_cursor):
        bench.failures.append(f"history {target}: block after restart {b.start} is below an earlier block")
    if not dis["disjoint"]:
        bench.failures.append(f"history {target}: fill blocks overlap")
    if not conv["ok"]:
        bench.failures.append(f"history {target}: nodes had not converged before the stop")
    sizes = lambda key: [files[nid][key] for nid in sorted(files)]  # noqa: E731
    return {"history_target": target, **f, "fill_disjoint_check": dis, "converged_before_stop": conv["ok"],
            "snapshot_before_stop": forced,
            "files_bytes": {str(k): v for k, v in files.items()}, "snapshots_written": snaps,
            "compaction_min_entries": RaftConfig().compaction_min_entries,
            "snapshot_bytes_max": max((x or 0) for x in sizes("raft.snapshot")),
            "journal_bytes_max": max((x or 0) for x in sizes("raft.journal")),
            "audit_bytes_max": max((x or 0) for x in sizes("audit.log")),
            "journal_entries_before_stop": {str(k): d["journal_entries"] for k, d in before.items()},
            "journal_entries_after_restart": {str(k): d["journal_entries"] for k, d in after.items()},
            "up_s": t_up - t0, "restart_to_first_allocation_s": t_first - t0,
            "first_block_after_restart": {"start": b.start, "length": b.length, "node": b.node},
            "max_end_before": max_end, "next_producer_id_before_stop": next_before,
            "after_restart_above_every_earlier_block": above_all and above_cursor}


async def phase_history(bench: Bench) -> dict:
    rows = []
    for target in (10, bench.args.history):
        rows.append(await history_row(bench, target))
    return {"rows": rows}
