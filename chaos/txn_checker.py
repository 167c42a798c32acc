"""The checker of the transactions workload: ``check(ops, readback) -> TxnVerdict``, a pure function.

``ops`` is the history of a ``pidctl chaos run --workload transactions`` (``chaos.history.Op``, ops
described in ``chaos.txn_workload``); ``readback`` is what was read once the faults stopped and no
transaction was left open, markers included.  Any anomaly (kinds in ``ANOMALIES``) makes the verdict
invalid.  The read-back's shape, the anomaly classes, what each count counts and the timing rules are
in docs/transactions.md, "Exactly-once under faults".
"""
from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from .history import FAIL, OK, Op, pair_ops

MAX_EXAMPLES = 50
INF = math.inf

ANOMALIES: dict[str, str] = {
    "lost-write": "A committed transaction's value, or an acknowledged idempotent value, missing from the "
                  "final read_committed read.",
    "aborted-read": "G1a: a value of an aborted transaction (abort_transaction() returned, or no commit was ever "
                    "asked) visible to read_committed.",
    "torn-transaction": "A transaction partly visible to read_committed: some of its values, not all (whatever "
                        "its outcome; an unknown one must be all or nothing).",
    "read-before-commit": "A transaction visible to read_committed (a sampled poll), or committed (its commit "
                          "marker below a sampled high watermark), before its commit was asked.",
    "lso-past-open-transaction": "A sampled read_committed ListOffsets answer (the LSO) above the first offset of "
                                 "a transaction still open then (its marker came after the sample).",
    "duplicate": "A value more than once in read_committed (or, for an idempotent producer, in "
                 "read_uncommitted).",
    "order": "Per producer and partition, values in read_committed out of the order the producer sent them.",
    "fenced-commit": "A commit that returned on a producer instance invoked after another instance with the same "
                     "transactional id had been initialized (the first must be fenced).",
    "unknown-value": "A value read back that no producer of the history sent.",
    "incomplete-read": "The final reads did not reach the end offsets, or transactions were still open: the "
                       "other checks are incomplete.",
}

COMMITTED, ABORTED, ABANDONED, UNKNOWN = "committed", "aborted", "abandoned", "unknown"
MUST_BE_INVISIBLE = (ABORTED, ABANDONED)


@dataclass
class TxnVerdict:
    valid: bool
    anomaly_counts: dict[str, int]
    anomalies: dict[str, list[dict]]
    stats: dict[str, Any]
    faults: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    workload: str = "transactions"

    def to_dict(self) -> dict:
        return {"workload": self.workload, "valid": self.valid, "anomaly_counts": dict(self.anomaly_counts),
                "anomaly_classes": list(ANOMALIES), "anomalies": {k: list(v) for k, v in self.anomalies.items()},
                "stats": self.stats, "faults": self.faults, "warnings": list(self.warnings)}


class _Found:
    def __init__(self, max_examples: int):
        self.max = max_examples
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[dict]] = defaultdict(list)

    def add(self, kind: str, message: str, **details: Any) -> None:
        assert kind in ANOMALIES, kind
        self.counts[kind] += 1
        if len(self.examples[kind]) < self.max:
            self.examples[kind].append({"kind": kind, "message": message, **details})


@dataclass
class _Txn:
    txn: str
    process: str
    lib: str
    instance: int
    seq: int                      # the producer's transaction number (invoke order)
    values: list[tuple[str, int]]
    invoke_ns: int
    outcome: str = UNKNOWN
    end_ns: int | None = None
    commit_asked_ns: int | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class _Batch:
    batch: str
    process: str
    lib: str
    instance: int
    seq: int
    values: list[tuple[str, int]]
    acked: set[str] = field(default_factory=set)


@dataclass
class _Span:
    partition: int
    producer_id: int
    first: int                    # first data offset
    marker: float                 # marker offset, INF while open
    control: str | None           # "commit" / "abort" / None
    values: list[tuple[int, str]] = field(default_factory=list)  # (offset, value)


def _ms(ns: int | float | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 3)


def _pct(sorted_values: list, q: float):
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values), max(1, math.ceil(q / 100 * len(sorted_values)))) - 1]


