"""One quorum node inside the simulation: the production ``Service`` (adapter, journal, snapshot
store, identity gate, state machine) and its ``Proposer``, on a ``SimDisk`` and the simulated
network, ticked by the simulation instead of a thread, its asyncio work run on simulated time."""
from __future__ import annotations

from typing import Protocol

from quorum.config import NodeConfig
from quorum.identity import IdentityError
from quorum.proposer import Proposer
from quorum.service import Service
from snapshots.storage.disk import CorruptFileError

from .clock import SimClock
from .disk import LossPolicy, MachineStopped, NodeHalted, SimDisk
from .host import Host
from .loop import SimLoop
from .net import SimNetwork, SimTransport, StableNode


class _Watcher(Protocol):
    """What the checker is told of a node's life."""

    def watch(self, node: SimulatedNode) -> None: ...

    def started(self, node: SimulatedNode) -> None: ...

    def installing(self, node: SimulatedNode, last: tuple, tail: int, held) -> None: ...


class NodeHost(Host, Protocol):
    """What a node uses of the simulation."""

    net: SimNetwork
    checker: _Watcher
    tick_period: float


class SimulatedNode:
    def __init__(self, sim: NodeHost, node_id: int, cfg: NodeConfig, disk: SimDisk):
        self.sim = sim
        self.node_id = node_id
        self.cfg = cfg
        self.disk = disk
        self.service: Service | None = None
        self.proposer: Proposer | None = None
        self.loop: SimLoop | None = None
        self.halted: tuple[int, str] | None = None
        self.refused: str | None = None  # why the last start was refused, if it was
        self.starts = 0
        self.next_tick: float | None = None
        self.slow: float = 0.0  # a slow disk: seconds each tick that synced adds before the next
        self.removed = False  # no longer a member (membership change); never started again
        self.cut = False  # a crash-state exploration cut this node's power (its restart is scheduled)
        # SIGSTOP (the transaction simulation's pause): not ticked, its loop not run; what reaches it
        # (messages, link changes, client requests) waits in ``deferred`` and runs, in order, on ``resume``.
        self.paused = False
        self.deferred: list = []
        # The next start is with the operator's word that the data directory is the node's own (--trust-own-log:
        # no peer's word needed before it votes and counts); the simulation sets it for a share of restarts.
        self.trust_own_log = False

    @property
    def address(self) -> str:
        return self.cfg.raft_address

    @property
    def running(self) -> bool:
        return self.service is not None

    @property
    def raft(self):
        return self.service.raft

    # ------------------------------------------------------------ lifecycle
    def _failstop(self, code: int, message: str):
        if self.halted is None:
            self.halted = (code, message)
        raise NodeHalted(code, message)

    def start(self) -> bool:
        """Start a process on the node's disk; False (and ``refused``) if it refuses to start."""
        assert self.service is None
        self.cut = False
        self.halted = self.refused = None
        self.disk.failstop = self._failstop
        self.disk.stopped = False
        self.starts += 1
        node, net = self, self.sim.net

        class Transport(SimTransport):
            network = net

        Transport.node = node
        self.loop = SimLoop(self.sim.clock)
        try:
            self.service = Service(self.cfg, disk=self.disk, clock=self.sim.clock, new_id=self.sim.new_id,
                                   failstop=self._failstop, transport_class=Transport,
                                   node_class=StableNode, trust_own_log=self.trust_own_log)
        except (CorruptFileError, IdentityError) as e:
            self.refused = str(e)
            self.sim.note(f"node {self.node_id} refuses to start: {e}")
            self._teardown()
            return False
        except (NodeHalted, MachineStopped) as e:
            self.refused = f"stopped while starting: {e}"
            self.sim.note(f"node {self.node_id} {self.refused}")
            self._teardown()
            return False
        self.sim.checker.watch(self)
        self._watch_installs()
        self.sim.checker.started(self)
        self.proposer = Proposer(self.service)
        self.proposer.linger_max_s = 0.0  # lingering only waits on real time patterns; keep batches plain
        self.loop.create_task(self.proposer.run())
        self.sim.note(f"node {self.node_id} started (start {self.starts}"
                      f"{', trusting its own log' if self.trust_own_log else ''}"
                      f"{', recovering to ' + str(self.raft.recovery) if self.raft.recovery else ''})")
        self.wake(0.0)
        return True

    def _watch_installs(self) -> None:
        """Tell the checker what log each snapshot from the leader lands on (``RaftNode.install``)."""
        raft = self.raft
        original = raft.install

        def install(snap, data, _raft=raft, _original=original):
            journal = _raft.journal
            last = tuple(snap.last_entry)
            held = journal.entry(last[1])
            tail = journal.entries[-1][1] - last[1] if journal.entries else 0
            self.sim.checker.installing(self, last, max(tail, 0), held)
            self.sim.note(f"node {self.node_id} installs a snapshot at {last[1]} (term {last[2]}) over its log "
                          f"{journal.entries[0][1] if journal.entries else None}.."
                          f"{journal.entries[-1][1] if journal.entries else None}"
                          + (f", holding term {held[2]} there" if held is not None and held[2] != last[2] else ""))
            return _original(snap, data)
        raft.install = install

    def _teardown(self) -> None:
        """The process is gone: its sockets close, nothing more reaches its files."""
        self.paused = False
        self.deferred = []
        service, self.service, self.proposer = self.service, None, None
        if service is not None:
            raft = getattr(service, "raft", None)
            if raft is not None:
                try:
                    raft.abandon()
                except (NodeHalted, MachineStopped):
                    pass
        elif self.sim.net.endpoints.get(self.address) is not None:
            self.sim.net.detach(self.address)
        if self.loop is not None:
            self.loop.shut()
            self.loop = None
        self.next_tick = None

    def committed_and_durable(self) -> int:
        """The highest index this node knows committed *and* holds on stable storage (by its own account:
        a node that wrongly believes a write synced is held to it).  A follower's commit index may run
        ahead of its synced log between writing an AppendEntries' entries and syncing them (it has not
        acknowledged them yet): losing those is no loss, a majority holds them."""
        raft = self.raft
        snap = raft.store.current
        durable = max(raft.journal.durable_end()[1], snap.last_index if snap else 0)
        return min(raft.commit_index, durable)

    def crash(self, why: str = "crash") -> None:
        """The process dies now (kill -9): what it wrote stays in the page cache."""
        if self.service is None:
            return
        self.sim.note(f"node {self.node_id} {why}")
        self._teardown()

    def power_loss(self, policy: LossPolicy) -> None:
        """The machine loses power: the process dies and what was not synced is lost (per ``policy``)."""
        self.crash("loses power")
        self.disk.stopped = False
        self.disk = self.disk.power_loss(policy)

    # ------------------------------------------------------------- SIGSTOP
    def pause(self) -> None:
        """SIGSTOP: the process stops where it is; its connections stay open (the kernel keeps them)."""
        if self.service is not None and not self.paused:
            self.paused = True
            self.next_tick = None
            self.sim.note(f"node {self.node_id} is paused (SIGSTOP)")

    def resume(self) -> None:
        """SIGCONT: what arrived meanwhile is handled in order, its timers fire late, it ticks."""
        if not self.paused:
            return
        self.paused = False
        self.sim.note(f"node {self.node_id} resumes (SIGCONT) with {len(self.deferred)} deferred event(s)")
        deferred, self.deferred = self.deferred, []
        for fn, args in deferred:
            self.guard(fn, *args)
        self.wake(0.0)

    # --------------------------------------------------------------- ticks
    def wake(self, after: float = 0.00005) -> None:
        """Tick soon (a message arrived, or work was queued)."""
        if self.service is None or self.paused:
            return
        at = self.sim.clock.now + after + self.slow
        if self.next_tick is None or at < self.next_tick:
            self.next_tick = at
            self.sim.schedule(at, "tick", self._tick_event, at)

    def _tick_event(self, at: float) -> None:
        if self.service is None or self.next_tick != at or self.paused:
            return  # superseded, or the node is down (or paused)
        self.next_tick = None
        self.tick()
        if self.service is not None:
            # As a node's loop waits (RaftNode.tick_wait); a simulated instant later at the least, since
            # pysyncobj sends once its clock is past the time it set.
            self.wake(max(min(self.sim.tick_period, self.raft.tick_wait()), 0.0001))

    def tick(self) -> None:
        def go():
            syncs = self.raft.journal.syncs
            for _ in range(2):  # pysyncobj, then what the proposer queued, then pysyncobj again
                self.raft.tick(0.0)
                self.loop.pump()
            if self.raft.journal.syncs != syncs and self.slow:
                self.next_tick = None  # the disk is slow: the next tick waits for it
        self.guard(go)

    def guard(self, fn, *args) -> None:
        """Run ``fn`` as this node's process would: a fail-stop or a machine stop ends the process."""
        if self.service is None:
            return
        if self.paused:
            self.deferred.append((fn, args))
            return
        try:
            fn(*args)
        except NodeHalted as e:
            self.sim.note(f"node {self.node_id} fail-stops (exit {e.code}): {e.message}")
            self._teardown()
        except MachineStopped as e:
            self.sim.note(f"node {self.node_id} machine stopped: {e}")
            self._teardown()


class Cluster(Protocol):
    """The simulation as what reads its nodes sees it (the checker, the liveness watch)."""

    clock: SimClock
    nodes: dict[int, SimulatedNode]
