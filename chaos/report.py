"""Rendering a chaos verdict: a terminal summary (rich) and a PNG timeline (matplotlib, Agg).

The timeline draws on a ``matplotlib.figure.Figure`` with the Agg canvas
directly, never through pyplot, so it changes no global backend state and is
safe to call from any thread or a test process that also uses pyplot.
"""
from __future__ import annotations

import os
from typing import Any

from rich.console import Console
from rich.table import Table

from .figures import fmt, print_table
from .checker import ANOMALIES, Verdict, fault_intervals, history_end_ns, percentile
from .history import ALLOCATE, GENERATE, OK, Op, pair_ops

SHOW = 10  # anomalies listed per kind in the summary
MAX_BUCKETS = 20_000  # timeline resolution limit


def render_summary(verdict: Verdict, console: Console | None = None, *, limit: int = SHOW) -> None:
    """Print the verdict: headline, anomalies (first ``limit`` of each kind, with counts),
    availability, faults and warnings."""
    out = console or Console(highlight=False)
    st = verdict.stats
    if verdict.valid:
        out.print(f"[bold green]VALID[/bold green]: {fmt(st['ops'])} ops, {fmt(st['ok_blocks'])} acknowledged "
                  f"blocks, {fmt(st['ok_pids'])} producer IDs, no anomalies")
    else:
        total = sum(verdict.anomaly_counts.values())
        out.print(f"[bold red]INVALID[/bold red]: {fmt(total)} anomalies in {fmt(st['ops'])} ops "
                  f"({', '.join(f'{k} x{n}' for k, n in verdict.anomaly_counts.items())})")
    nexts = sorted(set(st["final_next_producer_id"].values()))
    out.print(f"run: {st['duration_s']:.1f} s, {fmt(st['processes'])} processes, {fmt(st['committed_blocks'])} "
              f"committed blocks ({fmt(st['committed_unacknowledged_blocks'])} never acknowledged), final "
              f"next_producer_id {', '.join(fmt(n) for n in nexts)}")
    for w in verdict.warnings:
        out.print(f"[yellow]warning:[/yellow] {w}")

    if not verdict.valid:
        print_table(out, "anomalies", ("kind", "count", "meaning"),
                    [(kind, fmt(n), ANOMALIES.get(kind, "")) for kind, n in verdict.anomaly_counts.items()])
        for kind, examples in verdict.anomalies.items():
            n = verdict.anomaly_counts.get(kind, len(examples))
            shown = examples[:limit]
            print_table(out, f"{kind}: first {len(shown)} of {fmt(n)}", ("ops", "what"),
                        [(", ".join(f"#{i}" for i in a["ops"]) or "-", a["message"]) for a in shown])

    # One column per operation, one row per figure: stays readable in 80 columns.
    av = verdict.availability
    t = Table(title="availability", title_justify="left")
    t.add_column("")
    for kind in av:
        t.add_column(kind, justify="right")
    rows: list[tuple[str, Any]] = [
        ("invoked", lambda a: fmt(a["invoked"])),
        ("ok", lambda a: fmt(a["ok"])),
        ("fail", lambda a: fmt(a["fail"])),
        ("info (unknown)", lambda a: fmt(a["info"])),
        ("unfinished", lambda a: fmt(a["unfinished"])),
        ("latency p50 ms (ok)", lambda a: fmt(a["latency"]["ok"]["p50_ms"], 2)),
        ("latency p99 ms (ok)", lambda a: fmt(a["latency"]["ok"]["p99_ms"], 2)),
        ("latency max ms (ok)", lambda a: fmt(a["latency"]["ok"]["max_ms"], 2)),
        ("longest outage ms", lambda a: fmt(a["longest_outage_ms"])),
        ("load in progress", lambda a: f"{fmt(a['load_in_progress'])} ({a['load_in_progress_share']:.2%})"),
        ("client-visible waits", lambda a: fmt(a["client_visible_waits"])),
    ]
    for label, cell in rows:
        t.add_row(label, *[cell(a) for a in av.values()])
    out.print(t)

    by_kind = verdict.faults.get("by_kind", {})
    if by_kind:
        t = Table(title="faults", title_justify="left")
        for c in ("fault", "count", "failed", "total ms"):
            t.add_column(c, justify="left" if c == "fault" else "right")
        for f, k in by_kind.items():
            t.add_row(f, fmt(k["count"]), fmt(k["failed"]), fmt(k["total_ms"]))
        out.print(t)
    else:
        out.print("faults: none")


