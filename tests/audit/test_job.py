"""chaos.audit.job / `pidctl audit run`: the Spark audit finds exactly what was injected, and refuses bad input.

Every Spark test is in this file and shares one local[2] session (tests/audit/conftest.py).
Inputs are written here with pyarrow in the exporter's layout and schemas
(``chaos.audit.schemas.arrow_schema`` and the chaos schemas), and once through the real
exporter from audit trails and a chaos history.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from chaos.audit.buckets import Buckets, plan_buckets
from chaos.audit.export import export
from chaos.audit.inputs import AuditInputError
from chaos.audit.job import run_audit
from chaos.audit.schemas import CHAOS_ALLOCATE_SCHEMA, CHAOS_GENERATE_SCHEMA, arrow_schema
from chaos.history import HistoryWriter, Op
from cli.common import EXIT_ANOMALY, EXIT_ERROR, EXIT_OK
from cli.main import cli
from quorum.managers import ApplyOutcome
from quorum.trail import AuditWriter
from records import AllocateProducerIdsRecord, ProducerIdSeedRecord, RegisterBrokerRecord
from records.schema import BY_NAME, LONG_MAX
from tests.conftest import wait_for

pytestmark = pytest.mark.xdist_group("spark")

A, SEED, REG = "AllocateProducerIdsRecord", "ProducerIdSeedRecord", "RegisterBrokerRecord"
T0 = 1_700_000_040_000  # a minute boundary
MIN = 60_000
PNG = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- writing exports

def write_export(d, sources: dict[str, dict], nodes=(1, 2, 3)) -> str:
    """An export directory.  sources: name -> {"records": {RecordName: [row]}, "allocate": [...],
    "generate": [...]}.  A record row holds the record's fields plus raft_index (and optionally position,
    refused_on: nodes that refused it); each node in ``nodes`` gets a copy."""
    d = str(d)
    tables = {}
    for src, spec in sources.items():
        for name, rows in spec.get("records", {}).items():
            schema = arrow_schema(BY_NAME[name])
            full = []
            for r in rows:
                for n in nodes:
                    refused = n in r.get("refused_on", ())
                    row = {"source": src, "node_id": n, "raft_term": 1, "position": 0, "accepted": not refused,
                           "error": "refused: test" if refused else None}
                    row.update({k: v for k, v in r.items() if k != "refused_on"})
                    full.append(row)
            tables[_write(d, f"records/{name}/part-{src}.parquet", pa.Table.from_pylist(full, schema=schema))] = len(full)
        for table, schema in (("allocate", CHAOS_ALLOCATE_SCHEMA), ("generate", CHAOS_GENERATE_SCHEMA)):
            if table in spec:
                rows = [{"source": src, "process": r.get("process", "broker-1"),
                         "owner": r.get("process", "broker-1").split("/")[0], "index": i, "time_ns": i * 1000,
                         **{k: v for k, v in r.items() if k != "process"}} for i, r in enumerate(spec[table])]
                tables[_write(d, f"chaos/{table}/part-{src}.parquet", pa.Table.from_pylist(rows, schema=schema))] = len(rows)
    manifest = {"format": 1, "sources": [{"name": s, **({"kind": v["kind"]} if "kind" in v else {})}
                                         for s, v in sources.items()],
                "tables": {rel: {"rows": n, "schema": []} for rel, n in tables.items()}}
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return d


def _write(d: str, rel: str, table: pa.Table) -> str:
    path = os.path.join(d, *rel.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)
    return rel


def blk(raft_index, start, length, broker=1, epoch=1, ts=T0, **kw):
    return {"raft_index": raft_index, "broker_id": broker, "broker_epoch": epoch, "producer_id_start": start,
            "producer_id_len": length, "timestamp_ms": ts, **kw}


def seed(raft_index, zk_start, zk_end, ts=T0):
    return {"raft_index": raft_index, "next_producer_id": zk_end + 1, "origin": "export:zk.json", "zk_broker": 0,
            "zk_block_start": zk_start, "zk_block_end": zk_end, "timestamp_ms": ts}


def reg(raft_index, broker, epoch, ts=T0):
    return {"raft_index": raft_index, "broker_id": broker, "incarnation_id": f"inc-{epoch}", "broker_epoch": epoch,
            "listener": "127.0.0.1:9092", "timestamp_ms": ts}


def clean_sources() -> dict:
    """A cluster migrated from ZooKeeper ([0, 999]), 40 contiguous blocks from 1,000 over 40 minutes by
    brokers 1-4, one refused (stale) record; a chaos run exported with its cluster's audit trail (every
    acknowledged block is also a record), unique PIDs."""
    regs = [reg(i + 2, b, 10 + b) for i, b in enumerate((1, 2, 3, 4))]
    blocks = [blk(10 + i, 1000 + 100 * i, 100, broker=1 + i % 4, epoch=11 + i % 4, ts=T0 + i * MIN)
              for i in range(40)]
    blocks.append(blk(60, 1000, 100, broker=1, epoch=3, refused_on=(1, 2, 3)))  # stale epoch: refused
    chaos_blocks = [blk(5 + i, 100 * i, 100, broker=1, epoch=2) for i in range(5)]
    return {
        "prod": {"records": {SEED: [seed(1, 0, 999)], REG: regs, A: blocks}},
        "chaos-run": {"records": {A: chaos_blocks},
                      "allocate": [{"broker_id": 1, "broker_epoch": 2, "start": 100 * i, "length": 100}
                                   for i in range(5)],
                      "generate": [{"pid": p, "process": f"pidmgr-1/client-{p % 2}"} for p in range(50)]},
    }


# Injected problems (source "prod" unless said otherwise), and what the job must report.
DIRTY_OVERLAPS = {  # (source, start, raft index or op index) of the later block -> start of the block it overlaps
    ("prod", 900, 2): 0,          # first block after the seed starts inside the ZooKeeper block (KAFKA-15552)
    ("prod", 1150, 5): 1100,      # partial
    ("prod", 1300, 7): 1250,      # nested in [1250, 2250)
    ("prod", 1400, 8): 1250,      # nested too, after a smaller nested block (a previous-row check misses it)
    ("prod", 2250, 10): 2250,     # identical copy under a new Raft index
    ("prod", 14_000_000, 13): 10_000_000,  # nested in a huge block that starts several buckets earlier
    ("chaos-run", 100, 3): 100,   # a block acknowledged twice in a chaos run (op #3)
}
DIRTY_GAPS = [("prod", 2350, 3000, 650), ("prod", 3100, 10_000_000, 10_000_000 - 3100)]


def dirty_sources() -> dict:
    blocks = [
        blk(2, 900, 100), blk(3, 1000, 100), blk(4, 1100, 100), blk(5, 1150, 100), blk(6, 1250, 1000),
        blk(7, 1300, 10), blk(8, 1400, 10), blk(9, 2250, 100), blk(10, 2250, 100), blk(11, 3000, 100),
        blk(12, 10_000_000, 5_000_000), blk(13, 14_000_000, 100), blk(14, 15_000_000, 100),
        blk(15, 1000, 100, refused_on=(1, 2, 3)),              # refused everywhere: not issued
        blk(16, 15_000_100, 100, refused_on=(3,)),             # node 3 disagrees: issued, reported
    ]
    for i, b in enumerate(blocks):  # brokers 1-3, one block a minute each
        b["broker_id"] = 1 + i % 3
        b["timestamp_ms"] = T0 + i * MIN
    # Broker 7 in a restart loop: 5 registrations and 12 blocks under 5 epochs, all in one minute.
    regs = [reg(17 + i, 7, 100 + i, ts=T0 + 30 * MIN + i * 1000) for i in range(5)]
    regs += [reg(40 + b, b, 50 + b) for b in (1, 2, 3)]
    blocks += [blk(22 + i, 15_000_200 + 100 * i, 100, broker=7, epoch=100 + i % 5, ts=T0 + 30 * MIN + 5000 + i)
               for i in range(12)]
    return {
        "prod": {"records": {SEED: [seed(1, 0, 999)], REG: regs, A: blocks}},
        "chaos-run": {"records": {A: [blk(1, 0, 100), blk(2, 100, 100), blk(3, 200, 100)]},
                      "allocate": [{"broker_id": 1, "broker_epoch": 1, "start": s, "length": 100}
                                   for s in (0, 100, 200, 100)],
                      "generate": [{"pid": p} for p in list(range(10)) + [5, 7, 7]]},
    }


def brute_force_overlaps(blocks: list[tuple[int, int]]) -> int:
    """Blocks ([start, end)) that overlap some block at or before them in (start, end) order: O(n**2)."""
    s = sorted(blocks)
    return sum(1 for j in range(len(s)) if any(s[i][0] < s[j][1] and s[j][0] < s[i][1] for i in range(j)))


def found_overlaps(report) -> dict:
    out = {}
    for e in report["checks"]["overlaps"]["examples"]:
        b = e["block"]
        out[(e["source"], b["start"], b.get("raft_index", b.get("op_index")))] = e["overlaps"]["start"]
    return out


# --------------------------------------------------------------------------- the checks

def test_clean_history_is_valid_and_reports_rates_projection_and_charts(spark, tmp_path):
    d = write_export(tmp_path / "in", clean_sources())
    out = tmp_path / "out"
    r = run_audit(d, spark=spark, out_dir=str(out), buckets=8)
    assert r["valid"] and r["complete"]
    assert r["violations"] == {"overlaps": 0, "duplicate_pids": 0, "migration_boundary": 0}
    assert r["gaps"]["count"] == 0 and r["gaps"]["wasted_ids"] == 0
    assert r["blocks"]["by_kind"] == {"quorum": {"blocks": 45, "ids": 4500}, "zookeeper": {"blocks": 1, "ids": 1000}}
    assert r["blocks"]["refused_records"] == 1
    assert r["blocks"]["chaos_acks_matched"] == 5  # the chaos run's acknowledgements are its records, not copies
    assert r["checks"]["node_disagreements"]["count"] == 0
    assert r["checks"]["duplicate_pids"] == {"count": 0, "pids_checked": 50, "extra_issues": 0, "examples": []}
    mb = r["checks"]["migration_boundary"]
    assert mb["count"] == 0 and mb["seeds"] == 1 and mb["checked"][0]["first_block"]["start"] == 1000
    # Brokers per source: 4 in prod, broker 1 of the chaos run's cluster.
    assert r["brokers"]["restart_loops"]["count"] == 0 and r["brokers"]["count"] == 5
    b1 = next(b for b in r["brokers"]["per_broker"] if (b["source"], b["broker_id"]) == ("prod", 1))
    assert (b1["blocks"], b1["ids"], b1["windows"], b1["registrations"]) == (10, 1000, 10, 1)
    prod = r["id_space"]["prod"]
    assert (prod["first_id"], prod["next_id"], prod["blocks"]) == (0, 5000, 41)
    # 4,000 IDs in the 40 one-minute windows: 100 IDs a minute.
    assert prod["rate_ids_per_s"] == pytest.approx(4000 / (40 * 60))
    assert prod["remaining_ids"] == LONG_MAX - 5000
    assert prod["exhausted_in_years"] == pytest.approx((LONG_MAX - 5000) / (4000 / 2400) / (365.25 * 86400))
    saved = json.loads((out / "audit.json").read_text())
    assert saved["valid"] and saved["charts"] == [str(out / "broker_rates.png")]
    assert (out / "broker_rates.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize("buckets", [8, 1])
def test_dirty_history_finds_exactly_the_injected_problems(spark, tmp_path, buckets):
    d = write_export(tmp_path / "in", dirty_sources())
    r = run_audit(d, spark=spark, buckets=buckets, examples=50)
    assert not r["valid"]
    assert r["spark"]["buckets"] == buckets
    ov = r["checks"]["overlaps"]
    assert ov["count"] == len(DIRTY_OVERLAPS)
    assert found_overlaps(r) == DIRTY_OVERLAPS
    # The same count as an O(n**2) comparison of every pair of issued blocks of "prod".
    issued = [(0, 1000)] + [(b["producer_id_start"], b["producer_id_start"] + b["producer_id_len"])
                            for b in dirty_sources()["prod"]["records"][A] if set(b.get("refused_on", ())) != {1, 2, 3}]
    assert brute_force_overlaps(issued) == sum(1 for k in DIRTY_OVERLAPS if k[0] == "prod")
    assert ov["ids_reissued"] == 100 + 50 + 10 + 10 + 100 + 100 + 100
    chaos = next(e for e in ov["examples"] if e["source"] == "chaos-run")
    assert chaos["block"]["kind"] == "chaos" and chaos["block"]["process"] == "broker-1"

    gaps = r["gaps"]
    assert [(e["source"], e["from"], e["to"], e["wasted_ids"]) for e in gaps["examples"]] == DIRTY_GAPS
    assert gaps["count"] == 2 and gaps["wasted_ids"] == sum(g[3] for g in DIRTY_GAPS)

    mb = r["checks"]["migration_boundary"]
    assert mb["count"] == 1 and mb["examples"][0]["first_block"]["start"] == 900
    assert mb["examples"][0]["zk_block_end"] == 999

    dup = r["checks"]["duplicate_pids"]
    assert dup["count"] == 2 and dup["extra_issues"] == 3 and dup["pids_checked"] == 13
    assert [(e["pid"], e["times"]) for e in dup["examples"]] == [(5, 2), (7, 3)]

    nd = r["checks"]["node_disagreements"]
    assert nd["count"] == 1 and nd["examples"][0]["raft_index"] == 16
    assert [n["accepted"] for n in nd["examples"][0]["nodes"]] == [True, True, False]
    assert r["blocks"]["refused_records"] == 1
    assert r["blocks"]["chaos_acks_matched"] == 3

    loops = r["brokers"]["restart_loops"]
    assert [(e["source"], e["broker_id"]) for e in loops["examples"]] == [("prod", 7)]
    reasons = " / ".join(loops["examples"][0]["reasons"])
    assert "5 registrations in one window" in reasons and "5 broker epochs" in reasons and "12 blocks" in reasons
    assert r["violations"] == {"overlaps": 7, "duplicate_pids": 2, "migration_boundary": 1}


def test_buckets_are_monotonic_and_balance_a_skewed_id_space():
    pieces = [(0, 1_000_000, 1_000_000), (2**62, 2**62 + 10, 10)]  # almost everything near 0, a few far up
    b = plan_buckets(pieces, 1_000_010, buckets=64)
    xs = sorted({0, 1, 999_999, 1_000_000, 2**62, 2**62 + 10, LONG_MAX - 1} | set(range(0, 1_000_001, 9973)))
    got = [b.of(x) for x in xs]
    assert got == sorted(got) and got[0] == 0 and got[-1] < b.count
    near = {b.of(x) for x in range(0, 1_000_001, 997)}
    assert len(near) >= 48  # the dense part is spread over most buckets, not one
    assert Buckets((0,), (1,), 1).of(12345) == 0


# --------------------------------------------------------------------------- through the real exporter

def test_end_to_end_through_the_exporter(spark, tmp_path):
    """Audit trails of a 3-node cluster and a chaos run (history + its cluster), exported by
    `chaos.audit.export`, then audited: the chaos run's double acknowledgement is the only overlap."""
    data = tmp_path / "data"
    cluster = data / "prod"
    for node in (1, 2, 3):
        (cluster / f"node-{node}").mkdir(parents=True)
        w = AuditWriter(str(cluster / f"node-{node}" / "audit.log"))
        w.append(1, 1, [ApplyOutcome(ProducerIdSeedRecord(next_producer_id=1000, origin="export:zk.json",
                                                          zk_broker=0, zk_block_start=0, zk_block_end=999))])
        w.append(2, 1, [ApplyOutcome(RegisterBrokerRecord(broker_id=1, incarnation_id="a", broker_epoch=1,
                                                          timestamp_ms=T0))])
        for i in range(20):
            w.append(3 + i, 1, [ApplyOutcome(AllocateProducerIdsRecord(
                broker_id=1, broker_epoch=1, producer_id_start=1000 + 1000 * i, producer_id_len=1000,
                timestamp_ms=T0 + i * 1000))])
        w.close()
    run = data / "chaos-1"
    (run / "cluster" / "node-1").mkdir(parents=True)
    w = AuditWriter(str(run / "cluster" / "node-1" / "audit.log"))
    t = 0
    with HistoryWriter(str(run / "history.jsonl")) as h:
        for i, start in enumerate((0, 1000, 2000, 1000)):  # the last one acknowledges [1000, 2000) again
            if i < 3:
                w.append(1 + i, 1, [ApplyOutcome(AllocateProducerIdsRecord(
                    broker_id=1, broker_epoch=2, producer_id_start=start, producer_id_len=1000))])
            h.append(Op("broker-1", "invoke", "allocate", None, t := t + 10))
            h.append(Op("broker-1", "ok", "allocate", {"broker_id": 1, "broker_epoch": 2, "start": start,
                                                       "length": 1000}, t := t + 10))
        for pid in range(30):
            h.append(Op("pidmgr-1/client-0", "invoke", "generate", None, t := t + 10))
            h.append(Op("pidmgr-1/client-0", "ok", "generate", pid, t := t + 10))
    w.close()
    out = tmp_path / "export"
    export(str(data), str(out))
    r = run_audit(str(out), spark=spark)
    assert r["violations"] == {"overlaps": 1, "duplicate_pids": 0, "migration_boundary": 0}
    (e,) = r["checks"]["overlaps"]["examples"]
    assert e["source"] == "chaos-1" and e["block"]["kind"] == "chaos" and e["block"]["start"] == 1000
    assert r["blocks"]["by_kind"] == {"quorum": {"blocks": 23, "ids": 23000}, "zookeeper": {"blocks": 1, "ids": 1000},
                                      "chaos": {"blocks": 1, "ids": 1000}}  # the second acknowledgement
    assert r["blocks"]["chaos_acks_matched"] == 3
    assert r["checks"]["migration_boundary"]["checked"][0]["first_block"]["start"] == 1000
    assert r["checks"]["duplicate_pids"]["pids_checked"] == 30
    assert r["gaps"]["count"] == 0 and r["id_space"]["prod"]["next_id"] == 21000


