"""A real ZooKeeper for the migration tests.

Fixtures:

``zookeeper`` (session scope: one server per pytest-xdist worker, started the
first time a test asks for it)
    A standalone ZooKeeper from Debian's ``zookeeper`` package, installed with
    apt-get when it is missing, on a free 127.0.0.1 port with its own data dir
    and config under a tmp dir. The object has ``.hosts`` ("127.0.0.1:PORT"),
    ``.port``, ``.pid``, ``.running``, ``.stop(kill=False)``, ``.start()``
    (same port and data: for restart tests), ``.ensure_running()`` and
    ``.log_tail()``. The JVM is killed by PID at teardown.

``zk_chroot``
    A fresh chroot for one test, "127.0.0.1:PORT/test-<uuid>" (created
    empty, removed afterwards), so tests never see each other's znodes. It
    restarts the server first if an earlier test left it stopped.

``zk_client``
    A connected KazooClient on ``zk_chroot``, stopped at teardown.

Installing: right after collection (outside test timeouts) when a collected
test needs ``zookeeper``, if ``/usr/share/java/zookeeper.jar`` or java is missing, the
first worker to get the lock (fcntl.flock on /tmp/pidquorum-zookeeper-install.lock)
runs ``apt-get install -y --no-install-recommends zookeeper``
(DEBIAN_FRONTEND=noninteractive), and if that fails (most often: no package
index yet) ``apt-get update`` and the install again;
the other workers wait for the lock and find it installed. If ZooKeeper can't
be installed (no root and no passwordless sudo, no package index reachable) the
tests are skipped with the reason, or fail when PIDQUORUM_REQUIRE_ZOOKEEPER=1.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from quorum.localcluster import free_ports

ZK_JAR = "/usr/share/java/zookeeper.jar"
ZK_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
# zookeeper.jar's manifest names its dependencies but no slf4j binding: add
# log4j 1.2's (both come with libzookeeper-java's dependencies) to get a log.
LOG_JARS = ("/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar")
INSTALL_LOCK = "/tmp/pidquorum-zookeeper-install.lock"
APT_TIMEOUT = 900.0
START_TIMEOUT = 60.0


# --------------------------------------------------------------------- install
class ZooKeeperUnavailable(Exception):
    pass


def _unavailable(reason: str):
    raise ZooKeeperUnavailable(reason)


def _installed() -> bool:
    return os.path.isfile(ZK_JAR) and shutil.which("java") is not None


def _apt(args: list[str], prefix: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(
        prefix + ["apt-get", "-o", "DPkg::Lock::Timeout=300", *args],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=APT_TIMEOUT,
    )


def _tail(text: str, lines: int = 8) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def ensure_zookeeper_installed() -> float:
    """Install Debian's zookeeper package if it is missing; returns the seconds spent installing (0 if it was there)."""
    if _installed():
        return 0.0
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        prefix = ["sudo", "-n", "--preserve-env=DEBIAN_FRONTEND"]
    else:
        _unavailable("Debian's zookeeper package is not installed, and installing it needs root "
                     "(or passwordless sudo): apt-get install --no-install-recommends zookeeper")
    if shutil.which("apt-get") is None:
        _unavailable("zookeeper is not installed and there is no apt-get to install it with")
    with open(INSTALL_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other xdist workers wait here, then find it installed
        try:
            if _installed():
                return 0.0
            began = time.monotonic()
            install = ["install", "-y", "--no-install-recommends", "zookeeper"]
            try:
                done = _apt(install, prefix)
                if done.returncode != 0:
                    # Most often a missing or stale package index (a fresh machine has none).
                    update = _apt(["update"], prefix)
                    done = _apt(install, prefix)
                    if done.returncode != 0:
                        _unavailable(
                            f"apt-get install zookeeper failed (exit {done.returncode}): {_tail(done.stdout)}; "
                            f"apt-get update said: {_tail(update.stdout, 4)}")
            except subprocess.TimeoutExpired:
                _unavailable(f"apt-get did not finish within {APT_TIMEOUT:.0f}s")
            if not _installed():
                _unavailable(f"apt-get installed zookeeper but {ZK_JAR} or java is missing")
            elapsed = time.monotonic() - began
            print(f"[zookeeper fixture] installed Debian's zookeeper package in {elapsed:.1f}s", file=sys.stderr)
            return elapsed
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# ---------------------------------------------------------------------- server
LOG4J = """\
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} [myid:%X{myid}] - %-5p [%t:%C{1}@%L] - %m%n
"""


def four_letter(port: int, cmd: str, timeout: float = 2.0) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(cmd.encode())
        chunks = []
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer:
    """One standalone ZooKeeper JVM on 127.0.0.1:port, data under ``directory``."""

    def __init__(self, directory: Path, port: int):
        self.dir = Path(directory)
        self.port = port
        self.hosts = f"127.0.0.1:{port}"
        self.data_dir = self.dir / "data"
        self.conf_dir = self.dir / "conf"
        self.cfg = self.conf_dir / "zoo.cfg"
        self.log_path = self.dir / "zookeeper.log"
        self.proc: subprocess.Popen | None = None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        self.cfg.write_text(
            f"tickTime=1000\n"
            f"dataDir={self.data_dir}\n"
            f"clientPort={port}\n"
            f"clientPortAddress=127.0.0.1\n"
            f"admin.enableServer=false\n"
            f"4lw.commands.whitelist=ruok,srvr\n"
            f"maxClientCnxns=0\n"
            f"forceSync=no\n"
        )
        (self.conf_dir / "log4j.properties").write_text(LOG4J)

    def command(self) -> list[str]:
        return [
            shutil.which("java") or "/usr/bin/java",
            "-Xmx512m", "-Xms32m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            "-Dzookeeper.admin.enableServer=false",
            "-Dzookeeper.preAllocSize=1024",
            "-Dzookeeper.snapshot.trust.empty=true",
            f"-Dlog4j.configuration=file:{self.conf_dir / 'log4j.properties'}",
            "-cp", ":".join([str(self.conf_dir), ZK_JAR, *(j for j in LOG_JARS if os.path.isfile(j))]),
            ZK_MAIN, str(self.cfg),
        ]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        if self.running:
            return
        cmd = self.command()
        # The JVM dies with the pytest process that started it (even on a crash),
        # when started from the main thread: PDEATHSIG fires when the forking thread exits.
        if threading.current_thread() is threading.main_thread() and shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.dir, start_new_session=True)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop(kill=True)
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            if not self.running:
                raise RuntimeError(f"ZooKeeper exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            try:
                answer = four_letter(self.port, "ruok", timeout=1.0)
                if answer == "imok":
                    break
                last = f"ruok answered {answer!r}"
            except OSError as e:
                last = f"ruok: {e}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"ZooKeeper on {self.hosts} not ready after {timeout}s ({last}):\n{self.log_tail()}")
            time.sleep(0.1)
        # "imok" only says the process is up: make sure it serves sessions.
        while True:
            zk = KazooClient(hosts=self.hosts, timeout=5.0)
            try:
                zk.start(timeout=max(1.0, min(5.0, deadline - time.monotonic())))
                zk.exists("/")
                return
            except Exception as e:  # noqa: BLE001 - retried until the deadline
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ZooKeeper on {self.hosts} answers ruok but no session: {e!r}\n"
                                       f"{self.log_tail()}") from e
                time.sleep(0.1)
            finally:
                zk.stop()
                zk.close()

    def stop(self, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop the JVM (SIGTERM, or SIGKILL with kill=True; SIGKILL after ``timeout`` anyway)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        # Our own child, by PID (setpriv execs java: same PID).
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def ensure_running(self) -> None:
        if not self.running:
            self.start()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


_install_problem: list[str] = []


def pytest_collection_finish(session):
    """Install ZooKeeper once collection (after -k/-m deselection) shows a test needs it: outside any test's timeout
    (a fresh machine downloads a JRE), and before the first test, in every xdist worker
    (the lock makes all but one wait, then find it installed)."""
    if any("zookeeper" in getattr(item, "fixturenames", ()) for item in session.items):
        try:
            ensure_zookeeper_installed()
        except ZooKeeperUnavailable as e:
            _install_problem.append(str(e))


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    try:
        if _install_problem:
            raise ZooKeeperUnavailable(_install_problem[0])
        ensure_zookeeper_installed()
    except ZooKeeperUnavailable as e:
        if os.environ.get("PIDQUORUM_REQUIRE_ZOOKEEPER") == "1":
            pytest.fail(f"ZooKeeper unavailable: {e}", pytrace=False)
        pytest.skip(f"ZooKeeper unavailable: {e}")
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), free_ports(1)[0])
    try:
        server.start()
    except RuntimeError as e:
        server.stop(kill=True)
        pytest.fail(str(e), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def zk_chroot(zookeeper, request):
    zookeeper.ensure_running()
    chroot = f"/test-{uuid.uuid4().hex[:12]}"
    root = KazooClient(hosts=zookeeper.hosts, timeout=10.0)
    root.start(timeout=15)
    try:
        root.create(chroot)
    finally:
        root.stop()
        root.close()
    yield f"{zookeeper.hosts}{chroot}"
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print(f"----- zookeeper log ({zookeeper.log_path}) -----\n{zookeeper.log_tail()}")
    try:
        zookeeper.ensure_running()
        root = KazooClient(hosts=zookeeper.hosts, timeout=10.0)
        root.start(timeout=15)
        try:
            root.delete(chroot, recursive=True)
        finally:
            root.stop()
            root.close()
    except Exception:  # noqa: BLE001 - best effort: the chroot is unique anyway
        pass


@pytest.fixture
def zk_client(zk_chroot):
    zk = KazooClient(hosts=zk_chroot, timeout=10.0)
    zk.start(timeout=15)
    yield zk
    zk.stop()
    zk.close()
