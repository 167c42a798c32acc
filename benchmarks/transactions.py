"""Benchmark of Kafka transactions (KIP-98) through the broker with librdkafka (confluent-kafka):
transactions/s and commit_transaction() latency against an idempotent producer's flush(), then
exactly-once across quorum leader kills, read back with kafka-python.  What each phase does and
checks: docs/benchmarks.md ("Transactions with librdkafka").

    pidctl bench transactions [--quick] [--duration 20] [--kill-every 5] [--restart-after 1]
                              [--out bench-results] [--json PATH] [-o table|json]
                              [--phases steady,leader_kill,sweep] [--sweep-seconds 4]
                              [--sweep-cells 1x1,1x10,...] [--keep]

The targets of the run (benchmarks/txn_targets.py) are printed at the end beside Kafka's and Redpanda's
published figures.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time

import kafka

from quorum.localcluster import free_ports
from quorum.telemetry.metrics import MetricsUnavailable, read_metrics

from .common import HOST, LeaderKill, kill_leaders, temp_cluster
from .harness import environment_info, export_checkout, log, new_results, parser, phase_list, run_phases
from .processes import REPO, BrokerProcess
from .rdkafka_probes import client_versions
from .report import fmt_num, print_footer, report, table
from .txn_producers import (
    COMMIT_TIMEOUT_S,
    FLUSH_TIMEOUT_S,
    MESSAGES,
    PARTITIONS,
    ROUNDS,
    WARMUP_UNITS,
    IdempotentLoop,
    TxnLoop,
    alternate,
    over_idempotent,
)
from .txn_producers import value  # noqa: F401 - tests/benchmarks read it here
from .txn_readback import SETTLE_TIMEOUT_S, VIOLATIONS, check_topic
from .txn_readback import exactly_once  # noqa: F401 - tests/benchmarks read it here
from .txn_sweep import DEFAULT_CELLS, parse_cells, phase_sweep, print_sweep
from .txn_init_burst import add_arguments as init_burst_arguments
from .txn_init_burst import checks as init_burst_checks
from .txn_init_burst import phase_init_burst
from .txn_init_burst import print_table as print_init_burst
from .txn_sweep import checks as sweep_checks
from .txn_targets import evaluate, print_targets

PRODUCER_CONF: dict = {}        # librdkafka's defaults (linger.ms 5, acks all, transaction.timeout.ms 60000)
KEPT_LINES = 300              # librdkafka log lines kept in the JSON


# ------------------------------------------------------------------ the run
class Rig:
    """The cluster and broker of the run (set up by the ``setup`` phase, taken down at the end)."""

    def __init__(self):
        self.stack = contextlib.ExitStack()
        self.lc = None
        self.broker: BrokerProcess | None = None
        self.directory: str | None = None
        self.metrics: str | None = None  # the broker's metrics endpoint (its transaction step times)

    def up(self, a) -> dict:
        t = time.perf_counter()
        self.lc, self.directory = self.stack.enter_context(
            temp_cluster("pidquorum-bench-transactions-", a.keep, "transactions", subdir="cluster", tail_lines=20))
        self.metrics = f"{HOST}:{free_ports(1, HOST)[0]}"
        broker = BrokerProcess(self.directory, 1, self.lc.client_addresses(), "--partitions", str(PARTITIONS),
                               "--log-level", a.broker_log_level, "--metrics-port", self.metrics.rsplit(":", 1)[1],
                               new_session=True)
        self.stack.callback(broker.stop)
        broker.start()
        self.broker = broker
        return {"broker": broker.bootstrap, "nodes": [n.client_address for n in self.lc.nodes()],
                "setup_s": time.perf_counter() - t}

    def need(self) -> BrokerProcess:
        if self.broker is None:
            raise RuntimeError("no broker (the setup phase failed)")
        return self.broker

    def keep_logs(self, dest: str) -> list[str]:
        """Copy the broker's and the nodes' logs to ``dest`` (the run's evidence); the paths written."""
        os.makedirs(dest, exist_ok=True)
        out = []
        if self.broker is not None and os.path.exists(self.broker.log_path):
            out.append(shutil.copy(self.broker.log_path, os.path.join(dest, "broker-1.log")))
        if self.lc is not None:
            for n in self.lc.nodes():
                p = self.lc.log_path(n.node_id)
                if os.path.exists(p):
                    out.append(shutil.copy(p, os.path.join(dest, f"node-{n.node_id}.log")))
        return out

    def down(self) -> None:
        self.stack.close()


def phase_steady(a, rig: Rig) -> dict:
    bootstrap = rig.need().bootstrap
    conf = PRODUCER_CONF
    tx = TxnLoop(bootstrap, "bench-tx-steady", "tx-steady", conf)
    idem = IdempotentLoop(bootstrap, "idem-steady", conf)
    log(f"steady: warm-up ({WARMUP_UNITS} units each)")
    tx.warm_up()
    idem.warm_up()
    steps0 = step_times(rig.metrics)
    round_s = alternate(tx, idem, a.duration, "steady", log)
    steps1 = step_times(rig.metrics)
    tx.close()
    idem.producer.flush(FLUSH_TIMEOUT_S)
    t, i = tx.result(), idem.result()
    log("steady: reading both topics back")
    t["check"] = check_topic(bootstrap, tx.topic, {n: r["outcome"] for n, r in tx.outcomes.items()})
    i["check"] = check_topic(bootstrap, idem.topic, {n: "committed" for n in idem.flushed_units})
    ratio = over_idempotent(t, i)
    return {"duration_s": a.duration, "rounds": ROUNDS, "round_s": round_s, "transactional": t, "idempotent": i,
            "ratio_transactional_over_idempotent": ratio, "producer_conf": conf,
            "where_the_time_goes": time_split(steps0, steps1, t, i),
            "librdkafka_log": tx.lines.lines[-KEPT_LINES:]}


def step_times(address: str | None) -> dict[str, tuple[float, float]]:
    """The broker's transaction step times so far, {step: (count, seconds)} (its
    pidquorum_broker_txn_step_seconds summary); {} when it cannot be read."""
    if address is None:
        return {}
    try:
        m = read_metrics(address)
    except MetricsUnavailable as e:
        log(f"steady: the broker's step times cannot be read: {e}")
        return {}
    count, total = m.get("pidquorum_broker_txn_step_seconds_count", {}), m.get("pidquorum_broker_txn_step_seconds_sum", {})
    return {step: (count[step], total.get(step, 0.0)) for step in count}


def time_split(before: dict, after: dict, t: dict, i: dict) -> dict | None:
    """Where a transaction's mean time goes: the broker's quorum round trips on the client's path (add, end,
    verify, and a step's wait for the last completion), per transaction, from the step times' growth over
    the transactional rounds; the rest is the produce (an idempotent flush of the same records, beside it)
    and the client.  ``floor``: a commit with those round trips free, against a flush (means): no
    coordinator that decides through round trips does better with this client."""
    if not before or not after:
        return None
    delta = {s: (after[s][0] - before.get(s, (0, 0.0))[0], after[s][1] - before.get(s, (0, 0.0))[1]) for s in after}
    transactions = delta.get("end", (0, 0.0))[0]
    commit, flush = t["commit"].get("mean_ms"), i["flush"].get("mean_ms")
    if not transactions or commit is None or not flush:
        return None
    per_txn = {s: 1000 * sec / transactions for s, (_, sec) in delta.items()}
    on_path = sum(per_txn.get(s, 0.0) for s in ("add", "end", "verify", "wait"))
    return {"transactions": transactions, "per_transaction_ms": per_txn, "quorum_on_path_ms": on_path,
            "commit_mean_ms": commit, "flush_mean_ms": flush, "rest_ms": commit - on_path,
            "floor_over_flush": (commit - on_path) / flush}


async def _kill_run(a, rig: Rig, loop: TxnLoop) -> list[dict]:
    rounds: list[dict] = []

    def on_round(k: LeaderKill) -> None:
        rounds.append({"round": k.round, "at_s": k.at_s, "late_s": k.late_s, "killed_node": k.killed_node,
                       "new_leader": k.new_leader, "new_leader_seen_after_s": k.new_leader_seen_after_s,
                       "restart_ready_s": k.restart_ready_s})
        log(k.summary())

    t_start = time.perf_counter()
    t_stop = t_start + a.duration
    loop.t0 = loop.lines.t0 = t_start
    await asyncio.gather(asyncio.to_thread(loop.run_until, t_stop),
                         kill_leaders(rig.lc, t_start, t_stop, a.kill_every, a.restart_after, 0.0, on_round))
    return rounds


def broker_lines(path: str, needles: list[str], limit: int = 200) -> list[str]:
    """Lines of the broker log holding one of ``needles`` or a WARNING / ERROR (the last ``limit``), but for
    the version probe of kafka-python's read-back consumers (ApiVersions v4 refused, v3 taken)."""
    out = []
    try:
        with open(path, errors="replace") as fh:
            for line in fh:
                if "ApiVersions v4 is not supported" in line:
                    continue
                if any(x in line for x in needles) or "WARNING" in line or "ERROR" in line or "Traceback" in line:
                    out.append(line.rstrip("\n")[:400])
    except FileNotFoundError:
        pass
    return out[-limit:]


def phase_leader_kill(a, rig: Rig) -> dict:
    broker = rig.need()
    tid, topic = "bench-tx-kills", "tx-kills"
    loop = TxnLoop(broker.bootstrap, tid, topic, PRODUCER_CONF)
    log(f"leader_kill: warm-up, then {a.duration:g} s of transactions, the leader SIGKILLed every "
        f"{a.kill_every:g} s and restarted {a.restart_after:g} s later")
    loop.warm_up()
    rounds = asyncio.run(_kill_run(a, rig, loop))
    loop.close()
    r = loop.result()
    log("leader_kill: waiting for the last stable offsets, then reading the topic back (read_committed)")
    r["check"] = check_topic(broker.bootstrap, topic, {n: x["outcome"] for n, x in loop.outcomes.items()})
    failed = loop.failed_transactions()
    r.update({"duration_s": a.duration, "kill_every_s": a.kill_every, "restart_after_s": a.restart_after,
              "kills": len(rounds), "rounds": rounds,
              "failed_transactions": {str(n): x for n, x in sorted(failed.items())},
              "librdkafka_log": loop.lines.lines[-KEPT_LINES:],
              "broker_log": broker_lines(broker.log_path, [tid, "transaction"]),
              "broker_anomalies": broker.anomalies()})
    return r


# ------------------------------------------------------------------ checks and output
def violations(check: dict) -> dict:
    return {k: check[k] for k in VIOLATIONS if check.get(k)}


def checks(res: dict) -> list[str]:
    out = []
    s = res["phases"].get("steady")
    if s:
        for label, key in (("transactional", "transactional"), ("idempotent", "idempotent")):
            x = s[key]
            if x["errors"] or x.get("delivery_errors"):
                out.append(f"steady {label}: errors {x['errors']} {x.get('delivery_errors') or ''}".rstrip())
            v = violations(x["check"])
            if v:
                out.append(f"FAIL steady {label}: exactly-once violated: {v}")
            if not x["check"]["settle"]["settled"] or not x["check"]["read_complete"]:
                out.append(f"steady {label}: topic not read to its end (settled {x['check']['settle']['settled']}, "
                           f"read complete {x['check']['read_complete']})")
    if res["phases"].get("sweep"):
        out += sweep_checks(res["phases"]["sweep"])
    if res["phases"].get("init_burst"):
        out += init_burst_checks(res["phases"]["init_burst"])
    k = res["phases"].get("leader_kill")
    if k:
        c = k["check"]
        v = violations(c)
        if v:
            out.append(f"FAIL leader_kill: exactly-once violated for transactional.id {k['transactional_id']!r}: "
                       f"{v} (lost {c['lost']}, duplicated {c['duplicated']})")
        if not c["settle"]["settled"]:
            out.append(f"leader_kill: a transaction still open {SETTLE_TIMEOUT_S:.0f} s after the run (last stable "
                       f"offsets {c['settle']['last_stable_offsets']}, high watermarks "
                       f"{c['settle']['high_watermarks']})")
        if not c["read_complete"]:
            out.append("leader_kill: the topic was not read to its last stable offsets")
        if not k["kills"]:
            out.append(f"leader_kill: no leader was killed (a {k['duration_s']:g} s run with --kill-every "
                       f"{k['kill_every_s']:g} and --restart-after {k['restart_after_s']:g})")
        if not k["measured_committed"]:
            out.append("leader_kill: no transaction committed")
    return out


def _lat(s: dict) -> list[str]:
    return [fmt_num(s["p50_ms"], ".1f"), fmt_num(s["p99_ms"], ".1f"), fmt_num(s["max_ms"], ".1f")]


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _errs(d: dict) -> str:
    return "; ".join(f"{k} x{v}" for k, v in sorted(d.items())) or "0"


def print_results(res: dict) -> None:
    env, p = res["environment"], res["params"]
    print(f"Transactions benchmark ({'quick' if p['quick'] else 'full'} run; {env['cpu_count']} CPUs, "
          f"Python {env['python']}, confluent-kafka {env['confluent_kafka']} / librdkafka {env['librdkafka']}, "
          f"kafka-python {env['kafka_python']}, load avg at start {env['loadavg_start']})")
    s = res["phases"].get("steady")
    if s:
        t, i, r = s["transactional"], s["idempotent"], s["ratio_transactional_over_idempotent"]
        rows = [["units (transactions / flushes) per s", fmt_num(t["transactions_per_s"], ".1f"),
                 fmt_num(i["units_per_s"], ".1f"), _x(r["per_s"])],
                ["messages per s", fmt_num(t["messages_per_s"], ",.0f"), fmt_num(i["messages_per_s"], ",.0f"),
                 _x(r["per_s"])]]
        rows += [[f"commit_transaction() / flush() {q[:-3]} ms", fmt_num(t["commit"][q], ".2f"),
                  fmt_num(i["flush"][q], ".2f"), _x(r[f"latency_{q}"])] for q in ("p50_ms", "p99_ms", "max_ms")]
        rows += [
            ["whole unit p50 / p99 ms", " / ".join(fmt_num(t["unit"][q], ".2f") for q in ("p50_ms", "p99_ms")),
             " / ".join(fmt_num(i["unit"][q], ".2f") for q in ("p50_ms", "p99_ms")), "-"],
            ["units measured", t["measured_committed"], i["measured_units"], "-"],
            ["errors", _errs({**t["errors"], **t["delivery_errors"]}), _errs(i["errors"]), "-"],
            ["read back: lost / duplicated", f"{t['check']['lost']} / {t['check']['duplicated']}",
             f"{i['check']['lost']} / {i['check']['duplicated']}", "-"],
        ]
        print()
        print(table(f"1-2. one producer, {MESSAGES} messages per unit over {PARTITIONS} partitions, "
                    f"{s['duration_s']:g} s each (rounds {'-'.join(s['rounds'])} of {s['round_s']:g} s), no faults",
                    ["figure", "transactional", "idempotent", "tx / idem"], rows))
        print(f"  init_transactions(): {fmt_num(t['init_transactions']['p50_ms'], '.1f')} ms")
        w = s.get("where_the_time_goes")
        if w:
            pt = w["per_transaction_ms"]
            print(f"  where a commit's mean {w['commit_mean_ms']:.2f} ms goes ({w['transactions']:.0f} transactions; "
                  f"broker step times): quorum round trips on the client's path {w['quorum_on_path_ms']:.2f} ms "
                  f"(add {pt.get('add', 0):.2f}, end {pt.get('end', 0):.2f}, verify {pt.get('verify', 0):.2f}, "
                  f"wait for the last completion {pt.get('wait', 0):.2f}); the rest {w['rest_ms']:.2f} ms is the "
                  f"produce (a flush: {w['flush_mean_ms']:.2f} ms) and the client")
            print(f"  floor: with those round trips free a commit would be {w['floor_over_flush']:.2f}x a flush "
                  f"(markers and completion after the answer, off the path: {pt.get('complete', 0):.2f} ms)")
    k = res["phases"].get("leader_kill")
    if k:
        c = k["check"]
        o = k["outcomes"]
        rows = [
            ["leader SIGKILLs", k["kills"]],
            ["transactions committed (measured)", k["measured_committed"]],
            ["transactions failed: aborted / abandoned / unknown",
             f"{o.get('aborted', 0)} / {o.get('abandoned', 0)} / {o.get('unknown', 0)}"],
            ["commit retries (retriable errors)", k["commit_retries"]],
            ["producers created (same transactional.id)", k["producer_instances"]],
            ["transactions per s", fmt_num(k["transactions_per_s"], ".1f")],
            ["commit_transaction() p50 / p99 / max ms", " / ".join(_lat(k["commit"]))],
            ["longest gap between two commits ms", fmt_num(k["longest_gap_between_commits_ms"], ",.0f")],
            ["read_committed: records / transactions seen", f"{c['records']:,} / {c['transactions_seen']:,}"],
            ["unknown outcome: seen committed / absent", f"{c['unknown_seen_committed']} / {c['unknown_absent']}"],
            ["lost (committed, not seen whole)", c["lost"]],
            ["duplicated (messages seen twice)", c["duplicated"]],
            ["aborted/abandoned visible", c["aborted_visible"]],
            ["partial (unknown outcome, seen in part)", c["partial"]],
            ["foreign records", c["foreign"]],
        ]
        print()
        print(table(f"3. transactions with the quorum leader SIGKILLed every {k['kill_every_s']:g} s (restart after "
                    f"{k['restart_after_s']:g} s), {k['duration_s']:g} s, transactional.id {k['transactional_id']!r}",
                    ["figure", "value"], rows))
        for rd in k["rounds"]:
            print(f"  kill {rd['round']}: node {rd['killed_node']} at {rd['at_s']:.1f} s, new leader node "
                  f"{rd['new_leader']} seen after {rd['new_leader_seen_after_s'] * 1000:.0f} ms, restarted (ready in "
                  f"{rd['restart_ready_s'] * 1000:.0f} ms)")
        if k["errors"]:
            print(f"  client errors: {_errs(k['errors'])}")
        bad = violations(c)
        if bad:
            print(f"FAIL: exactly-once violated under leader kills (transactional.id {k['transactional_id']!r}): "
                  f"lost {c['lost']}, duplicated {c['duplicated']}, aborted visible {c['aborted_visible']}, "
                  f"partial {c['partial']}, foreign {c['foreign']}")
            for kind, ex in c["examples"].items():
                for e in ex[:5]:
                    print(f"  {kind}: {e}")
            if res.get("evidence"):
                print(f"  logs kept: {', '.join(res['evidence'])}")
        else:
            print(f"  exactly-once: OK (lost 0, duplicated 0; {c['committed']} committed transactions seen whole "
                  f"and once, none of {o.get('aborted', 0) + o.get('abandoned', 0)} aborted seen)")
    if res["phases"].get("sweep"):
        print_sweep(res["phases"]["sweep"])
    if res["phases"].get("init_burst"):
        print()
        print_init_burst(res["phases"]["init_burst"])
    print_targets(res.get("targets") or evaluate(res))
    print()
    print_footer(res)


# ------------------------------------------------------------------ options
def parse_args(argv=None, prog: str | None = None):
    ap = parser(prog, __doc__)
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds of each producer in the steady phase, and of the leader-kill run (20; quick 5)")
    ap.add_argument("--kill-every", type=float, default=5.0, help="seconds between leader kills")
    ap.add_argument("--restart-after", type=float, default=1.0, help="seconds from a kill to the node's restart")
    ap.add_argument("--phases", default="steady,leader_kill",
                    help="comma-separated: steady, leader_kill, sweep, init_burst (sweep and init_burst are not run "
                         "unless named)")
    init_burst_arguments(ap)
    ap.add_argument("--sweep-seconds", type=float, default=None,
                    help="seconds of each producer in each sweep cell (4; quick 1.5)")
    ap.add_argument("--sweep-cells", default=DEFAULT_CELLS,
                    help="the sweep's cells, PARTITIONSxMESSAGES per transaction, comma-separated")
    ap.add_argument("--out", default="bench-results", help="directory of the JSON (and of the logs of a failed run)")
    ap.add_argument("--json", default=None, help="where to write the results (default OUT/transactions.json)")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table",
                    help="print the tables, or the JSON (also written to --json)")
    ap.add_argument("--broker-log-level", default="INFO", help="the broker's --log-level (DEBUG logs every commit)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's and the broker's directory")
    ap.add_argument("--quick", action="store_true", help="5 s instead of 20 s")
    a = ap.parse_args(argv)
    if a.duration is None:
        a.duration = 5.0 if a.quick else 20.0
    if a.sweep_seconds is None:
        a.sweep_seconds = 1.5 if a.quick else 4.0
    try:
        a.sweep_cells = parse_cells(a.sweep_cells)
    except ValueError as e:
        ap.error(f"--sweep-cells: {e}")
    if a.json is None:
        a.json = os.path.join(a.out, "transactions.json")
    a.phases = phase_list(ap, a.phases, PHASES, require=True)
    if a.duration <= 0 or a.kill_every <= 0 or a.restart_after < 0 or a.sweep_seconds <= 0:
        ap.error("--duration, --kill-every and --sweep-seconds must be > 0, --restart-after >= 0")
    return a


