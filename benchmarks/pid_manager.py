"""Benchmark of the broker-side ProducerIdManager (broker/pid_manager.py): generate_producer_id() latency
against a fake quorum, then two managers (adaptive and Kafka-like reserve) at a steady demand while the
leader of a real local three-node cluster is killed.  What each phase does and checks:
docs/benchmarks.md.

    pidctl bench pid-manager [--quick] [--json bench-results/pid_manager.json]
                             [--calls 1000000] [--duration 60] [--kill-every 5]
                             [--restart-after 1] [--rate 1000]
"""
from __future__ import annotations

import array
import asyncio
import dataclasses
import os
import sys
import time

from broker.pid_manager import PidManagerConfig, ProducerIdManager
from quorum.client.quorum import AllocatedBlock, QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from quorum.trail import iter_blocks
from records.wire.errors import CoordinatorLoadInProgressError, PidQuorumError

from .common import HOST, LeaderKill, check_inside, kill_leaders, leader_kill_checks, paced, percentile, temp_cluster
from .harness import exit_status, log, new_results, parser, phase_list, quick_defaults, run_phases
from .report import fmt_num, leader_kills_title, print_footer, print_new_leaders, table

BLOCK = 1000
TICK_S = 0.01
MANAGER_POLICY = RetryPolicy(timeout=30.0, attempt_timeout=1.0)
P99_TARGET_US = 10.0


# ------------------------------------------------------------ 1. generate latency
class InstantQuorum:
    """In-process stand-in for the quorum: consecutive 1,000-ID blocks after one loop yield."""

    def __init__(self):
        self.next = 0
        self.calls = 0

    async def register_broker(self, broker_id, incarnation_id=None, listener=""):
        return 1

    async def allocate(self, broker_id, broker_epoch):
        await asyncio.sleep(0)
        self.calls += 1
        start, self.next = self.next, self.next + BLOCK
        return AllocatedBlock(start, BLOCK, 0, "in-process")


async def phase_latency(args) -> dict:
    n, batch = args.calls, args.batch
    log(f"phase 1: {n:,} generate_producer_id() calls, fake in-process quorum, yield every {batch}")
    q = InstantQuorum()
    mgr = ProducerIdManager(1, q)
    await mgr.start()
    ns = time.perf_counter_ns
    gen = mgr.generate_producer_id
    lat = array.array("q", bytes(8 * n))
    refused = 0
    last = -1
    monotonic = True
    # Warm-up (not recorded), same pattern, for --warmup seconds: the rate estimate and the reserve settle.
    warm_until = time.perf_counter() + args.warmup
    warm_calls = warm_refused = 0
    while time.perf_counter() < warm_until:
        for _ in range(batch):
            try:
                gen()
            except CoordinatorLoadInProgressError:
                warm_refused += 1
            warm_calls += 1
        await asyncio.sleep(0)
    i = 0
    t_start = time.perf_counter()
    while i < n:
        for _ in range(min(batch, n - i)):
            t0 = ns()
            try:
                pid = gen()
            except CoordinatorLoadInProgressError:
                t1 = ns()
                refused += 1
                lat[i] = t1 - t0
                i += 1
                continue
            t1 = ns()
            lat[i] = t1 - t0
            i += 1
            if pid <= last:
                monotonic = False
            last = pid
        await asyncio.sleep(0)
    wall = time.perf_counter() - t_start
    st = mgr.stats()
    await mgr.close()
    # The cost of the timing pair itself.
    empty = array.array("q", bytes(8 * 100_000))
    for j in range(len(empty)):
        t0 = ns()
        t1 = ns()
        empty[j] = t1 - t0
    s = sorted(lat)
    e = sorted(empty)
    us = lambda v: None if v is None else v / 1000.0  # noqa: E731
    return {"quorum": "fake, in process (allocate = one event-loop yield, 1,000-ID blocks)",
            "calls": n, "yield_every": batch, "refused_load_in_progress": refused,
            "warmup": {"seconds": args.warmup, "calls": warm_calls, "refused": warm_refused},
            "ids_strictly_increasing": monotonic,
            "latency_us": {"p50": us(percentile(s, 50)), "p99": us(percentile(s, 99)),
                           "p99_9": us(percentile(s, 99.9)), "max": us(s[-1]), "mean": us(sum(s) / len(s))},
            "timer_pair_us": {"p50": us(percentile(e, 50)), "p99": us(percentile(e, 99))},
            "wall_s": wall, "calls_per_s_including_yields": n / wall if wall else None,
            "blocks_fetched": st["counters"]["blocks_fetched"], "peak_reserve_ids": st["peak_reserve_ids"],
            "p99_target_us": P99_TARGET_US}


