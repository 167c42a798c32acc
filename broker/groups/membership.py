"""One consumer group's membership, the classic protocol as Kafka's ``GroupCoordinator`` runs it: members join
(JoinGroup), the coordinator waits for every known member to join again, completes the join with a new
generation and a leader, the leader's assignment is handed out (SyncGroup), members heartbeat, and a member
that leaves or stops heartbeating for its session timeout starts the next rebalance.  Static members
(KIP-345, ``group.instance.id``) keep their place across restarts; a newer member with the same instance id
fences the older one (FENCED_INSTANCE_ID).

States: Empty -> PreparingRebalance -> CompletingRebalance -> Stable (-> PreparingRebalance ...); Dead once
deleted.  Event-loop only.  What is durable and when: ``broker.groups.state``; the rules and the answers:
docs/consumer-groups.md.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from records.wire.errors import Errors, PidQuorumError

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"
STATES = (EMPTY, PREPARING, COMPLETING, STABLE, DEAD)


@dataclass(frozen=True)
class GroupSettings:
    """Kafka's group.* broker settings (``BrokerConfig`` carries them)."""
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    max_size: int = 10_000  # members (and members waiting for their id) of one group
    offset_metadata_max_bytes: int = 4096
    max_groups: int = 100_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000


class GroupError(PidQuorumError):
    """A request refused for the whole group (or member): ``code`` is the answer, ``message`` why."""

    def __init__(self, code: Errors, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class JoinResult:
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)  # the leader's: everyone's metadata
    error: Errors = Errors.NONE


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_ms: int
    rebalance_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    deadline: float = 0.0  # monotonic: the session ends then unless a heartbeat (or a request) comes
    joining: asyncio.Future | None = None  # its JoinGroup waiting for the join to complete
    syncing: asyncio.Future | None = None  # its SyncGroup waiting for the leader's assignment

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for n, m in self.protocols if n == protocol), b"")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


