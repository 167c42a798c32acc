"""chaos.audit.export / `pidctl audit export`: audit trails and chaos histories as Parquet.

Sources: a real local cluster (register, allocate, fence, transactional id, seed),
node directories written with quorum.trail.AuditWriter (every record type, refused
lines, gaps, a torn tail), hand-written chaos histories (chaos.history.HistoryWriter)
and a short real chaos run.  Schemas are compared field by field with
records.schema; every row is compared with what read_audit / read_history read.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from chaos.audit import export as ex
from chaos.audit.export import ExportError, export
from chaos.audit.manifest import read_manifest, table_files
from chaos.audit.schemas import AUDIT_COLUMNS, CHAOS_ALLOCATE_SCHEMA, CHAOS_GENERATE_SCHEMA, GAP_SCHEMA, arrow_schema
from chaos.history import HistoryError, HistoryWriter, Op, owner, read_history, write_final
from chaos.runner import RunConfig, run
from chaos.workload import WorkloadConfig
from cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from cli.main import cli
from quorum.localcluster import LocalCluster
from quorum.managers import ApplyOutcome
from quorum.trail import AuditWriter, _frame, read_audit
from records import AllocateProducerIdsRecord, AuditEntry, AuditGap
from records.codec import CLASSES, to_obj
from records.schema import AUDIT_ENTRY, AUDIT_GAP, PAYLOADS, RECORDS, TYPES, FieldSpec, RecordSpec
from snapshots.storage.disk import CorruptFileError
from tests.conftest import ClusterHarness, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Written out independently of chaos.audit.export, so a wrong mapping there fails here.
EXPECTED_ARROW = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
                  "bool": pa.bool_(), "string": pa.string(), "nullable_string": pa.string(),
                  "float64": pa.float64()}


def read_table(directory: str, rel: str) -> pa.Table:
    return pq.read_table(os.path.join(directory, *rel.split("/")))


def rows_of(directory: str, rel: str) -> list[dict]:
    return read_table(directory, rel).to_pylist()


def expected_audit_rows(source: str, node_id: int, path: str) -> tuple[dict[str, list[dict]], list[dict]]:
    """What the export must hold for one audit file: rows per record type, and gap rows (file order)."""
    lines, _ = read_audit(path)
    per_type: dict[str, list[dict]] = {}
    gaps = []
    for ln in lines:
        if isinstance(ln.entry, AuditGap):
            gaps.append({"source": source, "node_id": node_id, "raft_index": ln.entry.raft_index})
            continue
        row = {"source": source, "node_id": node_id,
               **{k: v for k, v in ln.entry.to_dict().items() if k != "record"}, **ln.record.to_dict()}
        per_type.setdefault(ln.entry.record, []).append(row)
    return per_type, gaps


def check_source_matches_audits(out: str, manifest: dict, source: str, audits: list[tuple[int, str]]) -> None:
    """Every line of every node's audit file is a row, with every value, and nothing else is."""
    slug = next(s["slug"] for s in manifest["sources"] if s["name"] == source)
    want: dict[str, list[dict]] = {}
    want_gaps: list[dict] = []
    for node_id, path in audits:
        per_type, gaps = expected_audit_rows(source, node_id, path)
        for name, rows in per_type.items():
            want.setdefault(name, []).extend(rows)
        want_gaps += gaps
    got = {rel.split("/")[1]: rel for rel in manifest["tables"]
           if rel.startswith("records/") and rel.endswith(f"/part-{slug}.parquet")}
    assert set(got) == set(want)
    for name, rows in want.items():
        table = read_table(out, got[name])
        assert table.schema.equals(arrow_schema(next(s for s in RECORDS if s.name == name)))
        assert table.to_pylist() == rows
        assert manifest["tables"][got[name]]["rows"] == len(rows)
    gap_rel = f"gaps/part-{slug}.parquet"
    if want_gaps:
        assert rows_of(out, gap_rel) == want_gaps
        assert read_table(out, gap_rel).schema.equals(GAP_SCHEMA)
    else:
        assert gap_rel not in manifest["tables"]


# --------------------------------------------------------------------------- schemas

