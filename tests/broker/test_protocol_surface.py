"""The edges of the broker's Kafka protocol surface, against real broker processes and a real quorum:

- A request at a version outside the advertised range closes the connection, as Kafka does (no
  answer in another version's layout); ApiVersions is answered UNSUPPORTED_VERSION with the ranges.
- An unknown API key is logged once per key, then only counted; the connection is closed.
"""
from __future__ import annotations

import socket

import pytest

from benchmarks.processes import BrokerProcess
from client import api as p
from quorum.localcluster import LocalCluster, free_ports
from telemetry.metrics import read_metrics
from tests.broker.test_frontend_bad_input import call
from tests.conftest import wait_for
from tests.quorum.test_bad_input import framed, header_v1, raw_conn, read_frame, read_until_closed
from wire import kafka
from wire.errors import Errors

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
ADD_PARTITIONS_TO_TXN, DESCRIBE_PRODUCERS = 24, 61
NAMES = {PRODUCE: "Produce", FETCH: "Fetch", LIST_OFFSETS: "ListOffsets", METADATA: "Metadata",
         ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn", DESCRIBE_PRODUCERS: "DescribeProducers"}


class Broker:
    def __init__(self, proc: BrokerProcess, metrics_port: int):
        self.proc, self.metrics = proc, f"127.0.0.1:{metrics_port}"

    @property
    def bootstrap(self) -> str:
        return self.proc.bootstrap

    def counter(self, name: str) -> float:
        return read_metrics(self.metrics).get(f"pidquorum_broker_{name}_total", 0)

    def log(self) -> str:
        return self.proc.tail(1_000_000)


@pytest.fixture(scope="module")
def quorum(tmp_path_factory):
    base = tmp_path_factory.mktemp("protocol-surface")
    lc = LocalCluster(str(base / "cluster"))
    lc.up(3)
    try:
        yield base, lc
    finally:
        lc.down(timeout=5)


@pytest.fixture(scope="module")
def broker(quorum):
    base, lc = quorum
    port = free_ports(1)[0]
    proc = BrokerProcess(str(base), 1, lc.client_addresses(), "--partitions", "2", "--metrics-port", str(port))
    proc.start()
    try:
        yield Broker(proc, port)
    finally:
        proc.stop()


def advertised(b: Broker) -> dict[int, tuple[int, int]]:
    body = call(b.proc, kafka.API_VERSIONS, 0)
    assert int(body.error_code) == 0
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}


def api_versions_on(s: socket.socket, corr: int) -> None:
    """ApiVersions v0 on an open connection is answered (the broker serves that connection)."""
    s.sendall(kafka.encode_request(kafka.request_entity(kafka.API_VERSIONS, 0), corr))
    got, body = p.QUORUM_API.parse_response(read_frame(s), kafka.API_VERSIONS, 0)
    assert got == corr and int(body.error_code) == 0


def closed_without_answer(b: Broker, payload: bytes) -> None:
    with raw_conn(b.bootstrap) as s:
        s.sendall(framed(payload))
        assert read_until_closed(s) == b"", "answered instead of closing the connection"


# ------------------------------------------------------------------ versions
UNSUPPORTED = [(PRODUCE, 11), (PRODUCE, 2), (FETCH, 3), (LIST_OFFSETS, 0), (LIST_OFFSETS, 8), (METADATA, 13),
               (ADD_PARTITIONS_TO_TXN, 4), (DESCRIBE_PRODUCERS, 1)]


@pytest.mark.parametrize("api_key,version", UNSUPPORTED, ids=[f"{k}v{v}" for k, v in UNSUPPORTED])
def test_a_request_at_an_unsupported_version_closes_the_connection(broker, api_key, version):
    lo, hi = advertised(broker)[api_key]
    assert not lo <= version <= hi, f"v{version} is advertised now (v{lo}-v{hi}): pick another version"
    before = broker.counter("unsupported_versions")
    with raw_conn(broker.bootstrap) as other:
        api_versions_on(other, 1)
        for _ in range(2):  # twice, on two connections
            closed_without_answer(broker, header_v1(api_key, version, 31) + b"\x00" * 16)
            api_versions_on(other, 2)  # the other connection is served throughout
    wait_for(lambda: broker.counter("unsupported_versions") >= before + 2, 5, what="unsupported_versions counted")
    said = f": {NAMES[api_key]} v{version} is not supported"
    lines = [line for line in broker.log().splitlines() if said in line]
    assert len(lines) == 1, lines  # logged once per (API, version)
    assert "closing the connection" in lines[0]


def test_every_api_one_version_past_either_end_closes_the_connection(broker):
    for api_key, (lo, hi) in advertised(broker).items():
        if api_key == kafka.API_VERSIONS:
            continue
        for version in (lo - 1, hi + 1):
            closed_without_answer(broker, header_v1(api_key, version, 7) + b"\x00" * 16)
    with raw_conn(broker.bootstrap) as s:
        api_versions_on(s, 3)


@pytest.mark.parametrize("version", [4, 99])
def test_api_versions_at_an_unsupported_version_is_answered_with_the_ranges(broker, version):
    with raw_conn(broker.bootstrap) as s:
        s.sendall(framed(header_v1(kafka.API_VERSIONS, version, 0x5150) + b"\x00" * 3))
        corr, body = p.QUORUM_API.parse_response(read_frame(s), kafka.API_VERSIONS, 0)
        assert corr == 0x5150 and int(body.error_code) == Errors.UNSUPPORTED_VERSION
        ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
        assert ranges == advertised(broker) and ranges[PRODUCE] == (3, 10)
        api_versions_on(s, 9)  # the connection stays open: the client downgrades on it


# ------------------------------------------------------------------ unknown API keys
def test_an_unknown_api_key_is_logged_once_and_counted(broker):
    before = broker.counter("bad_frames")
    with raw_conn(broker.bootstrap) as other:
        for corr in (1, 2):
            closed_without_answer(broker, header_v1(4242, 0, corr) + b"\x00" * 8)
            api_versions_on(other, corr)
    wait_for(lambda: broker.counter("bad_frames") >= before + 2, 5, what="bad_frames counted")
    lines = [line for line in broker.log().splitlines() if "unknown API key 4242" in line]
    assert len(lines) == 1, lines
    assert "closing the connection" in lines[0]

