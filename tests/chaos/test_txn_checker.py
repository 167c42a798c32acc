"""The transactions checker (``chaos.txn_checker.check``) on synthetic histories: a clean one passes, and
each anomaly class is found, counted and described.

``World`` builds a history and the broker's log together (so the read-back is what a correct broker
would return), and each test then breaks one thing.
"""
from __future__ import annotations

import json

import pytest

from chaos.history import FAIL, INFO, INVOKE, OK, Op
from chaos.txn_checker import ANOMALIES, check

CF, KP = "confluent-kafka", "kafka-python"


class World:
    def __init__(self, partitions: int = 3):
        self.partitions = partitions
        self.ops: list[Op] = []
        self.now = 1_000_000_000
        self.log: dict[int, list[dict]] = {p: [] for p in range(partitions)}
        self.instances: dict[str, int] = {}
        self.seq: dict[str, int] = {}

    # ------------------------------------------------------------ history
    def tick(self, ms: float = 1.0) -> int:
        self.now += int(ms * 1e6)
        return self.now

    def op(self, process, type_, f, value=None, error=None, t=None) -> Op:
        op = Op(process, type_, f, value, self.tick() if t is None else t,
                None if type_ in (INVOKE, OK) else (error or "boom"), len(self.ops))
        self.ops.append(op)
        return op

    def next_txn(self, process: str) -> str:
        n = self.seq.get(process, 0)
        self.seq[process] = n + 1
        return f"{process}:{n}"

    def init(self, process: str, instance: int) -> tuple[int, int]:
        a = self.op(process, INVOKE, "init", {"instance": instance})
        b = self.op(process, OK, "init", {"instance": instance})
        self.instances[process] = instance
        return a.time_ns, b.time_ns

    # ------------------------------------------------------------ log
    def _append(self, p: int, batch: dict) -> int:
        off = self.log[p][-1]["last_offset"] + 1 if self.log[p] else 0
        batch["base_offset"] = off
        n = len(batch.get("records", [])) or 1
        batch["last_offset"] = off + n - 1
        if "records" in batch:
            batch["records"] = [[off + i, v] for i, v in enumerate(batch["records"])]
        self.log[p].append(batch)
        return off

    def data(self, p: int, pid: int, values: list[str], transactional: bool = True) -> int:
        return self._append(p, {"producer_id": pid, "producer_epoch": 0, "transactional": transactional,
                                "control": False, "records": list(values)})

    def marker(self, p: int, pid: int, kind: str) -> int:
        return self._append(p, {"producer_id": pid, "producer_epoch": 0, "transactional": True, "control": True,
                                "control_type": kind})

    # ------------------------------------------------------------ producers
    def txn(self, process: str, writes: list[tuple[str, int]] | None = None, outcome: str = "committed",
            lib: str = CF, pid: int = 1000, markers: str | None = "auto", nvalues: int = 3) -> dict:
        """One transaction: invoke, its data in the log, commit (or abort), markers, completion."""
        n = self.seq.get(process, 0)
        self.seq[process] = n + 1
        inst = self.instances.get(process, 1)
        txn = f"{process}:{n}"
        if writes is None:
            writes = [(f"{txn}:{i}", i % self.partitions) for i in range(nvalues)]
        else:
            writes = [(v.replace("*", txn), p) for v, p in writes]
        self.op(process, INVOKE, "txn", {"txn": txn, "lib": lib, "instance": inst, "values": [list(w) for w in writes]})
        for v, p in writes:
            self.data(p, pid, [v])
        commit_asked = None
        if outcome in ("committed", "unknown", "aborted-after-commit"):
            commit_asked = self.op(process, INVOKE, "commit", {"txn": txn, "instance": inst}).time_ns
            self.op(process, OK if outcome == "committed" else INFO, "commit", {"txn": txn, "instance": inst})
        if outcome in ("aborted", "aborted-after-commit"):
            self.op(process, INVOKE, "abort", {"txn": txn, "instance": inst})
            self.op(process, OK, "abort", {"txn": txn, "instance": inst})
        kind = {"committed": "commit", "aborted": "abort", "aborted-after-commit": "abort", "abandoned": "abort",
                "unknown": "abort"}[outcome] if markers == "auto" else markers
        if kind is not None:
            for p in sorted({p for _, p in writes}):
                self.marker(p, pid, kind)
        final = "aborted" if outcome == "aborted-after-commit" else outcome
        type_ = OK if final == "committed" else FAIL if final in ("aborted", "abandoned") else INFO
        self.op(process, type_, "txn", {"txn": txn, "lib": lib, "instance": inst, "values": [list(w) for w in writes],
                                        "outcome": final, "commit_asked_ns": commit_asked, "errors": []})
        return {"txn": txn, "writes": writes, "commit_asked": commit_asked}

    def idem(self, process: str, n_values: int = 3, pid: int = 1, acked: bool = True, lib: str = KP) -> list[str]:
        n = self.seq.get(process, 0)
        self.seq[process] = n + 1
        batch = f"{process}:{n}"
        writes = [(f"{batch}:{i}", i % self.partitions) for i in range(n_values)]
        self.op(process, INVOKE, "write", {"batch": batch, "lib": lib, "instance": 1,
                                           "values": [list(w) for w in writes]})
        offs = [self.data(p, pid, [v], transactional=False) for v, p in writes]
        value = {"batch": batch, "lib": lib, "instance": 1,
                 "acked": [[v, p, o] for (v, p), o in zip(writes, offs)] if acked else [],
                 "unacked": [] if acked else [[v, p, "timeout"] for v, p in writes]}
        self.op(process, OK if acked else INFO, "write", value)
        return [v for v, _ in writes]

    # ------------------------------------------------------------ readers
    def offsets(self) -> tuple[dict[int, int], dict[int, int]]:
        """The LSO and HW of every partition, as a correct broker computes them from the log."""
        lso, hw = {}, {}
        for p, batches in self.log.items():
            hw[p] = batches[-1]["last_offset"] + 1 if batches else 0
            open_: dict[int, int] = {}
            for b in batches:
                if b["control"]:
                    open_.pop(b["producer_id"], None)
                elif b["transactional"]:
                    open_.setdefault(b["producer_id"], b["base_offset"])
            lso[p] = min(open_.values()) if open_ else hw[p]
        return lso, hw

    def sample(self, lso: dict | None = None, hw: dict | None = None) -> None:
        real_lso, real_hw = self.offsets()
        self.op("reader-lso", INVOKE, "lso")
        self.op("reader-lso", OK, "lso", {"lso": {str(k): v for k, v in (lso or real_lso).items()},
                                          "hw": {str(k): v for k, v in (hw or real_hw).items()}})

    def poll(self, records: list[list] | None = None) -> None:
        self.op("reader-rc", INVOKE, "poll")
        self.op("reader-rc", OK, "poll", {"records": records if records is not None else self.committed()})

    def committed(self) -> list[list]:
        """What read_committed returns now: data below the LSO, aborted transactions' left out."""
        lso, _ = self.offsets()
        out = []
        for p, batches in self.log.items():
            ends: dict[tuple[int, int], str] = {}  # (pid, data offset) -> marker kind
            pending: dict[int, list[dict]] = {}
            for b in batches:
                if b["control"]:
                    for d in pending.pop(b["producer_id"], []):
                        ends[(b["producer_id"], d["base_offset"])] = b["control_type"]
                elif b["transactional"]:
                    pending.setdefault(b["producer_id"], []).append(b)
            for b in batches:
                if b["control"] or b["base_offset"] >= lso[p]:
                    continue
                if b["transactional"] and ends.get((b["producer_id"], b["base_offset"])) != "commit":
                    continue
                out += [[p, o, v] for o, v in b["records"]]
        return out

    def readback(self) -> dict:
        lso, hw = self.offsets()
        uncommitted = [[p, o, v] for p, bs in self.log.items() for b in bs if not b["control"] for o, v in b["records"]]
        return {"topic": "t", "partitions": self.partitions,
                "settle": {"settled": lso == hw, "lso": {str(k): v for k, v in lso.items()},
                           "hw": {str(k): v for k, v in hw.items()}},
                "read_committed": {"records": self.committed(), "complete": True},
                "read_uncommitted": {"records": uncommitted, "complete": True},
                "log": {"batches": {str(p): bs for p, bs in self.log.items()}, "complete": True}}


