"""Deterministic simulation of a whole quorum: the real code, a simulated world, one seed.

``Simulation(SimConfig(seed=...)).run()`` runs three (or five) production quorum nodes in this process,
with the network, the disks and the clock simulated; one ``random.Random(seed)`` drives everything, so
a seed replays the same run bit for bit (``SimResult.digest``).  This module holds the scheduler (the
event queue, the clock, the run loop), the wiring of the nodes, and the end of a run (the last fault's
shapes, convergence, the liveness bounds); ``Simulation`` inherits the workload (``chaos.sim.workload``)
and the faults (``chaos.sim.faults``).  What runs and what is checked: docs/simulation.md, section 1.
"""
from __future__ import annotations

import hashlib
import heapq
import random
import time
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from quorum.client import api
from quorum.config import NodeConfig, Peer
from quorum.raft import RaftConfig
from quorum.rpcs import RPCS
from records import encode_batch

from .checker import Checker, Violation
from .clock import SimClock, patched
from .disk import SYNCS, LossPolicy, MachineStopped, NodeHalted, SimDisk
from .faults import DATA, FaultPlan, Faults
from .liveness import COMMIT_BOUND, LEADER_BOUND, Watch, majority_leader
from .net import NetFaults, SimNetwork
from .node import SimulatedNode
from .workload import Workload, _Broker, _ManagedBroker, _Op


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


class Simulation(Faults, Workload):
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
        found = self._three_and_settled_leader(healed)
        if found is None:
            return False
        members, old = found
        others = [n for n in members if n is not old]
        self.fault("partition_leader_below_held_back")
        cut = {(old.address, n.address) for n in others}
        cut |= {(b, a) for a, b in cut}
        self.net.blocked |= cut
        self.note(f"last fault: the leader, node {old.node_id}, is cut off with an entry the others lack")
        broker = self.PROBE_BROKER + 1
        request = api.registration_request(broker, uuid.UUID(self.new_id()), f"broker-{broker}:9092")
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

    def _three_and_settled_leader(self, healed: float) -> tuple[list[SimulatedNode], SimulatedNode] | None:
        """For a last fault that needs exactly three members: them and their settled leader (from then on
        the heal that counts is the fault's); None with other members, or no settled leader in time."""
        members = [n for n in self.nodes.values() if not n.removed]
        if len(members) != 3 or self._replacing:
            return None
        old = self._settled_leader(healed, members)
        if old is None:
            return None
        self.liveness.leader_after_heal = None
        return members, old

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
        found = self._three_and_settled_leader(healed)
        if found is None:
            return False
        members, old = found
        rng = self.tail_rng
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
        _Op(self, api.registration_request(broker, uuid.UUID(self.new_id()), f"broker-{broker}:9092"),
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


__all__ = ["Simulation", "SimConfig", "SimResult", "FaultPlan"]
