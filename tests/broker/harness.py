"""Real broker front-end processes for tests: started by PID, ended by PID, logs kept."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from quorum.localcluster import free_ports
from settings import toml_value
from tests.conftest import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BrokerProcess:
    """One ``python -m broker`` process on a fixed free port (so a restart keeps its address); with
    ``faults`` (chaos.faults specs) it runs under ``python -m chaos.armed`` with them armed."""

    def __init__(self, base_dir: str, broker_id: int, quorum: list[str], *extra: str, port: int | None = None,
                 faults: tuple[str, ...] = (), config: dict | None = None):
        """``config``: the broker reads its settings from a file (``broker.toml`` in its directory, with
        ``broker_id``, ``quorum``, ``listen`` and ``data_dir`` besides these) instead of flags;
        ``extra`` flags are still given (and override the file)."""
        self.broker_id = broker_id
        self.faults = tuple(faults)
        self.quorum = list(quorum)
        self.extra = list(extra)
        self.port = port or free_ports(1)[0]
        self.dir = os.path.join(base_dir, f"broker-{broker_id}")
        os.makedirs(self.dir, exist_ok=True)
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "broker.log")
        self.ready_path = os.path.join(self.dir, "ready")
        self.config_path = None
        if config is not None:
            self.config_path = os.path.join(self.dir, "broker.toml")
            with open(self.config_path, "w") as f:  # data_dir relative: to the file's directory
                f.write(_toml({"broker_id": broker_id, "quorum": self.quorum, "listen": self.bootstrap,
                               "data_dir": "data", **config}))
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "BrokerProcess":
        if os.path.exists(self.ready_path):
            os.remove(self.ready_path)
        armed = ["-m", "chaos.armed", *(a for f in self.faults for a in ("--failpoint", f))] if self.faults else ["-m"]
        settings = (["--config", self.config_path] if self.config_path else
                    ["--broker-id", str(self.broker_id), "--quorum", ",".join(self.quorum), "--listen", self.bootstrap,
                     "--data-dir", self.data_dir])
        cmd = [sys.executable, *armed, "broker", *settings, "--ready-file", self.ready_path, *self.extra]
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        finally:
            log.close()

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"broker {self.broker_id} exited with {self.proc.returncode}:\n{self.tail()}")
            return os.path.exists(self.ready_path)
        wait_for(ready, timeout, what=f"broker {self.broker_id} to serve")
        return self

    def kill(self) -> None:
        """kill -9, the process we started (by PID), and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, lines: int = 80) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def _toml(settings: dict) -> str:
    """A broker file: the top-level keys, then each dict as a [table]."""
    lines = [f"{k} = {toml_value(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    for name, table in settings.items():
        if isinstance(table, dict):
            lines += [f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"
