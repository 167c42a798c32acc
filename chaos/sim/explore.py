"""Every crash state of a node's disk (ALICE, OSDI '14): explored inside a running three-node cluster.

A scripted workload (allocations with frequent compaction, a follower that falls behind and
is sent a snapshot, restarts that rewrite the identity and peers files, a leadership
transfer) runs once in the simulation.  Before every file operation of the node under study
the simulation process forks once per crash state POSIX allows at that instant
(``SimDisk.crash_states``: each file's unsynced writes kept as any prefix, the last one torn,
unsynced creates, renames and unlinks reverted).  In each child the node loses power there,
starts again from that state inside the cluster, which goes on; the checker runs after every
step (Raft's safety properties, no committed entry lost from the node's durable state, no
producer ID issued twice) and at the end every acknowledged block must be in the final state.
A child that finds a violation reports it with the operation and the state.

The node's files are written by the production ``snapshots.storage.disk.Disk`` over the simulated file
system (``chaos/sim/fs.py``), so the operations cut at are the system calls a real node makes.
The simulation is deterministic and single-threaded, so a fork is an exact copy of the run at
that instant: nothing is replayed, and each child only runs what follows the crash.
"""
from __future__ import annotations

import json
import logging
import os
import select
import time
from dataclasses import dataclass, field
from typing import Callable

from .checker import Violation
from .disk import MachineStopped
from .sim import SimConfig, Simulation


@dataclass
class CrashCase:
    node: int
    op: str
    state: str
    ok: bool
    violation: str | None = None
    trace: list[str] = field(default_factory=list)


@dataclass
class ExploreResult:
    seed: int
    ops: int = 0                 # file operations at which the node was cut
    states: int = 0              # crash states explored (one child each)
    failures: list[CrashCase] = field(default_factory=list)
    by_node: dict = field(default_factory=dict)
    wall_seconds: float = 0.0
    recording_ok: bool = True
    recording_violation: str | None = None

    def to_dict(self) -> dict:
        return {"seed": self.seed, "ops": self.ops, "crash_states": self.states, "failed": len(self.failures),
                "by_node": self.by_node, "wall_seconds": round(self.wall_seconds, 2),
                "recording_ok": self.recording_ok, "recording_violation": self.recording_violation,
                "failures": [vars(f) for f in self.failures]}


def scripted(sim: Simulation) -> None:
    """The exploration workload's events (no random faults): a follower falls behind and gets a
    snapshot, nodes restart (identity and peers rewritten), leadership moves, compaction throughout."""
    follower = sim.nodes[2]

    def kill_follower():
        if follower.running:
            follower._committed_before = follower.committed_and_durable()
            follower.crash("is killed (script)")
    sim.after(1.0, "script", kill_follower)
    sim.after(2.8, "script", sim._restart, follower)  # after the compactions below: it needs a snapshot
    for t in (1.5, 2.0, 2.5):
        sim.after(t, "script", lambda: [n.raft.force_snapshot() for n in sim.running()])
    sim.after(4.0, "script", lambda: sim._fault_transfer())
    sim.after(4.5, "script", lambda: sim._stop(sim.nodes[3], "is killed (script)") if sim.nodes[3].running else None)


def explore(seed: int = 1, steps: int = 3000, nodes: list[int] | None = None, after_steps: int = 1500,
            jobs: int | None = None, max_ops: int | None = None,
            progress: Callable[[ExploreResult], None] | None = None, around: str | None = None,
            reach: int = 8) -> ExploreResult:
    """Cut each of ``nodes`` (default: every node) at every file operation of the scripted run (at most
    ``max_ops`` per node, spread evenly), in every crash state; ``after_steps`` events follow each cut.
    ``around``: only the operations within ``reach`` of one on a file whose name contains it (the
    windows of a compaction or an install with ``raft.snapshot``)."""
    logging.disable(logging.CRITICAL)
    jobs = max(1, jobs or os.cpu_count() or 1)
    result = ExploreResult(seed)
    t0 = time.perf_counter()
    targets = nodes or [1, 2, 3]
    for target in targets:
        _explore_node(seed, steps, target, after_steps, jobs, max_ops, result, progress, around, reach)
    result.wall_seconds = time.perf_counter() - t0
    return result


def _chosen_ops(seed: int, steps: int, target: int, max_ops: int | None, around: str | None,
                reach: int) -> set[int]:
    """Which of the target's file operations (numbered from 0, reads left out) to cut at."""
    sim = _simulation(seed, steps)
    names: list[str] = []

    def record(op):
        if op.kind != "read":
            names.append(f"{op.path} {op.detail.get('to', '')}")
    sim.nodes[target].disk.on_op = record
    sim.run()
    chosen = set(range(len(names)))
    if around is not None:
        hits = [i for i, name in enumerate(names) if around in name]
        chosen = {j for i in hits for j in range(i - reach, i + reach + 1) if 0 <= j < len(names)}
    if max_ops is not None and len(chosen) > max_ops:
        ordered = sorted(chosen)
        chosen = {ordered[round(k * (len(ordered) - 1) / (max_ops - 1))] for k in range(max_ops)} if max_ops > 1 \
            else {ordered[0]}
    return chosen


def _simulation(seed: int, steps: int) -> Simulation:
    sim = Simulation(SimConfig(seed=seed, steps=steps, faults=False, compaction_min_entries=8))
    sim.script = scripted
    return sim


