"""Faults for chaos runs (the Jepsen "nemesis"): each one starts a fault and heals it.

A ``Nemesis`` has a ``name`` and two coroutines, ``start(ctx)`` and
``stop(ctx)``; each returns a JSON-able description for the history.  ``stop``
heals what ``start`` did and is safe to call when ``start`` failed or found
nothing to do.  ``NemesisContext.heal_all()`` heals everything (every node
running and resumed, no slow disk, no partition) for a run's last step.
Blocking process work runs in a thread, so a workload sharing the event loop
keeps going while a node is killed or restarted.

Faults: kill -9 of the leader (``stop`` restarts it), SIGSTOP/SIGCONT of the
leader, kill -9 of every node (``stop`` restarts them all), a rolling restart
(SIGTERM and start, one node at a time, followers first), a slow disk (the
``fault-sync-delay-ms`` file, read at run time by the disk of a node started through
``chaos.faultnode`` (as the chaos runner starts them):
each sync sleeps before its fdatasync), and a partition that isolates the
leader's Raft traffic from both followers, in both directions.

The partition: TCP proxies on the Raft ports
---------------------------------------------
What was considered, as root on this machine (iproute2 and tc present;
iptables and nft not installed):

* iptables/nft/tc rules on loopback.  pysyncobj keeps one TCP connection per
  pair of nodes, opened by the node whose address string sorts higher to the
  other's advertised address, from 127.0.0.1 and an ephemeral port.  So a rule
  on ports cannot tell leader->follower from follower->follower traffic into
  the same listening port: with nodes a < b < c, both b and c connect to a.
  The rules would also be machine-wide state, shared by parallel pytest-xdist
  workers and left behind by a test process that dies.
* A network namespace per node with veth pairs (``ip netns add`` works here).
  A real partition, but a big change to LocalCluster (start nodes under
  ``ip netns exec``, a bridge and addresses per cluster in the root namespace,
  unique subnets and interface names per xdist worker), nodes leave loopback,
  and namespaces and bridges outlive a test process that is killed.
* A proxy per directed pair of nodes.  It cannot work: a pysyncobj node is
  known by one address string, both what it sends as its identity when it
  connects and where the others connect to; it cannot be a different proxy
  address for each peer.

Chosen: one proxy in front of each node's Raft port.  ``LocalCluster.create
(raft_proxy=True)`` has each node bind its Raft port on a private port
(``raft_bind``) and advertise another (``raft_address``); ``RaftNetwork``
listens on the advertised ports and forwards.  Identities and connection
direction are unchanged, since every node sees the same advertised addresses.
The proxy tells who connected by finding which node process owns the other
end of the socket (``/proc/net/tcp`` gives the socket's inode, a node's
``/proc/<pid>/fd`` holds it).  A cut link is silent, like dropped packets: a
live connection stops forwarding and discards what arrives, a new one is
accepted and never forwarded; both ends notice only through Raft's own
timeouts.  Healing closes the silenced connections, so the nodes reconnect on
clean streams.  Only Raft traffic is cut: client ports stay reachable (an
isolated leader still gets requests, and must not answer them with a block it
could not commit).  No root, nothing machine-wide, safe under xdist; the
proxies run in a daemon thread of the process that owns the cluster and end
with it.  The price: one extra loopback hop on Raft traffic, and a partition
nemesis only for clusters created with ``raft_proxy=True``.
"""
from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from quorum.client.leader import pick_leader
from quorum.client.quorum import QuorumClient, RetryPolicy
from quorum import config as quorum_config
from quorum.localcluster import LocalCluster
from records.wire.errors import NotControllerError

from .faultnode import FAULT_SYNC_DELAY_FILE

_log = logging.getLogger(__name__)


class NemesisError(Exception):
    """A fault could not be started or healed (no leader in time, no proxy for a partition, ...)."""


# --------------------------------------------------------------------------
# The network: one fault-injecting proxy per node's Raft port
# --------------------------------------------------------------------------


class _Link:
    """One proxied connection: ``connector`` (a node id, or None if unknown) -> ``listener``."""

    def __init__(self, connector: int | None, listener: int, client: asyncio.StreamWriter):
        self.connector = connector
        self.listener = listener
        self.writers = [client]
        self.silent = False

    def close(self) -> None:
        for w in self.writers:
            w.close()


