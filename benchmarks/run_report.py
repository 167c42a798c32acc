"""The output of ``pidctl bench`` (``benchmarks.run``): the table of every system's figures with each
peer's ratio to pidquorum's, the targets and warnings under it, and the bar charts of ``bench.png``."""
from __future__ import annotations

import math

from .report import table
from .systems import SYSTEMS


def _fmt(v, spec):
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, spec)


ROWS = [  # (workload label, metric label, path, format, higher is better)
    ("1 one broker, sequential", "blocks/s", ("w1", "blocks_per_s"), ",.0f", True),
    ("", "p50 ms", ("w1", "latency", "p50_ms"), ".2f", False),
    ("", "p99 ms", ("w1", "latency", "p99_ms"), ".2f", False),
    ("", "node CPU ms/block", ("w1", "node_cpu_ms_per_block"), ".2f", False),
    ("", "elections (no faults)", ("w1", "terms_started"), "d", False),
    ("2 three brokers, concurrent", "blocks/s", ("w2", "blocks_per_s"), ",.0f", True),
    ("", "p50 ms", ("w2", "latency", "p50_ms"), ".2f", False),
    ("", "p99 ms", ("w2", "latency", "p99_ms"), ".2f", False),
    ("", "node CPU ms/block", ("w2", "node_cpu_ms_per_block"), ".2f", False),
    ("", "elections (no faults)", ("w2", "terms_started"), "d", False),
    ("", "CAS retries/block", ("w2", "cas_retries_per_block"), ".2f", False),
    ("3 leader kill -9 under load", "outage median ms", ("w3", "outage_median_ms"), ",.0f", False),
    ("", "outage max ms", ("w3", "outage_max_ms"), ",.0f", False),
    ("", "kills", ("w3", "kills"), "d", None),
    ("", "blocks/s under kills", ("w3", "blocks_per_s"), ",.0f", True),
]


def _get(d, path):
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def render_table(res: dict) -> str:
    names = [n for n in SYSTEMS if n in res["systems"]]
    peers = [n for n in names if n != "pidquorum"]
    headers = ["workload", "metric", *names, *(f"{p}/pq" for p in peers)]
    rows = []
    for wl, metric, path, spec, _ in ROWS:
        vals = [_get(res["systems"][n], path) for n in names]
        if all(v is None for v in vals):
            continue
        pqv = _get(res["systems"].get("pidquorum", {}), path)
        ratios = []
        for p in peers:
            v = _get(res["systems"][p], path)
            ok = isinstance(v, (int, float)) and isinstance(pqv, (int, float)) and pqv and not math.isinf(pqv)
            ratios.append(f"{v / pqv:.2f}x" if ok and not math.isinf(v) else "-")
        rows.append([wl, metric, *(_fmt(v, spec) for v in vals), *ratios])
    out = [table(f"pidctl bench: three-node clusters on 127.0.0.1, durability on "
                 f"({res['params']['duration']:.0f}s per throughput scenario; blocks of 1,000 IDs)", headers, rows)]
    pq = res["systems"].get("pidquorum", {})
    differing = (pq.get("settings") or {}).get("differing_from_defaults")
    if differing is not None:
        out.append("pidquorum options that differ from a node's defaults: "
                   + (", ".join(f"{k} = {v}" for k, v in sorted(differing.items())) or "none")
                   + (" (no per-broker rate limit: the bench asks as fast as it can)"
                      if "allocate_rate_per_broker" in differing else ""))
    w4, mgr = pq.get("w4"), _get(pq, ("w3", "manager"))
    if w4 or mgr:
        lines = []
        if w4:
            lines.append(["4 generate_producer_id()", f"{w4['rate_ids_per_s']:,.0f} IDs/s steady", _fmt(w4["p50_us"], ".2f"),
                          _fmt(w4["p99_us"], ".2f"), _fmt(w4["p99_9_us"], ".2f"), w4["client_visible_waits"],
                          _fmt(w4["longest_without_id_ms"], ".1f")])
        if mgr:
            lines.append(["4 during workload 3", f"{mgr['rate_ids_per_s']:,.0f} IDs/s, leader kills",
                          _fmt(mgr["p50_us"], ".2f"), _fmt(mgr["p99_us"], ".2f"), _fmt(mgr["p99_9_us"], ".2f"),
                          mgr["client_visible_waits"], _fmt(mgr["longest_without_id_ms"], ".1f")])
        out.append("")
        out.append(table("pidquorum at the broker (ProducerIdManager on the real quorum)",
                         ["workload", "demand", "p50 us", "p99 us", "p99.9 us", "waits", "longest w/o ID ms"], lines))
    w5 = pq.get("w5")
    if w5 and w5.get("rows"):
        lines = []
        for r in w5["rows"]:
            lines.append([f"{r['history_target']:,}", f"{r['reached']:,}" + ("" if r["complete"] else " (INCOMPLETE)"),
                          _fmt(r["fill_rate_per_s"], ",.0f"), _fmt(r["up_s"], ".2f"),
                          _fmt(r["restart_to_first_allocation_s"], ".2f"), _fmt(r["snapshot_bytes_max"], ",d"),
                          _fmt(r["journal_bytes_max"], ",d")])
        out.append("")
        out.append(table("5 pidquorum restart vs history (whole cluster stopped and started)",
                         ["history", "reached", "fill/s", "up s", "restart->1st alloc s", "snapshot B",
                          "journal B"], lines))
    fl, w1 = res.get("floor"), pq.get("w1") or {}
    if fl and fl.get("commits"):
        line = (f"floor of a replicated fsync'd commit here (benchmarks.floor, same run): "
                f"{fl['commits_per_s']:,.0f} commits/s, p50 {fl['p50_ms']:.2f} ms, p99 {fl['p99_ms']:.2f} ms")
        if w1.get("blocks_per_s") and w1.get("latency", {}).get("p50_ms"):
            line += (f"; workload 1 reaches {w1['blocks_per_s'] / fl['commits_per_s']:.0%} of its rate, "
                     f"p50 {w1['latency']['p50_ms'] - fl['p50_ms']:+.2f} ms above it")
        out.append("")
        out.append(line)
    if res.get("targets"):
        out.append("")
        out.append("Targets:")
        for t in res["targets"]:
            out.append(f"  [{'HOLDS' if t['holds'] else 'MISSED'}] {t['target']}: {t['detail']}")
    for name, why in res.get("skipped", {}).items():
        out.append(f"skipped {name}: {why}")
    for w in res.get("busy_warnings", []):
        out.append(w)
    for e in res.get("errors", []):
        out.append(f"ERROR in {e['system'] or ''} {e['workload']}: {e['error']}")
    checks = [(n, k) for n in names for k in ("w1", "w2", "w3")
              if _get(res["systems"][n], (k, "disjoint_check", "disjoint")) is False]
    for n, k in checks:
        out.append(f"OVERLAPPING BLOCKS: {n} {k}")
    for n in names:
        if _get(res["systems"][n], ("w3", "outage_unbounded")):
            out.append(f"{n}: after a leader kill some broker got no block until the end of workload 3 "
                       f"(outage shown as '-' when it decides the figure)")
    out.append(f"JSON: {res.get('json_path')}  chart: {res.get('png_path')}")
    return "\n".join(out)


