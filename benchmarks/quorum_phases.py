"""End-to-end benchmark of a local three-node pidquorum: sequential allocations with and without fsync,
concurrent allocations, leader kills under load, and a whole-cluster restart after a large history
(the comparison, ``pidctl bench``, reuses that last phase: ``benchmarks.quorum_history``).  What each
phase does and checks: docs/benchmarks.md.

    pidctl bench quorum [--quick] [--json bench-results/quorum.json]
                        [--duration 5] [--kills 12] [--history 1000000]
"""
from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import sys
import time
from collections import Counter
from importlib.metadata import version

from quorum.client.quorum import QuorumClient
from quorum.localcluster import LocalCluster
from quorum.raft import RaftConfig

from .common import HOST, describe_all, median, percentile
from .harness import exit_status, log, new_results, parser, quick_defaults, run_phases
from .quorum_cluster import (
    CLUSTER_OPTIONS,
    DESCRIBE_POLICY,
    FAILOVER_POLICY,
    NO_FSYNC,
    THROUGHPUT_POLICY,
    Bench,
    check_disjoint,
    check_increasing,
    find_leader_address,
    leader_first,
    r,
    summarize_ms,
    wait_converged,
)
from .quorum_history import phase_history
from .report import print_footer, table


# ------------------------------------------------------------- throughput runs
class Load:
    """n_clients asyncio tasks, each its own broker id and QuorumClient (leader first), allocating back to back.

    ``run(seconds)`` is one measured slice: the tasks stop issuing at the
    slice's end, and the slice's time is from its start until the last call
    issued in it returns, so every completed call counts (no call is cut at a
    boundary).  Every block returned, warm-up included, is kept for the
    disjointness check.
    """

    def __init__(self, lc: LocalCluster, n_clients: int, label: str):
        self.lc, self.n, self.label = lc, n_clients, label
        self.starts: array.array = array.array("q")
        self.lengths: array.array = array.array("q")
        self.latencies: list[float] = []
        self.measured_s = 0.0
        self.slices = 0
        self.served: Counter = Counter()
        self.errors: Counter = Counter()
        self.clients: list[QuorumClient] = []
        self.counters_before: dict | None = None
        self.counters_after: dict | None = None

    async def setup(self) -> None:
        self.leader_id, self.leader_addr = await find_leader_address(self.lc)
        addrs = leader_first(self.lc, self.leader_addr)
        self.clients = [QuorumClient(list(addrs), THROUGHPUT_POLICY, client_id=f"bench-{self.label}-{i}")
                        for i in range(self.n)]
        self.epochs = await asyncio.gather(*(c.register_broker(i + 1) for i, c in enumerate(self.clients)))

    async def leader_counters(self) -> dict | None:
        return (await describe_all(self.lc, DESCRIBE_POLICY)).get(self.leader_id)

    async def run(self, seconds: float, record: bool = True) -> None:
        t_start = time.perf_counter()
        t_stop = t_start + seconds
        lat: list[float] = []

        async def worker(i: int) -> None:
            c, epoch = self.clients[i], self.epochs[i]
            while True:
                t0 = time.perf_counter()
                if t0 >= t_stop:
                    return
                try:
                    b = await c.allocate(i + 1, epoch)
                except Exception as e:  # noqa: BLE001 - count it and go on
                    self.errors[type(e).__name__] += 1
                    continue
                lat.append(time.perf_counter() - t0)
                self.starts.append(b.start)
                self.lengths.append(b.length)
                if record:
                    self.served[b.node] += 1

        await asyncio.gather(*(worker(i) for i in range(self.n)))
        if record:
            self.measured_s += time.perf_counter() - t_start
            self.latencies += lat
            self.slices += 1

    async def close(self) -> None:
        for c in self.clients:
            await c.close()

    def result(self) -> dict:
        n = len(self.latencies)
        out = {"clients": self.n, "measured_s": self.measured_s, "slices": self.slices, "blocks_measured": n,
               "blocks_per_s": n / self.measured_s if self.measured_s else 0.0,
               "latency": summarize_ms(self.latencies), "errors": dict(self.errors),
               "leader_node_id": self.leader_id, "served_by": dict(self.served),
               "served_by_leader_fraction": self.served[self.leader_addr] / n if n else None,
               "disjoint_check": check_disjoint(self.starts, self.lengths)}
        b, a = self.counters_before, self.counters_after
        if b and a:
            batches = a["proposer"]["batches"] - b["proposer"]["batches"]
            records = a["proposer"]["records"] - b["proposer"]["records"]
            out["leader_counters"] = {
                "raft_entries": batches, "records": records,
                "records_per_entry": records / batches if batches else None,
                "journal_syncs": a["raft"]["journal_syncs"] - b["raft"]["journal_syncs"],
                "note": "the leader's proposer and journal counters over the measured slices"}
        return out


