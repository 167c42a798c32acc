"""Fixtures for broker tests: a quorum plus real broker front-end processes."""
from __future__ import annotations

import pytest

from benchmarks.processes import BrokerProcess


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
