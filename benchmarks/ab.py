"""Two versions of the node, side by side: workload 1 (or 2 with ``--clients 3``) against a cluster of
BASE's nodes and one of CHANGE's (source trees), in pairs of fresh clusters, judged by the median of the
pairs' ratios (why pairs: docs/benchmarks.md).

    pidctl bench ab BASE CHANGE [--pairs 10] [--seconds 5] [--clients 1] [--warmup 300] [--quick]
                                [--json PATH] [--keep]
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import time

from quorum.client.quorum import QuorumClient, RetryPolicy

from .common import percentile, temp_cluster
from .harness import environment_info, log, parser, quick_defaults, utc_now
from .processes import cpu_seconds
from .report import table, write_report

WARMUP = 300  # allocations per client before a run is measured (connections, the leader found, caches)
FIGURES = ("rate", "p50_ms", "p99_ms", "cpu_ms")
HIGHER_IS_BETTER = {"rate"}


def source_tree(path: str) -> str:
    """``path`` as an absolute source tree of pidquorum, or ValueError."""
    tree = os.path.abspath(path)
    if not os.path.isfile(os.path.join(tree, "quorum", "__init__.py")):
        raise ValueError(f"{path}: not a pidquorum source tree (no quorum/__init__.py)")
    return tree


async def measure(addresses: list[str], pids: list[int], seconds: float, clients: int, broker_base: int = 100,
                  warmup: int = WARMUP) -> dict:
    """``clients`` brokers allocating back to back for ``seconds``: the run's figures."""
    policy = RetryPolicy(timeout=60.0, attempt_timeout=1.0)
    cs = [QuorumClient(addresses, policy, client_id=f"ab-{i}", prefer_leader=True) for i in range(clients)]
    latencies: list[float] = []
    try:
        epochs = [await c.register_broker(broker_base + i) for i, c in enumerate(cs)]
        for i, c in enumerate(cs):
            for _ in range(warmup):
                await c.allocate(broker_base + i, epochs[i])
        cpu0 = sum(cpu_seconds(p) or 0.0 for p in pids)
        t0 = time.monotonic()
        stop = t0 + seconds

        async def allocate(i: int, c: QuorumClient) -> None:
            while time.monotonic() < stop:
                t = time.perf_counter()
                await c.allocate(broker_base + i, epochs[i])
                latencies.append(time.perf_counter() - t)

        await asyncio.gather(*(allocate(i, c) for i, c in enumerate(cs)))
        elapsed = time.monotonic() - t0
        cpu = sum(cpu_seconds(p) or 0.0 for p in pids) - cpu0
    finally:
        for c in cs:
            await c.close()
    latencies.sort()
    n = len(latencies)
    return {"allocations": n, "rate": n / elapsed, "p50_ms": percentile(latencies, 50) * 1e3,
            "p99_ms": percentile(latencies, 99) * 1e3, "cpu_ms": cpu / n * 1e3}


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Per figure: each side's median, the median of the pairs' CHANGE/BASE ratios, and in how many pairs
    CHANGE was better (higher rate; lower latency and CPU)."""
    out = {}
    for k in FIGURES:
        ratios = [c[k] / b[k] for b, c in zip(runs["base"], runs["change"]) if b[k]]
        better = sum((r > 1) if k in HIGHER_IS_BETTER else (r < 1) for r in ratios)
        out[k] = {"base": statistics.median(r[k] for r in runs["base"]),
                  "change": statistics.median(r[k] for r in runs["change"]),
                  "paired_ratio": statistics.median(ratios) if ratios else None,
                  "change_better": better, "pairs": len(ratios)}
    return out


def run_pairs(trees: dict[str, str], pairs: int, seconds: float, clients: int, keep: bool,
              warmup: int = WARMUP) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {"base": [], "change": []}
    for i in range(pairs):
        order = ("base", "change") if i % 2 == 0 else ("change", "base")
        with contextlib.ExitStack() as stack:
            clusters = {}
            for side in order:
                clusters[side], _ = stack.enter_context(temp_cluster(
                    f"pq-ab-{side}-", keep, label=f"pair {i + 1} {side}", timeout=60,
                    env={"PYTHONPATH": trees[side]}, allocate_rate_per_broker=0))
            for side in order:
                lc = clusters[side]
                r = asyncio.run(measure(lc.client_addresses(), [n.pid for n in lc.nodes()], seconds, clients,
                                        warmup=warmup))
                runs[side].append(r)
                log(f"pair {i + 1}/{pairs} {side}: {r['rate']:,.0f}/s, p50 {r['p50_ms']:.3f} ms, "
                    f"p99 {r['p99_ms']:.3f} ms, node CPU {r['cpu_ms']:.3f} ms per allocation")
    return runs


def render(res: dict) -> str:
    s = res["summary"]
    rows = [[k, f"{s[k]['base']:,.3f}", f"{s[k]['change']:,.3f}",
             "-" if s[k]["paired_ratio"] is None else f"{s[k]['paired_ratio']:.3f}",
             f"{s[k]['change_better']}/{s[k]['pairs']}"] for k in FIGURES]
    p = res["params"]
    return table(f"A/B, {p['pairs']} pairs of fresh clusters, {p['clients']} client(s), {p['seconds']:g} s per run "
                 f"(rate: allocations/s; cpu_ms: node CPU per allocation, all three nodes)",
                 ["figure", "base median", "change median", "paired change/base", "change better"], rows)


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks.ab") -> int:
    ap = parser(prog, __doc__, raw=False)
    ap.add_argument("base", help="source tree of the version to compare against")
    ap.add_argument("change", help="source tree of the changed version")
    ap.add_argument("--pairs", type=int, default=None, help="pairs of runs (default 10; 3 with --quick)")
    ap.add_argument("--seconds", type=float, default=None, help="measured seconds per run (default 5; 2 with --quick)")
    ap.add_argument("--quick", action="store_true", help="3 pairs of 2 s runs (explicit options still win)")
    ap.add_argument("--clients", type=int, default=1, help="brokers allocating at once (1: workload 1)")
    ap.add_argument("--json", default=os.path.join("bench-results", "ab.json"))
    ap.add_argument("--warmup", type=int, default=WARMUP, help="allocations per client before each measured run")
    ap.add_argument("--keep", action="store_true", help="keep the clusters' directories")
    a = ap.parse_args(argv)
    quick_defaults(a, {"pairs": (10, 3), "seconds": (5.0, 2.0)})
    if a.pairs < 1 or a.seconds <= 0 or a.clients < 1 or a.warmup < 0:
        ap.error("--pairs and --clients must be at least 1, --seconds positive, --warmup not negative")
    try:
        trees = {"base": source_tree(a.base), "change": source_tree(a.change)}
    except ValueError as e:
        ap.error(str(e))
    res = {"params": {"base": trees["base"], "change": trees["change"], "pairs": a.pairs, "seconds": a.seconds,
                      "clients": a.clients, "warmup": a.warmup},
           "environment": environment_info(), "started_at": utc_now()}
    res["runs"] = run_pairs(trees, a.pairs, a.seconds, a.clients, a.keep, a.warmup)
    res["summary"] = summarize(res["runs"])
    res["finished_at"] = utc_now()
    write_report(res, a.json, render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
