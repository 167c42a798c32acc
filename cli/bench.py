"""``pidctl bench``: pidquorum against ZooKeeper and etcd, side by side; ``pidctl bench NAME``: one of
the other benchmarks of the ``benchmarks`` package (its own options, ``pidctl bench NAME --help``)."""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile

import click

from . import render
from .common import EXIT_ERROR, handle_errors, output_option

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


def _checkout() -> str | None:
    """The source checkout this pidctl runs from (an editable install), if it holds the benchmarks."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return root if os.path.isfile(os.path.join(root, "benchmarks", "__init__.py")) else None


def _load(name: str, module: str):
    """A module of the benchmarks.  They need the test extras and live beside the package in a source
    checkout, not in the wheel (``benchmarks`` tells its children where it is)."""
    try:
        return importlib.import_module(f"benchmarks.{module}")
    except ModuleNotFoundError as e:
        if e.name not in ("benchmarks", f"benchmarks.{module}"):  # an optional package (confluent-kafka ...)
            raise click.ClickException(f"{f'pidctl bench {name}'.rstrip()} needs the Python package {e.name!r}: "
                                       f"{e}") from None
    root = _checkout()
    if root is None:
        raise click.ClickException("pidctl bench runs from a source checkout of pidquorum (pip install -e '.[test]' "
                                   "there): this installation carries no benchmarks")
    sys.path.insert(0, root)
    return _load(name, module)


class BenchGroup(click.Group):
    def format_usage(self, ctx, formatter):
        formatter.write_usage(ctx.command_path, "[OPTIONS] | NAME [NAME'S OPTIONS]")


def _benchmark_command(name: str, module: str, summary: str) -> click.Command:
    @click.command(name, help=f"{summary}\n\nOptions: `pidctl bench {name} --help` (python -m benchmarks.{module}); "
                              "-o json: the results JSON on stdout (the printout goes to stderr).",
                   short_help=summary, add_help_option=False,
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    @handle_errors
    def command(ctx, args):
        main = _load(name, module).main
        args, output = _take_output(list(args))
        if output == "table":
            sys.exit(main(args, prog=ctx.command_path))
        sys.exit(_run_json(main, args, ctx.command_path))
    return command


def _take_output(args: list[str]) -> tuple[list[str], str]:
    """``args`` without ``-o/--output FORMAT`` (the same for every benchmark, whatever its own options),
    and the format (table when not given)."""
    out, output, i = [], "table", 0
    while i < len(args):
        a = args[i]
        if a in ("-o", "--output"):
            if i + 1 == len(args):
                raise click.UsageError(f"{a} needs a value: table or json")
            output, i = args[i + 1], i + 2
        elif a.startswith("--output="):
            output, i = a.split("=", 1)[1], i + 1
        else:
            out.append(a)
            i += 1
    if output not in ("table", "json"):
        raise click.UsageError(f"-o/--output: expected table or json, got {output!r}")
    return out, output


def _option_value(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _run_json(main, args: list[str], prog: str) -> int:
    """Run a benchmark's ``main`` with its printout on stderr, then print the results file it wrote (its
    --json FILE if given, else one in a temporary directory) on stdout; its exit status."""
    with tempfile.TemporaryDirectory(prefix="pidctl-bench-") as tmp:
        path = _option_value(args, "--json")
        if path is None:
            path = os.path.join(tmp, "results.json")
            args = [*args, "--json", path]
        before = os.stat(path).st_mtime_ns if os.path.exists(path) else None
        with contextlib.redirect_stdout(sys.stderr):
            status = main(args, prog=prog)
        if not os.path.exists(path) or os.stat(path).st_mtime_ns == before:
            raise click.ClickException(f"{prog} wrote no results to {path} (exit status {status})")
        with open(path, encoding="utf-8") as f:
            sys.stdout.write(f.read().rstrip("\n") + "\n")
    return status


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
@output_option
@click.pass_context
@handle_errors
def bench(ctx, systems, duration, out_dir, kills, history, fill_cap, workloads, manager_rate, install_peers, keep,
          reserve_blocks, output):
    """Benchmark pidquorum against ZooKeeper and etcd (three-node clusters on loopback), in one run.
    -o json: bench.json's content on stdout instead of the table.

    With a NAME, run that benchmark instead, with its own options (`pidctl bench NAME --help`), and -o json
    after its name for its results JSON on stdout."""

    if ctx.invoked_subcommand is not None:
        given = [f"--{p.name.replace('_', '-')}" for p in ctx.command.params
                 if ctx.get_parameter_source(p.name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"{', '.join(given)}: options of the comparison; `pidctl bench "
                                   f"{ctx.invoked_subcommand}` takes its own after its name")
        return
    known = _load("", "systems").SYSTEMS
    names = [x.strip() for x in systems.split(",") if x.strip()]
    unknown = [x for x in names if x not in known]
    if unknown or not names:
        raise click.UsageError(f"--systems: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}")
    try:
        wl = sorted({int(x) for x in workloads.split(",") if x.strip()})
    except ValueError:
        wl = []
    if not wl or any(not 1 <= x <= 5 for x in wl):
        raise click.UsageError(f"--workloads: expected numbers 1-5, got {workloads!r}")
    run = _load("", "run")
    opts = run.BenchOptions(systems=names, duration=duration, out_dir=out_dir, kills=kills, history=history,
                        fill_cap=fill_cap, workloads=wl, manager_rate=manager_rate, install_peers=install_peers,
                        keep=keep, reserve_blocks=reserve_blocks)
    res = run.run_bench(opts)  # progress on stderr
    if output == "json":
        render.emit_json(res)
    else:
        click.echo(_load("", "run_report").render_table(res))
    if res["errors"]:
        sys.exit(EXIT_ERROR)


for _name, (_module, _summary) in BENCHMARKS.items():
    bench.add_command(_benchmark_command(_name, _module, _summary))
