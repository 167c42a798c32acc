"""The broker's group coordinator: every consumer group whose FindCoordinator reaches this broker, with its
membership (``broker.groups.membership``), its committed offsets and the offsets transactions commit
(KIP-98, KIP-447), all durable in the groups' file (``broker.groups.store``).  Event-loop only.

Offsets in a transaction (TxnOffsetCommit) are pending until the transaction ends: the producer added the
group's offsets shard to its transaction (AddOffsetsToTxn, "__consumer_offsets"-<shard> as in Kafka), so the
transaction's marker, written by this broker's transaction coordinator like any partition's, commits or
drops them (``write_marker``).  A TxnOffsetCommit is written only if the producer's transaction still holds the
shard when it is written: one that arrives late, after its transaction ended, is refused instead of waiting
for (and being committed by) the producer's next transaction.  docs/consumer-groups.md.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from records.wire.errors import Errors, InvalidTxnStateError

from .membership import DEAD, EMPTY, Group, GroupError, GroupSettings, Member
from .state import DELETE, EXPIRE, GENERATION, MARKER, OFFSET, OFFSETS_TOPIC, TXN_OFFSET, Committed, shard_of
from .store import GroupStore

log = logging.getLogger(__name__)

EXPIRE_EVERY_S = 0.1
OFFSETS_EXPIRY_EVERY_S = 60.0


@dataclass(frozen=True)
class OffsetIn:
    """One partition's offset in an OffsetCommit or TxnOffsetCommit."""
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str | None


class _Watch:
    """A TxnOffsetCommit under way: voided by a marker of its producer queued before it writes."""
    __slots__ = ("voided",)

    def __init__(self) -> None:
        self.voided = False


