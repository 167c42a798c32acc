"""Bounds of the broker front end, against real broker processes (one quorum for the module):
a bounded DescribeProducers.  Counters are read from each broker's metrics endpoint."""
from __future__ import annotations

import asyncio

import pytest

from benchmarks.processes import BrokerProcess
from client.quorum import Connection
from quorum.localcluster import LocalCluster, free_ports
from telemetry.metrics import read_metrics
from tests.broker.test_frontend_bad_input import batch, entity, init_pid, produce
from wire import kafka
from wire.errors import Errors

DESCRIBE_PRODUCERS = 61
LIMIT = 5  # the describe_producers_limit of ``broker``


# ------------------------------------------------------------------ processes
class Broker:
    def __init__(self, proc: BrokerProcess, metrics_port: int):
        self.proc, self.metrics = proc, f"127.0.0.1:{metrics_port}"

    @property
    def bootstrap(self) -> str:
        return self.proc.bootstrap

    def counter(self, name: str) -> float:
        m = read_metrics(self.metrics)
        return m.get(f"pidquorum_broker_{name}_total", m.get(f"pidquorum_broker_{name}", 0))


@pytest.fixture(scope="module")
def quorum(tmp_path_factory):
    base = tmp_path_factory.mktemp("frontend-limits")
    lc = LocalCluster(str(base / "cluster"))
    lc.up(3)
    try:
        yield base, lc
    finally:
        lc.down(timeout=5)


def _start(quorum, broker_id: int, *flags: str):
    base, lc = quorum
    port = free_ports(1)[0]
    proc = BrokerProcess(str(base), broker_id, lc.client_addresses(), "--metrics-port", str(port), *flags)
    proc.start()
    return Broker(proc, port)


@pytest.fixture(scope="module")
def broker(quorum):
    b = _start(quorum, 1, "--describe-producers-limit", str(LIMIT))
    yield b
    b.proc.stop()


@pytest.fixture(autouse=True)
def _show_logs(request):
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "broker" in request.fixturenames:
        print(f"----- broker log -----\n{request.getfixturevalue('broker').proc.tail(60)}")


# ------------------------------------------------------------------ DescribeProducers
def describe_producers(b, topics: dict[str, list[int]]):
    body = kafka.request_entity(DESCRIBE_PRODUCERS, 0, topics=tuple(
        entity(DESCRIBE_PRODUCERS, 0, "TopicRequest", name=name, partition_indexes=tuple(parts))
        for name, parts in topics.items()))

    async def go():
        conn = Connection(b.bootstrap, "limits-test")
        try:
            return await conn.call(body, 10.0)
        finally:
            conn.close()
    resp = asyncio.run(go())
    return {(t.name, int(p.partition_index)): p for t in resp.topics for p in t.partitions}


def test_describe_producers_is_cut_at_the_limit_and_says_so(broker):
    truncated0 = broker.counter("describe_producers_truncated")
    pids = []
    for _ in range(LIMIT + 3):
        _, pid, epoch = init_pid(broker.proc)
        pids.append(pid)
        assert produce(broker.proc, batch(pid, epoch, seq=0, n=2), topic="described")[0] == Errors.NONE
    _, pid, epoch = init_pid(broker.proc)
    assert produce(broker.proc, batch(pid, epoch, seq=0), topic="described-few")[0] == Errors.NONE
    got = describe_producers(broker.proc, {"described": [0], "described-few": [0], "described-none": [0]})
    cut = got[("described", 0)]
    assert int(cut.error_code) == 0
    assert cut.error_message == f"{LIMIT} of {LIMIT + 3} producers shown, the lowest producer ids; " \
                                "describe_producers_limit"
    assert [int(p.producer_id) for p in cut.active_producers] == sorted(pids)[:LIMIT]
    assert {(int(p.producer_epoch), int(p.last_sequence)) for p in cut.active_producers} == {(0, 1)}
    few = got[("described-few", 0)]
    assert int(few.error_code) == 0 and few.error_message is None
    assert [int(p.producer_id) for p in few.active_producers] == [pid]
    assert int(got[("described-none", 0)].error_code) == Errors.UNKNOWN_TOPIC_OR_PARTITION
    assert broker.counter("describe_producers_truncated") == truncated0 + 1

