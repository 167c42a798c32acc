"""``pidctl chaos ...``: fault runs, their checker, the simulation and the crash-state explorer."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys

import click

from chaos.report import render_summary
from chaos.sim.campaign import parse_seeds, run_campaign
from chaos.sim.explore import explore
from chaos.txn_report import render_txn_summary
from chaos.workload import WorkloadConfig
from snapshots.storage.files import atomic_write

from . import render
from .common import EXIT_ANOMALY, handle_errors, output_option


@click.group()
def chaos():
    """Fault injection with a checker: prove no ID was issued twice."""




def _seconds_range(value: str, name: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in value.split(":"))
    except ValueError:
        raise click.BadParameter(f"expected MIN:MAX seconds, got {value!r}", param_hint=name) from None
    if not 0 <= lo <= hi:
        raise click.BadParameter(f"need 0 <= MIN <= MAX, got {value!r}", param_hint=name)
    return lo, hi


@chaos.command("run")
@click.option("--workload", type=click.Choice(["producer-ids", "transactions"]), default="producer-ids",
              show_default=True,
              help="producer-ids: block allocators and ProducerIdManagers against the quorum (needs --scenario). "
                   "transactions: Kafka transactions through a real broker with confluent-kafka and kafka-python "
                   "producers, checked for exactly-once (see docs/transactions.md).")
@click.option("--scenario",
              type=click.Choice(["kill-leader", "pause-leader", "kill-all", "rolling-restart", "partition-leader",
                                 "slow-disk", "mixed"]),
              help="Faults of the producer-ids workload (required for it).")
@click.option("--duration", type=click.FloatRange(5, 7 * 24 * 3600), default=60, show_default=True,
              help="Seconds of faults and load.")
@click.option("--seed", type=int, default=0, show_default=True, help="Fixes the choice and timing of faults.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Run directory (default chaos-<scenario>-<seed>, chaos-transactions-<seed>).")
@click.option("--brokers", type=click.IntRange(0, 64), default=2, show_default=True,
              help="Wire-protocol block allocators (producer-ids).")
@click.option("--block-rate", type=click.FloatRange(0.1, 10_000), default=20, show_default=True,
              help="AllocateProducerIds/s per broker (producer-ids).")
@click.option("--pid-managers", type=click.IntRange(0, 64), default=2, show_default=True, help="(producer-ids)")
@click.option("--pid-rate", type=click.FloatRange(1, 1_000_000), default=1000, show_default=True,
              help="PIDs/s asked of each ProducerIdManager (producer-ids).")
@click.option("--interval", default=None,
              help="Quiet seconds before each fault, MIN:MAX (drawn with the seed) [default: 2:4; transactions 2:5].")
@click.option("--hold", default=None,
              help="Seconds each fault lasts, MIN:MAX [default: 0.5:1.5; transactions 1:3, the downtime of a "
                   "killed quorum leader or broker].")
@click.option("--faults", default=None,
              help="transactions: the faults to draw from, comma-separated [default: kill-leader,pause-leader,"
                   "pause-node,pause-broker-peer,kill-broker,fence].")
@click.option("--pause", default="2:8", show_default=True,
              help="transactions: seconds a SIGSTOPped quorum node stays paused, MIN:MAX.")
@click.option("--txn-producers", type=click.IntRange(1, 32), default=2, show_default=True,
              help="transactions: transactional producers per client library.")
@click.option("--idempotent-producers", type=click.IntRange(0, 32), default=1, show_default=True,
              help="transactions: idempotent producers per client library.")
@click.option("--partitions", type=click.IntRange(1, 64), default=4, show_default=True,
              help="transactions: partitions of the topic.")
@click.option("--keep-data", is_flag=True, help="Keep data directories even if the run passes.")
@output_option
@handle_errors
def chaos_run(workload, scenario, duration, seed, out_dir, brokers, block_rate, pid_managers, pid_rate, interval,
              hold, faults, pause, txn_producers, idempotent_producers, partitions, keep_data, output):
    """Run a three-node quorum under faults, record every operation, check the history."""
    if workload == "transactions":
        _chaos_run_transactions(duration, seed, out_dir, interval, hold, faults, pause, txn_producers,
                                idempotent_producers, partitions, keep_data, output)
        return
    if scenario is None:
        raise click.MissingParameter(param_hint="'--scenario'", param_type="option")
    if faults is not None:
        raise click.BadParameter("only for --workload transactions", param_hint="--faults")
    interval = _seconds_range(interval or "2:4", "--interval")
    hold = _seconds_range(hold or "0.5:1.5", "--hold")
    from chaos.runner import RunConfig  # heavy (kazoo, for the nodes it starts): imported when used
    from chaos.runner import run as chaos_run_  # heavy (kazoo, for the nodes it starts): imported when used

    out_dir = out_dir or f"chaos-{scenario}-{seed}"
    cfg = RunConfig(scenario=scenario, duration_s=duration, seed=seed, out_dir=out_dir, keep_data=keep_data,
                    interval_s=interval, hold_s=hold,
                    workload=WorkloadConfig(brokers=brokers, block_rate=block_rate, pid_managers=pid_managers,
                                            pid_rate=pid_rate))
    with render.progress(f"chaos {scenario}") as update:
        verdict = asyncio.run(chaos_run_(cfg, update))
    _show_verdict(verdict, output, out_dir)


KAFKA_CLIENTS = ("confluent_kafka", "kafka")  # the `chaos` extra: the clients a transactions run drives


def _chaos_run_transactions(duration, seed, out_dir, interval, hold, faults, pause, txn_producers,
                            idempotent_producers, partitions, keep_data, output) -> None:
    missing = [m for m in KAFKA_CLIENTS if importlib.util.find_spec(m) is None]
    if missing:
        raise click.ClickException(f"--workload transactions drives real Kafka clients, and {', '.join(missing)} "
                                   "is not installed: pip install 'pidquorum[chaos]'")
    # heavy (the Kafka clients, kazoo for the nodes): imported when used
    from chaos.txn_runner import FAULTS, TxnRunConfig
    from chaos.txn_runner import run as txn_run
    from chaos.txn_workload import TxnWorkloadConfig

    chosen = tuple(f.strip() for f in (faults or ",".join(FAULTS)).split(",") if f.strip())
    unknown = [f for f in chosen if f not in FAULTS]
    if unknown or not chosen:
        raise click.BadParameter(f"unknown fault(s) {', '.join(unknown) or '(none given)'}; known: "
                                 f"{', '.join(FAULTS)}", param_hint="--faults")
    out_dir = out_dir or f"chaos-transactions-{seed}"
    cfg = TxnRunConfig(duration_s=duration, seed=seed, out_dir=out_dir, faults=chosen,
                       interval_s=_seconds_range(interval or "2:5", "--interval"),
                       hold_s=_seconds_range(hold or "1:3", "--hold"), pause_s=_seconds_range(pause, "--pause"),
                       keep_data=keep_data,
                       workload=TxnWorkloadConfig(partitions=partitions, txn_producers=txn_producers,
                                                  idempotent_producers=idempotent_producers))
    with render.progress("chaos transactions") as update:
        verdict = asyncio.run(txn_run(cfg, update))
    _show_verdict(verdict, output, out_dir)


@chaos.command("check")
@click.argument("run_dir", type=click.Path())
@click.option("--allow-torn", is_flag=True,
              help="Drop a torn last history line (a copy of a running or crashed run) instead of refusing.")
@output_option
@handle_errors
def chaos_check(run_dir, allow_torn, output):
    """Re-check a saved run directory offline (either workload: its run.json says which)."""
    from chaos.txn_runner import is_txn_run  # heavy (the Kafka clients): imported when used

    if is_txn_run(run_dir):
        from chaos.txn_runner import check_dir as check_txn_dir  # heavy: imported when used
        _show_verdict(check_txn_dir(run_dir, write=False, allow_torn_tail=allow_torn), output, run_dir)
        return
    from chaos.runner import check_dir  # heavy (kazoo, for the nodes it starts): imported when used

    _show_verdict(check_dir(run_dir, write=False, allow_torn_tail=allow_torn), output, run_dir)


@chaos.command("simulate")
@click.option("--seeds", required=True, help="Seeds to run: A..B (inclusive), A, or A,B,C.")
@click.option("--steps", type=click.IntRange(100, 10_000_000), default=6000, show_default=True,
              help="Simulated events per seed (then the faults stop and the cluster must converge).")
@click.option("--nodes", type=click.Choice(["3", "5"]), default="3", show_default=True)
@click.option("--jobs", type=click.IntRange(1, 256), default=None,
              help="Worker processes (default: one per CPU).")
@click.option("--trace", is_flag=True, help="Print the last events of every failing seed.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the figures as JSON here.")
@click.option("--workload", "sim_workload", type=click.Choice(["pids", "transactions"]), default="pids",
              show_default=True, help="pids: brokers allocating producer IDs; transactions: brokers running the "
                                      "real transaction coordinator, clients, model partitions (docs/simulation.md).")
@output_option
@handle_errors
def chaos_simulate(seeds, steps, nodes, jobs, trace, json_path, sim_workload, output):
    """Deterministic simulation of a whole quorum: the real node code on a simulated network, disks and
    clock, faults mixed by each seed; Raft's safety properties and no re-issued producer ID checked after
    every step.  A seed replays bit for bit.  Exit 5 if any seed finds a violation."""

    try:
        seed_list = parse_seeds(seeds)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--seeds") from None
    with render.progress(f"simulating {len(seed_list)} seed(s)") as update:
        def progress(done, total, result):
            update(done / total, f"seed {result.seed}: {'ok' if result.ok else 'VIOLATION'}")
        result = run_campaign(seed_list, steps, int(nodes), jobs, progress, workload=sim_workload)
    if _figures(result.to_dict(), json_path, output):
        if sim_workload == "transactions":
            render.table("transactions", ["figure", "value"], [
                ["transactions", f"{result.transactions:,}"], ["committed", f"{result.txn_committed:,}"],
                ["aborted", f"{result.txn_aborted:,}"], ["outcome unknown", f"{result.txn_unknown:,}"],
                ["late copies of steps served", f"{result.late_copies:,}"]])
        rates = result.rates()
        render.table("simulation", ["figure", "value"], [
            ["seeds", result.seeds], ["failed", len(result.failures)], ["nodes", nodes],
            ["simulated events", f"{result.steps:,}"], ["faults injected", f"{result.faults:,}"],
            ["messages", f"{result.messages:,}"], ["acknowledged requests", f"{result.acked:,}"],
            ["simulated hours", f"{result.sim_seconds / 3600:.2f}"],
            ["wall seconds", f"{result.wall_seconds:.1f} ({result.jobs} worker(s))"],
            ["events per wall minute", f"{rates['simulated_ops_per_wall_minute']:,}"],
            ["faults per wall minute", f"{rates['faults_per_wall_minute']:,}"],
            ["simulated hours per wall minute", rates["simulated_hours_per_wall_minute"]]])
        render.table("faults by kind", ["fault", "count"], sorted(result.faults_by_kind.items()))
        render.table("traffic", ["figure", "count"], [[k, f"{v:,}"] for k, v in sorted(result.traffic.items())])
        live = result.liveness()
        render.table("liveness (simulated seconds)", ["time to", "after", "count", "median", "p99", "max"], [
            [to, after, f"{s['count']:,}"] + ["-" if s[k] is None else f"{s[k]:.3f}" for k in ("median", "p99", "max")]
            for to, after, s in (
                ("leader", "last heal", live["leader_after_last_heal_s"]),
                ("commit", "last heal", live["commit_after_last_heal_s"]),
                ("leader", "heal in run", live["leader_after_mid_run_heal_s"]))])
        render.line("leader: one that a majority of its configuration follows; commit: a client request committed; "
                    "heal in run: a heal during the run that found no such leader")
        render.line(f"heals during the run: {live['mid_run_heals']:,}, {live['mid_run_heals_with_a_leader']:,} with "
                    f"a leader a majority follows at once, {live['mid_run_heals_open_when_faults_stopped']:,} "
                    f"without one still when the faults stopped")
        for f in result.failures:
            render.error(f"seed {f.seed}, step {f.step}: {f.violation}")
            render.line(f"  replay: {f.replay}")
            if trace:
                for event in f.trace:
                    render.line(f"    {event}")
    if result.failures:
        sys.exit(EXIT_ANOMALY)


@chaos.command("crash-states")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the scripted workload.")
@click.option("--steps", type=click.IntRange(500, 1_000_000), default=3000, show_default=True,
              help="Simulated events of the workload.")
@click.option("--node", "nodes", multiple=True, type=click.IntRange(1, 3),
              help="Node whose disk is cut (repeat; default: each of the three).")
@click.option("--max-ops", type=click.IntRange(1, 1_000_000), default=None,
              help="Cut at most this many file operations per node, spread evenly (default: every one).")
@click.option("--around", default=None,
              help="Only cut near operations on files whose name contains this (e.g. raft.snapshot: the windows "
                   "of compactions and installs).")
@click.option("--after-steps", type=click.IntRange(100, 1_000_000), default=1500, show_default=True,
              help="Simulated events run after each cut, before the cluster must converge.")
@click.option("--jobs", type=click.IntRange(1, 256), default=None, help="Crash states run at once (default: CPUs).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the figures as JSON here.")
@output_option
@handle_errors
def chaos_crash_states(seed, steps, nodes, max_ops, around, after_steps, jobs, json_path, output):
    """Every crash state of a node's disk (ALICE): before each file operation of a scripted workload
    (compaction, a snapshot install, identity writes), each state POSIX allows a power loss to leave is
    started inside the running three-node cluster and checked.  Exit 5 if any loses a committed entry,
    re-issues a block or cannot start."""

    with render.progress("crash states") as update:
        def progress(result):
            update(0.0, f"{result.states} states, {len(result.failures)} failing")
        result = explore(seed, steps, list(nodes) or None, after_steps, jobs, max_ops, progress, around)
        update(1.0, f"{result.states} states")
    if _figures(result.to_dict(), json_path, output):
        render.table("crash states", ["node", "file operations cut", "crash states", "failing"],
                     [[n, c["ops"], c["states"], c["failed"]] for n, c in sorted(result.by_node.items())]
                     + [["all", result.ops, result.states, len(result.failures)]])
        render.line(f"{result.wall_seconds:.1f} s; workload: seed {seed}, {steps} events"
                    + ("" if result.recording_ok else f"; the uncut run failed: {result.recording_violation}"))
        for f in result.failures:
            render.error(f"node {f.node}, power lost before {f.op} ({f.state}): {f.violation}")
    if result.failures or not result.recording_ok:
        sys.exit(EXIT_ANOMALY)


def _figures(figures: dict, json_path: str | None, output: str) -> bool:
    """Write ``figures`` to ``json_path`` (if given) and print them as JSON if asked; True if the caller
    should render its tables instead."""
    if json_path:
        atomic_write(json_path, (json.dumps(figures, indent=1, default=str) + "\n").encode())
    if output == "json":
        render.emit_json(figures)
        return False
    return True


def _show_verdict(verdict, output: str, run_dir: str) -> None:
    if output == "json":
        render.emit_json(verdict.to_dict())
    elif getattr(verdict, "workload", None) == "transactions":
        render_txn_summary(verdict, render.console())
        render.line(f"run directory: {run_dir}")
    else:
        render_summary(verdict, render.console())
        render.line(f"run directory: {run_dir}")
    if not verdict.valid:
        sys.exit(EXIT_ANOMALY)