class GroupCoordinator:
    def __init__(self, store: GroupStore, settings: GroupSettings,
                 partition_exists: Callable[[str, int], bool],
                 verify_txn: Callable[[str, int, int, str, int], Awaitable[None]],
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.settings = settings
        self._partition_exists = partition_exists
        self._verify_txn = verify_txn  # (tid, pid, epoch, topic, partition): KIP-890's check, raises if not in it
        self._clock = clock
        self.groups: dict[str, Group] = {}
        # producer id -> the TxnOffsetCommits of it under way: a marker queued for it voids them (``_Watch``)
        self._watches: dict[int, set[_Watch]] = {}
        self._task: asyncio.Task | None = None
        self.counters = {"group_rebalances": 0, "group_members_expired": 0, "offsets_committed": 0,
                         "txn_offsets_committed": 0, "txn_offsets_refused": 0, "offsets_expired": 0}

    # ------------------------------------------------------------ lifecycle
    def load(self) -> None:
        """The groups of the file (blocking: call before the loop serves).  A group whose last generation had
        members is Stable with them again; each has a full session timeout to heartbeat."""
        self.store.open()
        for name, gen in self.store.state.generations.items():
            g = self._new_group(name)
            g.restore(gen.generation, gen.protocol_type, gen.protocol, gen.leader, [
                Member(m.member_id, m.instance_id, m.client_id, m.client_host, m.session_ms, m.rebalance_ms,
                       gen.protocol_type or "", [(gen.protocol or "", m.metadata)], m.assignment)
                for m in gen.members])
        for name in self.store.state.groups():
            if name not in self.groups:
                self._new_group(name)

    def start(self) -> None:
        self.store.start()
        self._task = asyncio.get_running_loop().create_task(self._expire_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.store.close()

    async def _expire_loop(self) -> None:
        next_offsets_expiry = self._clock() + OFFSETS_EXPIRY_EVERY_S
        wake = EXPIRE_EVERY_S
        while True:
            await asyncio.sleep(wake)
            now = self._clock()
            earliest = now + EXPIRE_EVERY_S
            for g in list(self.groups.values()):
                if g.members or g.pending:
                    self.counters["group_members_expired"] += g.expire(now)
                    earliest = min(earliest, g.next_deadline())
            # At the next session's end, not a tick later (as Kafka's timers): a client that waits exactly its
            # session timeout finds the member gone.
            wake = min(EXPIRE_EVERY_S, max(0.001, earliest - self._clock()))
            if now >= next_offsets_expiry:
                next_offsets_expiry = now + OFFSETS_EXPIRY_EVERY_S
                self.expire_offsets(int(time.time() * 1000))

    def expire_offsets(self, now_ms: int) -> int:
        """Kafka's offsets.retention.minutes: an Empty group's committed offsets expire once
        ``offsets_retention_ms`` has passed since they were committed and since the group became Empty; a group
        left with nothing (no offsets, none pending) is deleted.  Groups with members keep theirs.  Queued
        (the entries are written by the store's writer); how many offsets expired."""
        retention, mono_now = self.settings.offsets_retention_ms, self._clock()
        rows: list[list] = []
        busy = {e[1] for e in self.store.queued() if e[0] != MARKER}  # a commit on its way: not now
        for name, g in list(self.groups.items()):
            if g.state != EMPTY or g.members or g.pending or name in self.store.state.pending or name in busy:
                continue
            empty_ms = now_ms - int((mono_now - g.empty_since) * 1000)  # wall time it became Empty
            offsets = self.store.state.offsets.get(name, {})
            gone = [tp for tp, c in offsets.items() if now_ms - max(c.commit_ms, empty_ms) > retention]
            if len(gone) == len(offsets) and now_ms - empty_ms > retention:
                g.kill()
                del self.groups[name]
                rows.append([DELETE, name])
            else:
                rows += [[EXPIRE, name, t, p] for t, p in gone]
        if rows:
            self.store.write(rows)
            log.info("offsets retention: %d entries expired (groups empty for %d ms)", len(rows), retention)
        self.counters["offsets_expired"] += len(rows)
        return len(rows)

    def stats(self) -> dict[str, int]:
        return {"groups": len(self.groups),
                "group_members": sum(len(g.members) for g in self.groups.values()),
                "group_rebalances": sum(g.rebalances for g in self.groups.values()),
                **{k: v for k, v in self.counters.items() if k != "group_rebalances"}, **self.store.counters}

    # ------------------------------------------------------------ groups
    def _new_group(self, name: str) -> Group:
        g = self.groups[name] = Group(name, self.settings, self._persist, self._clock)
        return g

    def _group(self, name: str, create: bool) -> Group | None:
        g = self.groups.get(name)
        if g is None or g.state == DEAD:
            if not create:
                return None
            if len(self.groups) >= self.settings.max_groups:
                raise GroupError(Errors.COORDINATOR_NOT_AVAILABLE,
                                 f"this broker coordinates {len(self.groups)} groups, its limit (max_groups)")
            g = self._new_group(name)
        return g

    def _persist(self, g: Group) -> asyncio.Future:
        return self.store.write([[GENERATION, g.name, g.generation, g.protocol_type, g.protocol, g.leader, [
            [m.member_id, m.instance_id, m.client_id, m.client_host, m.session_ms, m.rebalance_ms,
             m.metadata(g.protocol), m.assignment] for m in g.members.values()]]])

    @staticmethod
    def check_group_id(group_id: Any) -> str:
        if not group_id:
            raise GroupError(Errors.INVALID_GROUP_ID, "the group id is empty")
        return str(group_id)

    async def join(self, group_id: str, member_id: str, instance_id: str | None, client_id: str,
                   client_host: str, session_ms: int, rebalance_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]], require_known_id: bool):
        group_id = self.check_group_id(group_id)
        s = self.settings
        if not s.min_session_timeout_ms <= session_ms <= s.max_session_timeout_ms:
            raise GroupError(Errors.INVALID_SESSION_TIMEOUT,
                             f"session timeout {session_ms} ms is outside [{s.min_session_timeout_ms}, "
                             f"{s.max_session_timeout_ms}] (group_min/max_session_timeout_ms)")
        g = self._group(group_id, create=not member_id)
        if g is None:
            raise GroupError(Errors.UNKNOWN_MEMBER_ID, f"group {group_id[:200]!r} does not exist here")
        return await g.join(member_id, instance_id, client_id, client_host, session_ms, rebalance_ms,
                            protocol_type, protocols, require_known_id)

    def _existing(self, group_id: str) -> Group:
        g = self._group(self.check_group_id(group_id), create=False)
        if g is None:
            raise GroupError(Errors.UNKNOWN_MEMBER_ID, f"group {group_id[:200]!r} does not exist here")
        return g

    async def sync(self, group_id: str, member_id: str, instance_id: str | None, generation: int,
                   protocol_type: str | None, protocol: str | None, assignments: dict[str, bytes]):
        return await self._existing(group_id).sync(member_id, instance_id, generation, protocol_type, protocol,
                                                    assignments)

    def heartbeat(self, group_id: str, member_id: str, instance_id: str | None, generation: int) -> Errors:
        return self._existing(group_id).heartbeat(member_id, instance_id, generation)

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[Errors]:
        g = self._group(self.check_group_id(group_id), create=False)
        if g is None:
            return [Errors.UNKNOWN_MEMBER_ID] * len(members)
        return [g.leave(mid, iid) for mid, iid in members]

    def list_groups(self) -> list[tuple[str, str, str]]:
        """(group, protocol type, state) of every group, by name."""
        return [(g.name, g.protocol_type or "", g.state) for g in sorted(self.groups.values(), key=lambda g: g.name)
                if g.state != DEAD]

    def describe(self, group_id: str) -> Group | None:
        g = self.groups.get(group_id)
        return None if g is None or g.state == DEAD else g

    async def delete(self, group_id: str) -> Errors:
        """DeleteGroups for one group: only an Empty group with no transaction's offsets pending."""
        g = self.groups.get(group_id)
        if g is None or g.state == DEAD:
            return Errors.GROUP_ID_NOT_FOUND
        if g.state != EMPTY or g.pending:
            return Errors.NON_EMPTY_GROUP
        if group_id in self.store.state.pending:
            log.info("DeleteGroups %r: a transaction has offsets pending in it (answered NON_EMPTY_GROUP)",
                     group_id[:200])
            return Errors.NON_EMPTY_GROUP
        g.kill()
        del self.groups[group_id]
        await self.store.write([[DELETE, group_id]])
        return Errors.NONE

    # ------------------------------------------------------------ offsets
    def _offset_errors(self, offsets: list[OffsetIn]) -> dict[tuple[str, int], Errors]:
        out = {}
        for o in offsets:
            if o.metadata is not None and len(o.metadata.encode("utf-8", "surrogatepass")) > \
                    self.settings.offset_metadata_max_bytes:
                out[(o.topic, o.partition)] = Errors.OFFSET_METADATA_TOO_LARGE
            elif not self._partition_exists(o.topic, o.partition):
                out[(o.topic, o.partition)] = Errors.UNKNOWN_TOPIC_OR_PARTITION
        return out

    async def commit(self, group_id: str, generation: int, member_id: str, instance_id: str | None,
                     offsets: list[OffsetIn]) -> dict[tuple[str, int], Errors]:
        """OffsetCommit: per partition, its answer.  A group-wide refusal raises GroupError.  The empty group id
        is a group like any other here, as in Kafka (old consumers commit under it)."""
        group_id = str(group_id)
        g = self._group(group_id, create=False)
        if g is None:
            if generation >= 0:
                raise GroupError(Errors.ILLEGAL_GENERATION, f"group {group_id[:200]!r} has no generation "
                                                            f"{generation} (it has no members here)")
            g = self._group(group_id, create=True)  # offsets stored by a consumer that assigns itself
        elif generation < 0 and g.state == EMPTY and not member_id:
            pass  # an admin's or assign()-only consumer's commit to a group with no members
        else:
            if g.state == "CompletingRebalance":
                raise GroupError(Errors.REBALANCE_IN_PROGRESS, "the group is completing a rebalance")
            g.check_member(member_id, instance_id, generation)
            m = g.members[member_id]
            m.deadline = self._clock() + m.session_ms / 1000
        errors = self._offset_errors(offsets)
        now_ms = int(time.time() * 1000)
        rows = [[OFFSET, group_id, o.topic, o.partition, o.offset, o.leader_epoch, o.metadata, now_ms]
                for o in offsets if (o.topic, o.partition) not in errors]
        if rows:
            await self.store.write(rows)
            self.counters["offsets_committed"] += len(rows)
        return errors

    def fetch(self, group_id: str, partitions: list[tuple[str, int]] | None,
              require_stable: bool) -> list[tuple[str, int, Committed | None, Errors]]:
        """OffsetFetch of one group: (topic, partition, committed or None, error) per partition asked (every
        partition with an offset when ``partitions`` is None).  With ``require_stable`` (KIP-447), a partition
        a transaction has offsets pending for is UNSTABLE_OFFSET_COMMIT (retriable) until it ends."""
        committed = self.store.state.offsets.get(group_id, {})
        pending = {tp for p in self.store.state.pending.get(group_id, {}).values() for tp in p.offsets}
        wanted = sorted(committed) if partitions is None else partitions
        out = []
        for tp in wanted:
            if require_stable and tp in pending:
                out.append((tp[0], tp[1], None, Errors.UNSTABLE_OFFSET_COMMIT))
            else:
                out.append((tp[0], tp[1], committed.get(tp), Errors.NONE))
        return out

    # ------------------------------------------------------------ offsets in transactions
    async def txn_commit(self, tid: str, group_id: str, pid: int, epoch: int, generation: int, member_id: str,
                         instance_id: str | None, offsets: list[OffsetIn]) -> dict[tuple[str, int], Errors]:
        """TxnOffsetCommit: the offsets are pending in ``pid``'s transaction, committed by its commit marker.
        The transaction must hold the group's shard (AddOffsetsToTxn), and, when the request names a member
        (KIP-447), that member must be the group's in ``generation``."""
        group_id = self.check_group_id(group_id)
        shard = shard_of(group_id)
        watch = _Watch()
        self._watches.setdefault(pid, set()).add(watch)
        try:
            await self._verify_txn(tid, pid, epoch, OFFSETS_TOPIC, shard)  # raises: not in it, fenced
        finally:
            watching = self._watches.get(pid)
            if watching is not None:
                watching.discard(watch)
                if not watching:
                    del self._watches[pid]
        g = self._group(group_id, create=False)
        if g is not None and g.state != EMPTY or member_id or generation >= 0:
            if g is None:
                raise GroupError(Errors.UNKNOWN_MEMBER_ID if member_id else Errors.ILLEGAL_GENERATION,
                                 f"group {group_id[:200]!r} has no members here")
            if member_id or instance_id is not None:
                g.check_member(member_id, instance_id, generation if generation >= 0 else None)
            elif generation >= 0 and generation != g.generation:
                raise GroupError(Errors.ILLEGAL_GENERATION, f"generation {generation}, the group's is "
                                                            f"{g.generation}")
        if watch.voided:
            self.counters["txn_offsets_refused"] += 1
            raise InvalidTxnStateError(f"producer {pid}: its transaction ended while its offsets for group "
                                       f"{group_id[:200]!r} were being committed")
        if g is None:
            self._group(group_id, create=True)
        errors = self._offset_errors(offsets)
        now_ms = int(time.time() * 1000)
        rows = [[TXN_OFFSET, group_id, pid, epoch, o.topic, o.partition, o.offset, o.leader_epoch, o.metadata,
                 now_ms] for o in offsets if (o.topic, o.partition) not in errors]
        if rows:
            await self.store.write(rows)  # queued in the same step as the check above: before any later marker
            self.counters["txn_offsets_committed"] += len(rows)
        return errors

    async def write_marker(self, shard: int, pid: int, epoch: int, commit: bool,
                           still_current: Callable[[], bool] | None = None) -> bool:
        """The transaction marker of ``pid`` for the groups of ``shard``: its pending offsets there are
        committed or dropped, durably.  False when there was nothing to end (nothing written: a retried
        marker, a transaction that put no offsets here, or one that ``still_current`` says ended already)."""
        if still_current is not None and not still_current():
            return False  # a late marker of a transaction that ended: it ends nothing (and voids nothing)
        for watch in self._watches.pop(pid, ()):
            watch.voided = True  # a TxnOffsetCommit under way belongs to the transaction that ends here
        queued = any(e[0] == TXN_OFFSET and e[2] == pid and shard_of(e[1]) == shard for e in self.store.queued())
        if not queued and not self.store.state.pending_in_shard(shard, pid):
            return False
        await self.store.write([[MARKER, shard, pid, epoch, commit]])
        return True
