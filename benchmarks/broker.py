"""Benchmark of the broker front end (broker/frontend.py) with real Kafka clients.

Run it (a Python with pidquorum, confluent-kafka and kio)::

    pidctl bench broker [--quick] [--json bench-results/broker.json]
                        [--phases init,leader_kill,produce] [--duration 60] [--rate 1000]
                        [--messages 50000] [--keep]

(``python -m benchmarks.broker`` takes the same options.)

Every phase starts a fresh three-node ``LocalCluster`` (default node options)
and one ``python -m broker`` process (broker 1, default adaptive
``PidManagerConfig``, ``--partitions 3``; ``benchmarks.processes.BrokerProcess``,
the harness the broker tests use too), all on free ports of 127.0.0.1, in
its own ``tempfile.mkdtemp()`` directory.  Child processes get this checkout
first on ``PYTHONPATH``, so they run the same code as the benchmark.  Latency
percentiles are nearest-rank over sorted samples.

1. InitProducerId latency through the broker.

   librdkafka (confluent-kafka ``Producer``, ``enable.sparse.connections=false``
   so the broker connection comes up at once, ``debug=protocol,eos`` into a
   Python logger, ``statistics.interval.ms=5``):

   a. ``--tx-ids`` (200; 50 quick) producers, each with its own
      ``transactional.id`` (tx-i): create, wait until the stats report the
      broker connection UP, then time ``init_transactions()`` around the call
      (FindCoordinator, coordinator connection, InitProducerId, which commits
      the new transactional id to the quorum).  Also librdkafka's own round
      trip of the InitProducerId request, parsed from its protocol debug line
      ``Received InitProducerIdResponse (... rtt X ms)`` (measured inside
      librdkafka, so it does not depend on when the log line reaches Python).
   b. ``--bumps`` (200; 50 quick) producers with the SAME transactional id,
      one after the other: each init_transactions() bumps the epoch in the
      quorum (KIP-360 path); the epochs must go up by one each time.
   c. ``--idem-producers`` (200; 50 quick) idempotent producers
      (``enable.idempotence``, no transactional id).  librdkafka acquires the
      PID in the background and has no API that says when.  Two sources are
      used: the stats JSON (``eos.idemp_state`` = Assigned, and
      ``ts - idemp_stateage``, librdkafka's CLOCK_MONOTONIC, which is Python's
      ``time.monotonic()`` on Linux) gives the moment the PID was assigned
      (1 ms resolution) -> "create -> PID assigned"; the protocol debug line
      gives librdkafka's InitProducerId rtt.  The eos debug lines "Acquiring
      ProducerId" / "Acquired PID{...}" reach a Python ``logger`` only from
      ``poll()`` (confluent-kafka forwards librdkafka's log queue to the poll
      queue): they are timely only while the application polls, which this
      phase does in a tight loop; the lag between the logger's hand-over of
      "Acquired" and the stats' Assigned time is reported as the soundness
      check of that method: if any exceeds 2 ms (a loaded machine delays the
      hand-over) the logger figure is printed as not sound and skipped.  During
      ``init_transactions()`` nothing polls, so for 1a/1b the log lines arrive
      in one burst after the call and only their rtt text is used.

   Over the wire (``quorum.client.quorum.Connection``, one connection, sequential):
   ``--wire-idem`` (2,000; 1,000 quick) idempotent InitProducerId v4
   requests, ``--wire-tx`` (500; 200 quick) with new transactional ids, and
   as many epoch bumps of one transactional id, after 50 unrecorded requests.

2. Leader kills (``--duration`` s, 60; 20 quick): the quorum leader (highest
   term among live nodes, by DescribeState) is SIGKILLed every
   ``--kill-every`` s (5) plus a 0..1 s staggered offset frac(i x 0.618) x
   (block / rate), and restarted ``--restart-after`` s (1) later, as in
   benchmarks.pid_manager.  Meanwhile, open loop (a pacer issues every 10 ms the
   requests owed since the start, without waiting for answers):

   * ``adaptive``: broker 1 (the process), ``--rate`` (1,000) idempotent
     InitProducerId v4 requests/s over 4 connections;
   * ``kafka-like`` (the peer): the same load against broker 2 built with
     ``PidManagerConfig.kafka_fixed_threshold()`` (one block in reserve, asked
     for at 90 % use).  ``pidctl broker start`` has no option for the
     PID-manager config, so this broker runs IN PROCESS: a
     ``broker.frontend.BrokerServer`` in this benchmark's event loop, on a
     free port.  It therefore shares the loop (and a core) with the load
     clients; the adaptive broker has a process of its own;
   * ``--tx-rate`` (20) transactional InitProducerId requests/s to broker 1,
     each with a new transactional id on a fresh connection (as distinct
     producers would); these wait for a quorum commit.

   Every response's error code is counted (COORDINATOR_LOAD_IN_PROGRESS
   expected 0 for the adaptive broker), client timeouts (10 s idempotent,
   30 s transactional) and dropped connections too; latency p50/p99/max.  All
   returned PIDs (both brokers and the transactional ones) must be distinct,
   and after the run each broker's idempotent PIDs must lie inside blocks that
   the quorum's audit trails record for that broker.  The pacers' lateness is
   recorded: a tick 250 ms late or more means this process stalled (e.g. an
   overloaded machine), and the latency tail it caused is the benchmark's own,
   so the run fails that check rather than blame the broker.  Each kill's
   lateness and the time DescribeState polling needed to find a leader before
   it are recorded too (a long search = a leaderless quorum).

3. Produce throughput (librdkafka): ``--messages`` (500,000; 100,000 quick)
   messages of ``--message-bytes`` (100) bytes to a 3-partition topic, as fast
   as the producer takes them (produce() with poll(0), flush() at the end;
   linger.ms 5, librdkafka's default batching): ``idempotent``
   (enable.idempotence, acks=all) and, as the peer, ``plain``
   (enable.idempotence=false, acks=1), in alternating rounds (I P P I P I I P,
   each a quarter of the messages, a new producer per round warmed up with
   100 messages), so that a busy machine's noise falls on both alike.
   Messages/s from the first produce() to the end of flush(); delivery latency
   from ``Message.latency()`` (produce() to acknowledgement; in a burst this
   is mostly time queued in the producer).  The broker process's CPU seconds
   per round show which side set the pace (at ~450,000 msg/s a 50,000-message
   burst lasts ~0.1 s, too short to measure, hence the larger default).  The
   partitions' high watermarks must equal the messages delivered (no loss, no
   duplicate).

Figures print as tables on stdout (progress on stderr); every figure, with the
parameters, the machine (CPUs, load average and CPU seconds used by the
broker process and this process per phase) and versions, is written as JSON to
``--json``.  Exit status 1 if a phase failed or a check did not pass (listed
under FAILED CHECKS).  Two cores shared by three nodes, a broker and this
process: the figures are noisy; compare figures from the same run.
"""
from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import re
import sys
import time
from collections import Counter