# --------------------------------------------------------------------------
# The history
# --------------------------------------------------------------------------

class _History:
    def __init__(self, ops: list[Op]):
        self.txns: dict[str, _Txn] = {}
        self.batches: dict[str, _Batch] = {}
        self.value_of: dict[str, tuple[str, str, tuple[int, int]]] = {}  # value -> (kind, owner id, (seq, index))
        self.commits: list[tuple[str, int, int, str, str]] = []  # (process, instance, invoke_ns, type, txn)
        self.fences: list[dict] = []
        self.inits: dict[str, list[tuple[int, int, int]]] = defaultdict(list)  # process -> (instance, invoke, ok)
        self.polls: list[tuple[int, list]] = []
        self.samples: list[tuple[int, int, dict[int, int], dict[int, int]]] = []  # (invoke, done, lso, hw)
        self.lso_failed = 0
        self.faults: list[dict] = []
        seqs: Counter[str] = Counter()
        for inv, comp in pair_ops(ops):
            f = inv.f
            if inv.is_nemesis:
                self._fault(inv, comp)
            elif f == "txn":
                v = inv.value
                t = _Txn(v["txn"], inv.process, v.get("lib", "?"), v.get("instance", 0), seqs[inv.process],
                         [(x[0], int(x[1])) for x in v["values"]], inv.time_ns)
                seqs[inv.process] += 1
                self.txns[t.txn] = t
                for i, (val, _) in enumerate(t.values):
                    self.value_of[val] = ("txn", t.txn, (t.seq, i))
                if comp is not None:
                    t.end_ns = comp.time_ns
                    cv = comp.value if isinstance(comp.value, dict) else {}
                    if comp.type == OK:
                        t.outcome = COMMITTED
                    elif comp.type == FAIL:
                        t.outcome = ABANDONED if cv.get("outcome") == ABANDONED else ABORTED
                    else:
                        t.outcome = UNKNOWN
                    t.errors = list(cv.get("errors", []))
            elif f == "commit":
                v = inv.value
                t = self.txns.get(v["txn"])
                if t is not None and (t.commit_asked_ns is None or inv.time_ns < t.commit_asked_ns):
                    t.commit_asked_ns = inv.time_ns
                self.commits.append((inv.process, v.get("instance", 0), inv.time_ns,
                                     comp.type if comp is not None else "unfinished", v["txn"]))
            elif f == "write":
                v = inv.value
                b = _Batch(v["batch"], inv.process, v.get("lib", "?"), v.get("instance", 0), seqs[inv.process],
                           [(x[0], int(x[1])) for x in v["values"]])
                seqs[inv.process] += 1
                self.batches[b.batch] = b
                for i, (val, _) in enumerate(b.values):
                    self.value_of[val] = ("idem", b.batch, (b.seq, i))
                if comp is not None and isinstance(comp.value, dict):
                    b.acked = {x[0] for x in comp.value.get("acked", [])}
            elif f == "init" and comp is not None and comp.type == OK:
                self.inits[inv.process].append((inv.value.get("instance", 0), inv.time_ns, comp.time_ns))
            elif f == "poll" and comp is not None and comp.type == OK:
                self.polls.append((comp.time_ns, comp.value.get("records", [])))
            elif f == "lso" and comp is not None:
                if comp.type == OK:
                    self.samples.append((inv.time_ns, comp.time_ns,
                                         {int(k): v for k, v in comp.value["lso"].items()},
                                         {int(k): v for k, v in comp.value["hw"].items()}))
                else:
                    self.lso_failed += 1

    def _fault(self, inv: Op, comp: Op | None) -> None:
        v = comp.value if comp is not None and isinstance(comp.value, dict) else {}
        start = v.get("start") if isinstance(v.get("start"), dict) else {}
        self.faults.append({"f": inv.f, "start_ms": _ms(inv.time_ns),
                            "end_ms": _ms(comp.time_ns) if comp is not None else None,
                            "outcome": comp.type if comp is not None else "unfinished",
                            "error": comp.error if comp is not None else None, "start": start,
                            "stop": v.get("stop")})
        if inv.f == "fence" and comp is not None and comp.type == OK and "init_returned_ns" in start:
            self.fences.append(start)
            self.inits[start["process"]].append((start["instance"], start["init_invoked_ns"],
                                                 start["init_returned_ns"]))