def test_chaos_histories_alone(spark, tmp_path):
    """A passing chaos run keeps no audit trail: only its history is exported.  No timed quorum block,
    so no rates or projection, and the blocks and PIDs are still checked."""
    d = write_export(tmp_path / "in", {"run-1": {
        "allocate": [{"broker_id": 1, "broker_epoch": 1, "start": s, "length": 10} for s in (0, 10, 30)],
        "generate": [{"pid": p} for p in range(20)]}})
    r = run_audit(d, spark=spark)
    assert r["valid"] and r["blocks"]["by_kind"] == {"chaos": {"blocks": 3, "ids": 30}}
    assert [(g["from"], g["to"]) for g in r["gaps"]["examples"]] == [(20, 30)]
    assert r["brokers"]["count"] == 0 and "rate_ids_per_s" not in r["id_space"]["run-1"]
    assert r["id_space"]["run-1"]["exhausted_in_years"] is None


def test_node_sources_of_one_cluster_are_one_id_space(spark, tmp_path):
    """Data directories copied from two hosts of one cluster: the records both hold are one block each,
    and a block only host-b holds overlaps one only host-a holds -- found only across sources.  A chaos
    run stays its own ID space (it starts at 0 too)."""
    common = [seed(1, 0, 999)] + [blk(2 + i, 1000 + 100 * i, 100, ts=T0 + i * MIN) for i in range(3)]
    d = write_export(tmp_path / "in", {
        "host-a": {"kind": "node", "records": {SEED: common[:1], A: common[1:]}},
        "host-b": {"kind": "node", "records": {SEED: common[:1], A: common[1:3] + [blk(5, 1250, 100)]}},
        "chaos-x": {"kind": "chaos", "allocate": [{"broker_id": 1, "broker_epoch": 1, "start": s, "length": 100}
                                                  for s in (0, 100)]}})
    r = run_audit(d, spark=spark, examples=50)
    assert r["id_spaces"]["spaces"] == {"chaos-x": ["chaos-x"], "cluster": ["host-a", "host-b"]}
    assert r["blocks"]["by_kind"]["quorum"] == {"blocks": 4, "ids": 400}  # not 6: copies are one block
    assert found_overlaps(r) == {("cluster", 1250, 5): 1200} and r["checks"]["overlaps"]["count"] == 1
    assert r["checks"]["migration_boundary"]["count"] == 0 and not r["valid"]

    per = run_audit(d, spark=spark, id_spaces="source")  # --per-source: each directory alone looks clean
    assert per["id_spaces"]["spaces"] == {s: [s] for s in ("chaos-x", "host-a", "host-b")}
    assert per["valid"] and per["checks"]["overlaps"]["count"] == 0
    one = write_export(tmp_path / "one", {"host-a": {"kind": "node", "records": {SEED: common[:1], A: common[1:]}},
                                          "chaos-x": {"kind": "chaos", "allocate": [
                                              {"broker_id": 1, "broker_epoch": 1, "start": 0, "length": 100}]}})
    r1 = run_audit(one, spark=spark)
    assert r1["valid"] and r1["id_spaces"]["spaces"] == {"chaos-x": ["chaos-x"], "host-a": ["host-a"]}


