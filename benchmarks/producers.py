"""Benchmark of the broker's idempotent-producer state at scale: N idle producers in ONE partition.  In
process: bytes per idle producer, expiry, snapshot write/load, close and reopen; over the wire (a broker
process on a real quorum): bytes per idle producer, active producers' p99 beside a 0-idle run, restart
to serving.  Kafka's figures are printed beside ours.  What each phase does and checks:
docs/benchmarks.md.

    pidctl bench producers [--sizes 10000,100000,1000000] [--active-seconds 10]
                           [--json bench-results/producers.json] [-o table|json] [--phases in_process,wire]
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc

from broker.partition import EXPIRY_CHUNK_ROWS, Partition
from broker.producer_state import ProducerStateManager

from .common import temp_cluster
from .harness import log, new_results, parser, phase_list, run_phases
from .processes import REPO, BrokerProcess, child_env, cpu_seconds
from .producer_wire import (
    ACTIVE_FIRST_PID,
    BASELINE_ACTIVE_OFFSET,
    IN_PROCESS_FIRST_PID,
    LOADED_ACTIVE_OFFSET,
    PRODUCE_VERSION,
    TOPIC,
    active_run,
    blobs,
    create_idle,
    duplicate_check,
    restart,
)
from .producer_wire import longest_gap, stall_episodes  # noqa: F401 - tests/benchmarks read them here
from .report import print_footer, report, table

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
DAY_MS = 24 * 60 * 60 * 1000


# ------------------------------------------------------------------ Kafka's figures, with sources
KAFKA = {
    "bytes_per_idle_producer": {
        "value": 255, "batches_kept": 1,
        "text": "~255 B (1 batch kept)",
        "source": "estimate from the fields of ProducerStateEntry and its BatchMetadata (apache/kafka "
                  "storage/src/main/java/org/apache/kafka/storage/internals/log/ProducerStateEntry.java), "
                  "not a measurement"},
    "bytes_per_producer_5_batches": {
        "value": 415, "batches_kept": 5,
        "text": "~415 B (5 batches kept)",
        "source": "the same estimate with the 5 BatchMetadata a producer keeps at most"},
    "expire_all_ms": {
        "by_size": {10_000: 0.039, 100_000: 0.464, 1_000_000: 5.731},
        "text": "5.7 ms for 1M",
        "source": "apache/kafka PR #16075 (ProducerStateManagerBench.testDeleteExpiringIds, all expire; "
                  "39 us at 10k, 464 us at 100k, 5,731 us at 1M)"},
    "snapshot": {
        "text": "on segment roll; fsync outside the log lock",
        "source": "KAFKA-15046 (apache/kafka PR #14242: no fsync inside UnifiedLog.lock); KAFKA-9693 "
                  "(apache/kafka PR #13782: the snapshot flush on roll stalled produce)"},
    "active": {"text": "none", "source": "no published Kafka figure"},
    "restart": {"text": "none", "source": "no published Kafka figure"},
}
TARGETS = {
    "p99_over_baseline": 2.0,     # active producers' p99 with N idle within 2x of the 0-idle baseline
    "stall_ms": 50.0,             # no active producer waits longer than this between two answers
    "restart_s": 2.0,             # SIGTERM'd broker with N producers serves a Produce again within
    "bytes_per_producer": 200.0,  # broker memory per idle producer, last batch kept
    "expiry_pause_ms": 5.0,       # longest pause of an expiry pass (chunked as the partition runs it)
}


# ------------------------------------------------------------------ helpers
def rss_bytes(pid: int | str = "self") -> int:
    """VmRSS of a process, from /proc/<pid>/status, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def partition_options(**wanted) -> dict:
    """The keyword options ``Partition`` accepts, of ``wanted`` (its internals are being rewritten:
    an option it no longer takes is left out, and the JSON says which were given)."""
    params = inspect.signature(Partition).parameters
    return {k: v for k, v in wanted.items() if k in params}


