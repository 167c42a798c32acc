"""``pidctl quorum ...``: the Raft quorum: status and membership."""
from __future__ import annotations

import asyncio
import sys

import click

from quorum import membership

from . import render
from .common import EXIT_OK, EXIT_UNAVAILABLE, Addresses, Ctx, gather_status, pidctl_command, quorum_health, run


@click.group()
def quorum():
    """The Raft quorum."""


@quorum.command("status")
@pidctl_command
def quorum_status(obj: Ctx, output):
    """Leader, term, commit index and per-node lag.  Exit 0 healthy, 6 degraded (serving, but a node is down,
    recovering or follows no leader), 3 unavailable (no majority answers or no leader)."""
    sys.exit(show_status(obj, output))


def show_status(obj: Ctx, output: str) -> int:
    """Print the quorum's status and health line; the health's exit code (``quorum_health``)."""
    nodes = asyncio.run(gather_status(obj))
    render.quorum_status(output, nodes)
    code, line = quorum_health(nodes)
    if output != "json":
        (render.line if code == EXIT_OK else render.warn)(line)
    return code


@quorum.command("remove-node")
@click.argument("raft_address", type=Addresses(one=True))
@pidctl_command
def quorum_remove_node(obj: Ctx, raft_address, output):
    """Remove a member (by Raft address) from the cluster; one change at a time."""
    resp = asyncio.run(run(lambda c: membership.remove_node(c, obj.addresses(), raft_address, obj.timeout))(
        obj.client()))
    render.membership(output, resp, f"removed {raft_address}")


@quorum.command("add-node")
@click.argument("raft_address", type=Addresses(one=True))
@click.option("--client-address", required=True, type=Addresses(one=True),
              help="The new node's client address host:port (must be running).")
@click.option("--catch-up-timeout", type=click.FloatRange(0.1, 3600), default=60.0, show_default=True,
              help="Seconds to wait for the new node to hold the log.")
@pidctl_command
def quorum_add_node(obj: Ctx, raft_address, client_address, catch_up_timeout, output):
    """Add a fresh, running node (empty data dir) as a member; waits until it has caught up."""
    resp = asyncio.run(run(lambda c: membership.add_node(c, obj.addresses(), raft_address, client_address,
                                                         catch_up_timeout, obj.timeout))(obj.client()))
    render.membership(output, resp, f"added {raft_address}")
    if not resp["caught_up"]:
        render.error(f"{raft_address} is a member but has not caught up within {catch_up_timeout:g}s "
                     f"(match index {resp['match_index']}, target {resp['catch_up_index']}); is it running?")
        sys.exit(EXIT_UNAVAILABLE)


@quorum.command("transfer-leadership")
@click.argument("raft_address", required=False, type=Addresses(one=True))
@pidctl_command
def quorum_transfer_leadership(obj: Ctx, raft_address, output):
    """Hand leadership to RAFT_ADDRESS (default: the most caught-up follower), e.g. before maintenance."""
    resp = asyncio.run(run(lambda c: membership.transfer_leadership(c, obj.addresses(), raft_address,
                                                                    obj.timeout))(obj.client()))
    render.membership(output, resp, f"leader {resp['previous_leader']} -> {resp['leader']} (term {resp['term']})")