def clean_world() -> World:
    """Both libraries, every outcome, idempotent producers beside, samples and polls, a fence."""
    w = World()
    w.init("txn-cf-1", 1)
    w.init("txn-kp-1", 1)
    w.txn("txn-cf-1", pid=1000)
    w.sample()
    w.poll()
    w.txn("txn-kp-1", lib=KP, pid=2000)
    w.idem("idem-kp-1", pid=1)
    w.txn("txn-cf-1", outcome="aborted", pid=1000)
    w.sample()
    w.txn("txn-kp-1", outcome="aborted-after-commit", lib=KP, pid=2000)
    w.txn("txn-cf-1", outcome="unknown", pid=1000)              # not committed in the end: absent
    w.txn("txn-kp-1", outcome="unknown", lib=KP, pid=2000, markers="commit")  # committed in the end: whole
    w.idem("idem-kp-1", pid=1)
    w.txn("txn-cf-1", outcome="abandoned", pid=1000)
    # A fence: instance 2 of txn-cf-1 initialized; instance 1's next commit fails.
    w.op("nemesis", INVOKE, "fence")
    t0, t1 = w.tick(), w.tick()
    w.op("nemesis", OK, "fence", {"start": {"process": "txn-cf-1", "instance": 2, "init_invoked_ns": t0,
                                            "init_returned_ns": t1}, "stop": {}})
    w.txn("txn-cf-1", outcome="unknown", pid=1000, markers="abort")
    w.instances["txn-cf-1"] = 2
    w.txn("txn-cf-1", pid=1001)
    # An open transaction held back the LSO at a sample, then ended.
    assert w.next_txn("txn-kp-1") == "txn-kp-1:3"
    w.op("txn-kp-1", INVOKE, "txn", {"txn": "txn-kp-1:3", "lib": KP, "instance": 1,
                                     "values": [["txn-kp-1:3:0", 0], ["txn-kp-1:3:1", 1]]})
    w.data(0, 2000, ["txn-kp-1:3:0"])
    w.idem("idem-kp-1", pid=1)
    w.sample()
    w.poll()
    w.data(1, 2000, ["txn-kp-1:3:1"])
    w.op("txn-kp-1", INVOKE, "commit", {"txn": "txn-kp-1:3", "instance": 1})
    w.marker(0, 2000, "commit")
    w.marker(1, 2000, "commit")
    w.op("txn-kp-1", OK, "commit", {"txn": "txn-kp-1:3", "instance": 1})
    w.op("txn-kp-1", OK, "txn", {"txn": "txn-kp-1:3", "lib": KP, "instance": 1, "outcome": "committed",
                                 "values": [["txn-kp-1:3:0", 0], ["txn-kp-1:3:1", 1]]})
    w.sample()
    w.poll()
    return w


