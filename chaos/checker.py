"""The checker: is a chaos history, with the cluster's final state, consistent with a correct allocator?

``check(ops, final) -> Verdict``.  Safety anomalies (kinds described once, in
``ANOMALIES``) make the verdict INVALID; availability (counts, latencies, the longest outage) is
reported only.  The safety rules, how the longest outage is measured and the cost are in
docs/simulation.md, section 12.
"""
from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from .history import (
    ALLOCATE,
    FAIL,
    GENERATE,
    INFO,
    NEMESIS_PREFIX,
    OK,
    Op,
    owner,
    pair_ops,
    validate_final,
)

LOAD_IN_PROGRESS = "COORDINATOR_LOAD_IN_PROGRESS"
MAX_EXAMPLES = 100  # anomalies kept per kind in the verdict (all are counted)

# Every anomaly kind the checker can report, described once (the report prints these).
ANOMALIES: dict[str, str] = {
    "duplicate-pid": "A producer ID returned by two successful generate ops.",
    "overlapping-blocks": "Two acknowledged (ok) blocks share producer IDs.",
    "overlapping-committed-blocks": "Two blocks in the committed log (audit trails) share producer IDs.",
    "pid-outside-own-blocks": "A generated PID lies in no block acknowledged to its own process (or owner).",
    "block-above-next-id": "An acknowledged block ends above a node's final next_producer_id (lost on that node).",
    "committed-above-next-id": "A committed block ends above a node's final next_producer_id (could be issued again).",
    "block-not-committed": "An acknowledged block is missing from the committed log (lost).",
    "block-epoch-mismatch": "An acknowledged block was committed with a different broker epoch.",
    "nodes-disagree": "Nodes report different final next_producer_id values.",
    "non-increasing-blocks": "A process's acknowledged blocks do not have strictly increasing starts.",
}


@dataclass
class Verdict:
    valid: bool
    anomaly_counts: dict[str, int]
    anomalies: dict[str, list[dict]]  # kind -> first MAX_EXAMPLES, each {"kind", "ops", "message", ...}
    availability: dict[str, dict]     # "allocate" / "generate" -> figures
    faults: dict[str, Any]            # {"intervals": [...], "by_kind": {f: {"count", "failed", "total_ms"}}}
    stats: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"valid": self.valid, "anomaly_counts": dict(self.anomaly_counts),
                "anomalies": {k: list(v) for k, v in self.anomalies.items()},
                "availability": self.availability, "faults": self.faults, "stats": self.stats,
                "warnings": list(self.warnings)}


class _Anomalies:
    def __init__(self, max_examples: int):
        self.max = max_examples
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[dict]] = defaultdict(list)

    def count_only(self, kind: str, n: int = 1) -> bool:
        """If ``kind`` has all the examples it keeps, count ``n`` more and return True (skip building them)."""
        if len(self.examples[kind]) < self.max:
            return False
        self.counts[kind] += n
        return True

    def add(self, kind: str, ops: list[int], message: str, **details: Any) -> None:
        assert kind in ANOMALIES, kind
        self.counts[kind] += 1
        if len(self.examples[kind]) < self.max:
            self.examples[kind].append({"kind": kind, "ops": ops, "message": message, **details})


# --------------------------------------------------------------------------
# Helpers shared with the report
# --------------------------------------------------------------------------

