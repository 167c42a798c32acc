"""Quorum nodes in the test process: the real ``Service`` and ``RaftNode`` (pysyncobj over loopback
TCP), each node ticked by an asyncio loop on a thread of its own as in a node process, each node's
files on its own ``SimDisk``.

What this adds over ``LocalCluster`` (real processes): the instant of a crash can be chosen to the
file operation (``SimDisk.stop``), a power loss can drop exactly what was not synced
(``SimDisk.power_loss``), and disk errors can be injected (``SimDisk.fail``).  The test-only hooks
live here and in ``chaos.sim``; the nodes run production code unchanged.

``SimCluster.allocate`` is a minimal proposer with the real one's rules (a barrier entry of the
leader's term first, then a block generated from the applied state, committed as one entry); a block
is *acknowledged* when its entry was applied on the leader with the record accepted.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid
from dataclasses import dataclass, field

from chaos.sim.disk import LossPolicy, MachineStopped, NodeHalted, SimDisk
from quorum.client.leader import pick_leader
from quorum.config import NodeConfig, Peer
from quorum.localcluster import free_ports
from quorum.raft import ProposalRejected, ProposalUnknown, RaftConfig
from quorum.service import Service
from records import encode_batch

DATA = "/data"

_default_excepthook = threading.excepthook


def _quiet_stops(args) -> None:
    """A node's thread ended by a simulated machine stop or fail-stop: expected, not a test error."""
    if issubclass(args.exc_type, (MachineStopped, NodeHalted)):
        return
    _default_excepthook(args)


threading.excepthook = _quiet_stops


def _quiet_loop_stops(loop, context) -> None:
    """The same on a node's loop: a stop or fail-stop inside a tick ends that node (``RaftNode.halt``)."""
    if isinstance(context.get("exception"), (MachineStopped, NodeHalted)):
        return
    loop.default_exception_handler(context)
FAST = RaftConfig(heartbeat_interval=0.02, election_timeout_min=0.15, election_timeout_max=0.3,
                  connection_timeout=0.6, reconnect_interval=0.05, peer_ping_interval=0.05,
                  leader_step_down_timeout=0.5)
# FAST's messages with timeouts a loaded CI machine does not reach: for tests that count what one leader does
# over many entries, which an election in the middle would fail (not what they test).
STEADY = RaftConfig(heartbeat_interval=0.02, election_timeout_min=1.0, election_timeout_max=2.0,
                    connection_timeout=3.0, reconnect_interval=0.05, peer_ping_interval=0.05,
                    leader_step_down_timeout=2.0)


@dataclass
class SimNode:
    node_id: int
    cfg: NodeConfig
    disk: SimDisk
    service: Service | None = None
    halted: tuple[int, str] | None = None   # (exit code, reason) of a fail-stop
    starts: int = 0
    refused: list = field(default_factory=list)
    on_start: object = None  # called with the node after every start (the cluster re-applies its cuts)
    loop: asyncio.AbstractEventLoop | None = None  # this node's loop (its "process"), ticking Raft
    loop_thread: threading.Thread | None = None

    def _failstop(self, code: int, message: str):
        if self.halted is None:
            self.halted = (code, message)
        raise NodeHalted(code, message)

    def start(self, **raft_options) -> None:
        """Start (again) on ``self.disk``; ``raft_options`` go to ``RaftNode`` (e.g. trust_own_log)."""
        self.halted = None
        self.disk.failstop = self._failstop
        self.starts += 1
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_quiet_loop_stops)
        self.loop_thread = threading.Thread(target=self.loop.run_forever, name=f"node-{self.node_id}", daemon=True)
        self.loop_thread.start()
        try:
            self.service = self.on_loop(lambda: Service(self.cfg, disk=self.disk, failstop=self._failstop,
                                                        loop=self.loop, **raft_options))
        except BaseException:
            self._end_loop()
            raise
        if self.on_start is not None:
            self.on_start(self)

    def on_loop(self, fn, timeout: float = 10.0):
        """``fn()`` on this node's loop thread (where its Raft ticks); its result, or its exception."""
        done: concurrent.futures.Future = concurrent.futures.Future()

        def run():
            try:
                done.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                done.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return done.result(timeout)

    def _end_loop(self) -> None:
        loop, thread, self.loop, self.loop_thread = self.loop, self.loop_thread, None, None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()

    @property
    def raft(self):
        return self.service.raft

    @property
    def running(self) -> bool:
        return (self.service is not None and self.loop_thread is not None and self.loop_thread.is_alive()
                and not self.raft._stopping and not self.disk.stopped and self.halted is None)

    def crash(self) -> None:
        """The process dies here: no tick after the current one, no file written, sockets closed."""
        if self.service is None:
            return
        raft = self.raft

        def die():
            raft.halt()
            self.disk.stopped = True  # nothing more reaches the files
            try:
                raft._obj.transport.destroy()
            except (MachineStopped, NodeHalted):
                pass

        self.on_loop(die)
        self._end_loop()
        self.service = None

    def stop(self) -> None:
        """A clean stop (SIGTERM): ticks end, the journal is synced, files closed."""
        if self.service is None:
            return
        self.on_loop(self.service.close)
        self._end_loop()
        self.service = None

    def restart(self, disk: SimDisk, **raft_options) -> None:
        self.crash()
        self.disk = disk
        self.start(**raft_options)

    def power_loss(self, policy: LossPolicy | None = None, **raft_options) -> None:
        """The machine loses power: what was not synced is gone (per ``policy``); start again."""
        self.crash()
        was = self.disk
        was.stopped = False
        image = was.power_loss(policy)
        self.disk = image
        self.start(**raft_options)

    # ------------------------------------------------------------ reading
    def next_producer_id(self) -> int:
        with self.service.lock:
            return self.service.state.producer_ids.next_producer_id

    def status(self) -> dict:
        return self.raft.status()


