"""Processes the benchmarks (and the tests) start and own: started with this checkout first on
``PYTHONPATH``, ended by their PID (never by name), their logs kept.

* ``spawn`` / ``stop_process`` / ``wait_port`` / ``log_tail``: a server process of ours (a ZooKeeper
  JVM, an etcd member), which dies with us when started from the main thread (``setpriv
  --pdeathsig``), waited for until it listens, its log tail in every error;
* ``BrokerProcess``: one ``python -m broker`` against a quorum, the harness of the broker benchmark
  (``benchmarks.broker``) and of the broker tests (``tests/broker/conftest.py``);
* ``cpu_seconds``: a process's CPU time, from /proc.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Callable

from quorum.localcluster import free_ports
from quorum.settings import toml_value

HOST = "127.0.0.1"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout (or site-packages) holding us


def child_env(env: dict | None = None) -> dict:
    """``env`` (default: ours) with this checkout first on PYTHONPATH, so child processes run the code
    benchmarked or tested here, and unbuffered Python output (logs are read while the process runs)."""
    env = dict(os.environ if env is None else env)
    paths = [REPO] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x and x != REPO]
    return {**env, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}


def spawn(cmd: list[str], log_path: str, cwd: str, env: dict | None = None) -> subprocess.Popen:
    """Start ``cmd`` in a session of its own, stdin closed, stdout and stderr appended to ``log_path``.

    From the main thread it runs under ``setpriv --pdeathsig KILL`` (which execs it: same PID), so it
    dies with this process even if this one crashes (PDEATHSIG fires when the forking thread exits)."""
    if threading.current_thread() is threading.main_thread() and shutil.which("setpriv"):
        cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
    with open(log_path, "ab") as logf:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, cwd=cwd,
                                env=env, start_new_session=True)


def stop_process(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Send ``sig`` to our child ``proc`` (by PID) and reap it; SIGKILL if it outlives ``timeout``."""
    if proc is None or proc.poll() is not None:
        return
    os.kill(proc.pid, sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


def log_tail(path: str | os.PathLike, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file, or "(no log)"."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_port(host: str, port: int, deadline: float, proc: subprocess.Popen, what: str, log_path: str,
              tail_lines: int = 20) -> None:
    """Until ``host:port`` accepts a connection; RuntimeError with the log tail if ``proc`` exits first or
    ``deadline`` (``time.monotonic()``) passes."""
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting:\n"
                               f"{log_tail(log_path, tail_lines)}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} does not listen on {host}:{port}:\n{log_tail(log_path, tail_lines)}")
        time.sleep(0.05)


def wait_ready_file(proc: subprocess.Popen, path: str, timeout: float, what: str, tail: Callable[[], str],
                    error: type[Exception] = RuntimeError) -> None:
    """Until ``proc`` writes its ready file ``path``; ``error`` with ``tail()`` (its log's end) if it
    exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise error(f"{what} exited with {proc.returncode}:\n{tail()}")
        if time.monotonic() > deadline:
            raise error(f"{what} not serving within {timeout:.0f}s:\n{tail()}")
        time.sleep(0.02)


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, from /proc (None if unavailable)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


# ------------------------------------------------------------------ brokers
class BrokerStartError(RuntimeError):
    """A broker process exited while starting, or did not serve in time (its log tail in the message)."""


class BrokerProcess:
    """One ``python -m broker`` process on a fixed free port of 127.0.0.1 (so a restart keeps its
    address), in ``base_dir/broker-<id>`` (data, log, ready file); started and ended by its PID.

    With ``faults`` (``chaos.faults`` specs) it runs under ``python -m chaos.armed`` with them armed.
    ``new_session`` starts it in a session of its own (a terminal's Ctrl-C does not reach it)."""

    def __init__(self, base_dir: str, broker_id: int, quorum: list[str], *extra: str, port: int | None = None,
                 faults: tuple[str, ...] = (), new_session: bool = False, config: dict | None = None,
                 env: dict | None = None):
        """``config``: the broker reads its settings from a file (``broker.toml`` in its directory, with
        ``broker_id``, ``quorum``, ``listen`` and ``data_dir`` besides these) instead of flags;
        ``extra`` flags are still given (and override the file).  ``env``: environment variables set for
        the process (e.g. ``PIDQUORUM_BROKER_SASL_PASSWORD``: a password is never one of its flags)."""
        self.broker_id = broker_id
        self.env = dict(env or {})
        self.faults = tuple(faults)
        self.quorum = list(quorum)
        self.extra = list(extra)
        self.new_session = new_session
        self.port = port or free_ports(1, HOST)[0]
        self.dir = os.path.join(base_dir, f"broker-{broker_id}")
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "broker.log")
        self.ready_path = os.path.join(self.dir, "ready")
        self.config_path = None
        if config is not None:
            self.config_path = os.path.join(self.dir, "broker.toml")
            fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # may hold a password
            with os.fdopen(fd, "w") as f:  # data_dir relative: to the file's directory
                f.write(_toml({"broker_id": broker_id, "quorum": self.quorum, "listen": self.bootstrap,
                               "data_dir": "data", **config}))
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def command(self) -> list[str]:
        armed = ["-m", "chaos.armed", *(a for f in self.faults for a in ("--failpoint", f))] if self.faults else ["-m"]
        settings = (["--config", self.config_path] if self.config_path else
                    ["--broker-id", str(self.broker_id), "--quorum", ",".join(self.quorum), "--listen", self.bootstrap,
                     "--data-dir", self.data_dir])
        return [sys.executable, *armed, "broker", *settings, "--ready-file", self.ready_path, *self.extra]

    def start(self, timeout: float = 30.0) -> "BrokerProcess":
        """Start it and wait until it serves (its ready file); BrokerStartError if it exits or times out."""
        if os.path.exists(self.ready_path):
            os.remove(self.ready_path)
        with os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as logf:
            self.proc = subprocess.Popen(self.command(), stdout=logf, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=REPO, env=child_env({**os.environ, **self.env}),
                                         start_new_session=self.new_session)
        wait_ready_file(self.proc, self.ready_path, timeout, f"broker {self.broker_id}", self.tail, BrokerStartError)
        return self

    def kill(self) -> None:
        """kill -9, the process we started (by PID), and reap it."""
        stop_process(self.proc, signal.SIGKILL)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (SIGKILL after ``timeout``), by PID."""
        stop_process(self.proc, signal.SIGTERM, timeout)

    def tail(self, lines: int = 80) -> str:
        return log_tail(self.log_path, lines)

    def cpu_seconds(self) -> float | None:
        return cpu_seconds(self.proc.pid) if self.proc is not None and self.proc.poll() is None else None

    def anomalies(self) -> dict:
        """Lines of the broker log that show a request it could not serve."""
        out: Counter = Counter()
        try:
            with open(self.log_path, errors="replace") as fh:
                for line in fh:
                    if "answered INVALID_REQUEST" in line:
                        m = re.search(r"\): (.*) \(answered INVALID_REQUEST\)", line)
                        out[f"INVALID_REQUEST: {m.group(1) if m else line.strip()[-80:]}"] += 1
                    elif "UNKNOWN_SERVER_ERROR" in line or "Traceback" in line:
                        out["exception / UNKNOWN_SERVER_ERROR lines"] += 1
        except FileNotFoundError:
            pass
        return dict(out)


def _toml(settings: dict) -> str:
    """A broker file: the top-level keys, then each dict as a [table]."""
    lines = [f"{k} = {toml_value(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    for name, table in settings.items():
        if isinstance(table, dict):
            lines += [f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"