def test_a_clean_history_passes_with_every_outcome():
    w = clean_world()
    v = check(w.ops, w.readback())
    assert v.valid, json.dumps(v.to_dict()["anomalies"], indent=1)
    s = v.stats
    assert s["transactions"] == 10
    assert s["transactions_by_lib"] == {CF: {"abandoned": 1, "aborted": 1, "committed": 2, "unknown": 2},
                                        KP: {"aborted": 1, "committed": 2, "unknown": 1}}
    assert s["unknown_resolved"] == {"not committed (absent)": 2, "committed (seen whole)": 1}
    assert s["idempotent"]["acknowledged"] == 9 and s["lso_samples"] == 4 and s["fences"] == 1
    assert s["markers"]["commit"] > 0 and s["markers"]["abort"] > 0 and s["open_spans"] == 0
    d = v.to_dict()
    assert d["anomaly_classes"] == list(ANOMALIES) and d["anomaly_counts"] == {}
    json.dumps(d)  # the verdict is JSON


def _only(v, kind: str) -> list[dict]:
    assert not v.valid
    assert kind in v.anomaly_counts, v.anomaly_counts
    return v.anomalies[kind]


def test_lost_write_of_a_committed_transaction_and_of_an_acknowledged_idempotent_value():
    w = clean_world()
    t = w.txn("txn-kp-1", lib=KP, pid=2000)
    vals = w.idem("idem-kp-1", pid=1)
    rb = w.readback()
    gone = {t["writes"][1][0], vals[2]}
    rb["read_committed"]["records"] = [r for r in rb["read_committed"]["records"] if r[2] not in gone]
    v = check(w.ops, rb)
    ex = _only(v, "lost-write")
    assert v.anomaly_counts["lost-write"] == 2
    assert {e["value"] for e in ex} == gone
    assert v.anomaly_counts["torn-transaction"] == 1  # the transaction is now partly visible too


