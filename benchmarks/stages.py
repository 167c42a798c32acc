"""Where one commit's time goes: workload 1 on a three-node cluster whose nodes run under this module
(``node``: the node's entry point with timing probes around the functions that begin each stage); per
stage of the leader and the followers, the median and mean time since the stage before (the stages:
docs/benchmarks.md).

    pidctl bench stages [--seconds S] [--quick] [--json FILE] [--keep]
"""
from __future__ import annotations

import asyncio
import atexit
import glob
import os
import shutil
import sys
import tempfile
import time

from quorum import journal, proposer, raft, raftlink, server, service
from quorum.__main__ import main as quorum_main
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from snapshots.storage import disk

from .common import HOST, percentile
from .harness import log, parser, quick_defaults
from .report import table, write_report

LEADER_STAGES = ("parsed", "batch", "proposed", "appended", "sent", "acked", "committed", "applied", "answered")
FOLLOWER_STAGES = ("received", "appended", "syncing", "synced", "acked")
EVENTS = "stages-{pid}.txt"  # in the node's working directory (the cluster's directory)
NODE_COMMAND = ["-m", "benchmarks.stages", "node"]


# --------------------------------------------------------------------------- in the node
def _install_probes(events: list) -> None:
    """Wrap the node's functions that begin or end a stage; each appends (stage, perf_counter_ns)."""
    now = time.perf_counter_ns

    def before(owner, name: str, stage: str, when=None) -> None:
        original = getattr(owner, name)

        def probe(*args, **kwargs):
            if when is None or when(*args):
                events.append((stage, now()))
            return original(*args, **kwargs)
        if isinstance(owner, type):
            setattr(owner, name, probe)
        else:
            object.__setattr__(owner, name, probe)  # the API table is a frozen dataclass

    def kind(message) -> str | None:
        return message.get("type") if isinstance(message, dict) else None

    before(server.SERVER_API, "parse", "parsed")
    before(proposer.Proposer, "_run_batch", "batch")
    before(raft.RaftNode, "propose", "proposed")
    before(journal.DurableJournal, "add", "appended")
    before(raft.Gate, "send", "sent", lambda self, node, message: kind(message) == "append_entries")
    before(raft.Replicated, "on_message", "acked",
           lambda self, node, message: kind(message) == "next_node_idx")
    before(raft.Replicated, "on_message", "received",
           lambda self, node, message: kind(message) == "append_entries" and bool(message.get("entries")))
    before(journal.DurableJournal, "setRaftCommitIndex", "committed")
    before(service.Service, "_apply", "applied")
    before(server.InOrder, "_flush", "answered")
    before(disk.AppendFile, "sync", "syncing")
    sync = disk.AppendFile.sync

    def synced(self):
        result = sync(self)
        events.append(("synced", now()))
        return result
    disk.AppendFile.sync = synced
    send = raftlink.Link.send

    def sent(self, message):
        result = send(self, message)
        if kind(message) == "next_node_idx":
            events.append(("acked_sent", now()))
        return result
    raftlink.Link.send = sent


def node_main(argv: list[str]) -> int:
    """Run a node (``python -m quorum``'s arguments) with the probes; write the events when it stops."""
    events: list[tuple[str, int]] = []
    _install_probes(events)

    def write() -> None:
        with open(EVENTS.format(pid=os.getpid()), "w") as f:
            f.writelines(f"{stage} {t}\n" for stage, t in events)
    atexit.register(write)
    sys.argv = ["python -m quorum", *argv]
    return quorum_main()


# --------------------------------------------------------------------------- analysis
def _segments(events: list[tuple[str, int]], first: str, stages: tuple[str, ...]) -> dict[str, list[float]]:
    """Per stage, the microseconds since the stage before it, for every segment (from one ``first`` to the
    next) in which each stage occurs, in order; a stage's first occurrence after the one before it counts."""
    out: dict[str, list[float]] = {s: [] for s in stages[1:]}
    starts = [i for i, (stage, _) in enumerate(events) if stage == first] + [len(events)]
    for a, b in zip(starts, starts[1:]):
        times, pos = [events[a][1]], 1
        for stage, t in events[a + 1:b]:
            if pos < len(stages) and stage == stages[pos] and t >= times[-1]:
                times.append(t)
                pos += 1
        if pos == len(stages):
            for stage, t0, t1 in zip(stages[1:], times, times[1:]):
                out[stage].append((t1 - t0) / 1000)
    return out