def test_audit_columns_are_the_audit_entry_fields_after_source_and_node():
    assert [(f.name, f.type, f.nullable) for f in AUDIT_COLUMNS] == [
        ("source", pa.string(), False), ("node_id", pa.int32(), False), ("raft_index", pa.int64(), False),
        ("raft_term", pa.int64(), False), ("position", pa.int32(), False), ("accepted", pa.bool_(), False),
        ("error", pa.string(), True)]
    # ... and they are derived from AuditEntry (all its fields but the record name, which is the table)
    assert [f.name for f in AUDIT_COLUMNS[2:]] == [f.name for f in AUDIT_ENTRY.fields if f.name != "record"]


@pytest.mark.parametrize("spec", RECORDS, ids=lambda s: s.name)
def test_every_record_schema_is_derived_from_records_schema(spec):
    schema = arrow_schema(spec)
    assert list(schema)[:len(AUDIT_COLUMNS)] == list(AUDIT_COLUMNS)
    own = list(schema)[len(AUDIT_COLUMNS):]
    assert [f.name for f in own] == [f.name for f in spec.fields]
    for arrow_f, spec_f in zip(own, spec.fields):
        assert arrow_f.type == EXPECTED_ARROW[spec_f.type], (spec.name, spec_f.name)
        assert arrow_f.nullable == (spec_f.type == "nullable_string"), (spec.name, spec_f.name)


def test_every_schema_type_has_a_mapping_and_clashes_are_refused():
    assert set(ex.FIELD_TYPES) == TYPES
    for spec in PAYLOADS:  # not exported, but the mapping covers them too (error_message: nullable_string)
        if not {f.name for f in spec.fields} & {c.name for c in AUDIT_COLUMNS}:
            arrow_schema(spec)
    bad = RecordSpec("Clash", 999, 0, "x", (FieldSpec("raft_index", "int64", "x"),))
    with pytest.raises(ValueError, match="clash"):
        arrow_schema(bad)


def test_gap_and_chaos_schemas():
    assert [(f.name, f.type) for f in GAP_SCHEMA] == [("source", pa.string()), ("node_id", pa.int32()),
                                                      ("raft_index", pa.int64())]
    assert [f.name for f in GAP_SCHEMA][2:] == [f.name for f in AUDIT_GAP.fields]
    assert [(f.name, f.type) for f in CHAOS_ALLOCATE_SCHEMA] == [
        ("source", pa.string()), ("process", pa.string()), ("owner", pa.string()), ("index", pa.int64()),
        ("time_ns", pa.int64()), ("broker_id", pa.int32()), ("broker_epoch", pa.int64()), ("start", pa.int64()),
        ("length", pa.int32())]
    assert [(f.name, f.type) for f in CHAOS_GENERATE_SCHEMA] == [
        ("source", pa.string()), ("process", pa.string()), ("owner", pa.string()), ("index", pa.int64()),
        ("time_ns", pa.int64()), ("pid", pa.int64())]
    assert not any(f.nullable for f in (*GAP_SCHEMA, *CHAOS_ALLOCATE_SCHEMA, *CHAOS_GENERATE_SCHEMA))


