"""Faults for chaos runs on real processes (the Jepsen "nemesis"): each one starts a fault and heals it.

A ``Nemesis`` has a ``name`` and two coroutines, ``start(ctx)`` and ``stop(ctx)``, each returning a JSON-able
description for the history; ``stop`` heals what ``start`` did and is safe after a ``start`` that failed or
did nothing.  Blocking process work runs in a thread, so a workload sharing the event loop keeps going.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from quorum.client.leader import pick_leader
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum.localcluster import LocalCluster
from records.wire.errors import NotControllerError

from .faultnode import FAULT_SYNC_DELAY_FILE
from .raftnet import NemesisError, RaftNetwork

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------
# Context
# --------------------------------------------------------------------------


@dataclass
class NemesisContext:
    """What a nemesis acts on.

    ``log``: a ``logging.Logger``, or any callable taking one string.
    ``network``: the running ``RaftNetwork`` of a cluster created with
    ``raft_proxy=True``; without it there is no partition nemesis.
    ``env``: extra environment for every node a nemesis (re)starts: pass the
    same as to ``LocalCluster.up`` (e.g. a test-only mode) or restarts lose it.
    """

    cluster: LocalCluster
    rng: random.Random = field(default_factory=random.Random)
    log: Any = None
    network: RaftNetwork | None = None
    env: dict[str, str] | None = None
    leader_timeout: float = 15.0
    ready_timeout: float = 30.0
    probe_timeout: float = 0.5

    def note(self, message: str, *args: Any) -> None:
        if self.log is None:
            _log.info(message, *args)
        elif isinstance(self.log, (logging.Logger, logging.LoggerAdapter)):
            self.log.info(message, *args)
        else:
            self.log(message % args if args else message)

    # ---------------------------------------------------------------- status
    def _probe_client(self, addresses: list[str]) -> QuorumClient:
        return QuorumClient(addresses, RetryPolicy(timeout=self.probe_timeout, attempt_timeout=self.probe_timeout),
                            client_id="chaos-nemesis")

    async def statuses(self) -> dict[int, dict]:
        """DescribeState of every node that answers within ``probe_timeout`` (dead or paused ones do not)."""
        nodes = [n for n in self.cluster.nodes() if n.pid]
        if not nodes:
            return {}
        client = self._probe_client([n.client_address for n in nodes])
        try:
            answers = await client.describe_each()
        finally:
            await client.close()
        return {n.node_id: answers[n.client_address] for n in nodes if isinstance(answers[n.client_address], dict)}

    async def leader(self) -> int | None:
        """The node that leads (``quorum.client.leader.pick_leader`` over ``statuses()``), or None."""
        return pick_leader(await self.statuses())

    async def wait_leader(self, timeout: float | None = None, exclude: int | None = None) -> int:
        """A leader (other than ``exclude``), or NemesisError after ``timeout`` (``QuorumClient.find_leader``)."""
        timeout = self.leader_timeout if timeout is None else timeout
        node_of = {n.client_address: n.node_id for n in self.cluster.nodes()}
        client = self._probe_client(list(node_of))
        try:
            address, _ = await client.find_leader(timeout, exclude={a for a, n in node_of.items() if n == exclude})
        except NotControllerError:
            raise NemesisError(f"no leader{f' other than node {exclude}' if exclude else ''} "
                               f"within {timeout:.1f}s") from None
        finally:
            await client.close()
        return node_of[address]

    # -------------------------------------------------------------- processes
    def node_ids(self) -> list[int]:
        return [n.node_id for n in self.cluster.nodes()]

    async def kill(self, *node_ids: int) -> None:
        """kill -9 all of them at once, then wait until they are gone."""
        def go():
            for n in node_ids:
                self.cluster.signal(n, signal.SIGKILL)
            for n in node_ids:
                self.cluster.kill(n)
        await asyncio.to_thread(go)

    async def start(self, *node_ids: int) -> None:
        """Start the nodes that are not running (with ``env``) and wait until they serve."""
        def go():
            for n in node_ids:
                self.cluster.start(n, env=self.env)
            self.cluster.wait_ready(list(node_ids), timeout=self.ready_timeout)
        await asyncio.to_thread(go)

    async def signal(self, node_id: int, sig: int) -> None:
        await asyncio.to_thread(self.cluster.signal, node_id, sig)

    # ------------------------------------------------------------ slow disk
    def set_sync_delay(self, node_id: int, delay_ms: tuple[int, int] | None) -> None:
        path = os.path.join(self.cluster.data_dir(node_id), FAULT_SYNC_DELAY_FILE)
        if delay_ms is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            return
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{delay_ms[0]}-{delay_ms[1]}\n")
        os.replace(tmp, path)

    async def heal_all(self) -> dict:
        """Undo every fault: no partition, no slow disk, every node resumed and running."""
        if self.network is not None:
            self.network.heal()
        for n in self.node_ids():
            self.set_sync_delay(n, None)
            await self.signal(n, signal.SIGCONT)
        dead = [n for n in self.node_ids() if not self.cluster.alive(n)]
        if dead:
            await self.start(*dead)
        return {"restarted": dead}


# --------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------


class Nemesis:
    name: str = "nemesis"

    async def start(self, ctx: NemesisContext) -> dict:
        raise NotImplementedError

    async def stop(self, ctx: NemesisContext) -> dict:
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


async def _leader_or_none(ctx: NemesisContext) -> int | None:
    try:
        return await ctx.wait_leader()
    except NemesisError:
        return None


class _LeaderFault(Nemesis):
    """A fault on the node that leads when it starts; stop heals that node."""

    done = healed = ""  # what start and stop did, for the log

    def __init__(self) -> None:
        self.node: int | None = None

    async def _hit(self, ctx: NemesisContext, node: int) -> None:
        raise NotImplementedError

    async def _heal(self, ctx: NemesisContext, node: int) -> None:
        raise NotImplementedError

    async def start(self, ctx: NemesisContext) -> dict:
        self.node = await _leader_or_none(ctx)
        if self.node is None:
            return {"node": None, "skipped": "no leader"}
        await self._hit(ctx, self.node)
        ctx.note(f"nemesis: {self.done} leader node %d", self.node)
        return {"node": self.node}

    async def stop(self, ctx: NemesisContext) -> dict:
        node, self.node = self.node, None
        if node is not None:
            await self._heal(ctx, node)
            ctx.note(f"nemesis: {self.healed} node %d", node)
        return {"node": node}


class KillLeader(_LeaderFault):
    """kill -9 the leader (whatever it is doing); stop restarts it."""

    name = "kill-leader"
    done, healed = "killed", "restarted"

    async def _hit(self, ctx: NemesisContext, node: int) -> None:
        await ctx.kill(node)

    async def _heal(self, ctx: NemesisContext, node: int) -> None:
        await ctx.start(node)


class PauseLeader(_LeaderFault):
    """SIGSTOP the leader; stop sends SIGCONT (it wakes up believing it still leads)."""

    name = "pause-leader"
    done, healed = "paused", "resumed"

    async def _hit(self, ctx: NemesisContext, node: int) -> None:
        await ctx.signal(node, signal.SIGSTOP)

    async def _heal(self, ctx: NemesisContext, node: int) -> None:
        await ctx.signal(node, signal.SIGCONT)


class KillAll(Nemesis):
    """kill -9 every node; stop restarts them all and waits for a leader."""

    name = "kill-all"

    def __init__(self) -> None:
        self.nodes: list[int] = []

    async def start(self, ctx: NemesisContext) -> dict:
        self.nodes = ctx.node_ids()
        await ctx.kill(*self.nodes)
        ctx.note("nemesis: killed every node")
        return {"nodes": self.nodes}

    async def stop(self, ctx: NemesisContext) -> dict:
        nodes, self.nodes = self.nodes, []
        if nodes:
            await ctx.start(*nodes)
            leader = await _leader_or_none(ctx)
            ctx.note("nemesis: restarted every node; leader %s", leader)
            return {"nodes": nodes, "leader": leader}
        return {"nodes": nodes}


class RollingRestart(Nemesis):
    """start: SIGTERM and restart each node in turn, followers first, each time waiting
    until it serves and knows a leader; stop: nothing to heal."""

    name = "rolling-restart"

    async def start(self, ctx: NemesisContext) -> dict:
        leader = await _leader_or_none(ctx)
        order = [n for n in ctx.node_ids() if n != leader] + ([leader] if leader is not None else [])
        for node in order:
            await asyncio.to_thread(ctx.cluster.stop, node)
            await ctx.start(node)
            await _wait_knows_leader(ctx, node)
        ctx.note("nemesis: rolling restart of %s done", order)
        return {"order": order}


async def _wait_knows_leader(ctx: NemesisContext, node: int) -> None:
    deadline = time.monotonic() + ctx.leader_timeout
    while True:
        d = (await ctx.statuses()).get(node)
        if d is not None and (d["raft"]["leader"] is not None or d["raft"]["state"] == "leader"):
            return
        if time.monotonic() > deadline:
            raise NemesisError(f"node {node} knows no leader {ctx.leader_timeout:.1f}s after its restart")
        await asyncio.sleep(0.05)


class PartitionLeader(Nemesis):
    """Cut the leader's Raft links to both followers, both directions (client ports stay
    reachable); stop heals.  Needs ``ctx.network`` (``chaos.raftnet``)."""

    name = "partition-leader"

    def __init__(self) -> None:
        self.node: int | None = None

    async def start(self, ctx: NemesisContext) -> dict:
        if ctx.network is None:
            raise NemesisError("partition-leader needs ctx.network: a RaftNetwork over a cluster created "
                               "with LocalCluster.create(raft_proxy=True)")
        self.node = await _leader_or_none(ctx)
        if self.node is None:
            return {"node": None, "skipped": "no leader"}
        ctx.network.isolate(self.node)
        ctx.note("nemesis: isolated leader node %d", self.node)
        return {"node": self.node, "client_port": "reachable"}

    async def stop(self, ctx: NemesisContext) -> dict:
        node, self.node = self.node, None
        if ctx.network is not None:
            ctx.network.heal()
            ctx.note("nemesis: healed the partition")
        return {"node": node}


class SlowDisk(Nemesis):
    """Every journal sync of the leader (``scope="leader"``) or of every node (``"all"``)
    sleeps ``delay_ms`` (a uniform draw in MIN..MAX) first; stop removes the delay.
    Takes effect within 0.1 s, with no restart: the nodes run ``chaos.faultnode`` (``FAULT_SYNC_DELAY_FILE``)."""

    name = "slow-disk"

    def __init__(self, scope: str = "leader", delay_ms: tuple[int, int] = (50, 200)) -> None:
        if scope not in ("leader", "all"):
            raise ValueError(f"scope must be 'leader' or 'all', not {scope!r}")
        self.scope = scope
        self.delay_ms = delay_ms
        self.nodes: list[int] = []

    async def start(self, ctx: NemesisContext) -> dict:
        if self.scope == "all":
            self.nodes = ctx.node_ids()
        else:
            leader = await _leader_or_none(ctx)
            if leader is None:
                return {"nodes": [], "skipped": "no leader"}
            self.nodes = [leader]
        for n in self.nodes:
            ctx.set_sync_delay(n, self.delay_ms)
        ctx.note("nemesis: slow disk (%d-%d ms per sync) on %s", *self.delay_ms, self.nodes)
        return {"nodes": self.nodes, "delay_ms": list(self.delay_ms)}

    async def stop(self, ctx: NemesisContext) -> dict:
        nodes, self.nodes = self.nodes, []
        for n in nodes:
            ctx.set_sync_delay(n, None)
        return {"nodes": nodes}


class Mixed(Nemesis):
    """Each start picks one of the other faults with ``ctx.rng`` (a partition only when
    ``ctx.network`` is set); stop heals the one picked."""

    name = "mixed"
    CHOICES: tuple[type[Nemesis], ...] = (KillLeader, PauseLeader, KillAll, RollingRestart, PartitionLeader,
                                         SlowDisk)

    def __init__(self) -> None:
        self.current: Nemesis | None = None

    def pick(self, ctx: NemesisContext) -> Nemesis:
        choices = [c for c in self.CHOICES if c is not PartitionLeader or ctx.network is not None]
        return ctx.rng.choice(choices)()

    async def start(self, ctx: NemesisContext) -> dict:
        self.current = self.pick(ctx)
        return {"fault": self.current.name, **await self.current.start(ctx)}

    async def stop(self, ctx: NemesisContext) -> dict:
        current, self.current = self.current, None
        if current is None:
            return {}
        return {"fault": current.name, **await current.stop(ctx)}


SCENARIOS: dict[str, Callable[[], list[Nemesis]]] = {
    "kill-leader": lambda: [KillLeader()],
    "pause-leader": lambda: [PauseLeader()],
    "kill-all": lambda: [KillAll()],
    "rolling-restart": lambda: [RollingRestart()],
    "partition-leader": lambda: [PartitionLeader()],
    "slow-disk": lambda: [SlowDisk()],
    "mixed": lambda: [Mixed()],
}

__all__ = ["KillAll", "KillLeader", "Mixed", "Nemesis", "NemesisContext", "NemesisError", "PartitionLeader",
           "PauseLeader", "RaftNetwork", "RollingRestart", "SCENARIOS", "SlowDisk"]