_COLORS = {"pidquorum": "#2a7ab0", "zookeeper": "#d98b2b", "etcd": "#4a9c5d"}


def chart_figure(res: dict):
    """The bar charts of ``bench.png`` as a matplotlib Figure: one panel per figure some system has (a
    workload that did not run, for any system, has no panel); no figure at all: one panel saying so."""
    from matplotlib.figure import Figure  # heavy (matplotlib): imported when used

    names = [n for n in SYSTEMS if n in res["systems"]]
    panels = []  # (title, [(bar offset, alpha, values or None per system)])
    for title, path_ in (("1 broker: blocks/s", ("w1", "blocks_per_s")),
                         ("3 brokers: blocks/s", ("w2", "blocks_per_s"))):
        panels.append((title, [(0.0, 1.0, [_get(res["systems"][n], path_) for n in names])]))
    p99 = [(key, [_get(res["systems"][n], (key, "latency", "p99_ms")) for n in names]) for key in ("w1", "w2")]
    p99 = [(key, vals) for key, vals in p99 if any(v is not None for v in vals)]
    which = {"w1": "1 broker", "w2": "3 brokers"}
    width = 0.38 if len(p99) == 2 else 0.8
    panels.append((f"p99 latency ms ({' | '.join(which[k] for k, _ in p99)})",
                   [((j - 0.5) * width if len(p99) == 2 else 0.0, 1.0 if j == 0 else 0.55, vals)
                    for j, (_, vals) in enumerate(p99)]))
    outage = []
    for n in names:
        v = _get(res["systems"][n], ("w3", "outage_median_ms"))
        outage.append(math.inf if v is None and _get(res["systems"][n], ("w3", "outage_unbounded")) else v)
    panels.append(("leader kill: outage ms (median)", [(0.0, 1.0, outage)]))
    panels = [(t, bars) for t, bars in panels if any(v is not None for _, _, vals in bars for v in vals)]

    fig = Figure(figsize=(max(8, 4 * len(panels)), 4))
    fig.suptitle(f"pidctl bench, {res['started_at']} (load avg at start {res['environment']['loadavg_start'][0]})",
                 fontsize=10)
    if not panels:
        ax = fig.subplots()
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no data: no workload ran on any system", ha="center", va="center",
                transform=ax.transAxes)
        return fig
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, bars) in zip(axes, panels):
        width = 0.8 if len(bars) == 1 else 0.38
        for offset, alpha, raw in bars:
            vals = [0 if v is None or math.isinf(v) else v for v in raw]
            ax.bar([i + offset for i in range(len(names))], vals, width, color=[_COLORS[n] for n in names],
                   alpha=alpha)
            if len(bars) == 1:
                for i, (v, r) in enumerate(zip(vals, raw)):
                    label = ("not run" if r is None else "no block after kill" if math.isinf(r)
                             else f"{v:,.0f}" if v >= 100 else f"{v:.3g}")
                    ax.text(i, v, label, ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(names)), names)
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_chart(res: dict, path: str) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # heavy (matplotlib): imported when used

    fig = chart_figure(res)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=90)
    return path
