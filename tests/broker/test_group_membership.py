"""One consumer group's state machine (``broker.groups.membership.Group``) on a real event loop, without
processes: joins (KIP-394's member id first, the initial delay), protocol selection, SyncGroup handing out the
leader's assignment once it is durable, heartbeats' answers, session expiry, LeaveGroup, static members fencing
(KIP-345), refusals (inconsistent protocols, the group's size), and a leader that never syncs.

The rebalance and initial-delay timers are the loop's (``call_later``): tens of milliseconds here.  Session
deadlines read the clock the Group is given: a fake one the tests move by hand."""
from __future__ import annotations

import asyncio

import pytest

from broker.groups.membership import (COMPLETING, DEAD, EMPTY, PREPARING, STABLE, Group, GroupError, GroupSettings,
                                      JoinResult)
from records.wire.errors import Errors

DELAY_MS = 40  # the initial rebalance delay
REBALANCE_MS = 80
SESSION_MS = 1_000  # on the fake clock only
RANGE = [("range", b"meta-range"), ("roundrobin", b"meta-rr")]


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


class Persisted:
    """The group's ``persist``: records what each call saw; ``hold`` keeps the next writes pending until
    ``release``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, str | None, dict[str, bytes]]] = []
        self.held: list[asyncio.Future] = []
        self.hold = False

    def __call__(self, g: Group) -> asyncio.Future:
        self.calls.append((g.generation, g.state, g.leader, {m.member_id: m.assignment for m in g.members.values()}))
        fut = asyncio.get_running_loop().create_future()
        if self.hold:
            self.held.append(fut)
        else:
            fut.set_result(None)
        return fut

    def release(self) -> None:
        for f in self.held:
            f.set_result(None)
        self.held.clear()


def new_group(**settings) -> tuple[Group, Clock, Persisted]:
    clock, persisted = Clock(), Persisted()
    s = GroupSettings(**{"initial_rebalance_delay_ms": DELAY_MS, **settings})
    return Group("g", s, persisted, clock), clock, persisted


def join(g: Group, member_id: str = "", instance_id: str | None = None, protocols=RANGE, client: str = "c",
         ptype: str = "consumer", require_known_id: bool = False, session_ms: int = SESSION_MS,
         rebalance_ms: int = REBALANCE_MS) -> asyncio.Task:
    return asyncio.ensure_future(g.join(member_id, instance_id, client, "/127.0.0.1", session_ms, rebalance_ms,
                                        ptype, protocols, require_known_id))


async def done(*tasks: asyncio.Task, timeout: float = 2.0) -> list:
    return list(await asyncio.wait_for(asyncio.gather(*tasks), timeout))


async def stable_pair(g: Group) -> tuple[JoinResult, JoinResult]:
    """Two members joined and synced: (leader's join, follower's join), the group Stable in generation 1."""
    a, b = join(g, client="a"), join(g, client="b")
    ra, rb = await done(a, b)
    leader, follower = (ra, rb) if ra.member_id == ra.leader else (rb, ra)
    s1 = asyncio.ensure_future(g.sync(follower.member_id, None, 1, "consumer", "range", {}))
    s2 = asyncio.ensure_future(g.sync(leader.member_id, None, 1, "consumer", "range",
                                      {leader.member_id: b"L", follower.member_id: b"F"}))
    await done(s1, s2)
    assert g.state == STABLE
    return leader, follower


def run(coro):
    return asyncio.run(coro)


def code_of(exc_info) -> Errors:
    return exc_info.value.code


# ------------------------------------------------------------ joins
def test_first_join_gets_member_id_required_then_completes_after_the_initial_delay():
    async def go():
        g, _, persisted = new_group()
        first = await done(join(g, client="cli", require_known_id=True))
        r = first[0]
        assert r.error == Errors.MEMBER_ID_REQUIRED and r.member_id.startswith("cli-") and r.generation == -1
        assert g.state == EMPTY and set(g.pending) == {r.member_id} and not g.members
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        second = join(g, member_id=r.member_id, client="cli", require_known_id=True)
        await asyncio.sleep(DELAY_MS / 4000)
        assert not second.done() and g.state == PREPARING  # the initial delay holds the join
        res = (await done(second))[0]
        assert loop.time() - t0 >= DELAY_MS / 1000 * 0.9
        assert res.error == Errors.NONE and res.member_id == r.member_id == res.leader
        assert (res.generation, res.protocol_type, res.protocol) == (1, "consumer", "range")
        assert res.members == [(r.member_id, None, b"meta-range")]
        assert g.state == COMPLETING and g.pending == {} and persisted.calls == []
    run(go())


def test_two_members_join_one_generation_and_only_the_leader_gets_everyones_metadata():
    async def go():
        g, _, _ = new_group()
        a = join(g, client="a", protocols=[("range", b"A-range"), ("roundrobin", b"A-rr")])
        await asyncio.sleep(0)
        b = join(g, client="b", protocols=[("roundrobin", b"B-rr"), ("range", b"B-range")])
        ra, rb = await done(a, b)
        assert ra.generation == rb.generation == 1 and ra.leader == rb.leader == ra.member_id  # the first joined
        assert ra.protocol == rb.protocol == "range"  # a tie (one vote each): the leader's preference
        assert sorted(ra.members) == sorted([(ra.member_id, None, b"A-range"), (rb.member_id, None, b"B-range")])
        assert rb.members == []
        assert g.rebalances == 1
    run(go())


def test_the_protocol_most_members_prefer_is_selected():
    async def go():
        g, _, _ = new_group()
        tasks = [join(g, client="a", protocols=[("range", b"a1"), ("roundrobin", b"a2")])]
        await asyncio.sleep(0)
        tasks += [join(g, client=c, protocols=[("roundrobin", c.encode()), ("range", b"r"), ("sticky", b"s")])
                  for c in ("b", "c")]
        results = await done(*tasks)
        assert {r.protocol for r in results} == {"roundrobin"}  # 2 votes to 1, the leader's choice loses
        leader = next(r for r in results if r.members)
        assert sorted(md for _, _, md in leader.members) == [b"a2", b"b", b"c"]
    run(go())


def test_joins_during_the_initial_delay_extend_it_and_rebalance_once():
    async def go():
        g, clock, _ = new_group(initial_rebalance_delay_ms=30)
        tasks = [join(g, client="a", rebalance_ms=10_000)]
        for c in "bcd":
            await asyncio.sleep(0.02)  # each arrives within the delay: it waits another delay
            tasks.append(join(g, client=c, rebalance_ms=10_000))
        results = await done(*tasks)
        assert {r.generation for r in results} == {1} and g.rebalances == 1 and len(g.members) == 4
    run(go())


def test_unknown_member_id_and_a_dead_group_are_refused():
    async def go():
        g, _, _ = new_group()
        with pytest.raises(GroupError) as e:
            await g.join("nobody", None, "c", "h", SESSION_MS, REBALANCE_MS, "consumer", RANGE, True)
        assert code_of(e) == Errors.UNKNOWN_MEMBER_ID
        g.kill()
        assert g.state == DEAD
        with pytest.raises(GroupError) as e:
            await g.join("", None, "c", "h", SESSION_MS, REBALANCE_MS, "consumer", RANGE, True)
        assert code_of(e) == Errors.COORDINATOR_NOT_AVAILABLE
    run(go())


def test_inconsistent_protocols_are_refused():
    async def go():
        g, _, _ = new_group()
        a = join(g, client="a")
        await asyncio.sleep(0)
        for ptype, protocols in (("consumer", [("sticky", b"")]), ("connect", RANGE), ("consumer", []),
                                 ("", RANGE)):
            with pytest.raises(GroupError) as e:
                await g.join("", None, "x", "h", SESSION_MS, REBALANCE_MS, ptype, protocols, False)
            assert code_of(e) == Errors.INCONSISTENT_GROUP_PROTOCOL, (ptype, protocols)
        r = (await done(a))[0]
        assert len(g.members) == 1 and r.generation == 1
        # an empty group: no protocols at all is still refused
        g2, _, _ = new_group()
        with pytest.raises(GroupError) as e:
            await g2.join("", None, "x", "h", SESSION_MS, REBALANCE_MS, "consumer", [], False)
        assert code_of(e) == Errors.INCONSISTENT_GROUP_PROTOCOL and g2.state == EMPTY
    run(go())


def test_the_group_max_size_counts_members_and_member_ids_handed_out():
    async def go():
        g, _, _ = new_group(max_size=2)
        r1 = (await done(join(g, client="a", require_known_id=True)))[0]
        b = join(g, client="b")
        await asyncio.sleep(0)
        assert g.size == 2
        for require in (True, False):
            with pytest.raises(GroupError) as e:
                await g.join("", None, "c", "h", SESSION_MS, REBALANCE_MS, "consumer", RANGE, require)
            assert code_of(e) == Errors.GROUP_MAX_SIZE_REACHED
        a = join(g, member_id=r1.member_id, client="a", require_known_id=True)  # the id handed out still joins
        ra, rb = await done(a, b)
        assert ra.generation == rb.generation == 1 and len(g.members) == 2
    run(go())


# ------------------------------------------------------------ SyncGroup
def test_sync_hands_out_the_leaders_assignment_once_persisted():
    async def go():
        g, _, persisted = new_group()
        ra, rb = await done(join(g, client="a"), join(g, client="b"))
        leader, follower = (ra, rb) if ra.member_id == ra.leader else (rb, ra)
        fs = asyncio.ensure_future(g.sync(follower.member_id, None, 1, "consumer", "range", {}))
        await asyncio.sleep(0.01)
        assert not fs.done()  # the follower waits for the leader's assignment
        persisted.hold = True
        ls = asyncio.ensure_future(g.sync(leader.member_id, None, 1, "consumer", "range",
                                          {leader.member_id: b"to-leader", follower.member_id: b"to-follower"}))
        await asyncio.sleep(0.01)
        assert persisted.calls == [(1, COMPLETING, leader.member_id,
                                    {leader.member_id: b"to-leader", follower.member_id: b"to-follower"})]
        assert not ls.done() and not fs.done() and g.state == COMPLETING  # nothing answered before it is durable
        persisted.release()
        (la, lt, lp), (fa, ft, fp) = await done(ls, fs)
        assert (la, fa) == (b"to-leader", b"to-follower") and lt == ft == "consumer" and lp == fp == "range"
        assert g.state == STABLE
        # a later SyncGroup of the same generation gets the same assignment at once
        again = await g.sync(follower.member_id, None, 1, None, None, {})
        assert again == (b"to-follower", "consumer", "range")
    run(go())


def test_sync_refusals():
    async def go():
        g, _, _ = new_group()
        leader, follower = await stable_pair(g)
        for args, code in (((follower.member_id, None, 2, None, None), Errors.ILLEGAL_GENERATION),
                           (("nobody", None, 1, None, None), Errors.UNKNOWN_MEMBER_ID),
                           ((follower.member_id, None, 1, "connect", None), Errors.INCONSISTENT_GROUP_PROTOCOL),
                           ((follower.member_id, None, 1, "consumer", "roundrobin"),
                            Errors.INCONSISTENT_GROUP_PROTOCOL)):
            with pytest.raises(GroupError) as e:
                await g.sync(*args, {})
            assert code_of(e) == code, args
        assert g.state == STABLE
    run(go())


def test_a_member_not_in_the_assignment_gets_an_empty_one():
    async def go():
        g, _, _ = new_group()
        ra, rb = await done(join(g, client="a"), join(g, client="b"))
        leader, follower = (ra, rb) if ra.member_id == ra.leader else (rb, ra)
        fs = asyncio.ensure_future(g.sync(follower.member_id, None, 1, None, None, {}))
        la = await g.sync(leader.member_id, None, 1, None, None, {leader.member_id: b"all"})
        assert la[0] == b"all" and (await done(fs))[0][0] == b""
    run(go())


# ------------------------------------------------------------ Heartbeat
def test_heartbeat_answers():
    async def go():
        g, _, _ = new_group()
        leader, follower = await stable_pair(g)
        assert g.heartbeat(follower.member_id, None, 1) == Errors.NONE
        for mid, gen, code in ((follower.member_id, 0, Errors.ILLEGAL_GENERATION),
                               (follower.member_id, 2, Errors.ILLEGAL_GENERATION),
                               ("nobody", 1, Errors.UNKNOWN_MEMBER_ID)):
            with pytest.raises(GroupError) as e:
                g.heartbeat(mid, None, gen)
            assert code_of(e) == code
        c = join(g, client="c")  # a third member: the group rebalances
        await asyncio.sleep(0)
        assert g.state == PREPARING
        assert g.heartbeat(follower.member_id, None, 1) == Errors.REBALANCE_IN_PROGRESS
        assert g.heartbeat(leader.member_id, None, 1) == Errors.REBALANCE_IN_PROGRESS
        rejoin = [join(g, member_id=x.member_id) for x in (leader, follower)]
        results = await done(c, *rejoin)
        assert {r.generation for r in results} == {2}
        with pytest.raises(GroupError) as e:
            g.heartbeat(follower.member_id, None, 1)  # the old generation
        assert code_of(e) == Errors.ILLEGAL_GENERATION
        assert g.heartbeat(follower.member_id, None, 2) == Errors.NONE
    run(go())


def test_heartbeat_to_an_empty_group_is_unknown_member():
    async def go():
        g, _, _ = new_group()
        with pytest.raises(GroupError) as e:
            g.heartbeat("m", None, 0)
        assert code_of(e) == Errors.UNKNOWN_MEMBER_ID
    run(go())


def test_a_follower_joining_again_unchanged_in_a_stable_group_gets_the_generation_without_a_rebalance():
    async def go():
        g, _, _ = new_group()
        leader, follower = await stable_pair(g)
        r = (await done(join(g, member_id=follower.member_id)))[0]
        assert (r.generation, r.leader, r.members) == (1, leader.member_id, []) and g.state == STABLE
        assert g.rebalances == 1
    run(go())


# ------------------------------------------------------------ expiry, LeaveGroup
def test_session_expiry_removes_the_member_and_starts_a_rebalance():
    async def go():
        g, clock, _ = new_group()
        leader, follower = await stable_pair(g)
        clock.t += SESSION_MS / 2000
        assert g.heartbeat(leader.member_id, None, 1) == Errors.NONE
        assert g.expire(clock.t) == 0
        clock.t += SESSION_MS / 2000 + 0.001  # the follower's session is over, the leader's is not
        assert g.expire(clock.t) == 1
        assert set(g.members) == {leader.member_id} and g.state == PREPARING
        assert g.heartbeat(leader.member_id, None, 1) == Errors.REBALANCE_IN_PROGRESS
        with pytest.raises(GroupError) as e:
            g.heartbeat(follower.member_id, None, 1)
        assert code_of(e) == Errors.UNKNOWN_MEMBER_ID
        r = (await done(join(g, member_id=leader.member_id)))[0]
        assert r.generation == 2 and r.members == [(leader.member_id, None, b"meta-range")]
    run(go())


def test_a_member_waiting_on_the_coordinator_does_not_expire_and_unused_member_ids_lapse():
    async def go():
        g, clock, _ = new_group()
        r = (await done(join(g, client="p", require_known_id=True)))[0]
        a = join(g, client="a", rebalance_ms=10_000)
        await asyncio.sleep(0)
        clock.t += SESSION_MS / 1000 + 1
        assert g.expire(clock.t) == 1  # the id handed out to "p" lapsed; "a" is waiting in its join
        assert r.member_id not in g.pending and len(g.members) == 1
        assert (await done(a))[0].generation == 1
    run(go())


def test_leave_group():
    async def go():
        g, _, _ = new_group()
        leader, follower = await stable_pair(g)
        assert g.leave("nobody", None) == Errors.UNKNOWN_MEMBER_ID and g.state == STABLE
        assert g.leave(leader.member_id, None) == Errors.NONE
        assert g.state == PREPARING and set(g.members) == {follower.member_id}
        r = (await done(join(g, member_id=follower.member_id)))[0]
        assert r.generation == 2 and r.leader == follower.member_id  # the leader left: a new one
        assert g.leave(follower.member_id, None) == Errors.NONE
        await asyncio.sleep(REBALANCE_MS / 1000 * 1.5)  # the rebalance with no one left completes
        assert g.state == EMPTY and not g.members and g.generation == 3
        # Kafka keeps the protocol type: ListGroups tells this consumer group from a "simple" one by it.
        assert g.protocol_type == "consumer" and g.protocol is None
    run(go())


def test_a_leave_during_the_join_completes_it_for_the_others():
    async def go():
        g, _, _ = new_group()
        leader, follower = await stable_pair(g)
        again = join(g, member_id=leader.member_id)  # the leader joins again: a rebalance
        await asyncio.sleep(0)
        assert g.state == PREPARING and not again.done()
        assert g.leave(follower.member_id, None) == Errors.NONE
        r = (await done(again, timeout=REBALANCE_MS / 2000))[0]  # not waiting for the rebalance timeout
        assert r.generation == 2 and r.members == [(leader.member_id, None, b"meta-range")]
    run(go())


# ------------------------------------------------------------ static members (KIP-345)
def test_a_newer_static_member_fences_the_old_member_id():
    async def go():
        g, _, _ = new_group()
        old = (await done(join(g, instance_id="inst-1", client="v1")))[0]
        await g.sync(old.member_id, "inst-1", 1, None, None, {old.member_id: b"parts"})
        assert g.state == STABLE and g.static == {"inst-1": old.member_id}
        new = join(g, instance_id="inst-1", client="v2")  # the same instance restarted, a new member id
        await asyncio.sleep(0)
        assert old.member_id not in g.members
        for call in (lambda: g.heartbeat(old.member_id, "inst-1", 1),
                     lambda: g.check_member(old.member_id, "inst-1", None)):
            with pytest.raises(GroupError) as e:
                call()
            assert code_of(e) == Errors.FENCED_INSTANCE_ID
        with pytest.raises(GroupError) as e:
            await g.sync(old.member_id, "inst-1", 1, None, None, {})
        assert code_of(e) == Errors.FENCED_INSTANCE_ID
        with pytest.raises(GroupError) as e:
            await g.join(old.member_id, "inst-1", "v1", "h", SESSION_MS, REBALANCE_MS, "consumer", RANGE, True)
        assert code_of(e) == Errors.FENCED_INSTANCE_ID
        assert g.leave(old.member_id, "inst-1") == Errors.FENCED_INSTANCE_ID
        r = (await done(new))[0]
        assert r.member_id != old.member_id and r.member_id.startswith("v2-") and g.static == {"inst-1": r.member_id}
        assert g.heartbeat(r.member_id, "inst-1", r.generation) in (Errors.NONE, Errors.REBALANCE_IN_PROGRESS)
    run(go())


def test_a_static_member_is_not_removed_when_a_rebalance_completes_without_it_and_leaves_by_instance_id():
    async def go():
        g, _, _ = new_group()
        ra, rb = await done(join(g, instance_id="s", client="a"), join(g, client="b"))
        static = ra if g.members[ra.member_id].instance_id == "s" else rb
        dynamic = rb if static is ra else ra
        # a rebalance where neither joins again before the timeout: the dynamic member is removed
        g._prepare_rebalance("test")
        await asyncio.sleep(REBALANCE_MS / 1000 * 1.5)
        assert set(g.members) == {static.member_id} and g.generation == 2
        assert g.leave("", "s") == Errors.NONE and g.static == {} and not g.members
        assert dynamic.member_id not in g.members
    run(go())


# ------------------------------------------------------------ a leader that never syncs
def test_members_that_never_sync_are_removed_after_the_rebalance_timeout():
    async def go():
        g, _, persisted = new_group()
        ra, rb = await done(join(g, client="a"), join(g, client="b"))
        leader, follower = (ra, rb) if ra.member_id == ra.leader else (rb, ra)
        fs = asyncio.ensure_future(g.sync(follower.member_id, None, 1, None, None, {}))
        await asyncio.sleep(REBALANCE_MS / 1000 * 1.5)  # the leader never sends its assignment
        assert leader.member_id not in g.members and g.state == PREPARING
        with pytest.raises(GroupError) as e:
            await fs
        assert code_of(e) == Errors.REBALANCE_IN_PROGRESS  # the follower is told to join again
        assert persisted.calls == []
        r = (await done(join(g, member_id=follower.member_id)))[0]
        assert r.generation == 2 and r.leader == follower.member_id
    run(go())


def test_a_member_that_never_joins_again_is_removed_after_the_rebalance_timeout():
    async def go():
        g, _, _ = new_group()
        leader, follower = await stable_pair(g)
        again = join(g, member_id=leader.member_id)
        t0 = asyncio.get_running_loop().time()
        r = (await done(again))[0]
        waited = asyncio.get_running_loop().time() - t0
        assert REBALANCE_MS / 1000 * 0.9 <= waited < 1.5  # the join waited the rebalance timeout for the follower
        assert r.generation == 2 and set(g.members) == {leader.member_id}
        with pytest.raises(GroupError) as e:
            g.heartbeat(follower.member_id, None, 1)
        assert code_of(e) == Errors.UNKNOWN_MEMBER_ID
    run(go())


def test_the_group_empties_and_is_persisted_when_everyone_is_gone():
    async def go():
        g, _, persisted = new_group()
        r = (await done(join(g)))[0]
        await g.sync(r.member_id, None, 1, None, None, {r.member_id: b"x"})
        assert persisted.calls[-1] == (1, COMPLETING, r.member_id, {r.member_id: b"x"})
        assert g.leave(r.member_id, None) == Errors.NONE
        await asyncio.sleep(0.01)
        assert g.state == EMPTY and g.generation == 2 and g.protocol is None
        assert persisted.calls[-1] == (2, EMPTY, None, {})
    run(go())


def test_a_static_member_restarting_in_a_stable_group_does_not_rebalance():
    """KIP-345, Kafka's updateStaticMemberAndRebalance: the restarted instance gets the current generation at
    once, the leader named as before."""
    async def go():
        g, _, persisted = new_group()
        ra, rb = await done(join(g, instance_id="s", client="a"), join(g, client="b"))
        leader = ra if ra.member_id == ra.leader else rb
        other = rb if leader is ra else ra
        fs = asyncio.ensure_future(g.sync(other.member_id, g.members[other.member_id].instance_id, 1, None, None, {}))
        await g.sync(leader.member_id, g.members[leader.member_id].instance_id, 1, None, None,
                     {ra.member_id: b"A", rb.member_id: b"B"})
        await done(fs)
        # the static member restarts: JoinGroup with no member id and its instance id, the same protocols
        r = (await done(join(g, instance_id="s", client="a2"), timeout=REBALANCE_MS / 4000))[0]
        assert r.error == Errors.NONE and r.generation == 1 and r.leader == leader.member_id and r.members == []
        assert g.state == STABLE and g.rebalances == 1
        assert g.heartbeat(rb.member_id, None, 1) == Errors.NONE  # the other member: no rebalance to join
        # the new id takes the old one's place and assignment; the old id is fenced
        assert await g.sync(r.member_id, "s", 1, None, None, {}) == (b"A", "consumer", "range")
        assert persisted.calls[-1][3] == {r.member_id: b"A", rb.member_id: b"B"}
        for call in (lambda: g.heartbeat(ra.member_id, "s", 1), lambda: g.check_member(ra.member_id, "s", 1)):
            with pytest.raises(GroupError) as e:
                call()
            assert code_of(e) == Errors.FENCED_INSTANCE_ID
    run(go())


def test_heartbeat_while_completing_the_rebalance_is_none():
    async def go():
        g, _, _ = new_group()
        ra, rb = await done(join(g, client="a"), join(g, client="b"))
        assert g.state == COMPLETING
        assert g.heartbeat(ra.member_id, None, 1) == Errors.NONE == g.heartbeat(rb.member_id, None, 1)
    run(go())
