"""pysyncobj's sockets on the node's asyncio loop (``quorum.looppoller``) and the node ticked there."""
from __future__ import annotations

import asyncio
import os
import socket
import threading

from pysyncobj.poller import POLL_EVENT_TYPE

from quorum.looppoller import LoopPoller
from records import encode_batch
from storage.disk import EXIT_SOFTWARE
from tests.support.inproc import SimCluster

READ, WRITE, ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR


async def _passes(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_ready_descriptor_reaches_its_handler_with_the_event():
    async def go():
        a, b = socket.socketpair()
        seen = []
        poller = LoopPoller(asyncio.get_running_loop(), lambda h, d, e: h(d, e))
        poller.subscribe(a.fileno(), lambda d, e: seen.append((d, e)) or a.recv(100), READ | ERROR)
        await _passes()
        assert seen == []  # nothing to read yet
        b.send(b"x")
        await _passes()
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
        await _passes()
        assert WRITE in seen  # a connected socket is writable
        poller.subscribe(fd, lambda d, e: seen.append(e) or a.recv(10), READ | ERROR)  # as pysyncobj does once its buffer is empty
        seen.clear()
        await _passes()
        assert seen == []
        b.send(b"x")
        await _passes()
        assert seen == [READ]
        poller.unsubscribe(fd)
        b.send(b"y")
        seen.clear()
        await _passes()
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
        await _passes()
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


def test_a_proposal_on_the_loop_schedules_a_tick_without_the_pipe():
    with SimCluster() as c:
        c.register(1)
        leader = c.leader()
        raft = leader.raft
        writes = []
        notifier = raft._obj._SyncObj__pipeNotifier
        original = notifier.notify
        notifier.notify = lambda: writes.append(1) or original()
        done = threading.Event()

        def propose():
            tick = raft._tick_soon
            raft.propose(encode_batch([]), lambda result, error: done.set())
            return tick, raft._tick_soon

        before, after = leader.on_loop(propose)
        assert before is None and after is not None  # the next pass ticks
        assert done.wait(5)
        assert writes == []  # no byte through pysyncobj's pipe for it
        # From another thread the pipe still wakes the loop.
        done.clear()
        raft.propose(encode_batch([]), lambda result, error: done.set())
        assert done.wait(5) and writes == [1]


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