def _phase_sweep(a, rig: Rig) -> dict:
    return phase_sweep(a, rig.need().bootstrap, PRODUCER_CONF)


def _phase_init_burst(a, rig: Rig) -> dict:
    return phase_init_burst(a)  # a cluster and brokers of its own


PHASES = {"steady": phase_steady, "leader_kill": phase_leader_kill, "sweep": _phase_sweep,
          "init_burst": _phase_init_burst}


def main(argv=None, prog: str | None = None) -> int:
    a = parse_args(argv, prog)
    export_checkout()
    res = new_results(vars(a) | {"argv": sys.argv, "messages_per_unit": MESSAGES, "partitions": PARTITIONS,
                                 "warmup_units": WARMUP_UNITS, "commit_timeout_s": COMMIT_TIMEOUT_S,
                                 "percentiles": "nearest rank over sorted samples"},
                      environment_info(**client_versions(), kafka_python=kafka.__version__, repo=REPO))
    rig = Rig()

    def all_checks(r: dict) -> list[str]:
        r["targets"] = evaluate(r)
        found = checks(r)
        if any(c.startswith("FAIL") for c in found):
            r["evidence"] = rig.keep_logs(os.path.join(a.out, "transactions-logs"))
        return found

    try:
        run_phases(res, [("setup", rig.up), *((n, lambda a_, fn=PHASES[n]: fn(a_, rig)) for n in a.phases)], a,
                   a.json, checks=all_checks, phase_seconds=True)
    finally:
        rig.down()
    return report(res, a.output, print_results)


if __name__ == "__main__":
    sys.exit(main())
