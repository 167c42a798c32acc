"""pysyncobj's sockets on the node's asyncio loop (``quorum.looppoller``) and the node ticked there."""
from __future__ import annotations

import asyncio
import os
import socket
import threading

from quorum.client import api as p
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.looppoller import ERROR, READ, WRITE, LoopPoller
from quorum.proposer import Proposal, Proposer
from quorum.raft import FOLLOWER_APPLY_S
from quorum.rpcs import RPCS
from quorum.server import SERVER_API, InOrder, QuorumServer
from records import encode_batch
from snapshots.storage.disk import EXIT_SOFTWARE
from tests.support.inproc import STEADY, SimCluster
from tests.support.loop import passes



def track_ticks(obj) -> list:
    """Wrap a node's ``doTick``: the list returned is non-empty exactly while a tick runs."""
    in_tick, original = [], obj.doTick

    def tick(timeout):
        in_tick.append(True)
        try:
            return original(timeout)
        finally:
            in_tick.pop()

    obj.doTick = tick
    return in_tick


def test_a_ready_descriptor_reaches_its_handler_with_the_event():
    async def go():
        a, b = socket.socketpair()
        seen = []
        poller = LoopPoller(asyncio.get_running_loop(), lambda h, d, e: h(d, e))
        poller.subscribe(a.fileno(), lambda d, e: seen.append((d, e)) or a.recv(100), READ | ERROR)
        await passes()
        assert seen == []  # nothing to read yet
        b.send(b"x")
        await passes()
        assert seen == [(a.fileno(), READ)]
        poller.close()
        a.close(), b.close()

    asyncio.run(go())


def test_write_interest_follows_the_latest_subscription():
    async def go():
        a, b = socket.socketpair()
        seen = []
        poller = LoopPoller(asyncio.get_running_loop(), lambda h, d, e: h(d, e))
        fd = a.fileno()
        poller.subscribe(fd, lambda d, e: seen.append(e), READ | WRITE | ERROR)
        await passes()
        assert WRITE in seen  # a connected socket is writable
        # As pysyncobj does once its buffer is empty:
        poller.subscribe(fd, lambda d, e: seen.append(e) or a.recv(10), READ | ERROR)
        seen.clear()
        await passes()
        assert seen == []
        b.send(b"x")
        await passes()
        assert seen == [READ]
        poller.unsubscribe(fd)
        b.send(b"y")
        seen.clear()
        await passes()
        assert seen == [] and poller.descriptors == 0
        a.close(), b.close()

    asyncio.run(go())


def test_a_socket_closed_before_it_is_unsubscribed_leaves_its_number_usable():
    """pysyncobj closes a connection's socket and then unsubscribes it (the kernel has already taken it
    out of the loop's epoll set); the next socket given that number must be subscribable and reported."""
    async def go():
        poller = LoopPoller(asyncio.get_running_loop(), lambda h, d, e: h(d, e))
        a, b = socket.socketpair()
        fd = a.fileno()
        poller.subscribe(fd, lambda d, e: None, READ | WRITE | ERROR)
        a.close()
        poller.unsubscribe(fd)  # no error
        c, d = socket.socketpair()
        if c.fileno() == fd:
            reused = c
        else:  # the number went elsewhere meanwhile: give it to this socket
            os.dup2(c.fileno(), fd)
            reused = socket.socket(fileno=fd)
        seen = []
        poller.subscribe(fd, lambda dd, e: seen.append(e) or reused.recv(10), READ | ERROR)
        d.send(b"x")
        await passes()
        assert seen == [READ]
        poller.close()
        for s in {b, c, d, reused}:
            s.close()

    asyncio.run(go())


def test_every_tick_and_every_apply_runs_on_the_nodes_loop_thread():
    with SimCluster() as c:
        epoch = c.register(1)
        applied_on = []
        for n in c.nodes.values():
            original = n.service._apply

            def spy(index, term, payload, original=original, n=n):
                applied_on.append((n.node_id, threading.get_ident() == n.loop_thread.ident))
                return original(index, term, payload)
            n.raft._on_apply = spy
        c.allocate(1, epoch)
        c.wait(lambda: {nid for nid, _ in applied_on} == set(c.nodes), what="every node to apply")
        assert all(on_loop for _, on_loop in applied_on)
        assert not [t.name for t in threading.enumerate() if t.name.startswith("raft-")]