class SimCluster:
    def __init__(self, size: int = 3, raft: RaftConfig = FAST, block_size: int = 1000, start: bool = True,
                 **node_options):
        ports = free_ports(2 * size)
        addresses = [(f"127.0.0.1:{ports[2 * i]}", f"127.0.0.1:{ports[2 * i + 1]}") for i in range(size)]
        self.secret = "sim-secret-" + uuid.uuid4().hex
        cluster_id = "c-" + uuid.uuid4().hex
        self.nodes: dict[int, SimNode] = {}
        for i, (r, c) in enumerate(addresses):
            peers = [Peer(j + 1, rr, cc) for j, (rr, cc) in enumerate(addresses) if j != i]
            cfg = NodeConfig(node_id=i + 1, data_dir=DATA, raft_address=r, client_address=c, secret=self.secret,
                             peers=peers, block_size=block_size, raft=raft, cluster_id=cluster_id, **node_options)
            self.nodes[i + 1] = SimNode(i + 1, cfg, SimDisk(), on_start=self._filter_sends)
        self.acknowledged: list[tuple[int, int]] = []
        self._cuts: set[frozenset] = set()
        if start:
            for n in self.nodes.values():
                n.start()

    def newcomer(self, raft_port: int | None = None, cluster_id: str | None = None) -> SimNode:
        """A new node, not started and in no member's configuration yet, whose peers are the members (add
        it with the leader's ``raft.add_member`` once started); ``raft_port`` by default a free one."""
        node_id = max(self.nodes) + 1
        raft, (client,) = raft_port or free_ports(1)[0], free_ports(1)
        one = self.nodes[min(self.nodes)].cfg
        peers = [Peer(n.node_id, n.cfg.raft_address, n.cfg.client_address) for n in self.nodes.values()]
        cfg = NodeConfig(node_id=node_id, data_dir=DATA, raft_address=f"127.0.0.1:{raft}",
                         client_address=f"127.0.0.1:{client}", secret=one.secret, peers=peers,
                         block_size=one.block_size, raft=one.raft, cluster_id=cluster_id or one.cluster_id)
        self.nodes[node_id] = SimNode(node_id, cfg, SimDisk(), on_start=self._filter_sends)
        return self.nodes[node_id]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for n in self.nodes.values():
            try:
                n.crash()
            except BaseException:  # noqa: BLE001 - tearing down whatever state it is in
                pass

    def running(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.running]

    def leader(self, timeout: float = 15.0, among: list[int] | None = None) -> SimNode:
        """The running node (of ``among``) that leads, by ``quorum.client.leader.pick_leader`` over the nodes' roles."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            answers = {}
            for n in self.running():
                if among is None or n.node_id in among:
                    is_leader, leader, term = n.raft.role()
                    answers[n.node_id] = {"raft": {"self": n.raft.self_addr, "leader": leader, "term": term,
                                                   "state": "leader" if is_leader else "follower"}}
            node_id = pick_leader(answers)
            if node_id is not None:
                return self.nodes[node_id]
            time.sleep(0.01)
        raise TimeoutError(f"no leader within {timeout}s among {[n.node_id for n in self.running()]}")

    def wait(self, condition, timeout: float = 15.0, what: str = "a condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = condition()
            if got:
                return got
            time.sleep(0.01)
        raise TimeoutError(f"{what} not within {timeout}s")

    # ------------------------------------------------------------ network
    def cut(self, a: int, b: int) -> None:
        """Drop every Raft message between nodes ``a`` and ``b`` (both ways; the TCP link stays up)."""
        self._cuts.add(frozenset((a, b)))

    def heal(self) -> None:
        self._cuts.clear()

    def _filter_sends(self, node: SimNode) -> None:
        transport = node.raft._transport
        if getattr(transport, "_sim_filtered", False):
            return
        addresses = {n.cfg.raft_address: n.node_id for n in self.nodes.values()}
        original = transport.send
        cluster = self

        def send(peer, message):
            if frozenset((node.node_id, addresses.get(peer.address))) in cluster._cuts:
                return False
            return original(peer, message)

        transport.send = send
        transport.send_unsynced = lambda peer, message: (
            False if frozenset((node.node_id, addresses.get(peer.address))) in cluster._cuts
            else type(transport).send_unsynced(transport, peer, message))
        transport._sim_filtered = True

    # ------------------------------------------------------------ proposing
    def _propose(self, node: SimNode, records: list, timeout: float):
        done = threading.Event()
        out: list = []

        def callback(result, error):
            out.append((result, error))
            done.set()

        node.raft.propose(encode_batch(records), callback)
        if not done.wait(timeout):
            raise ProposalUnknown(f"no answer within {timeout}s")
        result, error = out[0]
        if error is not None:
            raise error
        return result

    def _with_leader(self, generate, timeout: float, among: list[int] | None):
        """Barrier, generate from the applied state, propose; retry afresh on any failure."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                leader = self.leader(max(0.1, deadline - time.monotonic()), among)
                self._propose(leader, [], 2.0)  # every earlier entry is applied here after this
                with leader.service.lock:
                    result = generate(leader.service.state, int(time.time() * 1000))
                outcome = self._propose(leader, result.records, 2.0)
                if outcome and any(e is not None for e in outcome):
                    raise ProposalRejected(f"replay refused: {outcome}")
                return result.response
            except (ProposalRejected, ProposalUnknown, TimeoutError, AttributeError) as e:
                last = e
                time.sleep(0.02)
        raise TimeoutError(f"not committed within {timeout}s: {last}")

    def register(self, broker_id: int, timeout: float = 20.0, among: list[int] | None = None) -> int:
        incarnation = uuid.uuid4().hex
        return self._with_leader(lambda state, now: state.registrations.generate_register(
            broker_id, incarnation, "127.0.0.1:1", now), timeout, among)

    def allocate(self, broker_id: int, epoch: int, timeout: float = 20.0,
                 among: list[int] | None = None) -> tuple[int, int]:
        block = self._with_leader(lambda state, now: state.producer_ids.generate_allocate(
            broker_id, epoch, state.registrations, self.nodes[1].cfg.block_size, now), timeout, among)
        self.acknowledged.append(block)
        return block

    def assert_no_block_reissued(self, blocks: list[tuple[int, int]] | None = None) -> None:
        ranges = sorted((s, s + n) for s, n in (blocks if blocks is not None else self.acknowledged))
        for (s1, e1), (s2, e2) in zip(ranges, ranges[1:]):
            assert s2 >= e1, f"blocks overlap: [{s1},{e1}) and [{s2},{e2})"


def stop_at(predicate):
    """A ``SimDisk.stop`` hook: stop the machine at the first operation for which
    ``predicate(op, when)`` holds (``when`` is "before" or "after")."""
    fired = []

    def hook(op, when):
        if not fired and predicate(op, when):
            fired.append((op, when))
            return True
        return False

    hook.fired = fired
    return hook
