"""Benchmark of the broker front end (broker/frontend.py) with real Kafka clients: InitProducerId latency
through the broker (librdkafka and over the wire), leader kills under an open-loop InitProducerId load
(adaptive broker process against a Kafka-like one in process), and librdkafka produce throughput,
idempotent against plain.  What each phase does and checks: docs/benchmarks.md.

    pidctl bench broker [--quick] [--json bench-results/broker.json]
                        [--phases init,leader_kill,produce] [--duration 60] [--rate 1000]
                        [--messages 50000] [--keep]
"""
from __future__ import annotations

import array
import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections import Counter

from broker.frontend import BrokerConfig, BrokerServer
from broker.pid_manager import PidManagerConfig
from quorum.localcluster import LocalCluster, free_ports
from quorum.trail import iter_blocks

from .common import HOST, LeaderKill, check_inside, kill_leaders, leader_kill_checks, temp_cluster
from .harness import (
    environment_info,
    exit_status,
    export_checkout,
    log,
    machine,
    new_results,
    parser,
    phase_list,
    quick_defaults,
    run_phases,
)
from .initpid_load import STALL_MS, TX_CLIENT_TIMEOUT_S, WireLoad, init_body, wire_sequential
from .processes import REPO, BrokerProcess
from .rdkafka_probes import client_versions, high_watermarks, produce_round, rk_idempotent, rk_transactional
from .report import counts, lat_cells, leader_kills_title, print_footer, print_new_leaders, summarize_ms, table
from .report import fmt_num

BLOCK = 1000
STALL_FAIL_MS = 250.0  # a stall this long makes phase 2's latency tail a figure of this process, not the broker


# --------------------------------------------------------------------------- stats


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


# ------------------------------------------------------------------ wire helpers


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


def _print_init(ph: dict) -> None:
    tx, bump, idem, w = ph["rdkafka_transactional"], ph["rdkafka_bump"], ph["rdkafka_idempotent"], ph["wire"]
    rows = [
        ["librdkafka init_transactions(), new transactional id", *lat_cells(tx["init_transactions"]),
         counts(tx["errors"])],
        ["  librdkafka's InitProducerId rtt (its debug log)", *lat_cells(tx["rdkafka_rtt"]), ""],
        ["librdkafka init_transactions(), same id (epoch bump)", *lat_cells(bump["init_transactions"]),
         counts(bump["errors"])],
        ["  librdkafka's InitProducerId rtt (its debug log)", *lat_cells(bump["rdkafka_rtt"]), ""],
        ["librdkafka idempotent: create -> PID assigned (stats)", *lat_cells(idem["create_to_pid_assigned"]),
         counts(idem["errors"])],
        ["  librdkafka's InitProducerId rtt (its debug log)", *lat_cells(idem["rdkafka_rtt"]), ""],
        ["  'Acquiring' -> 'Acquired' as handed to the logger",
         *(lat_cells(idem["logger_acquiring_to_acquired"]) if idem["logger_timing_sound"]
           else [idem["logger_acquiring_to_acquired"]["n"], "skipped", "(not", "sound)"]), ""],
        ["wire v4, idempotent (no transactional id)", *lat_cells(w["idempotent"]["latency"], ".3f"),
         counts(w["idempotent"]["errors"])],
        ["wire v4, new transactional id", *lat_cells(w["transactional_new_id"]["latency"]),
         counts(w["transactional_new_id"]["errors"])],
        ["wire v4, same transactional id (epoch bump)", *lat_cells(w["transactional_bump"]["latency"]),
         counts(w["transactional_bump"]["errors"])],
    ]
    print(table("1. InitProducerId latency through broker 1 (process), sequential, no faults",
                ["path", "n", "p50 ms", "p99 ms", "max ms", "errors"], rows))
    lag = idem["logger_lag_vs_stats_ms"]
    print(f"  librdkafka connection UP before init_transactions(): p50 "
          f"{fmt_num(tx['connect_before_init']['p50_ms'], '.1f')} ms (not in the init figure); "
          f"bump epochs {bump['epochs']}")
    print(f"  logger-callback timing (idempotent, application polling without pause): hand-over of 'Acquired' "
          f"minus stats' Assigned time {fmt_num(lag['min'])}..{fmt_num(lag['max'])} ms, "
          f"{lag['over_bound']} of {lag['n']} beyond +-{lag['bound']:g} ms ("
          f"stats age has 1 ms resolution): "
          f"{'sound' if idem['logger_timing_sound'] else 'NOT SOUND in this run, figure skipped'}; "
          f"during init_transactions() nothing polls, so its log lines arrive after the call")
    print(f"  CPU s: broker process {fmt_num(ph['broker_cpu_s'], '.1f')}; load avg {ph['machine_start']['loadavg']} -> "
          f"{ph['machine_end']['loadavg']}")