# --------------------------------------------------------------------------
# The log: spans
# --------------------------------------------------------------------------

def _spans(log: dict) -> tuple[dict[int, list[_Span]], dict[tuple[int, int], tuple[_Span, str]], Counter]:
    """Spans per partition (by first offset), (span, value) of each (partition, data offset), marker counts."""
    by_part: dict[int, list[_Span]] = {}
    at: dict[tuple[int, int], tuple[_Span, str]] = {}
    markers: Counter[str] = Counter()
    for p_key, batches in log.get("batches", {}).items():
        p = int(p_key)
        open_: dict[int, _Span] = {}
        spans: list[_Span] = []
        for b in sorted(batches, key=lambda x: x["base_offset"]):
            pid = b["producer_id"]
            if b.get("control"):
                markers[b.get("control_type", "?")] += 1
                s = open_.pop(pid, None)
                if s is not None:
                    s.marker = b["base_offset"]
                    s.control = b.get("control_type")
                continue
            if not b.get("transactional"):
                continue
            s = open_.get(pid)
            if s is None:
                s = _Span(p, pid, b["base_offset"], INF, None)
                open_[pid] = s
                spans.append(s)
            for off, val in b.get("records", []):
                s.values.append((off, val))
                at[(p, off)] = (s, val)
        by_part[p] = sorted(spans, key=lambda s: s.first)
    return by_part, at, markers


# --------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------