def test_aborted_read_g1a_of_an_aborted_and_of_an_abandoned_transaction():
    w = clean_world()
    w.txn("txn-cf-1", outcome="aborted", pid=1001, markers="commit")    # the broker committed it anyway
    w.txn("txn-kp-1", outcome="abandoned", lib=KP, pid=2000, markers="commit")
    v = check(w.ops, w.readback())
    ex = _only(v, "aborted-read")
    assert v.anomaly_counts["aborted-read"] == 2
    assert {e["outcome"] for e in ex} == {"aborted", "abandoned"}
    assert "torn-transaction" not in v.anomaly_counts  # wholly visible: G1a, not torn


def test_torn_transaction_of_unknown_outcome():
    w = clean_world()
    t = w.txn("txn-cf-1", outcome="unknown", pid=1001, markers="commit", nvalues=3)
    rb = w.readback()
    rb["read_committed"]["records"] = [r for r in rb["read_committed"]["records"] if r[2] != t["writes"][0][0]]
    v = check(w.ops, rb)
    ex = _only(v, "torn-transaction")
    assert v.anomaly_counts == {"torn-transaction": 1}
    assert ex[0]["txn"] == t["txn"] and ex[0]["outcome"] == "unknown"
    assert [m[0] for m in ex[0]["missing"]] == [t["writes"][0][0]]


def test_read_before_commit_seen_by_a_poll():
    w = clean_world()
    txn = w.next_txn("txn-cf-1")
    w.op("txn-cf-1", INVOKE, "txn", {"txn": txn, "lib": CF, "instance": 2, "values": [[f"{txn}:0", 2]]})
    off = w.data(2, 1001, [f"{txn}:0"])
    w.poll([[2, off, f"{txn}:0"]])  # returned to read_committed before the commit below was asked
    w.op("txn-cf-1", INVOKE, "commit", {"txn": txn, "instance": 2})
    w.marker(2, 1001, "commit")
    w.op("txn-cf-1", OK, "commit", {"txn": txn, "instance": 2})
    w.op("txn-cf-1", OK, "txn", {"txn": txn, "lib": CF, "instance": 2, "outcome": "committed",
                                 "values": [[f"{txn}:0", 2]]})
    v = check(w.ops, w.readback())
    ex = _only(v, "read-before-commit")
    assert v.anomaly_counts == {"read-before-commit": 1}
    assert ex[0]["evidence"] == "poll" and ex[0]["txn"] == txn and ex[0]["commit_asked_ms"] > ex[0]["seen_ms"]


