"""A ZooKeeper server from Debian's ``zookeeper`` package, run as a JVM of our own on 127.0.0.1.

One start-up routine for every ZooKeeper pidquorum runs: ``pidctl bench``'s three-server ensemble
(``benchmarks.systems.ZooKeeperSystem``) and the migration tests' standalone server
(``tests/migration/conftest.py``).  ``ZooKeeperServer`` writes the server's directory (``conf/zoo.cfg``,
``conf/log4j.properties``, ``data/``, ``zookeeper.log``), launches the JVM (``benchmarks.processes.spawn``:
its own session, killed by PID), waits until its client port listens, and puts the log tail in every
error.  Set-up traps avoided: the admin server is off (it binds 0.0.0.0:8080),
``clientPortAddress=127.0.0.1``, the ``srvr``/``mntr``/``ruok`` four-letter words are whitelisted, and
log4j 1.2's slf4j binding is on the class path (zookeeper.jar's manifest names none: no log without it).

``installed()`` / ``ensure_installed()``: the package and a ``java`` (installed with ``benchmarks.provision``).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from typing import Callable, Sequence

from benchmarks.provision import ensure_installed as apt_ensure_installed

from .processes import HOST, log_tail, spawn, stop_process, wait_port

PACKAGE = "zookeeper"
JAR = "/usr/share/java/zookeeper.jar"
LOG_JARS = ("/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar")  # from libzookeeper-java's deps
STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

LOG4J = """\
log4j.rootLogger={level}, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{{ISO8601}} [myid:%X{{myid}}] - %-5p [%t:%C{{1}}@%L] - %m%n
"""


def installed() -> bool:
    return os.path.isfile(JAR) and shutil.which("java") is not None


def ensure_installed(say: Callable[[str], None] | None = None) -> float:
    """Install Debian's zookeeper package when it (or java) is missing; the seconds it took (0 if present).
    Raises ``benchmarks.provision.AptUnavailable`` when it cannot be installed."""
    return apt_ensure_installed(PACKAGE, installed, say=say)


def four_letter(port: int, cmd: str, timeout: float = 2.0) -> str:
    """A four-letter word (``ruok``, ``srvr``, ...) to the server on HOST:port; its answer."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(cmd.encode())
        chunks = []
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer:
    """One ZooKeeper JVM on HOST:``client_port`` with its files under ``directory``.

    ``settings`` are zoo.cfg lines written first (timing, ``forceSync`` ...).  With ``peers`` (the
    (quorum port, election port) of every server of an ensemble, ``myid`` this one's 1-based place) it
    is an ensemble member (QuorumPeerMain); without, a standalone server (ZooKeeperServerMain).
    ``jvm_options`` come after the heap options; ``name`` is how errors call it."""

    def __init__(self, directory: str | os.PathLike, client_port: int, *, settings: dict | None = None,
                 peers: Sequence[tuple[int, int]] = (), myid: int | None = None, heap: str = "-Xmx512m",
                 jvm_options: Sequence[str] = (), log_level: str = "WARN", name: str | None = None):
        self.dir = str(directory)
        self.port = client_port
        self.hosts = f"{HOST}:{client_port}"
        self.name = name or f"ZooKeeper on {self.hosts}"
        self.data_dir = os.path.join(self.dir, "data")
        self.conf_dir = os.path.join(self.dir, "conf")
        self.cfg = os.path.join(self.conf_dir, "zoo.cfg")
        self.log_path = os.path.join(self.dir, "zookeeper.log")
        self.main = QUORUM_MAIN if peers else STANDALONE_MAIN
        self.heap = heap
        self.jvm_options = list(jvm_options)
        self.proc: subprocess.Popen | None = None
        os.makedirs(self.data_dir, exist_ok=True)
        os.makedirs(self.conf_dir, exist_ok=True)
        if peers:
            with open(os.path.join(self.data_dir, "myid"), "w") as f:
                f.write(f"{myid}\n")
        with open(self.cfg, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in (settings or {}).items())
                    + f"dataDir={self.data_dir}\n"
                    f"clientPort={client_port}\n"
                    f"clientPortAddress={HOST}\n"
                    f"admin.enableServer=false\n"
                    f"4lw.commands.whitelist=srvr,mntr,ruok\n"
                    f"maxClientCnxns=0\n"
                    + "".join(f"server.{i}={HOST}:{q}:{e}\n" for i, (q, e) in enumerate(peers, start=1)))
        with open(os.path.join(self.conf_dir, "log4j.properties"), "w") as f:
            f.write(LOG4J.format(level=log_level))

    def command(self) -> list[str]:
        return [shutil.which("java") or "/usr/bin/java", self.heap, "-Xms32m", *self.jvm_options,
                "-Djava.awt.headless=true", "-Dzookeeper.admin.enableServer=false",
                f"-Dlog4j.configuration=file:{os.path.join(self.conf_dir, 'log4j.properties')}",
                "-cp", ":".join([self.conf_dir, JAR, *(j for j in LOG_JARS if os.path.isfile(j))]),
                self.main, self.cfg]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self) -> subprocess.Popen:
        """Start the JVM, not waiting for it (an ensemble's members are launched together)."""
        self.proc = spawn(self.command(), self.log_path, self.dir)
        return self.proc

    def wait_port(self, deadline: float) -> None:
        """Until the client port listens (``deadline``: ``time.monotonic()``); RuntimeError with the log tail."""
        wait_port(HOST, self.port, deadline, self.proc, self.name, self.log_path)

    def start(self, timeout: float = 60.0) -> None:
        """Launch and wait for the client port; killed again if that fails."""
        if self.running:
            return
        self.launch()
        try:
            self.wait_port(time.monotonic() + timeout)
        except BaseException:
            self.stop(kill=True)
            raise

    def stop(self, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop the JVM (SIGTERM, or SIGKILL with kill=True; SIGKILL after ``timeout`` anyway), by PID."""
        proc, self.proc = self.proc, None
        stop_process(proc, signal.SIGKILL if kill else signal.SIGTERM, timeout)

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)
