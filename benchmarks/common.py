"""Helpers shared by the benchmarks of this package (``pidctl bench`` and ``pidctl bench NAME``).

Not a benchmark itself.  What is here: stderr progress lines, nearest-rank percentiles, the check that
IDs lie inside the quorum's blocks, a throw-away three-node ``LocalCluster``,
DescribeState polling (``describe_all`` / ``find_leader``), the staggered
leader-kill schedule, the results skeleton (environment, phases run one after
the other, JSON written whatever happens) and the plain-text tables.
"""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import datetime
import inspect
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from typing import Callable, Iterable

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from records.wire.errors import NotControllerError

HOST = "127.0.0.1"
GOLDEN = 0.6180339887498949
DESCRIBE_POLICY = RetryPolicy(timeout=1.0, attempt_timeout=0.5)


def log(msg: str) -> None:
    """A progress line on stderr, with the time of day."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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


# ------------------------------------------------------------------------ results
def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def environment_info(**extra) -> dict:
    """The machine and Python of the run, then ``extra``, then the load average at the start."""
    return {"cpu_count": os.cpu_count(), "python": platform.python_version(),
            "python_executable": sys.executable, "platform": platform.platform(), **extra,
            "loadavg_start": loadavg()}


def run_phases(res: dict, phases: Iterable[tuple[str, Callable]], arg, json_path: str,
               checks: Callable[[dict], list[str]] | None = None, phase_seconds: bool = False) -> None:
    """Run each (name, fn) as ``fn(arg)`` (through ``asyncio.run`` if that gives a coroutine) into
    ``res["phases"][name]``; a phase that raises is printed and recorded in ``res["errors"]``, and the
    next one runs.  Then ``res["failed_checks"] = checks(res)`` if given.  Whatever happens, total_s,
    loadavg_end and finished_at are set and ``res`` is written as JSON to ``json_path``.
    ``phase_seconds`` adds each phase's own time as its "phase_s"."""
    t0 = time.perf_counter()
    try:
        for name, fn in phases:
            t = time.perf_counter()
            try:
                out = fn(arg)
                if inspect.iscoroutine(out):
                    out = asyncio.run(out)
                res["phases"][name] = out
                if phase_seconds:
                    out["phase_s"] = time.perf_counter() - t
            except Exception as e:  # noqa: BLE001 - record it, go on with the next phase
                traceback.print_exc()
                res["errors"].append({"phase": name, "error": f"{type(e).__name__}: {e}"})
        if checks is not None:
            res["failed_checks"] = checks(res)
    finally:
        res["total_s"] = time.perf_counter() - t0
        res["environment"]["loadavg_end"] = loadavg()
        res["finished_at"] = utc_now()
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as fh:
            json.dump(res, fh, indent=2, default=str)


def report(res: dict, output: str, print_results: Callable[[dict], None]) -> int:
    """Print ``res`` as JSON (``output == "json"``) or through ``print_results``; the exit status: 1 if a
    phase failed or a check did not hold."""
    if output == "json":
        print(json.dumps(res, indent=2, default=str))
    else:
        print_results(res)
    return 1 if res["errors"] or res["failed_checks"] else 0


# ----------------------------------------------------------------------- printing
def write_report(res: dict, json_path: str, text: str) -> None:
    """Write ``res`` as JSON to ``json_path`` (its directory made if need be), print ``text`` and where the
    JSON went."""
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as fh:
        json.dump(res, fh, indent=2, default=str)
    print(text)
    print(f"JSON: {json_path}")


def table(title: str, headers: list[str], rows: list[list]) -> str:
    """Right-aligned columns under a title; None prints as "-"."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) if cells else len(h) for i, h in enumerate(headers)]
    out = [title, "  ".join(h.rjust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def fmt_num(v, fmt=".2f", unit=""):
    """``v`` formatted with ``fmt`` plus ``unit``, or "-" for None."""
    return "-" if v is None else f"{v:{fmt}}{unit}"


def print_footer(res: dict) -> None:
    """Phase errors, failed checks (or "all checks passed"), total time and where the JSON went."""
    if res["errors"]:
        print("PHASE ERRORS:")
        for e in res["errors"]:
            print(f"  {e['phase']}: {e['error']}")
    if res["failed_checks"]:
        print("FAILED CHECKS:")
        for c in res["failed_checks"]:
            print(f"  {c}")
    if not res["errors"] and not res["failed_checks"]:
        print("all checks passed")
    print(f"total {res['total_s']:.0f} s; JSON: {res['params']['json']}")
