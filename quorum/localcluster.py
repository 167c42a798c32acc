"""A local N-node quorum in one directory: the embedded default of ``pidctl cluster``,
and the harness the integration tests and benchmarks use.

Layout of ``DIR``::

    cluster.json          nodes, addresses, pids (the only processes ever signalled)
    secret                cluster secret (mode 0600), generated once
    node-N.toml           each node's config
    node-N/               data dir: raft.journal(.meta), raft.snapshot, audit.log
    node-N.log            the node's log

Nothing in it is for other users: the directory is created 0700, the files ``pidctl`` writes are 0600,
and the nodes run with umask 077 (their data and ready files: 0600 / 0700).  Its client ports accept
unauthenticated requests on 127.0.0.1 (``UNAUTHENTICATED_NOTICE``): a cluster for development on one
machine (a deployment: docs/deployment.md).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from snapshots.storage.disk import EXIT_UNAVAILABLE

from .config import NodeConfig, Peer
from .config import load as load_config
from .config import to_toml
from .identity import new_cluster_id
from .raft import RaftConfig

STATE_FILE = "cluster.json"
DEFAULT_NODE_COMMAND = ("-m", "quorum")
BIND_ATTEMPTS = 3  # how many times ``up`` creates a new cluster whose node found a port taken
UNAUTHENTICATED_NOTICE = ("for development on one machine only: its client ports accept unauthenticated "
                          "requests (ACL, quota and broker changes) from anyone on 127.0.0.1; to deploy, see "
                          "docs/deployment.md")
"""What ``pidctl cluster up`` says of the default cluster (no SASL, no TLS)."""


class ClusterError(Exception):
    pass


def write_private(path: str, text: str) -> None:
    """Replace ``path`` with ``text``, mode 0600 (also when it existed with another mode)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free TCP ports (held open together while picking, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class NodeInfo:
    node_id: int
    raft_address: str
    client_address: str
    pid: int | None = None
    metrics_address: str | None = None  # host:port of /metrics, if the cluster was created with metrics
    removed: bool = False  # removed from the Raft membership (pidctl quorum remove-node)


class LocalCluster:
    def __init__(self, directory: str):
        self.dir = os.path.abspath(directory)

    # ----------------------------------------------------------------- state
    @property
    def state_path(self) -> str:
        return os.path.join(self.dir, STATE_FILE)

    def exists(self) -> bool:
        return os.path.exists(self.state_path)

    def load(self) -> dict:
        try:
            with open(self.state_path) as f:
                return json.load(f)
        except FileNotFoundError:
            raise ClusterError(f"no cluster in {self.dir} (run 'pidctl cluster up')") from None

    def _save(self, state: dict) -> None:
        tmp = self.state_path + ".tmp"
        write_private(tmp, json.dumps(state, indent=2))
        os.replace(tmp, self.state_path)

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(**n) for n in self.load()["nodes"]]

    def client_addresses(self) -> list[str]:
        return [n.client_address for n in self.nodes() if not n.removed]

    def config_path(self, node_id: int) -> str:
        return os.path.join(self.dir, f"node-{node_id}.toml")

    def data_dir(self, node_id: int) -> str:
        return os.path.join(self.dir, f"node-{node_id}")

    def log_path(self, node_id: int) -> str:
        return os.path.join(self.dir, f"node-{node_id}.log")

    # ---------------------------------------------------------------- create
    def create(self, size: int = 3, host: str = "127.0.0.1", block_size: int = 1000,
               raft: RaftConfig | None = None, raft_proxy: bool = False, metrics: bool = False,
               node_command: list[str] | None = None, **node_options) -> None:
        """Write configs and a secret for a new cluster (no processes started).

        ``raft_proxy``: each node binds its Raft port on a port of its own
        (``raft_bind``) and advertises another (``raft_address``), where a proxy
        must forward to it: the nodes cannot reach each other until one does
        (``chaos.nemesis.RaftNetwork``, which cuts links to make partitions).
        ``metrics``: each node serves Prometheus metrics on a free port of ``host``
        (``NodeInfo.metrics_address``).
        ``node_command``: what runs a node, after the interpreter (default ``-m quorum``); chaos runs
        and benchmarks use ``-m chaos.faultnode`` for a disk they can slow down.
        """
        if self.exists():
            self._make_private()  # a cluster made before its files were
            return
        os.makedirs(self.dir, mode=0o700, exist_ok=True)  # an existing directory keeps its mode: each file is 0600
        secret_path = os.path.join(self.dir, "secret")
        if not os.path.exists(secret_path):
            fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
        node_options.setdefault("cluster_id", new_cluster_id())
        base = 3 * size if raft_proxy else 2 * size
        ports = free_ports(base + (size if metrics else 0), host)
        infos = [NodeInfo(i + 1, f"{host}:{ports[2 * i]}", f"{host}:{ports[2 * i + 1]}") for i in range(size)]
        metrics_ports = ports[base:]
        for info in infos:
            if raft_proxy:
                node_options["raft_bind"] = f"{host}:{ports[2 * size + info.node_id - 1]}"
            if metrics:
                node_options.update(metrics_host=host, metrics_port=metrics_ports[info.node_id - 1])
                info.metrics_address = f"{host}:{metrics_ports[info.node_id - 1]}"
            cfg = NodeConfig(node_id=info.node_id, data_dir=f"node-{info.node_id}", raft_address=info.raft_address,
                             client_address=info.client_address, secret="unused",
                             peers=[Peer(o.node_id, o.raft_address, o.client_address) for o in infos if o is not info],
                             block_size=block_size, raft=raft or RaftConfig(), **node_options)
            write_private(self.config_path(info.node_id), to_toml(cfg, "secret"))
        self._save({"nodes": [vars(i) for i in infos], "node_command": list(node_command or DEFAULT_NODE_COMMAND)})

    def _make_private(self) -> None:
        """Mode 0600 for the files ``pidctl`` wrote (configs, logs, the state file, the secret)."""
        paths = [self.state_path, os.path.join(self.dir, "secret")]
        for n in self.load()["nodes"]:
            paths += [self.config_path(n["node_id"]), self.log_path(n["node_id"])]
        for path in paths:
            try:
                if os.stat(path).st_mode & 0o077:
                    os.chmod(path, 0o600)
            except FileNotFoundError:
                pass

    def add_node_config(self, host: str = "127.0.0.1") -> NodeInfo:
        """Write the config of a new node (next id, free ports, empty data dir) whose peers are the
        nodes not marked removed, with the settings of an existing node's config.  Not started, and
        not a member until ``pidctl quorum add-node``."""
        state = self.load()
        members = [NodeInfo(**n) for n in state["nodes"] if not n.get("removed")]
        template = load_config(self.config_path(members[0].node_id))
        node_id = max(n["node_id"] for n in state["nodes"]) + 1
        raft_port, client_port = free_ports(2, host)
        info = NodeInfo(node_id, f"{host}:{raft_port}", f"{host}:{client_port}")
        template.node_id, template.data_dir = node_id, f"node-{node_id}"
        template.raft_address, template.client_address = info.raft_address, info.client_address
        template.raft_bind = template.client_bind = None
        template.peers = [Peer(o.node_id, o.raft_address, o.client_address) for o in members]
        write_private(self.config_path(node_id), to_toml(template, "secret"))
        state["nodes"].append(vars(info))
        self._save(state)
        return info

    def mark_removed(self, node_id: int) -> None:
        state = self.load()
        for n in state["nodes"]:
            if n["node_id"] == node_id:
                n["removed"] = True
        self._save(state)

    # ------------------------------------------------------------- processes
    def start(self, node_id: int, env: dict | None = None, command: list[str] | None = None) -> int:
        """Start node ``node_id``; ``command`` runs it instead of the cluster's node command this time (another
        version of the node, for a rolling upgrade)."""
        state = self.load()
        node = next((n for n in state["nodes"] if n["node_id"] == node_id), None)
        if node is None:
            raise ClusterError(f"no node {node_id}")
        if node.get("pid") and _alive(node["pid"], getattr(self, "_procs", {})):
            if self._our_pid(node_id):
                return node["pid"]
            # Alive but no longer readable as our node: it is dying (after kill -9 its cmdline reads
            # empty before it exits).  Wait for it: starting now would find the stale ready file and
            # "start" nothing.
            self._wait_exit(node["pid"], 10.0)
        ready = os.path.join(self.dir, f"node-{node_id}.ready")
        if os.path.exists(ready):
            os.unlink(ready)
        logf = os.fdopen(os.open(self.log_path(node_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        command = command or state.get("node_command") or DEFAULT_NODE_COMMAND
        proc = subprocess.Popen(
            [sys.executable, *command, "--config", self.config_path(node_id), "--ready-file", ready],
            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir,
            env={**os.environ, **(env or {})}, start_new_session=True, umask=0o077)
        logf.close()
        node["pid"] = proc.pid
        self._save(state)
        self._procs = getattr(self, "_procs", {})
        self._procs[proc.pid] = proc
        return proc.pid

    def wait_ready(self, node_ids: list[int] | None = None, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for n in self.nodes():
            if node_ids is not None and n.node_id not in node_ids:
                continue
            ready = os.path.join(self.dir, f"node-{n.node_id}.ready")
            while not os.path.exists(ready):
                if n.pid is None or not _alive(n.pid, getattr(self, "_procs", {})):
                    raise ClusterError(f"node {n.node_id} exited during start-up; see {self.log_path(n.node_id)}:\n"
                                       + self.tail_log(n.node_id))
                if time.monotonic() > deadline:
                    raise ClusterError(f"node {n.node_id} not ready within {timeout:.0f}s")
                time.sleep(0.02)

    def up(self, size: int = 3, timeout: float = 30.0, env: dict | None = None,
           commands: dict[int, list[str]] | None = None, **create_options) -> None:
        """Create the cluster if there is none, start its nodes and wait until they are ready.

        ``commands``: node id -> what runs that node instead of the cluster's node command.
        When ``up`` fails, it stops the nodes it started before it raises.  When it created the
        cluster itself and a node could not bind a port (``free_ports`` releases the ports it picks,
        and another process can take one before the node binds it), it discards the new cluster,
        which has issued nothing (no node applied a record: every audit trail is empty), and creates it
        again on other ports, up to ``BIND_ATTEMPTS`` times.  A cluster whose nodes applied anything (a
        client found it through ``cluster.json`` while it started) is never discarded: a new one would
        issue its blocks again."""
        fresh = not self.exists()
        for attempt in range(1, BIND_ATTEMPTS + 1):
            self.create(size=size, **create_options)
            running = {n.node_id for n in self.nodes() if self._our_pid(n.node_id)}
            try:
                for n in self.nodes():
                    self.start(n.node_id, env=env, command=(commands or {}).get(n.node_id))
                self.wait_ready(timeout=timeout)
                return
            except BaseException as e:
                retry = (fresh and attempt < BIND_ATTEMPTS and isinstance(e, ClusterError)
                         and self._port_taken())
                for n in self.nodes():
                    if n.node_id not in running:
                        self.stop(n.node_id, timeout=5.0)
                if not (retry and self._issued_nothing()):
                    raise
                self._discard()

    def _port_taken(self) -> bool:
        """Whether a node of this cluster exited because a port it was to bind was taken."""
        for n in self.nodes():
            proc = getattr(self, "_procs", {}).get(n.pid)
            if proc is not None and proc.poll() == EXIT_UNAVAILABLE:
                tail = self.tail_log(n.node_id).lower()
                if "cannot bind" in tail or "address already in use" in tail:
                    return True
        return False

    def _issued_nothing(self) -> bool:
        """No node applied a record (read with the nodes stopped: a node writes an entry's audit line
        before it answers the entry's requests)."""
        return all(not os.path.getsize(path) for n in self.nodes()
                   if os.path.exists(path := os.path.join(self.data_dir(n.node_id), "audit.log")))

    def _discard(self) -> None:
        """Remove what ``create`` wrote for the nodes (configs, data, logs, the state file); the secret
        stays.  Only for a cluster ``up`` has just created, whose nodes are stopped."""
        for n in self.nodes():
            for path in (self.config_path(n.node_id), self.log_path(n.node_id),
                         os.path.join(self.dir, f"node-{n.node_id}.ready")):
                if os.path.exists(path):
                    os.unlink(path)
            shutil.rmtree(self.data_dir(n.node_id), ignore_errors=True)
        os.unlink(self.state_path)

    def _our_pid(self, node_id: int) -> int | None:
        """The node's pid if that process is alive and is our node (never a recycled pid)."""
        pid = next((n.pid for n in self.nodes() if n.node_id == node_id), None)
        if not pid or not _alive(pid, getattr(self, "_procs", {})):
            return None
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:
            return None
        if pid in getattr(self, "_procs", {}):
            # A child this object started and has not reaped: the pid is not recycled.  Until its exec it
            # reads as this process's command line (on a loaded machine, for a while); it reads empty only
            # while it dies.
            return pid if raw else None
        return pid if self.config_path(node_id).encode() in raw.split(b"\0") else None

    def signal(self, node_id: int, sig: int) -> None:
        pid = self._our_pid(node_id)
        if pid:
            os.kill(pid, sig)

    def kill(self, node_id: int) -> None:
        """kill -9, and wait until the process is gone (also one already signalled, whose cmdline
        reads empty while it dies)."""
        pid = self._our_pid(node_id)
        if pid:
            os.kill(pid, signal.SIGKILL)
        recorded = next((n.pid for n in self.nodes() if n.node_id == node_id), None)
        if recorded:
            self._wait_exit(recorded, 10.0)

    def stop(self, node_id: int, timeout: float = 10.0) -> None:
        pid = self._our_pid(node_id)
        if pid:
            os.kill(pid, signal.SIGTERM)
            if not self._wait_exit(pid, timeout):
                os.kill(pid, signal.SIGKILL)
                self._wait_exit(pid, 5.0)

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while _alive(pid, getattr(self, "_procs", {})):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def down(self, timeout: float = 10.0) -> None:
        if not self.exists():
            return
        for n in self.nodes():
            self.stop(n.node_id, timeout)
        state = self.load()
        for n in state["nodes"]:
            n["pid"] = None
        self._save(state)

    def alive(self, node_id: int) -> bool:
        return self._our_pid(node_id) is not None

    def running(self) -> bool:
        """Every member (a node not removed) is running as our process."""
        return all(self.alive(n.node_id) for n in self.nodes() if not n.removed)

    # -------------------------------------------------------------- settings
    def settings(self) -> dict:
        """What the cluster was created with, read from its files: ``nodes`` (members, not removed),
        ``block_size`` (node 1's config, as every node's) and ``metrics`` (whether its nodes serve
        /metrics).  ``create`` never changes an existing cluster: these hold until ``reset``."""
        members = [n for n in self.nodes() if not n.removed]
        if not members:
            raise ClusterError(f"the cluster in {self.dir} has no members left")
        cfg = load_config(self.config_path(members[0].node_id))
        return {"nodes": len(members), "block_size": cfg.block_size,
                "metrics": any(n.metrics_address for n in members)}

    def differences(self, **wanted) -> list[str]:
        """``wanted`` settings (keys of ``settings``) the existing cluster does not have, each as
        "KEY: HAS (asked WANTED)"; empty when there is no cluster yet."""
        if not self.exists():
            return []
        have = self.settings()
        unknown = set(wanted) - set(have)
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}")
        return [f"{k.replace('_', ' ')} {_setting(have[k])} (asked {_setting(v)})"
                for k, v in wanted.items() if have[k] != v]

    def reset(self, timeout: float = 10.0) -> list[str]:
        """Stop the nodes (by the pids in ``cluster.json``, only processes that are our nodes) and delete
        what the cluster wrote: the state file, the secret, each node's config, log, ready file and data
        directory; then the directory itself when nothing else is in it.  Returns the names left in it
        (files the cluster did not write are never deleted).  Everything it issued is gone: a new cluster
        here starts again at producer ID 0."""
        if not self.exists():
            raise ClusterError(f"no cluster in {self.dir}")
        nodes = self.nodes()
        for n in nodes:
            self.stop(n.node_id, timeout)
        still = [n.node_id for n in nodes if self.alive(n.node_id)]
        if still:
            raise ClusterError(f"node(s) {', '.join(map(str, still))} did not stop; nothing deleted")
        for n in nodes:
            for path in (self.config_path(n.node_id), self.log_path(n.node_id),
                         os.path.join(self.dir, f"node-{n.node_id}.ready")):
                if os.path.exists(path):
                    os.unlink(path)
            shutil.rmtree(self.data_dir(n.node_id), ignore_errors=True)
        # The nodes run in this directory, and a library they import (kio, through hypothesis) writes
        # .hypothesis/ into the working directory.
        shutil.rmtree(os.path.join(self.dir, ".hypothesis"), ignore_errors=True)
        for name in ("secret", STATE_FILE + ".tmp", STATE_FILE):  # the state file last: it names the rest
            path = os.path.join(self.dir, name)
            if os.path.exists(path):
                os.unlink(path)
        left = sorted(os.listdir(self.dir))
        if not left:
            os.rmdir(self.dir)
        return left

    def tail_log(self, node_id: int, lines: int = 30) -> str:
        try:
            with open(self.log_path(node_id), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except FileNotFoundError:
            return ""


def _setting(v) -> str:
    return ("on" if v else "off") if isinstance(v, bool) else str(v)


def pid_exists(pid: int) -> bool:
    """A process with this id exists (``kill(pid, 0)``; another user's, or a zombie, too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _alive(pid: int, procs: dict | None = None) -> bool:
    proc = (procs or {}).get(pid)
    if proc is not None:
        return proc.poll() is None
    if not pid_exists(pid):
        return False
    # A zombie of ours that nobody reaped still answers kill(0).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