async def phase_sequential(bench: Bench) -> dict:
    """Both clusters (fsync / no fsync) run side by side and are measured in alternating
    slices, so that the machine's noise falls on both alike."""
    a = bench.args
    log(f"phase 1: one broker, sequential, fsync vs no fsync (chaos.faultnode --no-fsync), {a.duration}s each "
        f"in alternating {a.slice}s slices")
    configs = (("fsync", {}), ("no_fsync", NO_FSYNC))
    out: dict = {}
    with contextlib.ExitStack() as stack:
        loads = {}
        for label, options in configs:
            lc = stack.enter_context(bench.cluster(f"seq-{label}", **options))
            loads[label] = Load(lc, 1, f"seq-{label}")
        try:
            for load in loads.values():
                await load.setup()
                await load.run(a.warmup, record=False)
                load.counters_before = await load.leader_counters()
            n_slices = max(1, round(a.duration / a.slice))
            for i in range(n_slices):
                order = list(loads.values()) if i % 2 == 0 else list(loads.values())[::-1]
                for load in order:
                    await load.run(a.duration / n_slices)
            for load in loads.values():
                load.counters_after = await load.leader_counters()
        finally:
            for load in loads.values():
                await load.close()
        for label, env in configs:
            res = loads[label].result()
            res["env"] = env or {}
            out[label] = res
            if not res["disjoint_check"]["disjoint"]:
                bench.failures.append(f"sequential {label}: blocks overlap")
    f, n = out["fsync"], out["no_fsync"]
    fl, nl = f["latency"]["p50_ms"], n["latency"]["p50_ms"]
    out["method"] = (f"two clusters up at once, {n_slices} alternating slices of "
                     f"{a.duration / n_slices:.2f}s each per cluster, after {a.warmup}s warm-up each")
    out["durability_cost"] = {
        "throughput_ratio_no_fsync_over_fsync": n["blocks_per_s"] / f["blocks_per_s"] if f["blocks_per_s"] else None,
        "p50_latency_ratio_fsync_over_no_fsync": fl / nl if fl and nl else None,
        "p50_extra_ms_per_block": fl - nl if fl is not None and nl is not None else None,
    }
    return out


async def phase_concurrent(bench: Bench) -> dict:
    a = bench.args
    out = {}
    for n_clients in (3, a.many_clients):
        log(f"phase 2: {n_clients} concurrent clients, {a.duration}s")
        with bench.cluster(f"conc-{n_clients}") as lc:
            load = Load(lc, n_clients, f"conc{n_clients}")
            try:
                await load.setup()
                await load.run(a.warmup, record=False)
                load.counters_before = await load.leader_counters()
                await load.run(a.duration)
                load.counters_after = await load.leader_counters()
            finally:
                await load.close()
        res = load.result()
        out[f"clients_{n_clients}"] = res
        if not res["disjoint_check"]["disjoint"]:
            bench.failures.append(f"concurrent {n_clients}: blocks overlap")
    return out