# --------------------------------------------------------------------------- a real local cluster

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A three-node local cluster that was seeded, registered, allocated, fenced and served a transactional id."""
    lc = LocalCluster(str(tmp_path_factory.mktemp("audit") / "cluster"))
    lc.up(3)
    h = ClusterHarness(lc)
    got: list[tuple[int, int, int]] = []  # (broker, epoch, start) of every block the quorum acknowledged
    try:
        async def go():
            c = h.client()
            try:
                # Seeded while fresh (a seed over IDs issued before it is refused), then blocks above it.
                assert await c.seed(1_000_000, "export:zk.json", 7, 999_000, 999_999) == (True, 1_000_000)
                e1 = await c.register_broker(1, uuid.uuid4(), "127.0.0.1:9001")
                e2 = await c.register_broker(2)
                for _ in range(3):
                    got.append((1, e1, (await c.allocate(1, e1)).start))
                    got.append((2, e2, (await c.allocate(2, e2)).start))
                await c.heartbeat(2, e2, want_fence=True)
                await c.heartbeat(2, e2)
                await c.init_transactional(1, e1, "txn-a", 60_000)
                got.append((1, e1, (await c.allocate(1, e1)).start))
            finally:
                await c.close()
        asyncio.run(go())

        def converged():
            d = h.describe_all()
            keys = {(x["raft"]["commit_index"], x["raft"]["last_applied"]) for x in d.values()}
            return len(d) == 3 and len(keys) == 1 and next(iter(keys))[0] == next(iter(keys))[1]
        wait_for(converged, 15, what="all nodes applied everything")
    finally:
        lc.down(timeout=5)
    lc.acknowledged = got
    return lc


def test_export_of_a_local_cluster_holds_every_line_of_every_node(cluster, tmp_path):
    cluster_dir = cluster.dir
    out = str(tmp_path / "out")
    m = export(cluster_dir, out)
    assert m == read_manifest(out)
    assert m["format"] == 1 and m["exported_at"].endswith("Z")
    (s,) = m["sources"]
    assert (s["name"], s["kind"], s["path"], s["slug"]) == ("cluster", "cluster", cluster_dir, "cluster")
    audits = [(n, os.path.join(cluster_dir, f"node-{n}", "audit.log")) for n in (1, 2, 3)]
    check_source_matches_audits(out, m, "cluster", audits)
    lines = {n: read_audit(p)[0] for n, p in audits}
    assert s["counts"]["nodes"] == 3 and s["counts"]["audit_lines"] == sum(len(v) for v in lines.values())
    names = set(s["counts"]["records"])
    assert {"RegisterBrokerRecord", "AllocateProducerIdsRecord", "FenceBrokerRecord", "UnfenceBrokerRecord",
            "TransactionalIdRecord", "ProducerIdSeedRecord"} <= names
    # the values, spot-checked against what the quorum was told
    seeds = rows_of(out, "records/ProducerIdSeedRecord/part-cluster.parquet")
    assert {r["node_id"] for r in seeds} == {1, 2, 3}
    assert {(r["next_producer_id"], r["origin"], r["zk_broker"], r["zk_block_start"], r["zk_block_end"],
             r["accepted"], r["error"]) for r in seeds} == {(1_000_000, "export:zk.json", 7, 999_000, 999_999,
                                                              True, None)}
    blocks = read_table(out, "records/AllocateProducerIdsRecord/part-cluster.parquet")
    by_node = {n: sorted((r["raft_index"], r["broker_id"], r["broker_epoch"], r["producer_id_start"])
                         for r in blocks.to_pylist() if r["node_id"] == n) for n in (1, 2, 3)}
    assert by_node[1] == by_node[2] == by_node[3]  # every node applied the same blocks
    assert set(cluster.acknowledged) <= {b[1:] for b in by_node[1]}
    assert cluster.acknowledged[0] == (1, cluster.acknowledged[-1][1], 1_000_000)  # the first after the seed
    regs = rows_of(out, "records/RegisterBrokerRecord/part-cluster.parquet")
    assert {(r["broker_id"], r["listener"]) for r in regs} >= {(1, "127.0.0.1:9001")}
    # the Spark job's view: the files of a table, from the manifest
    assert table_files(out, m, "records/AllocateProducerIdsRecord") == [
        os.path.join(out, "records", "AllocateProducerIdsRecord", "part-cluster.parquet")]
    assert sorted(os.listdir(out)) == ["manifest.json", "records"]  # no chaos/ or gaps/ for a cluster


def test_a_single_node_data_dir_is_a_node_source(cluster, tmp_path):
    cluster_dir = cluster.dir
    out = str(tmp_path / "out")
    m = export(os.path.join(cluster_dir, "node-2"), out)
    (s,) = m["sources"]
    assert (s["name"], s["kind"], s["counts"]["nodes"]) == ("node-2", "node", 1)
    check_source_matches_audits(out, m, "node-2", [(2, os.path.join(cluster_dir, "node-2", "audit.log"))])


# --------------------------------------------------------------------------- hand-written audit trails

TS = 1_700_000_000_000


def one_of_each() -> list:
    """One record of every replicated type, with values that exercise every field type."""
    out = []
    for spec in RECORDS:
        kwargs = {}
        for i, f in enumerate(spec.fields):
            if f.type == "string":
                kwargs[f.name] = f"{spec.name}-{f.name}-é"
            elif f.type == "nullable_string":
                kwargs[f.name] = None
            elif f.type == "bool":
                kwargs[f.name] = True
            elif f.type == "float64":
                kwargs[f.name] = 0.1 + i
            else:
                kwargs[f.name] = {"int8": 127, "int16": 32767, "int32": 2**31 - 1 - i, "int64": 2**63 - 1 - i}[f.type]
        out.append(CLASSES[spec.type_id](**kwargs))
    return out


def write_node(data_dir: str, with_gap: bool = True) -> str:
    """A node data dir: a gap, every record type (some refused), an allocation after."""
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, "audit.log")
    w = AuditWriter(path)
    if with_gap:
        w.gap(10)
    recs = one_of_each()
    w.append(11, 2, [ApplyOutcome(r) for r in recs[:5]])
    w.append(12, 2, [ApplyOutcome(r, "refused: because") for r in recs[5:9]])
    w.append(13, 3, [ApplyOutcome(r) for r in recs[9:]])
    w.close()
    return path


def test_every_record_type_gaps_and_refusals_round_trip(tmp_path):
    path = write_node(str(tmp_path / "data" / "node-7"))
    out = str(tmp_path / "out")
    m = export(str(tmp_path / "data" / "node-7"), out)
    (s,) = m["sources"]
    assert s["counts"]["records"] == {spec.name: 1 for spec in RECORDS}
    assert s["counts"]["gaps"] == 1 and s["counts"]["refused"] == 4 and s["counts"]["torn_tail_bytes"] == 0
    check_source_matches_audits(out, m, "node-7", [(7, path)])
    rows = rows_of(out, f"records/{RECORDS[6].name}/part-node-7.parquet")
    assert rows[0]["accepted"] is False and rows[0]["error"] == "refused: because" and rows[0]["raft_term"] == 2
    assert rows_of(out, "gaps/part-node-7.parquet") == [{"source": "node-7", "node_id": 7, "raft_index": 10}]


def test_node_dir_without_a_node_number_gets_node_id_minus_one(tmp_path):
    write_node(str(tmp_path / "var-lib-pidquorum"), with_gap=False)
    out = str(tmp_path / "out")
    m = export(str(tmp_path / "var-lib-pidquorum"), out)
    for rel in m["tables"]:
        assert set(read_table(out, rel).column("node_id").to_pylist()) == {-1}
    assert not any(rel.startswith("gaps/") for rel in m["tables"])


def test_a_torn_last_audit_line_is_left_out_and_counted(tmp_path):
    path = write_node(str(tmp_path / "node-1"))
    with open(path, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x01\x02")  # a crash mid-append
    out = str(tmp_path / "out")
    m = export(str(tmp_path / "node-1"), out)
    assert m["sources"][0]["counts"]["torn_tail_bytes"] == 6
    check_source_matches_audits(out, m, "node-1", [(1, path)])


# --------------------------------------------------------------------------- chaos histories

def write_chaos_dir(run_dir: str, generates: int = 50, with_audit: bool = True) -> str:
    """A small chaos run directory: two allocators, a manager with two clients, a fault, failures."""
    os.makedirs(run_dir)
    t = [0]

    def now():
        t[0] += 1000
        return t[0]

    with HistoryWriter(os.path.join(run_dir, "history.jsonl")) as w:
        start = 0
        for i in range(4):
            for proc, broker in (("broker-1", 1), ("pidmgr-101/alloc", 101)):
                w.append(Op(proc, "invoke", "allocate", None, now()))
                w.append(Op(proc, "ok", "allocate", {"broker_id": broker, "broker_epoch": 5 + i, "start": start,
                                                     "length": 1000}, now()))
                start += 1000
        w.append(Op("broker-1", "invoke", "allocate", None, now()))
        w.append(Op("broker-1", "info", "allocate", None, now(), "REQUEST_TIMED_OUT"))
        w.append(Op("nemesis", "invoke", "kill-leader", None, now()))
        w.append(Op("nemesis", "ok", "kill-leader", {"start": {"node": 1}, "stop": None}, now()))
        for pid in range(generates):
            proc = f"pidmgr-101/client-{pid % 2}"
            w.append(Op(proc, "invoke", "generate", None, now()))
            w.append(Op(proc, "ok", "generate", 1000 + pid, now()))
        w.append(Op("pidmgr-101/client-0", "invoke", "generate", None, now()))
        w.append(Op("pidmgr-101/client-0", "fail", "generate", None, now(), "COORDINATOR_LOAD_IN_PROGRESS"))
        w.append(Op("broker-2", "invoke", "allocate", None, now()))  # never completed
    write_final(os.path.join(run_dir, "final.json"),
                {"nodes": {"1": {"next_producer_id": start, "commit_index": 9, "last_applied": 9}},
                 "audit_blocks": []})
    if with_audit:
        write_node(os.path.join(run_dir, "cluster", "node-1"))
        write_node(os.path.join(run_dir, "cluster", "node-3"), with_gap=False)
    return run_dir


def expected_chaos(source: str, history: str) -> tuple[list[dict], list[dict]]:
    alloc, gen = [], []
    for op in read_history(history):
        if op.type != "ok" or op.is_nemesis:
            continue
        base = {"source": source, "process": op.process, "owner": owner(op.process), "index": op.index,
                "time_ns": op.time_ns}
        if op.f == "allocate":
            alloc.append({**base, **op.value})
        elif op.f == "generate":
            gen.append({**base, "pid": op.value})
    return alloc, gen


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


# --------------------------------------------------------------------------- several sources

def test_a_directory_of_sources_is_walked_and_each_source_named(tmp_path, cluster):
    cluster_dir = cluster.dir
    root = tmp_path / "fleet"
    shutil.copytree(cluster_dir, root / "prod" / "cluster-a")
    write_chaos_dir(str(root / "chaos" / "run 1"))
    write_node(str(root / "prod" / "lone" / "node-4"))             # a dir of node-N dirs: a (one-node) cluster
    write_node(str(root / "prod" / "var-lib-pq"))                  # audit.log in it: a node data dir
    write_node(str(root / ".hidden" / "node-5"))                 # hidden: skipped
    (root / "notes").mkdir()
    (root / "notes" / "README").write_text("not a source\n")
    out = str(root / "export")                                   # inside the input: skipped
    os.makedirs(out)
    m = export(str(root), out)
    got = {s["name"]: (s["kind"], s["slug"]) for s in m["sources"]}
    assert got == {os.path.join("chaos", "run 1"): ("chaos", "chaos__run_1"),
                   os.path.join("prod", "cluster-a"): ("cluster", "prod__cluster-a"),
                   os.path.join("prod", "lone"): ("cluster", "prod__lone"),
                   os.path.join("prod", "var-lib-pq"): ("node", "prod__var-lib-pq")}
    # every source's rows are in its own part files, with its name
    for s in m["sources"]:
        for rel in m["tables"]:
            if rel.endswith(f"part-{s['slug']}.parquet"):
                assert set(read_table(out, rel).column("source").to_pylist()) <= {s["name"]}
    check_source_matches_audits(out, m, os.path.join("prod", "cluster-a"), [
        (n, str(root / "prod" / "cluster-a" / f"node-{n}" / "audit.log")) for n in (1, 2, 3)])
    assert len(table_files(out, m, "records/AllocateProducerIdsRecord")) == 4
    # a second export of the same tree (with --force) does not pick up the first one
    again = export(str(root), out, force=True)
    assert again["tables"] == m["tables"]


def test_slugs_stay_unique(tmp_path):
    write_node(str(tmp_path / "src" / "a b" / "node-1"))
    write_node(str(tmp_path / "src" / "a_b" / "node-1"))
    m = export(str(tmp_path / "src"), str(tmp_path / "out"))
    assert [(s["name"], s["slug"]) for s in m["sources"]] == [("a b", "a_b"), ("a_b", "a_b-2")]


# --------------------------------------------------------------------------- bad input

def assert_nothing_left(out: str, existed: bool = False) -> None:
    if existed:
        assert not os.path.exists(os.path.join(out, "manifest.json"))
        assert not [n for n in os.listdir(out) if n.startswith(".tmp-")]
    else:
        assert not os.path.exists(out)


def test_missing_empty_and_sourceless_inputs(tmp_path):
    out = str(tmp_path / "out")
    with pytest.raises(ExportError, match=r"nope: no such file or directory"):
        export(str(tmp_path / "nope"), out)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match=r"empty: empty directory: nothing to export"):
        export(str(tmp_path / "empty"), out)
    (tmp_path / "other" / "x").mkdir(parents=True)
    (tmp_path / "other" / "x" / "file.txt").write_text("hi")
    with pytest.raises(ExportError, match=r"other: no audit trail or chaos history found"):
        export(str(tmp_path / "other"), out)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportError, match=r"file: not a directory"):
        export(str(tmp_path / "file"), out)
    assert_nothing_left(out)


def test_corrupt_audit_log_names_the_file_and_leaves_nothing(tmp_path):
    src = tmp_path / "src"
    write_chaos_dir(str(src / "good"))
    bad = write_node(str(src / "zz" / "node-2"))
    with open(bad, "r+b") as f:  # flip a byte inside the first line's body: more lines follow it
        f.seek(12)
        b = f.read(1)
        f.seek(12)
        f.write(bytes([b[0] ^ 0xFF]))
    out = str(tmp_path / "out")
    with pytest.raises(CorruptFileError) as e:
        export(str(src), out)
    assert e.value.path == bad and bad in str(e.value)
    assert_nothing_left(out)


def test_audit_line_whose_entry_and_record_disagree_is_corrupt(tmp_path):
    d = tmp_path / "node-1"
    d.mkdir()
    entry = AuditEntry(raft_index=1, raft_term=1, position=0, accepted=True, error=None, record="RegisterBrokerRecord")
    rec = AllocateProducerIdsRecord(broker_id=1, broker_epoch=1, producer_id_start=0, producer_id_len=10)
    (d / "audit.log").write_bytes(_frame([to_obj(entry), to_obj(rec)]))
    with pytest.raises(CorruptFileError, match="says RegisterBrokerRecord but holds a AllocateProducerIdsRecord"):
        export(str(d), str(tmp_path / "out"))


BAD_HISTORIES = {
    "empty": b"",
    "foreign": b"this is not json\n",
    "bad-line-mid-file": None,       # built below from a good file
    "index-out-of-sequence": None,
    "unmatched-completion": None,
    "torn-last-line": None,
    "negative-pid": None,
    "not-utf8": b"\xff\xfe\n",
}


def bad_history(kind: str, good: bytes) -> bytes:
    lines = good.splitlines(keepends=True)
    if BAD_HISTORIES[kind] is not None:
        return BAD_HISTORIES[kind]
    if kind == "bad-line-mid-file":
        return b"".join(lines[:5] + [b"{oops\n"] + lines[6:])
    if kind == "index-out-of-sequence":
        return b"".join(lines[:5] + lines[6:])
    if kind == "unmatched-completion":
        return lines[1].replace(b'"index":1,', b'"index":0,')  # an ok with no invoke before it
    if kind == "torn-last-line":
        return b"".join(lines[:-1]) + lines[-1][:-10]
    if kind == "negative-pid":
        i = next(i for i, ln in enumerate(lines) if b'"ok","f":"generate"' in ln)
        return b"".join(lines[:i] + [lines[i].replace(b'"value":1000', b'"value":-1')] + lines[i + 1:])
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", sorted(BAD_HISTORIES))
def test_bad_history_gives_exactly_read_historys_error(tmp_path, kind):
    good_dir = write_chaos_dir(str(tmp_path / "good"), with_audit=False)
    good = open(os.path.join(good_dir, "history.jsonl"), "rb").read()
    run_dir = tmp_path / "src" / "run"
    shutil.copytree(good_dir, run_dir)
    (run_dir / "history.jsonl").write_bytes(bad_history(kind, good))
    with pytest.raises(HistoryError) as want:
        read_history(run_dir / "history.jsonl")
    out = str(tmp_path / "out")
    with pytest.raises(HistoryError) as got:
        export(str(tmp_path / "src"), out)
    assert str(got.value) == str(want.value)
    assert str(run_dir / "history.jsonl") in str(got.value)
    assert_nothing_left(out)


def test_torn_history_tail_can_be_allowed(tmp_path):
    run_dir = write_chaos_dir(str(tmp_path / "run"), with_audit=False)
    h = os.path.join(run_dir, "history.jsonl")
    data = open(h, "rb").read()
    open(h, "wb").write(data[:-10])
    out = str(tmp_path / "out")
    m = export(run_dir, out, allow_torn_tail=True)
    c = m["sources"][0]["counts"]
    assert c["torn_tail_lines"] == 1 and c["history_ops"] == len(read_history(h, allow_torn_tail=True))


def test_non_empty_destination_needs_force_and_force_replaces_the_previous_export(tmp_path):
    write_node(str(tmp_path / "a" / "node-1"))
    write_chaos_dir(str(tmp_path / "b" / "run"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty.*--force"):
        export(str(tmp_path / "a"), str(out))
    assert sorted(os.listdir(out)) == ["keep.txt"]
    first = export(str(tmp_path / "b"), str(out), force=True)
    second = export(str(tmp_path / "a"), str(out), force=True)
    # nothing of the first export is left: its chaos tables and part files are gone
    assert not os.path.exists(out / "chaos")
    files = sorted(os.path.relpath(os.path.join(d, f), out).replace(os.sep, "/")
                   for d, _, fs in os.walk(out) for f in fs)
    assert files == sorted(["keep.txt", "manifest.json", *second["tables"]])
    assert set(first["tables"]) != set(second["tables"])
    assert read_manifest(str(out)) == second


def test_a_failing_export_leaves_the_previous_one_intact(tmp_path):
    write_node(str(tmp_path / "src" / "a" / "node-1"))
    out = str(tmp_path / "out")
    before = export(str(tmp_path / "src"), out)
    bad = write_node(str(tmp_path / "src" / "b" / "node-1"))
    with open(bad, "r+b") as f:
        f.seek(12)
        f.write(b"\x00\x00")
    with pytest.raises(CorruptFileError):
        export(str(tmp_path / "src"), out, force=True)
    assert read_manifest(out) == before
    assert not [n for n in os.listdir(out) if n.startswith(".")]


def test_an_export_cut_off_while_publishing_has_no_manifest(tmp_path, monkeypatch):
    write_node(str(tmp_path / "src" / "node-1"))
    out = str(tmp_path / "out")
    export(str(tmp_path / "src"), out)

    def boom(*a, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ex, "atomic_write", boom)
    with pytest.raises(ExportError, match="out: cannot write: No space left on device"):
        export(str(tmp_path / "src"), out, force=True)
    with pytest.raises(ExportError, match="no manifest.json: not a finished audit export"):
        read_manifest(out)


def test_export_into_its_own_input_is_refused(tmp_path):
    write_node(str(tmp_path / "x" / "node-1"))
    with pytest.raises(ExportError, match="overwrite its own input"):
        export(str(tmp_path / "x"), str(tmp_path / "x"), force=True)
    (tmp_path / "out" / "records").mkdir(parents=True)
    write_node(str(tmp_path / "out" / "records" / "node-1"))
    with pytest.raises(ExportError, match="overwrite its own input"):
        export(str(tmp_path / "out" / "records" / "node-1"), str(tmp_path / "out"), force=True)


# --------------------------------------------------------------------------- read_manifest

def test_read_manifest_refuses_what_is_not_a_finished_export(tmp_path):
    with pytest.raises(ExportError, match="no such directory"):
        read_manifest(str(tmp_path / "nope"))
    with pytest.raises(ExportError, match="no manifest.json: not a finished audit export"):
        read_manifest(str(tmp_path))
    write_node(str(tmp_path / "src" / "node-1"))
    out = tmp_path / "out"
    m = export(str(tmp_path / "src"), str(out))
    man = out / "manifest.json"

    def expect(obj, pattern):
        man.write_text(obj if isinstance(obj, str) else json.dumps(obj))
        with pytest.raises(ExportError, match=pattern) as e:
            read_manifest(str(out))
        assert str(man) in str(e.value) or "part-src" in str(e.value)

    expect("{not json", "not JSON")
    expect([], "not a JSON object")
    expect({**m, "format": 2}, "format 2 is not supported")
    expect({k: v for k, v in m.items() if k != "tables"}, "missing 'tables'")
    expect({**m, "sources": [{"name": "x", "kind": "weird", "path": "/", "counts": {}}]}, r"sources\[0\]")
    rel = "records/AllocateProducerIdsRecord/part-src.parquet"
    expect({**m, "tables": {**m["tables"], rel: {**m["tables"][rel], "rows": 5}}}, "has 1 rows, the manifest says 5")
    expect({**m, "tables": {**m["tables"], "../x.parquet": m["tables"][rel]}}, "not a relative path")
    expect({**m, "tables": {**m["tables"], "records/Nope/part-x.parquet": m["tables"][rel]}}, "which is missing")
    man.write_text(json.dumps(m))
    os.truncate(out / "records" / "AllocateProducerIdsRecord" / "part-src.parquet", 10)
    with pytest.raises(ExportError, match="not a readable Parquet file"):
        read_manifest(str(out))
    assert read_manifest(str(out), verify=False) == m


# --------------------------------------------------------------------------- the CLI

def test_cli_export_and_exit_codes(tmp_path):
    runner = CliRunner()
    run_dir = write_chaos_dir(str(tmp_path / "src" / "run"))
    out = str(tmp_path / "out")
    r = runner.invoke(cli, ["audit", "export", "--from", str(tmp_path / "src"), "--to", out, "-o", "json"])
    assert r.exit_code == EXIT_OK, r.output
    shown = json.loads(r.output)
    assert shown["rows"] == sum(t["rows"] for t in shown["tables"].values())
    assert {k: shown[k] for k in ("format", "sources", "tables", "exported_at")} == read_manifest(out)
    r = runner.invoke(cli, ["audit", "export", "--from", str(tmp_path / "src"), "--to", out])
    assert r.exit_code == EXIT_ERROR and "not empty" in r.output
    r = runner.invoke(cli, ["audit", "export", "--from", str(tmp_path / "src"), "--to", out, "--force"])
    assert r.exit_code == EXIT_OK and "rows/s" in r.output
    r = runner.invoke(cli, ["audit", "export", "--from", str(tmp_path / "nope"), "--to", str(tmp_path / "o2")])
    assert r.exit_code == EXIT_ERROR and "nope: no such file or directory" in r.output
    open(os.path.join(run_dir, "history.jsonl"), "ab").write(b"garbage\n")
    r = runner.invoke(cli, ["audit", "export", "--from", str(tmp_path / "src"), "--to", str(tmp_path / "o3")])
    assert r.exit_code == EXIT_ERROR and os.path.join(run_dir, "history.jsonl") in r.output
    assert not os.path.exists(tmp_path / "o3")
    r = runner.invoke(cli, ["audit", "export", "--to", str(tmp_path / "o4")])
    assert r.exit_code == EXIT_USAGE


@pytest.mark.parametrize("damage", ["audit", "history"])
def test_pidctl_prints_one_line_naming_the_file_and_exits_1(tmp_path, damage):
    run_dir = write_chaos_dir(str(tmp_path / "run"))
    if damage == "audit":
        target = os.path.join(run_dir, "cluster", "node-3", "audit.log")
        with open(target, "r+b") as f:
            f.seek(12)
            f.write(b"\xff\xff\xff")
    else:
        target = os.path.join(run_dir, "history.jsonl")
        open(target, "ab").write(b"[1,2]\n")
    p = subprocess.run([sys.executable, "-m", "cli.main", "audit", "export", "--from", run_dir, "--to",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == EXIT_ERROR, (p.stdout, p.stderr)
    err = p.stderr.strip()
    assert err.startswith("error:") and target in err and "Traceback" not in err and len(err.splitlines()) <= 2
    assert not os.path.exists(tmp_path / "out")


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