class RaftNetwork:
    """Proxies on every node's advertised Raft address, forwarding to its ``raft_bind``.

    ``isolate(node)`` and ``partition(*groups)`` cut links; ``heal()`` restores
    them.  Use as a context manager, or ``start()`` and ``close()``.
    """

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self._routes: dict[int, tuple[str, str]] = {}  # node id -> (advertised, bound)
        self._cut: set[frozenset[int]] = set()
        self._links: set[_Link] = set()
        self._servers: list[asyncio.AbstractServer] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.unidentified = 0  # connections whose owner was not found (should stay 0)

    # -------------------------------------------------------------- lifecycle
    def start(self) -> "RaftNetwork":
        for n in self.cluster.nodes():
            cfg = quorum_config.load(self.cluster.config_path(n.node_id))
            if not cfg.raft_bind or cfg.raft_bind == cfg.raft_address:
                raise NemesisError(f"node {n.node_id} binds its advertised Raft address: create the cluster "
                                   "with LocalCluster.create(raft_proxy=True) to put a proxy in front of it")
            self._routes[n.node_id] = (cfg.raft_address, cfg.raft_bind)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="raft-network", daemon=True)
        self._thread.start()
        try:
            self._call(self._listen())
        except BaseException:
            self.close()
            raise
        return self

    async def _listen(self) -> None:
        for node_id, (advertised, _) in self._routes.items():
            host, port = advertised.rsplit(":", 1)
            server = await asyncio.start_server(lambda r, w, n=node_id: self._accept(n, r, w), host, int(port))
            self._servers.append(server)

    def close(self) -> None:
        if self._loop is None:
            return
        if self._loop.is_running():
            try:
                self._call(self._shutdown())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                if self._thread is not None:
                    self._thread.join(5)
        self._loop.close()
        self._loop = None

    async def _shutdown(self) -> None:
        for s in self._servers:
            s.close()
        self._servers.clear()
        for link in list(self._links):
            link.close()
        deadline = time.monotonic() + 1.0
        while self._links and time.monotonic() < deadline:  # let each connection's task end
            await asyncio.sleep(0.01)

    def __enter__(self) -> "RaftNetwork":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, coro, timeout: float = 10.0) -> Any:
        if self._loop is None:
            coro.close()
            raise NemesisError("the Raft network proxies are not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # ---------------------------------------------------------------- faults
    def isolate(self, node_id: int) -> None:
        """Cut every link between ``node_id`` and the other nodes, both directions."""
        self.partition({node_id}, set(self._routes) - {node_id})

    def partition(self, *groups: set[int]) -> None:
        """Cut every link between nodes of different groups (nodes in no group keep their links)."""
        pairs = {frozenset((a, b)) for i, g in enumerate(groups) for h in groups[i + 1:] for a in g for b in h}
        self._call(self._set_cut(self._cut | pairs))

    def heal(self) -> None:
        if self._loop is not None:
            self._call(self._set_cut(set()))

    @property
    def cut(self) -> set[frozenset[int]]:
        return set(self._cut)

    async def _set_cut(self, cut: set[frozenset[int]]) -> None:
        self._cut = cut
        for link in list(self._links):
            if self._is_cut(link):
                link.silent = True
            elif link.silent:
                link.close()  # a stream that lost bytes: the nodes reconnect on a clean one

    def _is_cut(self, link: _Link) -> bool:
        if link.connector is None:
            return any(link.listener in pair for pair in self._cut)
        return frozenset((link.connector, link.listener)) in self._cut

    # ---------------------------------------------------------------- proxying
    async def _accept(self, listener: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_port = writer.get_extra_info("peername")[1]
        own_port = writer.get_extra_info("sockname")[1]
        connector = _owner_node(peer_port, own_port, {n.node_id: n.pid for n in self.cluster.nodes() if n.pid})
        if connector is None:
            self.unidentified += 1
            _log.warning("raft proxy for node %d: cannot tell which node connected from port %d",
                         listener, peer_port)
        link = _Link(connector, listener, writer)
        self._links.add(link)
        try:
            if self._is_cut(link):
                link.silent = True
                await self._pump(link, reader, None)
                return
            host, port = self._routes[listener][1].rsplit(":", 1)
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2.0)
            except (OSError, asyncio.TimeoutError):
                return  # the node is down: the connector sees the connection close, as if refused
            link.writers.append(up_writer)
            await asyncio.gather(self._pump(link, reader, up_writer), self._pump(link, up_reader, writer))
        finally:
            self._links.discard(link)
            link.close()

    @staticmethod
    async def _pump(link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if link.silent or writer is None:
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            link.close()


def _owner_node(local_port: int, remote_port: int, pids: dict[int, int]) -> int | None:
    """The node whose process owns the loopback TCP socket local_port -> remote_port."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (int(fields[1].rsplit(":", 1)[1], 16) == local_port
                    and int(fields[2].rsplit(":", 1)[1], 16) == remote_port):
                inode = fields[9]
                break
        if inode is not None:
            break
    if inode is None or inode == "0":
        return None
    target = f"socket:[{inode}]"
    for node_id, pid in pids.items():
        fd_dir = f"/proc/{pid}/fd"
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink(os.path.join(fd_dir, fd)) == target:
                        return node_id
                except OSError:
                    continue
        except OSError:
            continue
    return None


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


class KillLeader(Nemesis):
    """kill -9 the leader (whatever it is doing); stop restarts it."""

    name = "kill-leader"

    def __init__(self) -> None:
        self.node: int | None = None

    async def start(self, ctx: NemesisContext) -> dict:
        self.node = await _leader_or_none(ctx)
        if self.node is None:
            return {"node": None, "skipped": "no leader"}
        await ctx.kill(self.node)
        ctx.note("nemesis: killed leader node %d", self.node)
        return {"node": self.node}

    async def stop(self, ctx: NemesisContext) -> dict:
        node, self.node = self.node, None
        if node is not None:
            await ctx.start(node)
            ctx.note("nemesis: restarted node %d", node)
        return {"node": node}


class PauseLeader(Nemesis):
    """SIGSTOP the leader; stop sends SIGCONT (it wakes up believing it still leads)."""

    name = "pause-leader"

    def __init__(self) -> None:
        self.node: int | None = None

    async def start(self, ctx: NemesisContext) -> dict:
        self.node = await _leader_or_none(ctx)
        if self.node is None:
            return {"node": None, "skipped": "no leader"}
        await ctx.signal(self.node, signal.SIGSTOP)
        ctx.note("nemesis: paused leader node %d", self.node)
        return {"node": self.node}

    async def stop(self, ctx: NemesisContext) -> dict:
        node, self.node = self.node, None
        if node is not None:
            await ctx.signal(node, signal.SIGCONT)
            ctx.note("nemesis: resumed node %d", node)
        return {"node": node}


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
    reachable); stop heals.  Needs ``ctx.network`` (see the module docstring)."""

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
