"""The terminal summary of a transactions verdict (``chaos.txn_checker.TxnVerdict``): every anomaly
class with its count (0 included), the first examples of each class found, the transactions by client
library and outcome, the idempotent producers, the reads and samples, and the faults."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .figures import fmt, print_table
from .txn_checker import ANOMALIES, TxnVerdict

SHOW = 5  # examples listed per class


def render_txn_summary(verdict: TxnVerdict, console: Console | None = None, *, limit: int = SHOW) -> None:
    out = console or Console(highlight=False)
    st = verdict.stats
    total = sum(verdict.anomaly_counts.values())
    head = (f"{fmt(st['transactions'])} transactions, {fmt(st['idempotent']['values'])} idempotent values, "
            f"{fmt(st['read_committed_records'])} records read back")
    if verdict.valid:
        out.print(f"[bold green]VALID[/bold green]: {head}, no anomalies")
    else:
        out.print(f"[bold red]INVALID[/bold red]: {fmt(total)} anomalies; {head}")
    for w in verdict.warnings:
        out.print(f"[yellow]warning:[/yellow] {escape(w)}")

    counts = {kind: verdict.anomaly_counts.get(kind, 0) for kind in ANOMALIES}
    print_table(out, "anomalies", ("class", "count", "meaning"),
                [(kind, f"[bold red]{fmt(n)}[/bold red]" if n else "0", ANOMALIES[kind]) for kind, n in counts.items()])
    for kind, examples in verdict.anomalies.items():
        n = verdict.anomaly_counts.get(kind, len(examples))
        shown = examples[:limit]
        print_table(out, f"{kind}: first {len(shown)} of {fmt(n)}", ("what",), [(escape(a["message"]),) for a in shown])

    t = Table(title="transactions (client outcome)", title_justify="left")
    outcomes = ("committed", "aborted", "abandoned", "unknown")
    for c in ("library", *outcomes, "commit p50 ms", "commit p99 ms", "commit max ms"):
        t.add_column(c, justify="left" if c == "library" else "right")
    for lib, counts in st["transactions_by_lib"].items():
        lat = st["commit_latency"].get(lib, {})
        t.add_row(lib, *(fmt(counts.get(o, 0)) for o in outcomes), fmt(lat.get("p50_ms")),
                  fmt(lat.get("p99_ms")), fmt(lat.get("max_ms")))
    out.print(t)
    unknown = st.get("unknown_resolved") or {}
    if unknown:
        out.print("unknown outcomes, as read back: " + ", ".join(f"{k} {v}" for k, v in sorted(unknown.items())))
    idem = st["idempotent"]
    out.print(f"idempotent: {fmt(idem['batches'])} batches, {fmt(idem['values'])} values, "
              f"{fmt(idem['acknowledged'])} acknowledged"
              + "".join(f"; {lib} {fmt(c.get('acknowledged', 0))}/{fmt(c.get('values', 0))}"
                        for lib, c in idem["by_lib"].items()))
    out.print(f"read back: {fmt(st['read_committed_records'])} read_committed, "
              f"{fmt(st['read_uncommitted_records'])} read_uncommitted records; log: {fmt(st['log_batches'])} "
              f"batches, markers {st['markers']}, {fmt(st['open_spans'])} open transactions")
    out.print(f"during the run: {fmt(st['polls'])} read_committed polls ({fmt(st['poll_records'])} records), "
              f"{fmt(st['lso_samples'])} LSO samples ({fmt(st['lso_samples_failed'])} unanswered), "
              f"{fmt(st['fences'])} fences")
    by_kind = verdict.faults.get("by_kind", {})
    if by_kind:
        t = Table(title="faults", title_justify="left")
        for c in ("fault", "count", "skipped or failed"):
            t.add_column(c, justify="left" if c == "fault" else "right")
        for f, k in by_kind.items():
            t.add_row(f, fmt(k.get("count", 0)), fmt(k.get("skipped_or_failed", 0)))
        out.print(t)
    else:
        out.print("faults: none")
