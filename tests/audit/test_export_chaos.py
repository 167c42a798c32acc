"""chaos.audit.export of chaos histories: hand-written run directories, a real short chaos run, and the
printed speed of exporting a million generate ops."""
from __future__ import annotations

import asyncio
import os
import time

import pyarrow.parquet as pq

from chaos.audit.export import export
from chaos.audit.manifest import table_files
from chaos.audit.schemas import CHAOS_ALLOCATE_SCHEMA, CHAOS_GENERATE_SCHEMA
from chaos.history import read_history
from chaos.runner import RunConfig, run
from chaos.workload import WorkloadConfig
from tests.audit.export_sources import (
    check_source_matches_audits, expected_chaos, read_table, rows_of, write_chaos_dir,
)


# --------------------------------------------------------------------------- chaos histories

def test_export_of_a_chaos_dir(tmp_path):
    run_dir = write_chaos_dir(str(tmp_path / "chaos-kill-leader-3"))
    out = str(tmp_path / "out")
    m = export(run_dir, out)
    (s,) = m["sources"]
    assert (s["name"], s["kind"], s["slug"]) == ("chaos-kill-leader-3", "chaos", "chaos-kill-leader-3")
    alloc, gen = expected_chaos(s["name"], os.path.join(run_dir, "history.jsonl"))
    assert len(alloc) == 8 and len(gen) == 50
    assert rows_of(out, "chaos/allocate/part-chaos-kill-leader-3.parquet") == alloc
    assert rows_of(out, "chaos/generate/part-chaos-kill-leader-3.parquet") == gen
    assert read_table(out, "chaos/allocate/part-chaos-kill-leader-3.parquet").schema.equals(CHAOS_ALLOCATE_SCHEMA)
    assert read_table(out, "chaos/generate/part-chaos-kill-leader-3.parquet").schema.equals(CHAOS_GENERATE_SCHEMA)
    c = s["counts"]
    assert (c["history_ops"], c["allocate_ok"], c["generate_ok"]) == (
        len(read_history(os.path.join(run_dir, "history.jsonl"))), 8, 50)
    check_source_matches_audits(out, m, s["name"], [
        (1, os.path.join(run_dir, "cluster", "node-1", "audit.log")),
        (3, os.path.join(run_dir, "cluster", "node-3", "audit.log"))])


def test_small_row_groups_split_the_tables_without_changing_them(tmp_path):
    run_dir = write_chaos_dir(str(tmp_path / "run"), generates=1000, with_audit=False)
    out = str(tmp_path / "out")
    export(run_dir, out, row_group_rows=64)
    f = pq.ParquetFile(os.path.join(out, "chaos", "generate", "part-run.parquet"))
    assert f.metadata.num_row_groups == 16 and f.metadata.num_rows == 1000
    assert rows_of(out, "chaos/generate/part-run.parquet") == expected_chaos("run", os.path.join(
        run_dir, "history.jsonl"))[1]


def test_a_chaos_dir_without_generates_still_has_both_chaos_tables(tmp_path):
    run_dir = write_chaos_dir(str(tmp_path / "run"), generates=0, with_audit=False)
    out = str(tmp_path / "out")
    m = export(run_dir, out)
    assert m["tables"]["chaos/generate/part-run.parquet"]["rows"] == 0
    assert read_table(out, "chaos/generate/part-run.parquet").schema.equals(CHAOS_GENERATE_SCHEMA)
    assert m["sources"][0]["counts"]["nodes"] == 0  # a passing run keeps no audit trails
    assert not any(rel.startswith("records/") for rel in m["tables"])


