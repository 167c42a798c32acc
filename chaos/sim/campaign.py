"""Many seeds of the simulation, in parallel processes, with the figures a campaign reports.

Each seed runs in a worker process of its own (a simulation replaces pysyncobj's clock for
its whole process); results do not depend on how many workers there are.
"""
from __future__ import annotations

import logging
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from typing import Callable

from .liveness import summary
from .run import make_simulation
from .sim import SimConfig, SimResult


def parse_seeds(text: str) -> list[int]:
    """``A..B`` (inclusive), ``A`` or ``A,B,C``."""
    text = text.strip()
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split("..", 1))
            if hi < lo:
                raise ValueError
            return list(range(lo, hi + 1))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"seeds must be A..B (A <= B), A, or A,B,C; got {text!r}") from None


@dataclass
class Failure:
    seed: int
    violation: str
    step: int | None
    trace: list[str]
    replay: str


@dataclass
class CampaignResult:
    seeds: int = 0
    failures: list[Failure] = field(default_factory=list)
    steps: int = 0
    sim_seconds: float = 0.0
    wall_seconds: float = 0.0   # the campaign's elapsed time
    cpu_seconds: float = 0.0    # the simulations' own time, summed over workers
    faults: int = 0
    faults_by_kind: Counter = field(default_factory=Counter)
    messages: int = 0
    acked: int = 0
    committed: int = 0
    jobs: int = 1
    workload: str = "pids"
    transactions: int = 0     # the transaction workload's figures (0 for pids)
    txn_committed: int = 0
    txn_aborted: int = 0
    txn_unknown: int = 0
    late_copies: int = 0      # requests served after their client had given up on them (SIGSTOP, delays)
    # What the seeds' traffic reached, summed (Simulation._traffic): split AppendEntries, commit indexes beyond a
    # message's entries, installs on a conflicting log, restarts with --trust-own-log.
    traffic: Counter = field(default_factory=Counter)
    # Liveness figures of every seed (chaos.sim.liveness), in simulated seconds: from the last heal to a leader
    # that a majority follows and to a committed client request; from each heal during the run that found no
    # such leader to one.  Summarized by ``liveness``; not in ``to_dict`` one by one.
    leader_after_heal: list[float] = field(default_factory=list, repr=False)
    commit_after_heal: list[float] = field(default_factory=list, repr=False)
    leader_after_mid_run_heal: list[float] = field(default_factory=list, repr=False)
    heals: int = 0
    heals_with_leader: int = 0
    heals_open_at_end: int = 0

    def liveness(self) -> dict:
        return {"leader_after_last_heal_s": summary(self.leader_after_heal),
                "commit_after_last_heal_s": summary(self.commit_after_heal),
                "leader_after_mid_run_heal_s": summary(self.leader_after_mid_run_heal),
                "mid_run_heals": self.heals, "mid_run_heals_with_a_leader": self.heals_with_leader,
                "mid_run_heals_open_when_faults_stopped": self.heals_open_at_end}

    def rates(self) -> dict:
        minutes = self.wall_seconds / 60 if self.wall_seconds else 0.0
        return {
            "simulated_ops_per_wall_minute": round(self.steps / minutes) if minutes else None,
            "faults_per_wall_minute": round(self.faults / minutes) if minutes else None,
            "simulated_hours_per_wall_minute": round(self.sim_seconds / 3600 / minutes, 3) if minutes else None,
        }

    def to_dict(self) -> dict:
        out = asdict(self)
        for name in ("leader_after_heal", "commit_after_heal", "leader_after_mid_run_heal", "heals",
                     "heals_with_leader", "heals_open_at_end"):
            del out[name]
        out["faults_by_kind"] = dict(sorted(self.faults_by_kind.items()))
        out["traffic"] = dict(sorted(self.traffic.items()))
        out["liveness"] = self.liveness()
        out["failed"] = len(self.failures)
        out.update(self.rates())
        return out


def _one(seed: int, steps: int, nodes: int, workload: str = "pids") -> SimResult:
    logging.disable(logging.CRITICAL)  # the nodes' own log lines: the trace says what happened
    return make_simulation(SimConfig(seed=seed, steps=steps, nodes=nodes, workload=workload)).run()


def run_campaign(seeds: list[int], steps: int, nodes: int, jobs: int | None = None,
                 progress: Callable[[int, int, SimResult], None] | None = None,
                 workload: str = "pids") -> CampaignResult:
    jobs = max(1, jobs or os.cpu_count() or 1)
    out = CampaignResult(jobs=jobs, workload=workload)
    t0 = time.perf_counter()

    def take(result: SimResult) -> None:
        out.seeds += 1
        out.steps += result.steps
        out.sim_seconds += result.sim_seconds
        out.cpu_seconds += result.wall_seconds
        out.faults += result.stats.get("faults", 0)
        out.faults_by_kind.update(result.stats.get("faults_by_kind", {}))
        out.messages += result.stats.get("messages", 0)
        out.acked += result.stats.get("acked", 0)
        out.committed += result.stats.get("committed", 0)
        out.transactions += result.stats.get("transactions", 0)
        out.txn_committed += result.stats.get("txn_committed", 0)
        out.txn_aborted += result.stats.get("txn_aborted", 0)
        out.txn_unknown += result.stats.get("txn_unknown", 0)
        txn = result.stats.get("txn", {})
        out.late_copies += txn.get("late_copies_ok", 0) + txn.get("late_copies_refused", 0)
        for k, v in result.stats.get("traffic", {}).items():
            if k not in ("batch_bytes", "large_records"):  # the seed's settings, not counts
                out.traffic[k] += v
        out.traffic["trust_own_log_restarts"] += result.stats.get("trust_own_log_restarts", 0)
        live = result.stats.get("liveness", {})
        if live.get("leader_after_heal") is not None:
            out.leader_after_heal.append(live["leader_after_heal"])
        if live.get("commit_after_heal") is not None:
            out.commit_after_heal.append(live["commit_after_heal"])
        out.leader_after_mid_run_heal.extend(live.get("leader_after_mid_run_heal", ()))
        out.heals += live.get("heals", 0)
        out.heals_with_leader += live.get("heals_with_leader", 0)
        out.heals_open_at_end += live.get("heals_open_at_end", 0)
        if not result.ok:
            out.failures.append(Failure(result.seed, result.violation or "", result.failed_step, result.trace,
                                        replay_command(result.seed, steps, nodes, workload)))
        if progress:
            progress(out.seeds, len(seeds), result)

    if jobs == 1 or len(seeds) == 1:
        for seed in seeds:
            take(_one(seed, steps, nodes, workload))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for fut in as_completed([pool.submit(_one, seed, steps, nodes, workload) for seed in seeds]):
                take(fut.result())
    out.failures.sort(key=lambda f: f.seed)
    out.wall_seconds = time.perf_counter() - t0
    return out


def replay_command(seed: int, steps: int, nodes: int, workload: str = "pids") -> str:
    return (f"pidctl chaos simulate --seeds {seed} --steps {steps} --nodes {nodes}"
            + (f" --workload {workload}" if workload != "pids" else "") + " --trace")
