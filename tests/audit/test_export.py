"""chaos.audit.export: the Parquet schemas, a real local cluster's audit trails, hand-written node audit trails
(every record type, refused lines, gaps, a torn tail) and directories of several sources.  Schemas are compared
field by field with records.schema; every row is compared with what read_audit reads.  Chaos histories are in
test_export_chaos.py, bad input and the CLI in test_export_errors.py; the inputs in export_sources.py.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import uuid

import pyarrow as pa
import pytest

from chaos.audit import export as ex
from chaos.audit.export import export
from chaos.audit.manifest import read_manifest, table_files
from chaos.audit.schemas import AUDIT_COLUMNS, CHAOS_ALLOCATE_SCHEMA, CHAOS_GENERATE_SCHEMA, GAP_SCHEMA, arrow_schema
from quorum.localcluster import LocalCluster
from quorum.trail import read_audit
from records.schema import AUDIT_ENTRY, AUDIT_GAP, PAYLOADS, RECORDS, TYPES, FieldSpec, RecordSpec
from tests.audit.export_sources import (
    EXPECTED_ARROW, check_source_matches_audits, read_table, rows_of, write_chaos_dir, write_node,
)
from tests.conftest import ClusterHarness, wait_for


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