def test_a_real_short_chaos_run(tmp_path):
    run_dir = str(tmp_path / "runs" / "kill-leader")
    cfg = RunConfig(scenario="kill-leader", duration_s=8, seed=5, out_dir=run_dir, interval_s=(2.0, 2.5),
                    hold_s=(0.3, 0.6), keep_data=True,
                    workload=WorkloadConfig(brokers=2, block_rate=20, pid_managers=1, pid_rate=300))
    assert asyncio.run(run(cfg)).valid
    out = str(tmp_path / "out")
    m = export(str(tmp_path / "runs"), out)
    (s,) = m["sources"]
    assert (s["name"], s["kind"], s["counts"]["nodes"]) == ("kill-leader", "chaos", 3)
    alloc, gen = expected_chaos("kill-leader", os.path.join(run_dir, "history.jsonl"))
    assert len(alloc) >= 5 and len(gen) >= 100  # a loaded machine does less in 8 s; the export must match whatever ran
    assert rows_of(out, "chaos/allocate/part-kill-leader.parquet") == alloc
    assert rows_of(out, "chaos/generate/part-kill-leader.parquet") == gen
    check_source_matches_audits(out, m, "kill-leader", [
        (n, os.path.join(run_dir, "cluster", f"node-{n}", "audit.log")) for n in (1, 2, 3)])
    # every block acknowledged in the history was committed: it is in the exported audit trail
    blocks = read_table(out, "records/AllocateProducerIdsRecord/part-kill-leader.parquet").to_pylist()
    committed = {(b["broker_id"], b["producer_id_start"], b["producer_id_len"]) for b in blocks if b["accepted"]}
    assert {(a["broker_id"], a["start"], a["length"]) for a in alloc} <= committed


# --------------------------------------------------------------------------- performance (printed, not asserted)

def write_big_history(path: str, generates: int, block: int = 1000) -> int:
    """The lines a HistoryWriter would write for a manager with 4 clients (faster: no flush per line)."""
    n = t = 0
    with open(path, "w", buffering=1 << 20) as f:
        w = f.write
        for i in range(generates):
            if i % block == 0:
                w(f'{{"index":{n},"time_ns":{t},"process":"pidmgr-101/alloc","type":"invoke","f":"allocate",'
                  f'"value":null,"error":null}}\n')
                w(f'{{"index":{n + 1},"time_ns":{t + 5},"process":"pidmgr-101/alloc","type":"ok","f":"allocate",'
                  f'"value":{{"broker_id":101,"broker_epoch":3,"start":{i},"length":{block}}},"error":null}}\n')
                n, t = n + 2, t + 10
            p = f"pidmgr-101/client-{i % 4}"
            w(f'{{"index":{n},"time_ns":{t},"process":"{p}","type":"invoke","f":"generate","value":null,'
              f'"error":null}}\n')
            w(f'{{"index":{n + 1},"time_ns":{t + 5},"process":"{p}","type":"ok","f":"generate","value":{i},'
              f'"error":null}}\n')
            n, t = n + 2, t + 10
    return n


def test_performance_export_of_a_million_generate_ops(tmp_path, capsys):
    run_dir = tmp_path / "src" / "big-run"
    run_dir.mkdir(parents=True)
    lines = write_big_history(str(run_dir / "history.jsonl"), 1_000_000)
    out = str(tmp_path / "out")
    t0 = time.perf_counter()
    m = export(str(tmp_path / "src"), out)
    elapsed = time.perf_counter() - t0
    c = m["sources"][0]["counts"]
    assert (c["history_ops"], c["generate_ok"], c["allocate_ok"]) == (lines, 1_000_000, 1000)
    f = pq.ParquetFile(os.path.join(out, "chaos", "generate", "part-big-run.parquet"))
    assert f.metadata.num_rows == 1_000_000 and f.metadata.num_row_groups == 4
    pids = f.read(columns=["pid"]).column("pid")
    assert pids[0].as_py() == 0 and pids[-1].as_py() == 999_999
    rows = sum(t["rows"] for t in m["tables"].values())
    with capsys.disabled():
        print(f"\naudit export: {lines:,} history lines -> {rows:,} rows in {elapsed:.2f}s "
              f"({rows / elapsed:,.0f} rows/s, {lines / elapsed:,.0f} lines/s; "
              f"{os.path.getsize(run_dir / 'history.jsonl') / 1e6:.0f} MB of JSON -> "
              f"{sum(os.path.getsize(p) for p in table_files(out, m, 'chaos/generate')) / 1e6:.1f} MB Parquet)")
