"""How a ``RaftNode`` is ticked: on its asyncio loop (a node process, the in-process test clusters) or by
its caller (the simulation), and the fail-stop around every tick.  Mixed into ``RaftNode``, whose state
it shares (``node``)."""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import Any, Callable

from snapshots.storage.disk import EXIT_SOFTWARE, EXIT_STORAGE, StorageFailure

from ..looppoller import LoopPoller
from .upstream import LEADER
from .upstream import clock as raft_clock

log = logging.getLogger(__package__ + ".node")  # the node's log lines keep their logger's name

FOLLOWER_APPLY_S = 0.005  # a follower applies a commit index it learned at most this late (RaftNode.quiet_append)


class LoopDriver:
    """The tick: when it runs (``wake``, ``tick_wait``), what may wait for the timed one (``_on_ready``,
    ``quiet_append``), and the fail-stop around it (``_guarded``, ``halt``).  ``RaftNode.__init__`` sets
    the state below."""

    _obj: Any  # the Raft object (``replication.Replicated``)
    _loop: asyncio.AbstractEventLoop | None
    _loop_thread: int | None
    _tick_soon: asyncio.Handle | None
    _tick_timer: asyncio.TimerHandle | None
    _stopping: bool
    _poller: LoopPoller | None
    _calls: queue.SimpleQueue
    _tick_period: float
    _apply_due: float | None
    journal: Any
    failstop: Any
    messages_read: int
    quiet: int

    def on_loop_thread(self) -> bool:
        return self._loop_thread is not None and threading.get_ident() == self._loop_thread

    def wake(self) -> None:
        """A tick at the loop's next pass (a descriptor was ready, a command queued); one per pass."""
        if self._tick_soon is None and not self._stopping:
            self._tick_soon = self._loop.call_soon(self._loop_tick)

    def _loop_tick(self, timer: bool = False) -> None:
        """One tick on the loop; the next at the latest when ``tick_wait`` says.  A timer already set no
        later than that stays (a tick a little early is harmless; a timer replaced at every tick, two or
        three per entry, cost more than the tick's own work on the leader)."""
        if self._tick_soon is not None:
            self._tick_soon.cancel()
            self._tick_soon = None
        if timer:
            self._tick_timer = None
        if self._stopping:
            return
        self._guarded(self._obj.doTick, 0.0)
        if self._stopping:
            return
        self._arm()

    def _arm(self) -> None:
        """The timed tick no later than ``tick_wait`` says."""
        when = self._loop.time() + self.tick_wait()
        if self._tick_timer is not None:
            if self._tick_timer.when() <= when:
                return
            self._tick_timer.cancel()
        self._tick_timer = self._loop.call_at(when, self._loop_tick, True)

    def _on_ready(self, handler: Callable[[int, int], None], descr: int, event: int) -> None:
        """A descriptor of pysyncobj's is ready: its handler (messages read and acted on), then a tick.

        Except when every message read was quiet, its tick due no sooner than the timed one
        (``tick_wait``):
        * a leader's acknowledgement that commits nothing (in three nodes, the second follower's
          acknowledgement of an entry the first one's already committed): its tick would find nothing
          to commit, apply or send, and it was a third of the leader's ticks;
        * a follower's AppendEntries from its leader in the steady state (``quiet_append``): it was
          appended, synced and acknowledged in the handler; what its tick would do is apply the commit
          index it carried, which can wait ``FOLLOWER_APPLY_S``.  Then it is applied in one tick with
          those of the next AppendEntries, and not in the instants after the acknowledgement, when the
          leader needs a CPU to commit and answer.
        A read with no message (a partial one, a connection's events, pysyncobj's pipe) ticks at the loop's
        next pass, as does any read on a follower or candidate (one tick for all the pass's reads).

        On the leader a read with a message that is not quiet ticks at once, before this returns: in the
        steady state that is the first acknowledgement of an entry, whose tick commits, applies and
        answers it.  Scheduled for the next pass, that tick waited behind the pass's other callbacks
        and a poll of the selector; the second acknowledgement, usually read in a later pass, is quiet."""
        if self._stopping:
            return
        messages, quiet = self.messages_read, self.quiet
        self._guarded(handler, descr, event)
        read = self.messages_read - messages
        if read and read == self.quiet - quiet:
            if self._apply_due is not None and not self._stopping:
                self._arm()
            return
        if read and self._obj.state == LEADER:
            self._loop_tick()
            return
        self.wake()

    def quiet_append(self) -> None:
        """A follower took an AppendEntries from its leader in its term, appended every entry, cut nothing,
        changed no membership and acknowledged them (``Replicated._match_and_append``): its tick can wait,
        to apply what is committed within ``FOLLOWER_APPLY_S``."""
        self.quiet += 1
        obj = self._obj
        if self._apply_due is None and obj.commit_index > obj.last_applied:
            self._apply_due = raft_clock() + FOLLOWER_APPLY_S

    def propose_now(self) -> None:
        """The leader appends the commands queued on its loop and sends them to its followers now, then
        starts its own sync: what its next tick would do first, without the rest of that tick.

        A proposal's tick was half of the leader's ticks, and all of it but this part (the commit
        index, the step-down check, the apply, the timers, the pings) waits for the tick that the first
        acknowledgement brings, a round trip later, or the timed one.  Nothing is skipped in between
        that the entry needs: ``check_commands`` is pysyncobj's own step (it appends at the
        leader's next index in its term, registers the callback and sends the AppendEntries), and
        ``start_sync`` is ``_on_tick``'s, so the entry's durability is as before (``Gate``): nothing is
        committed before its sync is collected."""
        if not self._stopping:
            self._guarded(self._propose_now)

    def _propose_now(self) -> None:
        self._obj.check_commands()
        self.journal.start_sync()

    def _guarded(self, fn: Callable, *args) -> None:
        """Fail-stop: any exception stops the node.  The loop itself would log it and go on, which after
        a failed fsync means acknowledging entries that were never written.  Nothing of this node runs
        after it (``halt``), whether ``failstop`` ends the process or, in a test, returns."""
        try:
            fn(*args)
        except StorageFailure as e:
            self.halt()
            self.failstop(EXIT_STORAGE, f"the Raft tick hit an I/O error: {e}")
        except Exception as e:  # noqa: BLE001 - fail-stop on anything unexpected
            self.halt()
            log.critical("the Raft tick failed", exc_info=True)
            self.failstop(EXIT_SOFTWARE, f"the Raft tick failed: {type(e).__name__}: {e}")
        except BaseException:
            self.halt()
            raise

    def halt(self) -> None:
        """No tick, no message handled after this (on the loop's thread); the sockets stay as they are."""
        self._stopping = True
        for handle in (self._tick_soon, self._tick_timer):
            if handle is not None:
                handle.cancel()
        self._tick_soon = self._tick_timer = None
        if self._poller is not None:
            self._poller.close()

    def tick_wait(self) -> float:
        """How long the node may wait for messages before its next tick: a tick period, or less
        when the leader owes its followers an AppendEntries sooner (a new commit index: Replicated), a
        follower's election deadline comes sooner or it has committed entries to apply (``quiet_append``)."""
        obj = self._obj
        now = raft_clock()
        wait = self._tick_period
        if self._apply_due is not None and obj.commit_index > obj.last_applied:
            wait = min(wait, max(self._apply_due - now, 0.0))  # what a follower learned is committed (quiet_append)
        if obj.state == LEADER:
            return min(wait, max(obj.next_append_time - now, 0.0))
        # A follower or candidate wakes for its election deadline, not at the next tick after it: the
        # followers of a lost leader campaign at the instants they drew (``Replicated.on_node_disconnected``), so
        # they do not split the vote by falling due in the same tick.  (A deadline already past: the tick
        # about to run starts the election, or this node reaches nobody and has nothing to wake for.)
        remaining = obj.election_deadline - now
        return wait if remaining <= 0 else min(wait, remaining)

    def _on_raft_thread(self, fn: Callable[[], None]) -> None:
        self._calls.put(fn)
        if self._loop is not None:
            if self.on_loop_thread():
                self.wake()
            else:
                self._loop.call_soon_threadsafe(self.wake)
