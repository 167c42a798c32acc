"""Benchmark of the KIP-936 producer-ID quota (broker/quota.py), in process, on a simulated clock: filter
memory and false positives with every layer full, check() cost, and the broker memory one principal can
make the broker hold (its phases: docs/benchmarks.md).

    pidctl bench quota [--rate 10] [--window-num 11] [--window-size-s 3600] [--fpp 0.001] [--burst-s 60]
                       [--fp-rates 1,10,100,1000] [--json bench-results/quota.json] [--quick]
"""
from __future__ import annotations

import gc
import math
import multiprocessing
import os
import random
import statistics
import sys
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor

from broker.producer_state import DEFAULT_RETRY_WINDOW_MS, ProducerStateManager
from broker.quota import LayeredBloomFilter, ProducerIdQuotaManager, QuotaWindow
from broker.recordbatch import BatchHeader

from .harness import exit_status, new_results, parser, run_phases
from .report import fmt_num, print_footer, table

PRINCIPAL = "User:bench"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def window(a) -> QuotaWindow:
    return QuotaWindow(num=a.window_num, size_s=a.window_size_s, false_positive_rate=a.fpp, burst_s=a.burst_s)


def make(a, rate: float | None = None) -> ProducerIdQuotaManager:
    m = ProducerIdQuotaManager(window(a))
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
    w = window(a)
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
    m = ProducerIdQuotaManager(window(a))
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
    w = window(a)
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


def fill_layers(filt: LayeredBloomFilter, layers: int, pid: int) -> int:
    """Add consecutive PIDs from ``pid``, at one instant (layers roll by count only), until ``filt`` has
    ``layers`` layers, all full; the next PID."""
    while len(filt.layers) < layers or filt.layers[-1].count < filt.layer_items:
        filt.add(pid, 0.0)
        pid += 1
    return pid


def z_score(hits: int, n: int, p: float) -> float:
    """Standard deviations between ``hits`` of ``n`` Bernoulli(p) trials and their mean."""
    return (hits - n * p) / math.sqrt(n * p * (1 - p)) if 0 < p < 1 else float("nan")


def false_positives_full_layers(rate: float, num: int, size_s: float, fpp: float, lookups: int) -> dict:
    """Run in a fresh process (phase ``fp_by_rate``): one principal's filter, every layer full."""
    gc.collect()
    rss0 = rss_bytes()
    w = QuotaWindow(num=num, size_s=size_s, false_positive_rate=fpp)
    filt = LayeredBloomFilter(w, w.layer_items(rate))
    rnd = random.Random(936)
    pid = 1_000_000_000
    out = {"rate": rate, "layer_items": w.layer_items(rate), "per_layer_target": w.layer_false_positive_rate,
           "lookups": lookups, "by_layers": {}}
    for layers in (w.num + 1, w.max_layers):
        t = time.perf_counter()
        pid = fill_layers(filt, layers, pid)
        fill_s = time.perf_counter() - t
        t = time.perf_counter()
        base = 10**13 + layers * lookups  # a later block: never added
        seq = sum(1 for q in range(base, base + lookups) if filt.find(q) is not None)
        rand = sum(1 for _ in range(lookups) if filt.find(rnd.getrandbits(63)) is not None)
        lookup_s = time.perf_counter() - t
        model = filt.false_positive_rate()
        gc.collect()
        out["by_layers"][str(layers)] = {
            "layers": len(filt.layers), "items": filt.items, "filter_bytes": filt.nbytes,
            "rss_growth": rss_bytes() - rss0, "target_rate": 1 - (1 - w.layer_false_positive_rate) ** layers,
            "model_rate": model, "consecutive_false_positives": seq, "consecutive_rate": seq / lookups,
            "consecutive_z": z_score(seq, lookups, model), "random_false_positives": rand,
            "random_rate": rand / lookups, "random_z": z_score(rand, lookups, model),
            "fill_s": fill_s, "lookup_s": lookup_s}
    return out


def phase_fp_by_rate(a) -> dict:
    ctx = multiprocessing.get_context("spawn")
    rows = {}
    for rate in a.fp_rates:
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:  # a fresh process per rate
            rows[str(rate)] = pool.submit(false_positives_full_layers, rate, a.window_num, a.window_size_s, a.fpp,
                                          a.fp_lookups).result()
    return {"window_num": a.window_num, "window_size_s": a.window_size_s, "target": a.fpp, "rates": rows}


RETRY_WINDOW_S = DEFAULT_RETRY_WINDOW_MS / 1000


