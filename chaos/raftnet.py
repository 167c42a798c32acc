"""The partition of chaos runs on real processes: a TCP proxy in front of each node's Raft port
(``RaftNetwork``) that cuts links between nodes, silently, and heals them.  docs/simulation.md
("The partition nemesis") says why a proxy and not firewall rules or namespaces."""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any

from quorum import config as quorum_config
from quorum.localcluster import LocalCluster

_log = logging.getLogger(__name__)


class NemesisError(Exception):
    """A fault could not be started or healed (no leader in time, no proxy for a partition, ...)."""


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


__all__ = ["NemesisError", "RaftNetwork"]
