"""The three systems ``pidctl bench`` compares, each as a three-node cluster on 127.0.0.1.

* ``pidquorum``: ``quorum.localcluster.LocalCluster`` (journal fdatasync on, the default).
* ``zookeeper``: Debian's ``zookeeper`` package (3.8), three JVMs forming an ensemble, with the
  package's own timing (tickTime 2000, initLimit 10, syncLimit 5) and fsync on as shipped
  (``forceSync`` left at its default, yes).  Set-up traps avoided: the admin server is off (it binds
  0.0.0.0:8080), ``clientPortAddress=127.0.0.1``, each JVM gets ``-Xmx512m``, the ``srvr``/``mntr``/
  ``ruok`` four-letter words are whitelisted, and every node has its own dataDir.
* ``etcd``: Debian's ``etcd-server`` package (3.4), three members, default timing (heartbeat 100 ms,
  election 1000 ms) and fsync on as shipped.

Every cluster lives in its own temporary directory, on free ports, and its processes are ours: they
are killed by PID (never by name) when the cluster is stopped.  ``leader()`` asks the nodes who leads
(DescribeState; ``srvr``; the v3 maintenance status); ``kill(i)`` is SIGKILL; ``restart(i)`` starts
the node again on the same data and waits until it serves.

A peer whose Debian package is missing is *missing*, not faked: ``missing_reason()`` says so and how to
install it; ``install_packages()`` runs apt-get (``pidctl bench --install-peers``).
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import http.client
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from importlib.metadata import version

from benchmarks.provision import AptUnavailable, ensure_installed
from quorum.config import NodeConfig
from quorum.localcluster import LocalCluster, free_ports
from quorum.raft import RaftConfig

from . import zookeeper
from .common import describe_all, find_leader
from .processes import HOST, log_tail, spawn, stop_process, wait_port

ETCD_BIN = "/usr/bin/etcd"
PACKAGES = {"zookeeper": zookeeper.PACKAGE, "etcd": "etcd-server"}
SYSTEMS = ("pidquorum", "zookeeper", "etcd")
APT_TIMEOUT = 900.0
RESERVE_BLOCKS = 0  # the node default (no reserve): the bench measures the default configuration


class SystemUnavailable(Exception):
    """A peer cannot be run here (package missing and not installed)."""


# ------------------------------------------------------------------ packages
def _installed(system: str) -> bool:
    if system == "pidquorum":
        return True
    if system == "zookeeper":
        return zookeeper.installed()
    if system == "etcd":
        return os.path.isfile(ETCD_BIN) or shutil.which("etcd") is not None
    raise ValueError(f"unknown system {system!r}")


def missing_reason(system: str) -> str | None:
    """None when ``system`` can run here; otherwise what is missing and how to install it."""
    if _installed(system):
        return None
    pkg = PACKAGES[system]
    return (f"{system} is not installed (Debian package {pkg!r}): run `apt-get install --no-install-recommends "
            f"{pkg}` or `pidctl bench --install-peers`")


def install_packages(systems, say=print) -> dict[str, str]:
    """apt-get install the Debian packages of the missing ``systems`` (``benchmarks.provision``: root or
    passwordless sudo).  Returns {system: problem} for those that could not be installed."""
    problems: dict[str, str] = {}
    for s in systems:
        if s == "pidquorum":
            continue
        try:
            ensure_installed(PACKAGES[s], lambda s=s: _installed(s), timeout=APT_TIMEOUT, say=lambda m: say(f"{m} ..."))
        except AptUnavailable as e:
            problems[s] = str(e)
    return problems


def package_version(system: str) -> str | None:
    pkg = PACKAGES.get(system)
    if pkg is None:
        try:
            return version("pidquorum")
        except Exception:  # noqa: BLE001
            return None
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


class _Processes:
    """Our own child processes, one per node; killed by PID."""

    def __init__(self):
        self.procs: dict[int, subprocess.Popen] = {}

    def spawn(self, i: int, cmd: list[str], log_path: str, cwd: str, env: dict | None = None) -> None:
        self.add(i, spawn(cmd, log_path, cwd, env))  # dies with us, even if we crash

    def add(self, i: int, proc: subprocess.Popen) -> None:
        self.procs[i] = proc

    def alive(self, i: int) -> bool:
        p = self.procs.get(i)
        return p is not None and p.poll() is None

    def kill(self, i: int, sig: int = signal.SIGKILL, wait: float = 10.0) -> None:
        stop_process(self.procs.get(i), sig, wait)  # setpriv execs the server: same PID

    def stop_all(self) -> None:
        for i in list(self.procs):
            self.kill(i, signal.SIGTERM)


# ------------------------------------------------------------------ systems
class System:
    name = ""
    nodes = 3

    def __init__(self, keep: bool = False):
        self.keep = keep
        self.dir = tempfile.mkdtemp(prefix=f"pidctl-bench-{self.name}-")

    def start(self) -> None:
        raise NotImplementedError

    def endpoints(self) -> str:
        """What a worker process needs to connect (comma-separated addresses)."""
        raise NotImplementedError

    def leader(self, timeout: float = 30.0) -> int:
        """Index (0-based) of the node that leads now."""
        raise NotImplementedError

    def kill(self, i: int) -> None:
        raise NotImplementedError

    def restart(self, i: int, timeout: float = 60.0) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def settings(self) -> dict:
        return {}

    def node_pids(self) -> list[int]:
        """The PIDs of the running nodes (their CPU is the cluster's cost)."""
        return []

    def raft_counts(self) -> dict[int, tuple[int, int]] | None:
        """Per node: (Raft term, leader changes it saw), where the system tells them; None elsewhere."""
        return None

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if not self.keep:
                shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()


class PidquorumSystem(System):
    name = "pidquorum"

    def __init__(self, keep: bool = False, **options):
        super().__init__(keep)
        # Rate limit off (as in benchmarks.quorum_phases): the bench asks for blocks as fast as it can.  The
        # leader-side reserve as asked (NodeConfig.allocate_reserve_blocks; the node default is off).
        self.options = {"allocate_rate_per_broker": 0, "allocate_reserve_blocks": RESERVE_BLOCKS, **options}
        self.lc = LocalCluster(os.path.join(self.dir, "cluster"))

    def start(self) -> None:
        self.lc.up(3, host=HOST, timeout=60, **self.options)
        self.leader()

    def endpoints(self) -> str:
        return ",".join(self.lc.client_addresses())

    def leader(self, timeout: float = 30.0) -> int:
        nid, _, _ = asyncio.run(find_leader(self.lc, timeout))
        return [n.node_id for n in self.lc.nodes()].index(nid)

    def _id(self, i: int) -> int:
        return self.lc.nodes()[i].node_id

    def kill(self, i: int) -> None:
        self.lc.kill(self._id(i))

    def restart(self, i: int, timeout: float = 60.0) -> None:
        self.lc.start(self._id(i))
        self.lc.wait_ready([self._id(i)], timeout)

    def stop(self) -> None:
        if self.lc.exists():
            self.lc.down(timeout=10)

    def node_pids(self) -> list[int]:
        return [n.pid for n in self.lc.nodes() if n.pid and self.lc.alive(n.node_id)]

    def raft_counts(self) -> dict[int, tuple[int, int]] | None:
        return {nid: (d["raft"]["term"], d["raft"]["leader_changes"])
                for nid, d in asyncio.run(describe_all(self.lc)).items()}

    def differing(self) -> dict:
        """The options that differ from a node's defaults (``NodeConfig``)."""
        defaults = {f.name: f.default for f in dataclasses.fields(NodeConfig)}
        return {k: v for k, v in self.options.items() if defaults.get(k) != v}

    def settings(self) -> dict:
        return {"journal": "fdatasync before any message leaves a node", "options": self.options,
                "differing_from_defaults": self.differing(),
                "raft": dataclasses.asdict(RaftConfig())}


class _PeerSystem(System):
    """A peer run as three server processes (``_spawn(i)``, ``_wait_serving``) on ``client_ports``, its
    leader the live node for which ``_is_leader(i)`` holds."""
    title = ""  # as messages name the system
    start_timeout = 60.0
    client_ports: list[int]

    def _peer_init(self, keep: bool, n_ports: int) -> list[int]:
        """``System.__init__``, then SystemUnavailable if the peer is not installed; ``n_ports`` free
        ports, the first three the client ports."""
        super().__init__(keep)
        reason = missing_reason(self.name)
        if reason:
            raise SystemUnavailable(reason)
        ports = free_ports(n_ports)
        self.client_ports = ports[0:3]
        self.procs = _Processes()
        return ports

    def _spawn(self, i: int) -> None:
        raise NotImplementedError

    def _wait_serving(self, nodes, timeout: float) -> None:
        raise NotImplementedError

    def start(self) -> None:
        for i in range(self.nodes):
            self._spawn(i)
        self._wait_serving(range(self.nodes), self.start_timeout)

    def endpoints(self) -> str:
        return ",".join(f"{HOST}:{p}" for p in self.client_ports)

    def _is_leader(self, i: int) -> bool:
        raise NotImplementedError

    def leader(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            for i in range(self.nodes):
                if self.procs.alive(i) and self._is_leader(i):
                    return i
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {self.title} leader within {timeout:.0f}s")
            time.sleep(0.02)

    def kill(self, i: int) -> None:
        self.procs.kill(i)

    def restart(self, i: int, timeout: float = 60.0) -> None:
        self._spawn(i)
        self._wait_serving([i], timeout)

    def stop(self) -> None:
        self.procs.stop_all()

    def node_pids(self) -> list[int]:
        return [p.pid for p in self.procs.procs.values() if p.poll() is None]


class ZooKeeperSystem(_PeerSystem):
    """A three-server ZooKeeper ensemble (QuorumPeerMain) from Debian's package."""

    name = "zookeeper"
    title = "ZooKeeper"
    start_timeout = 90.0
    # Debian's /etc/zookeeper/conf/zoo.cfg as shipped; fsync (forceSync) left at its default: on.
    TIMING = {"tickTime": 2000, "initLimit": 10, "syncLimit": 5}
    HEAP = "-Xmx512m"

    def __init__(self, keep: bool = False):
        ports = self._peer_init(keep, 9)
        self.quorum_ports = ports[3:6]
        self.election_ports = ports[6:9]
        peers = list(zip(self.quorum_ports, self.election_ports))
        self.servers = [zookeeper.ZooKeeperServer(self._node_dir(i), self.client_ports[i], settings=self.TIMING,
                                                  peers=peers, myid=i + 1, heap=self.HEAP,
                                                  name=f"ZooKeeper node {i + 1}")
                        for i in range(3)]

    def _node_dir(self, i: int) -> str:
        return os.path.join(self.dir, f"zk-{i + 1}")

    def _spawn(self, i: int) -> None:
        self.procs.add(i, self.servers[i].launch())

    def _mode(self, i: int) -> str | None:
        try:
            out = zookeeper.four_letter(self.client_ports[i], "srvr", timeout=1.0)
        except OSError:
            return None
        for line in out.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def _wait_serving(self, nodes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for i in nodes:
            self.servers[i].wait_port(deadline)
            while self._mode(i) not in ("leader", "follower"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ZooKeeper node {i + 1} not in the ensemble after {timeout:.0f}s:\n"
                                       + self.servers[i].log_tail(20))
                time.sleep(0.05)

    def _is_leader(self, i: int) -> bool:
        return self._mode(i) == "leader"

    def settings(self) -> dict:
        return {**self.TIMING, "forceSync": "yes (default)", "jvm_heap": self.HEAP, "admin_server": False,
                "client": "kazoo, quorum.migration.zk.LegacyAllocator (Kafka's conditional setData loop)"}


class EtcdSystem(_PeerSystem):
    """A three-member etcd cluster from Debian's etcd-server package."""

    name = "etcd"
    title = "etcd"

    def __init__(self, keep: bool = False):
        self.peer_ports = self._peer_init(keep, 6)[3:6]
        self.token = f"pidctl-bench-{os.getpid()}-{int(time.time())}"

    def _node_dir(self, i: int) -> str:
        return os.path.join(self.dir, f"etcd-{i + 1}")

    def _command(self, i: int) -> list[str]:
        cluster = ",".join(f"n{j + 1}=http://{HOST}:{self.peer_ports[j]}" for j in range(3))
        return [shutil.which("etcd") or ETCD_BIN, "--name", f"n{i + 1}", "--data-dir", os.path.join(self._node_dir(i), "data"),
                "--listen-client-urls", f"http://{HOST}:{self.client_ports[i]}",
                "--advertise-client-urls", f"http://{HOST}:{self.client_ports[i]}",
                "--listen-peer-urls", f"http://{HOST}:{self.peer_ports[i]}",
                "--initial-advertise-peer-urls", f"http://{HOST}:{self.peer_ports[i]}",
                "--initial-cluster", cluster, "--initial-cluster-token", self.token,
                "--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn"]

    def _spawn(self, i: int) -> None:
        os.makedirs(self._node_dir(i), exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        self.procs.spawn(i, self._command(i), os.path.join(self._node_dir(i), "etcd.log"), self._node_dir(i), env)

    def status(self, i: int, timeout: float = 1.0) -> dict | None:
        try:
            return etcd_post(f"{HOST}:{self.client_ports[i]}", "/v3/maintenance/status", {}, timeout)
        except (OSError, http.client.HTTPException, ValueError):
            return None

    def _wait_serving(self, nodes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for i in nodes:
            wait_port(HOST, self.client_ports[i], deadline, self.procs.procs[i], f"etcd member {i + 1}",
                      os.path.join(self._node_dir(i), "etcd.log"))
            while True:
                st = self.status(i)
                if st and st.get("leader") not in (None, "0"):
                    try:  # a linearizable read: the member is in a cluster with a leader
                        etcd_post(f"{HOST}:{self.client_ports[i]}", "/v3/kv/range", {"key": _b64(b"/")}, 2.0)
                        break
                    except (OSError, http.client.HTTPException, ValueError):
                        pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd member {i + 1} not serving after {timeout:.0f}s:\n"
                                       + log_tail(os.path.join(self._node_dir(i), "etcd.log")))
                time.sleep(0.05)

    def _is_leader(self, i: int) -> bool:
        st = self.status(i)
        return bool(st) and st.get("header", {}).get("member_id") == st.get("leader")

    def settings(self) -> dict:
        return {"heartbeat_ms": 100, "election_ms": 1000, "fsync": "on (default)",
                "client": "v3 JSON gateway over HTTP/1.1 keep-alive: Txn compare mod_revision, put"}


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def etcd_post(address: str, path: str, body: dict, timeout: float, conn: http.client.HTTPConnection | None = None):
    """POST a v3 gateway call; one-off connection unless ``conn`` is given."""
    own = conn is None
    if own:
        host, port = address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise ValueError(f"etcd {path}: HTTP {resp.status}: {data[:200]!r}")
        return json.loads(data)
    finally:
        if own:
            conn.close()


def make_system(name: str, keep: bool = False, reserve_blocks: int = RESERVE_BLOCKS) -> System:
    if name == "pidquorum":
        return PidquorumSystem(keep, allocate_reserve_blocks=reserve_blocks)
    if name == "zookeeper":
        return ZooKeeperSystem(keep)
    if name == "etcd":
        return EtcdSystem(keep)
    raise ValueError(f"unknown system {name!r} (known: {', '.join(SYSTEMS)})")