def producer_state_bytes(batches: int, n: int = 20_000) -> float:
    """tracemalloc bytes per producer in one partition's ProducerStateManager, ``batches`` batches each."""
    def header(pid: int, seq: int) -> BatchHeader:
        return BatchHeader(base_offset=0, batch_length=100, partition_leader_epoch=0, magic=2, crc=0, attributes=0,
                           last_offset_delta=0, base_timestamp=1_700_000_000_000,
                           max_timestamp=1_700_000_000_000 + seq, producer_id=pid, producer_epoch=0,
                           base_sequence=seq, records_count=1)
    headers = [header(10**12 + i, seq) for i in range(n) for seq in range(batches)]
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        psm = ProducerStateManager()
        for offset, h in enumerate(headers):
            psm.update(h, 10**9 + offset, 1_700_000_000_000 + offset)
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    if len(psm) != n:
        raise RuntimeError(f"{len(psm)} producers in the state, expected {n}")
    return grown / n


def phase_budget(a) -> dict:
    w = window(a)
    kip = QuotaWindow(num=a.window_num, size_s=a.window_size_s, false_positive_rate=a.fpp, burst_s=w.span_s)
    one, five = producer_state_bytes(1), producer_state_bytes(5)
    rows = {}
    for rate in (1.0, 10.0, 100.0, 1000.0):
        burst, remembered = w.burst(rate), w.max_layers * w.layer_items(rate)
        live = burst + rate * a.expiration_s + remembered
        # Only producers that appended within the retry window keep 5 batches; the others keep their last.
        recent = min(live, burst + rate * RETRY_WINDOW_S)
        rows[str(rate)] = {"burst": burst, "kip_burst": kip.burst(rate), "per_expiration": rate * a.expiration_s,
                           "remembered": remembered, "live_producers_bound": live,
                           "bytes_bound_1_batch": live * one, "bytes_bound_5_batches": live * five,
                           "bytes_bound": live * one + recent * (five - one),
                           "at_once_bytes_5_batches": burst * five,
                           "kip_at_once_bytes_5_batches": kip.burst(rate) * five}
    return {"bytes_per_producer_1_batch": one, "bytes_per_producer_5_batches": five, "burst_s": w.burst_s,
            "retry_window_s": RETRY_WINDOW_S,
            "expiration_s": a.expiration_s, "window_num": w.num, "window_size_s": w.size_s, "rates": rows}


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
    for rate, r in (res["phases"].get("fp_by_rate") or {}).get("rates", {}).items():
        for layers, x in r["by_layers"].items():
            for kind in ("consecutive", "random"):
                if abs(x[f"{kind}_z"]) > 4.5:
                    out.append(f"fp_by_rate {rate}/s, {layers} layers: {kind} PIDs {x[f'{kind}_rate']:.6f} is "
                               f"{x[f'{kind}_z']:+.1f} sd from the layers' rate {x['model_rate']:.6f}")
            if abs(x["model_rate"] - x["target_rate"]) > 0.15 * x["target_rate"]:
                out.append(f"fp_by_rate {rate}/s, {layers} layers: the layers' rate {x['model_rate']:.6f} is not "
                           f"within 15 % of the target {x['target_rate']:.6f}")
    return out


def kib(v) -> str:
    return fmt_num(None if v is None else v / 1024, ".1f", " KiB")