# --------------------------------------------------------------------------- spark-submit on a cluster

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(600)
def test_spark_submit_on_a_standalone_cluster(tmp_path, java_home):
    """The job as an operator runs it on a cluster: a Spark standalone master and one worker (separate
    JVMs, from the pyspark package), `spark-submit --master spark://... cli/audit.py`; the report names
    the cluster's master and finds the injected problems; exit 5."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    env = dict(os.environ, JAVA_HOME=java_home, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, SPARK_LOG_DIR=str(tmp_path / "logs"),
               SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs = []

    def start(name, *args):
        log = open(tmp_path / f"{name}.log", "wb")
        procs.append(subprocess.Popen([os.path.join(home, "bin", "spark-class"), *args], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True))
        return tmp_path / f"{name}.log"

    def logged(path, text):
        return text in path.read_text(errors="replace")

    try:
        mlog = start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                     "--webui-port", "0")
        wait_for(lambda: logged(mlog, "I have been elected leader"), timeout=120, what="Spark master up")
        start("worker", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1",
              "--memory", "1g", "--webui-port", "0", "--work-dir", str(tmp_path / "work"))
        wait_for(lambda: logged(mlog, "Registering worker"), timeout=120, what="Spark worker registered")
        d = write_export(tmp_path / "in", dirty_sources())
        job = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "cli", "audit.py")
        res = subprocess.run([os.path.join(home, "bin", "spark-submit"), "--master", url,
                              "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false",
                              "--executor-memory", "512m", "--driver-memory", "1g", job,
                              "--input", d, "--out", str(tmp_path / "out"), "--json"],
                             env=env, capture_output=True, text=True, timeout=450)
        assert res.returncode == 5, res.stderr[-3000:]
        r = json.loads(res.stdout)
        assert r["spark"]["master"] == url and r["complete"]
        assert r["violations"] == {"overlaps": 7, "duplicate_pids": 2, "migration_boundary": 1}
        assert found_overlaps(r) == DIRTY_OVERLAPS
        assert json.loads((tmp_path / "out" / "audit.json").read_text())["violations"] == r["violations"]
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


# --------------------------------------------------------------------------- pidctl audit run

def test_cli_exit_codes_json_and_summary(spark, tmp_path):
    clean = write_export(tmp_path / "clean", clean_sources())
    dirty = write_export(tmp_path / "dirty", dirty_sources())
    runner = CliRunner()
    res = runner.invoke(cli, ["audit", "run", "--input", dirty, "--out", str(tmp_path / "o1"), "-o", "json"])
    assert res.exit_code == EXIT_ANOMALY, res.output
    rep = json.loads(res.output)
    assert rep["valid"] is False and rep["violations"]["overlaps"] == 7
    res = runner.invoke(cli, ["audit", "run", "--input", clean, "--out", str(tmp_path / "o2")])
    assert res.exit_code == EXIT_OK, res.output
    assert "VALID" in res.output and "no ID issued twice" in res.output
    assert spark.sparkContext._jsc is not None  # the CLI used the active session and left it running


# --------------------------------------------------------------------------- bad input

def _good(tmp_path) -> str:
    return write_export(tmp_path / "in", {"prod": {"records": {A: [blk(1, 0, 100), blk(2, 100, 100)]}}}, nodes=(1,))


def _rewrite(d: str, rel: str, fn) -> None:
    path = os.path.join(d, *rel.split("/"))
    pq.write_table(fn(pq.read_table(path)), path)


def _set(table: pa.Table, col: str, values, typ=None) -> pa.Table:
    i = table.schema.get_field_index(col)
    return table.set_column(i, pa.field(col, typ or table.schema.field(col).type), pa.array(values, typ or
                                                                                            table.schema.field(col).type))


PART = f"records/{A}/part-prod.parquet"
BAD = {
    "missing": (lambda d: shutil.rmtree(d), None, "no such directory"),
    "empty": (lambda d: [shutil.rmtree(os.path.join(d, x)) if os.path.isdir(os.path.join(d, x))
                         else os.remove(os.path.join(d, x)) for x in os.listdir(d)], None, "empty directory"),
    "no manifest": (lambda d: os.remove(os.path.join(d, "manifest.json")), None, "no manifest.json"),
    "wrong type": (lambda d: _rewrite(d, PART, lambda t: _set(t, "producer_id_start", ["0", "100"], pa.string())),
                   "producer_id_start", "type string, expected int64"),
    "missing column": (lambda d: _rewrite(d, PART, lambda t: t.drop(["producer_id_len"])), "producer_id_len",
                       "missing"),
    "negative": (lambda d: _rewrite(d, PART, lambda t: _set(t, "producer_id_start", [0, -5])), "producer_id_start",
                 "negative producer ID (row 1: -5)"),
    "overflow": (lambda d: _rewrite(d, PART, lambda t: _set(t, "producer_id_start", [0, LONG_MAX - 10])),
                 "producer_id_start", "block end overflows int64"),
    "length 0": (lambda d: _rewrite(d, PART, lambda t: _set(t, "producer_id_len", [100, 0])), "producer_id_len",
                 "block length below 1"),
    "rows missing": (lambda d: _rewrite(d, PART, lambda t: t.slice(0, 1)), None, "manifest.json lists 2 rows, "
                                                                                 "the files hold 1"),
    "not parquet": (lambda d: open(os.path.join(d, *PART.split("/")), "wb").write(b"not parquet"), None,
                    "not a readable Parquet file"),
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_input_is_refused_naming_the_file_and_column(tmp_path, kind):
    d = _good(tmp_path)
    damage, column, words = BAD[kind]
    damage(d)
    out = tmp_path / "out"
    out.mkdir()
    (out / "audit.json").write_text('{"valid": true}')  # a previous report must not survive a failed run
    with pytest.raises(AuditInputError) as e:
        run_audit(d, out_dir=str(out))  # fails before Spark starts
    msg = str(e.value)
    assert words in msg
    if column:
        assert e.value.column == column and f"column {column}" in msg and PART in msg
    assert not (out / "audit.json").exists()
    res = CliRunner().invoke(cli, ["audit", "run", "--input", d, "--out", str(out)])
    assert res.exit_code == EXIT_ERROR
    assert words in res.output and "Traceback" not in res.output


def test_bad_values_in_seeds_and_chaos_tables(tmp_path):
    d = write_export(tmp_path / "a", {"prod": {"records": {SEED: [seed(1, 500, 100)]}}})
    with pytest.raises(AuditInputError, match="zk_block_end below zk_block_start") as e:
        run_audit(d)
    assert e.value.column == "zk_block_end"
    d = write_export(tmp_path / "b", {"c": {"generate": [{"pid": 1}, {"pid": -2}]}})
    with pytest.raises(AuditInputError, match=r"chaos/generate/part-c.parquet: column pid: negative producer ID"):
        run_audit(d)
    d = write_export(tmp_path / "c", {"c": {"allocate": [{"broker_id": 1, "broker_epoch": 1, "start": LONG_MAX - 5,
                                                          "length": 10}]}})
    with pytest.raises(AuditInputError, match="start: block end overflows"):
        run_audit(d)
    d = write_export(tmp_path / "d", {"c": {"generate": []}})
    with pytest.raises(AuditInputError, match="nothing to audit"):
        run_audit(d)


# --------------------------------------------------------------------------- the migration boundary, every block

def demo_then_migrated() -> dict:
    """Issue 38: a quorum that issued blocks from 0 (`pidctl demo`), then was seeded from a ZooKeeper whose
    block_end is far above them, then issued above it.  Every block after the seed is fine; the three
    before it lie in ZooKeeper's range 0..99,999."""
    blocks = [blk(2 + i, 1000 * i, 1000, ts=T0 + i * MIN) for i in range(3)]
    blocks += [blk(10 + i, 100_000 + 1000 * i, 1000, ts=T0 + (10 + i) * MIN) for i in range(3)]
    return {"prod": {"records": {SEED: [seed(5, 99_000, 99_999)], REG: [reg(1, 1, 1)], A: blocks}}}