def test_read_before_commit_from_a_commit_marker_below_an_earlier_high_watermark():
    # The late-EndTxn shape: transaction n+1 is committed by the broker before its own commit was asked.
    w = clean_world()
    txn = w.next_txn("txn-kp-1")
    vals = [[f"{txn}:0", 0], [f"{txn}:1", 1]]
    w.op("txn-kp-1", INVOKE, "txn", {"txn": txn, "lib": KP, "instance": 1, "values": vals})
    w.data(0, 2000, [f"{txn}:0"])
    w.data(1, 2000, [f"{txn}:1"])
    w.marker(0, 2000, "commit")
    w.marker(1, 2000, "commit")
    w.sample()  # its HW is above both markers
    w.op("txn-kp-1", INVOKE, "commit", {"txn": txn, "instance": 1})
    w.op("txn-kp-1", OK, "commit", {"txn": txn, "instance": 1})
    w.op("txn-kp-1", OK, "txn", {"txn": txn, "lib": KP, "instance": 1, "outcome": "committed", "values": vals})
    v = check(w.ops, w.readback())
    ex = _only(v, "read-before-commit")
    assert v.anomaly_counts == {"read-before-commit": 1}
    assert ex[0]["evidence"] == "marker" and ex[0]["txn"] == txn


def test_lso_past_an_open_transaction():
    w = clean_world()
    txn = w.next_txn("txn-cf-1")
    vals = [[f"{txn}:0", 1]]
    w.op("txn-cf-1", INVOKE, "txn", {"txn": txn, "lib": CF, "instance": 2, "values": vals})
    first = w.data(1, 1001, [f"{txn}:0"])
    lso, hw = w.offsets()
    assert lso[1] == first
    w.sample(lso={**lso, 1: first + 1}, hw=hw)  # the broker's LSO passed the open transaction
    w.op("txn-cf-1", INVOKE, "commit", {"txn": txn, "instance": 2})
    w.marker(1, 1001, "commit")
    w.op("txn-cf-1", OK, "commit", {"txn": txn, "instance": 2})
    w.op("txn-cf-1", OK, "txn", {"txn": txn, "lib": CF, "instance": 2, "outcome": "committed", "values": vals})
    v = check(w.ops, w.readback())
    ex = _only(v, "lso-past-open-transaction")
    assert v.anomaly_counts == {"lso-past-open-transaction": 1}
    assert ex[0]["partition"] == 1 and ex[0]["span_first"] == first and ex[0]["transactions"] == [txn]


def test_lso_past_a_transaction_never_ended_in_the_final_read():
    w = clean_world()
    txn = w.next_txn("txn-kp-1")
    w.op("txn-kp-1", INVOKE, "txn", {"txn": txn, "lib": KP, "instance": 1, "values": [[f"{txn}:0", 2]]})
    w.data(2, 2000, [f"{txn}:0"])
    rb = w.readback()
    rb["settle"] = {"settled": True, "lso": rb["settle"]["hw"], "hw": rb["settle"]["hw"]}  # the LSO lies
    v = check(w.ops, rb)
    ex = _only(v, "lso-past-open-transaction")
    assert ex[0]["sample"] == "final" and ex[0]["span_marker"] is None


def test_duplicates_in_read_committed_and_of_idempotent_values_in_read_uncommitted():
    w = clean_world()
    t = w.txn("txn-cf-1", pid=1001)
    vals = w.idem("idem-kp-1", pid=1)
    v0, p0 = t["writes"][0]
    w.data(p0, 1001, [v0])          # a retried batch stored again inside the transaction
    w.marker(p0, 1001, "commit")
    w.data(0, 1, [vals[0]], transactional=False)  # an idempotent retry stored twice
    v = check(w.ops, w.readback())
    ex = _only(v, "duplicate")
    reads = {(e["value"], e["read"]) for e in ex}
    assert (v0, "read_committed") in reads
    assert (vals[0], "read_uncommitted") in reads and (vals[0], "read_committed") in reads


