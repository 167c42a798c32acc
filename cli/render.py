"""Rendering for pidctl: the only module that imports rich.

Every listing renders as a table or as JSON (the records' own dicts).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Not a terminal (a pipe, CI): do not squeeze tables into 80 columns.
_width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "160"))
_out = Console(highlight=False, soft_wrap=True, width=_width)
_err = Console(stderr=True, highlight=False, soft_wrap=True)


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def table(title: str | None, columns: list[str], rows: Iterable[Iterable[Any]], *, compact: bool = False,
          whole: int = 1) -> None:
    """A table on stdout.  No value is ever cut short ("..."): a cell too wide for its column wraps, at
    spaces where it has some; the first ``whole`` columns (a name, an address) never wrap.  ``compact``:
    no vertical rules (room for more columns in 80)."""
    t = (Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
         if compact else Table(title=title, title_justify="left"))
    cells = [["-" if v is None else str(v) for v in r] for r in rows]
    for i, c in enumerate(columns):
        if i < whole:  # the row's name (a principal, an address): never cut, however narrow the terminal
            t.add_column(c, no_wrap=True, min_width=max([len(c)] + [len(r[i]) for r in cells if len(r) > i]))
        else:
            t.add_column(c, overflow="fold")
    for r in cells:
        t.add_row(*r)
    _out.print(t)


def line(text: str) -> None:
    _out.print(text)


def error(text: str) -> None:
    _err.print(f"[red]error:[/red] {escape(text)}")  # a message may quote "[table]" or a user's value


def warn(text: str) -> None:
    _err.print(f"[yellow]warning:[/yellow] {text}")


def listing(output: str, obj: Any, title: str | None, columns: list[str], rows: Iterable[Iterable[Any]]) -> None:
    if output == "json":
        emit_json(obj)
    else:
        table(title, columns, rows)


def quorum_status(output: str, nodes: list[dict]) -> None:
    """The nodes' DescribeState answers (``cli.common.gather_status``).  ``-o json`` prints them whole: per
    node ``node_id``, ``client_address``, ``raft`` (the Raft side: ``raft.state`` is the node's role, leader,
    follower or candidate; ``leader``, ``term``, ``commit_index``, ``last_applied``, ``peers``, ...),
    ``state`` (the replicated state machine: ``next_producer_id``, ``latest_block``, ``brokers``, ...),
    ``lag`` (entries behind the highest commit index), or ``error`` for a node that did not answer.
    The table has the part an operator reads first and fits 80 columns: the role (who leads; a node that
    follows another leader, or none, is named on the health line), the term, the applied index and lag,
    the next producer ID; the commit index is applied + lag."""
    if output == "json":
        emit_json(nodes)
        return
    rows = []
    for n in nodes:
        if n.get("error"):
            rows.append([n["node_id"], n["client_address"], "down", None, None, None, None])
            continue
        r = n["raft"]
        role = "recovering" if r.get("recovering") else r["state"]
        rows.append([n["node_id"], n["client_address"], role, r["term"], r["last_applied"], n.get("lag"),
                     n["state"]["next_producer_id"]])
    table("quorum status", ["node", "client", "role", "term", "applied", "lag", "next PID"], rows, compact=True,
          whole=2)
    for n in nodes:
        if n.get("error"):
            line(f"node {n['node_id']} is down: {n['error']}")
    _quorum_figures([n for n in nodes if not n.get("error")])


def _node_names(nodes: list[dict]) -> dict[str, str]:
    """Raft address -> the node's number, for the nodes that answered."""
    return {n["raft"]["self"]: str(n["node_id"]) for n in nodes if n.get("raft") and n["raft"].get("self")}


def _ms(seconds: float | None) -> str | None:
    return None if seconds is None else f"{seconds * 1000:.2f}"


def _quorum_figures(nodes: list[dict]) -> None:
    """The figures the metrics endpoints serve (pidquorum_*): one row per figure, one column per node
    (a row per node would need 13 columns); a figure per peer or per broker has a line each."""
    if not nodes:
        return
    names = _node_names(nodes)
    columns: list[list[Any]] = []
    for n in nodes:
        r, snap = n["raft"], n["snapshot"]
        sync, alloc = r.get("journal_sync_latency") or {}, n.get("allocate_latency") or {}
        followers = "\n".join(f"{_peer(names, peer)}: {p['lag_entries']}" for peer, p in sorted(r["peers"].items())
                              if p.get("lag_entries") is not None)
        allocations = "\n".join(f"{b}: {a['blocks']}" for b, a in (n.get("allocations") or {}).items())
        links = "\n".join(f"{_peer(names, peer)}: {_link(p['link'])}" for peer, p in sorted(r["peers"].items())
                          if p.get("link"))
        server = n.get("server", {})
        columns.append([r.get("leader_changes"), followers or None, links or None, snap["bytes"],
                        None if snap.get("age_s") is None else f"{snap['age_s']:.0f}", sync.get("count"),
                        _ms(sync.get("p50_s")), _ms(sync.get("p99_s")), allocations or None, alloc.get("count"),
                        _ms(alloc.get("p99_s")), server.get("throttled")])
    figures = ["leader changes", "follower lag (entries)", "raft links (sealing)", "snapshot bytes",
               "snapshot age s", "journal syncs", "sync p50 ms", "sync p99 ms", "blocks per broker",
               "allocs answered", "alloc p99 ms", "throttled"]
    table("figures (as on the metrics endpoints)", ["figure", *(f"node {n['node_id']}" for n in nodes)],
          [[name, *(c[i] for c in columns)] for i, name in enumerate(figures)], compact=True)


