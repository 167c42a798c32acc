"""A restarted node or a restored backup never loses a committed entry: who vouches for it, the recovery
target it is held to, and the membership it trusts.  Real nodes on a ``SimDisk``, one regression test per
defect found by review or by the deterministic simulation."""
from __future__ import annotations

import os
import struct
import zlib

import msgpack
import pytest

from quorum.raft import ProposalUnknown
from tests.quorum.raft_messages import fake_peer, vouch
from tests.support.inproc import DATA, SimCluster
from tests.quorum.durability_steps import _append_term_1_tail, _blocks_committed


def _restore_and_expect_nobody_elected_until_the_leader_is_back(c, epoch, a, b, backup, restarts: int) -> None:
    """The leader A dies and B starts on ``backup``: B is held back, restart after restart, and nobody is
    elected; once A is back the cluster goes on without re-issuing a block and B catches up."""
    a.crash()
    b.restart(backup)
    c.heal()
    for _ in range(restarts):  # repeated restarts of the restored node must not wear the check down
        c.wait(lambda: b.status()["recovering"] is not None, what="the restored node to be held back")
        with pytest.raises(TimeoutError):
            c.allocate(1, epoch, timeout=1.5)
        assert not any(n.raft.role()[0] for n in c.running())
        b.restart(b.disk.crash())
    a.restart(a.disk.crash())
    block = c.allocate(1, epoch, timeout=30)
    assert block[0] >= max(s + n for s, n in c.acknowledged[:-1])
    c.assert_no_block_reissued()
    c.wait(lambda: b.status()["recovering"] is None, what="the restored node to catch up")


def test_restored_backup_with_the_leader_down_and_a_lagging_follower_elects_nobody():
    """Defect 4: a copy of a follower's data directory, taken while it ran and restored after it was killed,
    was let in; with the leader down and the other follower lagging, the two elected a leader and
    re-issued acknowledged blocks.  Restarts must not wear the check down."""
    with SimCluster() as c:
        epoch = _blocks_committed(c, 3)
        a = c.leader()
        b, lag = [n for n in c.nodes.values() if n is not a]
        backup = b.disk.copy()  # the nightly backup, copied while B runs
        c.cut(a.node_id, lag.node_id)  # the other follower lags: it hears B, not the leader
        for _ in range(4):
            c.allocate(1, epoch, among=[a.node_id, b.node_id])
        c.wait(lambda: lag.raft.identity.held(b.cfg.raft_address) == b.raft.journal.durable_end(),
               what="the lagging node to see B's position")
        _restore_and_expect_nobody_elected_until_the_leader_is_back(c, epoch, a, b, backup, restarts=4)


def test_restored_backup_is_held_back_even_when_the_only_peer_up_never_saw_what_it_lost():
    """The variation the simulation found (seed 104472 of the first 10,000-seed campaign): the other
    follower was cut off from both while the leader and B committed, so no peer that is up knows what B
    acknowledged.  B's start needs both peers' word; until the leader is back nobody is elected."""
    with SimCluster() as c:
        epoch = _blocks_committed(c, 2)
        a = c.leader()
        b, lag = [n for n in c.nodes.values() if n is not a]
        c.cut(a.node_id, lag.node_id)
        c.cut(b.node_id, lag.node_id)
        backup = b.disk.copy()  # the nightly backup, copied while B runs
        for _ in range(4):
            c.allocate(1, epoch, among=[a.node_id, b.node_id])
        _restore_and_expect_nobody_elected_until_the_leader_is_back(c, epoch, a, b, backup, restarts=3)


def test_a_restart_with_every_peer_up_is_vouched_for_at_once():
    """The price of the rule above is paid only when a peer is down: with all up, a restarted node votes
    and counts again as soon as it holds what the others do."""
    with SimCluster() as c:
        epoch = c.register(1)
        a = c.leader()
        b = next(n for n in c.nodes.values() if n is not a)
        b.restart(b.disk.crash())
        c.wait(lambda: b.status()["recovering"] is None, what="B to be vouched for")
        assert b.raft.vouched
        c.allocate(1, epoch, among=[a.node_id, b.node_id])


def test_identity_without_raft_files_does_not_vote_until_caught_up():
    """A data directory that kept ``identity`` but lost its raft.* files started as a blank voting member."""
    with SimCluster() as c:
        _blocks_committed(c, 3)
        a = c.leader()
        b = next(n for n in c.nodes.values() if n is not a)
        c.wait(lambda: a.raft.identity.held(b.cfg.raft_address) == b.raft.journal.durable_end(),
               what="the leader to see B's position")
        b.crash()
        image = b.disk.crash()
        for name in ("raft.journal", "raft.journal.meta", "raft.snapshot"):
            image.remove(os.path.join(DATA, name))
        b.restart(image)
        c.wait(lambda: b.raft.recovery is None, what="B to catch up from the leader")
        assert b.raft.votes_withheld >= 0 and b.raft.journal.durable_end()[1] >= 5