def test_every_quorum_block_is_checked_against_zookeepers_range(spark, tmp_path):
    r = run_audit(write_export(tmp_path / "in", demo_then_migrated()), spark=spark, examples=50)
    mb = r["checks"]["migration_boundary"]
    assert not r["valid"] and r["violations"] == {"overlaps": 0, "duplicate_pids": 0, "migration_boundary": 3}
    assert [(e["block"]["start"], e["block"]["raft_index"], e["issued"]) for e in mb["examples"]] == [
        (0, 2, "before the seed"), (1000, 3, "before the seed"), (2000, 4, "before the seed")]
    assert mb["examples"][0]["zk_block_end"] == 99_999 and mb["examples"][0]["seed_raft_index"] == 5
    assert mb["examples"][2]["note"] == ("quorum block [2000, 2999] issued before the seed lies in ZooKeeper's "
                                         "range 0..99999: the quorum was not fresh when seeded")
    # The check that looked only at the first block after the seed found nothing here.
    assert mb["checked"][0]["first_block"]["start"] == 100_000 and mb["checked"][0]["ok"] is False


def test_blocks_between_two_seeds_are_checked_against_the_earlier_one(spark, tmp_path):
    # Seeded fresh, issued, rolled back (ZooKeeper went on above a placeholder), seeded again: every
    # block lies above the seed before it, so nothing is reported ...
    sources = {"prod": {"records": {
        SEED: [seed(1, 0, 999), seed(5, 50_000, 50_999)],
        A: [blk(2, 1000, 1000), blk(3, 2000, 1000), blk(6, 51_000, 1000)]}}}
    r = run_audit(write_export(tmp_path / "ok", sources), spark=spark)
    assert r["valid"] and r["checks"]["migration_boundary"]["count"] == 0
    assert r["checks"]["migration_boundary"]["seeds"] == 2
    # ... but a block after the second seed inside its range is, even when it is not the first after it.
    sources["prod"]["records"][A].append(blk(7, 50_500, 100))
    r = run_audit(write_export(tmp_path / "bad", sources), spark=spark)
    (e,) = r["checks"]["migration_boundary"]["examples"]
    assert (e["block"]["start"], e["issued"], e["zk_block_end"]) == (50_500, "after the seed", 50_999)


def test_cli_reports_an_early_block_in_zookeepers_range_as_an_anomaly(spark, tmp_path):
    d = write_export(tmp_path / "in", demo_then_migrated())
    res = CliRunner().invoke(cli, ["audit", "run", "--input", d, "--out", str(tmp_path / "out")])
    assert res.exit_code == EXIT_ANOMALY, res.output
    assert "INVALID" in res.output and "migration_boundary x3" in res.output
    assert "quorum blocks in ZooKeeper's range: 3 (seeds: 1)" in res.output
    assert "before the seed" in res.output
    res = CliRunner().invoke(cli, ["audit", "run", "--input", d, "--out", str(tmp_path / "out2"), "-o", "json"])
    assert res.exit_code == EXIT_ANOMALY
    assert json.loads(res.output)["violations"]["migration_boundary"] == 3