def _peer(names: dict[str, str], raft_address: str) -> str:
    return f"node {names[raft_address]}" if raft_address in names else raft_address


_LINK_NAMES = {"aes256gcm-1": "AES-GCM", "fernet": "Fernet"}


def _link(link: dict) -> str:
    """A Raft link's encoding, out and in (``quorum.linkcrypto``): one name when both directions agree."""
    out, into = (_LINK_NAMES.get(link[k], link[k]) for k in ("out", "in"))
    return out if out == into else f"out {out}, in {into}"


def metrics_status(output: str, address: str, figures: dict) -> None:
    """Figures read from a metrics endpoint (``quorum.telemetry.metrics.read_metrics``)."""
    if output == "json":
        emit_json({"endpoint": address, "metrics": figures})
        return
    rows = []
    for name, value in sorted(figures.items()):
        if isinstance(value, dict):
            rows += [[name, label, _number(v)] for label, v in sorted(value.items())]
        else:
            rows.append([name, None, _number(value)])
    table(f"metrics of {address}", ["metric", "label", "value"], rows)


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.6g}"


def membership(output: str, resp: dict, summary: str) -> None:
    if output == "json":
        emit_json(resp)
        return
    line(summary)
    if "members" in resp:
        line("members: " + ", ".join(resp["members"]))
    if "catch_up_seconds" in resp:
        line(f"caught up: {resp['caught_up']} (match index {resp['match_index']}, "
             f"target {resp['catch_up_index']}, {resp['catch_up_seconds']} s)")


def blocks(output: str, blocks: list[dict], title: str) -> None:
    listing(output, blocks, title, ["raft idx", "broker", "epoch", "start", "end (excl.)", "len"],
            [[b.get("raft_index"), b["broker_id"], b["broker_epoch"], b["producer_id_start"],
              b["producer_id_start"] + b["producer_id_len"], b["producer_id_len"]] for b in blocks])


def snapshot(output: str, info: dict) -> None:
    if output == "json":
        emit_json(info)
        return
    line(f"snapshot {info['file']}: {info['size_bytes']} bytes, last index {info['last_index']} "
         f"(term {info['last_term']}), cluster {', '.join(info['cluster'])}")
    table("records", ["type", "fields"],
          [[r["type"], ", ".join(f"{k}={v}" for k, v in r.items() if k != "type")] for r in info["records"]])


class progress:
    """A progress bar on stderr: ``with render.progress("chaos") as update: update(fraction, text)``."""

    def __init__(self, title: str):

        self._p = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                           TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=_err, transient=False)
        self._title = title
        self._task = None

    def __enter__(self):
        self._p.__enter__()
        self._task = self._p.add_task(self._title, total=1.0, note="")

        def update(fraction: float, note: str = "") -> None:
            self._p.update(self._task, completed=fraction, note=note)
        return update

    def __exit__(self, *exc) -> None:
        self._p.__exit__(*exc)


def console() -> Console:
    """The stdout console (for reports rendered by other packages)."""
    return _out


def quotas(output: str, rows: list[dict], node: str) -> None:
    if output == "json":
        emit_json(rows)
        return
    table(f"client quotas (from {node})", ["entity", "producer_ids_rate"],
          [[r["entity"], r.get("producer_ids_rate")] for r in rows])


def quota_status(output: str, by_broker: dict[str, dict]) -> None:
    if output == "json":
        emit_json(by_broker)
        return
    for broker_dir, data in by_broker.items():
        fresh = data.get("freshness") or {}
        cfg = data.get("config") or {}
        line(f"{broker_dir}: quotas read from {fresh.get('read_from') or '-'} {fresh.get('age_s')} s before the "
             f"stats were written ({data.get('file_age_s')} s ago); window {cfg.get('window_num')} x "
             f"{cfg.get('window_size_s')} s, burst {cfg.get('burst_s')} s of the rate"
             + (f"; last error: {fresh['last_error']}" if fresh.get("last_error") else ""))
        table(None, ["principal", "quota/s", "from", "rate/s", "tokens", "burst", "throttle ms", "throttled",
                     "new PIDs", "seen", "filter KiB", "layers"],
              [[p, s["quota"], s["quota_source"], s["rate"], s["tokens"], s.get("burst"), s["throttle_time_ms"],
                s["throttled_requests"], s["new_pids"], s["seen_pids"], round(s["filter_bytes"] / 1024, 1),
                s["filter_layers"]] for p, s in data["principals"].items()])
