"""``pidctl bench``: pidquorum against ZooKeeper and etcd, side by side, in one run: every system a
three-node cluster on 127.0.0.1 (``benchmarks.systems``) up for the whole run, each workload run against
each in turn by client processes (``benchmarks.worker``); the table and chart are
``benchmarks.run_report``'s.  The workloads and how they are judged: docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field

from . import floor
from .common import median, percentile
from .harness import environment_info, loadavg, log, utc_now, write_json
from .processes import child_env, cpu_seconds
from .quorum_cluster import Bench as QBench
from .quorum_history import history_row
from .report import summarize_ms
from .run_report import draw_chart
from .systems import (
    RESERVE_BLOCKS,
    SYSTEMS,
    SystemUnavailable,
    install_packages,
    make_system,
    missing_reason,
    package_version,
)

BROKERS = 3
RESTART_AFTER_S = 1.5
KILL_PERIOD_S = 4.0
MANAGER_BROKER_ID = 100


@dataclass
class BenchOptions:
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    duration: float = 10.0
    out_dir: str = "bench-results"
    kills: int = 5
    history: int = 1_000_000
    fill_cap: float = 600.0
    fill_clients: int = 64
    manager_rate: float = 20_000.0
    workloads: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    install_peers: bool = False
    keep: bool = False
    reserve_blocks: int = RESERVE_BLOCKS  # pidquorum's allocate_reserve_blocks (0: the node default, no reserve)


# ------------------------------------------------------------------ workers
def _worker_cmd(system: str, endpoints: str, broker_id: int, out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.worker", "--system", system, "--endpoints", endpoints,
            "--broker-id", str(broker_id), "--out", out, *extra]


class Workers:
    """Worker processes that have said READY; ``go(start, stop)`` releases them; ``collect()`` their JSON."""

    def __init__(self, cmds: list[tuple[list[str], str]], ready_timeout: float = 120.0):
        self.procs: list[tuple[subprocess.Popen, str]] = []
        env = child_env()  # this checkout first on PYTHONPATH
        for cmd, out in cmds:
            with open(out + ".log", "w") as errf:  # a file, not a pipe: kazoo's failover chatter must not block
                p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, text=True,
                                     env=env)
            self.procs.append((p, out))
        deadline = time.monotonic() + ready_timeout
        for p, _ in self.procs:
            line = p.stdout.readline().strip()  # blocks until READY or exit
            if line != "READY" or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"worker {' '.join(p.args[3:9])} did not start: {line!r} {_tail(p.args)}")

    def go(self, start: float, stop: float) -> None:
        for p, _ in self.procs:
            p.stdin.write(f"GO {start} {stop}\n")
            p.stdin.flush()

    def collect(self, timeout: float) -> list[dict]:
        out = []
        deadline = time.monotonic() + timeout
        for p, path in self.procs:
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise RuntimeError(f"worker {path} did not finish in time")
            if p.returncode != 0:
                raise RuntimeError(f"worker {path} exited {p.returncode}: {_tail(p.args)}")
            with open(path) as f:
                out.append(json.load(f))
        return out

    def kill(self) -> None:
        for p, _ in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def _tail(args: list[str]) -> str:
    try:
        with open(args[args.index("--out") + 1] + ".log", errors="replace") as f:
            return f.read()[-2000:]
    except (OSError, ValueError):
        return ""


# ------------------------------------------------------------------ figures
def _ms(v):
    return None if v is None else v * 1000.0


def check_disjoint(blocks: list[tuple[int, int]]) -> dict:
    """Every block returned to any broker is disjoint from every other (the peers are checked too)."""
    blocks = sorted(blocks)
    overlaps = sum(1 for a, b in zip(blocks, blocks[1:]) if b[0] < a[0] + a[1])
    return {"blocks": len(blocks), "disjoint": overlaps == 0, "overlaps": overlaps}


def throughput(records: list[dict], window: tuple[float, float]) -> dict:
    lat, blocks, retries = [], [], 0
    errors: dict[str, int] = {}
    for r in records:
        lat += [b - a for a, b in zip(r["t0"], r["t1"])]
        blocks += list(zip(r["start"], r["length"]))
        retries += sum(r["retries"])
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    # Calls issued before the stop all count; the time runs until the last of them returned.
    end = max([window[1], *(r["t1"][-1] for r in records if r["t1"])])
    elapsed = end - window[0]
    n = len(lat)
    return {"brokers": len(records), "blocks": n, "seconds": elapsed, "blocks_per_s": n / elapsed if elapsed else 0.0,
            "latency": summarize_ms(lat, with_min=False, with_mean=False), "cas_retries_per_block": retries / n if n else None,
            "errors": errors, "disjoint_check": check_disjoint(blocks)}


def outage_of(records: list[dict], t_kill: float, window: float = KILL_PERIOD_S) -> float | None:
    """The longest time one broker went without a block because of the kill at ``t_kill``.

    Per broker: the longest gap between consecutive completions among those that end within
    ``window`` s after the kill (a gap may start before it: an answer already on its way when the
    leader died arrives just after the kill and must not hide the wait that follows).  The worst
    broker's figure; inf if some broker got no block at all after the kill; None if no broker ran."""
    worst = None
    for r in records:
        t1 = r["t1"]
        if not t1 or t1[0] > t_kill:
            continue
        prev = None
        best = None
        after = False
        for t in t1:
            if t > t_kill + window:
                if not after:  # nothing in the window: the gap runs to the first completion after it
                    best = t - prev
                    after = True
                break
            if t >= t_kill and prev is not None:
                after = True
                best = t - prev if best is None else max(best, t - prev)
            prev = t
        if not after:
            best = math.inf
        worst = best if worst is None else max(worst, best)
    return worst