@pytest.mark.parametrize("second", ["this version", "an earlier version"])
def test_the_peers_that_vouch_set_the_whole_target_not_what_a_peer_saw_in_an_earlier_run(second):
    """Simulation seed 291: a restored former leader was held back to reach an entry of its own that was never
    committed and that no node held any more, while both other nodes, restarted after a power loss, waited to
    reach its log: nobody could stand, for good.  Once every peer it needs vouched, the highest of their log
    ends is the whole target (a committed entry is on one of them).  A peer of an earlier version reports no
    log end: then what it saw stays the target."""
    with SimCluster(start=False) as c:
        n = c.nodes[1]
        n.start()
        raft, journal = n.raft, n.raft.journal
        _append_term_1_tail(n, fake_peer(c, 2), commit_index=1)
        assert journal.durable_end() == (1, 5)
        # Peer 2 saw this node hold (3, 9) in its last run (a leader's own entry, never committed).
        vouch(n, c, 2, log_end=[1, 4], held=[3, 9], recover=[3, 9])
        assert raft.recovery == (3, 9) and not raft.vouched  # one voucher of the two it needs
        vouch(n, c, 3, log_end=[1, 5], held=[1, 5], older=second != "this version")
        assert raft.vouched
        if second == "this version":
            assert raft.recovery is None and journal.recovery_target() is None  # it holds (1, 5) already
            assert raft.status()["recovering"] is None
        else:
            assert raft.recovery == (3, 9) and journal.recovery_target() == (3, 9)
        assert raft.current_term() == 3  # and no vote in the vouchers' term, either way


def test_a_start_on_the_operators_word_lowers_a_peers_target_to_what_the_peers_hold():
    """``--trust-own-log`` vouches for a start at once; a peer that saw the node hold more than its files
    have proves the word wrong, and the node is held back to reach it.  When that position is an entry no
    node holds (a leader's own, never committed, lost to a conflict cut and a power loss), the node waited
    for it for good.  Once enough peers gave their word, their highest log end is the whole target."""
    with SimCluster(start=False) as c:
        n = c.nodes[1]
        n.start(trust_own_log=True)
        raft, journal = n.raft, n.raft.journal
        assert raft.vouched and raft.recovery is None
        _append_term_1_tail(n, fake_peer(c, 2), commit_index=1)
        term = raft.current_term()
        vouch(n, c, 2, log_end=[1, 4], held=[3, 9], recover=[3, 9])
        assert raft.recovery == (3, 9) and raft.restricted  # one peer's word of the two it needs
        vouch(n, c, 3, log_end=[1, 5], held=[1, 5])
        assert raft.recovery is None and journal.recovery_target() is None  # it holds (1, 5) already
        assert not raft.restricted
        assert raft.current_term() == term  # the operator's word stands for its term and vote


def test_a_restarted_node_uses_the_membership_in_its_journal():
    """After a restart pysyncobj rebuilt membership from the snapshot and then only from entries as they
    were committed again; the durable commit index is a hint written once a second, so a node restarted
    right after a member was added did not know it, could not connect to it, and could not hear its
    verdict that the node was behind (simulation: a leader elected without a committed entry)."""
    with SimCluster() as c:
        c.register(1)
        leader = c.leader()
        follower = next(x for x in c.nodes.values() if x is not leader)
        extra = "127.0.0.1:1"  # a member that never runs
        done = []
        leader.raft._on_raft_thread(lambda: leader.raft._obj.addNodeToCluster(
            extra, callback=lambda r, e: done.append(e)))
        c.wait(lambda: extra in follower.raft.members(), what="the follower to append the change")
        follower.crash()
        image = follower.disk.crash()
        meta_path = os.path.join(DATA, "raft.journal.meta")
        data = image.read(meta_path)
        body = msgpack.unpackb(data[8:-4], raw=False)
        body["commit_index"] = 1  # what a node that stopped within a second of the change has on disk
        raw = msgpack.packb(body, use_bin_type=True)
        image.write_file(meta_path, data[:8] + raw + struct.pack("<I", zlib.crc32(raw)))
        follower.restart(image)
        assert extra in follower.raft.members()