# ----------------------------------------------------------------- 2. leader kill
class Demand:
    """Paced callers of one manager: every tick, the IDs owed since the start at ``rate``."""

    def __init__(self, label: str, mgr: ProducerIdManager, rate: float):
        self.label, self.mgr, self.rate = label, mgr, rate
        self.ids = array.array("q")
        self.refused = 0
        self.other_errors: dict[str, int] = {}
        self.dry_since: float | None = None
        self.max_dry_s = 0.0
        self.dry_total_s = 0.0
        self.dry_spells = 0
        self.max_tick_lag_s = 0.0
        self.reserve_at_kills: list[int] = []

    async def run(self, t_start: float, t_stop: float) -> None:
        gen, ids = self.mgr.generate_producer_id, self.ids
        async for due, now in paced(t_start, TICK_S, time.perf_counter):
            self.max_tick_lag_s = max(self.max_tick_lag_s, now - due)
            owed = int((min(now, t_stop) - t_start) * self.rate) - len(ids)
            try:
                for _ in range(owed):
                    ids.append(gen())
                if self.dry_since is not None:
                    spell = now - self.dry_since
                    self.max_dry_s = max(self.max_dry_s, spell)
                    self.dry_total_s += spell
                    self.dry_since = None
            except CoordinatorLoadInProgressError:
                self.refused += 1
                if self.dry_since is None:
                    self.dry_since = now
                    self.dry_spells += 1
            except PidQuorumError as e:  # a fatal error: count it, keep the pace
                self.other_errors[type(e).__name__] = self.other_errors.get(type(e).__name__, 0) + 1
            if now >= t_stop:
                if self.dry_since is not None:
                    self.max_dry_s = max(self.max_dry_s, now - self.dry_since)
                return


async def killer(lc: LocalCluster, t_start: float, t_stop: float, every: float, restart_after: float,
                 stagger_s: float, demands: list[Demand], rounds: list[dict]) -> None:
    """Leader kills (benchmarks.common.kill_leaders), noting each manager's reserve just before each kill."""
    def before_kill() -> None:
        for d in demands:
            d.reserve_at_kills.append(d.mgr.reserve_ids)

    def on_round(k: LeaderKill) -> None:
        rnd = {"round": k.round, "at_s": k.at_s, "killed_node": k.killed_node, "kill_s": k.kill_s,
               "new_leader": k.new_leader, "new_leader_seen_after_s": k.new_leader_seen_after_s,
               "reserve_at_kill": {d.label: d.reserve_at_kills[-1] for d in demands},
               "restart_ready_s": k.restart_ready_s}
        rounds.append(rnd)
        log(k.summary() + "; reserve at kill: " + ", ".join(f"{label} {v}"
                                                           for label, v in rnd["reserve_at_kill"].items()))

    await kill_leaders(lc, t_start, t_stop, every, restart_after, stagger_s, on_round, before_kill)


