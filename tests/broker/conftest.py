"""Fixtures for broker tests: a quorum plus real broker front-end processes, and a partition's directory."""
from __future__ import annotations

import pytest

from benchmarks.processes import BrokerProcess
from quorum.localcluster import LocalCluster, free_ports
from quorum.telemetry.metrics import read_metrics
from tests.conftest import wait_for


class MeteredBroker:
    """A broker process with its metrics port: counters, log, memory."""

    def __init__(self, proc: BrokerProcess, metrics_port: int):
        self.proc, self.metrics = proc, f"127.0.0.1:{metrics_port}"

    @property
    def bootstrap(self) -> str:
        return self.proc.bootstrap

    def counter(self, name: str) -> float:
        """A counter (``_total``) or a gauge of the broker's metrics; 0 before its first sample."""
        m = read_metrics(self.metrics)
        return m.get(f"pidquorum_broker_{name}_total", m.get(f"pidquorum_broker_{name}", 0))

    def log(self) -> str:
        return self.proc.tail(1_000_000)

    def rss(self) -> int:
        with open(f"/proc/{self.proc.proc.pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

    def idle(self) -> None:
        """Every connection the last test opened is gone (the broker saw the close)."""
        wait_for(lambda: self.counter("connections") == 0, 15, what="the broker's connections to close")


def start_metered(quorum: tuple, broker_id: int, *flags: str) -> MeteredBroker:
    """Start a broker with a metrics port against ``module_quorum``."""
    base, lc = quorum
    port = free_ports(1)[0]
    proc = BrokerProcess(str(base), broker_id, lc.client_addresses(), "--metrics-port", str(port), *flags)
    return MeteredBroker(proc.start(), port)


def metered_broker(quorum: tuple, broker_id: int, *flags: str):
    """``start_metered`` for a fixture to ``yield from``: the broker, stopped afterwards."""
    b = start_metered(quorum, broker_id, *flags)
    try:
        yield b
    finally:
        b.proc.stop()


@pytest.fixture(scope="module")
def module_quorum(tmp_path_factory):
    """A three-node quorum shared by a module's tests: (base directory, LocalCluster)."""
    base = tmp_path_factory.mktemp("quorum")
    lc = LocalCluster(str(base / "cluster"))
    lc.up(3)
    try:
        yield base, lc
    finally:
        lc.down(timeout=5)


@pytest.fixture
def brokers(cluster, tmp_path, request):
    """Start brokers against the test's quorum: ``brokers(broker_id, *extra_args)``; ``config={...}``:
    the broker's settings in a file (``BrokerProcess``)."""
    started: list[BrokerProcess] = []

    def start(broker_id: int, *extra: str, port: int | None = None, faults: tuple[str, ...] = (),
              config: dict | None = None) -> BrokerProcess:
        b = BrokerProcess(str(tmp_path / "brokers"), broker_id, cluster.lc.client_addresses(), *extra, port=port,
                          faults=faults, config=config)
        started.append(b)
        return b.start()

    yield start
    rep = getattr(request.node, "rep_call", None)
    for b in started:
        if rep is not None and rep.failed:
            print(f"----- broker {b.broker_id} log -----\n{b.tail()}")
        b.stop()


@pytest.fixture
def d(tmp_path) -> str:
    """A partition's directory (test_log*); a module with another layout defines its own ``d``."""
    return str(tmp_path / "t-0")