class Group:
    def __init__(self, name: str, settings: GroupSettings, persist: Callable[["Group"], asyncio.Future],
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.settings = settings
        self.state = EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.pending: dict[str, float] = {}  # member ids handed out (MEMBER_ID_REQUIRED) -> when they lapse
        self.static: dict[str, str] = {}  # instance id -> its member's id
        self._persist = persist  # writes the group's generation; resolves once durable
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._initial_deadline = 0.0  # the initial delay of an Empty group's first join may be extended until then
        self._joined_during_delay = False
        self.rebalances = 0
        self.empty_since = clock()  # when the group last became Empty (offsets expire from then on)

    # ------------------------------------------------------------ checks
    def _fenced(self, member_id: str, instance_id: str | None) -> bool:
        return instance_id is not None and instance_id in self.static and self.static[instance_id] != member_id

    def check_member(self, member_id: str, instance_id: str | None, generation: int | None) -> None:
        """The member (and, unless None, its generation) is this group's current one, else GroupError."""
        if self.state == DEAD:
            raise GroupError(Errors.COORDINATOR_NOT_AVAILABLE, f"group {self.name[:200]!r} was deleted")
        if self._fenced(member_id, instance_id):
            raise GroupError(Errors.FENCED_INSTANCE_ID, f"instance {instance_id[:200]!r} has another member now")
        if member_id not in self.members:
            raise GroupError(Errors.UNKNOWN_MEMBER_ID, f"member {member_id[:200]!r} is not in group "
                                                       f"{self.name[:200]!r}")
        if generation is not None and generation != self.generation:
            raise GroupError(Errors.ILLEGAL_GENERATION, f"generation {generation}, the group's is "
                                                        f"{self.generation}")

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not protocol_type or not protocols:
            return False
        if not self.members:
            return True  # an Empty group takes any protocol type (its next generation's is the joiners')
        return protocol_type == self.protocol_type and bool(self._candidates() & {n for n, _ in protocols})

    def _candidates(self) -> set[str]:
        sets = [{n for n, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    @property
    def size(self) -> int:
        return len(self.members) + len(self.pending)

    # ------------------------------------------------------------ JoinGroup
    async def join(self, member_id: str, instance_id: str | None, client_id: str, client_host: str,
                   session_ms: int, rebalance_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
                   require_known_id: bool) -> JoinResult:
        if self.state == DEAD:
            raise GroupError(Errors.COORDINATOR_NOT_AVAILABLE, f"group {self.name[:200]!r} was deleted")
        if not self.supports(protocol_type, protocols):
            raise GroupError(Errors.INCONSISTENT_GROUP_PROTOCOL,
                             f"protocol type {protocol_type[:100]!r} with protocols "
                             f"{[n[:100] for n, _ in protocols][:10]} is not what group {self.name[:200]!r} runs "
                             f"({self.protocol_type!r}, {sorted(self._candidates())[:10]})")
        now = self._clock()
        if not member_id:
            if instance_id is None and self.size >= self.settings.max_size:
                raise GroupError(Errors.GROUP_MAX_SIZE_REACHED, f"group {self.name[:200]!r} has "
                                                                f"{self.settings.max_size} members (group_max_size)")
            new_id = f"{client_id}-{uuid.uuid4()}"
            if instance_id is not None:
                old = self.static.get(instance_id)
                if old is not None and old in self.members:
                    return await self._replace_static(old, new_id, session_ms, rebalance_ms, protocols)
                if self.size >= self.settings.max_size:
                    raise GroupError(Errors.GROUP_MAX_SIZE_REACHED, f"group {self.name[:200]!r} has "
                                                                    f"{self.settings.max_size} members")
            elif require_known_id:
                # KIP-394: the member id first, then the join; one that never comes back lapses.
                self.pending[new_id] = now + session_ms / 1000
                return JoinResult(new_id, error=Errors.MEMBER_ID_REQUIRED)
            member_id = new_id
        elif member_id in self.pending:
            del self.pending[member_id]
        else:
            if self._fenced(member_id, instance_id):
                raise GroupError(Errors.FENCED_INSTANCE_ID, f"instance {instance_id[:200]!r} has another member")
            m = self.members.get(member_id)
            if m is None or self.state == EMPTY:
                raise GroupError(Errors.UNKNOWN_MEMBER_ID, f"member {member_id[:200]!r} is not in group "
                                                           f"{self.name[:200]!r}")
            m.deadline = now + m.session_ms / 1000
            if self.state == COMPLETING and m.matches(protocols) or \
                    self.state == STABLE and m.member_id != self.leader and m.matches(protocols):
                return self._join_result(m)  # nothing changed: the current generation, no rebalance
            m.session_ms, m.rebalance_ms, m.protocols = session_ms, rebalance_ms, protocols
            fut = m.joining = asyncio.get_running_loop().create_future()
            if self.state == PREPARING:
                self._try_complete_join()
            else:
                self._prepare_rebalance(f"member {member_id[:200]!r} joins again")
            return await fut
        m = Member(member_id, instance_id, client_id, client_host, session_ms, rebalance_ms, protocol_type,
                   protocols, deadline=now + session_ms / 1000)
        self.members[member_id] = m
        if instance_id is not None:
            self.static[instance_id] = member_id
        if len(self.members) == 1:
            self.protocol_type = protocol_type  # the first member of an Empty group sets it
        fut = m.joining = asyncio.get_running_loop().create_future()
        if self.state == PREPARING:
            self._joined_during_delay = True
            self._try_complete_join()
        else:
            self._prepare_rebalance(f"member {member_id[:200]!r} joins")
        return await fut

    async def _replace_static(self, old_id: str, new_id: str, session_ms: int, rebalance_ms: int,
                              protocols: list[tuple[str, bytes]]) -> JoinResult:
        """A static member joins again under a new member id (a restarted instance, KIP-345): it takes the old
        member's place and assignment, and the old id is fenced (FENCED_INSTANCE_ID).  In a Stable group whose
        protocol this does not change, there is no rebalance: the member gets the current generation, with the
        leader named as before the replacement so that a returning leader does not assign again (as Kafka's
        ``updateStaticMemberAndRebalance``); it then syncs and gets its old assignment."""
        m = self.members.pop(old_id)
        for fut in (m.joining, m.syncing):
            if fut is not None and not fut.done():
                fut.set_exception(GroupError(Errors.FENCED_INSTANCE_ID, f"instance {m.instance_id!r} joined again "
                                                                        f"as another member"))
        m.joining = m.syncing = None
        leader_before = self.leader
        m.member_id, m.session_ms, m.rebalance_ms, m.protocols = new_id, session_ms, rebalance_ms, protocols
        m.deadline = self._clock() + session_ms / 1000
        self.members[new_id] = m
        self.static[m.instance_id] = new_id
        if self.leader == old_id:
            self.leader = new_id
        if self.state == STABLE and self._select_protocol() == self.protocol:
            await self._persist(self)
            return JoinResult(new_id, self.generation, self.protocol_type, self.protocol, leader_before or "")
        fut = m.joining = asyncio.get_running_loop().create_future()
        if self.state == PREPARING:
            self._try_complete_join()
        else:
            self._prepare_rebalance(f"static member {m.instance_id[:200]!r} joins again with new metadata")
        return await fut

    def _join_result(self, m: Member) -> JoinResult:
        members = ([(x.member_id, x.instance_id, x.metadata(self.protocol)) for x in self.members.values()]
                   if m.member_id == self.leader else [])
        return JoinResult(m.member_id, self.generation, self.protocol_type, self.protocol, self.leader or "",
                          members)

    def _prepare_rebalance(self, why: str) -> None:
        for m in self.members.values():
            if m.syncing is not None and not m.syncing.done():
                m.syncing.set_exception(GroupError(Errors.REBALANCE_IN_PROGRESS, f"the group rebalances: {why}"))
            m.syncing = None
        initial = self.state == EMPTY
        self.state = PREPARING
        self.rebalances += 1
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        timeout = max((m.rebalance_ms for m in self.members.values()), default=0) / 1000
        delay = self.settings.initial_rebalance_delay_ms / 1000
        if initial and delay > 0:
            self._joined_during_delay = False
            self._initial_deadline = self._clock() + max(timeout, delay)
            self._timer = loop.call_later(delay, self._initial_delay_over, delay)
        else:
            self._initial_deadline = 0.0
            self._timer = loop.call_later(timeout, self._complete_join)
            self._try_complete_join()

    def _initial_delay_over(self, delay: float) -> None:
        """Kafka's InitialDelayedJoin: while members keep arriving, wait another delay (up to the rebalance
        timeout), so a group starting many members rebalances once."""
        self._timer = None
        left = self._initial_deadline - self._clock()
        if self._joined_during_delay and left > 0:
            self._joined_during_delay = False
            self._timer = asyncio.get_running_loop().call_later(min(delay, left), self._initial_delay_over, delay)
            return
        self._initial_deadline = 0.0
        self._complete_join()

    def _try_complete_join(self) -> None:
        if self.state != PREPARING or self._initial_deadline:
            return
        if not self.pending and all(m.joining is not None for m in self.members.values()):
            self._complete_join()

    def _complete_join(self) -> None:
        """The join is over (everyone joined, or the rebalance timeout passed): members that did not join again
        are removed (static ones stay), the next generation begins."""
        if self.state != PREPARING:
            return
        self._cancel_timer()
        for m in [m for m in self.members.values() if m.joining is None and m.instance_id is None]:
            self._remove(m, Errors.UNKNOWN_MEMBER_ID, rebalance=False)
        self.generation += 1
        if not self.members:
            # Kafka keeps the protocol type ("consumer"): ListGroups tells a consumer group that has no members
            # from a "simple" group (offsets only) by it.
            self.state, self.protocol, self.leader = EMPTY, None, None
            self.empty_since = self._clock()
            self._persist(self)
            return
        self.state = COMPLETING
        self.protocol = self._select_protocol()
        if self.leader not in self.members or self.members[self.leader].joining is None:
            self.leader = next((m.member_id for m in self.members.values() if m.joining is not None),
                               next(iter(self.members)))
        now = self._clock()
        for m in self.members.values():
            m.deadline = now + m.session_ms / 1000
            m.assignment = b""
            if m.joining is not None:
                if not m.joining.done():
                    m.joining.set_result(self._join_result(m))
                m.joining = None
        timeout = max(m.rebalance_ms for m in self.members.values()) / 1000
        self._timer = asyncio.get_running_loop().call_later(timeout, self._sync_expired, self.generation)

    def _select_protocol(self) -> str:
        candidates = self._candidates()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(n for n, _ in m.protocols if n in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        leader = self.members.get(self.leader or "") or next(iter(self.members.values()))
        order = [n for n, _ in leader.protocols if n in votes]
        return max(order, key=lambda n: votes[n])  # ties: the leader's preference

    def _sync_expired(self, generation: int) -> None:
        """The leader did not hand out the assignment within the rebalance timeout: the members that have not
        sent SyncGroup are removed and the group rebalances (as Kafka does since 3.x)."""
        self._timer = None
        if self.state != COMPLETING or self.generation != generation:
            return
        for m in [m for m in self.members.values() if m.syncing is None]:
            self._remove(m, Errors.REBALANCE_IN_PROGRESS, rebalance=False)
        self._prepare_rebalance("SyncGroup did not come within the rebalance timeout")

    # ------------------------------------------------------------ SyncGroup
    async def sync(self, member_id: str, instance_id: str | None, generation: int, protocol_type: str | None,
                   protocol: str | None, assignments: dict[str, bytes]) -> tuple[bytes, str | None, str | None]:
        """(assignment, protocol type, protocol) once the leader's assignment is durable."""
        self.check_member(member_id, instance_id, generation)
        if (protocol_type is not None and protocol_type != self.protocol_type) or \
                (protocol is not None and protocol != self.protocol):
            raise GroupError(Errors.INCONSISTENT_GROUP_PROTOCOL, f"the group runs {self.protocol_type!r} / "
                                                                 f"{self.protocol!r}")
        m = self.members[member_id]
        m.deadline = self._clock() + m.session_ms / 1000
        if self.state == PREPARING:
            raise GroupError(Errors.REBALANCE_IN_PROGRESS, "the group is rebalancing: join again")
        if self.state == STABLE:
            return m.assignment, self.protocol_type, self.protocol
        fut = m.syncing = asyncio.get_running_loop().create_future()
        if member_id == self.leader:
            gen = self.generation
            for x in self.members.values():
                x.assignment = assignments.get(x.member_id, b"")
            await self._persist(self)
            if self.state == COMPLETING and self.generation == gen:
                self._cancel_timer()
                self.state = STABLE
                for x in self.members.values():
                    if x.syncing is not None and not x.syncing.done():
                        x.syncing.set_result(x.assignment)
                    x.syncing = None
        return await fut, self.protocol_type, self.protocol

    # ------------------------------------------------------------ Heartbeat, LeaveGroup, expiry
    def heartbeat(self, member_id: str, instance_id: str | None, generation: int) -> Errors:
        if self.state == EMPTY:
            raise GroupError(Errors.UNKNOWN_MEMBER_ID, f"group {self.name[:200]!r} has no members")
        self.check_member(member_id, instance_id, generation)
        m = self.members[member_id]
        m.deadline = self._clock() + m.session_ms / 1000
        return Errors.REBALANCE_IN_PROGRESS if self.state == PREPARING else Errors.NONE

    def leave(self, member_id: str, instance_id: str | None) -> Errors:
        """One member of a LeaveGroup: its answer."""
        if self.state == DEAD:
            return Errors.COORDINATOR_NOT_AVAILABLE
        if not member_id and instance_id is not None:
            member_id = self.static.get(instance_id, "")
        elif self._fenced(member_id, instance_id):
            return Errors.FENCED_INSTANCE_ID
        if member_id in self.pending:
            del self.pending[member_id]
            self._try_complete_join()
            return Errors.NONE
        m = self.members.get(member_id)
        if m is None:
            return Errors.UNKNOWN_MEMBER_ID
        self._remove(m, Errors.UNKNOWN_MEMBER_ID)
        return Errors.NONE

    def _remove(self, m: Member, why: Errors, rebalance: bool = True) -> None:
        del self.members[m.member_id]
        if m.instance_id is not None and self.static.get(m.instance_id) == m.member_id:
            del self.static[m.instance_id]
        for fut in (m.joining, m.syncing):
            if fut is not None and not fut.done():
                fut.set_exception(GroupError(why, f"member {m.member_id[:200]!r} left group {self.name[:200]!r}"))
        m.joining = m.syncing = None
        if not rebalance:
            return
        if self.state in (STABLE, COMPLETING):
            self._prepare_rebalance(f"member {m.member_id[:200]!r} left")
        elif self.state == PREPARING:
            self._try_complete_join()

    def expire(self, now: float) -> int:
        """Members whose session ended (and member ids never used) are removed; how many."""
        gone = 0
        for mid in [mid for mid, deadline in self.pending.items() if deadline <= now]:
            del self.pending[mid]
            gone += 1
        for m in list(self.members.values()):
            if m.joining is not None or m.syncing is not None:
                m.deadline = now + m.session_ms / 1000  # waiting on the coordinator: kept alive (as Kafka)
            elif m.deadline <= now and m.member_id in self.members:
                self._remove(m, Errors.UNKNOWN_MEMBER_ID)
                gone += 1
        if gone and self.state == PREPARING:
            self._try_complete_join()
        return gone

    def next_deadline(self) -> float:
        """When the next session (or unused member id) may end: the earliest deadline of a member not waiting
        on the coordinator."""
        deadlines = [m.deadline for m in self.members.values() if m.joining is None and m.syncing is None]
        return min([*deadlines, *self.pending.values()], default=float("inf"))

    def restore(self, generation: int, protocol_type: str | None, protocol: str | None, leader: str | None,
                members: list[Member]) -> None:
        """The generation the group last completed, as the file has it: Stable with those members (each with a
        full session to heartbeat again), or Empty."""
        self.generation, self.protocol_type, self.protocol, self.leader = generation, protocol_type, protocol, leader
        now = self._clock()
        for m in members:
            m.deadline = now + m.session_ms / 1000
            self.members[m.member_id] = m
            if m.instance_id is not None:
                self.static[m.instance_id] = m.member_id
        self.state = STABLE if self.members else EMPTY

    def kill(self) -> None:
        """DeleteGroups: the group is gone (only an Empty group is deleted)."""
        self._cancel_timer()
        self.state = DEAD

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
