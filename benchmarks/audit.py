"""Benchmark of the Spark audit job (chaos/audit/job.py) against a single-process pyarrow/numpy check of the
same generated audit export (with known overlaps injected): both times, their ratio, and whether both
found the same overlaps, gaps and wasted IDs.  The steps: docs/benchmarks.md.

    pidctl bench audit [--quick] [--blocks 10000000] [--master local[2]]
                       [--json bench-results/audit.json] [--repeat 2] [--keep DIR]
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from chaos.audit.job import run_audit
from chaos.audit.spark import JRE_PACKAGE, SparkSetupError, find_java_home, spark_session
from records.schema import ALLOCATE_PRODUCER_IDS

from .harness import environment_info, log, parser, quick_defaults, utc_now, write_json
from .provision import ensure_installed
from .report import table

BROKERS = 50
BLOCK = 1000
GAP_P = 1e-4
TS0 = 1_700_000_000_000
TS_STEP_MS = 60



def ensure_java(say=None) -> str:
    """JAVA_HOME for Spark, installing Debian's JRE first when there is none (the suite's and this benchmark's
    set-up: the audit itself installs nothing)."""
    try:
        return find_java_home()
    except SparkSetupError:
        def present() -> bool:
            try:
                return bool(find_java_home())
            except SparkSetupError:
                return False
        ensure_installed(JRE_PACKAGE, present, timeout=1800, say=say)
        return find_java_home()

def generate(path: str, n: int, parts: int, inject: int, seed: int = 1) -> dict:
    """Write the export; returns what was injected (the expected findings)."""
    rng = np.random.default_rng(seed)
    length = np.full(n, BLOCK, dtype=np.int32)
    gap = np.zeros(n, dtype=np.int64)
    g = rng.random(n) < GAP_P
    g[0] = False
    gap[g] = rng.integers(1, 5000, int(g.sum()))
    start = np.cumsum(length.astype(np.int64) + gap) - length
    # Overlaps: half nested (a 10-ID block inside an earlier block), half identical copies of an earlier block.
    victims = np.sort(rng.choice(np.arange(1, n - 1), size=inject, replace=False)) if inject else np.array([], int)
    nested = victims[: inject // 2]
    copies = victims[inject // 2:]
    src_of = rng.integers(0, n // 2, size=len(victims))
    start[nested] = start[src_of[: len(nested)]] + 100
    length[nested] = 10
    start[copies] = start[src_of[len(nested):]]
    length[copies] = length[src_of[len(nested):]]
    broker = rng.integers(0, BROKERS, n).astype(np.int32)
    ts = TS0 + np.arange(n, dtype=np.int64) * TS_STEP_MS
    d = os.path.join(path, "records", ALLOCATE_PRODUCER_IDS.name)
    os.makedirs(d, exist_ok=True)
    schema = pa.schema([("source", pa.string()), ("node_id", pa.int32()), ("raft_index", pa.int64()),
                        ("raft_term", pa.int64()), ("position", pa.int32()), ("accepted", pa.bool_()),
                        ("error", pa.string()), ("broker_id", pa.int32()), ("broker_epoch", pa.int64()),
                        ("producer_id_start", pa.int64()), ("producer_id_len", pa.int32()),
                        ("timestamp_ms", pa.int64())])
    for p, idx in enumerate(np.array_split(np.arange(n), parts)):
        m = len(idx)
        tb = pa.table({"source": pa.array(np.full(m, "bench", dtype=object), pa.string()),
                       "node_id": np.ones(m, np.int32), "raft_index": idx.astype(np.int64) + 1,
                       "raft_term": np.ones(m, np.int64), "position": np.zeros(m, np.int32),
                       "accepted": np.ones(m, bool), "error": pa.nulls(m, pa.string()),
                       "broker_id": broker[idx], "broker_epoch": broker[idx].astype(np.int64) + 1,
                       "producer_id_start": start[idx], "producer_id_len": length[idx], "timestamp_ms": ts[idx]},
                      schema=schema)
        pq.write_table(tb, os.path.join(d, f"part-{p:05d}.parquet"), row_group_size=1 << 20)
    rel = f"records/{ALLOCATE_PRODUCER_IDS.name}"
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump({"format": 1, "sources": ["bench"],
                   "tables": {rel: {"rows": n, "schema": [[x.name, str(x.type)] for x in schema]}}}, f)
    return {"overlaps": len(victims), "nested": len(nested), "identical": len(copies)}


def numpy_check(path: str) -> dict:
    """The overlap/gap logic in one process: pyarrow read, numpy dedup + sort + running maximum."""
    t0 = time.perf_counter()
    tb = ds.dataset(os.path.join(path, "records", "AllocateProducerIdsRecord"), format="parquet").to_table(
        columns=["raft_index", "position", "accepted", "producer_id_start", "producer_id_len"])
    t_read = time.perf_counter()
    acc = tb.column("accepted").to_numpy(zero_copy_only=False)
    ri = tb.column("raft_index").to_numpy()[acc]
    pos = tb.column("position").to_numpy()[acc]
    start = tb.column("producer_id_start").to_numpy()[acc]
    end = start + tb.column("producer_id_len").to_numpy()[acc].astype(np.int64)
    # Node copies: one row per (raft_index, position).
    order = np.lexsort((pos, ri))
    ri, pos = ri[order], pos[order]
    keep = np.ones(len(ri), bool)
    keep[1:] = (ri[1:] != ri[:-1]) | (pos[1:] != pos[:-1])
    start, end = start[order][keep], end[order][keep]
    order = np.lexsort((end, start))
    start, end = start[order], end[order]
    prev = np.maximum.accumulate(end)[:-1]
    s = start[1:]
    overlaps = int(np.count_nonzero(s < prev))
    gap = s - prev
    gaps = gap > 0
    t1 = time.perf_counter()
    return {"blocks": int(len(start)), "overlaps": overlaps, "gaps": int(np.count_nonzero(gaps)),
            "wasted_ids": int(gap[gaps].sum()), "read_s": t_read - t0, "total_s": t1 - t0}


def run(a) -> dict:
    res = {"params": {"blocks": a.blocks, "parts": a.parts, "master": a.master, "inject": a.inject,
                      "repeat": a.repeat, "driver_memory": a.driver_memory, "argv": sys.argv},
           "environment": environment_info(), "started_at": utc_now()}
    tmp = a.keep or tempfile.mkdtemp(prefix="bench-audit-")
    try:
        log(f"generating {a.blocks:,} blocks in {tmp}")
        t = time.perf_counter()
        res["injected"] = generate(tmp, a.blocks, a.parts, a.inject)
        res["generate_s"] = time.perf_counter() - t
        res["input_bytes"] = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(tmp) for f in fs)

        log("numpy check")
        res["numpy"] = numpy_check(tmp)
        log(f"numpy: {res['numpy']['total_s']:.2f} s")

        ensure_java(say=log)
        log(f"starting Spark on {a.master}")
        t = time.perf_counter()
        spark = spark_session(a.master, driver_memory=a.driver_memory)
        res["spark_start_s"] = time.perf_counter() - t
        runs = []
        try:
            for i in range(a.repeat):
                t = time.perf_counter()
                rep = run_audit(tmp, spark=spark)
                wall = time.perf_counter() - t
                ph = rep["timing_s"]
                runs.append({"wall_s": wall, "phases_s": ph,
                             "overlap_gap_s": ph.get("carry_pass", 0) + ph.get("main_pass", 0)
                             + ph.get("block_results", 0),
                             "overlaps": rep["checks"]["overlaps"]["count"], "gaps": rep["gaps"]["count"],
                             "wasted_ids": rep["gaps"]["wasted_ids"], "blocks": rep["blocks"]["issued"],
                             "valid": rep["valid"], "spark": rep["spark"]})
                log(f"spark run {i + 1}: {wall:.2f} s ({ph})")
        finally:
            spark.stop()
        res["spark_runs"] = runs
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    npy = res["numpy"]
    first, best = runs[0], min(runs, key=lambda r: r["wall_s"])
    res["ratio_first_run"] = first["wall_s"] / npy["total_s"]
    res["ratio_best_run"] = best["wall_s"] / npy["total_s"]
    res["ratio_overlap_gap_passes"] = best["overlap_gap_s"] / npy["total_s"]
    res["agree"] = all((r["overlaps"], r["gaps"], r["wasted_ids"], r["blocks"])
                       == (npy["overlaps"], npy["gaps"], npy["wasted_ids"], npy["blocks"]) for r in runs)
    res["found_injected"] = npy["overlaps"] == res["injected"]["overlaps"]
    res["finished_at"] = utc_now()
    return res


def print_results(res: dict) -> None:
    npy = res["numpy"]
    rows = [["numpy (1 process)", f"{npy['total_s']:.2f}", "-", npy["overlaps"], npy["gaps"], npy["wasted_ids"]]]
    for i, r in enumerate(res["spark_runs"]):
        rows.append([f"spark {res['params']['master']} run {i + 1}", f"{r['wall_s']:.2f}", f"{r['overlap_gap_s']:.2f}",
                     r["overlaps"], r["gaps"], r["wasted_ids"]])
    print(table(f"audit of {res['params']['blocks']:,} blocks ({res['input_bytes'] / 2**20:.0f} MiB Parquet); "
                f"Spark session start {res['spark_start_s']:.1f} s",
                ["", "total s", "overlap+gap passes s", "overlaps", "gaps", "wasted IDs"], rows))
    print(f"ratio spark/numpy: first run {res['ratio_first_run']:.1f}x, best run {res['ratio_best_run']:.1f}x, "
          f"overlap+gap passes only {res['ratio_overlap_gap_passes']:.1f}x")
    print(f"injected overlaps {res['injected']['overlaps']} ({res['injected']['nested']} nested, "
          f"{res['injected']['identical']} identical): numpy found {npy['overlaps']}; "
          f"spark and numpy agree: {res['agree']}")


def main(argv=None, prog: str | None = None) -> int:
    ap = parser(prog, __doc__)
    ap.add_argument("--quick", action="store_true", help="1,000,000 blocks")
    ap.add_argument("--blocks", type=int, help="blocks to generate (default 10,000,000)")
    ap.add_argument("--parts", type=int, default=8, help="Parquet files")
    ap.add_argument("--inject", type=int, default=20, help="overlapping blocks to inject")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument("--repeat", type=int, default=2, help="Spark runs in one session")
    ap.add_argument("--json", default="bench-results/audit.json", help="where to write the results")
    ap.add_argument("--keep", metavar="DIR", help="generate into DIR and keep it")
    a = ap.parse_args(argv)
    quick_defaults(a, {"blocks": (10_000_000, 1_000_000)})
    res = run(a)
    write_json(res, a.json)
    print_results(res)
    print(f"results: {a.json}")
    return 0 if res["agree"] and res["found_injected"] else 1


if __name__ == "__main__":
    sys.exit(main())