import confluent_kafka
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from broker.frontend import BrokerConfig, BrokerServer
from broker.pid_manager import PidManagerConfig
from quorum.client.quorum import Connection, ConnectionFailed
from quorum.localcluster import LocalCluster, free_ports
from quorum.trail import iter_blocks
from records.wire import kafka
from records.wire.errors import Errors, RequestTimedOutError

from .common import HOST, LeaderKill, check_inside, kill_leaders, paced, percentile, temp_cluster
from .harness import environment_info, loadavg, log, run_phases, utc_now
from .processes import REPO, BrokerProcess, child_env, cpu_seconds
from .report import fmt_num as f, print_footer, table

BLOCK = 1000
TICK_S = 0.01
INIT_PRODUCER_ID = 22
TXN_TIMEOUT = datetime.timedelta(milliseconds=60_000)
IDEM_CLIENT_TIMEOUT_S = 10.0
TX_CLIENT_TIMEOUT_S = 30.0
LOG_LAG_BOUND_MS = 2.0
STALL_MS = 50.0        # a pacer tick this late counts as a stall of the load generator
STALL_FAIL_MS = 250.0  # a stall this long makes phase 2's latency tail a figure of this process, not the broker
RTT_RE = re.compile(r"Received InitProducerIdResponse \(v(\d+),.*rtt ([0-9.]+)ms")
ACQUIRED_RE = re.compile(r"Acquired PID\{Id:(-?\d+),Epoch:(-?\d+)\}")


# --------------------------------------------------------------------------- stats
def summarize_ms(values, scale: float = 1000.0) -> dict:
    """n, p50, p99, max, mean (ms) of values given in seconds (``scale`` 1 if already ms)."""
    s = sorted(v * scale for v in values)
    if not s:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "max_ms": None, "mean_ms": None, "min_ms": None}
    return {"n": len(s), "min_ms": s[0], "p50_ms": percentile(s, 50), "p99_ms": percentile(s, 99),
            "max_ms": s[-1], "mean_ms": sum(s) / len(s)}


def code_name(code: int) -> str:
    try:
        return Errors(code).name
    except ValueError:
        return f"ERROR_CODE_{code}"


def machine() -> dict:
    return {"loadavg": loadavg(), "bench_cpu_s": cpu_seconds(os.getpid())}


@contextlib.contextmanager
def environment(args, label: str):
    """A fresh three-node cluster plus broker 1 (process, --partitions 3): yields (lc, broker, directory)."""
    with temp_cluster(f"pidquorum-bench-broker-{label}-", args.keep, label, subdir="cluster",
                      tail_lines=20) as (lc, directory):
        broker = BrokerProcess(directory, 1, lc.client_addresses(), "--partitions", "3", new_session=True).start()
        ok = False
        try:
            yield lc, broker, directory
            ok = True
        finally:
            if not ok:
                log(f"----- {label}: broker 1 log tail -----\n{broker.tail(30)}")
            broker.stop()


