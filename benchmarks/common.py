"""Helpers of the benchmarks that run a quorum: nearest-rank percentiles and a pacer, the check that
IDs lie inside the quorum's blocks, a throw-away three-node ``LocalCluster``, DescribeState polling
(``describe_all`` / ``find_leader``) and the staggered leader-kill schedule."""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import math
import os
import shutil
import tempfile
import time
from typing import Callable

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from records.wire.errors import NotControllerError

from .harness import log

HOST = "127.0.0.1"
GOLDEN = 0.6180339887498949
DESCRIBE_POLICY = RetryPolicy(timeout=1.0, attempt_timeout=0.5)


# --------------------------------------------------------------------------- stats
async def paced(start: float, tick: float, clock=time.monotonic):
    """Yield ``(due, now)`` once per tick after ``start`` (due = start + k * tick), sleeping until each is
    due; a late loop is not made to catch up ticks, its caller pays what is owed by ``now``.  Endless:
    the caller breaks out at its stop time."""
    k = 0
    while True:
        k += 1
        due = start + k * tick
        now = clock()
        if due > now:
            await asyncio.sleep(due - now)
        yield due, clock()


def percentile(sorted_values, q: float):
    """Nearest-rank percentile of an already sorted sequence (q in 0..100); None if empty."""
    n = len(sorted_values)
    if not n:
        return None
    return sorted_values[min(n, max(1, math.ceil(q / 100.0 * n))) - 1]


def median(values):
    """The middle of ``values`` (the mean of the two middle ones for an even count); None if empty."""
    s = sorted(values)
    if not s:
        return None
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def check_inside(ids, blocks: list[tuple[int, int]]) -> dict:
    """Every ID inside one of ``blocks`` ([start, end) pairs)."""
    blocks = sorted(blocks)
    starts = [s for s, _ in blocks]
    outside = 0
    first = None
    for pid in ids:
        j = bisect.bisect_right(starts, pid) - 1
        if j < 0 or not blocks[j][0] <= pid < blocks[j][1]:
            outside += 1
            if first is None:
                first = pid
    return {"ids": len(ids), "blocks": len(blocks), "outside": outside, "first_outside": first}


# ------------------------------------------------------------------------ cluster
@contextlib.contextmanager
def temp_cluster(prefix: str, keep: bool, label: str | None = None, subdir: str | None = None,
                 tail_lines: int = 25, **up_options):
    """A fresh three-node ``LocalCluster`` on HOST, yielded as (cluster, directory).

    The directory is a new ``tempfile.mkdtemp(prefix=prefix)``; the cluster lives in it, or in its
    ``subdir`` (the caller keeps other things next to it).  ``up_options`` go to ``LocalCluster.up``.
    If the body raises, every node's log tail goes to stderr.  The cluster is always taken down, and the
    directory removed unless ``keep``."""
    directory = tempfile.mkdtemp(prefix=prefix)
    lc = LocalCluster(os.path.join(directory, subdir) if subdir else directory)
    tag = f"{label}: " if label else ""
    ok = False
    try:
        lc.up(3, host=HOST, **up_options)
        yield lc, directory
        ok = True
    finally:
        if not ok and lc.exists():
            for n in lc.nodes():
                log(f"----- {tag}node {n.node_id} log tail -----\n{lc.tail_log(n.node_id, tail_lines)}")
        try:
            lc.down(timeout=10)
        finally:
            if keep:
                log(f"{tag}{'directory' if subdir else 'cluster directory'} kept: {directory}")
            else:
                shutil.rmtree(directory, ignore_errors=True)


async def describe_all(lc: LocalCluster, policy: RetryPolicy = DESCRIBE_POLICY) -> dict[int, dict]:
    """DescribeState of every live node that answers, by node id (``QuorumClient.describe_each``)."""
    alive = {n.client_address: n.node_id for n in lc.nodes() if lc.alive(n.node_id)}
    if not alive:
        return {}
    c = QuorumClient(list(alive), policy)
    try:
        answers = await c.describe_each()
    finally:
        await c.close()
    return {alive[a]: d for a, d in answers.items() if not isinstance(d, Exception)}


