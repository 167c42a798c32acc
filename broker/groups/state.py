"""What the consumer groups' file holds once replayed: committed offsets, transactional offsets waiting for
their transaction's end, and each group's last completed generation.  Pure (no I/O): the file's entries,
applied in file order, make this state, and nothing else changes it (``GroupState.apply``).

Entries (msgpack lists; the file: ``broker.groups.store``):

=======  ==================================================================================================
``o``    ``[o, group, topic, partition, offset, leader_epoch, metadata, commit_ms]``: an OffsetCommit.
``t``    ``[t, group, producer_id, producer_epoch, topic, partition, offset, leader_epoch, metadata,
         commit_ms]``: a TxnOffsetCommit, pending until its transaction ends.
``m``    ``[m, shard, producer_id, producer_epoch, commit]``: the transaction marker of ``producer_id`` for the
         groups of offsets shard ``shard``: its pending offsets become committed (commit) or are dropped.
``g``    ``[g, group, generation, protocol_type, protocol, leader, members]``: a generation completed (members:
         ``[member_id, instance_id, client_id, client_host, session_ms, rebalance_ms, metadata, assignment]``).
``d``    ``[d, group]``: the group deleted (DeleteGroups, or its last offsets expired): its offsets and generation
         are gone.
``x``    ``[x, group, topic, partition]``: one committed offset expired (``offsets_retention_minutes``).
=======  ==================================================================================================
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OFFSET, TXN_OFFSET, MARKER, GENERATION, DELETE, EXPIRE = "o", "t", "m", "g", "d", "x"

# Kafka's __consumer_offsets: the partitions a group's offsets are spread over.  Here it names the part of
# the groups a transaction's offsets belong to (AddOffsetsToTxn adds "__consumer_offsets"-<shard> to the
# transaction, as Kafka does), so that the transaction's marker reaches them.
OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_SHARDS = 50  # Kafka's offsets.topic.num.partitions


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def shard_of(group: str) -> int:
    """The offsets shard of ``group``: Kafka's ``Utils.abs(groupId.hashCode) % 50``, so a group sits in the
    same __consumer_offsets partition as on a Kafka cluster with the default partition count."""
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % OFFSETS_SHARDS  # Kafka's Utils.abs: MIN_VALUE is 0


@dataclass(frozen=True, slots=True)
class Committed:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_ms: int


@dataclass
class StoredMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_ms: int
    rebalance_ms: int
    metadata: bytes
    assignment: bytes

    def row(self) -> list:
        return [self.member_id, self.instance_id, self.client_id, self.client_host, self.session_ms,
                self.rebalance_ms, self.metadata, self.assignment]


@dataclass
class StoredGeneration:
    generation: int
    protocol_type: str | None
    protocol: str | None
    leader: str | None
    members: list[StoredMember] = field(default_factory=list)


@dataclass
class Pending:
    """A producer's transactional offsets for one group, waiting for its transaction's marker."""
    producer_epoch: int
    offsets: dict[tuple[str, int], Committed] = field(default_factory=dict)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def check_entry(e: Any) -> None:
    """Raise ValueError unless ``e`` is a well-formed entry (the file's reader refuses the file then)."""
    if not isinstance(e, list) or not e:
        raise ValueError(f"bad entry {e!r:.200}")
    kind, ok = e[0], False
    if kind == OFFSET and len(e) == 8:
        ok = (isinstance(e[1], str) and isinstance(e[2], str) and all(_is_int(x) for x in (e[3], e[4], e[5], e[7]))
              and _opt_str(e[6]))
    elif kind == TXN_OFFSET and len(e) == 10:
        ok = (isinstance(e[1], str) and all(_is_int(x) for x in (e[2], e[3], e[5], e[6], e[7], e[9]))
              and isinstance(e[4], str) and _opt_str(e[8]))
    elif kind == MARKER and len(e) == 5:
        ok = all(_is_int(x) for x in e[1:4]) and isinstance(e[4], bool)
    elif kind == GENERATION and len(e) == 7:
        ok = (isinstance(e[1], str) and _is_int(e[2]) and all(_opt_str(x) for x in e[3:6])
              and isinstance(e[6], list) and all(_member_ok(m) for m in e[6]))
    elif kind == DELETE and len(e) == 2:
        ok = isinstance(e[1], str)
    elif kind == EXPIRE and len(e) == 4:
        ok = isinstance(e[1], str) and isinstance(e[2], str) and _is_int(e[3])
    if not ok:
        raise ValueError(f"bad entry {e!r:.200}")


def _member_ok(m: Any) -> bool:
    return (isinstance(m, list) and len(m) == 8 and isinstance(m[0], str) and _opt_str(m[1])
            and isinstance(m[2], str) and isinstance(m[3], str) and _is_int(m[4]) and _is_int(m[5])
            and isinstance(m[6], bytes) and isinstance(m[7], bytes))


class GroupState:
    """The groups' durable state: ``apply`` each entry in file order."""

    def __init__(self) -> None:
        self.offsets: dict[str, dict[tuple[str, int], Committed]] = {}
        self.pending: dict[str, dict[int, Pending]] = {}  # group -> producer id -> its offsets
        self.pending_groups: dict[int, set[str]] = {}  # producer id -> groups it has offsets pending in
        self.generations: dict[str, StoredGeneration] = {}

    def groups(self) -> set[str]:
        """Every group with anything stored."""
        return set(self.offsets) | set(self.pending) | set(self.generations)

    def apply(self, e: list) -> None:
        kind = e[0]
        if kind == OFFSET:
            _, group, topic, partition, offset, leader_epoch, metadata, ms = e
            self.offsets.setdefault(group, {})[(topic, partition)] = Committed(offset, leader_epoch, metadata, ms)
        elif kind == TXN_OFFSET:
            _, group, pid, epoch, topic, partition, offset, leader_epoch, metadata, ms = e
            by_pid = self.pending.setdefault(group, {})
            p = by_pid.get(pid)
            if p is None or p.producer_epoch < epoch:
                p = by_pid[pid] = Pending(epoch)
            p.offsets[(topic, partition)] = Committed(offset, leader_epoch, metadata, ms)
            self.pending_groups.setdefault(pid, set()).add(group)
        elif kind == MARKER:
            _, shard, pid, epoch, commit = e
            for group in sorted(self.pending_groups.get(pid, ())):
                if shard_of(group) == shard:
                    self._end(group, pid, epoch, commit)
        elif kind == GENERATION:
            _, group, generation, protocol_type, protocol, leader, members = e
            self.generations[group] = StoredGeneration(generation, protocol_type, protocol, leader,
                                                       [StoredMember(*m) for m in members])
        elif kind == DELETE:
            self.offsets.pop(e[1], None)
            self.generations.pop(e[1], None)
        elif kind == EXPIRE:
            offsets = self.offsets.get(e[1], {})
            offsets.pop((e[2], e[3]), None)
            if not offsets:
                self.offsets.pop(e[1], None)

    def _end(self, group: str, pid: int, epoch: int, commit: bool) -> None:
        by_pid = self.pending.get(group, {})
        p = by_pid.get(pid)
        if p is None or p.producer_epoch > epoch:
            return  # a marker of an earlier epoch: the offsets pending are a later transaction's
        del by_pid[pid]
        if not by_pid:
            del self.pending[group]
        groups = self.pending_groups[pid]
        groups.discard(group)
        if not groups:
            del self.pending_groups[pid]
        if commit:
            self.offsets.setdefault(group, {}).update(p.offsets)

    def pending_in_shard(self, shard: int, pid: int) -> bool:
        """Whether ``pid`` has offsets pending in a group of ``shard`` (a marker would change something)."""
        return any(shard_of(g) == shard for g in self.pending_groups.get(pid, ()))

    def rows(self) -> list[list]:
        """Entries that rebuild this state (what a rewrite of the file holds)."""
        out: list[list] = []
        for group, gen in self.generations.items():
            out.append([GENERATION, group, gen.generation, gen.protocol_type, gen.protocol, gen.leader,
                        [m.row() for m in gen.members]])
        for group, offsets in self.offsets.items():
            for (topic, partition), c in offsets.items():
                out.append([OFFSET, group, topic, partition, c.offset, c.leader_epoch, c.metadata, c.commit_ms])
        for group, by_pid in self.pending.items():
            for pid, p in by_pid.items():
                for (topic, partition), c in p.offsets.items():
                    out.append([TXN_OFFSET, group, pid, p.producer_epoch, topic, partition, c.offset,
                                c.leader_epoch, c.metadata, c.commit_ms])
        return out

    def size(self) -> int:
        """Entries ``rows`` would give (to decide when the file is worth rewriting)."""
        return (len(self.generations) + sum(len(o) for o in self.offsets.values())
                + sum(len(p.offsets) for by_pid in self.pending.values() for p in by_pid.values()))