# ------------------------------------------------------------ librdkafka probes
class _Lines(logging.Handler):
    """librdkafka log lines as handed to Python, with the monotonic time of the hand-over."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))


class RkProbe:
    """A confluent-kafka Producer whose logs (debug protocol,eos) and 5 ms stats are recorded.

    The stats callback closes over a list, not over the probe, so dropping the probe
    destroys the librdkafka handle at once (no reference cycle)."""

    def __init__(self, bootstrap: str, broker_id: int, **conf):
        self.handler = _Lines()
        lg = logging.Logger("rdkafka-probe")  # not registered: one per producer, garbage-collected with it
        lg.addHandler(self.handler)
        lg.setLevel(logging.DEBUG)
        stats: list[dict] = []
        self.stats = stats
        self.broker_id = broker_id
        self.t_create = time.monotonic()
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.sparse.connections": False,
                                  "statistics.interval.ms": 5, "debug": "protocol,eos", "logger": lg,
                                  "stats_cb": lambda s: stats.append(json.loads(s)), **conf})

    def broker_up(self) -> bool:
        return bool(self.stats) and any(b.get("nodeid") == self.broker_id and b.get("state") == "UP"
                                        for b in self.stats[-1].get("brokers", {}).values())

    def assigned_stats(self) -> dict | None:
        for s in self.stats:
            if s.get("eos", {}).get("idemp_state") == "Assigned":
                return s
        return None

    def poll_until(self, pred, timeout: float, step: float = 0.002) -> bool:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                return False
            self.producer.poll(step)
        return True

    def rtts_ms(self) -> list[float]:
        return [float(m.group(2)) for _, line in self.handler.lines for m in [RTT_RE.search(line)] if m]

    def acquired(self) -> tuple[float, int, int] | None:
        """(hand-over time, pid, epoch) of the first "Acquired PID{...}" line."""
        for t, line in self.handler.lines:
            m = ACQUIRED_RE.search(line)
            if m:
                return t, int(m.group(1)), int(m.group(2))
        return None

    def handed_over(self, needle: str) -> float | None:
        return next((t for t, line in self.handler.lines if needle in line), None)

    def close(self) -> float:
        t0 = time.perf_counter()
        self.producer = None  # rd_kafka_destroy()
        return time.perf_counter() - t0


def rk_transactional(bootstrap: str, tid: str, n: int, timeout: float, label: str) -> dict:
    """n producers with transactional id ``tid`` (or tid-i if tid ends with '-'): init_transactions() each."""
    init_s, connect_s, rtts, destroy_s = [], [], [], []
    acquired: list[tuple[int, int]] = []
    errors: Counter = Counter()
    multi_rtt = 0
    for i in range(n):
        t = f"{tid}{i}" if tid.endswith("-") else tid
        probe = RkProbe(bootstrap, 1, **{"transactional.id": t})
        if not probe.poll_until(probe.broker_up, 5.0):
            errors["broker connection not UP within 5 s (measured anyway)"] += 1
        connect_s.append(time.monotonic() - probe.t_create)
        t0 = time.perf_counter()
        try:
            probe.producer.init_transactions(timeout)
            init_s.append(time.perf_counter() - t0)
        except KafkaException as e:
            errors[f"init_transactions: {e.args[0].name()}"] += 1
        probe.producer.poll(0)  # hand the log lines queued during the call over to Python
        r = probe.rtts_ms()
        if r:
            rtts.append(r[-1])
            multi_rtt += len(r) > 1
        a = probe.acquired()
        if a:
            acquired.append((a[1], a[2]))
        destroy_s.append(probe.close())
        if (i + 1) % 50 == 0:
            log(f"  {label}: {i + 1}/{n}")
    return {"producers": n, "errors": dict(errors), "init_transactions": summarize_ms(init_s),
            "connect_before_init": summarize_ms(connect_s), "rdkafka_rtt": summarize_ms(rtts, 1.0),
            "producers_with_more_than_one_InitProducerId": multi_rtt, "destroy": summarize_ms(destroy_s),
            "acquired": acquired}


def rk_idempotent(bootstrap: str, n: int) -> dict:
    create_to_assigned, rtts, log_lag, log_acq_to_acq, lag_index = [], [], [], [], []
    errors: Counter = Counter()
    pids = []
    same_clock = sys.platform.startswith("linux")  # rd_clock() and time.monotonic() are both CLOCK_MONOTONIC
    for i in range(n):
        probe = RkProbe(bootstrap, 1, **{"enable.idempotence": True})
        # This thread polls without pause: stats and log lines are handed over as librdkafka queues them.
        if not probe.poll_until(lambda: probe.assigned_stats() is not None, 10.0, step=0.001):
            errors["no PID assigned within 10 s"] += 1
            probe.close()
            continue
        probe.producer.poll(0)
        s = probe.assigned_stats()
        assigned_at = s["ts"] / 1e6 - s["eos"]["idemp_stateage"] / 1e3
        if same_clock:
            create_to_assigned.append(assigned_at - probe.t_create)
        pids.append(s["eos"].get("producer_id"))
        r = probe.rtts_ms()
        if r:
            rtts.append(r[-1])
        a = probe.acquired()
        acq_start = probe.handed_over("Acquiring ProducerId")
        if a and same_clock:
            log_lag.append(a[0] - assigned_at)
            lag_index.append(i)
        if a and acq_start is not None:
            log_acq_to_acq.append(a[0] - acq_start)
        probe.close()
        if (i + 1) % 50 == 0:
            log(f"  idempotent librdkafka producers: {i + 1}/{n}")
    worst = max(range(len(log_lag)), key=lambda j: abs(log_lag[j]), default=None)
    lag_ms = sorted(x * 1000 for x in log_lag)
    sound = bool(lag_ms) and all(abs(x) <= LOG_LAG_BOUND_MS for x in lag_ms)
    return {"producers": n, "errors": dict(errors), "create_to_pid_assigned": summarize_ms(create_to_assigned),
            "rdkafka_rtt": summarize_ms(rtts, 1.0),
            "logger_acquiring_to_acquired": summarize_ms(log_acq_to_acq),
            "logger_lag_vs_stats_ms": {"n": len(lag_ms), "min": lag_ms[0] if lag_ms else None,
                                       "p50": percentile(lag_ms, 50), "max": lag_ms[-1] if lag_ms else None,
                                       "bound": LOG_LAG_BOUND_MS,
                                       "worst_at_producer": None if worst is None else lag_index[worst],
                                       "over_bound": sum(abs(x) > LOG_LAG_BOUND_MS for x in lag_ms)},
            "logger_timing_sound": sound,
            "pids_distinct": len(pids) == len(set(pids)), "pids": len(pids)}


# ------------------------------------------------------------------ wire helpers
def init_body(tid: str | None, pid: int = -1, epoch: int = -1):
    return kafka.request_entity(INIT_PRODUCER_ID, 4, transactional_id=tid, transaction_timeout=TXN_TIMEOUT,
                            producer_id=pid, producer_epoch=epoch)


async def wire_sequential(address: str, bodies, label: str) -> dict:
    """One connection, one request at a time: latency, error codes, (pid, epoch) of each success."""
    conn = Connection(address, f"bench-{label}")
    lat, errors, got = [], Counter(), []
    try:
        for body in bodies:
            t0 = time.perf_counter()
            try:
                resp = await conn.call(body, TX_CLIENT_TIMEOUT_S)
            except RequestTimedOutError:
                errors["CLIENT_TIMEOUT"] += 1
                continue
            except ConnectionFailed:
                errors["CONNECTION_FAILED"] += 1
                continue
            lat.append(time.perf_counter() - t0)
            code = int(resp.error_code)
            if code:
                errors[code_name(code)] += 1
            else:
                got.append((int(resp.producer_id), int(resp.producer_epoch)))
    finally:
        conn.close()
    return {"requests": len(lat) + sum(v for k, v in errors.items() if k in ("CLIENT_TIMEOUT", "CONNECTION_FAILED")),
            "latency": summarize_ms(lat), "errors": dict(errors), "got": got}


async def phase1_wire(args, address: str) -> dict:
    await wire_sequential(address, (init_body(None) for _ in range(50)), "warmup")
    idem = await wire_sequential(address, (init_body(None) for _ in range(args.wire_idem)), "wire-idem")
    tx = await wire_sequential(address, (init_body(f"wire-tx-{i}") for i in range(args.wire_tx)), "wire-tx")
    await wire_sequential(address, [init_body("wire-bump")], "warmup")
    bump = await wire_sequential(address, (init_body("wire-bump") for _ in range(args.wire_tx)), "wire-bump")
    return {"idempotent": idem, "transactional_new_id": tx, "transactional_bump": bump}


# ------------------------------------------------------------------ 1. InitProducerId
def phase_init(args) -> dict:
    log(f"phase 1: InitProducerId: librdkafka {args.tx_ids} transactional ids, {args.bumps} bumps, "
        f"{args.idem_producers} idempotent producers; wire {args.wire_idem} idempotent, {args.wire_tx} tx, "
        f"{args.wire_tx} bumps")
    with environment(args, "init") as (lc, broker, _):
        m0, b0 = machine(), broker.cpu_seconds()
        out: dict = {"broker": broker.bootstrap, "machine_start": m0}
        out["rdkafka_transactional"] = rk_transactional(broker.bootstrap, "tx-", args.tx_ids, args.init_timeout,
                                                        "transactional ids")
        rk_transactional(broker.bootstrap, "tx-bump", 1, args.init_timeout, "bump warm-up")  # creates the id
        out["rdkafka_bump"] = rk_transactional(broker.bootstrap, "tx-bump", args.bumps, args.init_timeout, "bumps")
        out["rdkafka_idempotent"] = rk_idempotent(broker.bootstrap, args.idem_producers)
        log("  wire requests")
        out["wire"] = asyncio.run(phase1_wire(args, broker.bootstrap))
        out["machine_end"] = machine()
        b1 = broker.cpu_seconds()
        out["broker_cpu_s"] = None if b0 is None or b1 is None else b1 - b0
        out["broker_anomalies"] = broker.anomalies()
    # Checks on what was returned (kept out of the printed tables).
    tx = out["rdkafka_transactional"]
    pids = [pid for pid, _ in tx.pop("acquired")]
    tx["pids_distinct"] = len(pids) == len(set(pids))
    bump = out["rdkafka_bump"]
    seq = bump.pop("acquired")
    bump["epochs"] = [seq[0][1], seq[-1][1]] if seq else None
    bump["epochs_step_by_one"] = len(seq) == bump["producers"] and all(
        b[1] == a[1] + 1 and b[0] == a[0] for a, b in zip(seq, seq[1:]))
    w = out["wire"]
    for key in ("idempotent", "transactional_new_id", "transactional_bump"):
        got = w[key].pop("got")
        w[key]["ok"] = len(got)
        if key == "transactional_bump":
            w[key]["epochs"] = [got[0][1], got[-1][1]] if got else None
            w[key]["epochs_step_by_one"] = all(b[1] == a[1] + 1 and b[0] == a[0] for a, b in zip(got, got[1:]))
        else:
            w[key]["pids_distinct"] = len(got) == len({pid for pid, _ in got})
    return out


# ------------------------------------------------------------------ 2. leader kills
async def killer(lc: LocalCluster, t_start: float, t_stop: float, every: float, restart_after: float,
                 stagger_s: float, rounds: list[dict]) -> None:
    """Leader kills (benchmarks.common.kill_leaders), with how late each was and the leader search before it."""
    def on_round(k: LeaderKill) -> None:
        rounds.append({"round": k.round, "at_s": k.at_s, "scheduled_at_s": k.scheduled_at_s, "late_s": k.late_s,
                       "leader_search_before_kill_s": k.leader_search_before_kill_s, "killed_node": k.killed_node,
                       "new_leader": k.new_leader, "new_leader_seen_after_s": k.new_leader_seen_after_s,
                       "restart_ready_s": k.restart_ready_s})
        log(k.summary())

    await kill_leaders(lc, t_start, t_stop, every, restart_after, stagger_s, on_round)


class WireLoad:
    """Open-loop InitProducerId v4 requests at ``rate``/s: every 10 ms the requests owed since the start.

    Idempotent (``tx_prefix`` None): round-robin over ``n_conns`` persistent connections.
    Transactional: a new transactional id per request, each on a fresh connection (as distinct
    producers), latency measured from the request's send (after the connect)."""

    def __init__(self, label: str, address: str, rate: float, n_conns: int = 4, tx_prefix: str | None = None,
                 timeout: float = IDEM_CLIENT_TIMEOUT_S):
        self.label, self.address, self.rate, self.tx_prefix, self.timeout = label, address, rate, tx_prefix, timeout
        self.conns = [Connection(address, f"bench-{label}-{i}") for i in range(n_conns)] if tx_prefix is None else []
        self.sent = 0
        self.lat_ok = array.array("d")
        self.lat_err = array.array("d")
        self.pids = array.array("q")
        self.errors: Counter = Counter()
        self.error_times: list[tuple[float, str]] = []
        self.slowest: tuple[float, float] | None = None  # (latency s, issued at s)
        self.max_tick_lag_s = 0.0
        self.stalls: list[tuple[float, float]] = []  # (at s, ms) pacer ticks >= STALL_MS late
        self.tasks: set[asyncio.Task] = set()
        self.t_start = 0.0

    def _error(self, name: str, t_issue: float) -> None:
        self.errors[name] += 1
        if len(self.error_times) < 5000:
            self.error_times.append((round(t_issue - self.t_start, 3), name))

    async def _one(self, n: int) -> None:
        t_issue = time.perf_counter()
        conn = None
        try:
            if self.tx_prefix is None:
                conn, body = self.conns[n % len(self.conns)], init_body(None)
            else:
                conn, body = Connection(self.address, f"bench-{self.label}"), init_body(f"{self.tx_prefix}{n}")
                await conn.connect(self.timeout)
            t0 = time.perf_counter()
            resp = await conn.call(body, self.timeout)
        except RequestTimedOutError:
            self._error(f"CLIENT_TIMEOUT (> {self.timeout:g} s)", t_issue)
            return
        except ConnectionFailed:
            self._error("CONNECTION_FAILED", t_issue)
            return
        finally:
            if self.tx_prefix is not None and conn is not None:
                conn.close()
        dt = time.perf_counter() - t0
        if self.slowest is None or dt > self.slowest[0]:
            self.slowest = (dt, t_issue - self.t_start)
        code = int(resp.error_code)
        if code:
            self.lat_err.append(dt)
            self._error(code_name(code), t_issue)
        else:
            self.lat_ok.append(dt)
            self.pids.append(int(resp.producer_id))

    async def run(self, t_start: float, t_stop: float) -> None:
        self.t_start = t_start
        async for due, now in paced(t_start, TICK_S, time.perf_counter):
            self.max_tick_lag_s = max(self.max_tick_lag_s, now - due)
            if now - due >= STALL_MS / 1000 and len(self.stalls) < 1000:
                self.stalls.append((round(due - t_start, 3), round((now - due) * 1000, 1)))
            owed = int((min(now, t_stop) - t_start) * self.rate) - self.sent
            for _ in range(max(0, owed)):
                t = asyncio.get_running_loop().create_task(self._one(self.sent))
                self.tasks.add(t)
                t.add_done_callback(self.tasks.discard)
                self.sent += 1
            if now >= t_stop:
                break
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)
        for c in self.conns:
            c.close()

    def result(self, wall: float) -> dict:
        answered = len(self.lat_ok) + len(self.lat_err)
        return {"target_rate_per_s": self.rate, "sent": self.sent, "sent_per_s": self.sent / wall if wall else None,
                "answered": answered, "ok": len(self.lat_ok), "errors": dict(self.errors),
                "latency_ok": summarize_ms(self.lat_ok), "latency_all_answered": summarize_ms(
                    list(self.lat_ok) + list(self.lat_err)),
                "slowest": None if self.slowest is None else {"latency_ms": self.slowest[0] * 1000,
                                                              "issued_at_s": self.slowest[1]},
                "max_pacer_lag_ms": self.max_tick_lag_s * 1000, "pacer_stalls": self.stalls,
                "error_times": self.error_times,
                "error_spells": spells(self.error_times),
                "pids_distinct_within": len(self.pids) == len(set(self.pids))}


