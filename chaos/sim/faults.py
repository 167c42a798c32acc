"""The faults of the deterministic simulation (``chaos.sim.sim``), and its nodes' starts and stops.

Mixed by the seed (``FaultPlan``): message drop, delay, reorder and duplication; symmetric and one-way
partitions; process crashes between events and in the middle of a file operation; power loss of one node,
a minority or all (unsynced data and renames lost, the last write torn); fsync and write errors and a full
disk; slow disks; restarts from an older copy of a data directory; membership changes and leadership
transfers; snapshots under load.  The last fault's shapes, played as the run ends, are in ``chaos.sim.sim``.
"""
from __future__ import annotations

import errno
import random
from dataclasses import dataclass, field

from quorum.config import NodeConfig, Peer
from records import encode_batch
from snapshots.storage.disk import EXIT_STORAGE

from .checker import Violation
from .disk import LossPolicy, SimDisk
from .net import NetFaults
from .node import SimulatedNode

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


class Faults:
    """The faults a ``Simulation`` injects (``_inject`` draws them), and how its nodes start and stop; mixed
    into it, so ``self`` is the simulation and every draw comes from its streams in the order of its events."""

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


__all__ = ["DATA", "LEGIT_HALTS", "FaultPlan", "Faults"]
