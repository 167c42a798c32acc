"""The printing every benchmark shares: plain-text tables, numbers or "-", latency summaries and their
cells, error counts, and the closing lines (phase errors, failed checks, total time, where the JSON went)."""
from __future__ import annotations

import json
from typing import Callable

from records.wire.errors import Errors

from .common import percentile
from .harness import exit_status, write_json


def table(title: str, headers: list[str], rows: list[list]) -> str:
    """Right-aligned columns under a title; None prints as "-"."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max(len(h), *(len(row[i]) for row in cells)) if cells else len(h) for i, h in enumerate(headers)]
    out = [title, "  ".join(h.rjust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


def fmt_num(v, fmt=".2f", unit=""):
    """``v`` formatted with ``fmt`` plus ``unit``, or "-" for None."""
    return "-" if v is None else f"{v:{fmt}}{unit}"


def summarize_ms(values, scale: float = 1000.0, with_min: bool = True, with_mean: bool = True) -> dict:
    """n, min (if ``with_min``), p50, p99, max, mean (if ``with_mean``), in ms, of values given in
    seconds (``scale`` 1 if already ms); None for each figure of no values."""
    s = sorted(v * scale for v in values)
    out = {"n": len(s), "min_ms": s[0] if s else None, "p50_ms": percentile(s, 50), "p99_ms": percentile(s, 99),
           "max_ms": s[-1] if s else None, "mean_ms": sum(s) / len(s) if s else None}
    if not with_min:
        del out["min_ms"]
    if not with_mean:
        del out["mean_ms"]
    return out


def lat_cells(s: dict, fmt: str = ".2f") -> list:
    """n, p50, p99, max of a ``summarize_ms`` summary, as table cells."""
    return [s["n"], fmt_num(s["p50_ms"], fmt), fmt_num(s["p99_ms"], fmt), fmt_num(s["max_ms"], fmt)]


def counts(d: dict) -> str:
    """``{name: count}`` as "name count, ..." sorted by name, or "0"."""
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "0"


def print_footer(res: dict) -> None:
    """Phase errors, failed checks (or "all checks passed"), total time and where the JSON went."""
    if res["errors"]:
        print("PHASE ERRORS:")
        for e in res["errors"]:
            print(f"  {e['phase']}: {e['error']}")
    if res["failed_checks"]:
        print("FAILED CHECKS:")
        for c in res["failed_checks"]:
            print(f"  {c}")
    if not res["errors"] and not res["failed_checks"]:
        print("all checks passed")
    print(f"total {res['total_s']:.0f} s; JSON: {res['params']['json']}")


def write_report(res: dict, json_path: str, text: str) -> None:
    """Write ``res`` as JSON to ``json_path``, print ``text`` and where the JSON went."""
    write_json(res, json_path)
    print(text)
    print(f"JSON: {json_path}")


def report(res: dict, output: str, print_results: Callable[[dict], None]) -> int:
    """Print ``res`` as JSON (``output == "json"``) or through ``print_results``; the exit status."""
    if output == "json":
        print(json.dumps(res, indent=2, default=str))
    else:
        print_results(res)
    return exit_status(res)


def leader_kills_title(k: dict) -> str:
    """How a leader-kill phase ``k`` killed: "N leader SIGKILLs in D s (every E s[ + stagger], restart after R s)"."""
    return (f"{k['kills']} leader SIGKILLs in {k['duration_s']:.0f} s (every {k['kill_every_s']:g} s"
            f"{' + 0..1 s stagger' if k['kill_stagger'] else ''}, restart after {k['restart_after_s']:g} s)")


def print_new_leaders(rounds: list[dict]) -> None:
    """When another node was seen as leader after each kill of a leader-kill phase (none: nothing)."""
    if rounds:
        print("  new leader seen after kill (DescribeState polling): "
              + ", ".join(f"{r['new_leader_seen_after_s'] * 1000:.0f}" for r in rounds) + " ms")


def code_name(code: int) -> str:
    """A Kafka error code's name (ERROR_CODE_<n> if unknown), as the counts of error answers show it."""
    try:
        return Errors(code).name
    except ValueError:
        return f"ERROR_CODE_{code}"