def spells(error_times: list, gap: float = 0.5) -> list[dict]:
    """Errors grouped into spells (no two consecutive errors more than ``gap`` s apart)."""
    out: list[dict] = []
    for t, name in error_times:
        if out and t - out[-1]["last_s"] <= gap:
            out[-1]["last_s"] = t
            out[-1]["count"] += 1
            out[-1]["codes"][name] = out[-1]["codes"].get(name, 0) + 1
        else:
            out.append({"first_s": t, "last_s": t, "count": 1, "codes": {name: 1}})
    return out


async def leader_kill_run(args, lc: LocalCluster, broker: BrokerProcess, directory: str) -> dict:
    blog = logging.getLogger("broker")
    qlog = logging.getLogger("quorum")
    fh = logging.FileHandler(os.path.join(directory, "broker-2-in-process.log"))
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for lg in (blog, qlog):
        lg.addHandler(fh)
        lg.setLevel(logging.INFO)
        lg.propagate = False
    peer_port = free_ports(1, HOST)[0]
    peer_cfg = BrokerConfig(broker_id=2, quorum=lc.client_addresses(), listen=f"{HOST}:{peer_port}",
                            data_dir=os.path.join(directory, "broker-2-data"), default_partitions=3,
                            pid_manager=PidManagerConfig.kafka_fixed_threshold())
    peer = BrokerServer(peer_cfg)
    rounds: list[dict] = []
    try:
        await peer.start()
        peer_addr = f"{HOST}:{peer.port}"
        loads = {"adaptive": WireLoad("adaptive", broker.bootstrap, args.rate),
                 "kafka-like": WireLoad("kafka-like", peer_addr, args.rate)}
        tx = WireLoad("tx", broker.bootstrap, args.tx_rate, tx_prefix="kill-tx-", timeout=TX_CLIENT_TIMEOUT_S)
        m0, b0, t_cpu0 = machine(), broker.cpu_seconds(), time.process_time()
        t_start = time.perf_counter()
        t_stop = t_start + args.duration
        await asyncio.gather(*(w.run(t_start, t_stop) for w in (*loads.values(), tx)),
                             killer(lc, t_start, t_stop, args.kill_every, args.restart_after,
                                    0.0 if args.no_stagger else BLOCK / args.rate, rounds))
        wall = time.perf_counter() - t_start
        b1 = broker.cpu_seconds()
        peer_stats = peer.pids.stats() if peer.pids is not None else None
        peer_counters = dict(peer.counters)
    finally:
        await peer.stop()
        for lg in (blog, qlog):
            lg.removeHandler(fh)
        fh.close()
    return {"loads": loads, "tx": tx, "wall": wall, "rounds": rounds, "machine_start": m0, "machine_end": machine(),
            "broker_cpu_s": None if b0 is None or b1 is None else b1 - b0,
            "bench_process_cpu_s": time.process_time() - t_cpu0,
            "peer": {"address": peer_addr, "pid_manager_stats": peer_stats, "counters": peer_counters,
                     "config": dataclasses.asdict(peer_cfg.pid_manager)}}