def percentile(sorted_values: list, q: float):
    """Nearest-rank percentile (q in (0, 100]) of an ascending list; None if empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def history_end_ns(ops: Iterable[Op]) -> int:
    return max((op.time_ns for op in ops), default=0)


def fault_intervals(pairs: list[tuple[Op, Op | None]], end_ns: int, nemesis: set[str] | None = None) -> list[dict]:
    """One dict per nemesis op: kind, node/value, start/end (ms since run start), outcome.

    An op that never completed lasts until ``end_ns`` (the end of the history).
    """
    out = []
    if nemesis is None:
        nemesis = _nemesis_processes(pairs)
    for inv, comp in pairs:
        if inv.process not in nemesis:
            continue
        stop = comp.time_ns if comp is not None else max(end_ns, inv.time_ns)
        out.append({"f": inv.f, "process": inv.process, "value": inv.value,
                    "start_ms": inv.time_ns / 1e6, "end_ms": stop / 1e6, "duration_ms": (stop - inv.time_ns) / 1e6,
                    "outcome": comp.type if comp is not None else "unfinished",
                    "error": comp.error if comp is not None else None,
                    "invoke_index": inv.index, "completion_index": comp.index if comp is not None else None})
    return out


def _nemesis_processes(pairs: list[tuple[Op, Op | None]], processes: set[str] | None = None) -> set[str]:
    if processes is None:
        processes = {inv.process for inv, _ in pairs}
    return {p for p in processes if p.startswith(NEMESIS_PREFIX)}


def _block(op: Op) -> tuple[int, int]:
    v = op.value
    return v["start"], v["start"] + v["length"]


def _rng(start: int, end: int) -> str:
    return f"[{start}, {end})"


# --------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------

def check(ops: list[Op], final: dict, *, max_examples: int = MAX_EXAMPLES) -> Verdict:
    """Check a history (ops in history order) against the final state; see the module doc.

    Raises HistoryError if the pairing is broken or ``final`` is malformed.  Warnings
    the reader attached to ``ops`` (``History.warnings``) are carried into the verdict.
    """
    validate_final(final)
    pairs = pair_ops(ops)
    end_ns = history_end_ns(ops)
    an = _Anomalies(max_examples)
    warnings = list(getattr(ops, "warnings", ()))

    # Split completed client ops by kind.  A block op is (start, end, completion op).
    ok_blocks: list[tuple[int, int, Op]] = []
    by_kind: dict[str, list[tuple[Op, Op | None]]] = {ALLOCATE: [], GENERATE: []}
    gen_ok: list[Op] = []
    processes = {inv.process for inv, _ in pairs}
    nemesis = _nemesis_processes(pairs, processes)
    for inv, comp in pairs:
        lst = by_kind.get(inv.f)
        if lst is None or inv.process in nemesis:
            continue
        lst.append((inv, comp))
        if comp is not None and comp.type == OK:
            if inv.f == ALLOCATE:
                s, e = _block(comp)
                ok_blocks.append((s, e, comp))
            else:
                gen_ok.append(comp)

    audit = _dedup_audit(final["audit_blocks"])
    _check_overlaps(an, ok_blocks)
    _check_committed_overlaps(an, audit)
    _check_increasing(an, ok_blocks)
    own = _owner_index(ok_blocks)
    _check_pids(an, gen_ok, own, ok_blocks, audit)
    _check_lost(an, ok_blocks, audit, final, warnings)

    acked = {(s, e, c.value["broker_id"]) for s, e, c in ok_blocks}
    unacked = sum(1 for b in audit if (b["producer_id_start"], b["producer_id_start"] + b["producer_id_len"],
                                      b["broker_id"]) not in acked)
    faults = fault_intervals(pairs, end_ns, nemesis)
    by_fault: dict[str, dict] = {}
    for fi in faults:
        k = by_fault.setdefault(fi["f"], {"count": 0, "failed": 0, "total_ms": 0.0})
        k["count"] += 1
        if fi["outcome"] == FAIL:
            k["failed"] += 1
        else:
            k["total_ms"] += fi["duration_ms"]
    nexts = {str(n): st["next_producer_id"] for n, st in final["nodes"].items()}
    stats = {
        "ops": len(ops), "operations": len(pairs),
        "processes": len(processes),
        "duration_s": end_ns / 1e9,
        "ok_blocks": len(ok_blocks), "ok_pids": len(gen_ok),
        "committed_blocks": len(audit), "committed_unacknowledged_blocks": unacked,
        "final_next_producer_id": nexts,
    }
    return Verdict(
        valid=not an.counts,
        anomaly_counts=dict(sorted(an.counts.items())),
        anomalies={k: an.examples[k] for k in sorted(an.examples)},
        availability={kind: _availability(by_kind[kind], end_ns) for kind in (ALLOCATE, GENERATE)},
        faults={"intervals": faults, "by_kind": dict(sorted(by_fault.items()))},
        stats=stats,
        warnings=warnings,
    )


def _dedup_audit(blocks: list[dict]) -> list[dict]:
    """Audit blocks once each (the same entry may come from several nodes' trails), by Raft index."""
    seen = {}
    for b in blocks:
        key = (b["raft_index"], b["broker_id"], b["broker_epoch"], b["producer_id_start"], b["producer_id_len"])
        seen.setdefault(key, b)
    return [seen[k] for k in sorted(seen)]


def _overlaps(intervals: list[tuple[int, int, Any]]):
    """Sweep half-open intervals (start, end, tag) by start with a heap of open ends.

    Yields (item, earlier items it overlaps) -- the second is the live heap (entries
    ``(end, seq, item)``): read it at once.  Counting overlapping pairs stays
    O(n log n) even when many intervals overlap; listing them is up to the caller.
    """
    active: list[tuple[int, int, Any]] = []
    for seq, item in enumerate(sorted(intervals, key=lambda t: (t[0], t[1]))):
        while active and active[0][0] <= item[0]:
            heapq.heappop(active)
        if active:
            yield item, active
        heapq.heappush(active, (item[1], seq, item))


def _overlap_anomalies(an: _Anomalies, kind: str, intervals: list, report) -> None:
    for item, active in _overlaps(intervals):
        if an.count_only(kind, len(active)):
            continue
        for _, _, other in active:
            if not an.count_only(kind):
                report(other, item)


def _check_overlaps(an: _Anomalies, ok_blocks: list[tuple[int, int, Op]]) -> None:
    def report(x, y):
        (s1, e1, a), (s2, e2, b) = sorted([x, y], key=lambda t: t[2].index)
        an.add("overlapping-blocks", [a.index, b.index],
               f"op #{a.index} ({a.process}) got {_rng(s1, e1)} and op #{b.index} ({b.process}) got "
               f"{_rng(s2, e2)}: {_rng(max(s1, s2), min(e1, e2))} issued twice",
               blocks=[a.value, b.value], processes=[a.process, b.process])
    _overlap_anomalies(an, "overlapping-blocks", ok_blocks, report)


def _check_committed_overlaps(an: _Anomalies, audit: list[dict]) -> None:
    def report(x, y):
        (s1, e1, a), (s2, e2, b) = sorted([x, y], key=lambda t: t[2]["raft_index"])
        an.add("overlapping-committed-blocks", [],
               f"raft index {a['raft_index']} (broker {a['broker_id']}) committed {_rng(s1, e1)} and raft index "
               f"{b['raft_index']} (broker {b['broker_id']}) committed {_rng(s2, e2)}",
               raft_indexes=[a["raft_index"], b["raft_index"]])
    ivs = [(b["producer_id_start"], b["producer_id_start"] + b["producer_id_len"], b) for b in audit]
    _overlap_anomalies(an, "overlapping-committed-blocks", ivs, report)


def _owner_index(ok_blocks: list[tuple[int, int, Op]]) -> dict[str, tuple]:
    """owner -> (starts, prefix max of ends, blocks) sorted by start, for the PID lookup."""
    per: dict[str, list[tuple[int, int, Op]]] = defaultdict(list)
    for blk in ok_blocks:
        per[owner(blk[2].process)].append(blk)
    return {o: _interval_index(blks) for o, blks in per.items()}


def _check_increasing(an: _Anomalies, ok_blocks: list[tuple[int, int, Op]]) -> None:
    """Per process (one call at a time, so completion order is commit order): strictly increasing starts."""
    per: dict[str, list[tuple[int, int, Op]]] = defaultdict(list)
    for blk in ok_blocks:
        per[blk[2].process].append(blk)
    for proc, blks in per.items():
        blks.sort(key=lambda b: b[2].index)  # completion order
        for prev, cur in zip(blks, blks[1:]):
            if cur[0] <= prev[0]:
                an.add("non-increasing-blocks", [prev[2].index, cur[2].index],
                       f"{proc} got {_rng(prev[0], prev[1])} at op #{prev[2].index}, then {_rng(cur[0], cur[1])} "
                       f"at op #{cur[2].index}: start {cur[0]} is not above {prev[0]}",
                       process=proc, starts=[prev[0], cur[0]])


def _interval_index(blks: list[tuple[int, int, Any]]) -> tuple[list[int], list[int], list]:
    """(starts, prefix max of ends, blocks) sorted by start: x is covered iff prefix_max[i] > x, i = last start <= x."""
    srt = sorted(blks, key=lambda b: (b[0], b[1]))
    starts = [b[0] for b in srt]
    pmax, m = [], -1
    for b in srt:
        m = max(m, b[1])
        pmax.append(m)
    return starts, pmax, srt


def _covering(index: tuple[list[int], list[int], list], x: int):
    """A block of ``index`` containing x, or None."""
    starts, pmax, srt = index
    i = bisect.bisect_right(starts, x) - 1
    if i < 0 or pmax[i] <= x:
        return None
    while i >= 0:  # rare: only when blocks overlap do we look further back
        if srt[i][0] <= x < srt[i][1]:
            return srt[i]
        i -= 1
    return None


def _check_pids(an: _Anomalies, gen_ok: list[Op], own: dict[str, tuple], ok_blocks: list, audit: list[dict]) -> None:
    first: dict[int, Op] = {}
    setdefault = first.setdefault
    empty = ([], [], [])
    # Hot loop over every generated PID: each process's last block hit is tried before a bisection.
    cache: dict[str, list] = {}  # process -> [lo, hi, index of its owner's blocks]
    for op in gen_ok:
        pid = op.value
        prev = setdefault(pid, op)
        if prev is not op and not an.count_only("duplicate-pid"):
            an.add("duplicate-pid", [prev.index, op.index],
                   f"PID {pid} issued twice: op #{prev.index} ({prev.process}) and op #{op.index} ({op.process})",
                   pid=pid, processes=[prev.process, op.process])
        c = cache.get(op.process)
        if c is None:
            c = cache[op.process] = [0, 0, own.get(owner(op.process), empty)]
        if c[0] <= pid < c[1]:
            continue
        blk = _covering(c[2], pid) if c[2][0] else None
        if blk is not None:
            c[0], c[1] = blk[0], blk[1]
            continue
        if an.count_only("pid-outside-own-blocks"):
            continue
        an.add("pid-outside-own-blocks", [op.index],
               f"op #{op.index}: {op.process} issued PID {pid}, {_where(pid, ok_blocks, audit)}",
               pid=pid, process=op.process)


def _where(pid: int, ok_blocks: list, audit: list[dict]) -> str:
    """Explain where a stray PID lies (called only for anomalies)."""
    for s, e, c in ok_blocks:
        if s <= pid < e:
            return f"which lies in {_rng(s, e)} acknowledged to {c.process} at op #{c.index}"
    for b in audit:
        s = b["producer_id_start"]
        if s <= pid < s + b["producer_id_len"]:
            return (f"which lies in {_rng(s, s + b['producer_id_len'])} committed at raft index {b['raft_index']} "
                    f"for broker {b['broker_id']} but acknowledged to no one")
        # (audit is small; a linear scan per anomaly is fine)
    return "which lies in no known block"


def _check_lost(an: _Anomalies, ok_blocks: list, audit: list[dict], final: dict, warnings: list[str]) -> None:
    nodes = final["nodes"]
    nexts = {str(n): st["next_producer_id"] for n, st in nodes.items()}
    if len(set(nexts.values())) > 1:
        an.add("nodes-disagree", [],
               "final next_producer_id differs: " + ", ".join(f"node {n}: {v}" for n, v in sorted(nexts.items())),
               next_producer_id=dict(sorted(nexts.items())))
    missing = final.get("missing_nodes") or []
    if missing:
        warnings.append("nodes " + ", ".join(map(str, missing)) + " did not answer after the run: "
                        "their final state was not checked")
    if final.get("converged") is False:
        warnings.append("the nodes had not converged when the final state was taken")
    applied = {str(n): st["last_applied"] for n, st in nodes.items()}
    if len(set(applied.values())) > 1:
        warnings.append("nodes had applied different log prefixes when the final state was taken: "
                        + ", ".join(f"node {n}: {v}" for n, v in sorted(applied.items())))
    low = min(nexts.values())
    for s, e, c in ok_blocks:
        if e > low:
            below = sorted(n for n, v in nexts.items() if e > v)
            an.add("block-above-next-id", [c.index],
                   f"op #{c.index}: {c.process} got {_rng(s, e)}, but next_producer_id is "
                   + ", ".join(f"{nexts[n]} on node {n}" for n in below),
                   block=c.value, nodes=below)
    for b in audit:
        e = b["producer_id_start"] + b["producer_id_len"]
        if e > low:
            below = sorted(n for n, v in nexts.items() if e > v)
            an.add("committed-above-next-id", [],
                   f"raft index {b['raft_index']} committed {_rng(b['producer_id_start'], e)} for broker "
                   f"{b['broker_id']}, but next_producer_id is " + ", ".join(f"{nexts[n]} on node {n}" for n in below),
                   raft_index=b["raft_index"], nodes=below)
    by_range: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for b in audit:
        by_range[(b["producer_id_start"], b["producer_id_len"])].append(b)
    for s, e, c in ok_blocks:
        v = c.value
        cands = by_range.get((s, e - s), [])
        same_broker = [b for b in cands if b["broker_id"] == v["broker_id"]]
        if not same_broker:
            why = ("; that range was committed for broker " + ", ".join(str(b["broker_id"]) for b in cands)
                   if cands else "")
            an.add("block-not-committed", [c.index],
                   f"op #{c.index}: {c.process} (broker {v['broker_id']}) got {_rng(s, e)}, which no committed "
                   f"block holds{why}", block=v)
        elif not any(b["broker_epoch"] == v["broker_epoch"] for b in same_broker):
            an.add("block-epoch-mismatch", [c.index],
                   f"op #{c.index}: broker {v['broker_id']} got {_rng(s, e)} at epoch {v['broker_epoch']}, "
                   f"committed at epoch {same_broker[0]['broker_epoch']} (raft index {same_broker[0]['raft_index']})",
                   block=v, committed_epoch=same_broker[0]["broker_epoch"])


# --------------------------------------------------------------------------
# Availability
# --------------------------------------------------------------------------

def _latency(sorted_ns: list[int]) -> dict:
    ms = lambda v: None if v is None else v / 1e6  # noqa: E731
    return {"count": len(sorted_ns), "p50_ms": ms(percentile(sorted_ns, 50)),
            "p99_ms": ms(percentile(sorted_ns, 99)), "max_ms": ms(sorted_ns[-1] if sorted_ns else None)}


def longest_outage(pairs: list[tuple[Op, Op | None]], end_ns: int) -> tuple[int, int] | None:
    """(start_ns, end_ns) of the longest outage of these ops (see the module doc), or None if there were no ops."""
    invokes = sorted(inv.time_ns for inv, _ in pairs)
    oks, others = [], []
    for inv, comp in pairs:
        if comp is None:
            others.append(max(end_ns, inv.time_ns))
        elif comp.type == OK:
            oks.append(comp.time_ns)
        else:
            others.append(comp.time_ns)
    if not invokes:
        return None
    oks.sort()
    others.sort()
    # Merge the three sorted streams; at equal times: invokes, then fail/info, then ok.
    i = j = k = 0
    ni, nj, nk = len(invokes), len(others), len(oks)
    inf = float("inf")
    outstanding = 0
    demand_since = None
    best = (0, invokes[0], invokes[0])
    last_t = invokes[0]
    while i < ni or j < nj or k < nk:
        ti = invokes[i] if i < ni else inf
        tj = others[j] if j < nj else inf
        tk = oks[k] if k < nk else inf
        if ti <= tj and ti <= tk:
            outstanding += 1
            if demand_since is None:
                demand_since = ti
            i += 1
            last_t = ti
        elif tj <= tk:
            outstanding -= 1
            j += 1
            last_t = tj
        else:
            outstanding -= 1
            if demand_since is not None and tk - demand_since > best[0]:
                best = (tk - demand_since, demand_since, tk)
            demand_since = tk if outstanding > 0 else None
            k += 1
            last_t = tk
    if demand_since is not None and last_t - demand_since > best[0]:
        best = (last_t - demand_since, demand_since, last_t)
    return best[1], best[2]


def _availability(pairs: list[tuple[Op, Op | None]], end_ns: int) -> dict:
    counts = Counter()
    errors: Counter[str] = Counter()
    lat_ok, lat_all = [], []
    for inv, comp in pairs:
        if comp is None:
            counts["unfinished"] += 1
            continue
        t = comp.type
        counts[t] += 1
        d = comp.time_ns - inv.time_ns
        lat_all.append(d)
        if t == OK:
            lat_ok.append(d)
        elif comp.error is not None:
            errors[comp.error] += 1
    lat_ok.sort()
    lat_all.sort()
    invoked = len(pairs)
    outage = longest_outage(pairs, end_ns)
    lip = errors.get(LOAD_IN_PROGRESS, 0)
    return {
        "invoked": invoked, "ok": counts[OK], "fail": counts[FAIL], "info": counts[INFO],
        "unfinished": counts["unfinished"],
        "latency": {"ok": _latency(lat_ok), "all": _latency(lat_all)},
        "longest_outage_ms": 0.0 if outage is None else (outage[1] - outage[0]) / 1e6,
        "longest_outage": None if outage is None else {"start_ms": outage[0] / 1e6, "end_ms": outage[1] / 1e6},
        "errors": dict(errors.most_common()),
        "load_in_progress": lip,
        "load_in_progress_share": lip / invoked if invoked else 0.0,
        "client_visible_waits": counts[FAIL] + counts[INFO],
    }
