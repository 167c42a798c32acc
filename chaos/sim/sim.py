"""Deterministic simulation of a whole quorum: the real code, a simulated world, one seed.

``Simulation(SimConfig(seed=...)).run()`` runs three (or five) quorum nodes in this
process: the production ``Service`` (pysyncobj's SyncObj with pidquorum's adapter,
journal, snapshot store, identity gate, state machine) and ``Proposer`` on each,
with the network (``net``), the disks (``disk``) and the clock (``clock``)
simulated.  One ``random.Random(seed)`` drives everything: the order of events,
message delays and faults, disk crash states, pysyncobj's election jitter, the
workload and the identities, so a seed replays the same run bit for bit
(``SimResult.digest``).

The workload: brokers that register, allocate blocks, re-register, start and bump
transactional ids, and a ZooKeeper migration seed.  The faults, mixed by the seed
(``FaultPlan``): message drop, delay, reorder and duplication; symmetric and
one-way partitions; process crashes between events and in the middle of a file
operation; power loss of one node, a minority or all (unsynced data and renames
lost, the last write torn); fsync and write errors and a full disk; slow disks;
restarts from an older copy of a data directory; membership changes and
leadership transfers; snapshots under load.

After every step ``checker.Checker.step`` checks Raft's safety properties and that
no node's durable state lost a committed entry; every acknowledged answer is
checked as it arrives (no producer ID issued twice); at the end the faults stop,
the cluster converges and every acknowledged block must be in the final state.  A
failure carries the seed, the step and the last events.
"""
from __future__ import annotations

import errno
import hashlib
import heapq
import random
import time
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from client import api as p
from quorum.config import NodeConfig, Peer
from quorum.raft import RaftConfig
from quorum.rpcs import RPCS
from records import encode_batch
from storage.disk import EXIT_STORAGE

from .checker import Checker, Violation
from .clock import SimClock, patched
from .disk import SYNCS, LossPolicy, MachineStopped, NodeHalted, SimDisk
from .liveness import COMMIT_BOUND, LEADER_BOUND, Watch, majority_leader
from .net import NetFaults, SimNetwork
from .node import SimulatedNode
from .workload import Workload, _Broker, _ManagedBroker, _Op

DATA = "/data"
LEGIT_HALTS = {EXIT_STORAGE}  # a fail-stop the simulation caused on purpose (an injected disk error)


@dataclass
class FaultPlan:
    """How often each fault happens (per simulated second), drawn per seed by ``FaultPlan.draw``."""

    net: NetFaults = field(default_factory=NetFaults)
    crash: float = 0.0
    crash_in_io: float = 0.0
    power_loss: float = 0.0
    partition: float = 0.0
    disk_error: float = 0.0
    disk_full: float = 0.0
    slow_disk: float = 0.0
    restore_backup: float = 0.0
    bad_answer: float = 0.0
    membership: float = 0.0
    transfer: float = 0.0
    snapshot: float = 0.0

    @classmethod
    def draw(cls, rng: random.Random) -> "FaultPlan":
        def rate(p_on: float, hi: float) -> float:
            return rng.uniform(0.05, hi) if rng.random() < p_on else 0.0
        net = NetFaults(drop=rate(0.5, 0.05), duplicate=rate(0.4, 0.05), reorder=rate(0.4, 0.1),
                        long_delay=rate(0.4, 0.02), long_delay_max=rng.choice([0.3, 1.0, 2.5]))
        return cls(net=net, crash=rate(0.6, 0.4), crash_in_io=rate(0.5, 0.4), power_loss=rate(0.5, 0.3),
                   partition=rate(0.5, 0.4), disk_error=rate(0.4, 0.2), disk_full=rate(0.3, 0.15),
                   slow_disk=rate(0.3, 0.3), restore_backup=rate(0.4, 0.4), bad_answer=rate(0.4, 0.3),
                   membership=rate(0.3, 0.15),
                   transfer=rate(0.4, 0.3), snapshot=rate(0.8, 1.0))

    def describe(self) -> dict:
        out = {k: round(v, 3) for k, v in vars(self).items() if k != "net" and v}
        out.update({f"net_{k}": (round(v, 3) if isinstance(v, float) else v) for k, v in vars(self.net).items()
                    if v and k not in ("delay",)})
        return out


@dataclass
class SimConfig:
    seed: int
    steps: int = 6000
    nodes: int = 3
    brokers: int = 3
    managed_brokers: int = 2  # brokers running the real ProducerIdManager (broker side)
    faults: bool = True
    block_size: int = 1000
    compaction_min_entries: int | None = None  # default: drawn by the seed
    workload: str = "pids"  # or "transactions": brokers running the real TxnCoordinator (chaos.sim.txn)


@dataclass
class SimResult:
    seed: int
    ok: bool
    steps: int
    sim_seconds: float
    wall_seconds: float
    violation: str | None = None
    failed_step: int | None = None
    trace: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    digest: str = ""

    def replay_command(self, steps: int, nodes: int, workload: str = "pids") -> str:
        return (f"pidctl chaos simulate --seeds {self.seed} --steps {steps} --nodes {nodes}"
                + (f" --workload {workload}" if workload != "pids" else "") + " --trace")


