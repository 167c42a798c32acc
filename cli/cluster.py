"""``pidctl cluster ...``: a local three-node cluster on 127.0.0.1 (and ``pidctl demo``)."""
from __future__ import annotations

import asyncio
import sys

import click
from click.core import ParameterSource

from quorum.identity import new_cluster_id
from quorum.localcluster import UNAUTHENTICATED_NOTICE, ClusterError
from records.wire.errors import NotControllerError

from . import render
from .common import (
    EXIT_ERROR,
    EXIT_OK,
    Ctx,
    gather_status,
    handle_errors,
    output_option,
    pidctl_command,
    quorum_health,
    run,
)
from .quorum import show_status


@click.group()
def cluster():
    """A local three-node quorum on 127.0.0.1 (background processes)."""


@cluster.command("up")
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option("--block-size", type=click.IntRange(1, 2**31 - 1), default=1000, show_default=True)
@click.option("--metrics", is_flag=True, help="Each node serves Prometheus metrics on a free 127.0.0.1 port.")
@output_option
@click.pass_context
@handle_errors
def cluster_up(ctx, nodes, block_size, metrics=False, output="table"):
    """Start the local cluster (created on first use) in the background: for development on one machine,
    its client ports take unauthenticated requests on 127.0.0.1 (a deployment: docs/deployment.md).

    --nodes, --block-size and --metrics are fixed when the cluster is created: given for an existing
    cluster with other values, they are refused (exit 1); `pidctl cluster reset` deletes it."""
    obj: Ctx = ctx.obj
    result = start_cluster(obj, {name: value for name, value in (("nodes", nodes), ("block_size", block_size),
                                                                 ("metrics", metrics))
                                 if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT},
                           size=nodes, block_size=block_size, metrics=metrics)
    if output == "json":
        render.emit_json(result)
    else:
        render_cluster_up(result)


def start_cluster(obj: Ctx, given: dict, **create_options) -> dict:
    """Start the local cluster (``LocalCluster.up``), refusing ``given`` settings an existing cluster does
    not have; what ``cluster up -o json`` prints: the directory, whether it was already up, the nodes."""
    lc = obj.cluster
    differ = lc.differences(**given)
    if differ:
        raise ClusterError(f"the cluster in {lc.dir} exists with {', '.join(differ)}; its settings are fixed at "
                           f"creation: to start over, pidctl --data-dir {obj.data_dir} cluster reset (deletes its "
                           f"data), or use another --data-dir")
    already = lc.exists() and lc.running()
    if not already:
        lc.up(**create_options)
    asyncio.run(_wait_leader(obj))
    return {"data_dir": lc.dir, "already_up": already, "settings": lc.settings(),
            "client_addresses": lc.client_addresses(),
            "nodes": [{"node_id": n.node_id, "pid": n.pid, "client_address": n.client_address,
                       "raft_address": n.raft_address, "metrics_address": n.metrics_address, "removed": n.removed}
                      for n in lc.nodes()],
            "notice": f"this cluster is {UNAUTHENTICATED_NOTICE}"}


def render_cluster_up(result: dict) -> None:
    addresses = result["client_addresses"]
    render.line(f"cluster {'already ' if result['already_up'] else ''}up in {result['data_dir']}: "
                f"{len(addresses)} nodes, client addresses {','.join(addresses)}")
    render.line(f"note: {result['notice']}")
    endpoints = [n["metrics_address"] for n in result["nodes"] if n["metrics_address"] and not n["removed"]]
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


@cluster.command("reset")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
@handle_errors
def cluster_reset(obj: Ctx, yes):
    """Stop the local cluster's nodes and delete its data: every block it issued, its configs, logs and
    secret (files in the directory the cluster did not write are kept).  The next `pidctl cluster up`
    creates a new cluster, with new settings, that issues IDs from 0 again."""
    lc = obj.cluster
    if not lc.exists():
        render.line(f"no cluster in {lc.dir}: nothing to reset")
        return
    if not yes:
        try:
            sure = click.confirm(f"stop the cluster in {lc.dir} and delete its data (all blocks it issued)?")
        except click.exceptions.Abort:  # end of input: no answer
            sure = False
        if not sure:
            render.error("not reset: nothing stopped or deleted (--yes resets without asking)")
            sys.exit(EXIT_ERROR)
    left = lc.reset()
    if left:
        render.line(f"cluster in {lc.dir} stopped and deleted; kept what it did not write: {', '.join(left)}")
    else:
        render.line(f"cluster in {lc.dir} stopped and deleted")


@cluster.command("status")
@pidctl_command
def cluster_status(obj: Ctx, output):
    """Each node's process (running or stopped, its pid) and Raft status; exits as ``pidctl quorum status``
    does (0 healthy, 6 degraded, 3 unavailable), the health line last."""
    lc = obj.cluster
    nodes = asyncio.run(gather_status(obj))
    for n in nodes:
        n["pid"] = next((i.pid for i in lc.nodes() if i.client_address == n["client_address"]), None)
        n["process"] = "running" if any(lc.alive(i.node_id) for i in lc.nodes()
                                         if i.client_address == n["client_address"]) else "stopped"
    render.quorum_status(output, nodes)
    code, line = quorum_health(nodes)
    if output != "json":
        (render.line if code == EXIT_OK else render.warn)(line)
    if code != EXIT_OK:
        sys.exit(code)


@click.command("demo")
@click.option("--blocks", "count", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Blocks per broker.")
@pidctl_command
def demo(obj: Ctx, count, output):
    """Start the local cluster, register two brokers, allocate blocks, show the quorum.

    -o json: one object: cluster (as `cluster up -o json`), brokers, blocks, status (as `quorum status
    -o json`) and health."""
    cluster_info = start_cluster(obj, {})
    if output != "json":
        render_cluster_up(cluster_info)

    async def go(client):
        epochs = {b: await client.register_broker(b) for b in (1, 2)}
        allocated = []
        for _ in range(count):
            for b, e in epochs.items():
                blk = await client.allocate(b, e)
                allocated.append({"broker_id": b, "broker_epoch": e, "producer_id_start": blk.start,
                                  "next_producer_id": blk.next_id, "producer_id_len": blk.length, "node": blk.node})
        return epochs, allocated

    epochs, allocated = asyncio.run(run(go)(obj.client()))
    if output == "json":
        nodes = asyncio.run(gather_status(obj))
        code, health = quorum_health(nodes)
        render.emit_json({"cluster": cluster_info,
                          "brokers": [{"broker_id": b, "broker_epoch": e} for b, e in epochs.items()],
                          "blocks": allocated, "status": nodes, "health": {"exit_code": code, "line": health},
                          "stop": f"pidctl --data-dir {obj.data_dir} cluster down"})
        return
    render.line(f"registered brokers: {', '.join(f'{b} (epoch {e})' for b, e in epochs.items())}")
    render.table("allocated blocks", ["broker", "epoch", "start", "end (excl.)", "len", "via node"],
                 [[a["broker_id"], a["broker_epoch"], a["producer_id_start"], a["next_producer_id"],
                   a["producer_id_len"], a["node"]] for a in allocated])
    show_status(obj, "table")
    render.line(f"stop it with: pidctl --data-dir {obj.data_dir} cluster down")
