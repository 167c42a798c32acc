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
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from quorum.localcluster import LocalCluster, free_ports

HOST = "127.0.0.1"
ZK_JAR = "/usr/share/java/zookeeper.jar"
ZK_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
ZK_LOG_JARS = ("/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar")
ETCD_BIN = "/usr/bin/etcd"
PACKAGES = {"zookeeper": "zookeeper", "etcd": "etcd-server"}
SYSTEMS = ("pidquorum", "zookeeper", "etcd")
APT_TIMEOUT = 900.0
RESERVE_BLOCKS = 32


class SystemUnavailable(Exception):
    """A peer cannot be run here (package missing and not installed)."""


# ------------------------------------------------------------------ packages
def _installed(system: str) -> bool:
    if system == "pidquorum":
        return True
    if system == "zookeeper":
        return os.path.isfile(ZK_JAR) and shutil.which("java") is not None
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
    """apt-get install the Debian packages of the missing ``systems`` (root or passwordless sudo).

    Returns {system: problem} for those that could not be installed."""
    problems: dict[str, str] = {}
    missing = [s for s in systems if s != "pidquorum" and not _installed(s)]
    if not missing:
        return problems
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        prefix = ["sudo", "-n", "--preserve-env=DEBIAN_FRONTEND"]
    else:
        return {s: "installing needs root or passwordless sudo" for s in missing}
    if shutil.which("apt-get") is None:
        return {s: "no apt-get on this machine" for s in missing}
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    pkgs = [PACKAGES[s] for s in missing]

    def apt(args):
        return subprocess.run(prefix + ["apt-get", "-o", "DPkg::Lock::Timeout=300", *args], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=APT_TIMEOUT)

    say(f"installing {', '.join(pkgs)} with apt-get ...")
    try:
        done = apt(["install", "-y", "--no-install-recommends", *pkgs])
        if done.returncode != 0:  # most often no package index yet
            apt(["update"])
            done = apt(["install", "-y", "--no-install-recommends", *pkgs])
    except subprocess.TimeoutExpired:
        return {s: f"apt-get did not finish within {APT_TIMEOUT:.0f}s" for s in missing}
    tail = " | ".join(done.stdout.strip().splitlines()[-3:])
    for s in missing:
        if not _installed(s):
            problems[s] = f"apt-get install {PACKAGES[s]} failed (exit {done.returncode}): {tail}"
    return problems


def package_version(system: str) -> str | None:
    pkg = PACKAGES.get(system)
    if pkg is None:
        try:
            from importlib.metadata import version
            return version("pidquorum")
        except Exception:  # noqa: BLE001
            return None
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _wait_port(port: int, deadline: float, proc: subprocess.Popen, what: str, log_path: str) -> None:
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting:\n{_tail(log_path)}")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} does not listen on {HOST}:{port}:\n{_tail(log_path)}")
        time.sleep(0.05)


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


class _Processes:
    """Our own child processes, one per node; killed by PID."""

    def __init__(self):
        self.procs: dict[int, subprocess.Popen] = {}

    def spawn(self, i: int, cmd: list[str], log_path: str, cwd: str, env: dict | None = None) -> None:
        if threading.current_thread() is threading.main_thread() and shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]  # dies with us, even if we crash
        with open(log_path, "ab") as logf:
            self.procs[i] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                             cwd=cwd, env=env, start_new_session=True)

    def alive(self, i: int) -> bool:
        p = self.procs.get(i)
        return p is not None and p.poll() is None

    def kill(self, i: int, sig: int = signal.SIGKILL, wait: float = 10.0) -> None:
        p = self.procs.get(i)
        if p is None or p.poll() is not None:
            return
        os.kill(p.pid, sig)  # setpriv execs the server: same PID
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)

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
        # Rate limit off (as in bench/bench_quorum.py); the leader-side reserve on (NodeConfig.allocate_reserve_blocks).
        self.options = {"allocate_rate_per_broker": 0, "allocate_reserve_blocks": RESERVE_BLOCKS, **options}
        self.lc = LocalCluster(os.path.join(self.dir, "cluster"))

    def start(self) -> None:
        self.lc.up(3, host=HOST, timeout=60, **self.options)
        self.leader()

    def endpoints(self) -> str:
        return ",".join(self.lc.client_addresses())

    def leader(self, timeout: float = 30.0) -> int:
        from .common import find_leader
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

    def settings(self) -> dict:
        from quorum.raft import RaftConfig
        import dataclasses
        return {"journal": "fdatasync before any message leaves a node", "options": self.options,
                "raft": dataclasses.asdict(RaftConfig())}


ZK_LOG4J = """\
log4j.rootLogger=WARN, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} [myid:%X{myid}] - %-5p [%t:%C{1}@%L] - %m%n
"""


def four_letter(port: int, cmd: str, timeout: float = 2.0) -> str:
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(cmd.encode())
        chunks = []
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class _PeerSystem(System):
    """A peer run as three server processes (``_spawn(i)``, ``_wait_serving``) on ``client_ports``."""
    start_timeout = 60.0
    client_ports: list[int]

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