async def phase_kills(args) -> dict:
    rounds: list[dict] = []
    with temp_cluster("pidquorum-bench-pidmgr-", args.keep) as (lc, directory):
        log(f"phase 2: {args.duration:.0f}s at {args.rate:.0f} IDs/s per manager, leader SIGKILL every "
            f"{args.kill_every:g}s, restart after {args.restart_after:g}s; cluster in {directory}")
        configs = {"adaptive": PidManagerConfig(), "kafka-like": PidManagerConfig.kafka_fixed_threshold()}
        clients, managers, demands = [], [], []
        for broker_id, (label, cfg) in enumerate(configs.items(), start=1):
            c = QuorumClient(lc.client_addresses(), MANAGER_POLICY, client_id=f"bench-pidmgr-{label}")
            m = ProducerIdManager(broker_id, c, listener=f"PLAINTEXT://{HOST}:{9090 + broker_id}", config=cfg)
            clients.append(c)
            managers.append(m)
            demands.append(Demand(label, m, args.rate))
        try:
            await asyncio.gather(*(m.start() for m in managers))
            t_start = time.perf_counter()
            t_stop = t_start + args.duration
            await asyncio.gather(*(d.run(t_start, t_stop) for d in demands),
                                 killer(lc, t_start, t_stop, args.kill_every, args.restart_after,
                                        0.0 if args.no_stagger else BLOCK / args.rate, demands, rounds))
            wall = time.perf_counter() - t_start
            stats = {d.label: d.mgr.stats() for d in demands}
        finally:
            for m in managers:
                await m.close()
            for c in clients:
                await c.close()
        await asyncio.to_thread(lc.down, 10.0)
        trails = [os.path.join(lc.data_dir(n.node_id), "audit.log") for n in lc.nodes()]
        audit = list(iter_blocks(trails))
        all_ids = set()
        total = 0
        per = {}
        for broker_id, d in enumerate(demands, start=1):
            st = stats[d.label]
            ids = d.ids
            total += len(ids)
            all_ids.update(ids)
            mine = [(b["producer_id_start"], b["producer_id_start"] + b["producer_id_len"])
                    for b in audit if b["broker_id"] == broker_id]
            per[d.label] = {
                "broker_id": broker_id, "config": dataclasses.asdict(d.mgr.config),
                "load_in_progress": d.refused, "manager_load_in_progress_counter":
                    st["counters"]["load_in_progress"], "other_errors": d.other_errors,
                "ids": len(ids), "ids_per_s": len(ids) / wall,
                "duplicates_within": len(ids) - len(set(ids)),
                "inside_quorum_blocks": check_inside(ids, mine),
                "dry_spells": d.dry_spells, "max_dry_s": d.max_dry_s, "dry_total_s": d.dry_total_s,
                "max_tick_lag_s": d.max_tick_lag_s,
                "max_block_wait_s": st["max_block_wait_s"], "max_outage_s": st["max_outage_s"],
                "allocate_latency_ewma_s": st["allocate_latency_ewma_s"],
                "peak_reserve_ids": st["peak_reserve_ids"], "reserve_at_kills": d.reserve_at_kills,
                "final_target_reserve_ids": st["target_reserve_ids"],
                "final_failover_budget_s": st["failover_budget_s"],
                "final_rate_estimate_per_s": st["rate_estimate_per_s"],
                "blocks_fetched": st["counters"]["blocks_fetched"],
                "blocks_rejected": st["counters"]["blocks_rejected"],
                "fetch_errors": st["counters"]["fetch_errors"], "outages": st["counters"]["outages"],
                "re_registrations": st["counters"]["re_registrations"], "backoffs": st["counters"]["backoffs"],
            }
        return {"duration_s": args.duration, "wall_s": wall, "rate_per_manager": args.rate, "tick_s": TICK_S,
                "kill_every_s": args.kill_every, "restart_after_s": args.restart_after, "kills": len(rounds),
                "kill_stagger": None if args.no_stagger else "kill i at i*kill_every + frac(i*0.618)*block/rate",
                "client_policy": dataclasses.asdict(MANAGER_POLICY), "block_size": BLOCK,
                "total_ids": total, "duplicates": total - len(all_ids), "managers": per, "rounds": rounds,
                "audit_blocks": len(audit),
                "definitions": {
                    "load_in_progress": "calls that raised COORDINATOR_LOAD_IN_PROGRESS (the owed IDs are "
                                        "retried on the next 10 ms tick)",
                    "max_dry_s": "longest time from the first refused call to the next successful tick",
                    "max_block_wait_s": "manager: longest time from first asking for a block to accepting one "
                                        "(includes failovers the QuorumClient hid behind its retries)",
                    "max_outage_s": "manager: the same, only for waits with failed attempts",
                    "duplicates": "IDs of both managers together minus distinct IDs"}}


