"""``pidctl blocks ...``: the quorum's producer-ID blocks."""
from __future__ import annotations

import asyncio
import glob
import os

import click

from client.leader import pick_leader
from client.quorum import unreachable
from quorum.localcluster import ClusterError
from quorum.trail import iter_blocks, parse_audit
from storage.disk import CorruptFileError
from wire.errors import RequestTimedOutError

from . import render
from .common import Ctx, gather_status, handle_errors, output_option

_PROBE = 1 << 16  # bytes read to recognise an audit trail (lines are far shorter)


@click.group()
def blocks():
    """Producer-ID blocks."""


@blocks.command("latest")
@output_option
@click.pass_obj
@handle_errors
def blocks_latest(obj: Ctx, output):
    """The latest block and the next ID, as the leader sees them."""
    nodes = asyncio.run(gather_status(obj))
    live = [n for n in nodes if "raft" in n]
    if not live:
        raise RequestTimedOutError(unreachable("no node answered", {n["client_address"]: n["error"] for n in nodes}))
    leader = pick_leader(dict(enumerate(live)))
    best = live[leader] if leader is not None else max(live, key=lambda n: n["applied_index"])
    result = {"node_id": best["node_id"], "applied_index": best["applied_index"],
              "next_producer_id": best["state"]["next_producer_id"], "latest_block": best["state"]["latest_block"]}
    if output == "json":
        render.emit_json(result)
    else:
        lb = result["latest_block"]
        render.blocks("table", [lb] if lb else [], f"latest block (node {result['node_id']}, "
                                                    f"next producer ID {result['next_producer_id']})")


@blocks.command("history")
@click.option("--audit", "audit_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Audit file(s) to read (default: every node's audit.log in --data-dir).")
@click.option("--broker-id", type=int, help="Only this broker's blocks.")
@output_option
@click.pass_obj
@handle_errors
def blocks_history(obj: Ctx, audit_files, broker_id, output):
    """Every block ever issued, from the nodes' audit trails (kept across log compaction).

    The history is read from audit files, never from the quorum (no request serves it): with --quorum,
    give the nodes' files with --audit (each node's DATA_DIR/audit.log)."""
    if obj.quorum and not audit_files:
        raise click.UsageError("blocks history reads the nodes' audit files, not the quorum given by --quorum "
                               "(no request serves the history): pass --audit FILE (each node's "
                               "DATA_DIR/audit.log), or drop --quorum for the local cluster's")
    paths = list(audit_files) or sorted(glob.glob(os.path.join(obj.data_dir, "node-*", "audit.log")))
    if not paths:
        raise ClusterError(f"no audit files in {obj.data_dir} (use --audit FILE)")
    for path in paths:
        _check_audit_file(path)
    rows = [b for b in iter_blocks(paths) if broker_id is None or b["broker_id"] == broker_id]
    render.blocks(output, rows, f"block history ({len(rows)} blocks)")


def _check_audit_file(path: str) -> None:
    """Refuse a file that is not an audit trail: not empty, yet no audit line at its start (a node's
    trail starts with a whole line; ``read_audit`` would take any other bytes for a torn last line)."""
    with open(path, "rb") as f:
        head = f.read(_PROBE)
    if not head:
        return  # a node that applied nothing yet
    lines, _ = parse_audit(path, head, tail=True)
    if not lines:
        raise CorruptFileError(path, "not an audit trail (no audit line at its start)")
