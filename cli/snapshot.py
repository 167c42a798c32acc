"""``pidctl snapshot ...``: take and inspect snapshots."""
from __future__ import annotations

import asyncio

import click

from snapshots import inspect_snapshot

from . import render
from .common import Ctx, handle_errors, output_option, pidctl_command, run


@click.group()
def snapshot():
    """Snapshot files."""


@snapshot.command("take")
@pidctl_command
def snapshot_take(obj: Ctx, output):
    """Ask every node to write a snapshot now (log compaction) and wait for the files.  -o json: one object
    per node, its client_address and the node's answer (path, bytes, ...)."""
    async def go(client):
        return {a: await client.take_snapshot(a, obj.timeout) for a in obj.addresses()}

    taken = asyncio.run(run(go)(obj.client()))
    if output == "json":
        render.emit_json([{"client_address": a, **snap} for a, snap in taken.items()])
        return
    for a, snap in taken.items():
        render.line(f"{a}: {snap['path']} ({snap['bytes']} bytes)")


@snapshot.command("inspect")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@output_option
@handle_errors
def snapshot_inspect(file, output):
    render.snapshot(output, inspect_snapshot(file))
