"""``pidctl cluster ...``: a local three-node cluster on 127.0.0.1 (and ``pidctl demo``)."""
from __future__ import annotations

import asyncio

import click

from quorum.identity import new_cluster_id
from quorum.localcluster import UNAUTHENTICATED_NOTICE, ClusterError
from wire.errors import NotControllerError

from . import render
from .common import Ctx, gather_status, handle_errors, output_option, run
from .quorum import show_status


@click.group()
def cluster():
    """A local three-node quorum on 127.0.0.1 (background processes)."""


@cluster.command("up")
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option("--block-size", type=click.IntRange(1, 2**31 - 1), default=1000, show_default=True)
@click.option("--metrics", is_flag=True, help="Each node serves Prometheus metrics on a free 127.0.0.1 port.")
@click.pass_obj
@handle_errors
def cluster_up(obj: Ctx, nodes, block_size, metrics=False):
    """Start the local cluster (created on first use) in the background: for development on one machine,
    its client ports take unauthenticated requests on 127.0.0.1 (a deployment: docs/deployment.md)."""
    lc = obj.cluster
    lc.up(size=nodes, block_size=block_size, metrics=metrics)
    addresses = lc.client_addresses()
    asyncio.run(_wait_leader(obj))
    render.line(f"cluster up in {lc.dir}: {len(addresses)} nodes, client addresses {','.join(addresses)}")
    render.line(f"note: this cluster is {UNAUTHENTICATED_NOTICE}")
    endpoints = [n.metrics_address for n in lc.nodes() if n.metrics_address]
    if endpoints:
        render.line(f"metrics: {', '.join(f'http://{a}/metrics' for a in endpoints)}")


async def _wait_leader(obj: Ctx) -> None:
    """Wait until some node leads (``QuorumClient.find_leader``); bounded by --timeout."""
    client = obj.client()
    try:
        await client.find_leader(obj.timeout)
    except NotControllerError:
        raise ClusterError(f"no leader within {obj.timeout:.0f}s") from None
    finally:
        await client.close()


@cluster.command("new-id")
def cluster_new_id():
    """Print a new cluster id, for cluster_id in every node's config of a new deployment."""
    render.line(new_cluster_id())


@cluster.command("down")
@click.pass_obj
@handle_errors
def cluster_down(obj: Ctx):
    lc = obj.cluster
    lc.load()
    lc.down()
    render.line(f"cluster in {lc.dir} stopped")


@cluster.command("status")
@output_option
@click.pass_obj
@handle_errors
def cluster_status(obj: Ctx, output):
    lc = obj.cluster
    nodes = asyncio.run(gather_status(obj))
    for n in nodes:
        n["pid"] = next((i.pid for i in lc.nodes() if i.client_address == n["client_address"]), None)
        n["process"] = "running" if any(lc.alive(i.node_id) for i in lc.nodes()
                                         if i.client_address == n["client_address"]) else "stopped"
    render.quorum_status(output, nodes)


@click.command("demo")
@click.option("--blocks", "count", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Blocks per broker.")
@click.pass_context
def demo(ctx, count):
    """Start the local cluster, register two brokers, allocate blocks, show the quorum."""
    obj: Ctx = ctx.obj
    ctx.invoke(cluster_up)

    async def go(client):
        epochs = {b: await client.register_broker(b) for b in (1, 2)}
        rows = []
        for _ in range(count):
            for b, e in epochs.items():
                blk = await client.allocate(b, e)
                rows.append([b, e, blk.start, blk.next_id, blk.length, blk.node])
        return epochs, rows

    epochs, rows = handle_errors(lambda: asyncio.run(run(go)(obj.client())))()
    render.line(f"registered brokers: {', '.join(f'{b} (epoch {e})' for b, e in epochs.items())}")
    render.table("allocated blocks", ["broker", "epoch", "start", "end (excl.)", "len", "via node"], rows)
    show_status(obj, "table")
    render.line(f"stop it with: pidctl --data-dir {obj.data_dir} cluster down")
