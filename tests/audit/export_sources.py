"""Inputs for the audit export tests and what their export must hold: hand-written node audit trails and
chaos run directories, and readers that compare an export with read_audit / read_history."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from chaos.audit.schemas import GAP_SCHEMA, arrow_schema
from chaos.history import HistoryWriter, Op, owner, read_history, write_final
from quorum.managers import ApplyOutcome
from quorum.trail import AuditWriter, read_audit
from records import AuditGap
from records.codec import CLASSES
from records.schema import RECORDS

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


def assert_nothing_left(out: str, existed: bool = False) -> None:
    if existed:
        assert not os.path.exists(os.path.join(out, "manifest.json"))
        assert not [n for n in os.listdir(out) if n.startswith(".tmp-")]
    else:
        assert not os.path.exists(out)
