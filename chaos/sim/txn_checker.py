"""What the transaction simulation must never show (Jepsen's anomaly classes for Kafka transactions),
judged on the model partitions' read_committed and read_uncommitted views, sampled during the run and
at the end, and on the transaction states the quorum committed; everything the quorum checker checks
still holds.  The anomalies are described in docs/simulation.md, section 7, "The checker".
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from records import RecordError, TransactionStateRecord, decode_batch

from .checker import Checker, Violation
from .node import Cluster
from .txn_log import ModelStorage


class _Partitioned(Protocol):
    storage: ModelStorage


class TxnCluster(Cluster, Protocol):
    """What the transaction checker reads of the simulation: its nodes and its brokers' partitions."""

    txn_brokers: Sequence[_Partitioned]


@dataclass
class ClientTxn:
    """One transaction as its client saw it."""
    number: int
    tid: str
    instance: str
    producer_id: int
    epoch: int
    topic: str
    began: float
    sent: list[str] = field(default_factory=list)
    acked: dict[str, list[str]] = field(default_factory=dict)   # partition -> values acknowledged there
    asks: list[str] = field(default_factory=list)              # "commit" / "abort", in the order asked
    commit_asked_at: float | None = None
    outcome: str | None = None  # committed, aborted, unknown; None: the client never ended it

    @property
    def values(self) -> list[str]:
        return [v for vs in self.acked.values() for v in vs]