def print_results(res: dict) -> None:
    p = res["params"]
    print(f"producer-ID quota: rate {p['rate']}/s, window {p['window_num']} x {p['window_size_s']} s, "
          f"burst {p['burst_s']} s of the rate, target false-positive rate {p['fpp']}")
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
    f = res["phases"].get("fp_by_rate")
    if f:
        rows = []
        for rate, r in f["rates"].items():
            for layers, x in r["by_layers"].items():
                rows.append([rate, r["layer_items"], layers, kib(x["filter_bytes"]), kib(x["rss_growth"]),
                             f"{x['target_rate']:.5f}", f"{x['model_rate']:.5f}",
                             f"{x['consecutive_rate']:.5f} ({x['consecutive_z']:+.1f})",
                             f"{x['random_rate']:.5f} ({x['random_z']:+.1f})"])
        first = next(iter(f["rates"].values()), {})
        print(table(f"false positives of never-seen PIDs, every layer full, a fresh process per rate (window "
                    f"{f['window_num']} x {f['window_size_s']} s; {first.get('lookups', 0):,} lookups of each "
                    f"kind; in brackets: standard deviations from the layers' rate)",
                    ["rate/s", "PIDs/layer", "layers", "filter", "RSS growth", "target", "layers' rate",
                     "consecutive PIDs", "random PIDs"], rows))
    b = res["phases"].get("budget")
    if b:
        mib = 1024 * 1024
        print(table(f"producer state one principal can make one partition hold (burst {b['burst_s']:.0f} s, "
                    f"producer_id_expiration {b['expiration_s']:.0f} s; {b['bytes_per_producer_1_batch']:.0f} B per "
                    f"producer with 1 cached batch, {b['bytes_per_producer_5_batches']:.0f} B with 5, kept only by "
                    f"producers that appended in the last {b.get('retry_window_s', 0):.0f} s: the bound)",
                    ["rate/s", "burst", "KIP bucket", "rate x expiration", "remembered", "live bound",
                     "MiB (1 batch)", "MiB (5 batches)", "MiB bound", "at once MiB", "KIP at once MiB"],
                    [[r, f"{v['burst']:,.0f}", f"{v['kip_burst']:,.0f}", f"{v['per_expiration']:,.0f}",
                      f"{v['remembered']:,}", f"{v['live_producers_bound']:,.0f}",
                      f"{v['bytes_bound_1_batch'] / mib:,.1f}", f"{v['bytes_bound_5_batches'] / mib:,.1f}",
                      f"{v['bytes_bound'] / mib:,.1f}", f"{v['at_once_bytes_5_batches'] / mib:,.2f}", f"{v['kip_at_once_bytes_5_batches'] / mib:,.1f}"]
                     for r, v in b["rates"].items()]))
    print_footer(res)


def parse_args(argv=None, prog: str | None = None):
    ap = parser(prog, __doc__)
    ap.add_argument("--rate", type=float, default=10.0, help="producer_ids_rate of the principal (PIDs/s)")
    ap.add_argument("--window-num", type=int, default=11, help="producer.id.quota.window.num")
    ap.add_argument("--window-size-s", type=float, default=3600.0, help="producer.id.quota.window.size.seconds")
    ap.add_argument("--fpp", type=float, default=0.001, help="target false-positive rate of the whole filter")
    ap.add_argument("--burst-s", type=float, default=60.0,
                    help="producer_id_quota_burst_s: the bucket, in seconds of the rate")
    ap.add_argument("--fp-rates", default="1,10,100,1000", help="rates of phase 6 (comma-separated PIDs/s)")
    ap.add_argument("--expiration-s", type=float, default=86400.0,
                    help="producer_id_expiration_ms / 1000 of the broker (phase 7)")
    ap.add_argument("--million", type=int, default=1_000_000, help="distinct PIDs in phase 3")
    ap.add_argument("--fp-lookups", type=int, default=1_000_000, help="never-seen PIDs looked up in phase 2")
    ap.add_argument("--calls", type=int, default=200_000, help="check() calls per timing run")
    ap.add_argument("--quick", action="store_true", help="rate 1/s, window 11 x 60 s, 200,000 lookups")
    ap.add_argument("--json", default="bench-results/quota.json", help="where to write the results")
    ap.add_argument("--phases", default="steady,false_positives,million,check_cost,overhead,sizing,fp_by_rate,budget")
    a = ap.parse_args(argv)
    if a.quick:
        a.rate, a.window_size_s, a.fp_lookups, a.calls = 1.0, 60.0, 200_000, 50_000
    a.phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    a.fp_rates = [float(x) for x in a.fp_rates.split(",") if x.strip()]
    return a


def main(argv=None, prog: str | None = None) -> int:
    a = parse_args(argv, prog)
    res = new_results({"rate": a.rate, "window_num": a.window_num, "window_size_s": a.window_size_s, "fpp": a.fpp,
                       "burst_s": a.burst_s, "fp_rates": a.fp_rates, "expiration_s": a.expiration_s,
                       "million": a.million, "fp_lookups": a.fp_lookups, "calls": a.calls, "quick": a.quick,
                       "json": a.json,
                       "argv": sys.argv, "clock": "simulated (check(now=...)); memory = rbloom bit arrays"})
    fns = {"steady": phase_steady, "false_positives": phase_false_positives, "million": phase_million,
           "check_cost": phase_check_cost, "overhead": phase_overhead, "sizing": phase_sizing,
           "fp_by_rate": phase_fp_by_rate, "budget": phase_budget}
    run_phases(res, [(n, fns[n]) for n in a.phases], a, a.json, checks=checks, phase_seconds=True)
    print_results(res)
    return exit_status(res)


if __name__ == "__main__":
    sys.exit(main())
