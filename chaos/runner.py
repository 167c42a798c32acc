"""One chaos run: a local three-node quorum, workloads, a nemesis, then the checker.

A run directory holds everything needed to check it again offline
(``pidctl chaos check DIR``):

* ``history.jsonl``  every operation (chaos.history)
* ``final.json``     each node's state after the run, once they agree, and every
  block the quorum committed (from the nodes' audit trails)
* ``verdict.json``   what the checker found; ``timeline.png`` the picture
* ``run.json``       scenario, seed, durations, workload settings, per-manager stats
* ``cluster/``       node configs and logs; a failing run also keeps the data
  directories (journal, snapshot, audit trail), a passing one drops them.

Faults come one at a time: wait, start a fault (history: ``nemesis`` invoke),
hold it, heal (``ok``).  The seed fixes the choice of faults and every wait, not
the timing of the system under test.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from quorum.trail import iter_blocks

from .checker import Verdict, check
from .faultnode import FAULT_NODE_COMMAND
from .history import HistoryWriter, Op, now_ns, read_final, read_history, write_final
from .nemesis import SCENARIOS, Mixed, NemesisContext, RaftNetwork
from .workload import BrokerAllocator, PidManagerWorkload, WorkloadConfig

log = logging.getLogger(__name__)

HISTORY, FINAL, VERDICT, RUN, TIMELINE = "history.jsonl", "final.json", "verdict.json", "run.json", "timeline.png"


class RunError(Exception):
    """A run directory cannot be (re-)checked, or a run could not be set up."""


@dataclass
class RunConfig:
    scenario: str
    duration_s: float = 60.0
    seed: int = 0
    out_dir: str = "chaos-run"
    interval_s: tuple[float, float] = (2.0, 4.0)   # quiet time before each fault
    hold_s: tuple[float, float] = (0.5, 1.5)       # how long a fault lasts
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    node_faults: tuple[str, ...] = ()  # failpoints armed in every node (chaos.faults), e.g. the broken allocator
    converge_timeout_s: float = 60.0
    keep_data: bool = False                        # keep data directories even if the run passes


async def _describe_all(lc: LocalCluster) -> dict[int, dict]:
    out = {}
    for n in lc.nodes():
        c = QuorumClient([n.client_address], RetryPolicy(timeout=1.0, attempt_timeout=1.0), client_id="chaos-final")
        try:
            out[n.node_id] = await c.describe(n.client_address)
        except Exception:  # noqa: BLE001 - a node that does not answer is reported as missing
            pass
        finally:
            await c.close()
    return out


async def _converged_state(lc: LocalCluster, timeout: float) -> tuple[bool, dict[int, dict]]:
    """Poll until every node answers and all agree on commit index and cursor (or the deadline)."""
    deadline = time.monotonic() + timeout
    last: dict[int, dict] = {}
    while time.monotonic() < deadline:
        last = await _describe_all(lc)
        keys = {(d["raft"]["commit_index"], d["raft"]["last_applied"], d["state"]["next_producer_id"])
                for d in last.values()}
        if len(last) == len(lc.nodes()) and len(keys) == 1:
            commit, applied, _ = next(iter(keys))
            if applied == commit:
                return True, last
        await asyncio.sleep(0.1)
    return False, last


def _final_record(lc: LocalCluster, described: dict[int, dict], converged: bool) -> dict:
    audits = [os.path.join(lc.data_dir(n.node_id), "audit.log") for n in lc.nodes()]
    blocks = list(iter_blocks([a for a in audits if os.path.exists(a)]))
    return {
        "converged": converged,
        "nodes": {str(nid): {"next_producer_id": d["state"]["next_producer_id"],
                             "commit_index": d["raft"]["commit_index"],
                             "last_applied": d["raft"]["last_applied"],
                             "term": d["raft"]["term"]} for nid, d in sorted(described.items())},
        "missing_nodes": sorted(n.node_id for n in lc.nodes() if n.node_id not in described),
        "audit_blocks": [{k: b[k] for k in ("raft_index", "broker_id", "broker_epoch", "producer_id_start",
                                            "producer_id_len")} for b in blocks],
    }


async def run(cfg: RunConfig, progress: Callable[[float, str], None] | None = None) -> Verdict:
    if cfg.scenario not in SCENARIOS:
        raise RunError(f"unknown scenario {cfg.scenario!r}; known: {', '.join(sorted(SCENARIOS))}")
    if os.path.exists(cfg.out_dir) and os.listdir(cfg.out_dir):
        raise RunError(f"{cfg.out_dir} is not empty: a run needs a directory of its own")
    os.makedirs(cfg.out_dir, exist_ok=True)
    rng = random.Random(cfg.seed)
    lc = LocalCluster(os.path.join(cfg.out_dir, "cluster"))
    history = HistoryWriter(os.path.join(cfg.out_dir, HISTORY))
    meta: dict[str, Any] = {"scenario": cfg.scenario, "seed": cfg.seed, "duration_s": cfg.duration_s,
                            "interval_s": cfg.interval_s, "hold_s": cfg.hold_s, "workload": asdict(cfg.workload),
                            "node_faults": list(cfg.node_faults), "started_at": time.time()}
    # Raft traffic goes through a proxy per node, so the partition fault can cut links.
    # Nodes run under chaos.faultnode: a disk the slow-disk fault can slow down, and the failpoints armed.
    lc.create(3, raft_proxy=True,
              node_command=[*FAULT_NODE_COMMAND, *(a for f in cfg.node_faults for a in ("--failpoint", f))])
    net = RaftNetwork(lc).start()
    try:
        lc.up(3)
        return await _run(cfg, lc, net, history, rng, meta, progress)
    finally:
        lc.down(timeout=10)  # on every exit path: no node outlives its run
        net.close()


async def _run(cfg: RunConfig, lc: LocalCluster, net: RaftNetwork, history: HistoryWriter, rng: random.Random,
               meta: dict[str, Any], progress: Callable[[float, str], None] | None) -> Verdict:
    stop = asyncio.Event()
    addresses = lc.client_addresses()
    w = cfg.workload
    brokers = [BrokerAllocator(i + 1, addresses, history, w.block_rate) for i in range(w.brokers)]
    managers = [PidManagerWorkload(100 + i, addresses, history, w.pid_rate, w.clients_per_manager)
                for i in range(w.pid_managers)]
    tasks = [asyncio.create_task(x.run(stop)) for x in (*brokers, *managers)]
    ctx = NemesisContext(lc, rng, log, network=net)
    nemeses = SCENARIOS[cfg.scenario]()
    faults: list[dict] = []
    t0 = time.monotonic()
    try:
        while True:
            elapsed = time.monotonic() - t0
            if progress:
                progress(min(elapsed / cfg.duration_s, 1.0), f"{len(faults)} faults")
            wait = rng.uniform(*cfg.interval_s)
            hold = rng.uniform(*cfg.hold_s)
            if elapsed + wait + hold > cfg.duration_s:
                await asyncio.sleep(max(0.0, cfg.duration_s - elapsed))
                break
            await _sleep_watching(wait, tasks)
            nem = rng.choice(nemeses)
            if isinstance(nem, Mixed):
                nem = nem.pick(ctx)  # record the concrete fault, so reports count kills, pauses ... apart
            history.append(Op("nemesis", "invoke", nem.name, None, now_ns()))
            started: dict | None = None
            try:
                started = await nem.start(ctx)
                await _sleep_watching(hold, tasks)
            finally:
                healed = await nem.stop(ctx)  # heal even when the run is failing
                history.append(Op("nemesis", "ok", nem.name, {"start": started, "stop": healed}, now_ns()))
            faults.append({"fault": nem.name, "start": started, "stop": healed})
    finally:
        await ctx.heal_all()  # whatever state the last fault left behind
        stop.set()
        done, pending = await asyncio.wait(tasks, timeout=15)
        for t in pending:
            t.cancel()
        meta["managers"] = [m.stats() for m in managers]
        for t in done:
            if not t.cancelled() and t.exception() is not None:
                meta.setdefault("workload_errors", []).append(repr(t.exception()))
        history.close()
    if progress:
        progress(1.0, "converging")
    converged, described = await _converged_state(lc, cfg.converge_timeout_s)
    final = _final_record(lc, described, converged)
    lc.down(timeout=10)
    meta["faults"] = len(faults)
    meta["elapsed_s"] = time.monotonic() - t0
    write_final(os.path.join(cfg.out_dir, FINAL), final)
    _write_json(os.path.join(cfg.out_dir, RUN), meta)
    verdict = check_dir(cfg.out_dir)
    if verdict.valid and not cfg.keep_data:
        for n in lc.nodes():
            _drop_data(lc.data_dir(n.node_id))
    return verdict


async def _sleep_watching(seconds: float, tasks: list[asyncio.Task]) -> None:
    """Sleep, but fail fast if a workload task died (its exception is the real problem)."""
    done, _ = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            raise RunError(f"a workload stopped: {t.exception()!r}") from t.exception()


def _drop_data(data_dir: str) -> None:
    """Remove journal, snapshot and audit files of a passing run; keep the node log."""
    if not os.path.isdir(data_dir):
        return
    for name in os.listdir(data_dir):
        path = os.path.join(data_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif not name.endswith(".log") or name == "audit.log":
            os.remove(path)


def _write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def check_dir(run_dir: str, write: bool = True, allow_torn_tail: bool = False) -> Verdict:
    """Check (or re-check) a saved run: history + final state -> verdict (and timeline.png)."""
    if not os.path.isdir(run_dir):
        raise RunError(f"{run_dir}: no such directory")
    if not os.path.exists(os.path.join(run_dir, HISTORY)):
        raise RunError(f"{run_dir}: no {HISTORY}: not a chaos run directory")
    if not os.path.exists(os.path.join(run_dir, FINAL)):
        raise RunError(f"{run_dir}: no {FINAL}: the run did not finish (its history alone cannot be checked)")
    final = read_final(os.path.join(run_dir, FINAL))
    ops = read_history(os.path.join(run_dir, HISTORY), allow_torn_tail=allow_torn_tail)
    verdict = check(ops, final)
    if write:
        _write_json(os.path.join(run_dir, VERDICT), verdict.to_dict())
        from .report import timeline_png  # heavy (matplotlib): imported when used
        timeline_png(ops, os.path.join(run_dir, TIMELINE))
    return verdict