def _print_kills(k: dict) -> None:
    rows = []
    for label, b in k["brokers"].items():
        rows.append([label, f"{b['sent']:,}", fmt_num(b["sent_per_s"], ".0f"), f"{b['ok']:,}", b["load_in_progress"],
                     counts({x: v for x, v in b["errors"].items() if x != "COORDINATOR_LOAD_IN_PROGRESS"}),
                     fmt_num(b["latency_ok"]["p50_ms"], ".2f"), fmt_num(b["latency_ok"]["p99_ms"], ".2f"),
                     fmt_num(b["latency_ok"]["max_ms"], ".1f"), b["inside_quorum_blocks"]["outside"]])
    print(table(f"2. {leader_kills_title(k)}, idempotent InitProducerId v4 at {k['rate_per_broker']:.0f}/s per "
                f"broker, open loop",
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
          f"sent {t['sent']}, ok {t['ok']}, errors/timeouts {counts(t['errors'])}; latency p50 "
          f"{fmt_num(t['latency_ok']['p50_ms'])} ms, p99 {fmt_num(t['latency_ok']['p99_ms'])} ms, max "
          f"{fmt_num(t['latency_ok']['max_ms'], '.0f')} ms (slowest issued at "
          f"{fmt_num((t['slowest'] or {}).get('issued_at_s'), '.2f')} s)")
    ps = k["peer"]["pid_manager_stats"] or {}
    print(f"  all PIDs returned: {k['all_pids']:,}, duplicates {k['duplicates']}; audit-trail blocks "
          f"{k['audit_blocks']}; kafka-like broker's manager: max block wait "
          f"{fmt_num(ps.get('max_block_wait_s', 0) * 1000, '.0f')} ms, refusals it counted "
          f"{ps.get('counters', {}).get('load_in_progress')}")
    print_new_leaders(k["rounds"])
    print(f"  CPU s during the run: broker process {fmt_num(k['broker_process_cpu_s'], '.1f')}, this process (load "
          f"clients + kafka-like broker) {fmt_num(k['bench_process_cpu_s'], '.1f')}; "
          f"load avg {k['machine_start']['loadavg']} -> {k['machine_end']['loadavg']}")


def _print_produce(pr: dict) -> None:
    rows = []
    for label, x in pr["producers"].items():
        rows.append([label, f"{x['config']}", f"{x['messages']:,}", fmt_num(x["msgs_per_s"], ",.0f"),
                     " / ".join(f"{v:,.0f}" for v in x["rounds_msgs_per_s"]),
                     fmt_num(x["broker_cpu_fraction_of_wall"], ".0%"), fmt_num(x["broker_cpu_us_per_msg"], ".2f"),
                     fmt_num(x["delivery_latency"]["p50_ms"], ".1f"), fmt_num(x["delivery_latency"]["p99_ms"], ".1f"),
                     fmt_num(x["delivery_latency"]["max_ms"], ".1f"), counts(x["delivery_errors"]),
                     f"{x['log_end_total']:,}/{x['expected_log_end_total']:,}"])
    print(table(f"3. librdkafka produce, {pr['message_bytes']} B messages, 3 partitions, burst "
                f"(rounds {' '.join(o[0].upper() for o in pr['order'])})",
                ["producer", "config", "messages", "msg/s", "per round", "broker CPU/wall",
                 "broker CPU us/msg", "p50 ms", "p99 ms", "max ms", "errors", "log end/expected"], rows))
    print(f"  idempotent / plain throughput: {fmt_num(pr['idempotent_over_plain_throughput'], '.2f')}; delivery "
          f"latency = produce() to ack (linger.ms 5), in a burst mostly time queued in the producer; a broker "
          f"CPU/wall well below 100 % means the Python produce() loop, not the broker, set the pace; "
          f"load avg {pr['machine_start']['loadavg']} -> {pr['machine_end']['loadavg']}")


def print_results(res: dict) -> None:
    pa, env = res["params"], res["environment"]
    print()
    print(f"Broker front-end benchmark ({'quick' if pa['quick'] else 'full'} run; {env['cpu_count']} CPUs, "
          f"Python {env['python']}, confluent-kafka {env['confluent_kafka']} / librdkafka {env['librdkafka']}, "
          f"load avg at start {env['loadavg_start']})")
    print()
    for name, printer, who in (("init", _print_init, "broker"), ("leader_kill", _print_kills, "broker 1"),
                               ("produce", _print_produce, "broker")):
        ph = res["phases"].get(name)
        if ph:
            printer(ph)
            if ph["broker_anomalies"]:
                print(f"  {who} log: {counts(ph['broker_anomalies'])}")
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
                out.append(f"init: {name}: {counts(x['errors'])}")
        if not tx["pids_distinct"]:
            out.append("init: librdkafka transactional ids got a PID twice")
        if not bump["epochs_step_by_one"]:
            out.append(f"init: librdkafka bumps: epochs did not go up by one each time ({bump['epochs']})")
        if not idem["pids_distinct"]:
            out.append("init: librdkafka idempotent producers got a PID twice")
        for key, x in w.items():
            if x["errors"]:
                out.append(f"init: wire {key}: {counts(x['errors'])}")
            if not x.get("pids_distinct", True) or not x.get("epochs_step_by_one", True):
                out.append(f"init: wire {key}: PIDs repeated or epochs not stepping by one")
    k = res["phases"].get("leader_kill")
    if k:
        def load_checks(label: str, b: dict) -> list[str]:
            out = []
            if b["sent_per_s"] is not None and b["sent_per_s"] < 0.95 * b["target_rate_per_s"]:
                out.append(f"leader kill: {label}: the pacer issued only {b['sent_per_s']:.0f}/s of "
                           f"{b['target_rate_per_s']:.0f}/s")
            if b["max_pacer_lag_ms"] >= STALL_FAIL_MS:
                out.append(f"leader kill: {label}: this process stalled {b['max_pacer_lag_ms']:.0f} ms (pacer lag; "
                           f"load avg {k['machine_end']['loadavg']}): p99/max latency include that stall")
            return out
        out += leader_kill_checks(k, "brokers", "PIDs", load_checks)
        a = k["brokers"]["adaptive"]
        if a["load_in_progress"]:
            out.append(f"leader kill: adaptive broker answered COORDINATOR_LOAD_IN_PROGRESS {a['load_in_progress']} "
                       f"times (expected 0)")
        other = {x: v for x, v in a["errors"].items() if x != "COORDINATOR_LOAD_IN_PROGRESS"}
        if other:
            out.append(f"leader kill: adaptive broker, idempotent requests: {counts(other)}")
    pr = res["phases"].get("produce")
    if pr:
        for label, x in pr["producers"].items():
            if x["delivery_errors"] or x["undelivered"]:
                out.append(f"produce: {label}: {counts(x['delivery_errors'])}, undelivered {x['undelivered']}")
            if x["log_end_total"] != x["expected_log_end_total"]:
                out.append(f"produce: {label}: log end offsets sum to {x['log_end_total']}, expected "
                           f"{x['expected_log_end_total']} (loss or duplicates)")
    return out


PHASES = {"init": phase_init, "leader_kill": phase_kills, "produce": phase_produce}


def parse_args(argv=None, prog: str | None = None):
    ap = parser(prog, __doc__)
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
    quick_defaults(a, {"tx_ids": (200, 50), "bumps": (200, 50), "idem_producers": (200, 50),
                       "wire_idem": (2000, 1000), "wire_tx": (500, 200), "duration": (60.0, 20.0),
                       "messages": (500_000, 100_000)})
    a.phases = phase_list(ap, a.phases, PHASES)
    return a


def main(argv=None, prog: str | None = None) -> int:
    a = parse_args(argv, prog)
    export_checkout()
    res = new_results(vars(a) | {"argv": sys.argv, "host": HOST, "block_size": BLOCK,
                                 "percentiles": "nearest rank over sorted samples"},
                      environment_info(**client_versions(), repo=REPO))
    run_phases(res, [(name, PHASES[name]) for name in a.phases], a, a.json, checks=checks, phase_seconds=True)
    print_results(res)
    return exit_status(res)


if __name__ == "__main__":
    sys.exit(main())
