"""What must hold after every step of a simulation, and at its end.

``Checker`` checks Raft's safety properties (Raft paper, figure 3) on the nodes' real state, and
pidquorum's own: no committed entry lost from a node's durable state, no producer ID issued twice,
every acknowledged block in the final state.  The list, property by property, is in
docs/simulation.md, section 1, "The checker".
"""
from __future__ import annotations

import bisect
import zlib

from records import AllocateProducerIdsRecord, ProducerIdSeedRecord, RecordError, TransactionalIdRecord, decode_batch

from .node import Cluster, SimulatedNode


class Violation(AssertionError):
    """A safety property failed (the message says which, where and with what)."""


def _h(payload: bytes) -> int:
    return zlib.crc32(payload)


class Ranges:
    """Disjoint [start, end) ranges, each with what it was; ``add`` refuses an overlap."""

    def __init__(self):
        self.starts: list[int] = []
        self.items: list[tuple[int, int, str]] = []

    def overlap(self, start: int, end: int) -> tuple[int, int, str] | None:
        i = bisect.bisect_right(self.starts, start)
        for j in (i - 1, i):
            if 0 <= j < len(self.items):
                s, e, w = self.items[j]
                if start < e and s < end:
                    return self.items[j]
        return None

    def add(self, start: int, end: int, what: str) -> None:
        i = bisect.bisect_right(self.starts, start)
        self.starts.insert(i, start)
        self.items.insert(i, (start, end, what))

    def __contains__(self, span: tuple[int, int]) -> bool:
        i = bisect.bisect_left(self.starts, span[0])
        return i < len(self.items) and self.items[i][:2] == span