# ------------------------------------------------------------------ the run
class Bench:
    def __init__(self, opts: BenchOptions, say=log):
        self.o = opts
        self.say = say
        self.tmp = os.path.join(os.path.abspath(opts.out_dir), "workers")
        os.makedirs(self.tmp, exist_ok=True)
        self.loads: list[dict] = []
        self.busy_warnings: list[str] = []

    def note_load(self, scenario: str) -> dict:
        la = loadavg()
        cpus = os.cpu_count() or 1
        entry = {"scenario": scenario, "loadavg": la, "cpus": cpus, "busy": la[0] > cpus, "at": utc_now()}
        self.loads.append(entry)
        if entry["busy"]:
            msg = (f"WARNING: the machine was busy before {scenario}: load average {la[0]:.2f} on {cpus} CPUs; "
                   f"figures are noisy, compare systems within this run only")
            self.busy_warnings.append(msg)
            self.say(msg)
        return entry

    def _out(self, tag: str) -> str:
        return os.path.join(self.tmp, f"{tag}.json")

    def allocate_run(self, sys_, tag: str, n_brokers: int, seconds: float, during=None, extra_workers=()):
        """n_brokers allocating workers (+ extra (cmd, out) workers); ``during(start, stop)`` runs meanwhile."""
        eps = sys_.endpoints()
        cmds = [(_worker_cmd(sys_.name, eps, i + 1, self._out(f"{tag}-{i + 1}")), self._out(f"{tag}-{i + 1}"))
                for i in range(n_brokers)]
        w = Workers(cmds + list(extra_workers))
        try:
            start = time.monotonic() + 0.3
            stop = start + seconds
            w.go(start, stop)
            extra = during(start, stop) if during is not None else None
            recs = w.collect(seconds + 120)
        finally:
            w.kill()
        return recs[:n_brokers], recs[n_brokers:], (start, stop), extra

    # -- workloads 1 and 2
    def w_throughput(self, sys_, n_brokers: int) -> dict:
        label = "w1" if n_brokers == 1 else "w2"
        load = self.note_load(f"{label} {sys_.name}")
        self.say(f"{label}: {sys_.name}, {n_brokers} broker(s), {self.o.duration:.0f}s")
        pids, counts = sys_.node_pids(), sys_.raft_counts()
        cpu0 = {pid: cpu_seconds(pid) for pid in pids}
        recs, _, window, _ = self.allocate_run(sys_, f"{label}-{sys_.name}", n_brokers, self.o.duration)
        res = {**throughput(recs, window), "load_before": load["loadavg"]}
        # What a block costs the cluster: its nodes' CPU (user + system, all nodes) over the run.
        after = {pid: cpu_seconds(pid) for pid in pids}  # a node gone meanwhile (none is, without faults): left out
        cpu = sum(after[pid] - cpu0[pid] for pid in pids if after[pid] is not None and cpu0[pid] is not None)
        res["node_cpu_s"] = cpu
        res["node_cpu_ms_per_block"] = cpu * 1000 / res["blocks"] if res["blocks"] else None
        if counts is not None:  # elections with no fault injected: each one is spurious
            after = sys_.raft_counts()
            res["terms_started"] = max((after[i][0] - t for i, (t, _) in counts.items() if i in after), default=None)
            res["leader_changes"] = max((after[i][1] - c for i, (_, c) in counts.items() if i in after),
                                        default=None)
        return res

    # -- workload 3 (+ 4b for pidquorum)
    def w_kills(self, sys_) -> dict:
        load = self.note_load(f"w3 {sys_.name}")
        kills = self.o.kills
        seconds = 1.0 + kills * KILL_PERIOD_S + 3.0
        self.say(f"w3: {sys_.name}, {BROKERS} brokers, {kills} leader kill(s) in {seconds:.0f}s")
        extra = []
        if sys_.name == "pidquorum":
            out = self._out(f"w4b-{sys_.name}")
            extra.append((_worker_cmd(sys_.name, sys_.endpoints(), MANAGER_BROKER_ID, out, "--mode", "manager",
                                      "--rate", str(self.o.manager_rate)), out))
        rounds: list[dict] = []

        def during(start, stop):
            for i in range(kills):
                due = start + 1.0 + i * KILL_PERIOD_S
                time.sleep(max(0.0, due - time.monotonic()))
                if time.monotonic() + RESTART_AFTER_S + 3.0 > stop:
                    break  # a slow restart ate the time: a kill now could not be measured
                t_find = time.monotonic()
                leader = sys_.leader(20.0)
                t_kill = time.monotonic()
                sys_.kill(leader)
                time.sleep(max(0.0, t_kill + RESTART_AFTER_S - time.monotonic()))
                t_restart = time.monotonic()
                sys_.restart(leader, 60.0)
                rounds.append({"node": leader, "t_kill": t_kill, "late_s": t_kill - due,
                               "leader_search_s": t_kill - t_find, "restart_ready_s": time.monotonic() - t_restart})

        recs, mgr, window, _ = self.allocate_run(sys_, f"w3-{sys_.name}", BROKERS, seconds, during, extra)
        outages = []
        for r in rounds:
            o = outage_of(recs, r["t_kill"])
            r["no_block_after_kill"] = o is not None and math.isinf(o)  # until the run's end
            r["outage_s"] = None if o is None or math.isinf(o) else o
            if o is not None:
                outages.append(o)
        med, worst = median(outages), (max(outages) if outages else None)
        # JSON has no infinity: an unbounded outage is null with outage_unbounded set.
        res = {**throughput(recs, window), "kills": len(rounds), "rounds": rounds,
               "outage_median_ms": None if med is None or math.isinf(med) else _ms(med),
               "outage_max_ms": None if worst is None or math.isinf(worst) else _ms(worst),
               "outage_unbounded": any(r["no_block_after_kill"] for r in rounds), "load_before": load["loadavg"]}
        if mgr:
            res["manager"] = manager_summary(mgr[0])
        return res

    # -- workload 4a
    def w_generate(self, sys_) -> dict:
        load = self.note_load("w4 pidquorum")
        self.say(f"w4: generate_producer_id() at a broker, {self.o.manager_rate:,.0f} IDs/s for {self.o.duration:.0f}s")
        out = self._out("w4a-pidquorum")
        w = Workers([(_worker_cmd("pidquorum", sys_.endpoints(), MANAGER_BROKER_ID + 1, out, "--mode", "manager",
                                  "--rate", str(self.o.manager_rate)), out)])
        try:
            start = time.monotonic() + 0.2
            w.go(start, start + self.o.duration)
            rec = w.collect(self.o.duration + 120)[0]
        finally:
            w.kill()
        return {**manager_summary(rec), "load_before": load["loadavg"]}

    # -- workload 5
    def w_history(self) -> dict:
        rows = []
        for target in (10, self.o.history):
            self.note_load(f"w5 history {target}")
            self.say(f"w5: pidquorum history of {target:,} allocations (fill cap {self.o.fill_cap:.0f}s)")
            qb = QBench(argparse.Namespace(fill_clients=self.o.fill_clients, fill_cap=self.o.fill_cap,
                                           catchup_timeout=60.0, keep=self.o.keep))
            row = asyncio.run(history_row(qb, target, snapshot_before_stop=True))
            row["failures"] = list(qb.failures)
            rows.append(row)
        keep = ("history_target", "reached", "complete", "fill_s", "fill_rate_per_s", "up_s",
                "restart_to_first_allocation_s", "snapshot_bytes_max", "journal_bytes_max", "audit_bytes_max",
                "snapshots_written", "journal_entries_before_stop", "after_restart_above_every_earlier_block",
                "snapshot_before_stop", "registered_brokers",
                "compaction_min_entries", "failures")
        return {"rows": [{k: r.get(k) for k in keep} for r in rows]}