def phase_kills(args) -> dict:
    log(f"phase 2: {args.duration:.0f}s, {args.rate:.0f} idempotent InitProducerId/s per broker + "
        f"{args.tx_rate:g} transactional/s, leader SIGKILL every {args.kill_every:g}s, restart after "
        f"{args.restart_after:g}s; kafka-like peer broker in process")
    with environment(args, "kills") as (lc, broker, directory):
        run = asyncio.run(leader_kill_run(args, lc, broker, directory))
        anomalies = broker.anomalies()
        broker.stop()
        lc.down(timeout=10)
        trails = [os.path.join(lc.data_dir(n.node_id), "audit.log") for n in lc.nodes()]
        audit = list(iter_blocks(trails))
    wall = run["wall"]
    loads, tx = run["loads"], run["tx"]
    per = {}
    everything = array.array("q")
    for (label, w), broker_id in zip(loads.items(), (1, 2)):
        res = w.result(wall)
        mine = [(b["producer_id_start"], b["producer_id_start"] + b["producer_id_len"])
                for b in audit if b["broker_id"] == broker_id]
        res["broker_id"] = broker_id
        res["inside_quorum_blocks"] = check_inside(w.pids, mine)
        res["load_in_progress"] = w.errors.get("COORDINATOR_LOAD_IN_PROGRESS", 0)
        everything.extend(w.pids)
        per[label] = res
    per["adaptive"]["how"] = "python -m broker process (default PidManagerConfig)"
    per["kafka-like"]["how"] = ("in process: BrokerServer in the benchmark's event loop with "
                                "PidManagerConfig.kafka_fixed_threshold()")
    txr = tx.result(wall)
    everything.extend(tx.pids)
    total = len(everything)
    return {"duration_s": args.duration, "wall_s": wall, "rate_per_broker": args.rate, "tx_rate": args.tx_rate,
            "kill_every_s": args.kill_every, "restart_after_s": args.restart_after, "kills": len(run["rounds"]),
            "kill_stagger": None if args.no_stagger else "kill i at i*kill_every + frac(i*0.618)*block/rate",
            "brokers": per, "transactional": txr, "all_pids": total, "duplicates": total - len(set(everything)),
            "rounds": run["rounds"], "audit_blocks": len(audit), "peer": run["peer"],
            "machine_start": run["machine_start"], "machine_end": run["machine_end"],
            "broker_process_cpu_s": run["broker_cpu_s"],
            "bench_process_cpu_s": run["bench_process_cpu_s"],
            "broker_anomalies": anomalies,
            "definitions": {
                "latency_ok": "send of the request to its answer, successful answers (ms)",
                "errors": "answers by error code, plus client timeouts and dropped connections (no retries: "
                          "every request is one attempt)",
                "duplicates": "all PIDs returned (both brokers and the transactional requests) minus distinct ones",
                "sent_per_s": "requests issued per second of wall time (the pacer's achieved rate)",
                "bench_process_cpu_s": "CPU s of this process: the load clients and the in-process kafka-like "
                                       "broker"}}


# ------------------------------------------------------------------ 3. produce
def produce_round(bootstrap: str, topic: str, n: int, size: int, conf: dict, broker_cpu) -> dict:
    lat = array.array("d")
    errors: Counter = Counter()
    lines = _Lines()
    lg = logging.Logger("rdkafka-produce")
    lg.addHandler(lines)
    lg.setLevel(logging.WARNING)

    def dr(err, msg):
        if err is not None:
            errors[err.name()] += 1
        else:
            lat.append(msg.latency())

    prod = Producer({"bootstrap.servers": bootstrap, "enable.sparse.connections": False, "linger.ms": 5,
                     "message.timeout.ms": 60_000, "logger": lg, **conf})
    value = b"x" * size
    for i in range(100):  # warm-up: connection, metadata, PID (idempotent)
        prod.produce(topic, value=value, on_delivery=dr)
    if prod.flush(30):
        raise RuntimeError(f"{topic}: warm-up not delivered within 30 s")
    warm_ok, warm_err = len(lat), sum(errors.values())
    lat = array.array("d")
    errors.clear()
    buffer_full = 0
    cpu0 = broker_cpu()
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                prod.produce(topic, value=value, on_delivery=dr)
                break
            except BufferError:
                buffer_full += 1
                prod.poll(0.001)
        if i % 500 == 0:
            prod.poll(0)
    left = prod.flush(120)
    wall = time.perf_counter() - t0
    cpu1 = broker_cpu()
    prod = None
    return {"messages": n, "wall_s": wall, "delivered": len(lat), "errors": dict(errors), "undelivered": left,
            "broker_cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
            "latencies": lat, "buffer_full_waits": buffer_full, "warmup_delivered": warm_ok,
            "warmup_errors": warm_err, "client_warnings": len(lines.lines)}


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks", "enable.auto.commit": False,
                  "log_level": 3})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, i), timeout=10)[1] for i in range(partitions)]
    finally:
        c.close()