class Checker:
    def __init__(self, sim: Cluster):
        self.sim = sim
        self.ledger: dict[int, tuple[int, int]] = {}      # committed index -> (term, crc of the command)
        self.applied_by: dict[int, str] = {}               # index -> the first node that applied it
        self.commit_term: dict[int, int] = {}              # index -> a term by which it was committed (an upper bound)
        self.leaders: dict[int, str] = {}                 # term -> leader address
        self.held: dict[int, tuple[int, int]] = {}        # node id -> (start, highest committed index its log holds)
        self.committed = Ranges()                        # committed allocations (and seeded ZooKeeper blocks)
        self.issued = Ranges()                           # acknowledged [start, end) ranges, with what
        self.max_index = 0
        self.txn_epochs: set[tuple[str, int, int]] = set()
        self.txn_pid: dict[str, int] = {}
        self.handed: dict[int, int] = {}  # producer ID -> the broker that handed it out
        self.votes: dict[tuple[str, int], str] = {}       # (voter, term) -> the candidate it granted its vote to
        self.terms: dict[int, int] = {}                   # node id -> highest term its journal held while it ran
        self.installs = 0                                 # snapshots installed by followers
        self.installs_on_conflict = 0                     # of them, on a log holding the snapshot's index in another term
        self.installs_over_tail = 0                       # ... and entries after it (the tail the install must drop)
        self.checks = 0

    # ------------------------------------------------------------ applies
    def watch(self, node: SimulatedNode) -> None:
        raft = node.service.raft
        original = raft._on_apply

        def on_apply(index, term, payload, _node=node, _original=original):
            result = _original(index, term, payload)
            self._applied(_node, index, term, payload, result)
            return result

        raft._on_apply = on_apply

    # ------------------------------------------------------ votes and terms
    def vote(self, voter: str, term, candidate: str) -> None:
        """``voter`` sent ``candidate`` a granted vote in ``term``: never another candidate in that term."""
        if not isinstance(term, int):
            return
        other = self.votes.setdefault((voter, term), candidate)
        if other != candidate:
            raise Violation(f"one vote per term: {voter} voted for {other} and for {candidate} in term {term}")

    def started(self, node: SimulatedNode) -> None:
        """``node`` started: its term is at least the highest it held while it ran before."""
        term = node.raft.raft_term
        held = self.terms.get(node.node_id, 0)
        if term < held:
            raise Violation(f"term went back: node {node.node_id} held term {held} before it stopped and starts "
                            f"again in term {term} (start {node.starts})")
        self.terms[node.node_id] = max(held, term)

    def forget_term(self, node_id: int) -> None:
        """The node's data directory was replaced by an older copy: its term may be older (the peers' word
        raises it before it votes); what it holds from now on is checked again."""
        self.terms.pop(node_id, None)

    def installing(self, node: SimulatedNode, last: tuple, tail: int, held) -> None:
        """A follower installs a snapshot ending at ``last`` (command, index, term); ``held`` is its log's
        entry at that index, ``tail`` how many entries it holds after it."""
        self.installs += 1
        if held is not None and held[2] != last[2]:
            self.installs_on_conflict += 1
            if tail:
                self.installs_over_tail += 1

    def figures(self) -> dict:
        return {"installs": self.installs, "installs_on_conflict": self.installs_on_conflict,
                "installs_over_tail": self.installs_over_tail}

    def _applied(self, node: SimulatedNode, index: int, term: int, payload: bytes, result) -> None:
        entry = node.raft.journal.entry(index)  # what is compared is the log entry's command, as in the logs
        key = (term, _h(entry[0]) if entry is not None else _h(payload))
        known = self.ledger.get(index)
        current = node.raft.raft_term  # the applying node learnt of the commit in this term
        if current < self.commit_term.get(index, current + 1):
            self.commit_term[index] = current
        if known is None:
            self.ledger[index] = key
            self.max_index = max(self.max_index, index)
            self.applied_by[index] = node.address
            self._note_records(index, payload, result)
        elif known != key:
            raise Violation(f"state-machine safety: node {node.node_id} applied entry {index} in term {term} "
                            f"(command crc {key[1]:#x}), but {self.applied_by[index]} applied term {known[0]} "
                            f"(crc {known[1]:#x}) there")

    def _note_records(self, index: int, payload: bytes, result) -> None:
        try:
            records = decode_batch(payload)
        except RecordError:
            return
        errors = result if isinstance(result, list) else [None] * len(records)
        blocks = []
        for rec, err in zip(records, errors):
            if err is not None:
                continue
            if isinstance(rec, AllocateProducerIdsRecord):
                blocks.append((rec.producer_id_start, rec.producer_id_start + rec.producer_id_len,
                               f"block for broker {rec.broker_id} at index {index}"))
            elif isinstance(rec, ProducerIdSeedRecord):
                if (rec.zk_block_start, rec.zk_block_end + 1) not in self.committed:  # a retried seed: the same block
                    blocks.append((rec.zk_block_start, rec.zk_block_end + 1, f"ZooKeeper block seeded at index {index}"))
            elif isinstance(rec, TransactionalIdRecord) and rec.producer_id >= 0:
                pass  # a transactional id's producer id comes from a one-ID block in the same entry
        for start, end, what in blocks:
            other = self.committed.overlap(start, end)
            if other is not None:
                raise Violation(f"producer IDs issued twice: committed {what} [{start}, {end}) overlaps committed "
                                f"{other[2]} [{other[0]}, {other[1]})")
            self.committed.add(start, end, what)

    # --------------------------------------------------------------- steps
    def step(self) -> None:
        """Raft's safety properties and durable commits, on every running node."""
        self.checks += 1
        nodes = [n for n in self.sim.nodes.values() if n.running]
        logs = {}
        for n in nodes:
            raft = n.raft
            term = raft.raft_term
            if raft.is_leader:
                holder = self.leaders.setdefault(term, n.address)
                if holder != n.address:
                    raise Violation(f"election safety: {n.address} and {holder} both lead term {term}")
            journal = raft.journal
            # (what its journal holds as its term: durable before any message of that term leaves it)
            self.terms[n.node_id] = max(self.terms.get(n.node_id, 0), journal.getCurrentTerm())
            snap = raft.store.current
            base = snap.last_index if snap else 1  # index 1: pysyncobj's implicit first no-op, on every node
            entries = {}
            previous = (0, 0)
            for e in journal.entries:
                if e[2] < previous[1]:
                    raise Violation(f"log: node {n.node_id} holds term {e[2]} at index {e[1]} after term "
                                    f"{previous[1]} at index {previous[0]} (a log's terms never decrease)")
                previous = (e[1], e[2])
                entries[e[1]] = (e[2], _h(e[0]))
            logs[n.address] = (entries, base)
            commit = raft.commit_index
            durable = journal.durable_end()[1]
            if commit > max(durable, base):
                raise Violation(f"durability: node {n.node_id} has commit index {commit} but its journal is durable "
                                f"only to {durable} (snapshot at {base})")
            for index in range(base + 1, commit + 1):
                want = self.ledger.get(index)
                have = entries.get(index)
                if have is None:
                    raise Violation(f"durability: node {n.node_id} committed index {index} but holds no entry there "
                                    f"(journal {min(entries, default=None)}..{max(entries, default=None)}, "
                                    f"snapshot at {base})")
                if want is not None and have != want:
                    raise Violation(f"state-machine safety: node {n.node_id} holds {have} at committed index {index}, "
                                    f"the committed entry is {want}")
            self._kept(n, entries, base)
            if raft.is_leader:
                for index in range(base + 1, self.max_index + 1):
                    want = self.ledger.get(index)
                    if want is not None and self.commit_term[index] < term and entries.get(index) != want:
                        raise Violation(f"leader completeness: {n.address} leads term {term} without committed entry "
                                        f"{index} (term {want[0]}); it holds {entries.get(index)}")
        self._log_matching(logs)

    def _kept(self, n, entries: dict, base: int) -> None:
        """A process never removes a committed entry from its log, except into a snapshot: every later leader
        holds it, so no AppendEntries conflicts with it (Raft's truncation is on a conflict only).  Checked
        at the highest committed entry the process held at the last step (log matching covers below it)."""
        start, top = self.held.get(n.node_id, (None, 0))
        if start == n.starts and top > base and entries.get(top) != self.ledger.get(top):
            raise Violation(f"log: node {n.node_id} removed committed entry {top} from its log (it now holds "
                            f"{entries.get(top)}, journal {min(entries, default=None)}..{max(entries, default=None)}, "
                            f"snapshot at {base})")
        top = min(max(entries, default=0), self.max_index)
        while top > base and (self.ledger.get(top) is None or entries.get(top) != self.ledger[top]):
            top -= 1
        self.held[n.node_id] = (n.starts, top)

    def _log_matching(self, logs: dict) -> None:
        seen: dict[tuple[int, int], tuple[int, str]] = {}
        for address, (entries, _base) in logs.items():
            for index, (term, crc) in entries.items():
                other = seen.setdefault((index, term), (crc, address))
                if other[0] != crc:
                    raise Violation(f"log matching: {address} and {other[1]} hold different commands at index {index} "
                                    f"in term {term}")
        addresses = sorted(logs)
        for i, a in enumerate(addresses):
            ea = logs[a][0]
            for b in addresses[i + 1:]:
                eb = logs[b][0]
                common = [x for x in ea if x in eb and ea[x][0] == eb[x][0]]
                if not common:
                    continue
                top = max(common)
                for index in ea:
                    if index <= top and index in eb and ea[index] != eb[index]:
                        raise Violation(f"log matching: {a} and {b} agree at index {top} but differ at {index} "
                                        f"({ea[index]} / {eb[index]})")

    # ----------------------------------------------------------- workload
    def issue(self, start: int, end: int, what: str) -> None:
        """A range of producer IDs was handed to a client (acknowledged): it must be new."""
        other = self.issued.overlap(start, end)
        if other is not None:
            raise Violation(f"producer IDs issued twice: {what} [{start}, {end}) overlaps {other[2]} "
                            f"[{other[0]}, {other[1]})")
        self.issued.add(start, end, what)

    def hand_out(self, broker_id: int, pid: int, acked: "Ranges") -> None:
        """A broker's ProducerIdManager handed ``pid`` to a producer: never twice, and only from a block the
        quorum acknowledged to that broker."""
        owner = self.handed.get(pid)
        if owner is not None:
            raise Violation(f"producer ID {pid} handed out twice (brokers {owner} and {broker_id})")
        self.handed[pid] = broker_id
        if acked.overlap(pid, pid + 1) is None:
            raise Violation(f"broker {broker_id} handed out producer ID {pid}, outside every block the quorum "
                            f"acknowledged to it")

    def txn_init(self, txn_id: str, pid: int, epoch: int, what: str) -> None:
        key = (txn_id, pid, epoch)
        if key in self.txn_epochs:
            raise Violation(f"{what}: producer epoch {epoch} of {txn_id} (producer id {pid}) handed out twice")
        self.txn_epochs.add(key)
        if self.txn_pid.get(txn_id) != pid:
            self.txn_pid[txn_id] = pid
            self.issue(pid, pid + 1, f"producer id of {txn_id} ({what})")

    def final(self, states: dict[int, int], acked_blocks: list[tuple[int, int, int]]) -> None:
        """At the end, once converged: every acknowledged block is in the committed log and below every
        node's cursor."""
        for broker, start, end in acked_blocks:
            if (start, end) not in self.committed:
                raise Violation(f"acknowledged block [{start}, {end}) of broker {broker} is not in the committed log")
            for node_id, cursor in states.items():
                if cursor < end:
                    raise Violation(f"acknowledged block [{start}, {end}) is above node {node_id}'s cursor {cursor}")
