"""Benchmark of the observability paths (quorum/metrics.py, quorum/stats.py, quorum/telemetry/logs.py):
the cost of a histogram observation and of a log line, /metrics scrapes of a local three-node cluster,
and what a scraper hitting the leader costs AllocateProducerIds (docs/benchmarks.md).

    pidctl bench metrics [--quick] [--json bench-results/metrics.json] [--scrapes 300] [--blocks 500]
"""
from __future__ import annotations

import asyncio
import io
import logging
import sys
import threading
import time
import urllib.request

from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.stats import Histogram
from quorum.telemetry import logs

from .common import find_leader, percentile, temp_cluster
from .harness import environment_info, exit_status, log, new_results, parser, run_phases
from .report import fmt_num, print_footer, table


def in_process(args) -> dict:
    n = args.calls
    h = Histogram()
    t = time.perf_counter_ns()
    for i in range(n):
        h.observe(0.001)
    observe_ns = (time.perf_counter_ns() - t) / n
    out = {"calls": n, "histogram_observe_ns": observe_ns}
    logs.set_identity(node_id=1)
    logs.set_context_source("term", lambda: 7)
    for fmt in ("json", "human"):
        buf = io.StringIO()
        handler = logging.StreamHandler(buf)
        handler.addFilter(logs.ContextFilter())
        handler.setFormatter(logs.JsonFormatter() if fmt == "json" else logs.HumanFormatter())
        record = logging.LogRecord("quorum.server", logging.INFO, __file__, 1, "client %s: %s v%d -> %s",
                                   ("127.0.0.1:5555", "AllocateProducerIds", 0, "STALE_BROKER_EPOCH"), None)
        token = logs.request_context("broker-1", 42)
        t = time.perf_counter_ns()
        for _ in range(n // 4):
            handler.handle(record)
        out[f"log_line_{fmt}_ns"] = (time.perf_counter_ns() - t) / (n // 4)
        logs.end_request_context(token)
    return out


def _scrape(address: str) -> tuple[float, int]:
    t = time.perf_counter()
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        size = len(resp.read())
    return time.perf_counter() - t, size


async def _allocate_run(lc, blocks: int) -> dict:
    client = QuorumClient(lc.client_addresses(), RetryPolicy(timeout=10.0, attempt_timeout=2.0))
    try:
        epoch = await client.register_broker(1)
        lat = []
        t0 = time.perf_counter()
        for _ in range(blocks):
            t = time.perf_counter()
            await client.allocate(1, epoch)
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - t0
    finally:
        await client.close()
    lat.sort()
    return {"blocks": blocks, "blocks_per_s": blocks / elapsed, "p50_ms": percentile(lat, 50) * 1000,
            "p99_ms": percentile(lat, 99) * 1000}


def cluster_phase(args) -> dict:
    with temp_cluster("bench-metrics-", keep=False, metrics=True, allocate_rate_per_broker=0) as (lc, _):
        leader = asyncio.run(find_leader(lc))[0]
        out = {"nodes": {}}
        for n in lc.nodes():
            times, size = [], 0
            for _ in range(args.scrapes):
                dt, size = _scrape(n.metrics_address)
                times.append(dt)
            times.sort()
            out["nodes"][n.node_id] = {"scrapes": len(times), "bytes": size,
                                       "p50_ms": percentile(times, 50) * 1000,
                                       "p99_ms": percentile(times, 99) * 1000, "max_ms": times[-1] * 1000}
        log("allocations without a scraper")
        out["allocate_quiet"] = asyncio.run(_allocate_run(lc, args.blocks))
        stop = threading.Event()
        scraped = [0]
        address = next(n.metrics_address for n in lc.nodes() if n.node_id == leader)

        def scraper():
            while not stop.is_set():
                _scrape(address)
                scraped[0] += 1
        th = threading.Thread(target=scraper, daemon=True)
        th.start()
        log("allocations while the leader is scraped back to back")
        try:
            out["allocate_scraped"] = asyncio.run(_allocate_run(lc, args.blocks))
        finally:
            stop.set()
            th.join(10)
        out["allocate_scraped"]["scrapes_meanwhile"] = scraped[0]
        return out


def main(argv=None, prog: str | None = None) -> int:
    ap = parser(prog, __doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="bench-results/metrics.json")
    ap.add_argument("--scrapes", type=int, default=None)
    ap.add_argument("--blocks", type=int, default=None)
    args = ap.parse_args(argv)
    args.calls = 50_000 if args.quick else 200_000
    args.scrapes = args.scrapes or (100 if args.quick else 300)
    args.blocks = args.blocks or (200 if args.quick else 500)
    res = new_results(vars(args), environment_info(quick=args.quick), benchmark="metrics")
    run_phases(res, [("in_process", in_process), ("cluster", cluster_phase)], args, args.json)
    p = res["phases"]
    if "in_process" in p:
        ip = p["in_process"]
        print(table("in process (ns per call)", ["Histogram.observe", "log line JSON", "log line human"],
                    [[fmt_num(ip["histogram_observe_ns"], ".0f"), fmt_num(ip["log_line_json_ns"], ".0f"),
                      fmt_num(ip["log_line_human_ns"], ".0f")]]))
    if "cluster" in p:
        c = p["cluster"]
        print(table("scrapes of /metrics", ["node", "scrapes", "bytes", "p50 ms", "p99 ms", "max ms"],
                    [[i, v["scrapes"], v["bytes"], fmt_num(v["p50_ms"]), fmt_num(v["p99_ms"]), fmt_num(v["max_ms"])]
                     for i, v in sorted(c["nodes"].items())]))
        print(table("AllocateProducerIds, sequential", ["run", "blocks", "blocks/s", "p50 ms", "p99 ms", "scrapes"],
                    [[name, c[k]["blocks"], fmt_num(c[k]["blocks_per_s"], ".0f"), fmt_num(c[k]["p50_ms"]),
                      fmt_num(c[k]["p99_ms"]), c[k].get("scrapes_meanwhile")]
                     for name, k in (("quiet", "allocate_quiet"), ("leader scraped", "allocate_scraped"))]))
    print_footer(res)
    return exit_status(res)


if __name__ == "__main__":
    sys.exit(main())
