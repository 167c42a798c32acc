"""Rendering an audit report: a terminal summary (rich) and a PNG of per-broker rates (matplotlib, Agg).

As in ``chaos.report``, the chart draws on a ``matplotlib.figure.Figure`` with
the Agg canvas directly, never through pyplot, so it changes no global backend
state and is safe from any thread.
"""
from __future__ import annotations

import datetime
import os
from typing import Any

from rich.console import Console
from rich.table import Table

from chaos.figures import fmt, print_table

SHOW = 10        # findings listed per kind in the summary
MAX_POINTS = 2000  # chart points per broker (windows are merged above that)
BROKER_ROWS = 15   # brokers listed in the summary


def _fmt(v: Any, digits: int = 1) -> str:
    return str(v).lower() if isinstance(v, bool) else fmt(v, digits)


def _block(b: dict | None) -> str:
    if not b:
        return "-"
    if b.get("kind") not in ("quorum", "zookeeper", "chaos"):
        return f"a block ending at {b.get('end'):,}"
    where = {"quorum": lambda: f"raft {b['raft_index']}:{b['position']}, broker {b['broker_id']} epoch {b['broker_epoch']}",
             "zookeeper": lambda: f"ZooKeeper block of broker {b['broker_id']} (seed at raft {b['seed_raft_index']})",
             "chaos": lambda: f"chaos op #{b['op_index']} {b.get('process') or ''}, broker {b['broker_id']}"}[b["kind"]]()
    return f"[{b['start']:,}, {b['end']:,}) {where}"


def _years(y: float | None) -> str:
    if y is None:
        return "-"
    if y >= 1e6:
        return f"{y:.2e} years"
    return f"{y:,.1f} years"


def render_summary(report: dict, console: Console | None = None, *, limit: int = SHOW) -> None:
    """Headline (VALID/INVALID), violations with their first ``limit`` examples, gaps, ID-space
    projection, brokers (restart-loop suspects first), and where the files went."""
    out = console or Console(highlight=False)
    checks = report["checks"]
    blocks = report["blocks"]
    kinds = ", ".join(f"{_fmt(v['blocks'])} {k}" for k, v in sorted(blocks["by_kind"].items())) or "no blocks"
    dup = checks["duplicate_pids"]
    if report["valid"]:
        out.print(f"[bold green]VALID[/bold green]: {_fmt(blocks['issued'])} blocks ({kinds}), "
                  f"{_fmt(blocks['ids_issued'])} IDs, {_fmt(dup['pids_checked'])} chaos PIDs: no ID issued twice")
    else:
        v = report["violations"]
        out.print("[bold red]INVALID[/bold red]: " + ", ".join(f"{k} x{_fmt(n)}" for k, n in v.items() if n)
                  + f" in {_fmt(blocks['issued'])} blocks ({kinds}) and {_fmt(dup['pids_checked'])} chaos PIDs")
    extra = []
    if blocks["refused_records"]:
        extra.append(f"{_fmt(blocks['refused_records'])} refused records not counted")
    if blocks["chaos_acks_matched"]:
        extra.append(f"{_fmt(blocks['chaos_acks_matched'])} chaos acknowledgements matched to their records")
    spaces = report.get("id_spaces", {}).get("spaces", {})
    for space, members in spaces.items():
        if members != [space]:
            extra.append(f"ID space {space!r} = sources {', '.join(members)} (compared with each other)")
    if extra:
        out.print("; ".join(extra))
    nd = checks["node_disagreements"]
    if nd["count"]:
        out.print(f"[yellow]warning:[/yellow] nodes disagree on whether {_fmt(nd['count'])} record(s) were accepted "
                  f"(counted as issued): first at raft index {nd['examples'][0]['raft_index']}")

    ov = checks["overlaps"]
    if ov["count"]:
        print_table(out, f"overlaps: first {min(limit, len(ov['examples']))} of {_fmt(ov['count'])} "
                    f"({_fmt(ov['ids_reissued'])} IDs issued more than once)",
               ("source", "block", "overlaps earlier block", "shared IDs"),
               [(e["source"], _block(e["block"]), _block(e["overlaps"]), _fmt(e["shared_ids"]))
                for e in ov["examples"][:limit]])
    if dup["count"]:
        print_table(out, f"duplicate PIDs: first {min(limit, len(dup['examples']))} of {_fmt(dup['count'])}",
               ("source", "pid", "times", "first", "last"),
               [(e["source"], _fmt(e["pid"]), _fmt(e["times"]), f"#{e['first']['op_index']} {e['first']['process']}",
                 f"#{e['last']['op_index']} {e['last']['process']}") for e in dup["examples"][:limit]])
    mb = checks["migration_boundary"]
    if mb["count"]:
        print_table(out, f"quorum blocks in ZooKeeper's range: {_fmt(mb['count'])} (seeds: {_fmt(mb['seeds'])})",
               ("source", "seed (raft)", "ZooKeeper range", "quorum block", "issued"),
               [(e["source"], _fmt(e["seed_raft_index"]), f"0..{e['zk_block_end']:,}", _block(e["block"]),
                 e["issued"]) for e in mb["examples"][:limit]])
    elif mb["seeds"]:
        out.print(f"migration boundary: {_fmt(mb['seeds'])} seed(s), every quorum block lies above ZooKeeper's "
                  "range")

    gaps = report["gaps"]
    out.print(f"gaps: {_fmt(gaps['count'])}, {_fmt(gaps['wasted_ids'])} IDs never issued between blocks")
    if gaps["count"]:
        print_table(out, f"gaps: first {min(limit, len(gaps['examples']))} of {_fmt(gaps['count'])}",
               ("source", "from", "to (excl.)", "IDs"),
               [(e["source"], _fmt(e["from"]), _fmt(e["to"]), _fmt(e["wasted_ids"])) for e in gaps["examples"][:limit]],
               numbers_right=True)

    if report["id_space"]:
        t = Table(title="ID space (up to 2**63-2)", title_justify="left")
        for c in ("source", "blocks", "IDs issued", "next ID", "used", "rate IDs/s", "runs out in", "at"):
            t.add_column(c, justify="left" if c == "source" else "right")
        for src, s in report["id_space"].items():
            t.add_row(src, _fmt(s.get("blocks")), _fmt(s.get("ids_issued")), _fmt(s.get("next_id")),
                      f"{s['used_fraction']:.2e}" if s.get("used_fraction") is not None else "-",
                      _fmt(s.get("rate_ids_per_s"), 1), _years(s.get("exhausted_in_years")),
                      s.get("exhausted_at") or "-")
        out.print(t)

    br = report["brokers"]
    if br["per_broker"]:
        rl = br["restart_loops"]
        title = (f"brokers ({_fmt(br['count'])}; {_fmt(rl['count'])} look like restart loops; "
                 f"windows of {br['window_ms'] / 1000:g} s)")
        t = Table(title=title, title_justify="left")
        for c in ("source", "broker", "blocks", "IDs", "median/window", "peak/window", "registrations",
                  "max regs/window", "why flagged"):
            t.add_column(c, justify="left" if c in ("source", "why flagged") else "right")
        for b in br["per_broker"][:BROKER_ROWS]:
            t.add_row(b["source"], _fmt(b["broker_id"]), _fmt(b["blocks"]), _fmt(b["ids"]),
                      _fmt(b["median_blocks_per_window"]), _fmt(b["peak_blocks_per_window"]),
                      _fmt(b["registrations"]), _fmt(b["max_registrations_per_window"]),
                      "[red]" + "; ".join(b["reasons"]) + "[/red]" if b["reasons"] else "")
        out.print(t)
        if len(br["per_broker"]) > BROKER_ROWS:
            out.print(f"... {len(br['per_broker']) - BROKER_ROWS} more brokers in audit.json")
    timing = report.get("timing_s", {})
    sp = report.get("spark", {})
    if timing:
        out.print(f"Spark {sp.get('version', '?')} on {sp.get('master', '?')}: {timing.get('total', 0):.1f} s "
                  f"({', '.join(f'{k} {v:.1f}' for k, v in timing.items() if k != 'total')})")
    for c in report.get("charts", []):
        out.print(f"chart: {c}")