# ------------------------------------------------------------------ leader kill
async def phase_kills(bench: Bench) -> dict:
    a = bench.args
    log(f"phase 3: {a.kills} leader kills")
    rounds = []
    blocks: list[tuple[int, int]] = []
    with bench.cluster("kills") as lc:
        reg = QuorumClient(lc.client_addresses(), FAILOVER_POLICY)
        epoch = await reg.register_broker(1)
        await reg.close()
        for i in range(a.kills):
            pre = await wait_converged(lc, a.catchup_timeout)
            # The client talks to the leader when it dies: a fresh client, leader first,
            # warmed by one allocation that the leader itself must have served.
            for attempt in range(5):
                leader_id, leader_addr = await find_leader_address(lc)
                c = QuorumClient(leader_first(lc, leader_addr), FAILOVER_POLICY, client_id=f"bench-kill-{i}")
                b = await c.allocate(1, epoch)
                blocks.append((b.start, b.length))
                if b.node == leader_addr or attempt == 4:
                    break
                await c.close()
            on_leader = b.node == leader_addr
            t0 = time.perf_counter()
            lc.kill(leader_id)
            t_killed = time.perf_counter()
            try:
                b = await c.allocate(1, epoch)
            finally:
                await c.close()
            t1 = time.perf_counter()
            blocks.append((b.start, b.length))
            outage = t1 - t0
            new_leader, _ = await find_leader_address(lc)
            t_start = time.perf_counter()
            lc.start(leader_id)
            lc.wait_ready([leader_id], timeout=60)
            t_ready = time.perf_counter()
            conv = await wait_converged(lc, a.catchup_timeout)
            t_conv = time.perf_counter()
            answered_by = next((n.node_id for n in lc.nodes() if n.client_address == b.node), None)
            rnd = {"round": i + 1, "killed_node": leader_id, "outage_s": outage,
                   "kill_call_s": t_killed - t0, "first_block_after_kill": [b.start, b.length],
                   "client_was_on_leader": on_leader,
                   "answered_by_node": answered_by, "new_leader": new_leader, "restart_ready_s": t_ready - t_start,
                   "catchup_ok": conv["ok"], "catchup_s": t_conv - t_start,
                   "catchup_after_ready_s": t_conv - t_ready, "pre_kill_converged": pre["ok"]}
            if not conv["ok"]:
                rnd["catchup_state"] = conv.get("nodes")
                bench.failures.append(f"leader kill round {i + 1}: no catch-up within {a.catchup_timeout}s")
            rounds.append(rnd)
            log(f"  kill {i + 1}/{a.kills}: node {leader_id} killed, outage {outage * 1000:.0f} ms, "
                f"new leader node {new_leader}, catch-up {rnd['catchup_s'] * 1000:.0f} ms "
                f"({'ok' if conv['ok'] else 'TIMED OUT'})")
    outages = sorted(x["outage_s"] for x in rounds)
    catchups = sorted(x["catchup_s"] for x in rounds if x["catchup_ok"])
    readies = sorted(x["restart_ready_s"] for x in rounds)
    inc = check_increasing(blocks)
    dis = check_disjoint([s for s, _ in blocks], [n for _, n in blocks])
    if not inc["increasing"]:
        bench.failures.append("leader kill: blocks not increasing")
    if not dis["disjoint"]:
        bench.failures.append("leader kill: blocks overlap")
    ms = lambda v: None if v is None else v * 1000  # noqa: E731
    return {"kills": a.kills, "client_policy": dataclasses.asdict(FAILOVER_POLICY),
            "outage_ms": {"median": ms(median(outages)), "p90": ms(percentile(outages, 90)),
                          "min": ms(outages[0]) if outages else None, "max": ms(outages[-1]) if outages else None},
            "catchup_ms": {"median": ms(median(catchups)), "max": ms(catchups[-1]) if catchups else None,
                           "ok_rounds": len(catchups)},
            "restart_ready_ms": {"median": ms(median(readies))},
            "increasing_check": inc, "disjoint_check": dis, "rounds": rounds,
            "definitions": {"outage": "SIGKILL of the leader -> next allocate() returns (client was on the leader)",
                            "catchup": "lc.start of the killed node -> every node reports equal commit_index, "
                                       "last_applied, applied_index and next_producer_id"}}


# ------------------------------------------------------------------- printing
def snap_desc(row: dict) -> str:
    sc = [f["snapshot_contents"] for f in row["files_bytes"].values() if f.get("snapshot_contents")]
    if not sc:
        return f"- (log < {row['compaction_min_entries']} entries)"
    x = max(sc, key=lambda c: c.get("records", 0))
    return f"{x.get('records')} recs / {x.get('embedded_entry_bytes')} B" if "records" in x else x["error"]