# ------------------------------------------------------------------ 1. in process (child processes)
def measure_in_process(n: int, per: int, batches_per_producer: int, trace: bool, timings: bool,
                       work_dir: str) -> dict:
    """In THIS process: a Partition in ``work_dir``, n producers x ``batches_per_producer`` batches."""
    directory = tempfile.mkdtemp(prefix="partition-", dir=work_dir)
    # No periodic snapshot in the measured window (its transient buffers would stay in the RSS figure).
    opts = partition_options(snapshot_every=n * batches_per_producer + 1)  # counted in batches
    part = Partition(directory, **opts)
    out: dict = {"n": n, "batches_per_producer": batches_per_producer, "batches_per_append": per,
                 "partition_options": opts}
    try:
        gc.collect()
        if trace:
            tracemalloc.start()
            snap0 = tracemalloc.take_snapshot()
            traced0 = tracemalloc.get_traced_memory()[0]
        rss0 = rss_bytes()
        refused = 0
        t0 = time.perf_counter()
        for seq in range(batches_per_producer):
            for _, blob in blobs(IN_PROCESS_FIRST_PID, n, per, seq):
                if not part.append(blob).ok:
                    refused += 1
        out["append_s"] = time.perf_counter() - t0
        blob = None
        gc.collect()
        rss1 = rss_bytes()
        out.update(rss_before=rss0, rss_after=rss1, rss_bytes_per_producer=(rss1 - rss0) / n,
                   refused_appends=refused, producers=len(part.state))
        if trace:
            traced1 = tracemalloc.get_traced_memory()[0]
            stats = tracemalloc.take_snapshot().compare_to(snap0, "filename")
            tracemalloc.stop()
            out["traced_bytes_per_producer"] = (traced1 - traced0) / n
            out["traced_by_file"] = {os.path.relpath(s.traceback[0].filename, REPO): s.size_diff
                                     for s in stats[:6] if s.size_diff > 0}
        if timings:
            # What a broker restart does to this partition: close (snapshot at the log end), open again
            # (the log's recovery scan, then the snapshot loaded).
            t = time.perf_counter()
            part.close()
            out["partition_close_ms"] = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            part = Partition(directory, **opts)
            out["partition_reopen_ms"] = (time.perf_counter() - t) * 1000
            out["producers_after_reopen"] = len(part.state)
            out.update(state_timings(part, directory))
    finally:
        part.close()
        shutil.rmtree(directory, ignore_errors=True)
    return out


def state_timings(part: Partition, directory: str) -> dict:
    """expire() none / all, write_snapshot and load_snapshot on the partition's state."""
    state = part.state
    n = len(state)
    now = time.time_ns() // 1_000_000
    none_s, kept = [], None
    for _ in range(5):
        t = time.perf_counter()
        kept = state.expire(now, DAY_MS)  # how many went (none)
        none_s.append(time.perf_counter() - t)
    path = os.path.join(directory, "bench.snapshot")
    offset = part.log_end_offset
    t = time.perf_counter()
    state.write_snapshot(path, offset)
    write_s = time.perf_counter() - t
    size = os.path.getsize(path)
    loaded = ProducerStateManager()
    t = time.perf_counter()
    loaded_offset = loaded.load_snapshot(path)
    load_s = time.perf_counter() - t
    loaded_producers = len(loaded)
    later = now + 1000  # every producer appended before ``now``: all are idle for >= 1 ms
    t = time.perf_counter()
    all_gone = state.expire(later, 1)
    all_s = time.perf_counter() - t
    # What the partition does: the pass a chunk of rows at a time, the lock released in between.
    chunks, repeat_gone, start = [], 0, 0
    while start < loaded.row_count:
        t = time.perf_counter()
        repeat_gone += loaded.expire(later, 1, start, start + EXPIRY_CHUNK_ROWS)
        chunks.append(time.perf_counter() - t)
        start += EXPIRY_CHUNK_ROWS
    repeat_s = sum(chunks)
    return {"expire_none_ms": statistics.median(none_s) * 1000, "expire_none_runs_ms": [x * 1000 for x in none_s],
            "expire_none_expired": kept, "expire_all_ms": all_s * 1000, "expire_all_expired": all_gone,
            "expire_all_repeat_ms": repeat_s * 1000, "expire_all_repeat_expired": repeat_gone,
            "expire_chunk_max_ms": max(chunks, default=0.0) * 1000, "expire_chunks": len(chunks),
            "snapshot_write_ms": write_s * 1000, "snapshot_load_ms": load_s * 1000, "snapshot_bytes": size,
            "snapshot_bytes_per_producer": size / n if n else None, "snapshot_offset": offset,
            "snapshot_loaded_offset": loaded_offset, "snapshot_loaded_producers": loaded_producers}