def test_order_of_an_idempotent_producer_and_within_a_transaction():
    w = clean_world()
    batch = w.next_txn("idem-kp-1")
    writes = [[f"{batch}:0", 0], [f"{batch}:1", 0]]
    w.op("idem-kp-1", INVOKE, "write", {"batch": batch, "lib": KP, "instance": 1, "values": writes})
    o1 = w.data(0, 1, [f"{batch}:1"], transactional=False)  # stored in the other order
    o0 = w.data(0, 1, [f"{batch}:0"], transactional=False)
    w.op("idem-kp-1", OK, "write", {"batch": batch, "lib": KP, "instance": 1, "unacked": [],
                                    "acked": [[f"{batch}:0", 0, o0], [f"{batch}:1", 0, o1]]})
    w.txn("txn-cf-1", writes=[("*:0", 2), ("*:1", 2)], pid=1001)
    b = w.log[2]
    b[-3]["records"][0][1], b[-2]["records"][0][1] = b[-2]["records"][0][1], b[-3]["records"][0][1]  # swap
    v = check(w.ops, w.readback())
    ex = _only(v, "order")
    assert v.anomaly_counts == {"order": 2}
    assert {e["producer"] for e in ex} == {"idem-kp-1", "txn-cf-1"}


def test_a_fenced_instance_whose_commit_returns():
    w = clean_world()
    w.op("nemesis", INVOKE, "fence")
    t0, t1 = w.tick(), w.tick()
    w.op("nemesis", OK, "fence", {"start": {"process": "txn-kp-1", "instance": 2, "init_invoked_ns": t0,
                                            "init_returned_ns": t1}, "stop": {}})
    t = w.txn("txn-kp-1", lib=KP, pid=2000)  # instance 1 commits after instance 2's init returned
    v = check(w.ops, w.readback())
    ex = _only(v, "fenced-commit")
    assert v.anomaly_counts == {"fenced-commit": 1}
    assert ex[0]["txn"] == t["txn"] and ex[0]["instance"] == 1 and ex[0]["fencing_instance"] == 2


def test_a_commit_in_flight_when_the_fence_started_may_return():
    w = World()
    w.init("txn-kp-1", 1)
    w.op("txn-kp-1", INVOKE, "txn", {"txn": "txn-kp-1:0", "lib": KP, "instance": 1, "values": [["txn-kp-1:0:0", 0]]})
    w.data(0, 2000, ["txn-kp-1:0:0"])
    w.op("txn-kp-1", INVOKE, "commit", {"txn": "txn-kp-1:0", "instance": 1})
    t0 = w.tick()                              # the fencer's init starts ...
    w.marker(0, 2000, "commit")
    w.op("txn-kp-1", OK, "commit", {"txn": "txn-kp-1:0", "instance": 1})
    w.op("txn-kp-1", OK, "txn", {"txn": "txn-kp-1:0", "lib": KP, "instance": 1, "outcome": "committed",
                                 "values": [["txn-kp-1:0:0", 0]]})
    t1 = w.tick()                              # ... and returns once the commit is complete
    w.op("nemesis", INVOKE, "fence")
    w.op("nemesis", OK, "fence", {"start": {"process": "txn-kp-1", "instance": 2, "init_invoked_ns": t0,
                                            "init_returned_ns": t1}})
    v = check(w.ops, w.readback())
    assert v.valid, v.anomaly_counts


def test_unknown_values_and_incomplete_reads():
    w = clean_world()
    rb = w.readback()
    rb["read_committed"]["records"].append([0, 999, "nobody:0:0"])
    rb["read_uncommitted"]["complete"] = False
    v = check(w.ops, rb)
    assert v.anomaly_counts == {"incomplete-read": 1, "unknown-value": 1}
    assert v.anomalies["unknown-value"][0]["value"] == "nobody:0:0"


def test_examples_are_capped_but_every_anomaly_is_counted():
    w = clean_world()
    for _ in range(30):
        w.txn("txn-cf-1", outcome="aborted", pid=1001, markers="commit")
    v = check(w.ops, w.readback(), max_examples=5)
    assert v.anomaly_counts["aborted-read"] == 30 and len(v.anomalies["aborted-read"]) == 5


@pytest.mark.parametrize("kind", sorted(ANOMALIES))
def test_every_class_is_described(kind):
    assert ANOMALIES[kind].strip().endswith(".")