def _explore_node(seed: int, steps: int, target: int, after_steps: int, jobs: int, max_ops: int | None,
                  result: ExploreResult, progress, around: str | None, reach: int) -> None:
    chosen = _chosen_ops(seed, steps, target, max_ops, around, reach)
    sim = _simulation(seed, steps)
    node = sim.nodes[target]
    running: dict[int, tuple[int, str, str]] = {}
    pipes: dict[int, int] = {}
    outputs: dict[int, bytearray] = {}
    seen = [0]
    counts = {"ops": 0, "states": 0, "failed": 0}

    def reap(block: bool) -> None:
        while running and (block or len(running) >= jobs):
            fds = list(pipes.values())
            ready, _, _ = select.select(fds, [], [], None)
            for fd in ready:
                pid = next(p for p, f in pipes.items() if f == fd)
                chunk = os.read(fd, 65536)
                if chunk:
                    outputs[pid] += chunk
                    continue
                os.close(fd)
                os.waitpid(pid, 0)
                op, state_label = running.pop(pid)[1:]
                del pipes[pid]
                data = bytes(outputs.pop(pid))
                case = CrashCase(target, op, state_label, False, "the child died without a verdict")
                if data:
                    verdict = json.loads(data)
                    case = CrashCase(target, op, state_label, verdict["ok"], verdict.get("violation"),
                                     verdict.get("trace", []))
                result.states += 1
                counts["states"] += 1
                if not case.ok:
                    result.failures.append(case)
                    counts["failed"] += 1
                if progress:
                    progress(result)
            block = block and bool(running)

    def on_op(op) -> None:
        if op.kind == "read":
            return
        _mark_cuts(node)
        seen[0] += 1
        if seen[0] - 1 not in chosen:
            return
        states = list(node.disk.crash_states())
        result.ops += 1
        counts["ops"] += 1
        for label, image in states:
            reap(False)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: the node loses power here, in this state
                os.close(r)
                _child(sim, node, image, f"{op}", label, after_steps, w)
            os.close(w)
            running[pid] = (pid, str(op), label)
            pipes[pid] = r
            outputs[pid] = bytearray()

    node.disk.on_op = on_op
    recording = sim.run()
    reap(True)
    if not recording.ok:
        result.recording_ok = False
        result.recording_violation = recording.violation
    result.by_node[target] = counts


def _mark_cuts(node) -> None:
    """Flag, on the node's journal, when a deliberate cut is under way (a Raft conflict truncation, a
    rebase that drops a conflicting tail): synced entries may then vanish, as they should."""
    if not node.running:
        return
    journal = node.raft.journal
    if getattr(journal, "_explore_wrapped", False):
        return
    journal._explore_wrapped, journal._cutting = True, False

    def wrap(method):
        def call(*args, **kwargs):
            journal._cutting = True
            try:
                return method(*args, **kwargs)
            finally:
                journal._cutting = False
        return call
    journal.truncate_from = wrap(journal.truncate_from)
    rebase = journal.rebase

    def rebase_call(prev, last):
        held = journal.entry(last[1])
        if held is not None and held[2] == last[2]:
            return rebase(prev, last)  # a compaction: what it drops is in the snapshot
        return wrap(rebase)(prev, last)
    journal.rebase = rebase_call


def _synced_entries(node) -> tuple[list[tuple[int, int]], bool]:
    """(index, term) of the entries on the node's stable storage now, and whether a cut is under way."""
    if not node.running:
        return [], True
    journal = node.raft.journal
    return [(e[1], e[2]) for e in journal.entries[:journal._durable] if e[2] > 0], getattr(journal, "_cutting", True)


def _child(sim: Simulation, node, image, op: str, label: str, after_steps: int, w: int) -> None:
    """In the forked child: the node loses power before ``op``, its disk becoming ``image``; it starts
    again shortly and must hold every entry it had synced (unless a deliberate cut was under way); the
    run goes on for ``after_steps`` events, converges and is checked.  The verdict goes to ``w`` when
    ``Simulation.run`` ends (``report_child``)."""
    node.disk.on_op = None
    sim.on_end = lambda outcome: report_child(w, outcome)
    synced, cutting = _synced_entries(node)
    if node.running:
        node._committed_before = node.committed_and_durable()
    sim.config.steps = sim.step_no + after_steps
    sim.note(f"node {node.node_id} loses power before {op}: {label}")
    node.disk.stopped = True  # the disk as it was: nothing more reaches it
    node.disk = image
    node.cut = True

    def restart():
        if node.running or node.removed:
            return
        if sim._start(node) and not cutting:
            snap = node.raft.store.current
            base = snap.last_index if snap else 0
            held = {e[1]: e[2] for e in node.raft.journal.entries}
            for index, term in synced:
                if index > base and held.get(index) != term:
                    raise Violation(f"node {node.node_id} lost entry {index} (term {term}), synced before the power "
                                    f"cut ({label}): its journal holds {min(held, default=None)}.."
                                    f"{max(held, default=None)}, its snapshot ends at {base}")
    sim.after(sim.rng.uniform(0.05, 0.5), "restart", restart)
    raise MachineStopped(f"power cut before {op}")  # the node's guard ends the process here


def report_child(pipe: int, outcome) -> None:
    """End of ``Simulation.run`` in an exploration child: write the verdict to ``pipe``, exit."""
    verdict = {"ok": outcome.ok, "violation": outcome.violation,
               "trace": list(outcome.trace)[-25:] if not outcome.ok else []}
    data = json.dumps(verdict).encode()
    while data:
        n = os.write(pipe, data)
        data = data[n:]
    os.close(pipe)
    os._exit(0)


__all__ = ["explore", "ExploreResult", "CrashCase"]