async def find_leader(lc: LocalCluster, timeout: float = 20.0, exclude: int | None = None,
                      policy: RetryPolicy = DESCRIBE_POLICY) -> tuple[int, float, str]:
    """(node id, seconds spent, client address) of the leader (``QuorumClient.find_leader``), not ``exclude``."""
    t0 = time.perf_counter()
    node_of = {n.client_address: n.node_id for n in lc.nodes()}
    c = QuorumClient(list(node_of), policy)
    try:
        address, _ = await c.find_leader(timeout, exclude={a for a, nid in node_of.items() if nid == exclude})
    except NotControllerError as e:
        raise RuntimeError(f"no leader within {timeout:.0f}s: {e.message}") from None
    finally:
        await c.close()
    return node_of[address], time.perf_counter() - t0, address


@dataclasses.dataclass
class LeaderKill:
    """One round of ``kill_leaders``: seconds; ``at_s`` and ``scheduled_at_s`` from the run's start."""
    round: int
    at_s: float                         # SIGKILL sent
    scheduled_at_s: float               # when it was due
    late_s: float                       # sent minus due (a long leader search before it shows here)
    leader_search_before_kill_s: float  # DescribeState polling that found the leader
    killed_node: int
    kill_s: float                       # the lc.kill() call
    new_leader: int
    new_leader_seen_after_s: float      # SIGKILL -> another node seen as leader
    restart_ready_s: float = 0.0        # lc.start() of the killed node -> it is ready

    def summary(self) -> str:
        return (f"  kill {self.round}: node {self.killed_node} (leader) killed at {self.at_s:.1f}s, new leader "
                f"node {self.new_leader} seen after {self.new_leader_seen_after_s * 1000:.0f} ms, restarted "
                f"(ready in {self.restart_ready_s * 1000:.0f} ms)")


async def kill_leaders(lc: LocalCluster, t_start: float, t_stop: float, every: float, restart_after: float,
                       stagger_s: float, on_round: Callable[[LeaderKill], None],
                       before_kill: Callable[[], None] | None = None) -> None:
    """SIGKILL the quorum leader every ``every`` s and restart it ``restart_after`` s after the kill.

    Kill i is due at ``t_start + i * every + frac(i * GOLDEN) * stagger_s`` (perf_counter times), so
    that with a block's worth of ``stagger_s`` the kills fall at different points of the block cycle.
    No kill is made that could not be restarted by ``t_stop`` - 0.5 s.  The leader is the live node
    with the highest term (DescribeState); ``before_kill()`` runs once it is found, just before the
    kill; ``on_round`` gets each round once the node is ready again."""
    i = 0
    while True:
        i += 1
        t_kill = t_start + i * every + (math.modf(i * GOLDEN)[0] * stagger_s)
        if t_kill + restart_after + 0.5 > t_stop:
            return
        await asyncio.sleep(max(0.0, t_kill - time.perf_counter()))
        leader, search_s, _ = await find_leader(lc, 20.0)
        if before_kill is not None:
            before_kill()
        t0 = time.perf_counter()
        await asyncio.to_thread(lc.kill, leader)
        t_killed = time.perf_counter()
        new_leader, _, _ = await find_leader(lc, 20.0, exclude=leader)
        k = LeaderKill(round=i, at_s=t0 - t_start, scheduled_at_s=t_kill - t_start, late_s=t0 - t_kill,
                       leader_search_before_kill_s=search_s, killed_node=leader, kill_s=t_killed - t0,
                       new_leader=new_leader, new_leader_seen_after_s=time.perf_counter() - t0)
        await asyncio.sleep(max(0.0, t0 + restart_after - time.perf_counter()))
        t_restart = time.perf_counter()
        await asyncio.to_thread(lc.start, leader)
        await asyncio.to_thread(lc.wait_ready, [leader], 60.0)
        k.restart_ready_s = time.perf_counter() - t_restart
        on_round(k)


def leader_kill_checks(k: dict, group: str, unit: str,
                       more: Callable[[str, dict], list[str]] | None = None) -> list[str]:
    """The failed checks of a leader-kill phase ``k``: IDs handed out twice, and, for each member of
    ``k[group]`` (label -> figures), IDs outside the broker's audit-trail blocks, then ``more(label,
    figures)``."""
    out = [f"leader kill: {k['duplicates']} duplicate {unit}"] if k["duplicates"] else []
    for label, m in k[group].items():
        if m["inside_quorum_blocks"]["outside"]:
            out.append(f"leader kill: {label}: {m['inside_quorum_blocks']['outside']} {unit} outside the broker's "
                       f"audit-trail blocks")
        if more is not None:
            out += more(label, m)
    return out