def test_a_backup_from_before_a_member_was_added_waits_for_the_word_of_the_new_configuration():
    """A copy from before a membership change knows only the configuration of its time: its word from
    those peers does not meet the majorities of the configuration since.  Two members, A and B, add C; A
    is cut off while B and C commit; B is restored from a backup taken before C was added.  Its own
    configuration (A, B) asks only A's word, and A lacks what B and C committed: A and B would make a
    majority of (A, B, C) without those entries and hand their blocks out again.  A's word carries A's
    configuration, newer than B's: B also waits for C's, and for C's log."""
    with SimCluster(size=2) as c:
        epoch = c.register(1)
        c.allocate(1, epoch)
        a, b = c.nodes[1], c.nodes[2]
        backup = b.disk.copy()  # the nightly backup: the configuration is (A, B)
        new = c.newcomer()
        new.start()
        c.leader().raft.add_member(new.cfg.raft_address, timeout=10.0)
        c.wait(lambda: all(len(n.raft.members()) == 3 for n in c.running()), what="every node to know C")
        c.cut(a.node_id, b.node_id)
        c.cut(a.node_id, new.node_id)
        for _ in range(3):
            c.allocate(1, epoch, among=[b.node_id, new.node_id])
        c.cut(b.node_id, new.node_id)  # C, which holds them with B, is unreachable while B restarts
        b.restart(backup)
        c.heal()
        c.cut(a.node_id, new.node_id)
        c.cut(b.node_id, new.node_id)
        c.wait(lambda: b.on_loop(lambda: a.cfg.raft_address in b.raft._vouchers), what="A's word for B")
        with pytest.raises(TimeoutError):
            c.allocate(1, epoch, timeout=3.0, among=[a.node_id, b.node_id])
        assert b.status()["recovering"] is not None
        c.heal()
        c.allocate(1, epoch, timeout=20.0)
        c.assert_no_block_reissued()


def test_a_restart_is_not_held_to_the_word_of_a_member_removed_before_its_configuration():
    """Only configurations newer than the restarted node's own count: a peer that has not applied the removal of
    a dead member yet reports a configuration older than the node's, and the dead member's word is not asked
    for (it never comes).  C dies; the leader A removes it while B is cut off, and restarts; B's word alone
    makes A count again, A leads, and B gets the removal from it."""
    with SimCluster() as c:
        epoch = c.register(1)
        a = c.leader()
        b, dead = [n for n in c.nodes.values() if n is not a]
        dead.crash()
        c.cut(a.node_id, b.node_id)
        with pytest.raises(ProposalUnknown):  # appended, but B, which the new configuration needs, is cut off
            a.raft.remove_member(dead.cfg.raft_address, timeout=1.0)
        assert dead.cfg.raft_address not in a.raft.members()
        assert dead.cfg.raft_address in b.raft.members()
        a.restart(a.disk.crash())
        c.heal()
        c.wait(lambda: a.status()["recovering"] is None, what="A to count again on B's word alone")
        c.allocate(1, epoch, among=[a.node_id, b.node_id])
        c.wait(lambda: dead.cfg.raft_address not in b.raft.members(), what="B to apply the removal")
        c.assert_no_block_reissued()


def test_a_new_member_that_alone_holds_what_the_others_wait_for_gets_their_votes():
    """The member added last can be the only node that holds what the others need while their logs do not list
    it yet.  A leads and B is cut off; A adds C and commits with C; A is restored from a backup taken before C
    was added.  A waits for C's log (C's configuration is newer than its own); B, not held back, cannot win
    A's vote with its shorter log; C needs one vote, and neither configuration lists it.  A held-back node
    votes for a candidate that reaches its target even from outside its configuration: C is elected."""
    with SimCluster(size=2) as c:
        epoch = c.register(1)
        c.allocate(1, epoch)
        a = c.leader()
        b = next(n for n in c.nodes.values() if n is not a)
        backup = a.disk.crash()  # the configuration is (A, B)
        new = c.newcomer()
        new.start()
        c.wait(lambda: new.raft.vouched, what="C to have the word of A and B")  # else its acknowledgements do not count
        c.cut(a.node_id, b.node_id)
        c.cut(b.node_id, new.node_id)
        a.raft.add_member(new.cfg.raft_address, timeout=10.0)  # committed by A and C
        for _ in range(3):
            c.allocate(1, epoch, among=[a.node_id])
        a.restart(backup)
        c.wait(lambda: a.on_loop(lambda: new.cfg.raft_address in a.raft._vouchers), what="C's word for A")
        assert a.raft.restricted
        c.heal()
        c.allocate(1, epoch, timeout=20.0)
        c.wait(lambda: all(len(n.raft.members()) == 3 for n in c.running()), what="A and B to learn of C")
        c.assert_no_block_reissued()


def test_a_start_is_not_vouched_for_while_a_linked_peers_word_is_on_its_way():
    """Enough words of its own configuration are not enough while a peer whose hello arrived has not given
    its word yet: that peer may be a member added since, whose configuration asks for more."""
    with SimCluster() as c:
        c.register(1)
        b = c.nodes[2]
        for other in (1, 3):
            c.cut(2, other)
        b.restart(b.disk.crash())
        words = {n.cfg.raft_address: ((1, 1), 1) for n in c.nodes.values() if n is not b}

        def check(pending: bool) -> bool:
            raft = b.raft
            raft._vouchers.update(words)
            raft._verified["127.0.0.2:9000"] = True  # linked, its hello checked
            for address, verified in raft._verified.items():  # (a real peer's hello may have come through the cut)
                if verified is True:
                    raft._welcomed[address] = not pending
            raft.check_vouched()
            return raft.vouched

        assert not b.on_loop(lambda: check(pending=True))
        assert b.on_loop(lambda: check(pending=False))
