"""Benchmark of the KIP-936 producer-ID quota (broker/quota.py), in process, on a simulated clock.

Run it::

    pidctl bench quota [--rate 10] [--window-num 11] [--window-size-s 3600] [--fpp 0.001]
                       [--json bench-results/quota.json] [--quick]

(``python -m benchmarks.quota`` takes the same options.)

Phases (one principal, ``User:bench``, with ``producer_ids_rate = --rate``):

1. ``steady``: a rogue offers new PIDs at twice the rate for two full spans
   (``window_num * window_size_s`` each) of simulated time, so the bucket is
   always spent and the filter is as full as the quota lets it be.  Reports the
   filter's bytes (rbloom bit arrays) and layers at the end and at the peak,
   bytes per remembered PID, and the bound ``max_layers * layer bytes``.
2. ``false_positives``: on that full filter, 1,000,000 PIDs never offered are
   looked up: the fraction that look seen is the measured false-positive rate
   (such a PID would pass for free).  Also the rate seen through ``check()``
   in phase 3 (distinct PIDs reported as seen).
3. ``million``: 1,000,000 distinct PIDs from one principal, offered at 100 x
   the rate: filter bytes and layers at the end and peak, process RSS before
   and after, and, for scale, the RSS a Python ``set`` of the same PIDs takes.
4. ``check_cost``: nanoseconds per ``check()`` (median of 5 runs of
   ``--calls`` calls): a PID already seen, a new PID admitted, a new PID
   refused (bucket empty), a principal without a quota.
5. ``sizing``: bytes per principal for several rates with these window
   settings, from real layers (steady state: window_num + 1 layers; bound:
   3 * window_num + 2).
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
import tracemalloc

from broker.quota import LayeredBloomFilter, ProducerIdQuotaManager, QuotaWindow

from .common import environment_info, fmt_num, print_footer, run_phases, table, utc_now

PRINCIPAL = "User:bench"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make(a, rate: float | None = None) -> ProducerIdQuotaManager:
    m = ProducerIdQuotaManager(QuotaWindow(num=a.window_num, size_s=a.window_size_s, false_positive_rate=a.fpp))
    m.configure([{"user": "bench", "values": {"producer_ids_rate": rate or a.rate}}])
    return m


def offer(m: ProducerIdQuotaManager, first_pid: int, count: int, offer_rate: float, t0: float = 0.0) -> dict:
    """Offer ``count`` new PIDs at ``offer_rate``/s of simulated time; peak filter size on the way."""
    step = 1.0 / offer_rate
    peak_bytes = peak_layers = 0
    admitted = 0
    sample_every = max(1, count // 2000)
    now = t0
    for i in range(count):
        now = t0 + i * step
        if m.check(PRINCIPAL, first_pid + i, now) == 0:
            admitted += 1
        if i % sample_every == 0:
            s = m._states[PRINCIPAL].filter  # noqa: SLF001 - the bench reads the filter it measures
            peak_bytes, peak_layers = max(peak_bytes, s.nbytes), max(peak_layers, len(s.layers))
    st = m.stats(now)[PRINCIPAL]
    return {"offered": count, "admitted": admitted, "end_s": now, "peak_filter_bytes": max(peak_bytes, st["filter_bytes"]),
            "peak_layers": max(peak_layers, st["filter_layers"]), "stats": st}


def layer_bytes(window: QuotaWindow, rate: float) -> int:
    f = LayeredBloomFilter(window, window.layer_items(rate))
    f.add(0, 0.0)
    return f.nbytes


def phase_steady(a) -> dict:
    m = make(a)
    w = m.window
    count = int(2 * w.span_s * a.rate * 2)  # two spans at twice the rate
    out = offer(m, 1_000_000_000, count, 2 * a.rate)
    st = out["stats"]
    lb = layer_bytes(w, a.rate)
    a._steady_manager = m  # for the false-positive phase
    a._steady_end = out["end_s"]
    return {**out, "layer_items": w.layer_items(a.rate), "layer_bytes": lb, "bound_bytes": w.max_layers * lb,
            "bytes_per_remembered_pid": st["filter_bytes"] / max(1, st["filter_items"]),
            "memory_per_principal_bytes": st["filter_bytes"]}


def phase_false_positives(a) -> dict:
    m = getattr(a, "_steady_manager", None)
    if m is None:
        m = make(a)
        offer(m, 1_000_000_000, int(2 * m.window.span_s * a.rate * 2), 2 * a.rate)
    filt = m._states[PRINCIPAL].filter  # noqa: SLF001
    n = a.fp_lookups
    base = 5_000_000_000  # never offered
    hits = sum(1 for pid in range(base, base + n) if filt.find(pid) is not None)
    return {"lookups": n, "false_positives": hits, "measured_false_positive_rate": hits / n,
            "configured_false_positive_rate": a.fpp, "layers": len(filt.layers), "items": filt.items,
            "per_layer_target": m.window.layer_false_positive_rate}


def phase_million(a) -> dict:
    gc.collect()
    rss0 = rss_bytes()
    m = make(a)
    out = offer(m, 10_000_000_000, a.million, 100 * a.rate)
    gc.collect()
    rss1 = rss_bytes()
    st = out["stats"]
    through_check_fp = st["seen_pids"] / a.million  # every PID was offered once: "seen" is a false positive
    del m
    gc.collect()
    rss2 = rss_bytes()
    pids = set(range(10_000_000_000, 10_000_000_000 + a.million))
    rss3 = rss_bytes()
    del pids
    return {**out, "filter_bytes_end": st["filter_bytes"], "filter_layers_end": st["filter_layers"],
            "rss_before": rss0, "rss_after": rss1, "rss_growth": rss1 - rss0,
            "python_set_of_same_pids_rss": rss3 - rss2, "false_positive_rate_through_check": through_check_fp,
            "bound_bytes": m_bound(a)}


def m_bound(a) -> int:
    w = QuotaWindow(num=a.window_num, size_s=a.window_size_s, false_positive_rate=a.fpp)
    return w.max_layers * layer_bytes(w, a.rate)


def timed(fn, calls: int) -> float:
    runs = []
    for _ in range(5):
        t = time.perf_counter_ns()
        fn(calls)
        runs.append((time.perf_counter_ns() - t) / calls)
    return statistics.median(runs)


def phase_check_cost(a) -> dict:
    calls = a.calls
    m = make(a, rate=1e6)
    for pid in range(1000):
        m.check(PRINCIPAL, pid, 0.0)
    seen = timed(lambda n: [m.check(PRINCIPAL, i % 1000, 1.0) for i in range(n)], calls)

    fresh = make(a, rate=1e6)
    counter = [0]

    def admitted(n):  # rate 1e6/s and the clock moving 1 us per call: a token every call
        c = counter[0]
        for i in range(n):
            fresh.check(PRINCIPAL, 10**11 + c + i, (c + i) * 1e-6)
        counter[0] = c + n
    admit = timed(admitted, calls)

    r = make(a, rate=1.0)
    for pid in range(int(r.window.burst(1.0)) + 1):
        r.check(PRINCIPAL, pid, 0.0)
    refused = timed(lambda n: [r.check(PRINCIPAL, 10**12 + i, 0.0) for i in range(n)], calls)
    free = timed(lambda n: [r.check("User:nobody", i, 0.0) for i in range(n)], calls)
    loop = timed(lambda n: [None for _ in range(n)], calls)
    return {"calls_per_run": calls, "seen_ns": seen, "new_admitted_ns": admit, "new_refused_ns": refused,
            "unlimited_principal_ns": free, "empty_loop_ns": loop}


def phase_overhead(a) -> dict:
    """Python-side bytes (tracemalloc: objects, dicts, deques; rbloom's bit arrays are allocated in Rust
    and not seen by it) per tracked principal with one layer, and per extra layer."""
    n = 2000
    m = ProducerIdQuotaManager(QuotaWindow(num=a.window_num, size_s=a.window_size_s, false_positive_rate=a.fpp))
    m.configure([{"user": None, "values": {"producer_ids_rate": a.rate}}])
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        m.check(f"User:u{i}", 1, 0.0)
    per_principal = (tracemalloc.get_traced_memory()[0] - base) / n
    f = LayeredBloomFilter(m.window, 16)
    base = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        f.add(i, i * m.window.size_s)  # a new layer each time (the oldest go past the cap)
    per_layer = (tracemalloc.get_traced_memory()[0] - base) / len(f.layers)
    tracemalloc.stop()
    return {"python_bytes_per_principal_one_layer": per_principal, "python_bytes_per_layer": per_layer,
            "principals": n}


def phase_sizing(a) -> dict:
    w = QuotaWindow(num=a.window_num, size_s=a.window_size_s, false_positive_rate=a.fpp)
    rows = {}
    for rate in (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0):
        lb, items = layer_bytes(w, rate), w.layer_items(rate)
        # Steady state: the admissions of one span (rate * span) fill layers of ``items``; past the
        # layer-size cap that takes more than window_num + 1 layers, and past max_layers the oldest
        # goes early: PIDs are then remembered for less than the span.
        layers = min(w.max_layers, max(w.num + 1, math.ceil(rate * w.span_s / items) + 1))
        remembered_s = min(w.span_s, (w.max_layers - 1) * items / rate)
        rows[str(rate)] = {"layer_items": items, "layer_bytes": lb, "steady_layers": layers,
                           "steady_bytes": layers * lb, "bound_bytes": w.max_layers * lb,
                           "remembered_pids_steady": int(rate * remembered_s), "remembered_for_s": remembered_s}
    return {"window_num": w.num, "window_size_s": w.size_s, "rates": rows}


def checks(res: dict) -> list[str]:
    out = []
    s = res["phases"].get("steady")
    if s and s["peak_filter_bytes"] > s["bound_bytes"]:
        out.append(f"steady: peak filter {s['peak_filter_bytes']} B above the bound {s['bound_bytes']} B")
    mi = res["phases"].get("million")
    for name in ("steady", "million"):
        ph = res["phases"].get(name)
        if ph and ph["stats"]["layers_dropped_early"]:
            out.append(f"{name}: {ph['stats']['layers_dropped_early']} layers dropped before their time")
    if mi and mi["peak_filter_bytes"] > mi["bound_bytes"]:
        out.append(f"million: peak filter {mi['peak_filter_bytes']} B above the bound {mi['bound_bytes']} B")
    fp = res["phases"].get("false_positives")
    if fp and fp["measured_false_positive_rate"] > 3 * fp["configured_false_positive_rate"]:
        out.append(f"false positives {fp['measured_false_positive_rate']:.5f} > 3 x configured {fp['configured_false_positive_rate']}")
    return out


def kib(v) -> str:
    return fmt_num(None if v is None else v / 1024, ".1f", " KiB")


def print_results(res: dict) -> None:
    p = res["params"]
    print(f"producer-ID quota: rate {p['rate']}/s, window {p['window_num']} x {p['window_size_s']} s, "
          f"target false-positive rate {p['fpp']}")
    s = res["phases"].get("steady")
    if s:
        st = s["stats"]
        print(table("steady state (rogue at 2x the rate for 2 spans, simulated)",
                    ["offered", "admitted", "layers", "remembered", "filter", "peak", "bound", "B/PID", "dropped early"],
                    [[s["offered"], s["admitted"], st["filter_layers"], st["filter_items"],
                      kib(s["memory_per_principal_bytes"]), kib(s["peak_filter_bytes"]), kib(s["bound_bytes"]),
                      f"{s['bytes_per_remembered_pid']:.2f}", st["layers_dropped_early"]]]))
    fp = res["phases"].get("false_positives")
    if fp:
        print(f"false positives: {fp['false_positives']} of {fp['lookups']} never-seen PIDs looked seen = "
              f"{fp['measured_false_positive_rate']:.6f} (target {fp['configured_false_positive_rate']}, "
              f"{fp['layers']} layers)")
    mi = res["phases"].get("million")
    if mi:
        print(table("1,000,000 distinct PIDs from one principal (100x the rate)",
                    ["offered", "admitted", "layers", "filter end", "peak", "bound", "RSS growth", "set() of them",
                     "FP via check", "dropped early"],
                    [[mi["offered"], mi["admitted"], mi["filter_layers_end"], kib(mi["filter_bytes_end"]),
                      kib(mi["peak_filter_bytes"]), kib(mi["bound_bytes"]), kib(mi["rss_growth"]),
                      kib(mi["python_set_of_same_pids_rss"]), f"{mi['false_positive_rate_through_check']:.6f}",
                      mi["stats"]["layers_dropped_early"]]]))
    c = res["phases"].get("check_cost")
    if c:
        print(table("check() cost (ns per call, median of 5 runs)", ["seen PID", "new, admitted", "new, refused",
                                                                      "no quota", "empty loop"],
                    [[f"{c['seen_ns']:.0f}", f"{c['new_admitted_ns']:.0f}", f"{c['new_refused_ns']:.0f}",
                      f"{c['unlimited_principal_ns']:.0f}", f"{c['empty_loop_ns']:.0f}"]]))
    o = res["phases"].get("overhead")
    if o:
        print(f"Python objects besides the bit arrays: {o['python_bytes_per_principal_one_layer']:.0f} B per "
              f"tracked principal (one layer), {o['python_bytes_per_layer']:.0f} B per further layer")
    z = res["phases"].get("sizing")
    if z:
        print(table(f"memory per principal by rate (window {z['window_num']} x {z['window_size_s']} s)",
                    ["rate/s", "PIDs/layer", "layer", "layers", "steady", "bound", "remembered", "for s"],
                    [[r, v["layer_items"], kib(v["layer_bytes"]), v["steady_layers"], kib(v["steady_bytes"]),
                      kib(v["bound_bytes"]), v["remembered_pids_steady"], f"{v['remembered_for_s']:.0f}"]
                     for r, v in z["rates"].items()]))
    print_footer(res)


def parse_args(argv=None, prog: str | None = None):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=10.0, help="producer_ids_rate of the principal (PIDs/s)")
    ap.add_argument("--window-num", type=int, default=11, help="producer.id.quota.window.num")
    ap.add_argument("--window-size-s", type=float, default=3600.0, help="producer.id.quota.window.size.seconds")
    ap.add_argument("--fpp", type=float, default=0.001, help="target false-positive rate of the whole filter")
    ap.add_argument("--million", type=int, default=1_000_000, help="distinct PIDs in phase 3")
    ap.add_argument("--fp-lookups", type=int, default=1_000_000, help="never-seen PIDs looked up in phase 2")
    ap.add_argument("--calls", type=int, default=200_000, help="check() calls per timing run")
    ap.add_argument("--quick", action="store_true", help="rate 1/s, window 11 x 60 s, 200,000 lookups")
    ap.add_argument("--json", default="bench-results/quota.json", help="where to write the results")
    ap.add_argument("--phases", default="steady,false_positives,million,check_cost,overhead,sizing")
    a = ap.parse_args(argv)
    if a.quick:
        a.rate, a.window_size_s, a.fp_lookups, a.calls = 1.0, 60.0, 200_000, 50_000
    a.phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    return a


def main(argv=None, prog: str | None = None) -> int:
    a = parse_args(argv, prog)
    res = {"params": {"rate": a.rate, "window_num": a.window_num, "window_size_s": a.window_size_s, "fpp": a.fpp,
                      "million": a.million, "fp_lookups": a.fp_lookups, "calls": a.calls, "quick": a.quick,
                      "json": a.json,
                      "argv": sys.argv, "clock": "simulated (check(now=...)); memory = rbloom bit arrays"},
           "environment": environment_info(), "started_at": utc_now(), "phases": {}, "errors": [],
           "failed_checks": []}
    fns = {"steady": phase_steady, "false_positives": phase_false_positives, "million": phase_million,
           "check_cost": phase_check_cost, "overhead": phase_overhead, "sizing": phase_sizing}
    run_phases(res, [(n, fns[n]) for n in a.phases], a, a.json, checks=checks, phase_seconds=True)
    print_results(res)
    return 1 if res["errors"] or res["failed_checks"] else 0


if __name__ == "__main__":
    sys.exit(main())