class TxnChecker(Checker):
    def __init__(self, sim: TxnCluster):
        super().__init__(sim)
        self.txns: list[ClientTxn] = []
        self.of_value: dict[str, ClientTxn] = {}
        self.asked: Counter = Counter()      # (tid, "commit" | "abort") -> asks by clients
        self.prepared: Counter = Counter()   # (tid, "commit" | "abort") -> prepares the quorum committed (own epoch)
        self.fenced_aborts = 0
        self.last_state: dict[str, TransactionStateRecord] = {}
        self.samples = 0

    # ----------------------------------------------------------- clients
    def producer_id(self, tid: str, pid: int) -> None:
        if self.txn_pid.get(tid) != pid:
            self.txn_pid[tid] = pid
            self.issue(pid, pid + 1, f"producer id of {tid}")

    def begin(self, tid: str, instance: str, pid: int, epoch: int, topic: str) -> ClientTxn:
        txn = ClientTxn(len(self.txns) + 1, tid, instance, pid, epoch, topic, self.sim.clock.now)
        self.txns.append(txn)
        return txn

    def sent(self, txn: ClientTxn, value: str) -> None:
        txn.sent.append(value)
        self.of_value[value] = txn

    def ask(self, txn: ClientTxn, what: str) -> None:
        txn.asks.append(what)
        self.asked[(txn.tid, what)] += 1
        if what == "commit" and txn.commit_asked_at is None:
            txn.commit_asked_at = self.sim.clock.now

    # ------------------------------------------------------------ quorum
    def _note_records(self, index: int, payload: bytes, result) -> None:
        super()._note_records(index, payload, result)
        try:
            records = decode_batch(payload)
        except RecordError:
            return
        errors = result if isinstance(result, list) else [None] * len(records)
        for rec, err in zip(records, errors):
            if err is None and isinstance(rec, TransactionStateRecord):
                self._transition(index, rec)

    def _transition(self, index: int, rec: TransactionStateRecord) -> None:
        tid = rec.transactional_id
        old = self.last_state.get(tid)
        self.last_state[tid] = rec
        if old is None or old.state != "Ongoing" or rec.state not in ("PrepareCommit", "PrepareAbort"):
            return
        if rec.state == "PrepareAbort" and rec.producer_epoch != old.producer_epoch:
            self.fenced_aborts += 1  # a timeout or a new instance's InitProducerId: the epoch is bumped
            return
        what = "commit" if rec.state == "PrepareCommit" else "abort"
        self.prepared[(tid, what)] += 1
        if self.prepared[(tid, what)] > self.asked[(tid, what)]:
            raise Violation(
                f"anomaly (a transaction ended that nobody asked to end): entry {index} prepares transaction "
                f"{rec.sequence} of {tid!r} to {what} ({rec.state}, epoch {rec.producer_epoch}): the quorum has "
                f"committed {self.prepared[(tid, what)]} such prepares, its clients asked {self.asked[(tid, what)]}")

    # ------------------------------------------------------------ views
    def _partitions(self):
        return [p for b in self.sim.txn_brokers for p in b.storage.all()]

    def sample(self) -> None:
        """What must hold at any moment: no value readable before its commit was asked, none of an
        aborted transaction, no duplicate, per-producer order, the LSO below every open transaction."""
        self.samples += 1
        for part in self._partitions():
            lso = part.last_stable_offset
            for pid, (epoch, first) in part.ongoing.items():
                if lso > first:
                    raise Violation(f"anomaly (LSO past an open transaction): {part.name} has LSO {lso}, producer "
                                    f"{pid}'s transaction is open from offset {first}")
            committed = part.read_committed()
            for e in committed:
                txn = self.of_value.get(e.value)
                if txn is None:
                    raise Violation(f"anomaly (phantom): {part.name} offset {e.offset} holds {e.value!r}, which no "
                                    f"client sent")
                if txn.outcome == "aborted":
                    raise Violation(f"anomaly (aborted read, G1a): {part.name} offset {e.offset}: {e.value!r} of "
                                    f"transaction {txn.number} ({txn.tid}), whose abort was answered OK, is readable")
                if "commit" not in txn.asks:
                    raise Violation(f"anomaly (read before commit): {part.name} offset {e.offset}: {e.value!r} of "
                                    f"transaction {txn.number} ({txn.instance}) is readable (LSO {lso}) and its client "
                                    f"has not asked to commit it (asked: {txn.asks or 'nothing'})")
            self._open_below_lso(part, lso)
            self._duplicates_and_order(part)

    def _open_below_lso(self, part, lso: int) -> None:
        """A value of a transaction its client has not ended, below the LSO, ended by an abort marker of the
        transaction's own epoch: an abort nobody asked for (a timeout or fencing bumps the epoch)."""
        for e in part.log[:lso]:
            if e.kind != "data":
                continue
            txn = self.of_value.get(e.value)
            if txn is None or txn.asks or txn.outcome is not None:
                continue
            marker = next((m for m in part.log[e.offset + 1:lso] if m.kind != "data" and m.producer_id ==
                           e.producer_id), None)
            if marker is not None and marker.kind == "abort" and marker.epoch == e.epoch:
                raise Violation(f"anomaly (LSO past an open transaction): {part.name} offset {e.offset}: "
                                f"{e.value!r} of transaction {txn.number} ({txn.instance}), which its client has not "
                                f"ended, was aborted by a marker of its own epoch {e.epoch} at offset {marker.offset}")

    def _duplicates_and_order(self, part) -> None:
        seen: set[str] = set()
        last: dict[str, int] = {}
        for e in part.read_uncommitted():
            if e.value in seen:
                raise Violation(f"anomaly (duplicate): {part.name} holds {e.value!r} twice (again at offset {e.offset})")
            seen.add(e.value)
            instance, _, n = e.value.rpartition(".")
            if int(n) < last.get(instance, 0):
                raise Violation(f"anomaly (order): {part.name} offset {e.offset}: {e.value!r} after value "
                                f"{instance}.{last[instance]} of the same producer")
            last[instance] = int(n)

    def final(self, *args) -> None:
        """At the end (everything completed): the sampled properties, then per transaction: committed ones
        wholly readable, aborted ones not at all, every other one all or nothing, no open transaction left
        in a partition."""
        if args:  # the quorum checker's own final check (acknowledged blocks)
            super().final(*args)
            return
        self.sample()
        readable: dict[str, int] = {}
        for part in self._partitions():
            if part.ongoing:
                raise Violation(f"anomaly (hanging transaction): {part.name} still holds open transactions of "
                                f"producers {sorted(part.ongoing)} at the end (LSO {part.last_stable_offset}, high "
                                f"watermark {part.high_watermark})")
            for e in part.read_committed():
                readable[e.value] = e.offset
        for txn in self.txns:
            values = txn.values
            seen = [v for v in values if v in readable]
            if txn.outcome == "committed" and len(seen) != len(values):
                missing = [v for v in values if v not in readable]
                raise Violation(f"anomaly (lost write): transaction {txn.number} ({txn.instance}) was committed (EndTxn "
                                f"answered OK) but {missing[:5]} are not readable")
            if seen and len(seen) != len(values):
                raise Violation(f"anomaly (torn transaction): transaction {txn.number} ({txn.instance}, outcome "
                                f"{txn.outcome}) is partly readable: {seen[:5]} but not "
                                f"{[v for v in values if v not in readable][:5]}")
            # sent but unacknowledged values: readable only with the rest of their transaction
            extra = [v for v in txn.sent if v in readable and v not in values]
            if extra and not seen and values:
                raise Violation(f"anomaly (torn transaction): transaction {txn.number} ({txn.instance}): unacknowledged "
                                f"{extra[:5]} readable, its acknowledged values not")

    def figures(self) -> dict:
        outcomes = Counter(t.outcome or "open" for t in self.txns)
        return {"transactions": len(self.txns), "txn_committed": outcomes["committed"],
                "txn_aborted": outcomes["aborted"], "txn_unknown": outcomes["unknown"], "txn_open": outcomes["open"],
                "txn_values": sum(len(t.values) for t in self.txns), "txn_fencing_aborts": self.fenced_aborts,
                "txn_samples": self.samples}