def run_child(a, work_dir: str, **job) -> dict:
    """``measure_in_process(**job)`` in a fresh ``python -m benchmarks.producers`` process (ours, killed
    by subprocess.run if it outlives ``--child-timeout``)."""
    out = os.path.join(work_dir, f"child-{time.monotonic_ns()}.json")
    cmd = [sys.executable, "-m", "benchmarks.producers", "--child-job", json.dumps({**job, "work_dir": work_dir}),
           "--child-out", out]
    p = subprocess.run(cmd, env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=a.child_timeout)
    if p.returncode != 0:
        raise RuntimeError(f"in-process measurement {job} exited {p.returncode}: {p.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


def phase_in_process(a) -> dict:
    out = {}
    work_dir = tempfile.mkdtemp(prefix="pidquorum-bench-producers-")
    try:
        for n in a.sizes:
            log(f"in process: {n:,} idle producers (Partition.append, {a.batches_per_request} batches per call)")
            r: dict = {}
            try:
                r["rss"] = run_child(a, work_dir, n=n, per=a.batches_per_request, batches_per_producer=1,
                                     trace=False, timings=True)
                tn = min(n, a.tracemalloc_max)
                log(f"  tracemalloc at {tn:,}")
                r["tracemalloc"] = run_child(a, work_dir, n=tn, per=a.batches_per_request, batches_per_producer=1,
                                             trace=True, timings=False)
                fn = min(n, a.five_batches_max)
                log(f"  5 batches kept, at {fn:,}")
                r["five_batches"] = run_child(a, work_dir, n=fn, per=a.batches_per_request, batches_per_producer=5,
                                              trace=False, timings=False)
            except Exception as e:  # noqa: BLE001 - recorded; the next size still runs
                log(f"  in process {n:,}: {type(e).__name__}: {e}")
                r["error"] = f"{type(e).__name__}: {e}"
            out[str(n)] = r
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return out


# ------------------------------------------------------------------ 2. over the wire


def wire_size(a, lc, directory: str, broker_id: int, n: int) -> dict:
    broker = BrokerProcess(directory, broker_id, lc.client_addresses(), "--partitions", "1")
    out: dict = {"n": n, "broker_id": broker_id}
    try:
        t = time.perf_counter()
        broker.start(a.restart_timeout)
        out["first_start_s"] = time.perf_counter() - t
        pid = broker.proc.pid
        address = broker.bootstrap
        stall_s = TARGETS["stall_ms"] / 1000
        asyncio.run(active_run(address, ACTIVE_FIRST_PID - 100, 1, 0.3, stall_s))  # creates the topic, warms up
        log(f"  baseline: {a.active_producers} active producers, 0 idle, {a.active_seconds:.0f}s")
        out["baseline"] = asyncio.run(active_run(address, ACTIVE_FIRST_PID + BASELINE_ACTIVE_OFFSET,
                                                 a.active_producers, a.active_seconds, stall_s))
        out["rss_before"] = rss_bytes(pid)
        cpu0 = cpu_seconds(pid)
        log(f"  creating {n:,} idle producers ({a.batches_per_request} batches per request)")
        fill = asyncio.run(create_idle(address, n, a.batches_per_request))
        out["broker_cpu_s_fill"] = (cpu_seconds(pid) or 0) - (cpu0 or 0)
        time.sleep(0.5)
        out["rss_after"] = rss_bytes(pid)
        out["rss_bytes_per_producer"] = (out["rss_after"] - out["rss_before"]) / n
        offsets = fill.pop("first_offsets")
        out["fill"] = fill
        log(f"  {a.active_producers} active producers with {n:,} idle, {a.active_seconds:.0f}s")
        out["loaded"] = asyncio.run(active_run(address, ACTIVE_FIRST_PID + LOADED_ACTIVE_OFFSET,
                                               a.active_producers, a.active_seconds, stall_s))
        b99, l99 = out["baseline"]["p99_ms"], out["loaded"]["p99_ms"]
        out["p99_over_baseline"] = l99 / b99 if b99 and l99 is not None else None
        out["rss_after_active"] = rss_bytes(pid)
        log("  restart (SIGTERM, start)")
        out["restart"] = asyncio.run(restart(broker, a.restart_timeout))
        out["rss_after_restart"] = rss_bytes(broker.proc.pid)
        out["duplicate_after_restart"] = (asyncio.run(duplicate_check(address, offsets)) if offsets
                                          else {"state_survived": False, "error": "no idle producer was created"})
        out["broker_anomalies"] = broker.anomalies()
    except Exception:
        log(f"----- broker {broker_id} log tail -----\n{broker.tail(40)}")
        raise
    finally:
        broker.stop(a.restart_timeout)
    return out


def phase_wire(a) -> dict:
    out = {}
    with temp_cluster("pidquorum-bench-producers-", a.keep, "producers", subdir="cluster") as (lc, directory):
        for i, n in enumerate(a.sizes):
            log(f"wire: {n:,} idle producers, broker {i + 1} (fresh)")
            try:
                out[str(n)] = wire_size(a, lc, directory, i + 1, n)
            except Exception as e:  # noqa: BLE001 - recorded; the next size still runs
                log(f"  wire {n:,}: {type(e).__name__}: {e}")
                out[str(n)] = {"error": f"{type(e).__name__}: {e}"}
    return out


# ------------------------------------------------------------------ checks, targets, output
def checks(res: dict) -> list[str]:
    """Sanity of the run (not targets): the figures mean what they say."""
    bad = []
    for n, r in res["phases"].get("in_process", {}).items():
        if "error" in r:
            bad.append(f"in process {n}: {r['error']}")
            continue
        for key, m in r.items():
            if m["refused_appends"] or m["producers"] != m["n"]:
                bad.append(f"in process {n} {key}: {m['refused_appends']} appends refused, "
                           f"{m['producers']} producers in the state (expected {m['n']})")
        t = r["rss"]
        if t["producers_after_reopen"] != t["n"]:
            bad.append(f"in process {n}: {t['producers_after_reopen']} producers after Partition was reopened "
                       f"(expected {t['n']})")
        if t["snapshot_loaded_producers"] != t["n"] or t["snapshot_loaded_offset"] != t["snapshot_offset"]:
            bad.append(f"in process {n}: the snapshot loaded {t['snapshot_loaded_producers']} producers at offset "
                       f"{t['snapshot_loaded_offset']} (wrote {t['n']} at {t['snapshot_offset']})")
        if t["expire_none_expired"] != 0 or t["expire_all_expired"] != t["n"]:
            bad.append(f"in process {n}: expire() dropped {t['expire_none_expired']} (none expected) and "
                       f"{t['expire_all_expired']} (all {t['n']} expected)")
    for n, r in res["phases"].get("wire", {}).items():
        if "error" in r:
            bad.append(f"wire {n}: {r['error']}")
            continue
        for what in ("baseline", "loaded"):
            if r[what]["errors"] or not r[what]["n"]:
                bad.append(f"wire {n} {what}: {r[what]['n']} answers, errors {r[what]['errors']}")
        if r["fill"]["errors"]:
            bad.append(f"wire {n}: creating idle producers: errors {r['fill']['errors']}")
        if not r["duplicate_after_restart"].get("state_survived"):
            bad.append(f"wire {n}: after the restart an idle producer's retry was not a duplicate at its "
                       f"original offset: {r['duplicate_after_restart']}")
        if r["restart"]["stop_exit_code"] != 0:
            bad.append(f"wire {n}: the broker exited {r['restart']['stop_exit_code']} on SIGTERM")
        if r["restart"]["first_produce_answered_s"] is None:
            bad.append(f"wire {n}: no Produce answered after the restart")
        if r.get("broker_anomalies"):
            bad.append(f"wire {n}: broker log: {r['broker_anomalies']}")
    return bad


def evaluate_targets(res: dict) -> list[dict]:
    out = []
    for n, r in res["phases"].get("in_process", {}).items():
        if "error" in r or "rss" not in r:
            continue
        idle, i = f"{int(n):,}", r["rss"]
        out.append({"n": int(n), "target": f"expiry pause <= {TARGETS['expiry_pause_ms']:g} ms with {idle}",
                    "holds": i["expire_chunk_max_ms"] <= TARGETS["expiry_pause_ms"],
                    "detail": f"longest chunk {i['expire_chunk_max_ms']:.2f} ms of {i['expire_chunks']} "
                              f"(one call for all: {i['expire_all_ms']:.1f} ms)"})
    for n, r in res["phases"].get("wire", {}).items():
        if "error" in r:
            continue
        idle = f"{int(n):,}"
        ratio, b = r["p99_over_baseline"], r["baseline"]
        out.append({"n": int(n), "target": f"p99 with {idle} idle <= {TARGETS['p99_over_baseline']:g}x baseline",
                    "holds": ratio is not None and ratio <= TARGETS["p99_over_baseline"],
                    "detail": f"{_f(r['loaded']['p99_ms'], '.2f')} ms vs {_f(b['p99_ms'], '.2f')} ms "
                              f"= {_f(ratio, '.2f')}x"})
        stall = r["loaded"]["longest_stall_ms"]
        out.append({"n": int(n), "target": f"no stall over {TARGETS['stall_ms']:g} ms with {idle} idle",
                    "holds": stall is not None and stall <= TARGETS["stall_ms"],
                    "detail": f"longest {_f(stall, '.1f')} ms (baseline {_f(b['longest_stall_ms'], '.1f')} ms)"})
        per = r["rss_bytes_per_producer"]
        out.append({"n": int(n), "target": f"bytes per idle producer <= {TARGETS['bytes_per_producer']:g} "
                                           f"with {idle} (broker process, over the wire)",
                    "holds": per is not None and per <= TARGETS["bytes_per_producer"],
                    "detail": f"{_f(per, '.0f')} B (broker RSS growth / producers)"})
        rs = r["restart"]
        s = rs["first_produce_answered_s"]
        out.append({"n": int(n), "target": f"restart with {idle} producers serves within {TARGETS['restart_s']:g} s",
                    "holds": s is not None and s <= TARGETS["restart_s"],
                    "detail": f"first Produce answered {_f(s, '.2f')} s after start (ready file "
                              f"{_f(rs['ready_file_s'], '.2f')} s; stop {_f(rs['stop_s'], '.2f')} s)"})
    return out


def _f(v, spec: str, unit: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{unit}"


def _holds(res: dict, n: str, prefix: str) -> str:
    for t in res.get("targets", []):
        if str(t["n"]) == n and t["target"].startswith(prefix):
            return "HOLDS" if t["holds"] else "MISSED"
    return "-"


def table_rows(res: dict) -> list[list]:
    rows = []
    ip, wr = res["phases"].get("in_process", {}), res["phases"].get("wire", {})
    kb, kb5, ke = KAFKA["bytes_per_idle_producer"], KAFKA["bytes_per_producer_5_batches"], KAFKA["expire_all_ms"]
    for n in [str(x) for x in res["params"]["sizes"]]:
        N = f"{int(n):,}"
        i, w = ip.get(n, {}), wr.get(n, {})
        if "error" in i:
            rows.append([N, "in process", f"ERROR: {i['error'][:60]}", "", ""])
        elif i:
            r, tm, f5 = i["rss"], i["tracemalloc"], i["five_batches"]
            rows += [
                [N, "B/idle producer, in process (RSS)", _f(r["rss_bytes_per_producer"], ",.0f"), kb["text"], "-"],
                ["", f"B/idle producer, in process (tracemalloc, n={tm['n']:,})",
                 _f(tm["traced_bytes_per_producer"], ",.0f"), kb["text"], "-"],
                ["", f"B/producer, 5 batches kept (RSS, n={f5['n']:,})", _f(f5["rss_bytes_per_producer"], ",.0f"),
                 kb5["text"], "-"],
                ["", "expire(), all expire", _f(r["expire_all_ms"], ",.1f", " ms"),
                 f"{ke['by_size'][int(n)]:g} ms" if int(n) in ke["by_size"] else ke["text"], "-"],
                ["", "expire(), as the partition runs it: longest chunk",
                 _f(r["expire_chunk_max_ms"], ",.2f", " ms") + f" ({r['expire_chunks']} chunks)", "-",
                 f"<= {TARGETS['expiry_pause_ms']:g} ms {_holds(res, n, 'expiry')}"],
                ["", "expire(), none expires (median of 5)", _f(r["expire_none_ms"], ",.1f", " ms"), "-", "-"],
                ["", "write_snapshot", _f(r["snapshot_write_ms"], ",.0f", " ms"), KAFKA["snapshot"]["text"], "-"],
                ["", "load_snapshot", _f(r["snapshot_load_ms"], ",.0f", " ms"), "-", "-"],
                ["", "snapshot file", f"{r['snapshot_bytes']:,} B ({r['snapshot_bytes_per_producer']:.1f} B/producer)",
                 "-", "-"],
                ["", "Partition.close() (snapshot at the log end)", _f(r["partition_close_ms"], ",.0f", " ms"),
                 "-", "-"],
                ["", "Partition(dir) reopen (log scan + snapshot)", _f(r["partition_reopen_ms"], ",.0f", " ms"),
                 "-", "-"],
            ]
        if "error" in w:
            rows.append([N if not i else "", "wire", f"ERROR: {w['error'][:60]}", "", ""])
        elif w:
            b, lo, rs = w["baseline"], w["loaded"], w["restart"]
            rows += [
                [N if not i else "", "B/idle producer, broker process (RSS, wire)",
                 _f(w["rss_bytes_per_producer"], ",.0f"), kb["text"],
                 f"<= {TARGETS['bytes_per_producer']:g} {_holds(res, n, 'bytes')}"],
                ["", "idle producers created over the wire", f"{w['fill']['producers_per_s']:,.0f}/s", "-", "-"],
                ["", f"active p50 ({lo['producers']} producers)",
                 f"{_f(lo['p50_ms'], '.2f')} ms (0 idle: {_f(b['p50_ms'], '.2f')})", KAFKA["active"]["text"], "-"],
                ["", "active p99 / baseline p99",
                 f"{_f(lo['p99_ms'], '.2f')} / {_f(b['p99_ms'], '.2f')} ms = {_f(w['p99_over_baseline'], '.2f')}x",
                 KAFKA["active"]["text"],
                 f"<= {TARGETS['p99_over_baseline']:g}x {_holds(res, n, 'p99')}"],
                ["", "longest stall", f"{_f(lo['longest_stall_ms'], ',.1f')} ms (0 idle: "
                                      f"{_f(b['longest_stall_ms'], ',.1f')})", KAFKA["active"]["text"],
                 f"<= {TARGETS['stall_ms']:g} ms {_holds(res, n, 'no stall')}"],
                ["", f"stalls over {TARGETS['stall_ms']:g} ms (all producers held)",
                 f"{lo['stall_episodes_over_target']} (0 idle: {b['stall_episodes_over_target']})", "-", "-"],
                ["", "broker stop (SIGTERM -> exit)", _f(rs["stop_s"], ".2f", " s"), KAFKA["restart"]["text"], "-"],
                ["", "restart -> ready file", _f(rs["ready_file_s"], ".2f", " s"), KAFKA["restart"]["text"], "-"],
                ["", "restart -> Produce answered", _f(rs["first_produce_answered_s"], ".2f", " s"),
                 KAFKA["restart"]["text"], f"<= {TARGETS['restart_s']:g} s {_holds(res, n, 'restart')}"],
                ["", "broker RSS: 0 idle / N idle / after restart",
                 " / ".join(f"{w[k] / 2**20:,.0f}" for k in ("rss_before", "rss_after", "rss_after_restart")) + " MiB",
                 "-", "-"],
            ]
    return rows


def print_results(res: dict) -> None:
    p = res["params"]
    print(table(f"idle producers in one partition (active: {p['active_producers']} producers x "
                f"{p['active_seconds']:g} s, one request in flight each; {p['batches_per_request']} batches per "
                f"idle-producer request)", ["N", "figure", "pidquorum", "Kafka reference", "target"],
                table_rows(res)))
    print("Kafka references:")
    for k, v in KAFKA.items():
        print(f"  {k}: {v['text']}: {v['source']}")
    if res["targets"]:
        print("Targets:")
        for t in res["targets"]:
            print(f"  [{'HOLDS' if t['holds'] else 'MISSED'}] {t['target']}: {t['detail']}")
    print_footer(res)


# ------------------------------------------------------------------ options
def sizes_arg(text: str) -> list[int]:
    try:
        sizes = [int(x.strip().replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return sizes


def parse_args(argv=None, prog: str | None = None):
    ap = parser(prog, __doc__)
    ap.add_argument("--sizes", type=sizes_arg, default=list(DEFAULT_SIZES),
                    help="idle producers per run, comma-separated (default 10000,100000,1000000)")
    ap.add_argument("--active-seconds", type=float, default=10.0, help="length of each active run (s)")
    ap.add_argument("--active-producers", type=int, default=10, help="active producers in each active run")
    ap.add_argument("--batches-per-request", type=int, default=1000,
                    help="batches (one per idle producer) per Produce request / Partition.append call")
    ap.add_argument("--tracemalloc-max", type=int, default=100_000,
                    help="the tracemalloc figure is measured at min(N, this) producers")
    ap.add_argument("--five-batches-max", type=int, default=100_000,
                    help="the 5-batches-kept figure is measured at min(N, this) producers")
    ap.add_argument("--restart-timeout", type=float, default=600.0,
                    help="the broker's start and stop deadline (s)")
    ap.add_argument("--child-timeout", type=float, default=3600.0, help="deadline of one in-process measurement (s)")
    ap.add_argument("--phases", default="in_process,wire", help="comma-separated: in_process, wire")
    ap.add_argument("--json", default="bench-results/producers.json", help="where to write the results")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table",
                    help="print the table, or the JSON (also written to --json)")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's and brokers' directory")
    ap.add_argument("--quick", action="store_true", help="sizes 2,000 and 20,000, active runs of 2 s")
    ap.add_argument("--child-job", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.quick:
        a.sizes, a.active_seconds = [2000, 20_000], 2.0
    a.phases = phase_list(ap, a.phases, PHASES)
    if a.batches_per_request < 1 or a.active_producers < 1 or a.active_seconds <= 0:
        ap.error("--batches-per-request and --active-producers must be >= 1, --active-seconds > 0")
    return a


PHASES = {"in_process": phase_in_process, "wire": phase_wire}


def main(argv=None, prog: str | None = None) -> int:
    a = parse_args(argv, prog)
    if a.child_job:  # one in-process measurement, in this (child) process
        out = measure_in_process(**json.loads(a.child_job))
        with open(a.child_out, "w") as f:
            json.dump(out, f)
        return 0
    res = new_results({"sizes": a.sizes, "active_seconds": a.active_seconds, "active_producers": a.active_producers,
                       "batches_per_request": a.batches_per_request, "tracemalloc_max": a.tracemalloc_max,
                       "five_batches_max": a.five_batches_max, "phases": a.phases, "json": a.json, "argv": sys.argv,
                       "produce": f"Produce v{PRODUCE_VERSION}, acks=1, topic {TOPIC!r}, 1 partition"},
                      references={k: {**v, "by_size": {str(s): x for s, x in v.get("by_size", {}).items()}}
                                  for k, v in KAFKA.items()},
                      target_values=TARGETS, targets=[])

    def all_checks(r: dict) -> list[str]:
        r["targets"] = evaluate_targets(r)
        return checks(r)

    run_phases(res, [(n, PHASES[n]) for n in a.phases], a, a.json, checks=all_checks)
    return report(res, a.output, print_results)


if __name__ == "__main__":
    sys.exit(main())
