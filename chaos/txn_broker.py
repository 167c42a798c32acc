"""The broker process of a transactions chaos run: one ``python -m broker`` on a fixed free port of
127.0.0.1 (a restart keeps its address and its data), started, killed and stopped by its PID only.

(``benchmarks.processes.BrokerProcess`` does the same for the benchmarks and tests; the layering
contract keeps chaos below benchmarks, so the few lines a run needs are here.)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from quorum.localcluster import free_ports

HOST = "127.0.0.1"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout (or site-packages) holding us


def child_env() -> dict:
    """Our environment with this checkout first on PYTHONPATH (children run this code), unbuffered output."""
    paths = [REPO] + [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x and x != REPO]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1"}


class BrokerStartError(RuntimeError):
    """The broker exited while starting, or did not serve in time (its log tail in the message)."""


class ChaosBroker:
    def __init__(self, base_dir: str, broker_id: int, quorum: list[str], *extra: str):
        self.broker_id = broker_id
        self.quorum = list(quorum)
        self.extra = list(extra)
        self.port = free_ports(1, HOST)[0]
        self.dir = os.path.join(base_dir, f"broker-{broker_id}")
        os.makedirs(self.dir, exist_ok=True)
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "broker.log")
        self.ready_path = os.path.join(self.dir, "ready")
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> "ChaosBroker":
        """Start it (in a session of its own) and wait for its ready file."""
        if os.path.exists(self.ready_path):
            os.remove(self.ready_path)
        cmd = [sys.executable, "-m", "broker", "--broker-id", str(self.broker_id), "--quorum", ",".join(self.quorum),
               "--listen", self.bootstrap, "--data-dir", self.data_dir, "--ready-file", self.ready_path, *self.extra]
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=REPO, env=child_env(), start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.ready_path):
            if self.proc.poll() is not None:
                raise BrokerStartError(f"broker {self.broker_id} exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise BrokerStartError(f"broker {self.broker_id} not serving within {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.02)
        return self

    def _signal_and_reap(self, sig: int, timeout: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def kill(self) -> None:
        """kill -9 (our child, by PID), and reap it."""
        self._signal_and_reap(signal.SIGKILL, 10.0)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (SIGKILL after ``timeout``), by PID."""
        self._signal_and_reap(signal.SIGTERM, timeout)

    def tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_problems(self, limit: int = 50) -> dict:
        """Tracebacks and UNKNOWN_SERVER_ERROR / ERROR lines of the broker's log (count, and the last ones)."""
        lines = []
        try:
            with open(self.log_path, errors="replace") as f:
                for line in f:
                    if "Traceback" in line or "UNKNOWN_SERVER_ERROR" in line or " ERROR " in line:
                        lines.append(line.rstrip("\n")[:300])
        except OSError:
            pass
        return {"count": len(lines), "last": lines[-limit:]}