class ZooKeeperSystem(_PeerSystem):
    """A three-server ZooKeeper ensemble (QuorumPeerMain) from Debian's package."""

    name = "zookeeper"
    start_timeout = 90.0
    # Debian's /etc/zookeeper/conf/zoo.cfg as shipped; fsync (forceSync) left at its default: on.
    TIMING = {"tickTime": 2000, "initLimit": 10, "syncLimit": 5}
    HEAP = "-Xmx512m"

    def __init__(self, keep: bool = False):
        super().__init__(keep)
        reason = missing_reason("zookeeper")
        if reason:
            raise SystemUnavailable(reason)
        ports = free_ports(9)
        self.client_ports = ports[0:3]
        self.quorum_ports = ports[3:6]
        self.election_ports = ports[6:9]
        self.procs = _Processes()
        servers = "".join(f"server.{i + 1}={HOST}:{self.quorum_ports[i]}:{self.election_ports[i]}\n"
                          for i in range(3))
        for i in range(3):
            d = self._node_dir(i)
            os.makedirs(os.path.join(d, "data"), exist_ok=True)
            with open(os.path.join(d, "data", "myid"), "w") as f:
                f.write(f"{i + 1}\n")
            with open(os.path.join(d, "zoo.cfg"), "w") as f:
                f.write("".join(f"{k}={v}\n" for k, v in self.TIMING.items()) +
                        f"dataDir={os.path.join(d, 'data')}\n"
                        f"clientPort={self.client_ports[i]}\n"
                        f"clientPortAddress={HOST}\n"
                        f"admin.enableServer=false\n"
                        f"4lw.commands.whitelist=srvr,mntr,ruok\n"
                        f"maxClientCnxns=0\n" + servers)
            with open(os.path.join(d, "log4j.properties"), "w") as f:
                f.write(ZK_LOG4J)

    def _node_dir(self, i: int) -> str:
        return os.path.join(self.dir, f"zk-{i + 1}")

    def _command(self, i: int) -> list[str]:
        d = self._node_dir(i)
        return [shutil.which("java") or "/usr/bin/java", self.HEAP, "-Xms32m", "-Djava.awt.headless=true",
                "-Dzookeeper.admin.enableServer=false", f"-Dlog4j.configuration=file:{d}/log4j.properties",
                "-cp", ":".join([d, ZK_JAR, *(j for j in ZK_LOG_JARS if os.path.isfile(j))]),
                ZK_MAIN, os.path.join(d, "zoo.cfg")]

    def _spawn(self, i: int) -> None:
        self.procs.spawn(i, self._command(i), os.path.join(self._node_dir(i), "zookeeper.log"), self._node_dir(i))

    def _mode(self, i: int) -> str | None:
        try:
            out = four_letter(self.client_ports[i], "srvr", timeout=1.0)
        except OSError:
            return None
        for line in out.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def _wait_serving(self, nodes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for i in nodes:
            _wait_port(self.client_ports[i], deadline, self.procs.procs[i], f"ZooKeeper node {i + 1}",
                       os.path.join(self._node_dir(i), "zookeeper.log"))
            while self._mode(i) not in ("leader", "follower"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ZooKeeper node {i + 1} not in the ensemble after {timeout:.0f}s:\n"
                                       + _tail(os.path.join(self._node_dir(i), "zookeeper.log")))
                time.sleep(0.05)

    def leader(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            for i in range(3):
                if self.procs.alive(i) and self._mode(i) == "leader":
                    return i
            if time.monotonic() > deadline:
                raise RuntimeError(f"no ZooKeeper leader within {timeout:.0f}s")
            time.sleep(0.02)

    def kill(self, i: int) -> None:
        self.procs.kill(i)

    def restart(self, i: int, timeout: float = 60.0) -> None:
        self._spawn(i)
        self._wait_serving([i], timeout)

    def stop(self) -> None:
        self.procs.stop_all()

    def settings(self) -> dict:
        return {**self.TIMING, "forceSync": "yes (default)", "jvm_heap": self.HEAP, "admin_server": False,
                "client": "kazoo, migration.zk.LegacyAllocator (Kafka's conditional setData loop)"}


class EtcdSystem(_PeerSystem):
    """A three-member etcd cluster from Debian's etcd-server package."""

    name = "etcd"

    def __init__(self, keep: bool = False):
        super().__init__(keep)
        reason = missing_reason("etcd")
        if reason:
            raise SystemUnavailable(reason)
        ports = free_ports(6)
        self.client_ports = ports[0:3]
        self.peer_ports = ports[3:6]
        self.procs = _Processes()
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
            _wait_port(self.client_ports[i], deadline, self.procs.procs[i], f"etcd member {i + 1}",
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
                                       + _tail(os.path.join(self._node_dir(i), "etcd.log")))
                time.sleep(0.05)

    def leader(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            for i in range(3):
                if not self.procs.alive(i):
                    continue
                st = self.status(i)
                if st and st.get("header", {}).get("member_id") == st.get("leader"):
                    return i
            if time.monotonic() > deadline:
                raise RuntimeError(f"no etcd leader within {timeout:.0f}s")
            time.sleep(0.02)

    def kill(self, i: int) -> None:
        self.procs.kill(i)

    def restart(self, i: int, timeout: float = 60.0) -> None:
        self._spawn(i)
        self._wait_serving([i], timeout)

    def stop(self) -> None:
        self.procs.stop_all()

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
