"""One exactly-once chaos run (``pidctl chaos run --workload transactions``): a real three-node quorum, a
real broker process, real transactional and idempotent producers of two client libraries, faults from a
seeded schedule (``schedule()``), then a read of everything (``chaos.txn_read``) and the checker
(``chaos.txn_checker``).  The steps, the faults and the run directory's files are described in
docs/transactions.md, "Exactly-once under faults".
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from quorum.localcluster import LocalCluster

from .history import INFO, INVOKE, OK, HistoryError, HistoryWriter, Op, now_ns, read_history
from .nemesis import KillLeader, Nemesis, NemesisContext, PauseLeader
from .runner import RunError, _drop_data, _write_json
from .txn_broker import ChaosBroker, child_env
from .txn_checker import TxnVerdict, check
from .txn_read import RawBroker, ReadError, dump_log, read_all, settle
from .txn_workload import LIBS, IdempotentWorker, LsoSampler, PollReader, TxnWorker, TxnWorkloadConfig

log = logging.getLogger(__name__)

WORKLOAD = "transactions"
HISTORY, READBACK, VERDICT, RUN, CLIENT_LOG = "history.jsonl", "readback.json", "verdict.json", "run.json", \
    "clients.log"
FAULTS = ("kill-leader", "pause-leader", "pause-node", "pause-broker-peer", "kill-broker", "fence")
PAUSES = ("pause-leader", "pause-node", "pause-broker-peer")
START_S = {"pause-broker-peer": 5.0}  # time a fault's start may take before its hold (see PauseBrokerPeer)


@dataclass
class TxnRunConfig:
    duration_s: float = 60.0
    seed: int = 0
    out_dir: str = "chaos-transactions-0"
    faults: tuple[str, ...] = FAULTS
    interval_s: tuple[float, float] = (2.0, 5.0)   # quiet time before each fault
    hold_s: tuple[float, float] = (1.0, 3.0)       # a killed leader's or broker's downtime
    pause_s: tuple[float, float] = (2.0, 8.0)      # a paused node's
    workload: TxnWorkloadConfig = field(default_factory=TxnWorkloadConfig)
    settle_timeout_s: float = 90.0
    read_timeout_s: float = 60.0
    keep_data: bool = False
    schedule: list[dict] | None = None             # explicit faults ({"at_s", "fault", "hold_s", "pick"}), no draw


def schedule(cfg: TxnRunConfig) -> list[dict]:
    """The faults of a run, drawn from the seed: [{"at_s", "fault", "hold_s", "pick"}] (``pick`` in [0, 1)
    chooses the node or the producer when the fault needs one), each healed by ``duration_s``."""
    if cfg.schedule is not None:
        return [dict(e) for e in cfg.schedule]
    unknown = [f for f in cfg.faults if f not in FAULTS]
    if unknown or not cfg.faults:
        raise RunError(f"unknown fault(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(FAULTS)}")
    rng = random.Random(cfg.seed)
    out = []
    t = 0.0
    while True:
        wait = rng.uniform(*cfg.interval_s)
        fault = rng.choice(list(cfg.faults))
        hold = 0.0 if fault == "fence" else rng.uniform(*(cfg.pause_s if fault in PAUSES else cfg.hold_s))
        pick = rng.random()
        took = START_S.get(fault, 0.0) + hold
        if t + wait + took > cfg.duration_s:
            return out
        out.append({"at_s": round(t + wait, 3), "fault": fault, "hold_s": round(hold, 3), "pick": round(pick, 6)})
        t += wait + took


# --------------------------------------------------------------------------
# Faults beside chaos.nemesis'
# --------------------------------------------------------------------------

class PauseNode(Nemesis):
    """SIGSTOP a quorum node chosen by ``pick`` (leader or follower); stop sends SIGCONT."""

    name = "pause-node"

    def __init__(self, pick: float) -> None:
        self.pick = pick
        self.node: int | None = None

    async def start(self, ctx: NemesisContext) -> dict:
        nodes = ctx.node_ids()
        self.node = nodes[min(len(nodes) - 1, int(self.pick * len(nodes)))]
        leader = await ctx.leader()
        await ctx.signal(self.node, signal.SIGSTOP)
        ctx.note("nemesis: paused node %d (leader: %s)", self.node, leader)
        return {"node": self.node, "leader": leader, "was_leader": leader == self.node}

    async def stop(self, ctx: NemesisContext) -> dict:
        node, self.node = self.node, None
        if node is not None:
            await ctx.signal(node, signal.SIGCONT)
        return {"node": node}


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(link[8:-1])
    except OSError:
        pass
    return out


def broker_peer_bytes(broker_pid: int, client_ports: dict[int, int]) -> dict[int, int]:
    """Bytes the broker process has sent on its established connections to each quorum node's client port
    (``client_ports``: node id -> port), from ``ss -tie`` (its sockets told apart by inode)."""
    inodes = _socket_inodes(broker_pid)
    by_port = {port: node for node, port in client_ports.items()}
    try:
        text = subprocess.run(["ss", "-tniHe", "state", "established"], capture_output=True, text=True,
                              timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    out: dict[int, int] = {}
    node = None
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            fields = line.split()
            ino = next((f[4:] for f in fields if f.startswith("ino:")), None)
            port = int(fields[3].rsplit(":", 1)[1]) if len(fields) > 3 and ":" in fields[3] else None
            node = by_port.get(port) if ino in inodes else None
        elif node is not None:
            sent = next((int(f.split(":")[1]) for f in line.split() if f.startswith("bytes_sent:")), 0)
            out[node] = out.get(node, 0) + sent
    return out


async def broker_active_peer(broker_pid: int, client_ports: dict[int, int], window: float = 0.3) -> int | None:
    """The quorum node the broker sends the most to over ``window`` s (its transaction steps go there)."""
    before = await asyncio.to_thread(broker_peer_bytes, broker_pid, client_ports)
    await asyncio.sleep(window)
    after = await asyncio.to_thread(broker_peer_bytes, broker_pid, client_ports)
    deltas = {n: after[n] - before.get(n, 0) for n in after}
    if not deltas or max(deltas.values()) <= 0:
        return None
    return max(deltas, key=lambda n: deltas[n])


class PauseBrokerPeer(Nemesis):
    """SIGSTOP the quorum node the broker's requests go to, while the broker retries them elsewhere: the
    node holds a copy of a transaction step and delivers it (proposes or forwards it) when it resumes.

    The broker prefers the leader, and after an attempt times out (3 s) retries on another node, a
    follower half the time, which it keeps using until it looks for the leader again.  So: if the broker
    sends to a follower, that follower is paused for the hold; if it sends to the leader, the leader is
    paused for ``lead_s`` (past the broker's attempt timeout), resumed, and then the node the broker moved
    to is paused for the hold.  stop sends SIGCONT."""

    name = "pause-broker-peer"

    def __init__(self, broker: "ChaosBroker", lead_s: float = 3.5) -> None:
        self.broker = broker
        self.lead_s = lead_s
        self.node: int | None = None
        self.first: int | None = None

    async def start(self, ctx: NemesisContext) -> dict:
        if not self.broker.alive():
            return {"node": None, "skipped": "the broker is not running"}
        ports = {n.node_id: int(n.client_address.rsplit(":", 1)[1]) for n in ctx.cluster.nodes()}
        pid = self.broker.proc.pid
        leader = await ctx.leader()
        peer = await broker_active_peer(pid, ports)
        out: dict[str, Any] = {"leader": leader, "active_peer": peer}
        if peer is None:
            out.update(node=None, skipped="the broker sends nothing to the quorum")
            return out
        if peer == leader:
            self.first = peer
            t_first = time.monotonic()
            await ctx.signal(peer, signal.SIGSTOP)
            await asyncio.sleep(self.lead_s)
            others = {n: p for n, p in ports.items() if n != peer}
            moved = None
            for _ in range(10):  # the broker's retries reach another node once an attempt timed out
                moved = await broker_active_peer(pid, others)
                if moved is not None:
                    break
            await ctx.signal(peer, signal.SIGCONT)
            self.first = None
            out.update(first_paused=peer, first_paused_s=round(time.monotonic() - t_first, 3), moved_to=moved)
            peer = moved
            if peer is None:
                out.update(node=None, skipped="the broker sent nowhere else while the leader was paused")
                return out
        self.node = peer
        await ctx.signal(peer, signal.SIGSTOP)
        leader_now = await ctx.leader()
        out.update(node=peer, leader_after=leader_now, was_leader=peer == leader_now)
        ctx.note("nemesis: paused node %d, where the broker sends its quorum requests (%s)", peer, out)
        return out

    async def stop(self, ctx: NemesisContext) -> dict:
        for n in (self.first, self.node):
            if n is not None:
                await ctx.signal(n, signal.SIGCONT)
        node, self.node, self.first = self.node, None, None
        return {"node": node}


class KillBroker(Nemesis):
    """kill -9 the broker process; stop starts it again (same port, same data directory)."""

    name = "kill-broker"

    def __init__(self, broker: ChaosBroker) -> None:
        self.broker = broker
        self.killed = False

    async def start(self, ctx: NemesisContext) -> dict:
        pid = self.broker.proc.pid if self.broker.proc is not None else None
        await asyncio.to_thread(self.broker.kill)
        self.killed = True
        ctx.note("nemesis: killed the broker (pid %s)", pid)
        return {"pid": pid}

    async def stop(self, ctx: NemesisContext) -> dict:
        if not self.killed:
            return {}
        self.killed = False
        t = time.monotonic()
        await asyncio.to_thread(self.broker.start, 60.0)
        return {"pid": self.broker.proc.pid, "restart_s": round(time.monotonic() - t, 3)}


class Fence(Nemesis):
    """A second instance of a transactional producer (chosen by ``pick``) calls init_transactions()."""

    name = "fence"

    def __init__(self, workers: list[TxnWorker], pick: float) -> None:
        self.workers = workers
        self.pick = pick

    async def start(self, ctx: NemesisContext) -> dict:
        alive = [w for w in self.workers if w.is_alive()]
        if not alive:
            return {"skipped": "no transactional producer running"}
        w = alive[min(len(alive) - 1, int(self.pick * len(alive)))]
        out = await asyncio.to_thread(w.fence)
        ctx.note("nemesis: fenced %s: %s", w.process, out)
        return out


def _nemesis(entry: dict, broker: ChaosBroker, workers: list[TxnWorker]) -> Nemesis:
    f = entry["fault"]
    if f == "kill-leader":
        return KillLeader()
    if f == "pause-leader":
        return PauseLeader()
    if f == "pause-node":
        return PauseNode(entry.get("pick", 0.0))
    if f == "pause-broker-peer":
        return PauseBrokerPeer(broker)
    if f == "kill-broker":
        return KillBroker(broker)
    if f == "fence":
        return Fence(workers, entry.get("pick", 0.0))
    raise RunError(f"unknown fault {f!r}; known: {', '.join(FAULTS)}")


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------

def _versions() -> dict:
    import confluent_kafka
    import kafka
    return {"confluent_kafka": getattr(confluent_kafka, "__version__", None) or confluent_kafka.version()[0],
            "librdkafka": confluent_kafka.libversion()[0], "kafka_python": kafka.__version__}


class _ClientLogs:
    """librdkafka's and kafka-python's log lines go to the run's ``clients.log`` while it lasts."""

    def __init__(self, path: str):
        self.handler = logging.FileHandler(path)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(threadName)s %(message)s"))
        self.rdkafka = logging.Logger("chaos.txn.rdkafka")  # not registered: lives with the run
        self.rdkafka.addHandler(self.handler)
        self.kafka = logging.getLogger("kafka")
        self._saved = (self.kafka.propagate, self.kafka.level)

    def __enter__(self) -> "_ClientLogs":
        self.kafka.addHandler(self.handler)
        self.kafka.propagate = False
        self.kafka.setLevel(logging.WARNING)
        return self

    def __exit__(self, *exc) -> None:
        self.kafka.removeHandler(self.handler)
        self.kafka.propagate, lvl = self._saved
        self.kafka.setLevel(lvl)
        self.handler.close()


async def run(cfg: TxnRunConfig, progress: Callable[[float, str], None] | None = None) -> TxnVerdict:
    """Run, read back, check; see the module doc.  RunError if the run cannot be set up."""
    plan = schedule(cfg)
    w = cfg.workload
    if w.txn_producers < 1:
        raise RunError("the transactions workload needs at least one transactional producer per library")
    if os.path.exists(cfg.out_dir) and os.listdir(cfg.out_dir):
        raise RunError(f"{cfg.out_dir} is not empty: a run needs a directory of its own")
    os.makedirs(cfg.out_dir, exist_ok=True)
    out = os.path.abspath(cfg.out_dir)
    meta: dict[str, Any] = {"workload": WORKLOAD, "seed": cfg.seed, "duration_s": cfg.duration_s,
                            "faults_enabled": list(cfg.faults), "interval_s": list(cfg.interval_s),
                            "hold_s": list(cfg.hold_s), "pause_s": list(cfg.pause_s), "schedule": plan,
                            "config": asdict(w), "started_at": time.time(), "versions": _versions()}
    _write_json(os.path.join(out, RUN), meta)
    env = {"PYTHONPATH": child_env()["PYTHONPATH"]}
    lc = LocalCluster(os.path.join(out, "cluster"))
    broker: ChaosBroker | None = None
    try:
        lc.up(3, env=env)
        broker = ChaosBroker(out, 1, lc.client_addresses(), "--partitions", str(w.partitions))
        broker.start(60.0)
        with _ClientLogs(os.path.join(out, CLIENT_LOG)) as logs:
            await _run(cfg, plan, lc, broker, env, meta, logs, out, progress)
    finally:
        if broker is not None:
            broker.stop()
        lc.down(timeout=10)
    meta["elapsed_s"] = round(time.time() - meta["started_at"], 3)
    _write_json(os.path.join(out, RUN), meta)
    verdict = check_dir(out)
    if verdict.valid and not cfg.keep_data:
        for n in lc.nodes():
            _drop_data(lc.data_dir(n.node_id))
        shutil.rmtree(broker.data_dir, ignore_errors=True)
    return verdict


async def _run(cfg: TxnRunConfig, plan: list[dict], lc: LocalCluster, broker: ChaosBroker, env: dict,
               meta: dict, logs: _ClientLogs, out: str, progress: Callable[[float, str], None] | None) -> None:
    w = cfg.workload
    with RawBroker(broker.bootstrap, timeout=5.0) as raw:
        got = await asyncio.to_thread(raw.create_topic, w.topic)
    if got != w.partitions:
        raise RunError(f"topic {w.topic} has {got} partitions, expected {w.partitions}")
    history = HistoryWriter(os.path.join(out, HISTORY))
    stop_writers, stop_readers = threading.Event(), threading.Event()
    txn_workers: list[TxnWorker] = []
    idem_workers: list[IdempotentWorker] = []
    for key in LIBS:
        for i in range(1, w.txn_producers + 1):
            name = f"txn-{key}-{i}"
            txn_workers.append(TxnWorker(name, key, broker.bootstrap, f"chaos-{name}", w, history, stop_writers,
                                         cfg.seed, logs.rdkafka))
        for i in range(1, w.idempotent_producers + 1):
            name = f"idem-{key}-{i}"
            idem_workers.append(IdempotentWorker(name, key, broker.bootstrap, None, w, history, stop_writers,
                                                 cfg.seed, logs.rdkafka))
    readers = [PollReader(broker.bootstrap, w, history, stop_readers),
               LsoSampler(broker.bootstrap, w, history, stop_readers)]
    for t in (*readers, *txn_workers, *idem_workers):
        t.start()
    ctx = NemesisContext(lc, random.Random(cfg.seed), log, env=env)
    done: list[dict] = []
    t0 = time.monotonic()
    try:
        for entry in plan:
            delay = entry["at_s"] - (time.monotonic() - t0)
            if delay > 0:
                await _sleep(delay, progress, t0, cfg.duration_s, done)
            if time.monotonic() - t0 + START_S.get(entry["fault"], 0.0) + entry["hold_s"] > cfg.duration_s + 5.0:
                break  # earlier faults ran late: none is left unhealed past the run
            nem = _nemesis(entry, broker, txn_workers)
            history.append(Op("nemesis", INVOKE, nem.name, None, now_ns()))
            started: dict | None = None
            healed: dict | None = None
            error: str | None = None
            try:
                started = await nem.start(ctx)
                await asyncio.sleep(entry["hold_s"])
            except Exception as e:  # noqa: BLE001 - recorded; the run goes on
                error = f"{type(e).__name__}: {e}"[:300]
            finally:
                try:
                    healed = await nem.stop(ctx)
                except Exception as e:  # noqa: BLE001 - heal_all below tries again
                    error = (error or "") + f" stop: {type(e).__name__}: {e}"[:300]
                history.append(Op("nemesis", INFO if error else OK, nem.name,
                                  {"start": started, "stop": healed, "planned": entry}, now_ns(), error))
            done.append({"fault": nem.name, "start": started, "stop": healed, "error": error})
        rest = cfg.duration_s - (time.monotonic() - t0)
        if rest > 0:
            await _sleep(rest, progress, t0, cfg.duration_s, done)
    finally:
        await ctx.heal_all()
        if not broker.alive():
            await asyncio.to_thread(broker.start, 60.0)
        stop_writers.set()
        if progress:
            progress(1.0, "stopping the producers")
        for t in (*txn_workers, *idem_workers):
            await asyncio.to_thread(t.join, w.step_deadline_s * 2 + 30)
        if progress:
            progress(1.0, "waiting for open transactions to end")
        with RawBroker(broker.bootstrap, timeout=5.0) as raw:
            settled = await asyncio.to_thread(settle, raw, w.topic, w.partitions, cfg.settle_timeout_s)
        stop_readers.set()
        for t in readers:
            await asyncio.to_thread(t.join, 30)
        history.close()
    meta["faults"] = done
    meta["fault_counts"] = {f: sum(1 for d in done if d["fault"] == f) for f in sorted({d["fault"] for d in done})}
    meta["workers"] = {t.process: {"lib": t.lib, "kind": "transactional" if isinstance(t, TxnWorker) else "idempotent",
                                   "transactional_id": t.tid, "units": t.units, "instances": t._instances,
                                   "errors": t.errors, "stopped_with": t.error, "alive": t.is_alive(),
                                   **({"outcomes": t.outcomes} if isinstance(t, TxnWorker) else
                                      {"acked": t.acked, "unacked": t.unacked})}
                       for t in (*txn_workers, *idem_workers)}
    meta["readers"] = {"reader-rc": {"polls": readers[0].polls, "records": readers[0].records,
                                     "stopped_with": readers[0].error},
                       "reader-lso": {"samples": readers[1].samples, "failed": readers[1].failed}}
    if progress:
        progress(1.0, "reading back")
    readback: dict[str, Any] = {"topic": w.topic, "partitions": w.partitions, "settle": settled}
    readback["read_committed"] = await asyncio.to_thread(read_all, broker.bootstrap, w.topic, w.partitions, True,
                                                         cfg.read_timeout_s)
    readback["read_uncommitted"] = await asyncio.to_thread(read_all, broker.bootstrap, w.topic, w.partitions, False,
                                                           cfg.read_timeout_s)
    with RawBroker(broker.bootstrap, timeout=5.0) as raw:
        try:
            hw = await asyncio.to_thread(raw.list_offsets, w.topic, w.partitions, False)
            readback["log"] = await asyncio.to_thread(dump_log, raw, w.topic, w.partitions, hw,
                                                      time.monotonic() + cfg.read_timeout_s)
            readback["log"]["hw"] = {str(k): v for k, v in hw.items()}
        except ReadError as e:
            readback["log"] = {"batches": {}, "complete": False, "error": str(e)}
    _write_json(os.path.join(out, READBACK), readback)
    meta["broker"] = {"bootstrap": broker.bootstrap, "starts": broker.starts, "log_problems": broker.log_problems()}


async def _sleep(seconds: float, progress, t0: float, duration: float, done: list) -> None:
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if progress:
            progress(min((time.monotonic() - t0) / duration, 1.0), f"{len(done)} faults")
        if left <= 0:
            return
        await asyncio.sleep(min(left, 1.0))


# --------------------------------------------------------------------------
# Checking a run directory
# --------------------------------------------------------------------------

def run_meta(run_dir: str) -> dict | None:
    """The run's ``run.json``, or None if there is none (or it is not JSON)."""
    try:
        with open(os.path.join(run_dir, RUN)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def is_txn_run(run_dir: str) -> bool:
    meta = run_meta(run_dir)
    return meta is not None and meta.get("workload") == WORKLOAD


def check_dir(run_dir: str, write: bool = True, allow_torn_tail: bool = False) -> TxnVerdict:
    """Check (or re-check) a saved transactions run: history + read-back -> verdict."""
    if not os.path.isdir(run_dir):
        raise RunError(f"{run_dir}: no such directory")
    meta = run_meta(run_dir)
    if meta is None or meta.get("workload") != WORKLOAD:
        raise RunError(f"{run_dir}: no {RUN} of a transactions run")
    if not os.path.exists(os.path.join(run_dir, HISTORY)):
        raise RunError(f"{run_dir}: no {HISTORY}: the run did not start its workload")
    path = os.path.join(run_dir, READBACK)
    if not os.path.exists(path):
        raise RunError(f"{run_dir}: no {READBACK}: the run did not finish (its history alone cannot be checked)")
    try:
        with open(path) as f:
            readback = json.load(f)
        if not isinstance(readback, dict) or not {"read_committed", "read_uncommitted"} <= readback.keys():
            raise ValueError("not a read-back")
    except ValueError as e:
        raise RunError(f"{path}: {e}") from None
    ops = read_history(os.path.join(run_dir, HISTORY), allow_torn_tail=allow_torn_tail)
    try:
        verdict = check(ops, readback)
    except (KeyError, TypeError, ValueError) as e:
        raise HistoryError(path, None, f"malformed history or read-back: {type(e).__name__}: {e}") from None
    for name, wk in sorted(meta.get("workers", {}).items()):
        if wk.get("stopped_with"):
            verdict.warnings.append(f"{name} stopped before the end: {wk['stopped_with']}")
    stopped = meta.get("readers", {}).get("reader-rc", {}).get("stopped_with")
    if stopped:
        verdict.warnings.append(f"reader-rc stopped before the end: {stopped}")
    verdict.stats["run"] = {"seed": meta.get("seed"), "duration_s": meta.get("duration_s"),
                            "elapsed_s": meta.get("elapsed_s"), "fault_counts": meta.get("fault_counts"),
                            "versions": meta.get("versions")}
    if write:
        _write_json(os.path.join(run_dir, VERDICT), verdict.to_dict())
    return verdict
