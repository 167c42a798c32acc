"""What the phases of the quorum benchmark (``pidctl bench quorum``) share: the cluster options and retry
policies, the ``Bench`` state (arguments, checks that failed), finding the leader and waiting until the
nodes agree, and the summaries and checks of what the quorum handed out (blocks disjoint and increasing)
and of what it left on disk (snapshot and journal sizes)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter

from chaos.faultnode import FAULT_NODE_COMMAND
from quorum.client.quorum import RetryPolicy
from quorum.journal import written_length
from quorum.localcluster import LocalCluster
from snapshots.format import read_snapshot

from .common import describe_all, find_leader, median, percentile, temp_cluster

NO_FSYNC = {"node_command": [*FAULT_NODE_COMMAND, "--no-fsync"]}  # benchmark-only: what durability costs
CLUSTER_OPTIONS = {"allocate_rate_per_broker": 0}  # rate limit off in every phase
THROUGHPUT_POLICY = RetryPolicy(timeout=10.0, attempt_timeout=3.0)
FAILOVER_POLICY = RetryPolicy(timeout=30.0, attempt_timeout=1.0)
RESTART_POLICY = RetryPolicy(timeout=120.0, attempt_timeout=2.0)
DESCRIBE_POLICY = RetryPolicy(timeout=2.0, attempt_timeout=1.0)


def summarize_ms(seconds: list[float]) -> dict:
    """n, min, p50 (the median), p90, p99, max, mean in ms of values in seconds."""
    s = sorted(x * 1000.0 for x in seconds)
    if not s:
        return {"n": 0, "min_ms": None, "p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None,
                "mean_ms": None}
    return {"n": len(s), "min_ms": s[0], "p50_ms": median(s), "p90_ms": percentile(s, 90),
            "p99_ms": percentile(s, 99), "max_ms": s[-1], "mean_ms": sum(s) / len(s)}


def check_disjoint(starts, lengths) -> dict:
    """Sort blocks by start; each must start at or after the previous one's end."""
    n = len(starts)
    order = sorted(range(n), key=starts.__getitem__)
    overlaps = 0
    first = None
    prev_end = None
    for i in order:
        if prev_end is not None and starts[i] < prev_end:
            overlaps += 1
            if first is None:
                first = {"start": starts[i], "length": lengths[i], "previous_end": prev_end}
        end = starts[i] + lengths[i]
        prev_end = end if prev_end is None else max(prev_end, end)
    return {"blocks": n, "disjoint": overlaps == 0, "overlaps": overlaps, "first_overlap": first,
            "max_end": prev_end}


def check_increasing(blocks: list[tuple[int, int]]) -> dict:
    """In the order they were handed out, each block starts at or after the previous one's end."""
    bad = [i for i in range(1, len(blocks)) if blocks[i][0] < blocks[i - 1][0] + blocks[i - 1][1]]
    return {"blocks": len(blocks), "increasing": not bad, "violations": len(bad),
            "first_violation": ({"index": bad[0], "block": list(blocks[bad[0]]),
                                 "previous": list(blocks[bad[0] - 1])} if bad else None)}


def r(x, nd=1):
    return None if x is None else round(x, nd)


class Bench:
    def __init__(self, args):
        self.args = args
        self.failures: list[str] = []

    @contextlib.contextmanager
    def cluster(self, label: str, env: dict | None = None, **options):
        with temp_cluster(f"pidquorum-bench-{label}-", self.args.keep, label, env=env, **{**CLUSTER_OPTIONS,
                                                                                         **options}) as (lc, _):
            yield lc


async def find_leader_address(lc: LocalCluster) -> tuple[int, str]:
    """(node id, client address) of the leader with the highest term among live nodes."""
    nid, _, address = await find_leader(lc, 20.0, policy=DESCRIBE_POLICY)
    return nid, address


def convergence_key(d: dict) -> tuple:
    return (d["raft"]["commit_index"], d["raft"]["last_applied"], d["applied_index"],
            d["state"]["next_producer_id"])


async def wait_converged(lc: LocalCluster, timeout: float) -> dict:
    """Poll until every node answers and all report the same commit index, applied indexes and cursor."""
    t0 = time.perf_counter()
    deadline = t0 + timeout
    n_nodes = len(lc.nodes())
    last: dict[int, dict] = {}
    while True:
        last = await describe_all(lc, DESCRIBE_POLICY)
        keys = {convergence_key(d) for d in last.values()}
        if len(last) == n_nodes and len(keys) == 1:
            commit, raft_applied, applied, next_id = keys.pop()
            if raft_applied == commit:
                return {"ok": True, "seconds": time.perf_counter() - t0, "commit_index": commit,
                        "applied_index": applied, "next_producer_id": next_id}
        if time.perf_counter() > deadline:
            return {"ok": False, "seconds": time.perf_counter() - t0,
                    "nodes": {nid: dict(zip(("commit_index", "raft_last_applied", "applied_index",
                                             "next_producer_id"), convergence_key(d)))
                              for nid, d in last.items()}}
        await asyncio.sleep(0.01)


def leader_first(lc: LocalCluster, leader_address: str) -> list[str]:
    addrs = lc.client_addresses()
    return [leader_address] + [a for a in addrs if a != leader_address]


def count_snapshot_lines(log_path: str) -> int:
    """Snapshots a node wrote, from its log ("snapshot at index ..." lines of quorum.raft)."""
    try:
        with open(log_path, errors="replace") as f:
            return sum(1 for line in f if "snapshot at index" in line)
    except FileNotFoundError:
        return 0


def snapshot_contents(path: str) -> dict | None:
    """What a raft.snapshot holds: record count by type, and the bytes of the two log entries it embeds."""
    if not os.path.exists(path):
        return None
    try:
        snap = read_snapshot(path)
    except Exception as e:  # noqa: BLE001 - report, do not fail the benchmark
        return {"error": f"{type(e).__name__}: {e}"}
    return {"records": len(snap.records), "record_types": dict(Counter(type(x).__name__ for x in snap.records)),
            "last_index": snap.last_index, "embedded_entry_bytes": len(snap.last_entry[0]) + len(snap.prev_entry[0])}


def file_size(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return None


def journal_size(path: str) -> int | None:
    """The bytes a journal's entries take (``quorum.journal.written_length``), not its preallocated length."""
    try:
        with open(path, "rb") as f:
            return written_length(f.read())
    except FileNotFoundError:
        return None