def test_a_leaders_proposal_on_its_loop_is_appended_sent_and_synced_at_once_without_a_tick_or_the_pipe():
    """On the leader's loop a proposal is appended, sent to every follower and its sync started in the
    call itself (``RaftNode.propose_now``): no tick scheduled for it, no byte through pysyncobj's pipe.
    On a follower's loop it is queued for the next pass's tick; from another thread the pipe wakes the loop."""
    with SimCluster() as c:
        c.register(1)
        leader = c.leader()
        raft = leader.raft
        writes, sent, syncs = [], [], []
        notifier = raft._obj.pipe_notifier
        original = notifier.notify
        notifier.notify = lambda: writes.append(1) or original()
        send, start_sync = raft._transport.send, raft.journal.start_sync

        def spy_send(node, message):
            if isinstance(message, dict) and message.get("type") == "append_entries":
                sent.append((node.address, [e[1] for e in message.get("entries", [])]))
            return send(node, message)

        def spy_sync():
            syncs.append(len(sent))
            return start_sync()
        done = threading.Event()

        def propose():
            raft._transport.send, raft.journal.start_sync = spy_send, spy_sync
            try:
                tick, before = raft._tick_soon, raft.journal.entries[-1][1]
                raft.propose(encode_batch([]), lambda result, error: done.set())
                return tick, raft._tick_soon, before, raft.journal.entries[-1][1], list(sent), list(syncs)
            finally:
                raft._transport.send, raft.journal.start_sync = send, start_sync

        tick_before, tick_after, last_before, last_after, sent_now, syncs_now = leader.on_loop(propose)
        assert tick_before is None and tick_after is None  # no tick for it
        assert last_after == last_before + 1  # appended in the call
        followers = {n.raft.self_addr for n in c.running() if n is not leader}
        assert {addr for addr, indexes in sent_now if last_after in indexes} == followers  # sent to both
        assert syncs_now and syncs_now[-1] == len(sent_now)  # its sync started after the sends
        assert done.wait(5)
        assert writes == []

        # On a follower's loop: queued, and the next pass ticks (which forwards it to the leader).
        f = next(n for n in c.running() if n is not leader)
        done.clear()

        def propose_on_follower():
            tick = f.raft._tick_soon
            f.raft.propose(encode_batch([]), lambda result, error: done.set())
            return tick, f.raft._tick_soon
        before, after = f.on_loop(propose_on_follower)
        # A tick is scheduled for it: a new one, or the one a message that just arrived had scheduled already
        # (one per pass: the proposal rides on it).
        assert after is not None and (before is None or before is after)
        assert done.wait(5)

        # From another thread the pipe still wakes the leader's loop.
        done.clear()
        raft.propose(encode_batch([]), lambda result, error: done.set())
        assert done.wait(5) and writes == [1]


def test_the_proposer_answers_its_requests_inside_the_tick_that_applies_their_entry():
    """A request's future is settled where its entry is applied, not a pass of the loop later by the
    proposer's coroutine: the waiting handler resumes in the next pass."""
    with SimCluster() as c:
        epoch = c.register(1)
        leader = c.leader()
        in_tick = track_ticks(leader.raft._obj)
        settled = []
        original_finish = Proposal.finish

        def finish(self, response=None, error=None):
            settled.append((bool(in_tick), error))
            return original_finish(self, response, error)

        Proposal.finish = finish
        try:
            async def allocate_twice():
                proposer = Proposer(leader.service)
                runner = asyncio.get_running_loop().create_task(proposer.run())
                rpc = RPCS.of(p.ALLOCATE_PRODUCER_IDS, None)
                try:
                    return [await proposer.submit(rpc, p.allocate_request(1, epoch), 10.0) for _ in range(2)]
                finally:
                    runner.cancel()

            done = threading.Event()
            out = []
            leader.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(allocate_twice()).add_done_callback(
                lambda f: (out.append(f.result()), done.set())))
            assert done.wait(10)
        finally:
            Proposal.finish = original_finish
        blocks = out[0]
        assert len(blocks) == 2 and blocks[0] != blocks[1]
        assert settled == [(True, None), (True, None)]


def test_an_exception_while_a_message_is_handled_stops_the_node():
    """The loop logs an exception of a callback and goes on; a node must not (a fail-stop, as for an
    exception in a tick), and nothing of it runs after."""
    with SimCluster() as c:
        epoch = c.register(1)
        leader = c.leader()
        f = next(n for n in c.nodes.values() if n is not leader)
        obj = f.raft._obj

        def broken(node, message):
            raise RuntimeError("a bug in the handler")
        obj._append_entries = broken
        c.allocate(1, epoch)  # committed by the two others
        c.wait(lambda: f.halted is not None, what="the follower to fail-stop")
        assert f.halted[0] == EXIT_SOFTWARE and "a bug in the handler" in f.halted[1]
        assert f.on_loop(lambda: (f.raft._stopping, f.raft._poller.descriptors, f.raft._tick_timer)) == (True, 0, None)
        for _ in range(2):
            c.allocate(1, epoch, among=[n.node_id for n in c.nodes.values() if n is not f])
        c.assert_no_block_reissued()


