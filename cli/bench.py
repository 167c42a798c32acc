"""``pidctl bench``: pidquorum against ZooKeeper and etcd, side by side; ``pidctl bench NAME``: one of
the other benchmarks of the ``benchmarks`` package (its own options, ``pidctl bench NAME --help``)."""
from __future__ import annotations

import importlib
import sys

import click

from benchmarks.run import BenchOptions, render_table, run_bench
from benchmarks.systems import SYSTEMS

from .common import EXIT_ERROR, handle_errors

# name -> (module of the benchmarks package, what it measures); each module has main(argv, prog) -> exit status.
# Imported when run: some need heavy or optional packages (pyarrow and pyspark, confluent-kafka).
BENCHMARKS = {
    "quorum": ("quorum_phases", "A local three-node pidquorum: sequential and concurrent allocations, leader "
                                "kills, restart after a large history."),
    "pid-manager": ("pid_manager", "The broker's ProducerIdManager: generate latency, and leader kills at a "
                                   "steady demand (adaptive vs Kafka-like reserve)."),
    "broker": ("broker", "The broker front end with real Kafka clients: InitProducerId latency, leader kills "
                         "under load, produce throughput."),
    "metrics": ("metrics", "Observability paths: histogram and log-line cost, /metrics scrapes, what a scrape "
                           "costs allocations."),
    "quota": ("quota", "The KIP-936 producer-ID quota on a simulated clock: filter memory, false positives, "
                       "check() cost."),
    "producers": ("producers", "Idempotent-producer state at scale: memory per idle producer, active latency, "
                               "expiry, snapshots and broker restart with N idle producers in one partition."),
    "transactions": ("transactions", "Kafka transactions with librdkafka: commits/s and commit latency against an "
                                     "idempotent producer's flush, and exactly-once across quorum leader kills."),
    "security": ("security", "Authentication and authorization: PLAIN and SCRAM, ACL checks, a SASL_SSL "
                             "connection."),
    "audit": ("audit", "The Spark audit job against a single-process numpy check of the same blocks."),
    "stages": ("stages", "Where one commit's time goes: workload 1's stages on the leader and the followers, "
                         "timed by probes in the nodes."),
    "ab": ("ab", "Two source trees of the node side by side: workload 1 in pairs of fresh clusters, judged by "
                 "the pairs' ratios."),
}


class BenchGroup(click.Group):
    def format_usage(self, ctx, formatter):
        formatter.write_usage(ctx.command_path, "[OPTIONS] | NAME [NAME'S OPTIONS]")


def _benchmark_command(name: str, module: str, summary: str) -> click.Command:
    @click.command(name, help=f"{summary}\n\nOptions: `pidctl bench {name} --help` (python -m benchmarks.{module}).",
                   short_help=summary, add_help_option=False,
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    @handle_errors
    def command(ctx, args):
        try:
            main = importlib.import_module(f"benchmarks.{module}").main
        except ModuleNotFoundError as e:  # an optional package (confluent-kafka ...) is missing
            raise click.ClickException(f"pidctl bench {name} needs the Python package {e.name!r}: {e}") from None
        sys.exit(main(list(args), prog=ctx.command_path))
    return command


@click.group("bench", cls=BenchGroup, invoke_without_command=True)
@click.option("--systems", default="pidquorum,zookeeper,etcd", show_default=True,
              help="Comma-separated systems to compare (pidquorum, zookeeper, etcd).")
@click.option("--duration", type=click.FloatRange(0.5, 3600), default=10.0, show_default=True,
              help="Seconds per throughput scenario (workloads 1, 2 and 4).")
@click.option("--out", "out_dir", default="bench-results", show_default=True, type=click.Path(file_okay=False),
              help="Where bench.json and bench.png go.")
@click.option("--kills", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Leader kills per system in workload 3.")
@click.option("--history", type=click.IntRange(11, 100_000_000), default=1_000_000, show_default=True,
              help="Large history for workload 5 (allocations).")
@click.option("--fill-cap", type=click.FloatRange(1, 36000), default=600.0, show_default=True,
              help="Cap on filling the large history, seconds (the output says when it was not reached).")
@click.option("--workloads", default="1,2,3,4,5", show_default=True, help="Comma-separated subset of 1-5.")
@click.option("--manager-rate", type=click.FloatRange(1, 10_000_000), default=20_000.0, show_default=True,
              help="IDs/s asked of the broker's ProducerIdManager in workload 4.")
@click.option("--install-peers", is_flag=True, help="apt-get install the missing peers' Debian packages first.")
@click.option("--keep", is_flag=True, help="Keep the clusters' directories.")
@click.option("--reserve-blocks", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="pidquorum's allocate_reserve_blocks (leader-side reserve; 0 = off, the node default).")
@click.pass_context
@handle_errors
def bench(ctx, systems, duration, out_dir, kills, history, fill_cap, workloads, manager_rate, install_peers, keep,
          reserve_blocks):
    """Benchmark pidquorum against ZooKeeper and etcd (three-node clusters on loopback), in one run.

    With a NAME, run that benchmark instead, with its own options (`pidctl bench NAME --help`)."""

    if ctx.invoked_subcommand is not None:
        given = [f"--{p.name.replace('_', '-')}" for p in ctx.command.params
                 if ctx.get_parameter_source(p.name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"{', '.join(given)}: options of the comparison; `pidctl bench "
                                   f"{ctx.invoked_subcommand}` takes its own after its name")
        return
    names = [x.strip() for x in systems.split(",") if x.strip()]
    unknown = [x for x in names if x not in SYSTEMS]
    if unknown or not names:
        raise click.UsageError(f"--systems: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(SYSTEMS)}")
    try:
        wl = sorted({int(x) for x in workloads.split(",") if x.strip()})
    except ValueError:
        wl = []
    if not wl or any(not 1 <= x <= 5 for x in wl):
        raise click.UsageError(f"--workloads: expected numbers 1-5, got {workloads!r}")
    opts = BenchOptions(systems=names, duration=duration, out_dir=out_dir, kills=kills, history=history,
                        fill_cap=fill_cap, workloads=wl, manager_rate=manager_rate, install_peers=install_peers,
                        keep=keep, reserve_blocks=reserve_blocks)
    res = run_bench(opts)  # progress on stderr
    click.echo(render_table(res))
    if res["errors"]:
        sys.exit(EXIT_ERROR)


for _name, (_module, _summary) in BENCHMARKS.items():
    bench.add_command(_benchmark_command(_name, _module, _summary))