_TIME_UNITS = ((600.0, "seconds", 1.0), (36_000.0, "minutes", 60.0), (432_000.0, "hours", 3600.0))


def time_unit(span_s: float) -> tuple[str, float]:
    """The unit of a time axis that spans ``span_s`` seconds, and its length in seconds: seconds up to
    10 minutes, minutes up to 10 hours, hours up to 5 days, then days."""
    return next(((name, secs) for limit, name, secs in _TIME_UNITS if span_s <= limit), ("days", 86400.0))


def rates_figure(series: dict, window_ms: int):
    """The figure of ``rates_png``: one panel per source (at most 6), blocks per window for its chosen
    brokers over time, restart-loop suspects drawn thicker and marked in the legend; windows merged so
    no line has more than MAX_POINTS points; the time axis in the unit that fits the source's span
    (``time_unit``).  A source with no blocks says so in its panel."""
    import numpy as np  # heavy (numpy): imported when used
    from matplotlib.figure import Figure  # heavy (matplotlib): imported when used

    sources = list(series)[:6]
    fig = Figure(figsize=(12, 3.2 * max(1, len(sources)) + 0.8), dpi=100)
    axes = fig.subplots(max(1, len(sources)), 1, squeeze=False)[:, 0]
    if not sources:
        axes[0].set_axis_off()
        axes[0].text(0.5, 0.5, "no data: no allocations in the export", ha="center", va="center",
                     transform=axes[0].transAxes)
    for ax, src in zip(axes, sources):
        d = series[src]
        wins = [w for pts in d["brokers"].values() for w, _ in pts]
        if not wins:
            ax.set_axis_off()
            ax.text(0.5, 0.5, f"{src}: no data (no allocations)", ha="center", va="center", transform=ax.transAxes)
            continue
        w0, w1 = min(wins), max(wins)
        merge = max(1, -(-(w1 - w0 + 1) // MAX_POINTS))
        per_s = 1000.0 / (window_ms * merge)
        nb = (w1 - w0) // merge + 1
        t0 = w0 * window_ms / 1000.0
        unit, unit_s = time_unit(nb * merge * window_ms / 1000.0)
        edges = (np.arange(nb + 1) * merge * window_ms) / 1000.0 / unit_s  # units since the first window
        for broker, pts in d["brokers"].items():
            counts = np.zeros(nb)
            for w, n in pts:
                counts[(w - w0) // merge] += n
            flagged = int(broker) in d["flagged"]
            ax.stairs(counts * per_s * 60.0, edges, linewidth=2.0 if flagged else 1.0, baseline=None,
                      label=f"broker {broker}" + (" (restart loop?)" if flagged else ""))
        ax.set_ylim(bottom=0)
        ax.set_xlim(0, edges[-1])
        start = datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        ax.set_title(f"{src}: AllocateProducerIds per minute, per broker (windows of "
                     f"{window_ms * merge / 1000:g} s)")
        ax.set_xlabel(f"{unit} since {start}")
        ax.set_ylabel("blocks / min")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    return fig


def rates_png(series: dict, window_ms: int, path: str | os.PathLike) -> str:
    """``rates_figure`` as a PNG at ``path``; returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy (matplotlib): imported when used

    path = os.fspath(path)
    fig = rates_figure(series, window_ms)
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png")
    return path