# ---------------------------------------------------------------------- printing
def print_results(res: dict) -> None:
    p, env = res["params"], res["environment"]
    print()
    print(f"ProducerIdManager benchmark ({'quick' if p['quick'] else 'full'} run; {env['cpu_count']} CPUs, "
          f"Python {env['python']}, load avg at start {env['loadavg_start']})")
    print()
    lat = res["phases"].get("latency")
    if lat:
        x = lat["latency_us"]
        print(table(f"1. generate_producer_id() latency, {lat['calls']:,} calls, {lat['quorum']}",
                    ["p50 us", "p99 us", "p99.9 us", "max us", "mean us", "timer pair p50 us", "refused",
                     "p99 < 10 us"],
                    [[fmt_num(x["p50"], ".3f"), fmt_num(x["p99"], ".3f"), fmt_num(x["p99_9"], ".3f"),
                      fmt_num(x["max"], ".1f"), fmt_num(x["mean"], ".3f"), fmt_num(lat["timer_pair_us"]["p50"], ".3f"),
                      lat["refused_load_in_progress"],
                      "yes" if x["p99"] is not None and x["p99"] < P99_TARGET_US else "NO"]]))
        print()
    k = res["phases"].get("leader_kill")
    if k:
        rows = []
        for label, m in k["managers"].items():
            rows.append([label, m["load_in_progress"], f"{m['ids']:,}", m["duplicates_within"],
                         m["inside_quorum_blocks"]["outside"], fmt_num(m["max_dry_s"] * 1000, ".0f", " ms"),
                         fmt_num(m["max_block_wait_s"] * 1000, ".0f", " ms"), f"{m['peak_reserve_ids']:,}",
                         f"{min(m['reserve_at_kills'], default=0):,}", m["blocks_fetched"],
                         sum(m["fetch_errors"].values()), fmt_num(m["final_failover_budget_s"], ".2f", " s")])
        print(table(f"2. {leader_kills_title(k)}, {k['rate_per_manager']:.0f} IDs/s per manager, real 3-node cluster",
                    ["manager", "LOAD_IN_PROGRESS", "IDs", "dups", "outside blocks", "max dry",
                     "max block wait", "peak reserve", "min reserve@kill", "blocks", "fetch errs",
                     "budget"], rows))
        print(f"  all IDs of both managers: {k['total_ids']:,}, duplicates {k['duplicates']}; "
              f"audit-trail blocks {k['audit_blocks']}")
        print_new_leaders(k["rounds"])
        print()
    print_footer(res)


# -------------------------------------------------------------------------- main
def checks(res: dict) -> list[str]:
    out = []
    lat = res["phases"].get("latency")
    if lat:
        if lat["latency_us"]["p99"] is None or lat["latency_us"]["p99"] >= P99_TARGET_US:
            out.append(f"latency: p99 {lat['latency_us']['p99']} us is not below {P99_TARGET_US} us")
        if not lat["ids_strictly_increasing"]:
            out.append("latency: IDs not strictly increasing")
    k = res["phases"].get("leader_kill")
    if k:
        out += leader_kill_checks(k, "managers", "IDs")
        if k["managers"]["adaptive"]["load_in_progress"]:
            out.append(f"leader kill: adaptive manager refused {k['managers']['adaptive']['load_in_progress']} "
                       f"calls (expected 0)")
    return out


PHASES = {"latency": phase_latency, "leader_kill": phase_kills}


def parse_args(argv=None, prog: str | None = None):
    ap = parser(prog, __doc__)
    ap.add_argument("--quick", action="store_true", help="200,000 calls and a 20 s leader-kill run")
    ap.add_argument("--json", default="bench-results/pid_manager.json", help="where to write the results")
    ap.add_argument("--calls", type=int, default=None, help="phase 1 calls (default 1,000,000)")
    ap.add_argument("--batch", type=int, default=100, help="phase 1: calls between event-loop yields")
    ap.add_argument("--duration", type=float, default=None, help="phase 2 seconds (default 60)")
    ap.add_argument("--rate", type=float, default=1000.0, help="phase 2 IDs/s per manager")
    ap.add_argument("--kill-every", type=float, default=5.0, help="phase 2: seconds between leader kills")
    ap.add_argument("--restart-after", type=float, default=1.0, help="phase 2: seconds until the restart")
    ap.add_argument("--phases", default="latency,leader_kill", help="comma-separated: latency, leader_kill")
    ap.add_argument("--no-stagger", action="store_true", help="phase 2: kill at exact multiples of --kill-every")
    ap.add_argument("--warmup", type=float, default=0.5, help="phase 1: unrecorded warm-up seconds")
    ap.add_argument("--keep", action="store_true", help="keep the cluster directory")
    a = ap.parse_args(argv)
    quick_defaults(a, {"calls": (1_000_000, 200_000), "duration": (60.0, 20.0)})
    a.phases = phase_list(ap, a.phases, PHASES)
    return a


def main(argv=None, prog: str | None = None) -> int:
    a = parse_args(argv, prog)
    res = new_results({"quick": a.quick, "json": a.json, "calls": a.calls, "batch": a.batch, "duration_s": a.duration,
                       "rate": a.rate, "kill_every_s": a.kill_every, "restart_after_s": a.restart_after,
                       "stagger": not a.no_stagger, "warmup_s": a.warmup,
                       "phases": a.phases, "host": HOST, "block_size": BLOCK, "argv": sys.argv,
                       "percentiles": "nearest rank over sorted samples"})
    run_phases(res, [(name, PHASES[name]) for name in a.phases], a, a.json, checks=checks)
    print_results(res)
    return exit_status(res)


if __name__ == "__main__":
    sys.exit(main())