def check(ops: list[Op], readback: dict, *, max_examples: int = MAX_EXAMPLES) -> TxnVerdict:
    """Check a transactions history against what was read back; see the module doc."""
    h = _History(ops)
    found = _Found(max_examples)
    warnings = list(getattr(ops, "warnings", ()))
    rc = [(int(p), int(o), v) for p, o, v in readback["read_committed"]["records"]]
    ru = [(int(p), int(o), v) for p, o, v in readback["read_uncommitted"]["records"]]
    log = readback.get("log", {"batches": {}, "complete": False})
    settle = readback.get("settle", {})

    # -- incomplete reads
    for name, ok in (("read_committed", readback["read_committed"].get("complete", False)),
                     ("read_uncommitted", readback["read_uncommitted"].get("complete", False)),
                     ("log", log.get("complete", False)), ("settle", settle.get("settled", False))):
        if not ok:
            found.add("incomplete-read", f"{name}: did not complete" if name != "settle" else
                      "transactions were still open (LSO below HW) when the final read started",
                      read=name)

    rc_where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p, o, v in rc:
        rc_where[v].append((p, o))
    ru_where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p, o, v in ru:
        ru_where[v].append((p, o))

    # -- unknown values
    seen_unknown: set = set()
    for where, read in ((rc_where, "read_committed"), (ru_where, "read_uncommitted")):
        for v, locs in where.items():
            if v not in h.value_of and v not in seen_unknown:
                seen_unknown.add(v)
                found.add("unknown-value", f"{v!r} read at {locs[:5]} ({read}) was never sent", value=v,
                          where=locs[:10], read=read)
    for batches in log.get("batches", {}).values():
        for b in batches:
            for off, v in b.get("records", []):
                if v not in h.value_of and v not in seen_unknown:
                    seen_unknown.add(v)
                    found.add("unknown-value", f"{v!r} in the log at offset {off} was never sent", value=v,
                              read="log")

    # -- duplicates
    for v, locs in rc_where.items():
        if len(locs) > 1:
            found.add("duplicate", f"{v} read {len(locs)} times with read_committed at {sorted(locs)}", value=v,
                      read="read_committed", where=sorted(locs), owner=h.value_of.get(v, (None, None))[1])
    ru_txn_dups = 0
    for v, locs in ru_where.items():
        if len(locs) > 1:
            kind = h.value_of.get(v, (None,))[0]
            if kind == "idem":
                found.add("duplicate", f"idempotent value {v} stored {len(locs)} times (read_uncommitted) at "
                          f"{sorted(locs)}", value=v, read="read_uncommitted", where=sorted(locs),
                          owner=h.value_of[v][1])
            else:
                ru_txn_dups += 1

    # -- per transaction: lost, aborted read, torn
    outcomes_by_lib: dict[str, Counter] = defaultdict(Counter)
    unknown_resolved: Counter[str] = Counter()
    commit_lat: dict[str, list[int]] = defaultdict(list)
    for t in h.txns.values():
        outcomes_by_lib[t.lib][t.outcome] += 1
        visible = [(v, p) for v, p in t.values if v in rc_where]
        missing = [(v, p) for v, p in t.values if v not in rc_where]
        where = {v: rc_where[v] for v, _ in visible}
        if t.outcome == COMMITTED:
            if t.commit_asked_ns is not None and t.end_ns is not None:
                commit_lat[t.lib].append(t.end_ns - t.commit_asked_ns)
            for v, p in missing:
                found.add("lost-write", f"{v} (partition {p}) of committed transaction {t.txn} is not in "
                          f"read_committed", value=v, partition=p, txn=t.txn, lib=t.lib, outcome=t.outcome)
        elif t.outcome in MUST_BE_INVISIBLE and visible:
            found.add("aborted-read", f"transaction {t.txn} ({t.lib}, {t.outcome}) has {len(visible)} of "
                      f"{len(t.values)} values visible to read_committed: {where}", txn=t.txn, lib=t.lib,
                      outcome=t.outcome, visible=where, commit_asked_ms=_ms(t.commit_asked_ns),
                      errors=t.errors[:5])
        elif t.outcome == UNKNOWN:
            unknown_resolved["committed (seen whole)" if not missing else
                             "not committed (absent)" if not visible else "torn"] += 1
        if visible and missing:
            found.add("torn-transaction", f"transaction {t.txn} ({t.lib}, {t.outcome}): {len(visible)} of "
                      f"{len(t.values)} values visible to read_committed; missing "
                      f"{[v for v, _ in missing]}", txn=t.txn, lib=t.lib, outcome=t.outcome, visible=where,
                      missing=[[v, p] for v, p in missing], errors=t.errors[:5])

    # -- idempotent: lost acknowledged values
    idem_acked = idem_values = 0
    idem_by_lib: dict[str, Counter] = defaultdict(Counter)
    for b in h.batches.values():
        idem_values += len(b.values)
        idem_acked += len(b.acked)
        idem_by_lib[b.lib]["batches"] += 1
        idem_by_lib[b.lib]["values"] += len(b.values)
        idem_by_lib[b.lib]["acknowledged"] += len(b.acked)
        for v, p in b.values:
            if v in b.acked and v not in rc_where:
                found.add("lost-write", f"acknowledged idempotent value {v} (partition {p}, batch {b.batch}) is not "
                          "in read_committed", value=v, partition=p, batch=b.batch, lib=b.lib)

    # -- the log's spans
    spans, span_at, markers = _spans(log)
    txn_spans: dict[str, dict[int, _Span]] = defaultdict(dict)  # txn -> partition -> span of its first value there
    for (p, off), (s, v) in sorted(span_at.items(), key=lambda x: x[0]):
        k = h.value_of.get(v)
        if k is not None and k[0] == "txn" and p not in txn_spans[k[1]]:
            txn_spans[k[1]][p] = s

    # -- read before commit: sampled polls
    flagged_rbc: set[str] = set()
    for t_ns, recs in h.polls:
        for p, off, v in recs:
            k = h.value_of.get(v)
            if k is None or k[0] != "txn" or k[1] in flagged_rbc:
                continue
            t = h.txns[k[1]]
            if t.commit_asked_ns is None or t.commit_asked_ns > t_ns:
                flagged_rbc.add(t.txn)
                found.add("read-before-commit",
                          f"{v} of {t.txn} ({t.lib}, {t.outcome}) was returned to a read_committed poll at "
                          f"{_ms(t_ns)} ms, " + ("and its commit was never asked" if t.commit_asked_ns is None else
                                                 f"{_ms(t.commit_asked_ns - t_ns)} ms before its commit was asked"),
                          txn=t.txn, lib=t.lib, outcome=t.outcome, evidence="poll", value=v, partition=p,
                          offset=off, seen_ms=_ms(t_ns), commit_asked_ms=_ms(t.commit_asked_ns))

    # -- read before commit: commit markers below a high watermark sampled before the commit was asked
    hw_series: dict[int, tuple[list[int], list[int]]] = {}  # p -> (done times, prefix max HW)
    for p in {p for _, _, _, hw in h.samples for p in hw}:
        times, pmax, m = [], [], -1
        for _, done, _, hw in sorted(h.samples, key=lambda s: s[1]):
            if p in hw:
                m = max(m, hw[p])
                times.append(done)
                pmax.append(m)
        hw_series[p] = (times, pmax)
    for txn, parts in txn_spans.items():
        if txn in flagged_rbc:
            continue
        t = h.txns[txn]
        for p, s in sorted(parts.items()):
            if s.control != "commit" or p not in hw_series:
                continue
            times, pmax = hw_series[p]
            j = bisect.bisect_right(pmax, s.marker)  # first sample whose HW is above the marker
            if j < len(pmax) and (t.commit_asked_ns is None or times[j] < t.commit_asked_ns):
                flagged_rbc.add(txn)
                found.add("read-before-commit",
                          f"{txn} ({t.lib}, {t.outcome}): its commit marker (partition {p}, offset {s.marker}) "
                          f"was below the high watermark answered at {_ms(times[j])} ms, "
                          + ("and its commit was never asked" if t.commit_asked_ns is None else
                             f"{_ms(t.commit_asked_ns - times[j])} ms before its commit was asked"),
                          txn=txn, lib=t.lib, outcome=t.outcome, evidence="marker", partition=p,
                          marker_offset=s.marker, hw_seen_ms=_ms(times[j]), commit_asked_ms=_ms(t.commit_asked_ns),
                          span_values=[v for _, v in s.values][:20])
                break

    # -- LSO past an open transaction
    samples = [(s[0], s[1], s[2], s[3], "sample") for s in h.samples]
    if settle.get("lso") and settle.get("hw"):
        samples.append((None, None, {int(k): v for k, v in settle["lso"].items()},
                        {int(k): v for k, v in settle["hw"].items()}, "final"))
    index = {p: ([s.first for s in ss], _prefix_max([s.marker for s in ss])) for p, ss in spans.items()}
    flagged_spans: set[int] = set()
    for inv_ns, done_ns, lso, hw, what in samples:
        for p, L in lso.items():
            if p not in index or p not in hw:
                continue
            firsts, pmax = index[p]
            j = bisect.bisect_left(firsts, L)  # spans [0, j) start below L
            if j == 0 or pmax[j - 1] < hw[p]:
                continue
            for s in spans[p][:j]:
                if s.marker >= hw[p] and id(s) not in flagged_spans:
                    flagged_spans.add(id(s))
                    owners = sorted({h.value_of[v][1] for _, v in s.values if v in h.value_of})
                    found.add("lso-past-open-transaction",
                              f"partition {p}: LSO {L} answered at {_ms(done_ns)} ms ({what}) is above offset "
                              f"{s.first}, the first of producer {s.producer_id}'s transaction "
                              f"{owners[:3]}, whose marker is at "
                              f"{'no offset (never ended)' if s.marker == INF else int(s.marker)} >= the HW "
                              f"{hw[p]} answered after it", partition=p, lso=L, hw=hw[p], sample=what,
                              sample_ms=[_ms(inv_ns), _ms(done_ns)], span_first=s.first,
                              span_marker=None if s.marker == INF else int(s.marker), producer_id=s.producer_id,
                              transactions=owners[:10])

    # -- order
    groups: dict[tuple, list[tuple[int, int, str, tuple[int, int]]]] = defaultdict(list)
    for p, o, v in rc:
        k = h.value_of.get(v)
        if k is None:
            continue
        if k[0] == "txn":
            t = h.txns[k[1]]
            groups[(p, t.process)].append((o, p, v, k[2]))
        else:
            b = h.batches[k[1]]
            groups[(p, b.process, b.instance)].append((o, p, v, k[2]))
    for key, recs in groups.items():
        recs.sort()
        for a, b in zip(recs, recs[1:]):
            if b[3] < a[3]:  # equal: the same value twice, a duplicate
                found.add("order", f"partition {key[0]}, producer {key[1]}: {b[2]} at offset {b[0]} comes after "
                          f"{a[2]} at offset {a[0]}, but was sent before it", partition=key[0], producer=key[1],
                          records=[[a[0], a[2]], [b[0], b[2]]])

    # -- fenced commits: instance Y was initialized after X's init returned, so Y fences X; a commit of X
    # asked after Y's init returned must not return
    fenced_commits = 0
    for process, instance, invoke_ns, type_, txn in h.commits:
        if type_ != OK:
            continue
        inits = h.inits.get(process, ())
        mine = [r for i, _, r in inits if i == instance]
        if not mine:
            continue
        for other, inv_ns, ret_ns in inits:
            if other != instance and inv_ns > mine[0] and ret_ns < invoke_ns:
                fenced_commits += 1
                found.add("fenced-commit", f"{process}: commit of {txn} by instance {instance} invoked at "
                          f"{_ms(invoke_ns)} ms returned, though instance {other} had been initialized (its "
                          f"init_transactions() returned at {_ms(ret_ns)} ms, called after instance "
                          f"{instance}'s had returned)", process=process, txn=txn, instance=instance,
                          fencing_instance=other, fencing_init_ms=[_ms(inv_ns), _ms(ret_ns)])
                break

    # -- figures
    lat = {lib: {"n": len(v), "p50_ms": _ms(_pct(sorted(v), 50)), "p99_ms": _ms(_pct(sorted(v), 99)),
                 "max_ms": _ms(max(v) if v else None)} for lib, v in sorted(commit_lat.items())}
    by_fault: dict[str, Counter] = defaultdict(Counter)
    for f in h.faults:
        st = f["start"] or {}
        by_fault[f["f"]]["count"] += 1
        if f["outcome"] != OK or st.get("skipped") or st.get("failed"):
            by_fault[f["f"]]["skipped_or_failed"] += 1
    ends = [op.time_ns for op in ops]
    stats = {
        "ops": len(ops), "duration_s": round((max(ends) - min(ends)) / 1e9, 3) if ends else 0.0,
        "transactions": len(h.txns),
        "transactions_by_lib": {lib: dict(sorted(c.items())) for lib, c in sorted(outcomes_by_lib.items())},
        "outcomes": dict(sorted(sum(outcomes_by_lib.values(), Counter()).items())),
        "unknown_resolved": dict(unknown_resolved),
        "commit_latency": lat,
        "transactional_values": sum(len(t.values) for t in h.txns.values()),
        "idempotent": {"batches": len(h.batches), "values": idem_values, "acknowledged": idem_acked,
                       "by_lib": {lib: dict(c) for lib, c in sorted(idem_by_lib.items())}},
        "read_committed_records": len(rc), "read_uncommitted_records": len(ru),
        "read_uncommitted_duplicate_transactional_values": ru_txn_dups,
        "log_batches": sum(len(b) for b in log.get("batches", {}).values()),
        "markers": dict(markers), "spans": sum(len(s) for s in spans.values()),
        "open_spans": sum(1 for ss in spans.values() for s in ss if s.marker == INF),
        "polls": len(h.polls), "poll_records": sum(len(r) for _, r in h.polls),
        "lso_samples": len(h.samples), "lso_samples_failed": h.lso_failed,
        "fences": len(h.fences), "commit_calls": len(h.commits),
    }
    faults = {"by_kind": {k: dict(v) for k, v in sorted(by_fault.items())}, "intervals": h.faults}
    return TxnVerdict(valid=not found.counts, anomaly_counts=dict(sorted(found.counts.items())),
                      anomalies={k: found.examples[k] for k in sorted(found.examples)}, stats=stats,
                      faults=faults, warnings=warnings)


def _prefix_max(xs: list[float]) -> list[float]:
    out, m = [], -INF
    for x in xs:
        m = max(m, x)
        out.append(m)
    return out
