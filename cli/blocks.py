"""``pidctl blocks ...``: the quorum's producer-ID blocks."""
from __future__ import annotations

import asyncio
import glob
import os

import click

from quorum.client.leader import pick_leader
from quorum.client.quorum import unreachable
from quorum.localcluster import ClusterError
from quorum.trail import iter_blocks, merge_histories, parse_audit
from snapshots.storage.disk import CorruptFileError
from records.wire.errors import PidQuorumError, RequestTimedOutError

from . import render
from .common import INT32_MAX, Ctx, gather_status, pidctl_command, run

_PROBE = 1 << 16  # bytes read to recognise an audit trail (lines are far shorter)


@click.group()
def blocks():
    """Producer-ID blocks."""


@blocks.command("latest")
@pidctl_command
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
              help="Audit file(s) to read (default: ask the nodes of --quorum, or read every node's audit.log "
                   "in --data-dir).")
@click.option("--broker-id", type=click.IntRange(0, INT32_MAX), help="Only this broker's blocks.")
@pidctl_command
def blocks_history(obj: Ctx, audit_files, broker_id, output):
    """Every block ever issued, from the nodes' audit trails (kept across log compaction).

    Where from: the files given with --audit; else, with --quorum (or PIDQUORUM_QUORUM), each node's
    own trail, asked on its client port (DESCRIBE on the cluster when ACLs are on); else the local
    cluster's files (every DATA_DIR/node-*/audit.log).  The blocks of all the trails read, each once."""
    if audit_files or not obj.quorum:
        paths = list(audit_files) or sorted(glob.glob(os.path.join(obj.data_dir, "node-*", "audit.log")))
        if not paths:
            raise ClusterError(f"no audit files in {obj.data_dir} (use --audit FILE, or --quorum)")
        for path in paths:
            _check_audit_file(path)
        rows = [b for b in iter_blocks(paths) if broker_id is None or b["broker_id"] == broker_id]
    else:
        rows = _remote_history(obj, broker_id)
    render.blocks(output, rows, f"block history ({len(rows)} blocks)")


def _remote_history(obj: Ctx, broker_id: int | None) -> list[dict]:
    """Every node's trail (``QuorumClient.block_history_each``), merged; on stderr, which nodes answered
    and up to which Raft index their trails go (each node writes its trail as it applies), and what may
    be missing: a node that did not answer, Raft indexes no answering node's trail holds."""
    answers = asyncio.run(run(lambda c: c.block_history_each(broker_id=broker_id))(obj.client()))
    pages = [a for a in answers.values() if not isinstance(a, Exception)]
    failed = {address: a for address, a in answers.items() if isinstance(a, Exception)}
    if not pages:
        refused = next((e for e in failed.values() if isinstance(e, PidQuorumError) and not e.retriable), None)
        if refused is not None:
            raise refused
        raise RequestTimedOutError(unreachable("no node answered", {a: str(e) for a, e in failed.items()}))
    rows, missing = merge_histories([(p.blocks, p.gaps, p.trail_index) for p in pages])
    click.echo("from " + ", ".join(f"node {p.node_id} ({p.address}) through raft index {p.trail_index} "
                                   f"(applied {p.applied_index})" for p in pages), err=True)
    for address, e in failed.items():
        why = str(e).removeprefix(f"{address}: ") or type(e).__name__
        render.warn(f"{address} did not answer ({why}): its trail is not read")
    if missing:
        ranges = ", ".join(f"{a + 1}..{b}" for a, b in missing)
        render.warn(f"raft indexes {ranges} are in no answering node's trail (a snapshot installed over them): "
                    f"blocks issued there are not listed; read the other nodes' DATA_DIR/audit.log with --audit")
    return rows


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