def timeline_png(ops: list[Op], path: str | os.PathLike, bucket_s: float = 1.0) -> str:
    """Write a PNG timeline of the run and return its path.

    Top: ok allocations/s and ok PIDs/s (two y axes).  Bottom: p50/p99 latency of ok
    allocate and generate ops per bucket (by completion time, log scale).  Fault
    intervals (nemesis ops that did not fail) are shaded on both, one colour per kind.
    """
    import numpy as np  # heavy (numpy, with matplotlib): imported when used
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy (matplotlib): imported when used
    from matplotlib.figure import Figure  # heavy (matplotlib): imported when used
    from matplotlib.patches import Patch  # heavy (matplotlib): imported when used

    if bucket_s <= 0:
        raise ValueError("bucket_s must be > 0")
    path = os.fspath(path)
    pairs = pair_ops(ops)
    end_ns = history_end_ns(ops)
    start_ns = min((op.time_ns for op in ops), default=0)
    # At most MAX_BUCKETS buckets: a long run with a small bucket gets wider ones (the title says which).
    bucket_s = max(bucket_s, (end_ns - start_ns) / 1e9 / MAX_BUCKETS)
    bucket_ns = bucket_s * 1e9
    # Buckets from the first op's (the clock may have started before the run's first op).
    b0 = int(start_ns // bucket_ns)
    nb = max(1, int(end_ns // bucket_ns) + 1 - b0)
    xs = (np.arange(nb) + b0 + 0.5) * bucket_s

    done: dict[str, list[int]] = {ALLOCATE: [], GENERATE: []}
    lats: dict[str, list[int]] = {ALLOCATE: [], GENERATE: []}
    for inv, comp in pairs:
        if comp is not None and comp.type == OK and inv.f in done and not inv.is_nemesis:
            done[inv.f].append(comp.time_ns)
            lats[inv.f].append(comp.time_ns - inv.time_ns)

    fig = Figure(figsize=(12, 7), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)

    rates = {}
    for kind in (ALLOCATE, GENERATE):
        b = (np.asarray(done[kind], dtype=np.float64) // bucket_ns).astype(np.int64) - b0
        rates[kind] = np.bincount(b, minlength=nb)[:nb] / bucket_s
    top.plot(xs, rates[GENERATE], color="tab:blue", label="PIDs/s")
    top.set_ylabel("PIDs/s")
    top2 = top.twinx()
    top2.plot(xs, rates[ALLOCATE], color="tab:orange", drawstyle="steps-mid", label="allocations/s")
    top2.set_ylabel("allocations/s")
    top.set_title(f"throughput (ok ops per {bucket_s:g} s bucket, per second)")

    colors = {ALLOCATE: "tab:orange", GENERATE: "tab:blue"}
    plotted = False
    for kind in (ALLOCATE, GENERATE):
        if not done[kind]:
            continue
        b = (np.asarray(done[kind], dtype=np.float64) // bucket_ns).astype(np.int64)
        lat = np.asarray(lats[kind], dtype=np.int64)
        order = np.argsort(b, kind="stable")
        b, lat = b[order], lat[order]
        cut = np.flatnonzero(np.diff(b)) + 1
        # One point per bucket, NaN where nothing completed: lines break over gaps instead of bridging them.
        p50 = np.full(nb, np.nan)
        p99 = np.full(nb, np.nan)
        for bi, chunk in zip(b[np.r_[0, cut]] - b0, np.split(lat, cut)):
            s = sorted(chunk.tolist())
            p50[bi] = max(percentile(s, 50) / 1e6, 1e-3)  # ms; floor at 1 us for the log scale
            p99[bi] = max(percentile(s, 99) / 1e6, 1e-3)
        bottom.plot(xs, p50, color=colors[kind], marker=".", markersize=4, label=f"{kind} p50")
        bottom.plot(xs, p99, color=colors[kind], marker=".", markersize=4, linestyle="--", label=f"{kind} p99")
        plotted = True
    if plotted:
        bottom.set_yscale("log")
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("time on the run's clock (s)")
    bottom.set_title("latency of ok ops, invoke to completion (p50 solid, p99 dashed)")

    cmap = ["tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray", "tab:green"]
    kinds: dict[str, str] = {}
    for fi in fault_intervals(pairs, end_ns):
        if fi["outcome"] == "fail":
            continue  # the fault was not applied
        color = kinds.setdefault(fi["f"], cmap[len(kinds) % len(cmap)])
        for ax in (top, bottom):
            ax.axvspan(fi["start_ms"] / 1e3, max(fi["end_ms"], fi["start_ms"] + 1e-3) / 1e3,
                       color=color, alpha=0.2, linewidth=0)

    # Legends outside the plots, on the right, so they never hide data.
    handles = [Patch(color=c, alpha=0.3, label=f) for f, c in kinds.items()]
    h1, l1 = top.get_legend_handles_labels()
    h2, l2 = top2.get_legend_handles_labels()
    top.legend(h1 + h2 + handles, l1 + l2 + list(kinds), loc="upper left", bbox_to_anchor=(1.07, 1.0),
               fontsize="small", title="ok ops / faults", title_fontsize="small")
    hb, lb = bottom.get_legend_handles_labels()
    if hb:
        bottom.legend(hb, lb, loc="upper left", bbox_to_anchor=(1.07, 1.0), fontsize="small")
    top.set_xlim(b0 * bucket_s, max((b0 + nb) * bucket_s, end_ns / 1e9))
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