def test_the_leader_skips_the_tick_of_an_acknowledgement_that_commits_nothing():
    """In three nodes the second acknowledgement of an entry usually finds it committed: its tick would do
    nothing.  Every other read (an acknowledgement that commits, any other message, a read with no
    message) still ticks, and every entry still commits.  On the leader a read with a message that is
    not quiet ticks at once, inside the read: the acknowledgement that commits an entry has it applied
    (and its requests answered) before the read returns, not at the loop's next pass."""
    with SimCluster(raft=STEADY) as c:
        c.register(1)
        leader = c.leader()
        raft = leader.raft
        wakes, reads, applied_in_read = [0], [], []
        wake, loop_tick = raft.wake, raft._loop_tick

        def counting_wake():
            wakes[0] += 1
            wake()

        def counting_tick(timer=False):
            if not timer:
                wakes[0] += 1  # a tick run at once counts as one asked for
            loop_tick(timer)

        on_ready = raft._poller._on_ready
        transport = raft._transport
        received = raft._obj.on_message  # what Raft does with each message the transport hands it
        kinds: list[str] = []

        def spy(handler, descr, event):
            m, q, w, a = raft.messages_read, raft.quiet, wakes[0], raft._obj.last_applied
            kinds.clear()
            on_ready(handler, descr, event)
            reads.append((raft.messages_read - m, raft.quiet - q, wakes[0] - w))
            ack_reads.append(wakes[0] - w if kinds and set(kinds) == {"next_node_idx"} else None)
            if kinds and set(kinds) == {"next_node_idx"} and raft._obj.last_applied > a:
                applied_in_read.append(raft._obj.last_applied)

        def install():
            raft.wake = counting_wake
            raft._loop_tick = counting_tick
            raft._poller._on_ready = spy
            raft._obj.on_message = lambda node, message: kinds.append(message.get("type")) or received(
                node, message)
        ack_reads: list[int | None] = []
        leader.on_loop(install)
        for _ in range(20):
            c._propose(leader, [], 2.0)  # each commits (the answer comes from the leader's apply)
        # The first acknowledgement of each entry commits it: that read ticks (the second's may not).
        assert len([w for w in ack_reads if w]) >= 20
        assert len(applied_in_read) >= 20  # each applied inside the read of the acknowledgement that commits it

        # Whether a second acknowledgement arrives before or after the first one's tick is the machine's
        # timing; so also one delivered here, the duplicate of an acknowledgement already counted.
        follower = next(n for n in raft._obj.other_nodes)

        def deliver(message):
            def handler(descr, event):
                transport.message_received(follower, message)
            spy(handler, -1, 1)
            return reads[-1]

        def duplicate_ack():
            obj = raft._obj
            match = obj.match_index[follower]
            return {"type": "next_node_idx", "next_node_idx": match + 1, "reset": False, "success": True,
                    "term": obj.term}

        c.wait(lambda: leader.on_loop(raft._obj._commits_nothing), what="every entry committed and applied")
        assert leader.on_loop(lambda: deliver(duplicate_ack())) == (1, 1, 0)  # no tick for it
        ping = {"type": "pq_ping", "log": list(raft.journal.durable_end())}
        assert leader.on_loop(lambda: deliver(ping)) == (1, 0, 1)  # any other message ticks
        assert leader.on_loop(lambda: (spy(lambda d, e: None, -1, 1), reads[-1])[1]) == (0, 0, 1)  # no message: ticks
        leader.on_loop(lambda: (setattr(raft._poller, "_on_ready", on_ready), setattr(raft, "wake", wake),
                                setattr(raft, "_loop_tick", loop_tick)))
        raft._obj.on_message = received
        quiet = [r for r in reads if r[0] and r[0] == r[1]]
        assert quiet and all(w == 0 for _, _, w in quiet)
        assert all(w >= 1 for m, q, w in reads if not (m and m == q))