def ms0(v) -> str:
    return "-" if v is None else f"{v:.0f} ms"


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def print_results(results: dict) -> None:
    ph = results["phases"]
    p = results["params"]
    env = results["environment"]
    print()
    print(f"pidquorum benchmark  ({'quick' if p['quick'] else 'full'} run; {env['cpu_count']} CPUs, "
          f"Python {env['python']}, load avg at start {env['loadavg_start']})")
    print()
    tp_rows = []
    for key, label in (("fsync", "1 broker seq, fsync"), ("no_fsync", "1 broker seq, NO fsync")):
        x = ph.get("sequential", {}).get(key)
        if x:
            tp_rows.append((label, x))
    for key, x in ph.get("concurrent", {}).items():
        tp_rows.append((f"{x['clients']} clients concurrent, fsync", x))
    if tp_rows:
        rows = []
        for label, x in tp_rows:
            lat = x["latency"]
            lc = x.get("leader_counters") or {}
            rows.append([label, f"{x['blocks_per_s']:.0f}", r(lat["p50_ms"], 2), r(lat["p99_ms"], 2),
                         r(lat["max_ms"], 1), r(lc.get("records_per_entry"), 1), x["blocks_measured"],
                         sum(x["errors"].values()), "ok" if x["disjoint_check"]["disjoint"] else "OVERLAP"])
        print(table(f"Throughput (~{p['duration_s']}s measured per row; AllocateProducerIds over the wire, "
                    f"clients on the leader; rate limit off)",
                    ["run", "blocks/s", "p50 ms", "p99 ms", "max ms", "recs/entry", "blocks", "errors",
                     "disjoint"], rows))
        dc = ph.get("sequential", {}).get("durability_cost")
        if dc and dc["throughput_ratio_no_fsync_over_fsync"]:
            print(f"durability cost (same run): no-fsync / fsync throughput = "
                  f"{dc['throughput_ratio_no_fsync_over_fsync']:.2f}x; p50 latency fsync / no-fsync = "
                  f"{dc['p50_latency_ratio_fsync_over_no_fsync']:.2f}x "
                  f"(+{dc['p50_extra_ms_per_block']:.2f} ms per block)")
        print()
    k = ph.get("leader_kill")
    if k:
        o, c = k["outage_ms"], k["catchup_ms"]
        print(table(f"Leader kill -9 ({k['kills']} rounds; outage = kill -> next allocate returns)",
                    ["outage median", "p90", "min", "max", "catch-up median", "catch-up max", "catch-up ok",
                     "increasing", "disjoint"],
                    [[ms0(o["median"]), ms0(o["p90"]), ms0(o["min"]), ms0(o["max"]), ms0(c["median"]),
                      ms0(c["max"]),
                      f"{c['ok_rounds']}/{k['kills']}",
                      "ok" if k["increasing_check"]["increasing"] else "NO",
                      "ok" if k["disjoint_check"]["disjoint"] else "OVERLAP"]]))
        print("  per round outage ms: " + ", ".join(f"{x['outage_s'] * 1000:.0f}" for x in k["rounds"]))
        print(f"  catch-up = lc.start of the killed node -> every node reports the same commit/applied index; "
              f"of which process start to ready: median {ms0(k['restart_ready_ms']['median'])}")
        print()
    h = ph.get("history")
    if h and h["rows"]:
        rows_ = h["rows"]
        names = [f"history {x['history_target']:,}" for x in rows_]
        lines = [
            ("allocations reached", [f"{x['reached']:,}" + ("" if x["complete"] else " (INCOMPLETE)") for x in rows_]),
            ("fill time / rate", [f"{x['fill_s']:.1f} s / {x['fill_rate_per_s'] or 0:,.0f}/s" for x in rows_]),
            ("raft.snapshot (max node)", [fmt_bytes(x["snapshot_bytes_max"]) if x["snapshot_bytes_max"] else
                                          "none yet" for x in rows_]),
            ("snapshot records / entry bytes", [snap_desc(x) for x in rows_]),
            ("snapshots written per node", [", ".join(str(v) for v in x["snapshots_written"].values())
                                            for x in rows_]),
            ("raft.journal (max node)", [fmt_bytes(x["journal_bytes_max"]) for x in rows_]),
            ("audit.log (max node)", [fmt_bytes(x["audit_bytes_max"]) for x in rows_]),
            ("journal entries at stop", [", ".join(str(v) for v in x["journal_entries_before_stop"].values())
                                         for x in rows_]),
            ("up() until all ready", [f"{x['up_s']:.2f} s" for x in rows_]),
            ("restart -> first allocation", [f"{x['restart_to_first_allocation_s']:.2f} s" for x in rows_]),
            ("new block above all earlier", ["ok" if x["after_restart_above_every_earlier_block"] else "NO"
                                             for x in rows_]),
            ("fill blocks disjoint", ["ok" if x["fill_disjoint_check"]["disjoint"] else "OVERLAP" for x in rows_]),
        ]
        print(table("Snapshot size and restart time vs history", ["", *names],
                    [[label, *vals] for label, vals in lines]))
        for x in rows_:
            if not x["complete"]:
                print(f"  NOTE: history {x['history_target']:,} was NOT reached: the fill stopped at the "
                      f"{x['cap_s']:.0f} s cap after {x['reached']:,} allocations "
                      f"({x['fill_rate_per_s']:,.0f}/s; the full fill would take ~"
                      f"{x['projected_full_fill_s']:.0f} s at that rate). The row shows what was reached.")
        print()
    print_footer(results)