class Simulation(Workload):
    def __init__(self, config: SimConfig):
        self.config = config
        self.rng = random.Random(config.seed)
        self.clock = SimClock()
        self.raft_rng = random.Random(self.rng.getrandbits(64))
        self._events: list = []
        self._seq = 0
        self.trace: deque[str] = deque(maxlen=80)
        self._digest = hashlib.sha256()
        self.tick_period = 0.05
        self.step_no = 0
        self.stats: dict[str, int] = {"faults": 0, "ops": 0, "acked": 0, "unknown": 0, "refused": 0,
                                      "restarts": 0, "crash_states": 0, "trust_own_log_restarts": 0}
        self.faults_seen: dict[str, int] = {}
        self.plan = FaultPlan.draw(self.rng) if config.faults else FaultPlan()
        compaction = self.rng.choice([8, 20, 60, 5000])
        raft = RaftConfig(compaction_min_entries=config.compaction_min_entries or compaction,
                          compaction_min_time=self.rng.choice([2.0, 30.0, 300.0]),
                          # Snapshots here are a few kilobytes: small chunks make installs take several
                          # messages, with the follower's old log still in place between them.  (A stream of
                          # its own, so the draws above and the fault schedule stay as they were.)
                          snapshot_chunk_bytes=random.Random(f"{config.seed}-chunks").choice([65536, 1024, 256]),
                          # Likewise the AppendEntries batch limit: at 2 KiB or 512 bytes a follower that lags is
                          # caught up by several messages, each carrying the leader's commit index beyond its
                          # last entry, and a record larger than the limit travels in pieces.
                          append_entries_batch_bytes=random.Random(f"{config.seed}-batches").choice(
                              [65536, 2048, 512]))
        self.raft_config = raft
        # Records of a few KiB in some requests (long transactional ids and broker listeners), from a stream of
        # its own: which requests are large moves no other draw.
        self.records_rng = random.Random(f"{config.seed}-records")
        # Each stays under the batch limit: an entry larger than it travels in pieces, a path that fails today
        # (pysyncobj marks the last piece by the command's length, not the pickled entry's).
        self.large_record_chars = min(self.records_rng.choice([0, 0, 1500, 5000]),
                                      max(raft.append_entries_batch_bytes - 512, 0) // 3)
        # A share of restarts of a node on its own data directory are started with --trust-own-log.
        self.trust_rng = random.Random(f"{config.seed}-trust")
        self.trust_share = self.trust_rng.choice([0.0, 0.3, 0.6])
        # Whether the last fault is ``_deposed_tail_behind_commit``, and its every choice: a stream of its own,
        # so that no other draw moves (the shape's steps draw from ``rng`` as every step does).
        self.tail_rng = random.Random(f"{config.seed}-deposed-tail")
        self.checker = Checker(self)
        self.liveness = Watch(self)
        self.net = SimNetwork(self, self.plan.net, raft.connection_timeout, raft.reconnect_interval)
        reserve = self.rng.choice([0, 0, 8])
        addresses = [f"10.0.0.{i + 1}:9093" for i in range(config.nodes)]
        clients = [f"10.0.0.{i + 1}:9092" for i in range(config.nodes)]
        self.nodes: dict[int, SimulatedNode] = {}
        for i in range(config.nodes):
            peers = [Peer(j + 1, addresses[j], clients[j]) for j in range(config.nodes) if j != i]
            cfg = NodeConfig(node_id=i + 1, data_dir=DATA, raft_address=addresses[i], client_address=clients[i],
                             secret="simulated", peers=peers, block_size=config.block_size, raft=raft,
                             cluster_id="c-simulated", allocate_reserve_blocks=reserve)
            self.nodes[i + 1] = SimulatedNode(self, i + 1, cfg, SimDisk())
        self.backups: dict[int, tuple[float, SimDisk]] = {}
        self.backups_before_change: dict[int, tuple[float, SimDisk]] = {}  # taken before the last membership change
        self.acked_blocks: list[tuple[int, int, int]] = []
        self.brokers = [_Broker(self, 1 + b) for b in range(config.brokers)]
        self.managed: list[_ManagedBroker] = []
        self.expected_loss: set[int] = set()  # nodes restored from a backup (may lack what they acknowledged)
        self._replacing = False
        self._restored: tuple[SimulatedNode, float | None] | None = None
        self._staged: str | None = None  # a fault played out in several steps (no random loss meanwhile)
        self.script: Callable[["Simulation"], None] | None = None  # extra scripted events (crash-state exploration)
        # Called with the outcome when ``run`` ends (a crash-state exploration child reports it and exits).
        self.on_end: Callable[[SimResult], None] | None = None

    # ------------------------------------------------------------ plumbing
    def new_id(self) -> str:
        return "%032x" % self.rng.getrandbits(128)

    def schedule(self, at: float, kind: str, fn: Callable, *args) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, fn, args))

    def after(self, delay: float, kind: str, fn: Callable, *args) -> None:
        self.schedule(self.clock.now + delay, kind, fn, *args)

    def note(self, message: str) -> None:
        line = f"{self.clock.now:9.4f}s #{self.step_no} {message}"
        self.trace.append(line)
        self._digest.update(line.encode())

    def fault(self, name: str) -> None:
        self.stats["faults"] += 1
        self.faults_seen[name] = self.faults_seen.get(name, 0) + 1

    def running(self) -> list[SimulatedNode]:
        return [n for n in self.nodes.values() if n.running]

    def node_at(self, address: str) -> SimulatedNode | None:
        for n in self.nodes.values():
            if n.address == address:
                return n
        return None

    def padding(self, share: float = 0.5) -> str:
        """A few KiB of text for a request's free-form field (a listener's host, a transactional id) in
        seeds that send large records, for ``share`` of the requests asked."""
        if not self.large_record_chars or self.records_rng.random() >= share:
            return ""
        return "-" + "x" * self.records_rng.randint(self.large_record_chars // 2, self.large_record_chars)

    def leader(self) -> SimulatedNode | None:
        for n in self.running():
            if n.raft.is_leader:
                return n
        return None

    # ------------------------------------------------------------------ run
    def run(self) -> SimResult:
        t0 = time.perf_counter()
        with patched(self.clock, self.raft_rng):
            try:
                self._run()
                outcome = self._result(True, None, t0)
            except Violation as v:
                outcome = self._result(False, str(v), t0)
            except Exception as e:  # noqa: BLE001 - the real code raised where no process would survive it
                where = traceback.extract_tb(e.__traceback__)[-4:]
                for frame in where:
                    self.note(f"  at {'/'.join(frame.filename.rsplit('/', 2)[-2:])}:{frame.lineno} {frame.name}")
                outcome = self._result(False, f"unexpected exception: {type(e).__name__}: {e}", t0)
            finally:
                for n in self.nodes.values():
                    try:
                        n.crash("stops (end of simulation)")
                    except (NodeHalted, MachineStopped):
                        pass
                for b in self.managed:
                    b.close()
        if self.on_end is not None:
            self.on_end(outcome)
        return outcome

    def _result(self, ok: bool, violation: str | None, t0: float) -> SimResult:
        for index in sorted(self.checker.ledger):  # the committed log itself, entry by entry
            term, crc = self.checker.ledger[index]
            self._digest.update(f"{index}:{term}:{crc};".encode())
        stats = dict(self.stats, traffic=self._traffic(), messages=self.net.sent, delivered=self.net.delivered, dropped=self.net.dropped,
                     checks=self.checker.checks, committed=len(self.checker.ledger),
                     faults_by_kind=dict(sorted(self.faults_seen.items())), plan=self.plan.describe(),
                     liveness=self.liveness.figures())
        return SimResult(self.config.seed, ok, self.step_no, self.clock.now, time.perf_counter() - t0, violation,
                         None if ok else self.step_no, list(self.trace), stats, self._digest.hexdigest()[:16])

    def _traffic(self) -> dict:
        """What the seed's traffic reached: split AppendEntries, commit indexes beyond a message's entries,
        installs on a conflicting log (``SimNetwork.figures``, ``Checker.figures``)."""
        return dict(self.net.figures(), **self.checker.figures(), batch_bytes=self.raft_config.append_entries_batch_bytes,
                    large_records=self.large_record_chars)

    def _run(self) -> None:
        for n in self.nodes.values():
            n.start()
        self.after(0.0, "net", self._maintain_net)
        for b in self.brokers:
            self.after(self.rng.uniform(0.3, 1.0), "client", b.act)
        if self.config.faults:
            self.after(self.rng.uniform(0.5, 1.5), "fault", self._inject)
        self._start_workload()
        while self.step_no < self.config.steps and self._events:
            self._step()
        self._converge()

    def _step(self) -> None:
        at, _, kind, fn, args = heapq.heappop(self._events)
        if at > self.clock.now:
            self.clock.now = at
        self.step_no += 1
        fn(*args)
        self._notice_halts()
        self.checker.step()
        self.liveness.after(kind, fn)

    def _maintain_net(self) -> None:
        self.net.maintain()
        self.after(self.raft_config.reconnect_interval, "net", self._maintain_net)

    # ------------------------------------------------------------- the end
    def _converge(self) -> None:
        """Stop the faults, heal everything, start every member; within the liveness bounds
        (``chaos/sim/liveness.py``) a leader that a majority follows, and a client request committed; then the
        cluster must agree and hold every acknowledged block."""
        self.note("converging: faults stop, partitions heal, every member starts")
        self.liveness.faults_stop()
        self.net.blocked.clear()
        self.net.faults = NetFaults()
        self._events = [e for e in self._events if e[2] in ("deliver", "tick", "net", "membership", "broker")]
        for b in self.managed:
            b.bad_answer = False
        heapq.heapify(self._events)
        for n in self.nodes.values():
            n.disk.fail = None
            n.disk.capacity = None
            n.disk.stop = None
            n.slow = 0.0
            if not n.running and not n.removed:
                self._start(n)
        healed = self.clock.now
        if self.config.faults and self.rng.random() < self.HELD_ABOVE_CANDIDATE and \
                self._candidate_below_held_back(healed):
            healed = self.clock.now
        elif self.config.faults and self.tail_rng.random() < self.DEPOSED_TAIL and \
                self._deposed_tail_behind_commit(healed):
            healed = self.clock.now
        self._probe(healed)
        deadline = self.clock.now + 60.0
        quiet_since = None
        converged = False
        while self._events and self.clock.now < deadline:
            self._step()
            self._judge_liveness(healed)
            members = [n for n in self.nodes.values() if not n.removed]
            if any(not n.running for n in members):
                for n in members:
                    if not n.running and n.halted is None:
                        self._start(n)
                continue
            leader = self.leader()
            if leader is None:
                continue
            last = leader.raft.journal.entries[-1][1]
            if self.liveness.commit_after_heal is not None and all(
                    n.raft.last_applied == last and not n.raft.restricted for n in members):
                quiet_since = quiet_since or self.clock.now
                if self.clock.now - quiet_since > 0.5:
                    converged = True
                    break
            else:
                quiet_since = None
        members = [n for n in self.nodes.values() if not n.removed]
        if not all(n.running for n in members) or self.leader() is None:
            raise Violation("liveness: after the faults stopped, the cluster did not come back within 60 simulated "
                            "seconds: " + "; ".join(self._describe(n) for n in members))
        if not converged:
            raise Violation("liveness: after the faults stopped, the members did not converge within 60 simulated "
                            "seconds: " + "; ".join(self._describe(n) for n in members))
        states = {}
        for n in members:
            with n.service.lock:
                states[n.node_id] = n.service.state.producer_ids.next_producer_id
        self.checker.final(states, self.acked_blocks)

    HELD_ABOVE_CANDIDATE = 0.2  # of the seeds with faults end with ``_candidate_below_held_back``

    def _candidate_below_held_back(self, healed: float) -> bool:
        """The last fault, in the shape in which the only node that may lead is below the term of both
        others (seeds 302145 and 102068 reached one like it by chance).  The leader C is cut off with an
        entry the others lack.  The first of the others to win an election, H, loses power at once: its
        no-op, unsynced and unsent, is gone, its term is not.  H restarts held back (without C's word), so
        the third, X, in H's term, wins no pre-vote.  Then the cut heals: H waits to reach C's entry (its
        recovery target), X's log lacks it, so C alone may lead, and its pre-votes and votes in its own term
        are denied until it takes the term the denials carry (``_on_pre_vote_response``, ``_stale_term``).
        Three members only.  It waits for a settled leader, judged from ``healed`` meanwhile; False if none
        came within the leader bound (the heal is then the one before)."""
        members = [n for n in self.nodes.values() if not n.removed]
        if len(members) != 3 or self._replacing:
            return False

        old = self._settled_leader(healed, members)
        if old is None:
            return False
        self.liveness.leader_after_heal = None  # the heal that counts is this fault's
        others = [n for n in members if n is not old]
        self.fault("partition_leader_below_held_back")
        cut = {(old.address, n.address) for n in others}
        cut |= {(b, a) for a, b in cut}
        self.net.blocked |= cut
        self.note(f"last fault: the leader, node {old.node_id}, is cut off with an entry the others lack")
        broker = self.PROBE_BROKER + 1
        request = p.registration_request(broker, uuid.UUID(self.new_id()), f"broker-{broker}:9092")
        task = old.loop.create_task(old.proposer.submit(RPCS.of_request(request), request, 1.0))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # outcome unknown to any client
        old.wake(0.0)
        until = self.clock.now + LEADER_BOUND
        new = None
        while self._events and self.clock.now < until and new is None:
            self._step()
            new = next((n for n in others if n.running and n.raft.is_leader), None)
        if new is not None:
            new._committed_before = new.committed_and_durable()
            new.power_loss(LossPolicy("none"))
            self.note(f"node {new.node_id} loses power as it wins the election (its no-op unsynced, unsent)")
            self.after(self.rng.uniform(0.05, 0.3), "restart", self._restart, new)
            until = self.clock.now + self.rng.uniform(1.0, 3.0)
            while self._events and self.clock.now < until:
                self._step()
        self.net.blocked -= cut
        for n in members:
            if not n.running:
                self._start(n)
        self.note("partition healed; every member runs: " + "; ".join(self._describe(n) for n in members))
        return True

    def _quiet_leader(self, members: list[SimulatedNode]) -> SimulatedNode | None:
        """A leader a majority follows, with all it holds committed and applied and nothing queued (so an
        entry proposed now, or its barrier, is appended at once), and no member held back."""
        leader = majority_leader(self)
        if leader is None or any(not n.running or n.raft.restricted for n in members):
            return None
        raft = leader.raft
        if not (raft.last_applied == raft.commit_index == raft.journal.entries[-1][1]
                and leader.proposer.queue.empty()):
            return None
        return leader

    def _settled_leader(self, healed: float, members: list[SimulatedNode]) -> SimulatedNode | None:
        """Steps until there is a settled leader (``_quiet_leader``), judged from ``healed`` meanwhile; None if none
        came within the leader bound."""
        while self._events and self._quiet_leader(members) is None:
            self._step()
            self._judge_liveness(healed)
            if self.clock.now - healed > LEADER_BOUND:
                return None
        return self._quiet_leader(members)

    def _steps_until(self, until: float, done: Callable[[], bool] = lambda: False) -> None:
        while self._events and self.clock.now < until and not done():
            self._step()

    DEPOSED_TAIL = 0.3  # of the seeds with faults not ending with the shape above end with the one below

    def _deposed_tail_behind_commit(self, healed: float) -> bool:
        """The last fault, in the shape in which a follower's commit index lags entries it holds that are
        committed, and after them it holds a deposed leader's tail that no majority holds: the follower, F,
        must commit only up to the last entry an AppendEntries verified (Raft, figure 2), not to its log's end.

        The leader L writes quickly (a pipelining writer, as ``_to_cut_off_leader``).  Its followers' answers
        stop reaching it: the entries it sends now reach both followers but are never acknowledged, so its
        commit index (and the one it sends) stays where it was.  Then it stops reaching the third node N: what
        it writes now reaches F only.  All of that within the step-down timeout (check-quorum).  F is cut off
        and L loses power (its machine stops before its next sync if one comes first, such as the one-second
        timer's meta write: what it sent F alone is never durable on L) and restarts (``--trust-own-log``: the
        directory is its own; it needs no word from F); L or N leads in a new term, and commits the entries
        both followers received (they hold them) and its own after them, where F holds L's tail.  Then F's cut
        heals: the leader walks F back to after its commit index and sends from there in batches, the first of
        which ends before F's tail (when more entries than a batch holds were sent unacknowledged, and the
        leader did not compact past F's commit index: a snapshot goes instead) and carries a commit index beyond
        it.  Three members only; False if no settled leader came within the leader bound or none led after L
        lost power."""
        members = [n for n in self.nodes.values() if not n.removed]
        if len(members) != 3 or self._replacing:
            return False
        old = self._settled_leader(healed, members)
        if old is None:
            return False
        rng = self.tail_rng
        self.liveness.leader_after_heal = None  # the heal that counts is this fault's
        follower, third = rng.sample([n for n in members if n is not old], 2)
        self.fault("partition_deposed_tail_behind_commit")
        # More entries unacknowledged than a batch holds (a 2 KiB batch holds about 80 empty ones: 1.5 to 3 times
        # that; a 64 KiB one holds them all, and a few dozen do), all within the step-down timeout (1 s).
        together, unacknowledged, one_only = rng.uniform(0.05, 0.3), rng.uniform(0.3, 0.6), rng.uniform(0.05, 0.2)
        batch = self.raft_config.append_entries_batch_bytes
        entries = batch // 25 * rng.uniform(1.5, 3.0) if batch <= 2048 else rng.uniform(30, 80)
        self._write_while_leading(old, self.clock.now + together + unacknowledged + one_only,
                                  unacknowledged / entries)
        self.note(f"last fault: the leader, node {old.node_id}, writes quickly")
        self._steps_until(self.clock.now + together)
        deaf = {(third.address, old.address), (follower.address, old.address)}
        self.net.blocked |= deaf
        self.note(f"node {old.node_id} hears neither follower: {sorted(deaf)}")
        self._steps_until(self.clock.now + unacknowledged)
        self.net.blocked.add((old.address, third.address))
        both = third.raft.journal.entries[-1][1] if third.running and third.raft.journal.entries else None
        self.note(f"node {old.node_id} reaches node {follower.node_id} only (node {third.node_id} holds up to {both})")
        # Its next sync (the one-second timer's meta write collects one) would make what it sent F alone
        # durable: the machine stops before it, if it comes first.
        old._committed_before = old.committed_and_durable()  # its commit index moves no more (nobody answers)
        old.disk.stop = lambda op, when: when == "before" and op.kind in SYNCS
        self._steps_until(self.clock.now + one_only, lambda: old.disk.stopped or not old.running)
        old.disk.stop = None
        alone = {(follower.address, n.address) for n in members if n is not follower}
        alone |= {(b, a) for a, b in alone}
        self.net.blocked -= deaf | {(old.address, third.address)}
        self.net.blocked |= alone
        if follower.running:
            journal = follower.raft.journal
            self.note(f"node {follower.node_id} is cut off holding {journal.entries[0][1]}..{journal.entries[-1][1]}"
                      f", commit index {follower.raft.commit_index}")
        if old.running or old.disk.stopped:
            old.power_loss(LossPolicy("none"))
            self.note(f"node {old.node_id} loses power (what it did not sync is gone)")
        self._steps_until(self.clock.now + rng.uniform(0.05, 0.3))
        if not old.running and not old.removed:
            self._start(old, trust_own_log=True)
        self._steps_until(self.clock.now + LEADER_BOUND, lambda: majority_leader(self) is not None)
        new = majority_leader(self)
        if new is not None:
            # It writes on for a while: the commit index it sends F is then past the start of F's tail.
            self._write_while_leading(new, self.clock.now + rng.uniform(0.05, 0.2), rng.uniform(0.005, 0.01))
            self._steps_until(self.clock.now + rng.uniform(0.2, 0.4))
        self.net.blocked -= alone
        for n in members:
            if not n.running and not n.removed:
                self._start(n)
        self.note(f"node {follower.node_id}'s cut healed; every member runs: "
                  + "; ".join(self._describe(n) for n in members))
        return new is not None

    def _write_while_leading(self, node: SimulatedNode, until: float, every: float) -> None:
        """A writer of the node's own: an empty batch proposed every ``every`` seconds until ``until``, while it
        believes it leads (``_to_cut_off_leader``'s)."""
        if self.clock.now >= until or not node.running or not node.raft.is_leader:
            return
        node.guard(node.raft.propose, encode_batch([]), lambda result, error: None)
        node.wake(0.0)
        self.after(every, "client", self._write_while_leading, node, until, every)

    PROBE_BROKER = 900  # the broker id of the request sent after the last heal (no workload broker has it)

    def _probe(self, healed: float) -> None:
        """One client request after the last heal: a broker registration sent as the workload sends its
        requests (to a node, retried elsewhere on NOT_CONTROLLER), sent again after an unknown outcome,
        until one is answered; the answer's time is the seed's time to commit."""
        watch = self.liveness
        if watch.commit_after_heal is not None:
            return

        def ok(_epoch) -> None:
            watch.commit_after_heal = round(self.clock.now - healed, 4)

        def done() -> None:
            if watch.commit_after_heal is None:
                self.after(0.05, "client", self._probe, healed)
        broker = self.PROBE_BROKER
        _Op(self, p.registration_request(broker, uuid.UUID(self.new_id()), f"broker-{broker}:9092"),
            f"broker {broker} registers (after the last heal)", on_ok=ok, on_done=done, deadline=COMMIT_BOUND)

    def _judge_liveness(self, healed: float) -> None:
        """The bounds after the last heal (``chaos.sim.liveness``): a miss is the seed's failure."""
        watch, since = self.liveness, self.clock.now - healed
        if watch.leader_after_heal is None:
            if majority_leader(self) is not None:
                watch.leader_after_heal = round(since, 4)
                self.note(f"a leader that a majority follows, {since:.3f}s after the last heal")
            if since > LEADER_BOUND:  # (a leader first seen at the event past the bound is late too)
                raise Violation(f"liveness: no leader that a majority follows {LEADER_BOUND:g} simulated seconds "
                                f"after the last fault healed (the leader bound): "
                                + "; ".join(self._describe(n) for n in self.nodes.values() if not n.removed))
        if since > COMMIT_BOUND and (watch.commit_after_heal is None or watch.commit_after_heal > COMMIT_BOUND):
            raise Violation(f"liveness: no client request committed {COMMIT_BOUND:g} simulated seconds after the "
                            f"last fault healed (the commit bound; a leader after "
                            f"{'none' if watch.leader_after_heal is None else f'{watch.leader_after_heal:.3f}s'}): "
                            + "; ".join(self._describe(n) for n in self.nodes.values() if not n.removed))

    @staticmethod
    def _describe(n: SimulatedNode) -> str:
        """One member's state, for a liveness failure: role, log, applied, what holds it back, its membership."""
        if not n.running:
            return f"node {n.node_id}: down ({n.refused or n.halted})"
        st = n.raft.status()
        held = (st["recovering"] or {}).get("reason")
        return (f"node {n.node_id}: {st['state']} term {st['term']} log {list(n.raft.journal.durable_end())} applied "
                f"{st['last_applied']}" + (f", held back: {held}" if held else "")
                + f", members {[m.rsplit(':', 1)[0] for m in st['members']]}")

    # --------------------------------------------------------------- faults
    def _start(self, node: SimulatedNode, trust_own_log: bool | None = None) -> bool:
        """Start ``node``; with ``--trust-own-log`` when ``trust_own_log`` says so, else for a share of restarts."""
        self.stats["restarts"] += 1
        before = getattr(node, "_committed_before", None)
        # --trust-own-log is the operator's word that the data directory is the one the node last ran on: true
        # of every restart here but those of a restored copy (a power loss keeps what was synced).
        if trust_own_log is None:
            trust_own_log = (node.starts > 0 and node.node_id not in self.expected_loss
                             and self.trust_rng.random() < self.trust_share)
        node.trust_own_log = trust_own_log
        if node.trust_own_log:
            self.stats["trust_own_log_restarts"] += 1
        ok = node.start()
        if not ok:
            if node.cut:  # a crash-state exploration cut this start short; its restart is scheduled
                node.cut = False
                return False
            if node.disk.stopped:  # the machine stopped in the middle of the start: it loses power there
                node.disk.stopped = False
                node.disk.stop = None
                node.disk = node.disk.power_loss(LossPolicy("random", self.rng))
                self.after(self.rng.uniform(0.05, 1.0), "restart", self._restart, node)
                return False
            if node.halted is not None and node.halted[0] in LEGIT_HALTS:
                node.halted = None
                self.after(self.rng.uniform(0.1, 1.0), "restart", self._restart, node)
                return False
            self.stats["refused"] += 1
            raise Violation(f"node {node.node_id} refused to start: {node.refused}")
        if before is not None and node.node_id not in self.expected_loss:
            journal, snap = node.raft.journal, node.raft.store.current
            base = snap.last_index if snap else 0
            held = {e[1]: e[2] for e in journal.entries}
            for index in range(base + 1, before + 1):
                want = self.checker.ledger.get(index)
                if want is not None and held.get(index) != want[0]:
                    raise Violation(f"durability: node {node.node_id} held committed index {index} on disk before "
                                    f"it stopped, and lost it (journal {min(held, default=None)}.."
                                    f"{max(held, default=None)}, snapshot at {base})")
        node._committed_before = None
        return ok

    def _stop(self, node: SimulatedNode, how: str, policy: LossPolicy | None = None) -> None:
        if node.running:
            node._committed_before = node.committed_and_durable()
        if policy is None:
            node.crash(how)
        else:
            node.power_loss(policy)
        self.after(self.rng.uniform(0.05, 2.5), "restart", self._restart, node)

    def _restart(self, node: SimulatedNode) -> None:
        if not node.running and not node.removed:
            self._start(node)

    LOSSES = ("crash", "crash_in_io", "power_loss", "disk_error", "disk_full", "restore_backup", "membership",
              "partition")

    FAULT_KINDS = ("crash", "crash_in_io", "power_loss", "partition", "disk_error", "disk_full", "slow_disk",
                   "restore_backup", "bad_answer", "membership", "transfer", "snapshot")  # drawn by _inject

    def _inject(self) -> None:
        plan = self.plan
        kinds = [(k, getattr(plan, k)) for k in self.FAULT_KINDS if getattr(plan, k)]
        if self._staged is not None:
            kinds = [(k, w) for k, w in kinds if k not in self.LOSSES]  # a staged fault is playing out
        elif self._restored_pending():
            # While a restored node catches up, any fault but a second loss of data (another restored copy)
            # or a membership change (a copy cannot reach members added since) is within what it must
            # survive: it waits for its peers' word, then for its target (docs/durability.md).
            kinds = [(k, w) for k, w in kinds if k not in ("restore_backup", "membership")]
        if kinds:
            total = sum(w for _, w in kinds)
            kind = self.rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
            getattr(self, f"_fault_{kind}")()
            self.after(self.rng.expovariate(total) + 0.05, "fault", self._inject)
        self._maybe_backup()

    def _notice_halts(self) -> None:
        for n in self.nodes.values():
            if not n.running and n.halted is not None and not n.removed:
                code, message = n.halted
                if code not in LEGIT_HALTS:
                    raise Violation(f"node {n.node_id} stopped with exit {code}: {message}")
                n.halted = None
                n.disk.fail = None
                self.after(self.rng.uniform(0.1, 1.0), "restart", self._restart, n)

    def _pick(self, running: bool = True) -> SimulatedNode | None:
        pool = [n for n in self.nodes.values() if n.running == running and not n.removed]
        return self.rng.choice(pool) if pool else None

    def _fault_crash(self) -> None:
        n = self._pick()
        if n:
            self.fault("crash")
            self._stop(n, "is killed (kill -9)")

    def _fault_crash_in_io(self) -> None:
        n = self._pick()
        if n is None:
            return
        self.fault("crash_in_io")
        remaining = [self.rng.randint(1, 40)]
        kind = self.rng.choice([None, "rename", "fdatasync", "fsync", "sync_dir", "write", "truncate", "create"])
        moment = self.rng.choice(["before", "after"])

        def stop(op, when):
            if (kind is not None and op.kind != kind) or when != moment:
                return False
            remaining[0] -= 1
            return remaining[0] <= 0
        n.disk.stop = stop
        self.note(f"node {n.node_id}: the machine will stop {moment} its {remaining[0]}th "
                  f"{kind or 'file'} operation")
        self.after(0.0, "watch", self._watch_machine_stop, n, 60)

    def _watch_machine_stop(self, n: SimulatedNode, tries: int) -> None:
        if n.disk.stopped or (not n.running and n.disk.stop is not None):
            n.disk.stop = None
            if n.running:
                n.crash("machine stopped")
            if n.disk.stopped:
                n._committed_before = getattr(n, "_committed_before", None)
                n.disk.stopped = False
                n.disk = n.disk.power_loss(LossPolicy("random", self.rng))
                self.note(f"node {n.node_id}: power lost where the machine stopped")
                self.after(self.rng.uniform(0.05, 2.0), "restart", self._restart, n)
            return
        if tries <= 0:
            n.disk.stop = None
            return
        self.after(0.05, "watch", self._watch_machine_stop, n, tries - 1)

    def _fault_power_loss(self) -> None:
        members = [n for n in self.nodes.values() if not n.removed]
        scope = self.rng.choice(["one", "minority", "all"])
        if scope == "one":
            victims = [self.rng.choice(members)]
        elif scope == "minority":
            victims = self.rng.sample(members, (len(members) - 1) // 2)
        else:
            victims = members
        self.fault(f"power_loss_{scope}")
        for n in victims:
            if n.running:
                n._committed_before = n.committed_and_durable()
            if n.running or n.disk is not None:
                n.power_loss(LossPolicy("random", self.rng, torn=0.5))
                self.after(self.rng.uniform(0.05, 2.5), "restart", self._restart, n)

    def _fault_partition(self) -> None:
        if self.rng.random() < 0.25 and self.leader() is not None and self._staged is None:
            self._isolate_leader_then_compact()
            return
        addresses = [n.address for n in self.nodes.values() if not n.removed]
        shape = self.rng.choice(["isolate", "one-way", "split"])
        if shape == "isolate":
            a = self.rng.choice(addresses)
            cut = {(a, b) for b in addresses if b != a} | {(b, a) for b in addresses if b != a}
        elif shape == "one-way":
            a, b = self.rng.sample(addresses, 2)
            cut = {(a, b)}
        else:
            side = set(self.rng.sample(addresses, len(addresses) // 2))
            cut = {(a, b) for a in addresses for b in addresses if (a in side) != (b in side)}
        self.fault(f"partition_{shape}")
        self.net.blocked |= cut
        self.note(f"partition ({shape}): {sorted(cut)}")
        self.after(self.rng.uniform(0.3, 4.0), "heal", self._heal, cut)

    def _isolate_leader_then_compact(self) -> None:
        """The shape in which a follower must drop entries it holds: the leader is cut off and keeps
        appending what clients send it (never committed), the others elect a leader that commits and
        compacts past that point, then the cut heals and the old leader is brought up to date by a
        snapshot over a log that does not match it.  The cut lasts 0.8-2 s; the compaction comes just
        before the heal."""
        old = self.leader()
        addresses = [n.address for n in self.nodes.values() if not n.removed]
        cut = {(old.address, b) for b in addresses if b != old.address}
        cut |= {(b, a) for a, b in cut}
        self.fault("partition_isolate_leader")
        self.net.blocked |= cut
        self.note(f"partition (the leader, node {old.node_id}, is cut off): {sorted(cut)}")
        self.after(self.rng.uniform(0.8, 2.0), "heal", self._compact_then_heal, old, cut)
        self._to_cut_off_leader(old, cut)

    def _to_cut_off_leader(self, old: SimulatedNode, cut: set) -> None:
        """While the cut-off leader believes it leads, entries keep reaching its log: a writer of its own
        proposes an empty batch every few milliseconds (a pipelining client of ``RaftNode.propose``; the
        quorum's proposer keeps one entry in flight, so it alone would add one).  The cut-off leader so
        appends entries of its term past the index the other side's leader compacts to: healed, it gets a
        snapshot over a log that holds that index in another term, with a tail after it."""
        if not cut <= self.net.blocked or not old.running or not old.raft.is_leader:
            return
        old.guard(old.raft.propose, encode_batch([]), lambda result, error: None)
        old.wake(0.0)
        self.after(self.rng.uniform(0.005, 0.03), "client", self._to_cut_off_leader, old, cut)

    def _compact_then_heal(self, old: SimulatedNode, cut: set) -> None:
        """The other side's leader writes an entry of its own term (an empty batch) and, once it applied it,
        compacts: the snapshot then ends at least two entries past the last one both sides share, so the
        cut-off leader cannot be caught up by AppendEntries from that leader's log and gets the snapshot."""
        leader = self.leader()
        if leader is not None and leader is not old:
            leader.guard(leader.raft.propose, encode_batch([]), lambda result, error: None)
            leader.wake(0.0)
            self.after(0.05, "heal", self._compact_and_heal, old, cut)
            return
        self.after(self.rng.uniform(0.05, 0.3), "heal", self._heal, cut)

    def _compact_and_heal(self, old: SimulatedNode, cut: set) -> None:
        leader = self.leader()
        if leader is not None and leader is not old:
            leader.raft.force_snapshot()
            leader.wake(0.0)
        self.after(self.rng.uniform(0.05, 0.3), "heal", self._heal, cut)

    def _heal(self, cut: set) -> None:
        self.net.blocked -= cut
        self.note("partition healed")

    def _fault_disk_error(self) -> None:
        n = self._pick()
        if n is None:
            return
        self.fault("disk_error")
        kind = self.rng.choice(["fdatasync", "fsync", "write", "rename", "sync_dir"])
        countdown = [self.rng.randint(1, 20)]
        err = OSError(errno.EIO, "Input/output error")
        # Half the time the machine then loses power: what a swallowed error left unwritten is gone.
        power_loss_after = self.rng.uniform(0.05, 1.0) if self.rng.random() < 0.5 else None

        def fail(op, _kind=kind):
            if op.kind != _kind:
                return None
            countdown[0] -= 1
            if countdown[0] != 0:
                return None
            if power_loss_after is not None:
                self.after(power_loss_after, "fault", self._power_loss_after_error, n)
            return err
        n.disk.fail = fail
        self.note(f"node {n.node_id}: EIO at its {countdown[0]}th {kind}"
                  + (f", then a power loss {power_loss_after:.2f}s later" if power_loss_after is not None else ""))

    def _power_loss_after_error(self, n: SimulatedNode) -> None:
        if n.removed or n.disk is None:
            return
        if n.running:
            n._committed_before = n.committed_and_durable()
        n.power_loss(LossPolicy("random", self.rng, torn=0.5))
        self.after(self.rng.uniform(0.05, 2.5), "restart", self._restart, n)

    def _fault_disk_full(self) -> None:
        n = self._pick()
        if n is None:
            return
        self.fault("disk_full")
        n.disk.capacity = n.disk.used() + self.rng.randint(0, 4000)
        self.note(f"node {n.node_id}: the disk fills up at {n.disk.capacity} bytes")
        self.after(self.rng.uniform(0.5, 3.0), "heal", self._free_disk, n)

    def _free_disk(self, n: SimulatedNode) -> None:
        n.disk.capacity = None
        self.note(f"node {n.node_id}: disk space freed")

    def _fault_slow_disk(self) -> None:
        n = self._pick()
        if n is None:
            return
        self.fault("slow_disk")
        n.slow = self.rng.uniform(0.01, 0.3)
        self.note(f"node {n.node_id}: every sync now takes {n.slow * 1000:.0f} ms")
        self.after(self.rng.uniform(1.0, 4.0), "heal", self._fast_disk, n)

    def _fast_disk(self, n: SimulatedNode) -> None:
        n.slow = 0.0

    def _maybe_backup(self) -> None:
        if not self.plan.restore_backup or self.rng.random() > 0.3 or self._replacing:
            return
        n = self._pick()
        if n is not None:
            self.backups[n.node_id] = (self.clock.now, n.disk.copy())
            self.note(f"node {n.node_id}: its data directory is copied (a backup)")

    def _fault_restore_backup(self) -> None:
        """An old copy of a node's data directory is started in its place.  Only when every other member
        runs: a node whose later position no live peer saw cannot be told apart (docs/durability.md).

        Half the time in the shape that makes a restored copy dangerous (``_restore_while_a_member_lags``);
        otherwise from a backup taken earlier, at a random moment, and when a membership change completed
        since some backup, half of those times from a backup taken before it (its copy knows only the
        configuration before the change: docs/durability.md, "Configurations since the copy")."""
        if self.rng.random() < 0.5:
            self._restore_while_a_member_lags()
            return
        pool = self.backups
        if self.backups_before_change and self.rng.random() < 0.5:
            pool = self.backups_before_change
        candidates = [i for i in pool if not self.nodes[i].removed and self.nodes[i].running]
        if not candidates:
            return
        i = self.rng.choice(candidates)
        if self._may_restore(self.nodes[i]):
            self._restore(self.nodes[i], pool)

    def _may_restore(self, n: SimulatedNode) -> bool:
        """Every other member runs on a healthy disk, none is recovering and none is being replaced: with a
        member already recovering, or one being replaced, a second loss is a majority's."""
        others = [m for m in self.nodes.values() if m is not n and not m.removed]
        return not self._replacing and n.running and all(
            m.running and not m.raft.restricted and m.disk.stop is None and m.disk.fail is None
            and m.disk.capacity is None for m in others)

    def _restore(self, n: SimulatedNode, pool: dict | None = None) -> float:
        """Replace ``n``'s data directory by its backup (of ``pool``: ``backups`` by default); it starts again
        after the delay returned."""
        self.fault("restore_backup")
        taken, disk = (self.backups if pool is None else pool).pop(n.node_id)
        n.crash(f"is stopped and its data directory replaced by the backup from {taken:.2f}s")
        n._committed_before = None
        n.disk = disk.copy()
        self.expected_loss.add(n.node_id)
        self.checker.forget_term(n.node_id)
        self._restored = (n, None)
        delay = self.rng.uniform(0.05, 1.0)
        self.after(delay, "restart", self._restart, n)
        return delay

    def _restore_while_a_member_lags(self) -> None:
        """The shape in which a restored copy loses committed entries if it is let in as a full member:
        entries commit on the copy's node and one peer only (the third member is cut off), the copy is
        restored, and the peer that holds those entries is killed as the cut-off member comes back.  The
        copy and the laggard would then make a majority without those entries.  Done right, the copy
        waits for both peers' word and then for its recovery target, so the cluster waits for the killed
        peer's restart (kill -9: its files stay).

        The backup is taken now, the cut lasts 0.3-1.5 s; the kill and the heal come together, from the
        moment the copy is restored to just after it starts."""
        members = [m for m in self.nodes.values() if not m.removed]
        if len(members) != 3 or self._restored_pending() or self._staged is not None:
            return
        copy, laggard, holder = self.rng.sample(members, 3)
        if not self._may_restore(copy):
            return
        self.backups[copy.node_id] = (self.clock.now, copy.disk.copy())
        cut = {(laggard.address, m.address) for m in members if m is not laggard}
        cut |= {(b, a) for a, b in cut}
        self.net.blocked |= cut
        self._staged = "restore while a member lags"
        self.note(f"node {copy.node_id}: its data directory is copied (a backup); node {laggard.node_id} is cut off")
        self.after(self.rng.uniform(0.3, 1.5), "fault", self._restore_while_cut_off, copy, holder, cut)

    def _restore_while_cut_off(self, copy: SimulatedNode, holder: SimulatedNode, cut: set) -> None:
        if not self._may_restore(copy):
            self._staged = None
            self._heal(cut)
            return
        restart = self._restore(copy)
        self.after(self.rng.uniform(0.0, restart + 0.05), "fault", self._kill_holder_and_heal, holder, cut)

    def _kill_holder_and_heal(self, holder: SimulatedNode, cut: set) -> None:
        if holder.running:
            self.fault("crash")
            self._stop(holder, "is killed (kill -9) as the cut-off member returns")
        self._heal(cut)
        self._staged = None

    def _restored_pending(self) -> bool:
        if self._restored is None:
            return False
        n, since = self._restored
        if not n.running:
            return True
        if since is None:
            self._restored = (n, self.clock.now)
            return True
        if self.clock.now - since < 2.0:
            return True
        self._restored = None
        return False

    def _fault_membership(self) -> None:
        """Replace a follower the documented way: remove it from the membership, retire it, then add a
        fresh node (empty data directory, a new address) and start it (docs/operations.md).  Like an
        operator, the simulation checks the committed membership rather than trusting the command's
        answer (the leader may die before it answers)."""
        leader = self.leader()
        members = [n for n in self.nodes.values() if not n.removed]
        followers = [n for n in self.running() if n is not leader and not n.removed]
        if (leader is None or not followers or len(self.running()) < len(members) or self._replacing
                or any(n.raft.restricted for n in self.running())):
            return
        victim = self.rng.choice(followers)
        self.fault("membership")
        self._replacing = True
        self.note(f"membership: replacing node {victim.node_id}")
        leader.guard(leader.raft.start_remove_member, victim.address,
                     lambda r, e, _v=victim: self.note(f"membership: removal of node {_v.node_id}: "
                                                       f"{'done' if e == 0 else e}"))
        self.after(0.2, "membership", self._watch_membership, victim, None, self.clock.now)

    def _committed_members(self) -> list[str] | None:
        """The leader's membership, once everything in its log is committed (so it holds)."""
        leader = self.leader()
        if leader is None:
            return None
        if leader.raft.commit_index != leader.raft.journal.entries[-1][1]:
            return None
        return leader.raft.members()

    def _watch_membership(self, victim: SimulatedNode | None, fresh: SimulatedNode | None, since: float) -> None:
        members = self._committed_members()
        if victim is not None:
            if members is not None and victim.address not in members:
                victim.removed = True
                victim.crash("is removed from the cluster and retired")
                self.note(f"membership: node {victim.node_id} is out")
                self.after(self.rng.uniform(0.2, 1.5), "membership", self._add_fresh)
                return
            if self.clock.now - since > 3.0 and self.leader() is not None:
                leader = self.leader()
                self.note(f"membership: removing node {victim.node_id} again")
                leader.guard(leader.raft.start_remove_member, victim.address, lambda r, e: None)
                since = self.clock.now
            self.after(0.2, "membership", self._watch_membership, victim, None, since)
            return
        if members is not None and fresh.address in members:
            self.note(f"membership: node {fresh.node_id} is in")
            # The backups from before the change are kept apart: a copy restored from one must wait for the
            # word of the configuration since (docs/durability.md, "Configurations since the copy").
            self.backups_before_change = dict(self.backups)
            self.backups.clear()
            self._replacing = False
            return
        if self.clock.now - since > 3.0 and self.leader() is not None and fresh.running:
            leader = self.leader()
            self.note(f"membership: adding node {fresh.node_id} again")
            leader.guard(leader.raft.start_add_member, fresh.address, lambda r, e: None)
            since = self.clock.now
        elif not fresh.running and not fresh.removed:
            self._restart(fresh)
        self.after(0.2, "membership", self._watch_membership, None, fresh, since)

    def _add_fresh(self) -> None:
        """(An operator finishing a replacement retries until it is done.)"""
        leader = self.leader()
        if leader is None:
            self.after(0.3, "membership", self._add_fresh)
            return
        node_id = max(self.nodes) + 1
        address, client = f"10.0.0.{node_id}:9093", f"10.0.0.{node_id}:9092"
        members = [n for n in self.nodes.values() if not n.removed]
        template = members[0].cfg
        cfg = NodeConfig(node_id=node_id, data_dir=DATA, raft_address=address, client_address=client,
                         secret=template.secret, peers=[Peer(n.node_id, n.address, n.cfg.client_address)
                                                        for n in members],
                         block_size=template.block_size, raft=template.raft, cluster_id=template.cluster_id,
                         allocate_reserve_blocks=template.allocate_reserve_blocks)
        node = SimulatedNode(self, node_id, cfg, SimDisk())
        self.nodes[node_id] = node
        self._start(node)
        leader.guard(leader.raft.start_add_member, address,
                     lambda r, e, _n=node: self.note(f"membership: adding node {_n.node_id}: {'done' if e == 0 else e}"))
        self.after(0.2, "membership", self._watch_membership, None, node, self.clock.now)

    def _fault_bad_answer(self) -> None:
        if self.managed:
            broker = self.rng.choice(self.managed)
            self.fault("bad_answer")
            broker.bad_answer = True

    def _fault_transfer(self) -> None:
        leader = self.leader()
        if leader is not None:
            self.fault("transfer")
            leader.guard(leader.raft.start_transfer, None, lambda r, e: self.note(
                f"leadership transfer from node {leader.node_id}: {'sent' if e == 0 else f'denied ({e})'}"))

    def _fault_snapshot(self) -> None:
        n = self._pick()
        if n is not None:
            self.fault("snapshot")
            n.raft.force_snapshot()
            n.wake(0.0)


def make_simulation(config: SimConfig) -> Simulation:
    """The simulation of ``config.workload``: producer IDs (``Simulation``) or transactions
    (``chaos.sim.txn.TxnSimulation``)."""
    if config.workload == "transactions":
        from .txn import TxnSimulation
        return TxnSimulation(config)
    if config.workload != "pids":
        raise ValueError(f"unknown workload {config.workload!r} (pids, transactions)")
    return Simulation(config)


def simulate(seed: int, steps: int = 6000, nodes: int = 3, faults: bool = True, workload: str = "pids") -> SimResult:
    return make_simulation(SimConfig(seed=seed, steps=steps, nodes=nodes, faults=faults, workload=workload)).run()


__all__ = ["Simulation", "SimConfig", "SimResult", "FaultPlan", "make_simulation", "simulate"]