def _summary(per_stage: dict[str, list[float]]) -> list[dict]:
    rows = []
    for stage, values in per_stage.items():
        values = sorted(values)
        rows.append({"stage": stage, "count": len(values), "p50_us": percentile(values, 50),
                     "mean_us": sum(values) / len(values) if values else None})
    return rows


def analyse(directory: str) -> dict:
    """The leader's and the followers' stages from the event files the nodes wrote in ``directory``."""
    result: dict = {"leader": None, "followers": []}
    for path in sorted(glob.glob(os.path.join(directory, EVENTS.format(pid="*")))):
        with open(path) as f:
            events = [(stage, int(t)) for stage, t in (line.split() for line in f)]
        if sum(stage == "parsed" for stage, _ in events) > 100:
            result["leader"] = _summary(_segments(events, "parsed", LEADER_STAGES))
        else:
            follower = [(("acked" if stage == "acked_sent" else stage), t) for stage, t in events
                        if stage in ("received", "appended", "syncing", "synced", "acked_sent")]
            rows = _summary(_segments(follower, "received", FOLLOWER_STAGES))
            if rows[0]["count"]:
                result["followers"].append(rows)
    return result


# --------------------------------------------------------------------------- the run
async def _allocate(addresses: list[str], seconds: float, warmup: int) -> dict:
    client = QuorumClient(addresses, RetryPolicy(timeout=10, attempt_timeout=5), prefer_leader=True)
    try:
        epoch = await client.register_broker(1)
        for _ in range(warmup):
            await client.allocate(1, epoch)
        latencies = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            await client.allocate(1, epoch)
            latencies.append(time.perf_counter() - t0)
    finally:
        await client.close()
    latencies.sort()
    return {"allocations": len(latencies), "per_s": len(latencies) / seconds,
            "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000}


def run(seconds: float, directory: str, warmup: int = 200) -> dict:
    lc = LocalCluster(os.path.join(directory, "cluster"))
    lc.up(3, host=HOST, node_command=NODE_COMMAND, allocate_rate_per_broker=0)
    try:
        client = asyncio.run(_allocate(lc.client_addresses(), seconds, warmup))
    finally:
        lc.down()
    return {"client": client, **analyse(lc.dir)}


def render(res: dict) -> str:
    c = res["client"]
    out = [f"one broker, {c['allocations']} allocations: {c['per_s']:.0f}/s, p50 {c['p50_ms']:.3f} ms, "
           f"p99 {c['p99_ms']:.3f} ms (with the probes; the stage counts include the warm-up)"]
    fmt = [[r["stage"], r["count"], f"{r['p50_us']:.1f}" if r["count"] else None,
            f"{r['mean_us']:.1f}" if r["count"] else None] for r in res["leader"] or []]
    out.append(table("leader: microseconds since the stage before", ["stage", "count", "p50", "mean"], fmt))
    for i, rows in enumerate(res["followers"], 1):
        fmt = [[r["stage"], r["count"], f"{r['p50_us']:.1f}" if r["count"] else None,
                f"{r['mean_us']:.1f}" if r["count"] else None] for r in rows]
        out.append(table(f"follower {i}: microseconds since the stage before", ["stage", "count", "p50", "mean"],
                         fmt))
    return "\n\n".join(out)


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks.stages") -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["node"]:
        return node_main(argv[1:])
    ap = parser(prog, __doc__, raw=False)
    ap.add_argument("--seconds", type=float, default=None, help="measured seconds (default 8; 2 with --quick)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="allocations before the measured ones (default 200; 50 with --quick)")
    ap.add_argument("--quick", action="store_true", help="2 s after 50 allocations (explicit options still win)")
    ap.add_argument("--json", default=os.path.join("bench-results", "stages.json"))
    ap.add_argument("--keep", action="store_true", help="keep the cluster's directory (and the event files)")
    a = ap.parse_args(argv)
    quick_defaults(a, {"seconds": (8.0, 2.0), "warmup": (200, 50)})
    if a.seconds <= 0 or a.warmup < 0:
        ap.error("--seconds must be positive and --warmup not negative")
    directory = tempfile.mkdtemp(prefix="pidquorum-stages-")
    try:
        log(f"one broker for {a.seconds:.0f}s on a three-node cluster with probes ({directory})")
        res = run(a.seconds, directory, a.warmup)
    finally:
        if not a.keep:
            shutil.rmtree(directory, ignore_errors=True)
    if res["leader"] is None:
        print("no node recorded a leader's stages (did the cluster elect a leader?)", file=sys.stderr)
        return 1
    write_report(res, a.json, render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