# ----------------------------------------------------------------------- main
def parse_args(argv=None, prog: str | None = None):
    ap = parser(prog, __doc__)
    ap.add_argument("--quick", action="store_true",
                    help="short run: 1.5 s windows, 3 kills, history 50,000 (explicit options still win)")
    ap.add_argument("--json", default="bench-results/quorum.json", help="where to write the results")
    ap.add_argument("--duration", type=float, default=None, help="seconds per throughput window (default 5)")
    ap.add_argument("--warmup", type=float, default=None, help="warm-up seconds before each window (default 0.5)")
    ap.add_argument("--slice", type=float, default=0.5,
                    help="phase 1 alternates fsync / no-fsync clusters in slices of this many seconds")
    ap.add_argument("--kills", type=int, default=None, help="leader kills in phase 3 (default 12)")
    ap.add_argument("--history", type=int, default=None,
                    help="large history size for phase 4 (default 1,000,000; 50,000 with --quick)")
    ap.add_argument("--fill-clients", type=int, default=64, help="concurrent tasks filling the history")
    ap.add_argument("--fill-cap", type=float, default=240.0, help="cap on one fill, seconds")
    ap.add_argument("--many-clients", type=int, default=32, help="the batching variant of phase 2")
    ap.add_argument("--catchup-timeout", type=float, default=30.0, help="deadline for nodes to agree, seconds")
    ap.add_argument("--phases", default="1,2,3,4",
                    help="comma-separated subset of phases to run, by number or name "
                         "(sequential, concurrent, leader_kill, history)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster directories")
    a = ap.parse_args(argv)
    quick_defaults(a, {"duration": (5.0, 1.5), "warmup": (0.5, 0.3), "kills": (12, 3), "history": (1_000_000, 50_000)})
    names = {"sequential": 1, "concurrent": 2, "leader_kill": 3, "history": 4}
    chosen = set()
    for x in (x.strip() for x in a.phases.split(",")):
        if not x:
            continue
        n = names.get(x) or (int(x) if x.isdigit() else None)
        if n not in names.values():
            ap.error(f"--phases: unknown phase {x!r} (use 1-4 or {', '.join(names)})")
        chosen.add(n)
    a.phases = sorted(chosen)
    return a


def main(argv=None, prog: str | None = None) -> int:
    a = parse_args(argv, prog)
    bench = Bench(a)
    results = new_results({
        "quick": a.quick, "json": a.json, "duration_s": a.duration, "warmup_s": a.warmup, "slice_s": a.slice,
        "kills": a.kills, "history_sizes": [10, a.history], "fill_clients": a.fill_clients,
        "fill_cap_s": a.fill_cap, "many_clients": a.many_clients, "catchup_timeout_s": a.catchup_timeout,
        "phases": a.phases, "nodes": 3, "host": HOST, "cluster_options": CLUSTER_OPTIONS,
        "block_size": 1000, "raft": dataclasses.asdict(RaftConfig()),
        "throughput_policy": dataclasses.asdict(THROUGHPUT_POLICY),
        "failover_policy": dataclasses.asdict(FAILOVER_POLICY),
        "percentiles": "nearest rank over sorted samples; median = middle (mean of two)",
        "argv": sys.argv})
    results["failed_checks"] = bench.failures  # the phases add to it as they go
    try:
        results["environment"]["pysyncobj"] = version("pysyncobj")
    except Exception:  # noqa: BLE001
        pass
    phases = {1: ("sequential", phase_sequential), 2: ("concurrent", phase_concurrent),
              3: ("leader_kill", phase_kills), 4: ("history", phase_history)}
    run_phases(results, [phases[number] for number in a.phases], bench, a.json)
    print_results(results)
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
