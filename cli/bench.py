"""``pidctl bench``: pidquorum against ZooKeeper and etcd, side by side."""
from __future__ import annotations

import sys

import click

from benchmarks.run import BenchOptions, render_table, run_bench
from benchmarks.systems import SYSTEMS

from .common import EXIT_ERROR, handle_errors


@click.command("bench")
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
@click.option("--reserve-blocks", type=click.IntRange(0, 1024), default=32, show_default=True,
              help="pidquorum's allocate_reserve_blocks (leader-side reserve; 0 = the node default, off).")
@handle_errors
def bench(systems, duration, out_dir, kills, history, fill_cap, workloads, manager_rate, install_peers, keep,
          reserve_blocks):
    """Benchmark pidquorum against ZooKeeper and etcd (three-node clusters on loopback), in one run."""

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