def manager_summary(rec: dict) -> dict:
    lat = sorted(rec["latency_ns"])
    us = lambda v: None if v is None else v / 1000.0  # noqa: E731
    return {"calls": len(lat), "ids": rec["ids"], "rate_ids_per_s": rec["rate"],
            "p50_us": us(percentile(lat, 50)), "p99_us": us(percentile(lat, 99)),
            "p99_9_us": us(percentile(lat, 99.9)), "max_us": us(lat[-1]) if lat else None,
            "timer_pair_us": us(rec["timer_pair_ns"]), "client_visible_waits": rec["refusals"],
            "longest_without_id_ms": rec["max_dry_s"] * 1000.0, "ids_increasing": rec["ids_increasing"],
            "manager_stats": rec.get("manager_stats")}


def evaluate_targets(res: dict) -> list[dict]:
    s = res["systems"]
    pq, zk = s.get("pidquorum", {}), s.get("zookeeper", {})
    out = []

    def target(name, holds, detail):
        out.append({"target": name, "holds": holds, "detail": detail})

    def g(d, *path):
        for p in path:
            if not isinstance(d, dict):
                return None
            d = d.get(p)
        return d

    # The commit path's targets (default configuration, no reserve); ZooKeeper's figures from the same run.
    a, b, p50 = g(pq, "w1", "blocks_per_s"), g(zk, "w1", "blocks_per_s"), g(pq, "w1", "latency", "p50_ms")
    if None not in (a, b, p50):
        target("w1: pidquorum blocks/s >= 3x ZooKeeper's, p50 <= 1 ms", a >= 3 * b and p50 <= 1.0,
               f"{a:,.0f} vs {b:,.0f} blocks/s ({a / b:.2f}x); p50 {p50:.2f} ms")
    a, b = g(pq, "w2", "blocks_per_s"), g(zk, "w2", "blocks_per_s")
    pa, pb = g(pq, "w2", "latency", "p99_ms"), g(zk, "w2", "latency", "p99_ms")
    if None not in (a, b, pa, pb):
        target("w2: pidquorum blocks/s >= 5x ZooKeeper's, p99 no higher", a >= 5 * b and pa <= pb,
               f"{a:,.0f} vs {b:,.0f} blocks/s ({a / b:.2f}x); p99 {pa:.2f} vs {pb:.2f} ms")
    cpu = {w: g(pq, w, "node_cpu_ms_per_block") for w in ("w1", "w2")}
    if all(v is not None for v in cpu.values()):
        target("w1, w2: node CPU per committed block <= 1 ms", max(cpu.values()) <= 1.0,
               f"{cpu['w1']:.2f} and {cpu['w2']:.2f} ms (all three nodes)")
    terms = {w: g(pq, w, "terms_started") for w in ("w1", "w2")}
    if all(v is not None for v in terms.values()):
        target("w1, w2: no election without a fault", not any(terms.values()),
               f"{terms['w1']} and {terms['w2']} elections started")
    a, b = g(pq, "w3", "outage_median_ms"), g(zk, "w3", "outage_median_ms")
    name = "w3: pidquorum outage (median) <= 300 ms and <= ZooKeeper's"
    if a is None and g(pq, "w3", "outage_unbounded") and g(zk, "w3", "kills"):
        target(name, False, "pidquorum: no block after a kill")
    elif b is None and a is not None and g(zk, "w3", "outage_unbounded"):
        target(name, a <= 300, f"{a:.0f} ms vs ZooKeeper: no block after a kill")
    elif a is not None and b is not None:
        target(name, a <= 300 and a <= b, f"{a:.0f} vs {b:.0f} ms")
    p99, waits = g(pq, "w4", "p99_us"), g(pq, "w3", "manager", "client_visible_waits")
    if p99 is not None:
        target("w4: generate_producer_id() p99 < 10 us", p99 < 10.0, f"p99 {p99:.2f} us")
    if waits is not None:
        target("w4: zero client-visible waits during leader kills", waits == 0,
               f"{waits} refusals, longest without an ID "
               f"{g(pq, 'w3', 'manager', 'longest_without_id_ms'):.1f} ms")
    rows = g(pq, "w5", "rows")
    if rows and len(rows) == 2:
        small, big = rows
        rs, rb = small["restart_to_first_allocation_s"], big["restart_to_first_allocation_s"]
        ss, sb = small["snapshot_bytes_max"] or 0, big["snapshot_bytes_max"] or 0
        # "The same": restart within 2x (and 1 s) of the small one, snapshot bounded (no growth with history).
        holds = rb <= max(2 * rs, rs + 1.0) and sb <= max(4096, 2 * ss)
        target(f"w5: restart time and snapshot size the same at 10 and {big['reached']:,} allocations", holds,
               f"restart {rs:.2f} s vs {rb:.2f} s; snapshot {ss} B vs {sb} B"
               + ("" if big["complete"] else f" (history INCOMPLETE: {big['reached']:,} of "
                                             f"{big['history_target']:,})"))
    return out