def phase_produce(args) -> dict:
    n = args.messages
    log(f"phase 3: produce {n:,} x {args.message_bytes} B, idempotent (acks=all) vs plain (acks=1), "
        f"rounds I P P I P I I P")
    configs = {"idempotent": {"enable.idempotence": True, "acks": "all"},
               "plain": {"enable.idempotence": False, "acks": 1}}
    order = ["idempotent", "plain", "plain", "idempotent", "plain", "idempotent", "idempotent", "plain"]
    per_round = [n // 4 + (1 if k < n % 4 else 0) for k in range(4)]
    seen = Counter()
    with environment(args, "produce") as (lc, broker, _):
        m0, b0 = machine(), broker.cpu_seconds()
        rounds = {k: [] for k in configs}
        for label in order:
            k = seen[label]
            seen[label] += 1
            r = produce_round(broker.bootstrap, f"bench-{label}", per_round[k], args.message_bytes, configs[label],
                              broker.cpu_seconds)
            log(f"  {label} round {k + 1}: {r['messages']:,} in {r['wall_s']:.2f}s "
                f"({r['messages'] / r['wall_s']:,.0f} msg/s)")
            rounds[label].append(r)
        marks = {label: high_watermarks(broker.bootstrap, f"bench-{label}", 3) for label in configs}
        b1 = broker.cpu_seconds()
        out = {"message_bytes": args.message_bytes, "order": order, "machine_start": m0, "machine_end": machine(),
               "broker_cpu_s": None if b0 is None or b1 is None else b1 - b0,
               "broker_anomalies": broker.anomalies(), "producers": {}}
    for label, rs in rounds.items():
        lat = [x for r in rs for x in r.pop("latencies")]
        msgs = sum(r["messages"] for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        delivered = sum(r["delivered"] for r in rs)
        warm = sum(r["warmup_delivered"] for r in rs)
        out["producers"][label] = {
            "config": configs[label], "messages": msgs, "wall_s": wall, "msgs_per_s": msgs / wall if wall else None,
            "delivered": delivered, "delivery_errors": dict(sum((Counter(r["errors"]) for r in rs), Counter())),
            "undelivered": sum(r["undelivered"] for r in rs), "delivery_latency": summarize_ms(lat),
            "rounds": rs, "high_watermarks": marks[label], "log_end_total": sum(marks[label]),
            "expected_log_end_total": delivered + warm,
            "rounds_msgs_per_s": [r["messages"] / r["wall_s"] for r in rs],
            "broker_cpu_s": (sum(r["broker_cpu_s"] for r in rs)
                             if all(r["broker_cpu_s"] is not None for r in rs) else None),
            "bench_note": "produce() is called from Python one message at a time"}
        x = out["producers"][label]
        x["broker_cpu_us_per_msg"] = x["broker_cpu_s"] / msgs * 1e6 if x["broker_cpu_s"] is not None else None
        x["broker_cpu_fraction_of_wall"] = x["broker_cpu_s"] / wall if x["broker_cpu_s"] is not None else None
    i, pl = out["producers"]["idempotent"], out["producers"]["plain"]
    out["idempotent_over_plain_throughput"] = (i["msgs_per_s"] / pl["msgs_per_s"]
                                               if i["msgs_per_s"] and pl["msgs_per_s"] else None)
    return out


# ---------------------------------------------------------------------- printing
def lat_cells(s: dict, fmt: str = ".2f") -> list:
    return [s["n"], f(s["p50_ms"], fmt), f(s["p99_ms"], fmt), f(s["max_ms"], fmt)]


def errs(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "0"


def print_results(res: dict) -> None:
    pa, env = res["params"], res["environment"]
    print()
    print(f"Broker front-end benchmark ({'quick' if pa['quick'] else 'full'} run; {env['cpu_count']} CPUs, "
          f"Python {env['python']}, confluent-kafka {env['confluent_kafka']} / librdkafka {env['librdkafka']}, "
          f"load avg at start {env['loadavg_start']})")
    print()
    ph = res["phases"].get("init")
    if ph:
        tx, bump, idem, w = ph["rdkafka_transactional"], ph["rdkafka_bump"], ph["rdkafka_idempotent"], ph["wire"]
        rows = [
            ["librdkafka init_transactions(), new transactional id", *lat_cells(tx["init_transactions"]),
             errs(tx["errors"])],
            ["  librdkafka's InitProducerId rtt (its debug log)", *lat_cells(tx["rdkafka_rtt"]), ""],
            ["librdkafka init_transactions(), same id (epoch bump)", *lat_cells(bump["init_transactions"]),
             errs(bump["errors"])],
            ["  librdkafka's InitProducerId rtt (its debug log)", *lat_cells(bump["rdkafka_rtt"]), ""],
            ["librdkafka idempotent: create -> PID assigned (stats)", *lat_cells(idem["create_to_pid_assigned"]),
             errs(idem["errors"])],
            ["  librdkafka's InitProducerId rtt (its debug log)", *lat_cells(idem["rdkafka_rtt"]), ""],
            ["  'Acquiring' -> 'Acquired' as handed to the logger",
             *(lat_cells(idem["logger_acquiring_to_acquired"]) if idem["logger_timing_sound"]
               else [idem["logger_acquiring_to_acquired"]["n"], "skipped", "(not", "sound)"]), ""],
            ["wire v4, idempotent (no transactional id)", *lat_cells(w["idempotent"]["latency"], ".3f"),
             errs(w["idempotent"]["errors"])],
            ["wire v4, new transactional id", *lat_cells(w["transactional_new_id"]["latency"]),
             errs(w["transactional_new_id"]["errors"])],
            ["wire v4, same transactional id (epoch bump)", *lat_cells(w["transactional_bump"]["latency"]),
             errs(w["transactional_bump"]["errors"])],
        ]
        print(table("1. InitProducerId latency through broker 1 (process), sequential, no faults",
                    ["path", "n", "p50 ms", "p99 ms", "max ms", "errors"], rows))
        lag = idem["logger_lag_vs_stats_ms"]
        print(f"  librdkafka connection UP before init_transactions(): p50 "
              f"{f(tx['connect_before_init']['p50_ms'], '.1f')} ms (not in the init figure); "
              f"bump epochs {bump['epochs']}")
        print(f"  logger-callback timing (idempotent, application polling without pause): hand-over of 'Acquired' "
              f"minus stats' Assigned time {f(lag['min'])}..{f(lag['max'])} ms, {lag['over_bound']} of {lag['n']} "
              f"beyond +-{lag['bound']:g} ms ("
              f"stats age has 1 ms resolution): "
              f"{'sound' if idem['logger_timing_sound'] else 'NOT SOUND in this run, figure skipped'}; "
              f"during init_transactions() nothing polls, so its log lines arrive after the call")
        print(f"  CPU s: broker process {f(ph['broker_cpu_s'], '.1f')}; load avg {ph['machine_start']['loadavg']} -> "
              f"{ph['machine_end']['loadavg']}")
        if ph["broker_anomalies"]:
            print(f"  broker log: {errs(ph['broker_anomalies'])}")
        print()
    k = res["phases"].get("leader_kill")
    if k:
        rows = []
        for label, b in k["brokers"].items():
            rows.append([label, f"{b['sent']:,}", f(b["sent_per_s"], ".0f"), f"{b['ok']:,}", b["load_in_progress"],
                         errs({x: v for x, v in b["errors"].items() if x != "COORDINATOR_LOAD_IN_PROGRESS"}),
                         f(b["latency_ok"]["p50_ms"], ".2f"), f(b["latency_ok"]["p99_ms"], ".2f"),
                         f(b["latency_ok"]["max_ms"], ".1f"), b["inside_quorum_blocks"]["outside"]])
        print(table(f"2. {k['kills']} leader SIGKILLs in {k['duration_s']:.0f} s (every {k['kill_every_s']:g} s"
                    f"{' + 0..1 s stagger' if k['kill_stagger'] else ''}, restart after {k['restart_after_s']:g} s), "
                    f"idempotent InitProducerId v4 at {k['rate_per_broker']:.0f}/s per broker, open loop",
                    ["broker", "sent", "sent/s", "ok", "LOAD_IN_PROGRESS", "other errors", "p50 ms", "p99 ms",
                     "max ms", "PIDs outside blocks"], rows))
        for label, b in k["brokers"].items():
            if b["error_spells"]:
                print(f"  {label}: errors in {len(b['error_spells'])} spells: " + "; ".join(
                    f"{sp['first_s']:.2f}-{sp['last_s']:.2f} s x{sp['count']}" for sp in b["error_spells"]))
        print("  kills at: " + ", ".join(f"{r['at_s']:.2f} s" for r in k["rounds"]))
        late = [r for r in k["rounds"] if r["late_s"] > 0.5]
        if late:
            print("  late kills (no leader found by DescribeState for a while): " + ", ".join(
                f"round {r['round']} {r['late_s']:.1f} s late (leader search {r['leader_search_before_kill_s']:.1f} s)"
                for r in late))
        st = sorted(((ms, at, label) for label, b in k["brokers"].items() for at, ms in b["pacer_stalls"]),
                    reverse=True)
        if st:
            print(f"  this process's pacers stalled >= {STALL_MS:g} ms {len(st)} times (longest {st[0][0]:.0f} ms at "
                  f"{st[0][1]:.1f} s): requests in flight then carry this process's delay in their latency")
        t = k["transactional"]
        print("  adaptive = python -m broker process; kafka-like = PidManagerConfig.kafka_fixed_threshold() "
              "broker run IN PROCESS (BrokerServer in this benchmark's event loop)")
        print(f"  transactional InitProducerId to broker 1 at {k['tx_rate']:g}/s (new id each, fresh connection): "
              f"sent {t['sent']}, ok {t['ok']}, errors/timeouts {errs(t['errors'])}; latency p50 "
              f"{f(t['latency_ok']['p50_ms'])} ms, p99 {f(t['latency_ok']['p99_ms'])} ms, max "
              f"{f(t['latency_ok']['max_ms'], '.0f')} ms (slowest issued at "
              f"{f((t['slowest'] or {}).get('issued_at_s'), '.2f')} s)")
        ps = k["peer"]["pid_manager_stats"] or {}
        print(f"  all PIDs returned: {k['all_pids']:,}, duplicates {k['duplicates']}; audit-trail blocks "
              f"{k['audit_blocks']}; kafka-like broker's manager: max block wait "
              f"{f(ps.get('max_block_wait_s', 0) * 1000, '.0f')} ms, refusals it counted "
              f"{ps.get('counters', {}).get('load_in_progress')}")
        nl = [r["new_leader_seen_after_s"] * 1000 for r in k["rounds"]]
        if nl:
            print("  new leader seen after kill (DescribeState polling): "
                  + ", ".join(f"{v:.0f}" for v in nl) + " ms")
        print(f"  CPU s during the run: broker process {f(k['broker_process_cpu_s'], '.1f')}, this process (load "
              f"clients + kafka-like broker) {f(k['bench_process_cpu_s'], '.1f')}; "
              f"load avg {k['machine_start']['loadavg']} -> {k['machine_end']['loadavg']}")
        if k["broker_anomalies"]:
            print(f"  broker 1 log: {errs(k['broker_anomalies'])}")
        print()
    pr = res["phases"].get("produce")
    if pr:
        rows = []
        for label, x in pr["producers"].items():
            rows.append([label, f"{x['config']}", f"{x['messages']:,}", f(x["msgs_per_s"], ",.0f"),
                         " / ".join(f"{v:,.0f}" for v in x["rounds_msgs_per_s"]),
                         f(x["broker_cpu_fraction_of_wall"], ".0%"), f(x["broker_cpu_us_per_msg"], ".2f"),
                         f(x["delivery_latency"]["p50_ms"], ".1f"), f(x["delivery_latency"]["p99_ms"], ".1f"),
                         f(x["delivery_latency"]["max_ms"], ".1f"), errs(x["delivery_errors"]),
                         f"{x['log_end_total']:,}/{x['expected_log_end_total']:,}"])
        print(table(f"3. librdkafka produce, {pr['message_bytes']} B messages, 3 partitions, burst "
                    f"(rounds {' '.join(o[0].upper() for o in pr['order'])})",
                    ["producer", "config", "messages", "msg/s", "per round", "broker CPU/wall",
                     "broker CPU us/msg", "p50 ms", "p99 ms", "max ms", "errors", "log end/expected"], rows))
        print(f"  idempotent / plain throughput: {f(pr['idempotent_over_plain_throughput'], '.2f')}; delivery "
              f"latency = produce() to ack (linger.ms 5), in a burst mostly time queued in the producer; a broker "
              f"CPU/wall well below 100 % means the Python produce() loop, not the broker, set the pace; "
              f"load avg {pr['machine_start']['loadavg']} -> {pr['machine_end']['loadavg']}")
        if pr["broker_anomalies"]:
            print(f"  broker log: {errs(pr['broker_anomalies'])}")
        print()
    print_footer(res)


# -------------------------------------------------------------------------- main
def checks(res: dict) -> list[str]:
    out = []
    ph = res["phases"].get("init")
    if ph:
        tx, bump, idem, w = ph["rdkafka_transactional"], ph["rdkafka_bump"], ph["rdkafka_idempotent"], ph["wire"]
        for name, x in (("librdkafka transactional", tx), ("librdkafka bumps", bump),
                        ("librdkafka idempotent", idem)):
            if x["errors"]:
                out.append(f"init: {name}: {errs(x['errors'])}")
        if not tx["pids_distinct"]:
            out.append("init: librdkafka transactional ids got a PID twice")
        if not bump["epochs_step_by_one"]:
            out.append(f"init: librdkafka bumps: epochs did not go up by one each time ({bump['epochs']})")
        if not idem["pids_distinct"]:
            out.append("init: librdkafka idempotent producers got a PID twice")
        for key, x in w.items():
            if x["errors"]:
                out.append(f"init: wire {key}: {errs(x['errors'])}")
            if not x.get("pids_distinct", True) or not x.get("epochs_step_by_one", True):
                out.append(f"init: wire {key}: PIDs repeated or epochs not stepping by one")
    k = res["phases"].get("leader_kill")
    if k:
        if k["duplicates"]:
            out.append(f"leader kill: {k['duplicates']} duplicate PIDs")
        for label, b in k["brokers"].items():
            if b["inside_quorum_blocks"]["outside"]:
                out.append(f"leader kill: {label}: {b['inside_quorum_blocks']['outside']} PIDs outside the broker's "
                           f"audit-trail blocks")
            if b["sent_per_s"] is not None and b["sent_per_s"] < 0.95 * b["target_rate_per_s"]:
                out.append(f"leader kill: {label}: the pacer issued only {b['sent_per_s']:.0f}/s of "
                           f"{b['target_rate_per_s']:.0f}/s")
            if b["max_pacer_lag_ms"] >= STALL_FAIL_MS:
                out.append(f"leader kill: {label}: this process stalled {b['max_pacer_lag_ms']:.0f} ms (pacer lag; "
                           f"load avg {k['machine_end']['loadavg']}): p99/max latency include that stall")
        a = k["brokers"]["adaptive"]
        if a["load_in_progress"]:
            out.append(f"leader kill: adaptive broker answered COORDINATOR_LOAD_IN_PROGRESS {a['load_in_progress']} "
                       f"times (expected 0)")
        other = {x: v for x, v in a["errors"].items() if x != "COORDINATOR_LOAD_IN_PROGRESS"}
        if other:
            out.append(f"leader kill: adaptive broker, idempotent requests: {errs(other)}")
    pr = res["phases"].get("produce")
    if pr:
        for label, x in pr["producers"].items():
            if x["delivery_errors"] or x["undelivered"]:
                out.append(f"produce: {label}: {errs(x['delivery_errors'])}, undelivered {x['undelivered']}")
            if x["log_end_total"] != x["expected_log_end_total"]:
                out.append(f"produce: {label}: log end offsets sum to {x['log_end_total']}, expected "
                           f"{x['expected_log_end_total']} (loss or duplicates)")
    return out


PHASES = {"init": phase_init, "leader_kill": phase_kills, "produce": phase_produce}


def parse_args(argv=None, prog: str | None = None):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer producers and messages, a 20 s leader-kill run")
    ap.add_argument("--json", default="bench-results/broker.json", help="where to write the results")
    ap.add_argument("--phases", default="init,leader_kill,produce", help="comma-separated: " + ", ".join(PHASES))
    ap.add_argument("--tx-ids", type=int, default=None, help="phase 1a producers (200; quick 50)")
    ap.add_argument("--bumps", type=int, default=None, help="phase 1b epoch bumps (200; quick 50)")
    ap.add_argument("--idem-producers", type=int, default=None, help="phase 1c producers (200; quick 50)")
    ap.add_argument("--wire-idem", type=int, default=None, help="phase 1 wire idempotent requests (2000; quick 1000)")
    ap.add_argument("--wire-tx", type=int, default=None, help="phase 1 wire transactional requests and bumps "
                                                              "(500; quick 200)")
    ap.add_argument("--init-timeout", type=float, default=30.0, help="init_transactions() timeout, s")
    ap.add_argument("--duration", type=float, default=None, help="phase 2 seconds (60; quick 20)")
    ap.add_argument("--rate", type=float, default=1000.0, help="phase 2 idempotent InitProducerId/s per broker")
    ap.add_argument("--tx-rate", type=float, default=20.0, help="phase 2 transactional InitProducerId/s")
    ap.add_argument("--kill-every", type=float, default=5.0, help="phase 2: seconds between leader kills")
    ap.add_argument("--restart-after", type=float, default=1.0, help="phase 2: seconds until the restart")
    ap.add_argument("--no-stagger", action="store_true", help="phase 2: kill at exact multiples of --kill-every")
    ap.add_argument("--messages", type=int, default=None, help="phase 3 messages per producer (500000; quick 100000)")
    ap.add_argument("--message-bytes", type=int, default=100, help="phase 3 message size")
    ap.add_argument("--keep", action="store_true", help="keep the cluster and broker directories")
    a = ap.parse_args(argv)
    q = a.quick
    for name, full, quick in (("tx_ids", 200, 50), ("bumps", 200, 50), ("idem_producers", 200, 50),
                              ("wire_idem", 2000, 1000), ("wire_tx", 500, 200), ("duration", 60.0, 20.0),
                              ("messages", 500_000, 100_000)):
        if getattr(a, name) is None:
            setattr(a, name, quick if q else full)
    a.phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    bad = [x for x in a.phases if x not in PHASES]
    if bad:
        ap.error(f"--phases: unknown {bad}")
    return a


def main(argv=None, prog: str | None = None) -> int:
    a = parse_args(argv, prog)
    os.environ.update({"PYTHONPATH": child_env()["PYTHONPATH"]})  # the quorum nodes inherit os.environ
    res = {"params": {k: v for k, v in vars(a).items()} | {"argv": sys.argv, "host": HOST, "block_size": BLOCK,
                                                            "percentiles": "nearest rank over sorted samples"},
           "environment": environment_info(
               confluent_kafka=getattr(confluent_kafka, "__version__", None) or str(confluent_kafka.version()),
               librdkafka=confluent_kafka.libversion()[0], repo=REPO),
           "started_at": utc_now(), "phases": {}, "errors": [], "failed_checks": []}
    run_phases(res, [(name, PHASES[name]) for name in a.phases], a, a.json, checks=checks, phase_seconds=True)
    print_results(res)
    return 1 if res["errors"] or res["failed_checks"] else 0


if __name__ == "__main__":
    sys.exit(main())
