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

``lossy``
    ``(proxy, client)``: a ``tests.migration.zk_blocks.LossyProxy`` in front of
    ``zookeeper`` and a client connected through it to ``zk_chroot``.

Installing: right after collection (outside test timeouts) when a collected
test needs ``zookeeper``, Debian's zookeeper package is installed if it or java
is missing (``benchmarks.zookeeper.ensure_installed``, i.e. ``benchmarks.provision``:
apt-get, serialized with flock so that the other xdist workers wait and find
it installed). If ZooKeeper can't be installed (no root and no passwordless
sudo, no package index reachable) the tests are skipped with the reason, or
fail when PIDQUORUM_REQUIRE_ZOOKEEPER=1.

The server is ``benchmarks.zookeeper.ZooKeeperServer`` (the same start-up as
``pidctl bench``'s ensemble), standalone, with fsync off and a JVM tuned to
start fast; ready once it answers ``ruok`` and serves a session.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
from kazoo.client import KazooClient

from benchmarks import zookeeper as zk
from benchmarks.provision import AptUnavailable
from quorum.localcluster import LocalCluster, free_ports
from quorum.migration.zk import connect
from tests.migration.zk_blocks import LossyProxy

START_TIMEOUT = 60.0
JVM_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dzookeeper.preAllocSize=1024",
               "-Dzookeeper.snapshot.trust.empty=true")


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def three_node_quorum(path):
    """A three-node LocalCluster under ``path``, for a fixture to ``yield from``: up, then down."""
    lc = LocalCluster(str(path))
    lc.up(3)
    yield lc
    lc.down(timeout=5)


def pidctl(lc: LocalCluster, *args: str) -> subprocess.CompletedProcess:
    """``pidctl --quorum <lc's addresses> *args`` in a child process, from the checkout."""
    return subprocess.run([sys.executable, "-m", "cli.main", "--quorum", ",".join(lc.client_addresses()), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


class ZooKeeperUnavailable(Exception):
    pass


def ensure_zookeeper_installed() -> float:
    """Install Debian's zookeeper package if it is missing; returns the seconds spent installing (0 if it was there)."""
    try:
        elapsed = zk.ensure_installed()
    except AptUnavailable as e:
        raise ZooKeeperUnavailable(str(e)) from None
    if elapsed:
        print(f"[zookeeper fixture] installed Debian's zookeeper package in {elapsed:.1f}s", file=sys.stderr)
    return elapsed


class ZooKeeperServer(zk.ZooKeeperServer):
    """One standalone ZooKeeper JVM on 127.0.0.1:port, data under ``directory``; ``start()`` returns once
    it serves sessions."""

    def __init__(self, directory, port: int):
        super().__init__(directory, port, settings={"tickTime": 1000, "forceSync": "no"}, jvm_options=JVM_OPTIONS,
                         log_level="INFO")

    def start(self, timeout: float = START_TIMEOUT) -> None:
        if self.running:
            return
        deadline = time.monotonic() + timeout
        super().start(timeout)
        try:
            self._wait_ready(deadline)
        except BaseException:
            self.stop(kill=True)
            raise

    def _wait_ready(self, deadline: float) -> None:
        last = "no answer yet"
        while True:
            if not self.running:
                raise RuntimeError(f"ZooKeeper exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            try:
                answer = zk.four_letter(self.port, "ruok", timeout=1.0)
                if answer == "imok":
                    break
                last = f"ruok answered {answer!r}"
            except OSError as e:
                last = f"ruok: {e}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"ZooKeeper on {self.hosts} not ready ({last}):\n{self.log_tail()}")
            time.sleep(0.1)
        # "imok" only says the process is up: make sure it serves sessions.
        while True:
            client = KazooClient(hosts=self.hosts, timeout=5.0)
            try:
                client.start(timeout=max(1.0, min(5.0, deadline - time.monotonic())))
                client.exists("/")
                return
            except Exception as e:  # noqa: BLE001 - retried until the deadline
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ZooKeeper on {self.hosts} answers ruok but no session: {e!r}\n"
                                       f"{self.log_tail()}") from e
                time.sleep(0.1)
            finally:
                client.stop()
                client.close()

    def ensure_running(self) -> None:
        if not self.running:
            self.start()


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


@pytest.fixture
def lossy(zookeeper, zk_chroot):
    proxy = LossyProxy(zookeeper.port)
    chroot = zk_chroot[len(zookeeper.hosts):]
    zk = connect(proxy.hosts + chroot, timeout=10)
    yield proxy, zk
    zk.stop(); zk.close()
    proxy.close()