def run_bench(opts: BenchOptions, say=log) -> dict:
    """Run the benchmark; returns the results dict (also written to ``out_dir/bench.json``)."""
    os.makedirs(opts.out_dir, exist_ok=True)
    res: dict = {"params": asdict(opts), "environment": environment_info(), "started_at": utc_now(),
                 "systems": {}, "skipped": {}, "errors": [], "load": []}
    bench = Bench(opts, say)
    if opts.install_peers:
        for s, problem in install_packages(opts.systems, say).items():
            say(f"could not install {s}: {problem}")
    systems = []
    with contextlib.ExitStack() as stack:
        for name in opts.systems:
            reason = missing_reason(name)
            if reason:
                res["skipped"][name] = reason
                say(f"skipping {name}: {reason}")
                continue
            say(f"starting {name} (3 nodes on 127.0.0.1)")
            try:
                sys_ = stack.enter_context(make_system(name, opts.keep, opts.reserve_blocks))
            except (SystemUnavailable, RuntimeError, OSError) as e:
                res["skipped"][name] = f"{type(e).__name__}: {e}"
                say(f"skipping {name}: {e}")
                continue
            systems.append(sys_)
            res["systems"][name] = {"version": package_version(name), "settings": sys_.settings()}

        def attempt(name, key, fn, *args):
            try:
                res["systems"][name][key] = fn(*args)
            except Exception as e:  # noqa: BLE001 - recorded; the next scenario runs
                traceback.print_exc()
                res["errors"].append({"system": name, "workload": key, "error": f"{type(e).__name__}: {e}"})

        if 1 in opts.workloads:
            for s in systems:
                attempt(s.name, "w1", bench.w_throughput, s, 1)
            if any(s.name == "pidquorum" for s in systems):
                say(f"w1: the floor (benchmarks.floor), {opts.duration:.0f}s")
                try:
                    res["floor"] = floor.measure(os.path.join(opts.out_dir, "floor"), opts.duration)
                except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as e:
                    res["errors"].append({"system": None, "workload": "floor",
                                          "error": f"{type(e).__name__}: {e}"})
        if 2 in opts.workloads:
            for s in systems:
                attempt(s.name, "w2", bench.w_throughput, s, BROKERS)
        if 3 in opts.workloads:
            for s in systems:
                attempt(s.name, "w3", bench.w_kills, s)
        pq = next((s for s in systems if s.name == "pidquorum"), None)
        if pq is not None and 4 in opts.workloads:
            attempt("pidquorum", "w4", bench.w_generate, pq)
    if "pidquorum" in res["systems"] and 5 in opts.workloads:
        attempt("pidquorum", "w5", bench.w_history)
    res["load"] = bench.loads
    res["busy_warnings"] = bench.busy_warnings
    res["targets"] = evaluate_targets(res)
    res["finished_at"] = utc_now()
    res["environment"]["loadavg_end"] = loadavg()
    path = os.path.join(opts.out_dir, "bench.json")
    write_json(res, path)
    res["json_path"] = path
    try:
        res["png_path"] = draw_chart(res, os.path.join(opts.out_dir, "bench.png"))
    except Exception as e:  # noqa: BLE001 - the figures are in the JSON anyway
        res["errors"].append({"system": None, "workload": "chart", "error": f"{type(e).__name__}: {e}"})
    return res