def test_a_follower_takes_its_leaders_appendentries_without_a_tick_and_applies_them_on_time():
    """A follower's AppendEntries from its leader, appended, synced and acknowledged in the handler, needs
    no tick of its own: the commit index it carries is applied by the timed tick, set no later than
    ``FOLLOWER_APPLY_S`` ahead.  Any other read still ticks, and the follower applies every entry."""
    with SimCluster() as c:
        c.register(1)
        leader = c.leader()
        f = next(n for n in c.running() if n is not leader)
        raft = f.raft
        wakes, reads, armed = [0], [], []
        wake, on_ready = raft.wake, raft._poller._on_ready

        def counting_wake():
            wakes[0] += 1
            wake()

        def spy(handler, descr, event):
            m, q, w = raft.messages_read, raft.quiet, wakes[0]
            on_ready(handler, descr, event)
            reads.append((raft.messages_read - m, raft.quiet - q, wakes[0] - w))
            if reads[-1][0] and reads[-1][0] == reads[-1][1] and raft._apply_due is not None:
                armed.append(raft._tick_timer.when() - raft._loop.time())

        def install():
            raft.wake = counting_wake
            raft._poller._on_ready = spy
        f.on_loop(install)
        for _ in range(25):  # 20 quiet reads asked for: a read can also hold a peer's ping (then it ticks)
            c._propose(leader, [], 2.0)
        commit = leader.on_loop(lambda: leader.raft._obj.commit_index)
        c.wait(lambda: f.on_loop(lambda: raft._obj.last_applied) >= commit, what="the follower to apply every entry")

        quiet = [r for r in reads if r[0] and r[0] == r[1]]
        assert len(quiet) >= 20 and all(w == 0 for _, _, w in quiet)  # each entry's AppendEntries: no tick
        assert armed and max(armed) <= FOLLOWER_APPLY_S  # its apply: the timed tick, that soon

        # An AppendEntries that does not match the log (here: after an index the follower does not hold) is
        # not the steady state: the follower asks the leader to resume at its end, and that read ticks.
        leader_node = f.on_loop(lambda: raft._obj.leader)

        def deliver_unmatched():
            obj = raft._obj
            m = {"type": "append_entries", "term": obj.term, "commit_index": 0,
                 "prevLogIdx": len(raft.journal) + 1000, "prevLogTerm": obj.term, "entries": []}
            spy(lambda d, e: raft._transport.message_received(leader_node, m), -1, 1)
            return reads[-1]
        assert f.on_loop(deliver_unmatched) == (1, 0, 1)
        f.on_loop(lambda: (setattr(raft, "wake", wake), setattr(raft._poller, "_on_ready", on_ready)))
        c.allocate(2, c.register(2))  # the cluster goes on


def serve_five_allocations(leader, on_answer_written) -> list:
    """Serve the client port on ``leader``'s loop (the real ``QuorumServer``) while a client registers a broker
    and allocates five blocks; ``on_answer_written()`` runs whenever an answer leaves for the client's socket
    (``InOrder._flush`` wrote one).  Returns the blocks."""
    original_flush = InOrder._flush

    def flush(self):
        before = len(self._line)
        original_flush(self)
        if len(self._line) < before:
            on_answer_written()

    InOrder._flush = flush
    server = QuorumServer(leader.service)
    try:
        asyncio.run_coroutine_threadsafe(server.start(), leader.loop).result(10)

        async def allocate():
            client = QuorumClient([leader.cfg.client_address], RetryPolicy(timeout=10, attempt_timeout=5))
            try:
                epoch = await client.register_broker(7)
                return [await client.allocate(7, epoch) for _ in range(5)]
            finally:
                await client.close()

        return asyncio.run(allocate())
    finally:
        InOrder._flush = original_flush
        asyncio.run_coroutine_threadsafe(server.stop(), leader.loop).result(10)


def test_the_leader_writes_an_answer_inside_the_tick_that_applies_its_entry():
    """A request the leader proposes is answered from the tick that applied its entry (``Proposal.on_value``),
    not a pass of the loop later by the request's task: over the wire, through the real server."""
    with SimCluster() as c:
        leader = c.leader()
        in_tick = track_ticks(leader.raft._obj)
        flushes = []
        blocks = serve_five_allocations(leader, lambda: flushes.append(bool(in_tick)))
        starts = [b.start for b in blocks]
        assert starts == sorted(set(starts)) and len(starts) == 5
        assert flushes == [True] * 6  # the registration and five allocations, each written in its tick


def test_the_leader_encodes_an_answer_while_its_entry_is_on_its_way_and_writes_the_audit_trail_before_it():
    """A proposed request's answer is encoded once its entry is handed to Raft, before it is applied
    (``EarlyAnswer.prepare``): off the commit's critical path.  The entry's audit line is written before the
    answer leaves, so a client that reads the trails once it has its answer finds its block there."""
    with SimCluster() as c:
        leader = c.leader()
        service = leader.service
        in_tick = track_ticks(leader.raft._obj)
        encoded, written = [], []
        api = SERVER_API
        original_encode = api.encode

        def encode(*args, **kwargs):
            encoded.append(service.applied_index)
            return original_encode(*args, **kwargs)

        object.__setattr__(api, "encode", encode)  # the API table is a frozen dataclass
        try:
            blocks = serve_five_allocations(leader, lambda: written.append(
                (bool(in_tick), service.applied_index, service.audit.last_index)))
        finally:
            object.__setattr__(api, "encode", original_encode)
        assert [b.start for b in blocks] == sorted({b.start for b in blocks}) and len(blocks) == 5
        assert len(written) == 6 and len(encoded) == 6, (written, encoded)  # the registration, five allocations
        for applied_at_encode, (in_a_tick, applied, audited) in zip(encoded, written):
            assert in_a_tick and applied_at_encode < applied  # encoded before its entry was applied
            assert audited == applied  # the trail of the answered entry is written
